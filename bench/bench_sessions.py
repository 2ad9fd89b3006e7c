"""Sessions: turns per second with sessions kept beside sessions off (``history: none``).

100 agents on an in-process service with a harness that answers at once (so what is
measured is the daemon's own work: a turn's new session messages written at its start and
end, the session bounded and handed to the harness), each agent's session filled to 20
messages (10 turns of ~200-character prompts and outputs) before the clock starts; then every
agent runs ``TIMED_TURNS`` more turns, prompted again as soon as its last one is done (its
session grows from 20 to 40 messages meanwhile); the median of three rounds, off and on
interleaved. A row for sessions at their cap (200 messages, one run) shows the worst case.
Also: what writing a 20-message session file costs a command agent's turn.

Run with ``.venv/bin/python -m bench bench_sessions``. The PostgreSQL rows need a server at
``CORRAL_BENCH_PG`` (default postgresql://postgres@127.0.0.1:5432/postgres); without one they
are skipped with a note.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from bench._harness import fmt_ns, row, time_sync
from bench.bench_daemon import StoreURL, postgres_url, sqlite_url
from corral.daemon import AgentService, TurnRequest, TurnResult, _sessions, open_store

AGENTS = 100
FILL_TURNS = 10  # 2 messages a turn: 20-message sessions when the clock starts
TIMED_TURNS = 10
CAP_FILL_TURNS = _sessions.MAX_MESSAGES // 2
ROUNDS = 5
TEXT = "x" * 200  # a prompt's, and an output's, length


class FastHarness:
    """Answers every turn at once with ~200 characters; counts the session it was given."""

    def __init__(self) -> None:
        self.seen = 0

    async def run_turn(self, request: TurnRequest) -> TurnResult:
        self.seen += len(request.session)
        return TurnResult(output=TEXT)

    async def reap(self, agent_id: str, state_dir: Path) -> bool:
        return False


async def turns_per_second(url: str, home: Path, history: str, fill_turns: int) -> float:
    """Turns/s of ``AGENTS`` agents of ``history``, each with ``fill_turns`` turns behind it,
    running ``TIMED_TURNS`` more each."""
    store = open_store(url)
    await store.open()
    harness = FastHarness()
    service = AgentService(store, home=home, harnesses={"command": harness})
    await service.start()
    spec = {"harness": "command", "command": ["true"], "history": history}
    ids = [(await service.spawn({**spec, "name": f"agent-{i}"})).body["id"] for i in range(AGENTS)]
    idle = {agent_id: asyncio.Event() for agent_id in ids}

    async def watch() -> None:
        async for event in service.subscribe():
            if event.type == "agent.state_changed" and event.data["to"] == "idle":
                idle[event.agent_id or ""].set()

    async def drive(agent_id: str, turns: int) -> None:
        for _ in range(turns):
            idle[agent_id].clear()
            await service.prompt(agent_id, TEXT)
            await idle[agent_id].wait()

    watcher = asyncio.create_task(watch())
    await asyncio.sleep(0)
    await asyncio.gather(*(drive(a, fill_turns) for a in ids))
    if history != "none":
        sizes = {len(service.session(a)["messages"]) for a in ids}
        assert sizes == {min(2 * fill_turns, _sessions.MAX_MESSAGES)}, sizes
    started = time.perf_counter()
    await asyncio.gather(*(drive(a, TIMED_TURNS) for a in ids))
    elapsed = time.perf_counter() - started
    watcher.cancel()
    await service.close()
    await store.close()
    return AGENTS * TIMED_TURNS / elapsed


async def run(label: str, fresh: StoreURL, tmp: Path) -> list[str]:
    """``ROUNDS`` rounds of off then on (interleaved, so that a machine busy with something
    else slows both alike), medians; then one run at the cap."""
    runs: dict[str, list[float]] = {"off": [], "on": [], "cap": []}
    plan = [("off", "none", FILL_TURNS), ("on", "run", FILL_TURNS)] * ROUNDS
    for i, (name, history, fill) in enumerate([*plan, ("cap", "run", CAP_FILL_TURNS)]):
        async with fresh() as url:
            home = tmp / f"{label}-{name}-{i}"
            runs[name].append(await turns_per_second(url, home, history, fill))
    rates = {name: statistics.median(found) for name, found in runs.items()}
    return [
        row(
            label,
            f"{rates['off']:,.0f}",
            f"{rates['on']:,.0f}",
            f"{rates['on'] / rates['off']:.0%}",
            f"{rates['cap']:,.0f}",
        )
    ]


def main() -> None:
    print(
        row(
            "store",
            f"turns/s, sessions off ({AGENTS} agents)",
            "turns/s, sessions on (20-40 messages)",
            "on / off",
            f"turns/s, sessions at the cap ({_sessions.MAX_MESSAGES} messages)",
        )
    )
    print(row("---", "---:", "---:", "---:", "---:"))
    with tempfile.TemporaryDirectory() as tmp:
        for line in asyncio.run(run("SQLite", sqlite_url(Path(tmp)), Path(tmp))):
            print(line)
        try:
            for line in asyncio.run(run("PostgreSQL", postgres_url, Path(tmp))):
                print(line)
        except OSError as exc:  # no server answers: say so rather than fail the whole run
            print(f"PostgreSQL skipped: {exc}")
        session = [
            _sessions.message("user" if i % 2 == 0 else "assistant", i // 2 + 1, TEXT, "now")
            for i in range(20)
        ]
        path = Path(tmp) / "session.jsonl"
        cost = time_sync(lambda: _sessions.write_file(path, session), number=2000)
        print(f"\nWriting a 20-message session file (a command agent's turn): {fmt_ns(cost)}")


if __name__ == "__main__":
    main()
