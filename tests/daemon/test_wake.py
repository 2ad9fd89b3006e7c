"""Coordinators woken by their children's notices (``wake: true``): the rules of _wake.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from corral.daemon import AgentService, InvalidSpecError, SQLiteStore, _notices
from corral.daemon import _events as ev
from corral.daemon._spec import parse_spec
from corral.daemon._wake import WAKE_TEXT
from corral.runtime import FakeClock
from tests.daemon.conftest import MakeService
from tests.support.harness import ScriptedHarness, fail
from tests.support.polling import idle, settle

BOUND_S = 10.0  # bound on a wait that must not hang


class Team:
    def __init__(self, service: AgentService, harness: ScriptedHarness) -> None:
        self.service = service
        self.harness = harness

    async def spawn(self, **spec: Any) -> str:
        spec.setdefault("harness", "command")
        spec.setdefault("command", ["true"])
        return str((await self.service.spawn(spec)).body["id"])

    async def until(self, agent_id: str, state: str, *, turns: int | None = None) -> dict[str, Any]:
        """The record once the agent is in ``state`` (after ``turns`` turns) with nothing
        in flight and no wake queued."""

        def there() -> bool:
            rec = self.service.get(agent_id)
            return (
                rec["state"] == state
                and (turns is None or rec["turns"] == turns)
                and agent_id not in self.harness.running
            )

        await settle(there)
        async with asyncio.timeout(BOUND_S):
            await self.service.settled(agent_id)
        await idle()
        rec = self.service.get(agent_id)
        assert rec["state"] == state, rec
        return rec

    async def started(self, agent_id: str) -> list[dict[str, Any]]:
        events = await self.service.events(0, agent_id=agent_id)
        return [e.data for e in events if e.type == ev.TURN_STARTED]


@pytest.fixture
def team(service: AgentService, harness: ScriptedHarness) -> Team:
    return Team(service, harness)


async def test_an_idle_wake_parent_is_woken_by_its_childs_notice(team: Team) -> None:
    parent = await team.spawn(name="boss", wake=True)
    team.harness.script("w", "report ready")
    child = await team.spawn(name="w", prompt="x", parent=parent, notifyOn=["done"])
    await team.until(child, "idle")
    rec = await team.until(parent, "idle", turns=1)
    (sent,) = team.harness.prompts(parent)
    assert sent.startswith("[corral] notices since your last turn:")
    assert "finished a turn: report ready" in sent
    assert sent.endswith(WAKE_TEXT)
    (started,) = await team.started(parent)
    assert started["woken"] is True
    assert started["prompt"] == WAKE_TEXT
    assert rec["lastPrompt"] == WAKE_TEXT
    events = await team.service.events(0, agent_id=parent)
    reasons = [e.data.get("reason") for e in events if e.type == ev.STATE_CHANGED]
    assert reasons == ["woken", "turn-done"]
    assert [n["state"] for n in team.service.inbox(parent)] == ["delivered"]
    assert (await team.service.store.replay()).snapshot() == team.service.store.state.snapshot()


async def test_a_parent_without_wake_is_not_woken(team: Team) -> None:
    parent = await team.spawn(name="boss")
    child = await team.spawn(name="w", prompt="x", parent=parent, notifyOn=["done"])
    await team.until(child, "idle")
    rec = await team.until(parent, "idle")
    assert rec["turns"] == 0
    assert [n["state"] for n in team.service.inbox(parent)] == ["pending"]


async def test_a_busy_parent_gets_the_notices_when_its_turn_ends_woken_then(team: Team) -> None:
    team.harness.script("boss", "hang", "done reading")
    parent = await team.spawn(name="boss", wake=True, prompt="work")
    await settle(lambda: parent in team.harness.running)
    team.harness.script("w", fail("disk full"))
    child = await team.spawn(name="w", prompt="x", parent=parent, notifyOn=["failed"])
    await team.until(child, "failed")
    await idle()
    assert team.service.get(parent)["state"] == "running"  # not woken: busy
    team.harness.release("boss")
    await team.until(parent, "idle", turns=2)
    first, second = team.harness.prompts(parent)
    assert first == "work"
    assert "w (" in second
    assert "failed: disk full" in second
    assert [s.get("woken", False) for s in await team.started(parent)] == [False, True]


async def test_a_held_parent_is_not_woken_and_gets_the_notices_at_the_answer(
    team: Team,
) -> None:
    team.harness.script("boss", fail("stuck"))
    parent = await team.spawn(name="boss", wake=True, prompt="work", onFailure="ask")
    await team.until(parent, "blocked", turns=1)
    child = await team.spawn(name="w", prompt="x", parent=parent, notifyOn=["done"])
    await team.until(child, "idle")
    rec = await team.until(parent, "blocked")
    assert rec["turns"] == 1
    await team.service.prompt(parent, "go on", by="ops")
    await team.until(parent, "idle", turns=2)
    sent = team.harness.prompts(parent)[-1]
    assert "finished a turn" in sent
    assert sent.endswith("go on")


async def test_a_wake_with_no_budget_left_holds_the_parent_instead(team: Team) -> None:
    # The child's turn counts against its parent's budget too (budgets across the tree):
    # it takes the one turn the parent has, and leaves none for a wake.
    parent = await team.spawn(name="boss", wake=True, budget={"maxTurns": 1})
    child = await team.spawn(name="w", prompt="x", parent=parent, notifyOn=["done"])
    await team.until(child, "idle")
    rec = await team.until(parent, "blocked")
    assert rec["reason"] == "budget-exhausted"
    assert team.harness.prompts(parent) == []
    (held,) = [d for d in team.service.decisions() if d["agentId"] == parent]
    assert held["kind"] == "budget_exhausted"


async def test_a_parent_whose_woken_turns_fail_trips_its_breaker(team: Team) -> None:
    team.harness.script("boss", fail("model down"), fail("model down"), fail("model down"))
    parent = await team.spawn(
        name="boss", wake=True, onFailure="retry", maxRetries=5, maxConsecutiveFailures=3
    )
    child = await team.spawn(name="w", prompt="x", parent=parent, notifyOn=["done"])
    await team.until(child, "idle")
    rec = await team.until(parent, "blocked", turns=3)
    assert rec["reason"] == "circuit-tripped"
    assert rec["consecutiveFailures"] == 3


async def test_an_ended_parent_is_not_woken(team: Team) -> None:
    parent = await team.spawn(name="boss", wake=True)
    child = await team.spawn(name="w", parent=parent, notifyOn=["done"])
    await team.service.stop(parent, keep_children=True)
    await team.service.prompt(child, "x")
    await team.until(child, "idle")
    rec = await team.until(parent, "stopped")
    assert rec["turns"] == 0
    assert [n["state"] for n in team.service.inbox(parent)] == ["dropped"]


async def test_a_flapping_child_cannot_wake_a_succeeding_parent_without_end(
    make_service: MakeService, sqlite_store: SQLiteStore, harness: ScriptedHarness
) -> None:
    clock = FakeClock()
    team = Team(await make_service(sqlite_store, clock=clock), harness)
    parent = await team.spawn(name="boss", wake=True, maxWakesPerMinute=2)
    child = await team.spawn(name="w", parent=parent, notifyOn=["done"])

    async def child_turn(turns: int) -> None:
        await team.service.prompt(child, "again")
        await team.until(child, "idle", turns=turns)

    for n in (1, 2):
        await child_turn(n)
        await team.until(parent, "idle", turns=n)
    clock.advance(61)  # the first two wakes leave the window
    for n in (3, 4):
        await child_turn(n)
        await team.until(parent, "idle", turns=n)
    await child_turn(5)
    rec = await team.until(parent, "blocked")
    assert rec["reason"] == "wake-limit"
    assert "woken 2 times within 60 s" in rec["error"]
    assert rec["turns"] == 4
    (held,) = [d for d in team.service.decisions() if d["agentId"] == parent]
    assert held["kind"] == "blocked"
    assert [n["state"] for n in team.service.inbox(parent)][-1] == "pending"
    # A person's retry lets it go on with the notice it was not woken for, and its count
    # starts again.
    await team.service.answer(held["id"], "retry", by="ops")
    await team.until(parent, "idle", turns=5)
    assert "finished a turn" in team.harness.prompts(parent)[-1]
    await child_turn(6)
    await team.until(parent, "idle", turns=6)


async def test_a_restarted_daemon_wakes_a_parent_whose_notice_was_never_acted_on(
    make_service: MakeService, sqlite_store: SQLiteStore, harness: ScriptedHarness
) -> None:
    first = await make_service(sqlite_store)
    team = Team(first, harness)
    parent = await team.spawn(name="boss", wake=True)
    child = await team.spawn(name="w", parent=parent)
    await first.close()
    # The notice a daemon wrote just before it died, before it could wake the parent.
    state = sqlite_store.state
    await sqlite_store.append([_notices.to_parent(state, state.agents[child], "done")])
    team = Team(await make_service(sqlite_store), harness)
    await team.until(parent, "idle", turns=1)
    assert "finished a turn" in harness.prompts(parent)[0]


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"wake": 1}, "wake"),
        ({"maxWakesPerMinute": 0}, "maxWakesPerMinute"),
        ({"maxWakesPerMinute": "5"}, "maxWakesPerMinute"),
    ],
)
def test_wake_fields_are_strict(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidSpecError) as refused:
        parse_spec({"name": "x", "harness": "command", "command": ["true"], **fields})
    assert [p["field"] for p in refused.value.problems] == [field]
