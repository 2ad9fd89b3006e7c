"""Several daemons on one PostgreSQL store: no-op turns/s with one ``corral serve --node``
and with three, 100 agents spread over them, beside one client's bare commits/s measured in
the same run; and how long a dead daemon's agents take to be adopted.

Goal (issue 16): three daemons at least twice the turns/s of one. Real processes, each its
own Python and event loop, on this machine's cores; the driver prompts each agent on its
owner as soon as the owner's event stream says its last turn is done. Run with
``.venv/bin/python -m bench bench_cluster`` (a server at ``CORRAL_BENCH_PG``, default
postgresql://postgres@127.0.0.1:5432/postgres). ``CORRAL_BENCH_SECONDS`` sets the timed part
(default 10).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench._harness import machine_busy_s, row
from bench._serve import ServeProcess
from bench.bench_daemon import PG_ADMIN, bare_postgres_commits

AGENTS = 100
SECONDS = float(os.environ.get("CORRAL_BENCH_SECONDS", "10"))
LEASE_S = 2.0
TOKEN = "bench-cluster-" + uuid.uuid4().hex
SPEC = {"harness": "python", "function": "bench._noop_agent:turn"}
HEADERS = {"authorization": f"Bearer {TOKEN}"}


@contextlib.contextmanager
def database() -> Iterator[str]:
    import psycopg

    name = f"corral_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


class Daemon(ServeProcess):
    """A ``corral serve --node`` process."""

    def __init__(self, store: str, tmp: Path, name: str) -> None:
        self.name = name
        super().__init__(store, tmp / name, TOKEN, "--node", name, "--lease-s", str(LEASE_S))


@contextlib.contextmanager
def cluster(store: str, tmp: Path, count: int) -> Iterator[list[Daemon]]:
    daemons: list[Daemon] = []
    try:
        for i in range(count):
            daemons.append(Daemon(store, tmp, f"n{i + 1}"))
        yield daemons
    finally:
        for d in daemons:
            d.stop()


async def turns_per_second(daemons: list[Daemon]) -> tuple[float, dict[str, int], float, float]:
    """Spawn AGENTS no-op agents (placed by the daemons: the least loaded), one untimed turn
    each, then every agent prompted on its owner as soon as its last turn is done; the rate,
    the agents per daemon, and the CPU ms a turn took of the daemons' processes and of the
    whole machine (workers, database and this driver too)."""
    async with httpx.AsyncClient(headers=HEADERS, timeout=60) as client:
        first = daemons[0].url
        ids = []
        for i in range(AGENTS):
            answer = await client.post(f"{first}/agents", json={**SPEC, "name": f"noop-{i}"})
            answer.raise_for_status()
            ids.append(answer.json()["id"])
        nodes = (await client.get(f"{first}/nodes")).json()["nodes"]
        url_of = {n["name"]: n["url"] for n in nodes}
        owner = {a: url_of[n["name"]] for n in nodes for a in n["agents"]}
        per_node = {n["name"]: n["agentCount"] for n in nodes}
        idle = {a: asyncio.Event() for a in ids}

        async def watch(url: str) -> None:
            # Each daemon streams the whole log; each watcher keeps its own agents'.
            mine = {a for a, u in owner.items() if u == url}
            params = {"type": "agent.state_changed"}
            async with client.stream("GET", f"{url}/events", params=params, timeout=None) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data:"):
                        event = json.loads(line[5:])
                        if event["agentId"] in mine and event["data"]["to"] == "idle":
                            idle[event["agentId"]].set()

        watchers = [asyncio.create_task(watch(d.url)) for d in daemons]
        await asyncio.sleep(0.5)

        async def one_turn(agent: str) -> None:
            idle[agent].clear()
            answer = await client.post(f"{owner[agent]}/agents/{agent}/prompt", json={"text": "go"})
            answer.raise_for_status()
            await idle[agent].wait()

        await asyncio.gather(*(one_turn(a) for a in ids))  # warm-up: starts the workers
        end = time.perf_counter() + SECONDS
        done = 0

        async def drive(agent: str) -> None:
            nonlocal done
            while time.perf_counter() < end:
                await one_turn(agent)
                done += 1

        cpu, busy = daemons_cpu_s(daemons), machine_busy_s()
        started = time.perf_counter()
        await asyncio.gather(*(drive(a) for a in ids))
        elapsed = time.perf_counter() - started
        cpu, busy = daemons_cpu_s(daemons) - cpu, machine_busy_s() - busy
        for task in watchers:
            task.cancel()
        await asyncio.gather(*watchers, return_exceptions=True)
        turns = max(done, 1)
        return done / elapsed, per_node, cpu / turns * 1000, busy / turns * 1000


def daemons_cpu_s(daemons: list[Daemon]) -> float:
    """CPU seconds (user and system, every thread) the daemons' own processes have used."""
    total = 0
    for daemon in daemons:
        with contextlib.suppress(OSError):
            with open(f"/proc/{daemon.proc.pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


async def failover_seconds(daemons: list[Daemon]) -> float:
    """Seconds from SIGKILL of the daemon owning the most agents to every one of them
    owned by a live daemon, as GET /nodes on another daemon sees it."""
    async with httpx.AsyncClient(headers=HEADERS, timeout=30) as client:
        nodes = (await client.get(f"{daemons[0].url}/nodes")).json()["nodes"]
        victim_row = max(nodes, key=lambda n: n["agentCount"])
        victim = next(d for d in daemons if d.name == victim_row["name"])
        watcher = next(d for d in daemons if d is not victim)
        orphans = set(victim_row["agents"])
        started = time.perf_counter()
        victim.proc.kill()
        victim.proc.wait()
        while True:
            nodes = (await client.get(f"{watcher.url}/nodes")).json()["nodes"]
            taken = {
                a for n in nodes if n["live"] and n["name"] != victim.name for a in n["agents"]
            }
            if orphans <= taken:
                return time.perf_counter() - started
            await asyncio.sleep(0.05)


@dataclass(frozen=True)
class Measured:
    rate: float
    per_node: dict[str, int]
    daemons_ms: float  # CPU ms a turn, the daemons' processes
    machine_ms: float  # CPU ms a turn, the whole machine
    failover: float | None
    bare: float


async def measure(count: int) -> Measured:
    with database() as store, tempfile.TemporaryDirectory() as tmp:
        bare = bare_postgres_commits(store)
        with cluster(store, Path(tmp), count) as daemons:
            rate, per_node, daemons_ms, machine_ms = await turns_per_second(daemons)
            failover = await failover_seconds(daemons) if count > 1 else None
        return Measured(rate, per_node, daemons_ms, machine_ms, failover, bare)


def main() -> None:
    print(
        row(
            "daemons",
            "bare commits/s (one client)",
            f"no-op turns/s ({AGENTS} agents)",
            "turns / bare",
            "agents per daemon",
            "CPU ms a turn (daemons / machine)",
            "turns/s the cores allow",
            f"failover (lease {LEASE_S:g} s)",
        )
    )
    print(row("---", "---:", "---:", "---:", "---", "---:", "---:", "---:"))
    rates = {}
    for count in (1, 3):
        m = asyncio.run(measure(count))
        rates[count] = m.rate
        print(
            row(
                str(count),
                f"{m.bare:,.0f}",
                f"{m.rate:,.0f}",
                f"{m.rate / m.bare:.0%}",
                " / ".join(str(v) for v in m.per_node.values()),
                f"{m.daemons_ms:.2f} / {m.machine_ms:.2f}",
                f"{(os.cpu_count() or 1) / m.machine_ms * 1000:,.0f}" if m.machine_ms else "-",
                "-" if m.failover is None else f"{m.failover:.2f} s",
            )
        )
    print(f"\nthree daemons / one: {rates[3] / rates[1]:.2f}x")


if __name__ == "__main__":
    main()
