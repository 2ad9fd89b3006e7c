"""Chaos: three ``corral serve --node`` daemons on one PostgreSQL database, agents prompted
without pause through random daemons, and every few seconds a random daemon killed (kill -9)
and started again (meanwhile another may be killed, never the last one up), or now and then
paused (SIGSTOP) past its lease and resumed, for ``CORRAL_CHAOS_S`` seconds (``make chaos``).
Then, once every turn has ended: every agent leased to one live daemon, the log gapless,
every turn started ended once, the projections equal to a replay of the log, every SSE
client (each resumed on another daemon when its own died) saw the whole log once and in
order, and every prompt a daemon accepted started exactly one turn (nothing lost, nothing
done twice; a turn cut short by a kill or a pause is retried, and its work may have been
done by the leftover meanwhile: at most once more per interrupted turn).

``CORRAL_CHAOS_SEED`` replays a run's random choices (the seed is printed).
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.support.cluster import (
    TOKEN,
    Cluster,
    EventTail,
    check_invariants,
    check_stream,
    settled,
)

CHAOS_S = os.environ.get("CORRAL_CHAOS_S")

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.skipif(
        not CHAOS_S, reason="chaos runs for minutes: `make chaos` (sets CORRAL_CHAOS_S)"
    ),
]

LEASE_S = 2.0
AGENTS_PER_NODE = 3
KILL_EVERY_S = (2.0, 5.0)  # a kill (or a pause) every so many seconds, chosen at random
PAUSE_SHARE = 0.25  # SIGSTOP past the lease, then SIGCONT, instead of a kill
ATTEMPTS = 30  # tries of one prompt (its idempotency key) through the daemons
RETRY_PAUSE_S = 0.2  # between two tries of one prompt: the pace of a client, not a wait


@dataclass
class Load:
    """What the clients sent: each prompt's text by its key, and how it ended."""

    accepted: dict[str, str] = field(default_factory=dict)  # key -> text (202)
    busy: set[str] = field(default_factory=set)  # 409: the agent ran a turn, not started
    unknown: dict[str, str] = field(default_factory=dict)  # no answer after every try
    statuses: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)


def prompt_once(
    cluster: Cluster, rng: random.Random, agent: str, key: str, text: str, load: Load
) -> None:
    """Send one prompt with its key through random daemons until one answers for sure."""
    names = list(cluster.nodes)
    with httpx.Client(headers={"authorization": f"Bearer {TOKEN}"}, timeout=10.0) as client:
        for _ in range(ATTEMPTS):
            node = cluster.nodes[rng.choice(names)]
            try:
                answer = client.post(
                    f"{node.url}/agents/{agent}/prompt",
                    json={"text": text, "idempotencyKey": key},
                )
            except httpx.HTTPError as exc:
                with load.lock:
                    load.statuses[type(exc).__name__] += 1
                time.sleep(RETRY_PAUSE_S)
                continue
            with load.lock:
                load.statuses[str(answer.status_code)] += 1
            if answer.status_code == 202:
                with load.lock:
                    load.accepted[key] = text
                return
            if answer.status_code == 409:  # busy (or held): this prompt did not start
                with load.lock:
                    load.busy.add(key)
                return
            time.sleep(RETRY_PAUSE_S)  # 503: not owned right now, or the owner's answer lost
    with load.lock:
        load.unknown[key] = text


def test_random_daemons_killed_under_load(tmp_path: Path, postgres_dsn: str) -> None:
    assert CHAOS_S is not None
    duration_s = float(CHAOS_S)
    seed = int(os.environ.get("CORRAL_CHAOS_SEED") or time.time_ns() % 1_000_000)
    print(f"chaos: {duration_s:g} s, seed {seed} (CORRAL_CHAOS_SEED)")
    rng = random.Random(seed)
    cluster = Cluster(tmp_path, postgres_dsn, ("n1", "n2", "n3"), lease_s=LEASE_S)
    load = Load()
    kills: list[str] = []
    pauses: list[str] = []
    with cluster:
        try:
            tails = [EventTail(cluster, name) for name in cluster.nodes]
            agents = [
                cluster.spawn(
                    node,
                    via=rng.choice(list(cluster.nodes)),
                    name=f"w-{node}-{i}",
                    command=cluster.worker(f"w-{node}-{i}"),
                    onFailure="retry",
                    maxRetries=5,
                    maxConsecutiveFailures=20,
                )["id"]
                for node in cluster.nodes
                for i in range(AGENTS_PER_NODE)
            ]
            ledgers = {
                agent: f"w-{n}-{i}" for agent, (n, i) in zip(agents, _slots(cluster), strict=True)
            }
            stop = threading.Event()
            deadline = time.monotonic() + duration_s

            def clients(worker: int) -> None:
                mine = random.Random(seed * 100 + worker)
                n = 0
                while not stop.is_set():
                    n += 1
                    agent = mine.choice(agents)
                    prompt_once(cluster, mine, agent, f"k{worker}-{n}", f"c{worker}-{n}", load)

            threads = [threading.Thread(target=clients, args=(w,), daemon=True) for w in range(3)]
            for thread in threads:
                thread.start()
            restarting: dict[str, threading.Thread] = {}
            failures: list[BaseException] = []

            def restart(name: str, after_s: float) -> None:
                # Back at once (its lease still runs: refused until it has run out), or after
                # the others may have adopted its agents.
                time.sleep(after_s)  # the chaos's pace, not a wait
                try:
                    cluster.restart(name, within_s=120)
                except BaseException as exc:
                    failures.append(exc)

            def resume(name: str, after_s: float) -> None:
                time.sleep(after_s)  # the chaos's pace, not a wait
                cluster.nodes[name].resume()

            while time.monotonic() < deadline and not failures:
                time.sleep(rng.uniform(*KILL_EVERY_S))  # the chaos's pace, not a wait
                for name, thread in list(restarting.items()):
                    if not thread.is_alive():
                        del restarting[name]
                up = [
                    n for n, node in cluster.nodes.items() if n not in restarting and node.running
                ]
                if len(up) < 2:
                    continue  # never the last one standing
                victim = rng.choice(up)
                if rng.random() < PAUSE_SHARE:
                    cluster.nodes[victim].pause()
                    pauses.append(victim)
                    action = resume
                    after_s = rng.uniform(1.5 * LEASE_S, 3 * LEASE_S)  # past its lease
                else:
                    cluster.nodes[victim].kill_9()
                    kills.append(victim)
                    action = restart
                    after_s = rng.uniform(0, 2 * LEASE_S)
                restarting[victim] = threading.Thread(
                    target=action, args=(victim, after_s), daemon=True
                )
                restarting[victim].start()
            for thread in restarting.values():
                thread.join(180)
            stop.set()
            for thread in threads:
                thread.join(120)
            if failures:
                raise failures[0]

            settled(cluster, "n1", within_s=120)
            check_invariants(cluster, within_s=60)
            log = cluster.log()
            for tail in tails:
                check_stream(tail.until(len(log), within_s=60), log)
            report = account(cluster, load, log, ledgers)
            print(
                f"chaos: kills {Counter(kills)}; pauses {Counter(pauses)}; "
                f"answers {dict(load.statuses)}; {len(log)} events; " + report
            )
            print("chaos: streams read from " + "; ".join(" ".join(t.sources) for t in tails))
        except BaseException:
            print(f"chaos: seed {seed}, kills {kills}, pauses {pauses}\n{cluster.logs()}")
            raise


def _slots(cluster: Cluster) -> list[tuple[str, int]]:
    return [(node, i) for node in cluster.nodes for i in range(AGENTS_PER_NODE)]


def account(
    cluster: Cluster,
    load: Load,
    log: list[tuple[int, str, str | None, dict[str, object]]],
    ledgers: dict[str, str],
) -> str:
    """Every accepted prompt started one turn of its own (plus its policy's retries), and
    its work was done at least once per completed turn and at most once more per turn
    interrupted; a prompt nobody answered started at most one turn. A summary."""
    started: Counter[str] = Counter()  # prompt -> turns started for it, not retries
    retried: Counter[str] = Counter()
    completed: Counter[str] = Counter()
    interrupted: Counter[str] = Counter()
    prompt_of: dict[tuple[str | None, object], str] = {}
    for _, kind, agent, data in log:
        if kind == "agent.turn_started":
            text = str(data["prompt"])
            prompt_of[(agent, data["turn"])] = text
            (retried if data.get("retry") else started)[text] += 1
        elif kind == "agent.turn_completed":
            completed[prompt_of[(agent, data["turn"])]] += 1
        elif kind == "agent.turn_interrupted":
            interrupted[prompt_of[(agent, data["turn"])]] += 1
    accepted = set(load.accepted.values())
    lost = sorted(t for t in accepted if started[t] == 0)
    twice = sorted(t for t in started if started[t] > 1)
    strays = sorted(
        t for t in started if t not in accepted and t not in load.unknown.values() and t != ""
    )
    assert not lost, f"accepted prompts that never started a turn: {lost}"
    assert not twice, f"prompts that started more than one turn: {twice}"
    assert not strays, f"turns started for prompts no daemon accepted: {strays}"
    done: Counter[str] = Counter()
    for ledger in ledgers.values():
        done.update(cluster.ledger(ledger))
    wrong = {
        t: (done[t], completed[t], interrupted[t])
        for t in started
        if not completed[t] <= done[t] <= completed[t] + interrupted[t]
    }
    assert not wrong, f"work done (done, completed, interrupted) off the turns' count: {wrong}"
    return (
        f"{len(load.accepted)} prompts accepted, {len(load.busy)} refused busy, "
        f"{len(load.unknown)} unanswered; {sum(interrupted.values())} turns interrupted, "
        f"{sum(retried.values())} retried; work done again by a leftover: "
        f"{sum(done[t] - completed[t] for t in started)}"
    )
