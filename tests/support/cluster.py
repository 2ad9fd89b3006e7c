"""Several real ``corral serve --node`` processes on one PostgreSQL database, for the cluster's
end-to-end and chaos tests: start, kill -9, pause and restart them, follow their event
streams, and check the invariants the cluster promises once the dust has settled.

    cluster = Cluster(tmp_path, postgres_dsn, ("n1", "n2", "n3"), lease_s=1.5)
    with cluster:
        agent = cluster.spawn("n2", via="n1", name="w", command=worker(...))
        ...
        check_invariants(cluster)

Each node has a directory of its own under ``tmp_path`` (its ``--home`` and its output), the
same ``--token`` and ``--lease-s``; a restart keeps its name, home and port.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import psycopg

from tests.support.replay import assert_projections_equal_replay
from tests.support.serve_process import WAIT_BOUND_S, ServeProcess, wait_for

TOKEN = "cluster-test-token-0123456789abcdef"

# What a test's command agent runs: ``python -c WORKER LEDGER``. It appends its prompt to the
# ledger (a file outside every node's home, so every attempt on any node lands in one place)
# when the turn's work is done. Prompts starting with:
# - ``fail``: the first attempt fails (exit 1) without doing the work, later ones succeed;
# - ``hang``: the first attempt waits for ``LEDGER.gate`` (a leftover, once its daemon is
#   gone) and then does the work as "PROMPT first"; later ones do it at once.
# A marker ``LEDGER.PROMPT.tried`` tells a first attempt from a later one, on any node.
WORKER = """\
import pathlib, sys, time
prompt = sys.stdin.read().strip()
ledger = pathlib.Path(sys.argv[1])
marker = ledger.with_name(ledger.name + "." + prompt + ".tried")
first = not marker.exists()
marker.touch()
if first and prompt.startswith("fail"):
    sys.exit("refusing the first time")
if first and prompt.startswith("hang"):
    gate = ledger.with_name(ledger.name + ".gate")
    deadline = time.monotonic() + 300
    while not gate.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    prompt += " first"
with ledger.open("a") as f:
    f.write(prompt + "\\n")
print("did " + prompt)
"""

TURN_ENDS = ("agent.turn_completed", "agent.turn_failed", "agent.turn_interrupted")
# An agent in one of these states has no turn in flight.
SETTLED = ("idle", "blocked", "stopped", "completed", "failed", "paused")


def store_url(dsn: str) -> str:
    """``dsn`` (libpq keywords or a URL) as the ``postgresql://`` URL ``--store`` takes."""
    from psycopg.conninfo import conninfo_to_dict

    parts = conninfo_to_dict(dsn)
    return f"postgresql://{parts['user']}@{parts['host']}:{parts['port']}/{parts['dbname']}"


class ClusterNode(ServeProcess):
    """One ``corral serve --node NAME`` of a :class:`Cluster` (home ``<tmp>/NAME/home``)."""

    def __init__(self, tmp_path: Path, name: str, store: str, lease_s: float) -> None:
        base = tmp_path / name
        base.mkdir(parents=True, exist_ok=True)
        super().__init__(base, "--node", name, "--token", TOKEN, "--lease-s", f"{lease_s:g}")
        self.name = name
        self.store = store
        self.paused = False

    @property
    def token(self) -> str:
        return TOKEN

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def pause(self) -> None:
        """SIGSTOP: the process stays, does nothing, renews nothing."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)
        self.paused = False

    def stop(self) -> None:
        if self.paused:
            self.resume()
        super().stop()

    def turn_pid(self, agent_id: str) -> int | None:
        """The pid of ``agent_id``'s turn process this node started (its pid file), if any."""
        path = self.home / "agents" / agent_id / "state" / "turn.pid"
        try:
            pid: int = json.loads(path.read_text())["pid"]
        except (FileNotFoundError, ValueError, KeyError):
            return None
        return pid


class Cluster:
    """``names`` nodes on the database ``dsn`` (see the module docstring)."""

    def __init__(
        self,
        tmp_path: Path,
        dsn: str,
        names: Sequence[str] = ("n1", "n2", "n3"),
        *,
        lease_s: float = 1.5,
    ) -> None:
        self.dsn = dsn
        self.store = store_url(dsn)
        self.lease_s = lease_s
        self.ledgers = tmp_path / "ledgers"
        self.ledgers.mkdir(parents=True, exist_ok=True)
        self.nodes = {name: ClusterNode(tmp_path, name, self.store, lease_s) for name in names}
        self._clients: dict[str, httpx.Client] = {}
        self.tails: list[EventTail] = []

    # --- processes --------------------------------------------------------------------------

    def start(self, names: Iterable[str] | None = None) -> None:
        """Start ``names`` (default: every node) side by side, each waited for."""
        chosen = [self.nodes[n] for n in (self.nodes if names is None else names)]
        with ThreadPoolExecutor(len(chosen)) as pool:
            for started in pool.map(lambda node: node.start(), chosen):
                self._forget_client(started.name)

    def restart(self, name: str, *, within_s: float = WAIT_BOUND_S) -> None:
        """Start ``name`` again; while its last incarnation's lease still runs the node is
        refused (a live node of that name), so it is tried again until it starts."""
        node = self.nodes[name]
        deadline = time.monotonic() + within_s
        while True:
            try:
                node.start()
            except AssertionError:
                if "is live" not in node.log() or time.monotonic() > deadline:
                    raise
                continue
            self._forget_client(name)
            return

    def _forget_client(self, name: str) -> None:
        client = self._clients.pop(name, None)
        if client is not None:
            client.close()

    def stop(self) -> None:
        for tail in self.tails:
            tail.close()
        for client in self._clients.values():
            client.close()
        self._clients.clear()
        with ThreadPoolExecutor(len(self.nodes)) as pool:
            list(pool.map(lambda node: node.stop(), self.nodes.values()))

    def __enter__(self) -> Cluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def logs(self) -> str:
        """Every node's output of its current start, for a failing test's message."""
        return "\n".join(f"--- {n.name}\n{n.log()[-4000:]}" for n in self.nodes.values())

    # --- calls ------------------------------------------------------------------------------

    def api(self, name: str) -> httpx.Client:
        """A client of node ``name`` with the shared token (kept across calls)."""
        client = self._clients.get(name)
        if client is None:
            client = self._clients[name] = self.nodes[name].client()
        return client

    def spawn(self, node: str | None, *, via: str, **spec: Any) -> dict[str, Any]:
        """A new command agent through ``via``, placed on ``node`` (None: where the cluster
        places it); its record."""
        params = {} if node is None else {"node": node}
        answer = self.api(via).post("/agents", params=params, json={"harness": "command", **spec})
        assert answer.status_code == 201, answer.text
        record: dict[str, Any] = answer.json()
        return record

    def worker(self, ledger: str) -> list[str]:
        """The command of an agent that runs :data:`WORKER` on ledger file ``ledger``."""
        return [sys.executable, "-c", WORKER, str(self.ledgers / ledger)]

    def ledger(self, name: str) -> list[str]:
        """The lines the agents on ledger ``name`` wrote, in order."""
        path = self.ledgers / name
        return path.read_text().splitlines() if path.exists() else []

    def open_gate(self, name: str) -> None:
        """Let the first attempts of ``hang`` prompts on ledger ``name`` finish."""
        (self.ledgers / (name + ".gate")).touch()

    def record(self, agent_id: str, via: str) -> dict[str, Any]:
        answer = self.api(via).get(f"/agents/{agent_id}")
        assert answer.status_code == 200, answer.text
        found: dict[str, Any] = answer.json()
        return found

    def until_state(
        self, agent_id: str, *states: str, via: str, within_s: float = WAIT_BOUND_S
    ) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            rec = self.record(agent_id, via)
            return rec if rec["state"] in states else None

        found: dict[str, Any] = wait_for(
            reached, f"agent {agent_id} to be {'/'.join(states)}", within_s=within_s
        )
        return found

    def owners(self, via: str) -> dict[str, str]:
        """``GET /nodes`` through ``via``: agent -> the node holding its lease."""
        answer = self.api(via).get("/nodes")
        assert answer.status_code == 200, answer.text
        return {agent: n["name"] for n in answer.json()["nodes"] for agent in n["agents"]}

    def live(self, via: str) -> dict[str, bool]:
        answer = self.api(via).get("/nodes")
        assert answer.status_code == 200, answer.text
        return {n["name"]: n["live"] for n in answer.json()["nodes"]}

    # --- the store, read directly -------------------------------------------------------------

    def query(self, statement: str, *args: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn) as conn:
            return list(conn.execute(statement, args).fetchall())

    def log(self) -> list[tuple[int, str, str | None, dict[str, Any]]]:
        """Every event in the database: (seq, type, agent, data), by seq."""
        rows = self.query("SELECT seq, type, agent_id, data FROM events ORDER BY seq")
        return [(int(s), str(t), a, d) for s, t, a, d in rows]


class EventTail:
    """An SSE client of ``GET /events`` started on node ``first`` from the start of the log;
    when its connection ends (the node died) it resumes on the next node with
    ``Last-Event-ID``, as a browser's EventSource would. ``seen``: the events it got, as
    sent; ``sources``: the nodes it read from, in order."""

    def __init__(self, cluster: Cluster, first: str) -> None:
        self.cluster = cluster
        self.seen: list[dict[str, Any]] = []
        self.sources: list[str] = []
        self.errors: list[str] = []
        cluster.tails.append(self)
        self._order = list(cluster.nodes)
        self._at = self._order.index(first)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"tail-{first}")
        self._thread.start()

    @property
    def last(self) -> int:
        return int(self.seen[-1]["seq"]) if self.seen else 0

    def _run(self) -> None:
        while not self._stop.is_set():
            node = self.cluster.nodes[self._order[self._at]]
            if not node.running or not node.url:
                self._next()
                continue
            headers = {"authorization": f"Bearer {TOKEN}", "Last-Event-ID": str(self.last)}
            if not self.sources or self.sources[-1] != node.name:
                self.sources.append(node.name)
            try:
                # A short read timeout: a quiet stream is read again (resumed after what it
                # saw, on the same node) and the thread sees close() soon.
                with (
                    httpx.Client(timeout=httpx.Timeout(5.0, read=1.0)) as client,
                    client.stream("GET", node.url + "/events", headers=headers) as response,
                ):
                    if response.status_code != 200:
                        # Behind the log (it has not read the last commits yet): elsewhere.
                        self.errors.append(f"{node.name}: {response.status_code}")
                        self._next()
                        continue
                    for line in response.iter_lines():
                        if line.startswith("data:"):
                            self.seen.append(json.loads(line[5:]))
                        if self._stop.is_set():
                            return
            except httpx.ReadTimeout:
                continue
            except httpx.HTTPError as exc:
                self.errors.append(f"{node.name}: {type(exc).__name__}")
            self._next()

    def _next(self) -> None:
        self._at = (self._at + 1) % len(self._order)
        time.sleep(0.05)  # not a wait for a condition: a pause between reconnections

    def until(self, seq: int, *, within_s: float = WAIT_BOUND_S) -> list[dict[str, Any]]:
        """What it saw, once it has seen event ``seq``; then it stops."""
        wait_for(lambda: self.last >= seq, f"the stream to reach event {seq}", within_s=within_s)
        self.close()
        return list(self.seen)

    def close(self) -> None:
        """Stop reading (within its read timeout). Idempotent."""
        self._stop.set()
        self._thread.join(WAIT_BOUND_S)


def settled(cluster: Cluster, via: str, *, within_s: float = 30.0) -> list[dict[str, Any]]:
    """Every agent, once none has a turn in flight (as ``via`` sees them)."""

    def quiet() -> list[dict[str, Any]] | None:
        answer = cluster.api(via).get("/agents", params={"limit": 1000})
        assert answer.status_code == 200, answer.text
        agents: list[dict[str, Any]] = answer.json()["agents"]
        return agents if all(a["state"] in SETTLED for a in agents) else None

    found: list[dict[str, Any]] = wait_for(quiet, "every turn to end", within_s=within_s)
    return found


def turn_outcomes(
    log: Sequence[tuple[int, str, str | None, dict[str, Any]]],
) -> dict[tuple[str, int], list[str]]:
    """(agent, turn) -> the types of the events that started and ended it, in log order."""
    found: dict[tuple[str, int], list[str]] = defaultdict(list)
    for _, kind, agent, data in log:
        if agent is not None and (kind == "agent.turn_started" or kind in TURN_ENDS):
            found[(agent, int(data["turn"]))].append(kind)
    return found


# A turn's events: started, then completed or failed, or interrupted (then failed when the
# policy counts it: a daemon died; alone when a person stopped it).
_ENDED_ONCE = (
    ["agent.turn_started", "agent.turn_completed"],
    ["agent.turn_started", "agent.turn_failed"],
    ["agent.turn_started", "agent.turn_interrupted"],
    ["agent.turn_started", "agent.turn_interrupted", "agent.turn_failed"],
)


def check_invariants(cluster: Cluster, *, within_s: float = 30.0) -> None:
    """What the cluster promises once no node is being killed: every agent leased to exactly
    one live node, the log gapless, every turn started ended once, and the projections equal
    to a replay of the log. Call with every node running and every turn ended."""
    names = set(cluster.nodes)

    def all_leased_live() -> bool:
        rows = cluster.query(
            "SELECT a.id, l.node, (n.expires > clock_timestamp() AND NOT n.stopped) "
            "FROM agents a LEFT JOIN leases l ON l.agent_id = a.id "
            "LEFT JOIN nodes n ON n.name = l.node"
        )
        return bool(rows) and all(node in names and live for _, node, live in rows)

    wait_for(all_leased_live, "every agent leased to a live node", within_s=within_s)
    (leases,) = cluster.query("SELECT count(*) FROM leases")[0]
    (agents,) = cluster.query("SELECT count(*) FROM agents")[0]
    assert leases == agents, f"{leases} leases for {agents} agents"

    log = cluster.log()
    seqs = [seq for seq, *_ in log]
    assert seqs == list(range(1, len(seqs) + 1)), "the log has a gap"
    (counter,) = cluster.query("SELECT last_seq FROM event_counter")[0]
    assert counter == len(seqs)

    bad = {
        turn: kinds
        for turn, kinds in turn_outcomes(log).items()
        if kinds not in [list(k) for k in _ENDED_ONCE]
    }
    assert not bad, f"turns not started and ended once: {bad}"

    assert_projections_equal_replay(cluster.dsn)


def check_stream(seen: Sequence[dict[str, Any]], log: Sequence[tuple[int, str, Any, Any]]) -> None:
    """An SSE client saw every event of ``log`` once, in order, as the log holds it."""
    got = [(e["seq"], e["type"], e.get("agentId")) for e in seen]
    want = [(seq, kind, agent) for seq, kind, agent, _ in log]
    duplicates = [seq for seq, n in Counter(seq for seq, *_ in got).items() if n > 1]
    assert not duplicates, f"events seen twice: {duplicates[:20]}"
    assert len(got) == len(want), f"the stream saw {len(got)} events of {len(want)}"
    assert got == want, (
        "the stream differs from the log at event "
        f"{next(i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b) + 1}"
    )


def kill_leftovers(pids: Iterable[int]) -> None:
    """End processes a failing test may leave behind (a hanging turn of a dead node)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
