"""The agent service: turns per second, restart time, and state-change-to-SSE latency; and
turns per second against what the engine's bare durable commits do in the same run.

Goals (issue: the daemon): at least 500 no-op turns/s on SQLite with 100 agents; SSE p99
under 50 ms; restart with 1,000 agents under 2 s. Goals (issue 16, group commit): no-op
turns/s at least 50 % of the bare commit rate, on SQLite (one writer: ``BEGIN IMMEDIATE``,
``INSERT``, ``COMMIT`` with the store's pragmas) and on PostgreSQL (one client's ``INSERT``
and ``COMMIT``, ``synchronous_commit`` on). The second table also gives how many appends
each commit held during the turns (``commit_stats``), the CPU a turn took (this process,
and the whole machine from ``/proc/stat``: agent workers and the database too) with the
turns/s the machine's cores allow at that cost (cores / machine CPU a turn: a bound whatever
the store does), and the store alone under 100 concurrent appenders of one event each. Run
with ``.venv/bin/python -m bench bench_daemon``. The PostgreSQL rows need a server at
``CORRAL_BENCH_PG`` (default postgresql://postgres@127.0.0.1:5432/postgres); without one they
are skipped with a note.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import httpx

from bench._harness import machine_busy_s, row
from bench._serve import ServeProcess
from corral.daemon import (
    AgentService,
    NewEvent,
    PythonHarness,
    SQLiteStore,
    open_store,
)
from corral.daemon._tuning import tune as tune_process
from corral.daemon.stores import CommitStats, PostgresStore

AGENTS = 100
SECONDS = 5.0
RESTART_AGENTS = 1_000
SSE_AGENTS = 20
SSE_ROUNDS = 25
BARE_SECONDS = 3.0
APPENDERS = 100
SPEC = {"name": "noop", "harness": "python", "function": "bench._noop_agent:turn"}
PG_ADMIN = os.environ.get("CORRAL_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")

StoreURL = Callable[[], AbstractAsyncContextManager[str]]


def sqlite_url(directory: Path) -> StoreURL:
    @asynccontextmanager
    async def fresh() -> AsyncIterator[str]:
        path = directory / f"{uuid.uuid4().hex[:8]}.db"
        yield f"sqlite:///{path}"

    return fresh


@asynccontextmanager
async def postgres_url() -> AsyncIterator[str]:
    import psycopg

    name = f"corral_bench_{uuid.uuid4().hex[:8]}"
    async with await psycopg.AsyncConnection.connect(PG_ADMIN, autocommit=True) as admin:
        await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"
    finally:
        async with await psycopg.AsyncConnection.connect(PG_ADMIN, autocommit=True) as admin:
            await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


@dataclass(frozen=True)
class TurnRun:
    """The timed turns: their rate, how the store committed them, and the CPU they took
    (ms a turn: this process's, every thread; and the whole machine's: workers and database
    too)."""

    rate: float
    stats: CommitStats
    process_ms: float
    machine_ms: float


async def turns_per_second(url: str, home: Path) -> TurnRun:
    """100 agents, each prompted again as soon as its last turn is done, for SECONDS, after
    one untimed turn each (which starts each agent's worker: a fork, tens of ms on a busy
    machine, which the timed part would otherwise mostly measure); and how the store
    committed the appends of the timed part."""
    store = open_store(url)
    await store.open()
    service = AgentService(store, home=home, harnesses={"python": PythonHarness()})
    await service.start()
    ids = [(await service.spawn({**SPEC, "name": f"noop-{i}"})).body["id"] for i in range(AGENTS)]
    idle = {agent_id: asyncio.Event() for agent_id in ids}

    async def watch() -> None:
        async for event in service.subscribe():
            if event.type == "agent.state_changed" and event.data["to"] == "idle":
                idle[event.agent_id or ""].set()

    watcher = asyncio.create_task(watch())
    await asyncio.sleep(0)

    async def one_turn(agent_id: str) -> None:
        idle[agent_id].clear()
        await service.prompt(agent_id, "go")
        await idle[agent_id].wait()

    await asyncio.gather(*(one_turn(a) for a in ids))  # warm-up
    tune_process()  # as `corral serve` does once it is up
    end = time.perf_counter() + SECONDS
    done = 0

    async def drive(agent_id: str) -> None:
        nonlocal done
        while time.perf_counter() < end:
            await one_turn(agent_id)
            done += 1

    before = commit_stats(store)
    cpu, busy = time.process_time(), machine_busy_s()
    started = time.perf_counter()
    await asyncio.gather(*(drive(a) for a in ids))
    elapsed = time.perf_counter() - started
    cpu, busy = time.process_time() - cpu, machine_busy_s() - busy
    stats = delta(before, commit_stats(store))
    watcher.cancel()
    await service.close()
    await store.close()
    turns = max(done, 1)
    return TurnRun(done / elapsed, stats, cpu / turns * 1000, busy / turns * 1000)


def commit_stats(store: object) -> CommitStats:
    assert isinstance(store, SQLiteStore | PostgresStore)
    return store.commit_stats


def delta(before: CommitStats, after: CommitStats) -> CommitStats:
    return CommitStats(
        after.appends - before.appends,
        after.events - before.events,
        after.commits - before.commits,
        after.largest,
        after.refused - before.refused,
    )


def per_commit(stats: CommitStats) -> str:
    return f"{stats.appends / max(stats.commits, 1):.2f} (max {stats.largest})"


async def appends_per_second(url: str) -> tuple[float, CommitStats]:
    """The store alone: APPENDERS tasks, each appending one event again as soon as its last
    append returned, for SECONDS."""
    store = open_store(url)
    await store.open()
    await store.append([NewEvent("gateway.agent_frozen", None, {"warm": True})])
    end = time.perf_counter() + SECONDS
    done = 0

    async def appender(i: int) -> None:
        nonlocal done
        event = NewEvent("gateway.agent_frozen", f"a_{i}", {"n": i})
        while time.perf_counter() < end:
            await store.append([event])
            done += 1

    before = commit_stats(store)
    started = time.perf_counter()
    await asyncio.gather(*(appender(i) for i in range(APPENDERS)))
    elapsed = time.perf_counter() - started
    stats = delta(before, commit_stats(store))
    await store.close()
    return done / elapsed, stats


def bare_sqlite_commits(path: Path) -> float:
    """Durable commits/s of one SQLite writer with the store's pragmas (WAL, synchronous
    FULL): ``BEGIN IMMEDIATE``, one ``INSERT`` of an event-sized row, ``COMMIT``."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA busy_timeout=5000")
        conn.execute(
            "CREATE TABLE events (seq INTEGER PRIMARY KEY, ts TEXT NOT NULL, type TEXT NOT NULL,"
            " agent_id TEXT, data TEXT NOT NULL)"
        )
        data = json.dumps({"from": "idle", "to": "running", "reason": "prompted"})
        seq = 0
        end = time.perf_counter() + BARE_SECONDS
        started = time.perf_counter()
        while time.perf_counter() < end:
            seq += 1
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(
                "INSERT INTO events VALUES (?, ?, ?, ?, ?)",
                (seq, "2026-01-01T00:00:00+00:00", "agent.state_changed", "a_1", data),
            )
            conn.execute("COMMIT")
        return seq / (time.perf_counter() - started)
    finally:
        conn.close()


def bare_postgres_commits(url: str) -> float:
    """Durable commits/s of one PostgreSQL client (``synchronous_commit`` on): one ``INSERT``
    of an event-sized row, then ``COMMIT``."""
    import psycopg

    with psycopg.connect(url) as conn:
        row = conn.execute("SHOW synchronous_commit").fetchone()
        if row is None or row[0] != "on":
            raise RuntimeError(f"synchronous_commit is {row}, not on: commits would not wait")
        conn.execute(
            "CREATE TABLE bare_events (seq bigint PRIMARY KEY, ts text NOT NULL,"
            " type text NOT NULL, agent_id text, data json NOT NULL)"
        )
        conn.commit()
        data = json.dumps({"from": "idle", "to": "running", "reason": "prompted"})
        seq = 0
        end = time.perf_counter() + BARE_SECONDS
        started = time.perf_counter()
        while time.perf_counter() < end:
            seq += 1
            conn.execute(
                "INSERT INTO bare_events VALUES (%s, %s, %s, %s, %s)",
                (seq, "2026-01-01T00:00:00+00:00", "agent.state_changed", "a_1", data),
            )
            conn.commit()
        return seq / (time.perf_counter() - started)


async def restart_seconds(url: str, home: Path) -> tuple[float, int]:
    """Open the store and start the service on a log of 1,000 agents that ran a turn each."""
    store = open_store(url)
    await store.open()
    service = AgentService(store, home=home, harnesses={"python": PythonHarness()})
    await service.start()
    for i in range(RESTART_AGENTS):
        await service.spawn({**SPEC, "name": f"agent-{i}", "prompt": "one turn"})
    await wait_until(lambda: all(a["state"] == "idle" for a in service.list_agents()))
    events = store.state.last_seq
    await service.close()
    await store.close()

    started = time.perf_counter()
    store = open_store(url)
    await store.open()
    service = AgentService(store, home=home, harnesses={"python": PythonHarness()})
    await service.start()
    elapsed = time.perf_counter() - started
    if len(service.list_agents()) != RESTART_AGENTS:
        raise RuntimeError("the restarted service lost agents")
    await service.close()
    await store.close()
    return elapsed, events


async def sse_latency(url: str, home: Path) -> list[float]:
    """Milliseconds from each state change's commit (its ``ts``) to its SSE arrival, at a
    client outside the daemon: a real ``corral serve`` process, this process the client.

    (Until 2026-12-02 the daemon ran inside this process: its event loop then also ran the
    client, whose reads waited behind the daemon's work, so the figure measured the shared
    loop rather than the daemon.)"""
    token = "bench-sse-" + uuid.uuid4().hex
    daemon = await asyncio.to_thread(ServeProcess, url, home, token)
    latencies: list[float] = []
    try:
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(base_url=daemon.url, headers=headers, timeout=30) as client:
            ids = []
            for i in range(SSE_AGENTS):
                ids.append(
                    (await client.post("/agents", json={**SPEC, "name": f"sse-{i}"})).json()["id"]
                )
            # One untimed turn each first, which starts each agent's worker (a fork, as in
            # turns_per_second): the rounds measure a daemon at work, not its first forks.
            first = {"agent.turn_completed", "agent.turn_failed"}
            for agent_id in ids:
                await client.post(f"/agents/{agent_id}/prompt", json={"text": "x"})
            await wait_until_async(lambda: _ended_turns(client, first), SSE_AGENTS)
            after = (await client.get("/events", params={"format": "json"})).json()["lastSeq"]

            async def listen() -> None:
                headers = {"Last-Event-ID": str(after)}
                async with client.stream("GET", "/events", headers=headers) as response:
                    async for line in response.aiter_lines():
                        if line.startswith("data:"):
                            event = json.loads(line[5:])
                            if event["type"] == "agent.state_changed":
                                ts = datetime.fromisoformat(event["ts"]).timestamp()
                                latencies.append((time.time() - ts) * 1000)

            listener = asyncio.create_task(listen())
            # Each turn is two state changes (running, then idle): a round is over once the
            # stream has brought both of every agent's.
            for done in range(1, SSE_ROUNDS + 1):
                await asyncio.gather(
                    *(client.post(f"/agents/{a}/prompt", json={"text": "x"}) for a in ids)
                )
                expected = 2 * SSE_AGENTS * done
                await wait_until(lambda: len(latencies) >= expected, 30)  # noqa: B023
            listener.cancel()
            await asyncio.gather(listener, return_exceptions=True)
    finally:
        await asyncio.to_thread(daemon.stop)
    return latencies


async def _ended_turns(client: httpx.AsyncClient, types: set[str]) -> int:
    """How many turns have ended in the daemon's log so far."""
    page = (await client.get("/events", params={"format": "json", "limit": "1000"})).json()
    return sum(1 for event in page["events"] if event["type"] in types)


async def wait_until_async(count: Callable[[], Awaitable[int]], at_least: int) -> None:
    """Poll ``count()`` (a request to the daemon) every 50 ms until it reaches ``at_least``."""
    deadline = time.perf_counter() + 60
    while await count() < at_least:
        if time.perf_counter() > deadline:
            raise TimeoutError("the benchmark did not settle")
        await asyncio.sleep(0.05)


async def wait_until(condition: Callable[[], bool], within_s: float = 60.0) -> None:
    deadline = time.perf_counter() + within_s
    while not condition():
        if time.perf_counter() > deadline:
            raise TimeoutError("the benchmark did not settle")
        await asyncio.sleep(0.01)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))]


@dataclass(frozen=True)
class Throughput:
    """One engine's turns and appends against its bare commits, measured side by side."""

    label: str
    bare: tuple[float, float]  # bare durable commits/s, just before and just after the turns
    turns: TurnRun
    appends: float
    append_stats: CommitStats

    def row(self) -> str:
        before, after = self.bare
        turns = self.turns
        return row(
            self.label,
            f"{before:,.0f} / {after:,.0f}",
            f"{turns.rate:,.0f}",
            f"{turns.rate / ((before + after) / 2):.0%}",
            per_commit(turns.stats),
            f"{turns.process_ms:.2f} / {turns.machine_ms:.2f}",
            f"{(os.cpu_count() or 1) / turns.machine_ms * 1000:,.0f}" if turns.machine_ms else "-",
            f"{self.appends:,.0f}",
            per_commit(self.append_stats),
        )


async def run(label: str, fresh: StoreURL, tmp: Path) -> tuple[list[str], Throughput]:
    async with fresh() as url:
        bare_before = await asyncio.to_thread(bare_commits, url)
    async with fresh() as url:
        turns = await turns_per_second(url, tmp / f"{label}-turns")
    async with fresh() as url:
        bare_after = await asyncio.to_thread(bare_commits, url)
    async with fresh() as url:
        appends, append_stats = await appends_per_second(url)
    async with fresh() as url:
        restart, events = await restart_seconds(url, tmp / f"{label}-restart")
    async with fresh() as url:
        latencies = await sse_latency(url, tmp / f"{label}-sse")
    lines = [
        row(
            label,
            f"{turns.rate:,.0f}",
            f"{statistics.median(latencies):.1f} ms",
            f"{percentile(latencies, 0.99):.1f} ms",
            f"{restart:.3f} s ({events:,} events)",
        )
    ]
    bare = (bare_before, bare_after)
    return lines, Throughput(label, bare, turns, appends, append_stats)


def bare_commits(url: str) -> float:
    if url.startswith("sqlite:///"):
        return bare_sqlite_commits(Path(url.removeprefix("sqlite:///")))
    return bare_postgres_commits(url)


def main() -> None:
    print(
        row(
            "store",
            f"no-op turns/s ({AGENTS} agents)",
            "SSE p50",
            "SSE p99",
            f"restart, {RESTART_AGENTS:,} agents",
        )
    )
    print(row("---", "---:", "---:", "---:", "---:"))
    throughput = []
    with tempfile.TemporaryDirectory() as tmp:
        lines, measured = asyncio.run(run("SQLite", sqlite_url(Path(tmp)), Path(tmp)))
        print(*lines, sep="\n")
        throughput.append(measured)
        try:
            lines, measured = asyncio.run(run("PostgreSQL", postgres_url, Path(tmp)))
            print(*lines, sep="\n")
            throughput.append(measured)
        except OSError as exc:  # no server answers: say so rather than fail the whole run
            print(f"PostgreSQL skipped: {exc}")
    print()
    print(
        row(
            "store",
            "bare commits/s (before / after)",
            f"no-op turns/s ({AGENTS} agents)",
            "turns / bare (mean)",
            "appends per commit (turns)",
            "CPU ms a turn (process / machine)",
            "turns/s the cores allow",
            f"appends/s ({APPENDERS} appenders)",
            "appends per commit (appenders)",
        )
    )
    print(row("---", "---:", "---:", "---:", "---:", "---:", "---:", "---:", "---:"))
    for measured in throughput:
        print(measured.row())


if __name__ == "__main__":
    main()
