"""What a turn cut short had spent still counts: stopping, preempting or restarting a turn
must not let a tree spend past its root's budget (its harness tells, ``TurnRequest.spent``)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from corral.daemon import AgentService, SQLiteStore, TurnRequest, TurnResult
from corral.daemon._state import replay
from corral.runtime import FakeClock
from tests.daemon.conftest import MakeService
from tests.support.polling import idle, settle

SPENT = {"tokens": 40, "costUsd": 0.25}


class SpendingHarness:
    """Every turn runs until it is cancelled, then tells what it had spent (:data:`SPENT`),
    as the ``openai`` harness does for its model calls."""

    def __init__(self) -> None:
        self.running: set[str] = set()

    async def run_turn(self, request: TurnRequest) -> TurnResult:
        self.running.add(request.agent_id)
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            if request.spent is not None:
                request.spent(SPENT)
            raise
        finally:
            self.running.discard(request.agent_id)
        raise AssertionError("unreachable")

    async def reap(self, agent_id: str, state_dir: Path) -> bool:
        return False


async def start(
    make_service: MakeService, store: SQLiteStore, **options: Any
) -> tuple[AgentService, SpendingHarness]:
    harness = SpendingHarness()
    return await make_service(store, harness=harness, **options), harness


async def spawn(service: AgentService, name: str, **spec: Any) -> str:
    spec = {"name": name, "harness": "command", "command": ["w"], **spec}
    return str((await service.spawn(spec)).body["id"])


async def interrupted(service: AgentService, agent_id: str) -> list[dict[str, Any]]:
    return [e.data for e in await service.events(agent_id=agent_id) if e.type.endswith("rupted")]


async def assert_replays(service: AgentService, store: SQLiteStore) -> None:
    """The log alone gives the projections the service holds (the spend is in the log)."""
    events = await store.read(0, limit=100_000)
    assert replay(events).snapshot()["agents"] == store.state.snapshot()["agents"]


async def test_a_stopped_turn_s_spend_counts_against_the_agent_and_its_ancestors(
    make_service: MakeService, sqlite_store: SQLiteStore
) -> None:
    service, harness = await start(make_service, sqlite_store)
    root = await spawn(service, "root", budget={"maxTokens": 100})
    child = await spawn(service, "child", parent=root, prompt="go")
    await settle(lambda: child in harness.running)
    await service.stop(child)

    (cut,) = await interrupted(service, child)
    assert cut["usage"] == SPENT
    used = service.get(child)["usage"]
    assert (used["tokens"], used["costUsd"], used["turns"]) == (40, 0.25, 0)
    tree = service.get(root)["treeUsage"]
    assert (tree["tokens"], tree["turns"]) == (40, 0)  # spent, but not a turn that ran
    # What is left of the root is what the stopped turn did not spend.
    again = (
        await service.spawn(
            {
                "name": "c2",
                "harness": "command",
                "command": ["w"],
                "parent": root,
                "budget": {"maxTokens": 1000},
            }
        )
    ).body
    assert again["budget"]["maxTokens"] == 60
    await assert_replays(service, sqlite_store)


async def test_a_preempted_turn_s_spend_counts(
    make_service: MakeService, sqlite_store: SQLiteStore
) -> None:
    service, harness = await start(make_service, sqlite_store)
    root = await spawn(service, "root", budget={"maxTokens": 100}, spawnBudget={"maxAgents": 2})
    low = await spawn(service, "low", parent=root, prompt="go", priority="low", onPreempt="cancel")
    await settle(lambda: low in harness.running)
    await spawn(service, "high", parent=root, priority="high")

    assert service.get(low)["state"] == "paused"
    (cut,) = await interrupted(service, low)
    assert cut["usage"] == SPENT
    assert service.get(root)["treeUsage"]["tokens"] == 40
    await assert_replays(service, sqlite_store)


async def test_a_restarted_stalled_turn_s_spend_counts(
    make_service: MakeService, sqlite_store: SQLiteStore
) -> None:
    clock = FakeClock()
    service, harness = await start(make_service, sqlite_store, clock=clock)
    agent = await spawn(
        service,
        "w",
        prompt="go",
        heartbeatS=1.0,
        recovery={"cooldownS": 0},
        budget={"maxTokens": 100},
    )
    await settle(lambda: agent in harness.running)
    clock.advance(1.0)
    await settle(lambda: service.get(agent)["turnInFlight"] == 2)  # restarted
    await idle()

    (cut,) = await interrupted(service, agent)
    assert cut["usage"] == SPENT
    assert service.get(agent)["usage"]["tokens"] == 40
    await assert_replays(service, sqlite_store)
