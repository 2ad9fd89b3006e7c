"""Where stop, restart and delete meet the features before them: harness workers released
while an agent lives again, approvals of an agent that ends, service-level with a fake
clock."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from corral.daemon import AgentService, SQLiteStore, TurnFailedError, TurnRequest, TurnResult
from corral.daemon._metrics import Metrics
from corral.daemon._state import ENDED_STATES
from corral.runtime import FakeClock
from tests.daemon.conftest import MakeService
from tests.support.harness import ScriptedHarness, fail
from tests.support.polling import settle

BOUND_S = 10.0


class WarmScripted:
    """A harness that keeps a worker per agent: each turn answers ``ok``; ``release`` ends
    the worker (slowly, while ``slow`` is clear: it takes its time to exit), ``released``
    records each."""

    def __init__(self) -> None:
        self.released: list[str] = []
        self.slow = asyncio.Event()
        self.slow.set()

    async def run_turn(self, request: TurnRequest) -> TurnResult:
        return TurnResult(output="ok")

    async def reap(self, agent_id: str, state_dir: Path) -> bool:
        return False

    async def release(self, agent_id: str) -> None:
        self.released.append(agent_id)
        await self.slow.wait()

    async def aclose(self) -> None:
        self.slow.set()


async def spawn(service: AgentService, **spec: Any) -> str:
    spec.setdefault("harness", "command")
    spec.setdefault("command", ["true"])
    return str((await service.spawn(spec)).body["id"])


async def replays(store: SQLiteStore) -> None:
    assert (await store.replay()).snapshot() == store.state.snapshot()


async def test_a_cascade_stop_does_not_release_a_descendant_restarted_meanwhile(
    make_service: MakeService, sqlite_store: SQLiteStore
) -> None:
    # The stop commits, then releases each stopped agent's worker in turn, off the lock: a
    # child restarted while an earlier release was still ending keeps its worker.
    warm = WarmScripted()
    service = await make_service(sqlite_store, harness=warm)
    lead = await spawn(service, name="lead")
    first = await spawn(service, name="first", parent=lead)
    second = await spawn(service, name="second", parent=lead)
    warm.slow.clear()
    stopping = asyncio.ensure_future(service.stop(lead))
    await settle(lambda: warm.released == [first])  # the first release hangs
    assert service.get(second)["state"] == "stopped"
    await service.restart(lead)  # a child lives again under a live parent: the lead first
    await service.restart(second)  # no prompt: idle again, its worker its own
    assert service.get(second)["state"] == "idle"
    warm.slow.set()
    async with asyncio.timeout(BOUND_S):
        answer = await stopping
    assert answer.body["stopped"] == [first, second, lead]
    assert second not in warm.released  # live again: its worker stays
    assert warm.released == [first]
    await replays(sqlite_store)


async def test_a_cascade_stop_survives_a_descendant_deleted_meanwhile(
    make_service: MakeService, sqlite_store: SQLiteStore
) -> None:
    warm = WarmScripted()
    service = await make_service(sqlite_store, harness=warm)
    lead = await spawn(service, name="lead")
    first = await spawn(service, name="first", parent=lead)
    second = await spawn(service, name="second", parent=lead)
    warm.slow.clear()
    stopping = asyncio.ensure_future(service.stop(lead))
    await settle(lambda: warm.released == [first])
    deleting = asyncio.ensure_future(service.delete(second))
    await settle(lambda: second not in sqlite_store.state.agents)
    warm.slow.set()
    async with asyncio.timeout(BOUND_S):
        answer = await stopping  # the stop was committed: its answer says so
        await deleting
    assert answer.body["stopped"] == [first, second, lead]
    await replays(sqlite_store)


async def test_an_agent_that_fails_for_good_withdraws_every_approval_it_asked(
    make_service: MakeService, sqlite_store: SQLiteStore, harness: ScriptedHarness
) -> None:
    # An approval asked between turns belongs to no turn: the failure that ends the agent
    # withdraws it all the same, so deleting the agent leaves no decision pending on nobody.
    service = await make_service(sqlite_store, clock=FakeClock())
    metrics = Metrics.of(service)
    rules = [{"match": "deploy", "verdict": "ask", "timeoutS": 3600}]
    harness.script("w", fail("broke"))
    agent_id = await spawn(service, name="w", guardrails=rules)
    verdict = await service.check_action(agent_id, "deploy", {})
    assert verdict.verdict == "pending"
    await service.prompt(agent_id, "go")
    await settle(lambda: service.get(agent_id)["state"] in ENDED_STATES)
    async with asyncio.timeout(BOUND_S):
        await service.settled(agent_id)
    assert service.get(agent_id)["state"] == "failed"
    assert service.decisions() == []
    await service.delete(agent_id)
    assert service.decisions() == []
    assert b'corral_decisions_pending{kind="approval"} 0.0' in metrics.exposition()
    await replays(sqlite_store)


class Futures:
    """A harness whose turns wait for a future the test settles (``turns``, by agent)."""

    def __init__(self) -> None:
        self.turns: dict[str, asyncio.Future[TurnResult]] = {}

    async def run_turn(self, request: TurnRequest) -> TurnResult:
        future: asyncio.Future[TurnResult] = asyncio.get_running_loop().create_future()
        self.turns[request.agent_id] = future
        return await future

    async def reap(self, agent_id: str, state_dir: Path) -> bool:
        return False


async def test_a_turn_that_fails_while_waiting_is_retried_running(
    make_service: MakeService, sqlite_store: SQLiteStore
) -> None:
    # The failed turn's approval is withdrawn; its retry waits on nobody, so the agent
    # runs (a waiting agent's turn is not watched for stalls nor timed).
    futures = Futures()
    service = await make_service(sqlite_store, clock=FakeClock(), harness=futures)
    rules = [{"match": "deploy", "verdict": "ask", "timeoutS": 3600}]
    agent_id = await spawn(
        service, name="w", guardrails=rules, prompt="go", onFailure="retry", maxRetries=2
    )
    await settle(lambda: agent_id in futures.turns)
    assert (await service.check_action(agent_id, "deploy", {})).verdict == "pending"
    assert service.get(agent_id)["state"] == "waiting"
    futures.turns.pop(agent_id).set_exception(TurnFailedError("boom"))
    await settle(lambda: agent_id in futures.turns)  # the retry runs
    rec = service.get(agent_id)
    assert (rec["state"], rec["turnInFlight"], service.decisions()) == ("running", 2, [])
    changes = [e.data for e in await service.events(0, agent_id=agent_id) if e.data.get("to")]
    assert [(c["from"], c["to"]) for c in changes] == [
        ("running", "waiting"),
        ("waiting", "running"),
    ]
    await replays(sqlite_store)
