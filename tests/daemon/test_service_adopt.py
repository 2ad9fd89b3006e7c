"""The service adopts, at start, the turns that were waiting on a person when the daemon
died (with the real command harness), instead of interrupting them; the others, and those
with nothing left to adopt, are interrupted as before."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path
from typing import Any

from corral.daemon import CommandHarness, Harness, NothingToAdoptError, SQLiteStore
from corral.daemon import _events as ev
from corral.runtime import FakeClock
from tests.daemon.conftest import MakeService, OpenSQLite
from tests.support.harness import ScriptedHarness
from tests.support.orphans import orphan_turn
from tests.support.processes import read_pids, write_atomically

WORKER = str(Path(__file__).with_name("workers") / "cmd_worker.py")


ASK = [{"match": "deploy", "verdict": "ask", "reason": "a person first", "timeoutS": 600}]


async def _waiting_agent(
    make_service: MakeService, open_sqlite: OpenSQLite, clock: FakeClock | None = None
) -> tuple[str, str]:
    """An agent whose first turn waits on a person (its approval pending) when the daemon
    goes away: the agent's id and the decision's. The turn never ends by itself here, and
    closing the service writes nothing for it, as a crash."""
    scripted = ScriptedHarness()
    scripted.script("deployer", "hang")
    store = await open_sqlite()
    options: dict[str, Any] = {} if clock is None else {"clock": clock}
    first = await make_service(store, harness=scripted, **options)
    spec = {"name": "deployer", "harness": "command", "command": ["unused"]}
    created = await first.spawn({**spec, "guardrails": ASK, "prompt": "ship it"})
    agent = str(created.body["id"])
    verdict = await first.check_action(agent, "deploy web", wait_s=0)
    assert verdict.verdict == "pending"
    assert first.get(agent)["state"] == "waiting"
    await first.close()
    await store.close()
    assert verdict.decision is not None
    return agent, verdict.decision


async def test_a_turn_waiting_on_a_person_is_adopted_after_a_restart(
    make_service: MakeService, open_sqlite: OpenSQLite, tmp_path: Path
) -> None:
    agent, decision = await _waiting_agent(make_service, open_sqlite)
    home = tmp_path / "home"
    state_dir, workdir = home / "agents" / agent / "state", home / "agents" / agent / "work"
    # The turn's command, as the dead daemon started it: it waits for its verdict.
    orphan_turn(
        [sys.executable, WORKER, "await-file", "verdict"],
        state_dir=state_dir,
        workdir=workdir,
        agent_id=agent,
        turn=1,
        prompt="ship it",
    )
    try:
        store = await open_sqlite()
        harness: Harness = CommandHarness(adopt_poll_s=0.01)
        second = await make_service(store, harness=harness)
        rec = second.get(agent)
        assert (rec["state"], rec["decision"], rec["turnInFlight"]) == ("waiting", decision, 1)
        assert [d["id"] for d in second.decisions()] == [decision]

        await second.answer(decision, "approve", by="alice", why="go ahead")
        assert second.get(agent)["state"] == "running"
        write_atomically(workdir / "verdict", "0")  # what `corral check` answers now
        await asyncio.wait_for(second.settled(agent), 10)
    finally:
        with contextlib.suppress(OSError, ValueError):
            os.kill(read_pids(workdir)["child"], signal.SIGKILL)
    rec = second.get(agent)
    assert (rec["state"], rec["lastOutput"], rec["turns"]) == ("idle", "ship it -> 0\n", 1)
    types = [e.type for e in await second.events(agent_id=agent)]
    assert ev.TURN_INTERRUPTED not in types
    assert types.count(ev.TURN_COMPLETED) == 1
    assert (await store.replay()).snapshot() == store.state.snapshot()


async def test_an_adopted_turn_that_fails_counts_as_failed(
    make_service: MakeService, open_sqlite: OpenSQLite, tmp_path: Path
) -> None:
    # The deadline passed while no daemon ran: denied at start, the command hears "no" and
    # exits 1; the turn fails as it would have without the restart.
    clock = FakeClock()
    agent, decision = await _waiting_agent(make_service, open_sqlite, clock)
    home = tmp_path / "home"
    workdir = home / "agents" / agent / "work"
    orphan_turn(
        [sys.executable, WORKER, "await-file", "verdict"],
        state_dir=home / "agents" / agent / "state",
        workdir=workdir,
        agent_id=agent,
    )
    clock.advance(601)
    try:
        store = await open_sqlite()
        second = await make_service(store, harness=CommandHarness(adopt_poll_s=0.01), clock=clock)
        (answered,) = second.decisions(resolved=True)
        assert (answered["id"], answered["answer"], answered["timedOut"]) == (
            decision,
            "deny",
            True,
        )
        assert second.get(agent)["state"] == "running"  # the turn goes on, to hear "no"
        write_atomically(workdir / "verdict", "1")
        await asyncio.wait_for(second.settled(agent), 10)
    finally:
        with contextlib.suppress(OSError, ValueError):
            os.kill(read_pids(workdir)["child"], signal.SIGKILL)
    rec = second.get(agent)
    assert rec["state"] == "failed"
    assert rec["error"] == "command exited with code 1; last 2048 bytes of stderr:\nstderr of 1"
    types = [e.type for e in await second.events(agent_id=agent)]
    assert ev.TURN_INTERRUPTED not in types


async def test_a_waiting_turn_with_nothing_left_is_interrupted(
    make_service: MakeService, open_sqlite: OpenSQLite
) -> None:
    agent, decision = await _waiting_agent(make_service, open_sqlite)
    store = await open_sqlite()
    second = await make_service(store, harness=CommandHarness())
    await asyncio.wait_for(second.settled(agent), 10)
    rec = second.get(agent)
    assert (rec["state"], rec["error"]) == ("failed", "daemon restarted during turn")
    types = [e.type for e in await second.events(agent_id=agent)]
    assert types.count(ev.TURN_INTERRUPTED) == 1
    (withdrawn,) = second.decisions(resolved=True)
    assert (withdrawn["id"], withdrawn["answer"]) == (decision, "withdrawn")
    assert (await store.replay()).snapshot() == store.state.snapshot()


async def test_a_waiting_turn_of_a_harness_that_cannot_adopt_is_interrupted(
    make_service: MakeService, open_sqlite: OpenSQLite
) -> None:
    agent, _ = await _waiting_agent(make_service, open_sqlite)
    store = await open_sqlite()
    scripted = ScriptedHarness()
    second = await make_service(store, harness=scripted)
    assert scripted.reaped == [agent]  # at once, in start(), as before
    rec = second.get(agent)
    assert (rec["state"], rec["error"]) == ("failed", "daemon restarted during turn")


async def test_nothing_to_adopt_from_run_turn_is_a_harness_error(
    make_service: MakeService, sqlite_store: SQLiteStore
) -> None:
    # Only an adoption may say "nothing to adopt": from a turn it is a bug of the harness,
    # a failed turn, never an agent left running.
    scripted = ScriptedHarness()
    scripted.script("w", NothingToAdoptError("nonsense"))
    service = await make_service(sqlite_store, harness=scripted)
    spec = {"name": "w", "harness": "command", "command": ["x"], "prompt": "go"}
    created = await service.spawn(spec)
    agent = str(created.body["id"])
    await asyncio.wait_for(service.settled(agent), 10)
    rec = service.get(agent)
    assert rec["state"] == "failed"
    assert rec["error"].startswith("harness error: NothingToAdoptError")
