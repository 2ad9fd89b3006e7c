"""A turn's outcome survives a store that blips while it is written: it is tried again (with
the service's clock), an outcome that committed though its answer was lost is not written
twice, and a store down for longer than ``result_retry_s`` leaves the agent to a restart."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Protocol

import pytest

from corral.daemon import (
    AgentService,
    Event,
    NewEvent,
    SQLiteStore,
    State,
    StoreUnavailableError,
    _turns,
)
from corral.daemon import _events as ev
from corral.daemon.stores._base import MergeHook
from corral.daemon.stores._turns import TurnRows
from corral.runtime import FakeClock
from tests.daemon.conftest import MakeService
from tests.support.harness import ScriptedHarness, fail

OUTCOMES = {ev.TURN_COMPLETED, ev.TURN_FAILED}
BOUND_S = 10.0  # bound on a wait that must not hang


class BlippingStore:
    """A real SQLite store whose appends of a turn's outcome fail ``fail_outcomes`` times:
    before committing, or (``lost_answer``) after committing, as a connection dropped after
    COMMIT would."""

    def __init__(self, path: Path) -> None:
        self.inner = SQLiteStore(path)
        self.fail_outcomes = 0
        self.lost_answer = False
        self.refreshes = 0

    @property
    def state(self) -> State:
        return self.inner.state

    async def open(self) -> None:
        await self.inner.open()

    async def append(
        self, events: Sequence[NewEvent], *, turns: TurnRows | None = None
    ) -> list[Event]:
        if self.fail_outcomes and any(e.type in OUTCOMES for e in events):
            self.fail_outcomes -= 1
            if self.lost_answer:
                await self.inner.append(events, turns=turns)
            raise StoreUnavailableError("blipping store", "connection dropped (test)")
        return await self.inner.append(events, turns=turns)

    async def read(
        self, after: int = 0, *, agent_id: str | None = None, limit: int = 1000
    ) -> list[Event]:
        return await self.inner.read(after, agent_id=agent_id, limit=limit)

    async def replay(self) -> State:
        return await self.inner.replay()

    async def refresh(self) -> None:
        self.refreshes += 1
        await self.inner.refresh()

    async def close(self) -> None:
        await self.inner.close()

    def watch(self, hook: MergeHook) -> None:
        self.inner.watch(hook)


class Env:
    def __init__(
        self,
        store: BlippingStore,
        service: AgentService,
        clock: FakeClock,
        harness: ScriptedHarness,
    ) -> None:
        self.store = store
        self.service = service
        self.clock = clock
        self.harness = harness

    async def turn(self, *outcomes: object) -> str:
        self.harness.script("w", *outcomes)
        result = await self.service.spawn(
            {"name": "w", "harness": "command", "command": ["w"], "prompt": "go"}
        )
        agent_id = str(result.body["id"])
        async with asyncio.timeout(BOUND_S):
            await self.service.settled(agent_id)
        return agent_id

    async def types(self, agent_id: str) -> list[str]:
        return [e.type for e in await self.service.events(0, agent_id=agent_id)]


class MakeEnv(Protocol):
    async def __call__(self, result_retry_s: float = 60.0) -> Env: ...


@pytest.fixture
async def make_env(
    tmp_path: Path, make_service: MakeService, harness: ScriptedHarness
) -> AsyncIterator[MakeEnv]:
    stores: list[BlippingStore] = []

    async def make(result_retry_s: float = 60.0) -> Env:
        store = BlippingStore(tmp_path / "corral.db")
        stores.append(store)
        await store.open()
        clock = FakeClock(auto_advance=True)
        service = await make_service(store, clock=clock, result_retry_s=result_retry_s)
        return Env(store, service, clock, harness)

    yield make
    for store in stores:
        await store.close()


@pytest.fixture
async def env(make_env: MakeEnv) -> Env:
    return await make_env()


async def test_an_outcome_the_store_refused_is_written_when_it_is_back(env: Env) -> None:
    env.store.fail_outcomes = 2
    agent_id = await env.turn("done")
    assert env.service.get(agent_id)["state"] == "idle"
    assert (await env.types(agent_id)).count(ev.TURN_COMPLETED) == 1
    assert env.clock.sleeps[-2:] == [0.25, 0.5]
    assert env.store.refreshes == 2
    assert (await env.store.replay()).snapshot() == env.store.state.snapshot()


async def test_a_failed_turn_too_and_its_policy_applies_once(env: Env) -> None:
    env.store.fail_outcomes = 1
    agent_id = await env.turn(fail("no access"))
    rec = env.service.get(agent_id)
    assert (rec["state"], rec["consecutiveFailures"]) == ("failed", 1)
    assert (await env.types(agent_id)).count(ev.TURN_FAILED) == 1


async def test_an_outcome_committed_before_its_answer_was_lost_is_not_written_twice(
    env: Env,
) -> None:
    env.store.fail_outcomes = 1
    env.store.lost_answer = True
    agent_id = await env.turn("done")
    assert env.service.get(agent_id)["state"] == "idle"
    types = await env.types(agent_id)
    assert types.count(ev.TURN_COMPLETED) == 1
    assert types.count(ev.STATE_CHANGED) == 1  # running -> idle, once
    assert (await env.store.replay()).snapshot() == env.store.state.snapshot()


async def test_a_store_down_past_the_limit_leaves_the_agent_to_a_restart(
    make_env: MakeEnv, caplog: pytest.LogCaptureFixture
) -> None:
    env = await make_env(result_retry_s=1.0)
    env.store.fail_outcomes = 100
    with caplog.at_level(logging.WARNING, logger="corral"):
        agent_id = await env.turn("done")
    rec = env.service.get(agent_id)
    assert (rec["state"], rec["turnInFlight"]) == ("running", 1)
    assert sum(env.clock.sleeps) >= 1.0
    assert "turn 1's outcome not written" in caplog.text
    assert "turn task failed" in caplog.text


def test_result_retry_s_is_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="result_retry_s"):
        AgentService(SQLiteStore(tmp_path / "x.db"), home=tmp_path, harnesses={}, result_retry_s=-1)


@pytest.mark.parametrize("home", [Path(".corral"), Path("/srv/corral")])
def test_an_agents_directories_are_under_its_home(home: Path) -> None:
    for _ in range(2):  # the second time from the paths kept for recent agents
        assert _turns.workdir(home, "a_1") == home / "agents" / "a_1" / "work"
        assert _turns.state_dir(home, "a_1") == home / "agents" / "a_1" / "state"
    assert _turns.workdir(home / "other", "a_1") == home / "other" / "agents" / "a_1" / "work"
    assert _turns.state_dir(home, "a_2") == home / "agents" / "a_2" / "state"
