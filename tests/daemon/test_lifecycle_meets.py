"""Where stop, restart and delete meet the features before them: harness workers released
while an agent lives again, approvals of an agent that ends, service-level with a fake
clock."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from corral.daemon import AgentService, SQLiteStore, TurnRequest, TurnResult
from tests.daemon.conftest import MakeService
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
    await service.restart(second)  # no prompt: idle again, its worker its own
    assert service.get(second)["state"] == "idle"
    warm.slow.set()
    async with asyncio.timeout(BOUND_S):
        answer = await stopping
    assert answer.body["stopped"] == [first, second, lead]
    assert second not in warm.released  # live again: its worker stays
    assert warm.released == [first, lead]
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
