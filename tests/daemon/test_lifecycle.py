"""Graceful stop (its grace on a fake clock), cascade stop, restart and delete, service-level;
and agent.deleted in both stores."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from corral.daemon import (
    AgentLiveError,
    AgentNotFoundError,
    AgentService,
    ParentEndedError,
    SQLiteStore,
    TurnRequest,
    TurnResult,
    http_status,
)
from corral.daemon import _events as ev
from corral.daemon.harnesses import TerminatingHarness
from corral.runtime import FakeClock
from tests.daemon.conftest import MakeService
from tests.support.harness import ScriptedHarness, fail
from tests.support.polling import settle

BOUND_S = 10.0


class TermHarness(ScriptedHarness):
    """A scripted harness that can be asked to end a turn: agents named in ``obey`` end
    their hanging turn when asked (a process that exits on SIGTERM), the others ignore it."""

    def __init__(self, obey: set[str]) -> None:
        super().__init__()
        self.obey = obey
        self.asked: list[str] = []
        self.names: dict[str, str] = {}

    async def run_turn(self, request: TurnRequest) -> TurnResult:
        self.names[request.agent_id] = request.spec.name
        return await super().run_turn(request)

    async def terminate(self, agent_id: str, state_dir: Path) -> bool:
        self.asked.append(agent_id)
        if agent_id not in self.running:
            return False
        if self.names.get(agent_id) in self.obey:
            self.release(self.names[agent_id])
        return True


class Env:
    def __init__(self, store: SQLiteStore, service: AgentService, harness: TermHarness):
        self.store, self.service, self.harness = store, service, harness

    async def spawn(self, **spec: Any) -> str:
        spec.setdefault("harness", "command")
        spec.setdefault("command", ["true"])
        return str((await self.service.spawn(spec)).body["id"])

    def state(self, agent_id: str) -> str:
        return str(self.service.get(agent_id)["state"])

    async def until(self, agent_id: str, *states: str) -> None:
        await settle(lambda: self.state(agent_id) in states)
        async with asyncio.timeout(BOUND_S):
            await self.service.settled(agent_id)

    async def events(self, agent_id: str) -> list[ev.Event]:
        return await self.service.events(0, agent_id=agent_id)

    async def assert_replay_matches(self) -> None:
        assert (await self.store.replay()).snapshot() == self.store.state.snapshot()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def term() -> TermHarness:
    return TermHarness({"polite"})


@pytest.fixture
async def env(
    make_service: MakeService, sqlite_store: SQLiteStore, term: TermHarness, clock: FakeClock
) -> Env:
    assert isinstance(term, TerminatingHarness)
    service = await make_service(sqlite_store, harness=term, clock=clock)
    return Env(sqlite_store, service, term)


# --- graceful stop --------------------------------------------------------------------------


async def test_a_turn_that_ends_on_sigterm_is_not_killed(env: Env) -> None:
    env.harness.script("polite", "hang")
    agent_id = await env.spawn(name="polite", prompt="go", stopGraceS=5)
    await settle(lambda: agent_id in env.harness.running)
    answer = await env.service.stop(agent_id, by="ops", why="done for today")
    assert answer.body == {"id": agent_id, "accepted": "stop", "stopped": [agent_id]}
    assert env.state(agent_id) == "stopped"  # committed at once
    await settle(lambda: agent_id not in env.harness.running)
    assert env.harness.asked == [agent_id]
    assert env.harness.cancelled == []  # it ended by itself, within its grace
    types = [e.type for e in await env.events(agent_id)]
    assert types[-2:] == ["agent.turn_interrupted", "agent.state_changed"]
    assert types.count("agent.turn_completed") == 0  # its outcome was dropped
    await env.assert_replay_matches()


async def test_a_turn_that_ignores_sigterm_is_killed_after_its_grace_off_the_lock(
    env: Env, clock: FakeClock
) -> None:
    env.harness.script("stubborn", "hang")
    agent_id = await env.spawn(name="stubborn", prompt="go", stopGraceS=30)
    other = await env.spawn(name="other")
    await settle(lambda: agent_id in env.harness.running)
    await env.service.stop(agent_id)
    assert env.state(agent_id) == "stopped"
    await settle(lambda: env.harness.asked == [agent_id])
    # In its grace: still running, and the daemon takes other commands meanwhile.
    clock.advance(29)
    await asyncio.sleep(0)
    assert agent_id in env.harness.running
    await env.service.prompt(other, "meanwhile")
    await env.until(other, "idle")
    clock.advance(1)
    await settle(lambda: env.harness.cancelled == [agent_id])
    assert agent_id not in env.harness.running


async def test_now_kills_at_once_without_asking(env: Env) -> None:
    env.harness.script("stubborn", "hang")
    agent_id = await env.spawn(name="stubborn", prompt="go")
    await settle(lambda: agent_id in env.harness.running)
    await env.service.stop(agent_id, now=True)
    assert env.harness.cancelled == [agent_id]
    assert env.harness.asked == []


async def test_closing_the_service_kills_a_turn_in_its_grace(env: Env) -> None:
    env.harness.script("stubborn", "hang")
    agent_id = await env.spawn(name="stubborn", prompt="go", stopGraceS=300)
    await settle(lambda: agent_id in env.harness.running)
    await env.service.stop(agent_id)
    async with asyncio.timeout(BOUND_S):
        await env.service.close()
    assert env.harness.cancelled == [agent_id]


async def test_a_starting_daemon_reaps_what_a_stopped_agent_left(
    make_service: MakeService, sqlite_store: SQLiteStore, env: Env
) -> None:
    agent_id = await env.spawn(name="idle")
    await env.service.stop(agent_id)
    await env.service.close()
    again = TermHarness(set())
    await make_service(sqlite_store, harness=again)
    assert again.reaped == [agent_id]


# --- cascade --------------------------------------------------------------------------------


async def test_stopping_a_parent_stops_its_descendants_children_first(env: Env) -> None:
    lead = await env.spawn(name="lead")
    child = await env.spawn(name="child", parent=lead)
    grandchild = await env.spawn(name="grandchild", parent=child)
    done = await env.spawn(name="done", parent=lead)
    await env.service.stop(done)
    answer = await env.service.stop(lead, by="ops", why="wrong plan")
    assert answer.body["stopped"] == [grandchild, child, lead]
    assert {env.state(a) for a in (lead, child, grandchild)} == {"stopped"}
    log = [e for e in await env.service.events(0) if e.data.get("to") == "stopped"]
    last = log[-3:]
    assert [e.agent_id for e in last] == [grandchild, child, lead]
    assert [e.data.get("stoppedWith") for e in last] == [lead, lead, None]
    assert {(e.data["by"], e.data["why"]) for e in last} == {("ops", "wrong plan")}
    await env.assert_replay_matches()


async def test_keep_children_leaves_them_running(env: Env) -> None:
    lead = await env.spawn(name="lead")
    child = await env.spawn(name="child", parent=lead)
    answer = await env.service.stop(lead, keep_children=True)
    assert answer.body["stopped"] == [lead]
    assert env.state(child) == "idle"


# --- restart --------------------------------------------------------------------------------


async def test_a_failed_agent_runs_again_with_its_session(env: Env) -> None:
    env.harness.script("w", "first answer", fail("broke"), "fixed")
    agent_id = await env.spawn(name="w", prompt="work", history="permanent")
    await env.until(agent_id, "idle")
    await env.service.prompt(agent_id, "more")
    await env.until(agent_id, "failed")
    with pytest.raises(AgentLiveError):
        await env.service.restart(other := await env.spawn(name="o"))
    answer = await env.service.restart(
        agent_id, by="ops", why="fixed the config", idempotency_key="k"
    )
    assert answer.status == 202
    assert answer.body == {"id": agent_id, "accepted": "restart", "turn": 3}
    await env.until(agent_id, "idle")
    rec = env.service.get(agent_id)
    assert (rec["turns"], rec["lastOutput"], rec["consecutiveFailures"]) == (3, "fixed", 0)
    assert rec["restarts"] == 1
    assert env.harness.prompts(agent_id)[-1] == "more"  # its last prompt again
    (request,) = [r for r in env.harness.requests if r.agent_id == agent_id and r.turn == 3]
    assert [m["content"] for m in request.session][:2] == ["work", "first answer"]
    (restarted,) = [e for e in await env.events(agent_id) if e.type == ev.AGENT_RESTARTED]
    assert restarted.data == {
        "from": "failed",
        "by": "ops",
        "why": "fixed the config",
        "restarts": 1,
    }
    replayed = await env.service.restart(agent_id, idempotency_key="k")
    assert replayed.replayed
    assert replayed.body == answer.body
    assert env.state(other) == "idle"
    await env.assert_replay_matches()


async def test_a_child_is_restarted_after_its_parent_not_before(env: Env) -> None:
    lead = await env.spawn(name="lead")
    child = await env.spawn(name="child", parent=lead)
    await env.service.stop(lead)
    with pytest.raises(ParentEndedError, match="restart the parent first") as refused:
        await env.service.restart(child)
    assert refused.value.code == "parent_ended"
    assert http_status(refused.value) == 409
    assert env.state(child) == "stopped"
    await env.service.restart(lead)
    await env.service.restart(child)
    assert (env.state(lead), env.state(child)) == ("idle", "idle")
    await env.assert_replay_matches()


async def test_restart_does_not_refill_a_budget(env: Env) -> None:
    env.harness.script("w", "one")
    agent_id = await env.spawn(name="w", prompt="go", budget={"maxTurns": 1})
    await env.until(agent_id, "idle", "blocked")
    await env.service.stop(agent_id)
    answer = await env.service.restart(agent_id)
    assert answer.body["turn"] is None
    rec = env.service.get(agent_id)
    assert (rec["state"], rec["reason"]) == ("blocked", "budget-exhausted")


async def test_restarting_an_agent_in_its_grace_kills_the_old_turn_first(
    env: Env, clock: FakeClock
) -> None:
    env.harness.script("stubborn", "hang", "again")
    agent_id = await env.spawn(name="stubborn", prompt="go", stopGraceS=300)
    await settle(lambda: agent_id in env.harness.running)
    await env.service.stop(agent_id)
    await env.service.restart(agent_id)
    assert env.harness.cancelled == [agent_id]
    await env.until(agent_id, "idle")
    assert env.service.get(agent_id)["lastOutput"] == "again"


# --- delete ---------------------------------------------------------------------------------


async def test_delete_removes_an_ended_subtree_and_keeps_its_events(env: Env) -> None:
    lead = await env.spawn(name="lead", history="permanent", prompt="hi")
    await env.until(lead, "idle")
    child = await env.spawn(name="child", parent=lead)
    with pytest.raises(AgentLiveError) as live:
        await env.service.delete(lead)
    assert http_status(live.value) == 409
    await env.service.stop(lead)
    workdir = Path(env.service.get(lead)["workdir"])
    assert await asyncio.to_thread(workdir.is_dir)
    assert env.service.session(lead)["messages"]
    answer = await env.service.delete(lead, by="ops", why="cleanup")
    assert answer.body == {"id": lead, "deleted": [child, lead]}
    for gone in (lead, child):
        with pytest.raises(AgentNotFoundError):
            env.service.get(gone)
    assert not await asyncio.to_thread(workdir.parent.exists)
    assert lead not in env.store.state.sessions
    types = [e.type for e in await env.events(lead)]
    assert types[0] == "agent.created"
    assert types[-1] == ev.AGENT_DELETED
    (mark,) = [e for e in await env.events(child) if e.type == ev.AGENT_DELETED]
    assert mark.data == {"by": "ops", "why": "cleanup", "with": lead}
    await env.service.known(lead)  # its events are still read by its id
    await env.assert_replay_matches()


async def test_delete_refuses_a_live_descendant(env: Env) -> None:
    lead = await env.spawn(name="lead")
    child = await env.spawn(name="child", parent=lead)
    await env.service.stop(lead, keep_children=True)
    with pytest.raises(AgentLiveError, match=f"descendant '{child}'"):
        await env.service.delete(lead)
    assert env.state(lead) == "stopped"
