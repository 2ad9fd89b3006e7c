"""Three real ``corral serve --node`` processes on one PostgreSQL database, with a team spread
over them: commands through any daemon reach their agent's owner (idempotency keys too);
every daemon streams the whole log over SSE, resumed on another with Last-Event-ID; ``kill
-9`` of a daemon mid-turn has its agents adopted by the others and each interrupted turn
settled once; the dead daemon, restarted, ends its leftover turn processes and adopts
nothing it no longer owns; a daemon paused past its lease (SIGSTOP) is fenced off when it
resumes and rejoins. Then the invariants: every agent leased to one live daemon, the log
gapless, every turn started ended once, the projections equal to a replay of the log.

One scenario, in phases, on one cluster: starting three daemons costs more than the rest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import (
    Cluster,
    EventTail,
    check_invariants,
    check_stream,
    kill_leftovers,
    settled,
    turn_outcomes,
)
from tests.support.processes import gone
from tests.support.serve_process import wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(180)]

LEASE_S = 2.5  # a shorter lease lapses when the suite loads both cores (see make chaos)
INTERRUPTED = ["agent.turn_started", "agent.turn_interrupted", "agent.turn_failed"]
COMPLETED = ["agent.turn_started", "agent.turn_completed"]


def spawn_worker(
    cluster: Cluster, name: str, node: str | None, via: str, **spec: Any
) -> dict[str, Any]:
    """A command agent running the test worker on ledger ``name``; retried once on failure
    unless ``spec`` says otherwise."""
    if spec.setdefault("onFailure", "retry") == "retry":
        spec.setdefault("maxRetries", 1)
    return cluster.spawn(node, via=via, name=name, command=cluster.worker(name), **spec)


def prompt(cluster: Cluster, agent: str, text: str, via: str, key: str | None = None) -> Any:
    body: dict[str, Any] = {"text": text}
    if key is not None:
        body["idempotencyKey"] = key
    answer = cluster.api(via).post(f"/agents/{agent}/prompt", json=body)
    assert answer.status_code == 202, answer.text
    return answer


def outcomes_of(cluster: Cluster, agent: str) -> list[list[str]]:
    """The agent's turns, each as the types of the events that started and ended it."""
    found = turn_outcomes(cluster.log())
    return [found[key] for key in sorted(k for k in found if k[0] == agent)]


def owned_by(cluster: Cluster, via: str) -> dict[str, set[str]]:
    """Node -> the agents it holds, as ``GET /nodes`` on ``via`` answers."""
    found: dict[str, set[str]] = {name: set() for name in cluster.nodes}
    for agent, node in cluster.owners(via).items():
        found[node].add(agent)
    return found


def test_three_daemons_commands_events_kill_restart_and_pause(
    tmp_path: Path, postgres_dsn: str
) -> None:
    cluster = Cluster(tmp_path, postgres_dsn, ("n1", "n2", "n3"), lease_s=LEASE_S)
    leftovers: list[int] = []
    with cluster:
        try:
            tails = [EventTail(cluster, name) for name in cluster.nodes]
            run_scenario(cluster, leftovers, tails)
        except BaseException:
            kill_leftovers(leftovers)
            print(cluster.logs())
            raise


def run_scenario(cluster: Cluster, leftovers: list[int], tails: list[EventTail]) -> None:
    # --- a team spread over the three daemons, each spawned through another daemon ---------
    workers = {
        node: spawn_worker(cluster, f"w-{node}", node, via, prompt=f"p0-{node}")["id"]
        for node, via in (("n1", "n2"), ("n2", "n3"), ("n3", "n1"))
    }
    # A child goes to its parent's daemon, whichever daemon was asked.
    child = spawn_worker(cluster, "child", None, "n3", parent=workers["n1"], prompt="c0")["id"]
    hang_a = spawn_worker(cluster, "hang-a", "n2", "n1")["id"]
    hang_b = spawn_worker(cluster, "hang-b", "n2", "n3")["id"]
    ask = spawn_worker(cluster, "ask", "n1", "n2", onFailure="ask", prompt="fail-1")["id"]
    idle = spawn_worker(cluster, "idle", "n3", "n2")["id"]
    placed = {
        "n1": {workers["n1"], child, ask},
        "n2": {workers["n2"], hang_a, hang_b},
        "n3": {workers["n3"], idle},
    }
    for via in cluster.nodes:
        assert owned_by(cluster, via) == placed, f"GET /nodes on {via}"

    # --- commands through any daemon reach the agent ----------------------------------------
    sent: dict[str, list[str]] = {node: [f"p0-{node}"] for node in workers}
    for node, agent in workers.items():
        for via in cluster.nodes:
            if via == node:
                continue
            # Idle as its owner sees it: another daemon may not have read the last prompt's
            # turn yet, and would show the agent idle while it runs.
            cluster.until_state(agent, "idle", via=node)
            text = f"p-{node}-via-{via}"
            prompt(cluster, agent, text, via)
            sent[node].append(text)
    # An idempotency key retried through another daemon: the same answer, marked replayed.
    cluster.until_state(workers["n2"], "idle", via="n2")
    first = prompt(cluster, workers["n2"], "keyed", "n1", key="prompt-once")
    again = prompt(cluster, workers["n2"], "keyed", "n3", key="prompt-once")
    sent["n2"].append("keyed")
    assert again.json() == first.json()
    assert again.headers.get("idempotency-replayed") == "true"
    assert len(again.headers.get_list("date")) == 1, "the owner's headers were sent on twice"

    # A decision answered through daemons that do not own its agent, twice with one key.
    cluster.until_state(ask, "blocked", via="n3")
    (decision,) = cluster.api("n3").get("/decisions").json()["decisions"]
    assert decision["agentId"] == ask
    body = {"answer": "retry", "why": "try again", "idempotencyKey": "answer-once"}
    answered = cluster.api("n2").post(f"/decisions/{decision['id']}", json=body)
    replayed = cluster.api("n3").post(f"/decisions/{decision['id']}", json=body)
    assert answered.status_code < 300, answered.text
    assert (replayed.status_code, replayed.json()) == (answered.status_code, answered.json())
    assert replayed.headers.get("idempotency-replayed") == "true"
    cluster.until_state(ask, "idle", via="n1")
    assert cluster.ledger("ask") == ["fail-1"], "the retry did the work once"

    stopped = cluster.api("n1").post(f"/agents/{idle}/stop", json={})
    assert stopped.status_code == 202, stopped.text
    cluster.until_state(idle, "stopped", via="n2")

    # --- kill -9 of n2 in the middle of two turns -------------------------------------------
    for agent in workers.values():
        cluster.until_state(agent, "idle", via="n1")
    prompt(cluster, hang_a, "hang-a", "n1")
    prompt(cluster, hang_b, "hang-b", "n3")
    n2 = cluster.nodes["n2"]
    pids: list[int] = [
        wait_for(lambda a=a: n2.turn_pid(a), f"{a}'s turn process")  # type: ignore[misc]
        for a in (hang_a, hang_b)
    ]
    leftovers += pids
    n2.kill_9()

    def adopted() -> dict[str, set[str]] | None:
        now = owned_by(cluster, "n1")
        return now if not now["n2"] and not cluster.live("n1")["n2"] else None

    after_kill = wait_for(adopted, "n2's agents adopted by n1 and n3")
    assert after_kill["n1"] | after_kill["n3"] == placed["n1"] | placed["n2"] | placed["n3"]
    assert owned_by(cluster, "n3") == after_kill
    for agent, name in ((hang_a, "hang-a"), (hang_b, "hang-b")):
        cluster.until_state(agent, "idle", via="n3")
        # Interrupted once where it died, retried once by its new owner.
        assert outcomes_of(cluster, agent) == [INTERRUPTED, COMPLETED], agent
        assert cluster.ledger(name) == [name], "the leftover's work was not done, the retry's was"
    assert not any(gone(pid) for pid in pids), "a turn's process outlives its daemon"

    # --- n2 restarted: its leftovers ended, nothing adopted it no longer owns ---------------
    cluster.restart("n2")
    for pid in pids:
        wait_for(lambda p=pid: gone(p), f"n2's leftover turn process {pid} to be ended")  # type: ignore[misc]
    assert cluster.live("n2")["n2"]
    assert owned_by(cluster, "n2") == after_kill, "n2 took back agents it no longer owns"
    prompt(cluster, hang_a, "again-a", "n2")
    cluster.until_state(hang_a, "idle", via="n2")
    assert cluster.ledger("hang-a") == ["hang-a", "again-a"]

    # --- n3 paused past its lease mid-turn: adopted, and fenced off when it resumes ---------
    slow = spawn_worker(cluster, "slow", "n3", "n1", prompt="hang-slow")["id"]
    n3 = cluster.nodes["n3"]
    leftovers.append(wait_for(lambda: n3.turn_pid(slow), "slow's turn process"))
    n3.pause()

    def taken_over() -> dict[str, set[str]] | None:
        now = owned_by(cluster, "n1")
        return now if not now["n3"] and not cluster.live("n1")["n3"] else None

    after_pause = wait_for(taken_over, "n3's agents adopted while it is paused")
    assert slow in after_pause["n1"] | after_pause["n2"]
    cluster.until_state(slow, "idle", via="n2")
    # The paused daemon's turn process finishes its work meanwhile: its daemon must not
    # record that turn when it resumes, its new owner has settled it.
    cluster.open_gate("slow")
    wait_for(lambda: "hang-slow first" in cluster.ledger("slow"), "the paused turn's work")
    mark = cluster.log()[-1][0]
    n3.resume()
    wait_for(lambda: cluster.live("n1")["n3"], "n3 to rejoin")
    late = spawn_worker(cluster, "late", "n3", "n2", prompt="late")["id"]
    cluster.until_state(late, "idle", via="n3")
    assert "lease ran out" in n3.log()
    assert [e for e in cluster.log() if e[0] > mark and e[2] == slow] == []
    assert outcomes_of(cluster, slow) == [INTERRUPTED, COMPLETED]
    assert owned_by(cluster, "n3")["n3"] == {late}

    # --- the invariants ------------------------------------------------------------------------
    agents = settled(cluster, "n1")
    assert {a["id"] for a in agents} >= {slow, late, idle, child}
    log = cluster.log()
    for tail in tails:
        check_stream(tail.until(len(log)), log)
    # n2's stream went on from another daemon once n2 was killed.
    assert tails[1].sources[:2] in (["n2", "n3"], ["n2", "n1"]), tails[1].sources
    check_invariants(cluster)
    for node, agent in workers.items():
        assert cluster.ledger(f"w-{node}") == sent[node], agent
