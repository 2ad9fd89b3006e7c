"""How long the ``corral`` command takes, start to exit: ``corral --help``, and ``corral
agents`` (a table, and ``--json``) against a running daemon with 100 agents.

Goal (issue 13, a fast CLI): ``corral agents`` answers in under 0.3 s. Each figure is the p50
and p99 of RUNS runs of the console script as a new process (what a person waits for:
interpreter start, imports, the request, printing), one command after the other in turn so
that a busy moment of the machine falls on all of them alike. The daemon runs in this
process, served by uvicorn on a loopback port in a thread, over SQLite; its 100 agents ran one
turn each through a harness that starts no process. Run with ``.venv/bin/python -m bench
bench_cli`` (``CORRAL_BENCH_RUNS=N`` for another number of runs;
``CORRAL_BENCH_BEFORE=DIR``, the ``src`` directory of another checkout, times that code too,
in the same rounds, as ``before``: on a busy machine only figures taken together compare).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench._harness import row

AGENTS = 100
RUNS = int(os.environ.get("CORRAL_BENCH_RUNS", "40"))
BEFORE = os.environ.get("CORRAL_BENCH_BEFORE")
SPEC = {"harness": "command", "command": ["-"], "prompt": "one turn"}


class Quick:
    """A harness whose every turn answers at once (no process: the command is measured)."""

    async def run_turn(self, request: object) -> object:
        from corral.daemon import TurnResult

        return TurnResult(output="done")

    async def reap(self, agent_id: str, state_dir: Path) -> bool:
        return False


def serve_in_thread(home: Path) -> tuple[str, threading.Event]:
    """A daemon with AGENTS settled agents on a loopback port, run in a thread until the
    event returned is set; its base URL."""
    import uvicorn

    from corral.daemon import AgentService, create_app, open_store

    ready: dict[str, str] = {}
    stop = threading.Event()
    started = threading.Event()

    async def run() -> None:
        store = open_store(f"sqlite:///{home / 'corral.db'}")
        await store.open()
        service = AgentService(store, home=home, harnesses={"command": Quick()})  # type: ignore[dict-item]
        await service.start()
        for i in range(AGENTS):
            await service.spawn({**SPEC, "name": f"agent-{i}"})
        deadline = time.monotonic() + 120
        while not all(a["state"] == "idle" for a in service.list_agents()):
            if time.monotonic() > deadline:
                raise TimeoutError("the agents did not settle")
            await asyncio.sleep(0.05)
        config = uvicorn.Config(
            create_app(service, token="bench-token"),
            host="127.0.0.1",
            port=0,
            log_level="warning",
        )
        server = uvicorn.Server(config)
        task = asyncio.create_task(server.serve())
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        ready["url"] = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
        started.set()
        await asyncio.to_thread(stop.wait)
        server.should_exit = True
        await task
        await service.close()
        await store.close()

    thread = threading.Thread(target=asyncio.run, args=(run(),), daemon=True)
    thread.start()
    if not started.wait(180):
        raise TimeoutError("the daemon did not start")
    return ready["url"], stop


def command() -> list[str]:
    """The console script next to this interpreter (``python -m corral.cli`` without one)."""
    script = Path(sys.executable).with_name("corral")
    return [str(script)] if script.exists() else [sys.executable, "-m", "corral.cli"]


def percentiles(times: list[float]) -> tuple[str, str]:
    times = sorted(times)
    p99 = times[max(0, round(len(times) * 0.99) - 1)]
    return f"{statistics.median(times):.0f} ms", f"{p99:.0f} ms"


def main() -> None:
    home = Path(tempfile.mkdtemp(prefix="bench-cli-"))
    url, stop = serve_in_thread(home)
    env = {**os.environ, "CORRAL_URL": url, "CORRAL_TOKEN": "bench-token", "COLUMNS": "120"}
    # As an installed corral runs: from bytecode (pip compiles it at install; an environment
    # that sets PYTHONDONTWRITEBYTECODE would have every run compile corral's modules again).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    envs = {"now": env}
    if BEFORE:
        envs["before"] = {**env, "PYTHONPATH": BEFORE}
    cases = {
        "corral --help": ["--help"],
        f"corral agents ({AGENTS} agents, a table)": ["agents"],
        f"corral agents --json ({AGENTS} agents)": ["agents", "--json"],
    }
    took: dict[tuple[str, str], list[float]] = {(c, e): [] for c in cases for e in envs}
    try:
        for args in cases.values():  # warm-up: the files in the page cache, the bytecode
            for run_env in envs.values():
                subprocess.run([*command(), *args], env=run_env, capture_output=True, check=True)
        for _ in range(RUNS):
            for label, args in cases.items():
                for which, run_env in envs.items():
                    start = time.perf_counter()
                    done = subprocess.run([*command(), *args], env=run_env, capture_output=True)
                    took[label, which].append((time.perf_counter() - start) * 1000)
                    if done.returncode != 0:
                        raise RuntimeError(f"{label} exited {done.returncode}: {done.stderr!r}")
    finally:
        stop.set()
        shutil.rmtree(home, ignore_errors=True)
    print(f"The corral command as a new process, {RUNS} runs each\n")
    if BEFORE:
        print(row("command", "p50", "p99", "before: p50", "before: p99"))
        print(row("---", "---:", "---:", "---:", "---:"))
    else:
        print(row("command", "p50", "p99"))
        print(row("---", "---:", "---:"))
    for label in cases:
        cells = [c for which in envs for c in percentiles(took[label, which])]
        print(row(f"`{label}`", *cells))


if __name__ == "__main__":
    main()
