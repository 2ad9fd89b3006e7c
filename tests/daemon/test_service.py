"""AgentService: the failure rules of DESIGN section 4, notices, budgets, commands."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from corral.daemon import (
    AgentBudgetExhaustedError,
    AgentBusyError,
    AgentNotFoundError,
    AgentNotLiveError,
    AgentService,
    CommandResult,
    Event,
    IdempotencyConflictError,
    InvalidSpecError,
    NewEvent,
    NothingToSendError,
    ServiceClosedError,
    SpawnRefusedError,
    SQLiteStore,
    TurnRequest,
    TurnResult,
    http_status,
)
from tests.daemon.conftest import MakeService, OpenSQLite
from tests.support.harness import ScriptedHarness, fail
from tests.support.polling import idle, settle

BOUND_S = 10.0  # bound on a wait that must not hang; never a guess at how long it takes


def _exists(path: str) -> bool:
    return Path(path).exists()


class Env:
    def __init__(self, store: SQLiteStore, service: AgentService, harness: ScriptedHarness):
        self.store = store
        self.service = service
        self.harness = harness

    async def spawn(self, **spec: Any) -> str:
        spec.setdefault("harness", "command")
        spec.setdefault("command", ["true"])
        result = await self.service.spawn(spec)
        return str(result.body["id"])

    def state(self, agent_id: str) -> str:
        return str(self.service.get(agent_id)["state"])

    async def until(self, agent_id: str, *states: str) -> dict[str, Any]:
        await settle(
            lambda: self.state(agent_id) in states and agent_id not in self.harness.running
        )
        async with asyncio.timeout(BOUND_S):
            await self.service.settled(agent_id)
        return self.service.get(agent_id)

    async def events(self, agent_id: str | None = None) -> list[Event]:
        return await self.service.events(0, agent_id=agent_id)

    async def types(self, agent_id: str) -> list[str]:
        return [e.type for e in await self.events(agent_id)]

    async def assert_replay_matches(self) -> None:
        assert (await self.store.replay()).snapshot() == self.store.state.snapshot()


@pytest.fixture
def env(sqlite_store: SQLiteStore, service: AgentService, harness: ScriptedHarness) -> Env:
    return Env(sqlite_store, service, harness)


async def test_spawn_with_prompt_runs_a_turn_and_goes_idle(env: Env) -> None:
    env.harness.script("w", "all done")
    agent_id = await env.spawn(name="w", prompt="do it")
    assert agent_id.startswith("a_")
    assert len(agent_id) == 10
    rec = await env.until(agent_id, "idle")
    assert rec["lastOutput"] == "all done"
    assert rec["turns"] == 1
    assert rec["usage"]["turns"] == 1
    assert await env.types(agent_id) == [
        "agent.created",
        "agent.turn_started",
        "agent.turn_completed",
        "agent.state_changed",
    ]
    (request,) = env.harness.requests
    assert request.prompt == "do it"
    assert request.env["CORRAL_AGENT_ID"] == agent_id
    assert request.workdir.is_dir()
    await env.assert_replay_matches()


async def test_spawn_without_prompt_waits_idle_then_takes_a_prompt(env: Env) -> None:
    agent_id = await env.spawn(name="w")
    assert env.state(agent_id) == "idle"
    result = await env.service.prompt(agent_id, "hello")
    assert result.status == 202
    await env.until(agent_id, "idle")
    assert env.harness.prompts(agent_id) == ["hello"]


async def test_fail_is_the_default_and_turn_failed_comes_first(env: Env) -> None:
    env.harness.script("w", fail("exit 2: disk full"))
    agent_id = await env.spawn(name="w", prompt="go")
    rec = await env.until(agent_id, "failed")
    assert rec["error"] == "exit 2: disk full"
    events = await env.events(agent_id)
    failed = next(e for e in events if e.type == "agent.turn_failed")
    changed = next(e for e in events if e.type == "agent.state_changed")
    assert failed.seq < changed.seq
    assert failed.data["error"] == "exit 2: disk full"
    assert failed.data["consecutiveFailures"] == 1
    assert changed.data["to"] == "failed"


async def test_ask_holds_the_agent_and_tells_the_parent(env: Env) -> None:
    parent = await env.spawn(name="boss")
    env.harness.script("w", fail("no access"))
    child = await env.spawn(name="w", prompt="go", onFailure="ask", parent=parent)
    rec = await env.until(child, "blocked")
    assert rec["reason"] == "ask"
    events = await env.events(child)
    needed = [e for e in events if e.type == "agent.supervision_needed"]
    assert [e.data for e in needed] == [
        {"reason": "ask", "error": "no access", "decision": rec["decision"]}
    ]
    (notice,) = env.service.inbox(parent)
    assert notice["kind"] == "supervision"
    assert notice["from"] == child
    assert notice["reason"] == "ask"
    assert notice["state"] == "pending"
    (decision,) = env.service.decisions()
    assert decision["agentId"] == child
    assert decision["reason"] == "ask"


async def test_retry_resends_the_same_prompt_then_holds(env: Env) -> None:
    env.harness.script("w", fail("a"), fail("b"), fail("c"))
    agent_id = await env.spawn(
        name="w", prompt="migrate", onFailure="retry", maxRetries=2, maxConsecutiveFailures=5
    )
    rec = await env.until(agent_id, "blocked")
    assert rec["reason"] == "retries-exhausted"
    assert env.harness.prompts(agent_id) == ["migrate", "migrate", "migrate"]
    changes = [e.data for e in await env.events(agent_id) if e.type == "agent.state_changed"]
    assert [c["to"] for c in changes] == ["blocked"]  # retries emit no state change
    failures = [
        e.data["consecutiveFailures"]
        for e in await env.events(agent_id)
        if e.type == "agent.turn_failed"
    ]
    assert failures == [1, 2, 3]


async def test_retry_without_max_retries_holds_at_once(env: Env) -> None:
    env.harness.script("w", fail())
    agent_id = await env.spawn(name="w", prompt="go", onFailure="retry")
    rec = await env.until(agent_id, "blocked")
    assert rec["reason"] == "ask"
    assert len(env.harness.prompts(agent_id)) == 1


async def test_breaker_trips_whatever_the_policy(env: Env) -> None:
    env.harness.script("w", fail(), fail(), fail(), fail())
    agent_id = await env.spawn(name="w", prompt="go", onFailure="retry", maxRetries=10)
    rec = await env.until(agent_id, "blocked")
    assert rec["reason"] == "circuit-tripped"
    assert len(env.harness.prompts(agent_id)) == 3  # default maxConsecutiveFailures


async def test_breaker_counts_failures_after_a_person_reprompts(env: Env) -> None:
    env.harness.script("w", fail("one"), fail("two"))
    agent_id = await env.spawn(name="w", prompt="go", onFailure="ask", maxConsecutiveFailures=2)
    assert (await env.until(agent_id, "blocked"))["reason"] == "ask"
    await env.service.prompt(agent_id, "try again", by="ops", why="rotated the key")
    rec = await env.until(agent_id, "blocked")
    assert rec["reason"] == "circuit-tripped"
    (resolution,) = env.service.resolutions()
    assert resolution["answer"] == "retry"
    assert resolution["by"] == "ops"
    assert resolution["why"] == "rotated the key"
    assert resolution["reason"] == "ask"


async def test_a_success_resets_the_count(env: Env) -> None:
    env.harness.script("w", fail(), "fine", fail())
    agent_id = await env.spawn(
        name="w", prompt="go", onFailure="retry", maxRetries=5, maxConsecutiveFailures=2
    )
    await env.until(agent_id, "idle")
    assert env.service.get(agent_id)["consecutiveFailures"] == 0
    await env.service.prompt(agent_id, "again")
    await settle(lambda: len(env.harness.prompts(agent_id)) == 4)
    rec = await env.until(agent_id, "idle")
    assert rec["consecutiveFailures"] == 0


async def test_notify_on_done_and_failed_reaches_the_parent_in_front_of_its_next_prompt(
    env: Env,
) -> None:
    parent = await env.spawn(name="boss")
    env.harness.script("a", "report ready")
    env.harness.script("b", fail("crashed"))
    a = await env.spawn(name="a", prompt="x", parent=parent, notifyOn=["done"])
    b = await env.spawn(name="b", prompt="y", parent=parent, notifyOn=["failed"])
    await env.until(a, "idle")
    await env.until(b, "failed")
    assert sorted(n["kind"] for n in env.service.inbox(parent)) == ["done", "failed"]
    await env.service.prompt(parent, "what now?")
    await env.until(parent, "idle")
    (sent,) = env.harness.prompts(parent)
    assert sent.startswith("[corral] notices since your last turn:")
    assert "finished a turn: report ready" in sent
    assert "failed: crashed" in sent
    assert sent.endswith("\n\nwhat now?")
    assert {n["state"] for n in env.service.inbox(parent)} == {"delivered"}
    await env.assert_replay_matches()


async def test_without_notify_on_only_supervision_notices_are_sent(env: Env) -> None:
    parent = await env.spawn(name="boss")
    child = await env.spawn(name="w", prompt="x", parent=parent)
    await env.until(child, "idle")
    assert env.service.inbox(parent) == []


async def test_a_stopped_parents_notices_are_dropped(env: Env) -> None:
    parent = await env.spawn(name="boss")
    env.harness.script("w", fail(), "hang")
    child = await env.spawn(name="w", prompt="x", parent=parent, onFailure="ask")
    await env.until(child, "blocked")
    await env.service.stop(parent, keep_children=True)
    assert [n["state"] for n in env.service.inbox(parent)] == ["dropped"]
    await env.service.stop(child)
    assert env.state(child) == "stopped"


async def test_commands_on_wrong_states_are_refused(env: Env) -> None:
    env.harness.script("w", "hang")
    agent_id = await env.spawn(name="w", prompt="go")
    await settle(lambda: agent_id in env.harness.running)
    with pytest.raises(AgentBusyError) as busy:
        await env.service.prompt(agent_id, "more")
    assert busy.value.retryable
    await env.service.stop(agent_id)
    with pytest.raises(AgentNotLiveError, match="stopped"):
        await env.service.prompt(agent_id, "more")
    with pytest.raises(AgentNotLiveError):
        await env.service.stop(agent_id)
    with pytest.raises(AgentNotFoundError):
        await env.service.prompt("a_00000000", "x")
    idle = await env.spawn(name="idle")
    with pytest.raises(NothingToSendError):
        await env.service.prompt(idle)


async def test_stop_cancels_a_running_turn(env: Env) -> None:
    env.harness.script("w", "hang")
    agent_id = await env.spawn(name="w", prompt="go")
    await settle(lambda: agent_id in env.harness.running)
    await env.service.stop(agent_id, by="ops", why="runaway")
    assert env.harness.cancelled == [agent_id]
    types = await env.types(agent_id)
    assert types[-2:] == ["agent.turn_interrupted", "agent.state_changed"]
    rec = env.service.get(agent_id)
    assert rec["state"] == "stopped"
    assert rec["turnInFlight"] is None
    assert _exists(rec["workdir"])  # kept for a restart, until the agent is deleted
    await env.assert_replay_matches()


@pytest.mark.parametrize("state", ["running", "idle"])
async def test_a_stop_records_who_and_why_whatever_the_state(env: Env, state: str) -> None:
    # A running (or idle) agent resolves no decision: the stop itself keeps who and why.
    if state == "running":
        env.harness.script("w", "hang")
    agent_id = await env.spawn(name="w", prompt="go" if state == "running" else None)
    await settle(lambda: env.service.get(agent_id)["state"] == state)
    await env.service.stop(agent_id, by="ops", why="runaway")
    stopped = (await env.events(agent_id))[-1]
    assert stopped.data["to"] == "stopped"
    assert (stopped.data["by"], stopped.data["why"]) == ("ops", "runaway")


async def test_an_idempotency_conflict_on_the_same_command_says_what_differs(env: Env) -> None:
    agent_id = await env.spawn(name="w")
    await env.service.prompt(agent_id, "first", idempotency_key="k")
    await env.service.settled(agent_id)
    with pytest.raises(IdempotencyConflictError) as conflict:
        await env.service.prompt(agent_id, "second", idempotency_key="k")
    message = conflict.value.message
    assert message == (
        f"idempotency key 'k' was first used for prompt of agent {agent_id!r} with other "
        "arguments (differing: text); use a new key for new work"
    )
    assert conflict.value.details["differs"] == ["text"]
    spec = {"name": "x", "harness": "command", "command": ["true"]}
    await env.service.spawn(spec, idempotency_key="s")
    with pytest.raises(IdempotencyConflictError) as spawned:
        await env.service.spawn({**spec, "name": "y"}, idempotency_key="s")
    assert "spawn with other arguments (differing: spec.name)" in spawned.value.message


async def test_stopping_a_blocked_agent_records_the_decision(env: Env) -> None:
    env.harness.script("w", fail())
    agent_id = await env.spawn(name="w", prompt="go", onFailure="ask")
    await env.until(agent_id, "blocked")
    await env.service.stop(agent_id, by="alice", why="not worth it")
    (resolution,) = env.service.resolutions()
    assert (resolution["answer"], resolution["by"], resolution["why"]) == (
        "stop",
        "alice",
        "not worth it",
    )
    assert env.service.decisions() == []


async def test_idempotent_commands_are_applied_once(env: Env) -> None:
    spec = {"name": "w", "harness": "command", "command": ["true"]}
    first = await env.service.spawn(spec, idempotency_key="k1")
    again = await env.service.spawn(spec, idempotency_key="k1")
    assert again.replayed
    assert not first.replayed
    assert again.body == first.body
    assert again.status == 201
    assert len(env.service.list_agents()) == 1
    with pytest.raises(IdempotencyConflictError, match="k1"):
        await env.service.spawn({**spec, "name": "other"}, idempotency_key="k1")
    agent_id = first.body["id"]
    await env.service.prompt(agent_id, "once", idempotency_key="p1")
    await env.until(agent_id, "idle")
    replay = await env.service.prompt(agent_id, "once", idempotency_key="p1")
    assert replay.replayed
    await env.until(agent_id, "idle")
    assert env.harness.prompts(agent_id) == ["once"]


@pytest.mark.parametrize("answer", ["retry", "stop", "budget"])
async def test_an_answer_sent_again_with_its_key_is_replayed(env: Env, answer: str) -> None:
    # A client that lost the answer sends it again with the same key (through another
    # daemon, when several share a store): it gets the first answer, applied once.
    budget = None
    if answer == "budget":  # held on its budget: one turn of one
        agent_id = await env.spawn(name="w", prompt="go", budget={"maxTurns": 1})
        await env.until(agent_id, "idle")
        with pytest.raises(AgentBudgetExhaustedError):
            await env.service.prompt(agent_id, "more")
        budget = {"maxTurns": 5}
    else:  # held on a failure
        env.harness.script("w", fail())
        agent_id = await env.spawn(name="w", prompt="go", onFailure="ask")
    decision = (await env.until(agent_id, "blocked"))["decision"]
    first = await env.service.answer(decision, answer, budget=budget, idempotency_key="a1")
    again = await env.service.answer(decision, answer, budget=budget, idempotency_key="a1")
    assert (first.replayed, again.replayed) == (False, True)
    assert (again.status, again.body) == (first.status, first.body)
    assert [r["answer"] for r in env.service.resolutions()] == [answer]


async def test_a_turn_that_would_pass_the_budget_does_not_start(env: Env) -> None:
    agent_id = await env.spawn(name="w", prompt="one", budget={"maxTurns": 1})
    await env.until(agent_id, "idle")
    with pytest.raises(AgentBudgetExhaustedError) as info:
        await env.service.prompt(agent_id, "two")
    assert info.value.details["dimension"] == "turns"
    assert "used 1 of a limit of 1" in info.value.message
    rec = env.service.get(agent_id)
    assert rec["state"] == "blocked"
    assert rec["reason"] == "budget-exhausted"
    needed = [e.data for e in await env.events(agent_id) if e.type == "agent.supervision_needed"]
    assert needed[-1]["dimension"] == "turns"
    assert env.harness.prompts(agent_id) == ["one"]


async def test_tokens_spent_by_failed_retries_stop_the_retry_loop(env: Env) -> None:
    env.harness.script("w", fail("a", tokens=60), fail("b", tokens=60), fail("c", tokens=60))
    agent_id = await env.spawn(
        name="w",
        prompt="go",
        onFailure="retry",
        maxRetries=5,
        maxConsecutiveFailures=10,
        budget={"maxTokens": 100},
    )
    rec = await env.until(agent_id, "blocked")
    assert rec["reason"] == "budget-exhausted"
    assert len(env.harness.prompts(agent_id)) == 2
    assert rec["usage"]["tokens"] == 120


async def test_spawn_budget_caps_the_run(env: Env) -> None:
    root = await env.spawn(name="root", spawnBudget={"maxAgents": 2})
    await env.spawn(name="c1", parent=root)
    with pytest.raises(SpawnRefusedError) as info:
        await env.spawn(name="c2", parent=root)
    assert info.value.retryable
    assert "2 live agents of a cap of 2" in info.value.message


async def test_invalid_specs_list_every_problem_and_create_nothing(env: Env) -> None:
    before = env.store.state.last_seq
    with pytest.raises(InvalidSpecError) as info:
        await env.service.spawn(
            {"name": "", "harness": "command", "onFailure": "sometimes", "bogus": 1}
        )
    fields = {p["field"] for p in info.value.problems}
    assert {"name", "onFailure", "bogus"} <= fields
    with pytest.raises(InvalidSpecError) as parent:
        await env.service.spawn(
            {"name": "x", "harness": "command", "command": ["true"], "parent": "a_ffffffff"}
        )
    assert parent.value.problems == [
        {"field": "parent", "message": "no agent with id 'a_ffffffff'"}
    ]
    with pytest.raises(InvalidSpecError) as cross:
        await env.service.spawn(
            {"name": "x", "harness": "python", "notifyOn": ["done", "sometimes"]}
        )
    assert {p["field"] for p in cross.value.problems} == {"function", "notifyOn[1]", "notifyOn"}
    assert env.store.state.last_seq == before


async def test_restart_settles_a_turn_left_in_flight(
    open_sqlite: OpenSQLite, make_service: MakeService, harness: ScriptedHarness
) -> None:
    store = await open_sqlite()
    harness.script("failing", "hang")
    harness.script("retrying", "hang", "second time lucky")
    service = await make_service(store)
    spec: dict[str, Any] = {"harness": "command", "command": ["x"], "prompt": "go"}
    a = (await service.spawn({**spec, "name": "failing"})).body["id"]
    b = (
        await service.spawn({**spec, "name": "retrying", "onFailure": "retry", "maxRetries": 1})
    ).body["id"]
    c = (await service.spawn({"name": "idle", "harness": "command", "command": ["x"]})).body["id"]
    await settle(lambda: {a, b} <= harness.running)
    await service.close()  # like a crash: nothing is written for the turns in flight
    await store.close()

    store = await open_sqlite()
    assert store.state.agents[a]["turnInFlight"] == 1
    service = await make_service(store)
    assert sorted(harness.reaped) == sorted([a, b])
    env = Env(store, service, harness)
    rec = await env.until(a, "failed")
    assert rec["error"] == "daemon restarted during turn"
    types = await env.types(a)
    assert types[-3:] == ["agent.turn_interrupted", "agent.turn_failed", "agent.state_changed"]
    rec_b = await env.until(b, "idle")
    assert rec_b["lastOutput"] == "second time lucky"
    assert env.state(c) == "idle"
    seqs = [e.seq for e in await env.events()]
    assert seqs == list(range(1, len(seqs) + 1))
    await env.assert_replay_matches()


async def test_subscribers_catch_up_then_follow_live_without_gaps(env: Env) -> None:
    first = await env.spawn(name="w", prompt="one")
    await env.until(first, "idle")
    seen: list[int] = []
    stream = env.service.subscribe(after=2)

    async def collect(done: Callable[[], bool]) -> None:
        async for event in stream:
            seen.append(event.seq)
            if done():
                break

    task = asyncio.create_task(collect(lambda: len(seen) >= 6))
    await env.service.prompt(first, "two")
    await asyncio.wait_for(task, 5)
    assert seen == list(range(3, 9))
    await stream.aclose()


async def test_a_dollar_budget_holds_an_agent_whose_turns_cost_is_unknown(env: Env) -> None:
    from corral.daemon import TurnResult

    env.harness.script("w", TurnResult(output="spent something", tokens=10, cost_usd=None))
    agent_id = await env.spawn(name="w", prompt="go", budget={"maxCostUsd": 1.0})
    await env.until(agent_id, "idle")
    assert env.service.get(agent_id)["usage"]["unpricedTurns"] == 1
    with pytest.raises(AgentBudgetExhaustedError, match="cannot be enforced") as info:
        await env.service.prompt(agent_id, "more")
    assert info.value.details["dimension"] == "cost_usd"
    assert env.service.get(agent_id)["reason"] == "budget-exhausted"
    await env.assert_replay_matches()


# --- budgets at spawn, notices of ended agents, retries with notices ------------------------


@pytest.mark.parametrize(
    ("budget", "dimension"),
    [({"maxTurns": 0}, "turns"), ({"maxTokens": 0}, "tokens"), ({"deadlineS": 0}, "deadline_s")],
)
async def test_a_first_turn_the_budget_has_no_room_for_does_not_start(
    env: Env, budget: dict[str, Any], dimension: str
) -> None:
    parent = await env.spawn(name="boss")
    result = await env.service.spawn(
        {"name": "w", "harness": "command", "command": ["x"], "prompt": "go", "budget": budget},
        idempotency_key="k",
    )
    assert result.status == 201
    assert (result.body["state"], result.body["reason"]) == ("blocked", "budget-exhausted")
    agent_id = result.body["id"]
    assert result.body["turnInFlight"] is None
    rec = env.service.get(agent_id)
    assert (rec["state"], rec["reason"], rec["turns"]) == ("blocked", "budget-exhausted", 0)
    assert rec["error"] == result.body["error"]
    assert dimension in rec["error"]
    assert "agent.turn_started" not in await env.types(agent_id)
    (needed,) = [e for e in await env.events(agent_id) if e.type == "agent.supervision_needed"]
    assert (needed.data["reason"], needed.data["dimension"]) == ("budget-exhausted", dimension)
    assert env.harness.requests == []
    assert env.service.inbox(parent) == []
    await env.assert_replay_matches()


async def test_a_child_held_by_its_budget_at_spawn_tells_its_parent(env: Env) -> None:
    parent = await env.spawn(name="boss")
    child = await env.spawn(name="w", prompt="go", parent=parent, budget={"maxTurns": 0})
    (notice,) = env.service.inbox(parent)
    assert (notice["kind"], notice["from"], notice["reason"]) == (
        "supervision",
        child,
        "budget-exhausted",
    )


class Gated:
    """A ScriptedHarness behind gates: turns of the agents named in a closed gate wait
    (before their scripted outcome) until it is opened."""

    def __init__(self, inner: ScriptedHarness) -> None:
        self.inner = inner
        self.gates: dict[str, asyncio.Event] = {}
        self.waiting: set[str] = set()

    def close(self, name: str) -> None:
        self.gates[name] = asyncio.Event()

    def open(self, name: str) -> None:
        self.gates.pop(name).set()

    async def run_turn(self, request: TurnRequest) -> TurnResult:
        gate = self.gates.get(request.spec.name)
        if gate is not None:
            self.waiting.add(request.agent_id)
            try:
                await gate.wait()
            finally:
                self.waiting.discard(request.agent_id)
        return await self.inner.run_turn(request)

    async def reap(self, agent_id: str, state_dir: Path) -> bool:
        return await self.inner.reap(agent_id, state_dir)


async def test_notices_waiting_for_a_parent_that_fails_are_dropped(env: Env) -> None:
    gated = Gated(env.harness)
    env.service.harnesses["command"] = gated
    gated.close("boss")
    env.harness.script("boss", fail("lead crashed"))
    parent = await env.spawn(name="boss", prompt="lead")
    await settle(lambda: parent in gated.waiting)
    child = await env.spawn(name="w", prompt="x", parent=parent, notifyOn=["done"])
    await env.until(child, "idle")
    assert [n["state"] for n in env.service.inbox(parent)] == ["pending"]
    gated.open("boss")
    await env.until(parent, "failed")
    (notice,) = env.service.inbox(parent)
    assert notice["state"] == "dropped"
    assert notice["droppedAt"]
    assert (await env.types(parent))[-1] == "inbox.dropped"
    await env.assert_replay_matches()


async def test_a_notice_to_a_parent_that_has_ended_is_dropped_at_once(env: Env) -> None:
    parent = await env.spawn(name="boss")
    child = await env.spawn(name="w", parent=parent, notifyOn=["done"], onFailure="ask")
    await env.service.stop(parent, keep_children=True)
    env.harness.script("w", fail("no key"), "fixed")
    await env.service.prompt(child, "go")
    await env.until(child, "blocked")
    await env.service.prompt(child)
    await env.until(child, "idle")
    notices = env.service.inbox(parent)
    assert [(n["kind"], n["state"]) for n in notices] == [
        ("supervision", "dropped"),
        ("done", "dropped"),
    ]
    await env.assert_replay_matches()


async def test_a_retry_resends_the_notices_that_went_in_front_of_the_failed_prompt(
    env: Env,
) -> None:
    parent = await env.spawn(name="boss", onFailure="retry", maxRetries=1)
    child = await env.spawn(name="w", prompt="x", parent=parent, notifyOn=["done"])
    await env.until(child, "idle")
    env.harness.script("boss", fail("flaky"), "done")
    await env.service.prompt(parent, "what now?")
    await settle(lambda: len(env.harness.prompts(parent)) == 2)
    await env.until(parent, "idle")
    first, retry = env.harness.prompts(parent)
    assert first.startswith("[corral] notices since your last turn:")
    assert f"w ({child}) finished a turn: ok" in first
    assert first.endswith("\n\nwhat now?")
    assert retry == first
    started = [e.data for e in await env.events(parent) if e.type == "agent.turn_started"]
    assert [(d["prompt"], d["retry"]) for d in started] == [
        ("what now?", False),
        ("what now?", True),
    ]
    # A prompt of its own afterwards carries no notice any more: they were delivered.
    await env.service.prompt(parent, "next")
    await settle(lambda: len(env.harness.prompts(parent)) == 3)
    await env.until(parent, "idle")
    assert env.harness.prompts(parent)[-1] == "next"
    await env.assert_replay_matches()


async def test_pending_notices_survive_a_restart_and_go_in_front_of_the_next_prompt(
    open_sqlite: OpenSQLite, make_service: MakeService
) -> None:
    async def open_env(harness: ScriptedHarness) -> Env:
        store = await open_sqlite()
        return Env(store, await make_service(store, harness=harness), harness)

    env = await open_env(ScriptedHarness())
    parent = await env.spawn(name="boss")
    env.harness.script("w", fail("no key"))
    child = await env.spawn(name="w", prompt="x", parent=parent, onFailure="ask")
    await env.until(child, "blocked")
    await env.service.close()
    await env.store.close()

    env = await open_env(ScriptedHarness())
    notices = env.service.inbox(parent)
    assert [(n["kind"], n["state"]) for n in notices] == [("supervision", "pending")]
    await env.service.prompt(parent, "status?")
    await env.until(parent, "idle")
    (sent,) = env.harness.prompts(parent)
    assert f"w ({child}) is blocked (ask) and needs a decision: no key" in sent
    assert sent.endswith("\n\nstatus?")
    assert [n["state"] for n in env.service.inbox(parent)] == ["delivered"]


# --- races -------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def lock_held(env: Env) -> AsyncIterator[None]:
    """The service's lock held as a command holds it: a spawn whose write waits until the
    block ends. Commands and turn outcomes that come meanwhile queue behind it, in order."""
    gate = asyncio.Event()
    writing = asyncio.Event()
    append = env.store.append

    async def waiting_append(events: Sequence[NewEvent], **options: Any) -> list[Event]:
        writing.set()
        await gate.wait()
        return await append(events, **options)

    env.store.append = waiting_append  # type: ignore[method-assign]
    holder = asyncio.create_task(
        env.service.spawn({"name": "holder", "harness": "command", "command": ["x"]})
    )
    async with asyncio.timeout(BOUND_S):
        await writing.wait()
    env.store.append = append  # type: ignore[method-assign]
    try:
        yield
    finally:
        gate.set()
        async with asyncio.timeout(BOUND_S):
            await holder


async def test_stop_wins_over_a_finished_turn_waiting_to_be_written(env: Env) -> None:
    env.harness.script("w", "hang")
    agent_id = await env.spawn(name="w", prompt="go")
    await settle(lambda: agent_id in env.harness.running)
    async with lock_held(env):
        stopping = asyncio.create_task(env.service.stop(agent_id, by="ops"))
        await idle()  # the stop now waits for the lock
        env.harness.release("w")
        # the turn is back from the harness and waits for the lock, behind the stop
        await settle(lambda: agent_id not in env.harness.running)
    async with asyncio.timeout(BOUND_S):
        result = await stopping
    assert result.status == 202
    rec = env.service.get(agent_id)
    assert (rec["state"], rec["turnInFlight"], rec["lastOutput"]) == ("stopped", None, None)
    types = await env.types(agent_id)
    assert "agent.turn_completed" not in types
    assert types[-2:] == ["agent.turn_interrupted", "agent.state_changed"]
    async with asyncio.timeout(BOUND_S):
        await env.service.settled()
    await env.assert_replay_matches()


async def test_two_prompts_at_once_start_one_turn(env: Env) -> None:
    agent_id = await env.spawn(name="w")
    env.harness.script("w", "hang")
    results = await asyncio.gather(
        env.service.prompt(agent_id, "a"),
        env.service.prompt(agent_id, "b"),
        return_exceptions=True,
    )
    assert [type(r) for r in results] == [CommandResult, AgentBusyError]
    await settle(lambda: agent_id in env.harness.running)
    assert env.harness.prompts(agent_id) == ["a"]
    env.harness.release("w")
    rec = await env.until(agent_id, "idle")
    assert rec["turns"] == 1


async def test_the_same_spawn_sent_at_once_with_one_key_creates_one_agent(env: Env) -> None:
    spec = {"name": "w", "harness": "command", "command": ["x"], "prompt": "go"}
    results = await asyncio.gather(
        *(env.service.spawn(spec, idempotency_key="k") for _ in range(5))
    )
    assert len({r.body["id"] for r in results}) == 1
    assert [r.replayed for r in results].count(False) == 1
    (agent,) = env.service.list_agents()
    await env.until(agent["id"], "idle")
    assert env.harness.prompts(agent["id"]) == ["go"]


@pytest.mark.parametrize("first", ["prompt", "stop"])
async def test_a_prompt_and_a_stop_at_once_leave_the_agent_stopped(env: Env, first: str) -> None:
    agent_id = await env.spawn(name="w")
    env.harness.script("w", "hang")
    calls = {"prompt": env.service.prompt(agent_id, "go"), "stop": env.service.stop(agent_id)}
    order = [first, "stop" if first == "prompt" else "prompt"]
    results = dict(
        zip(
            order,
            await asyncio.gather(*(calls[c] for c in order), return_exceptions=True),
            strict=True,
        )
    )
    assert isinstance(results["stop"], CommandResult)
    if first == "stop":
        assert isinstance(results["prompt"], AgentNotLiveError)
    else:
        assert isinstance(results["prompt"], CommandResult)
    await settle(lambda: not env.harness.running)
    await idle()
    rec = env.service.get(agent_id)
    assert (rec["state"], rec["turnInFlight"]) == ("stopped", None)
    async with asyncio.timeout(BOUND_S):
        await env.service.settled()
    types = await env.types(agent_id)
    assert types[-1] == "agent.state_changed"
    assert "agent.turn_completed" not in types
    await env.assert_replay_matches()


async def test_settled_waits_for_the_turn_and_the_retry_it_starts(env: Env) -> None:
    env.harness.script("w", fail("flaky"), "hang")
    agent_id = await env.spawn(name="w", prompt="go", onFailure="retry", maxRetries=1)
    settling = asyncio.create_task(env.service.settled(agent_id))
    await settle(lambda: len(env.harness.requests) == 2 and agent_id in env.harness.running)
    assert not settling.done()
    other = await env.spawn(name="v")  # nothing in flight: settled at once
    async with asyncio.timeout(BOUND_S):
        await env.service.settled(other)
    env.harness.release("w")
    async with asyncio.timeout(BOUND_S):
        await settling
    rec = env.service.get(agent_id)  # the outcome is committed by then
    assert (rec["state"], rec["turnInFlight"], rec["turns"]) == ("idle", None, 2)


# --- closing -----------------------------------------------------------------------------------


async def test_commands_after_close_are_refused_and_write_nothing(env: Env) -> None:
    spec = {"name": "w", "harness": "command", "command": ["x"], "prompt": "one"}
    agent_id = (await env.service.spawn(spec, idempotency_key="k")).body["id"]
    await env.until(agent_id, "idle")
    await env.service.close()
    before = env.store.state.last_seq
    refused = [
        env.service.spawn({**spec, "name": "v"}),
        env.service.prompt(agent_id, "two"),
        env.service.stop(agent_id),
    ]
    for call, command in zip(refused, ["spawn", "prompt", "stop"], strict=True):
        with pytest.raises(ServiceClosedError) as info:
            await call
        assert info.value.code == "shutting_down"
        assert info.value.retryable
        assert http_status(info.value) == 503
        assert f"{command} was not applied" in info.value.message
    # a retried command that was applied before still gets its first answer
    assert (await env.service.spawn(spec, idempotency_key="k")).replayed
    assert env.store.state.last_seq == before
    assert env.harness.prompts(agent_id) == ["one"]


async def test_a_command_that_waited_for_the_lock_during_close_is_refused(env: Env) -> None:
    agent_id = await env.spawn(name="w")
    async with lock_held(env):
        prompting = asyncio.create_task(env.service.prompt(agent_id, "go"))
        await idle()  # the prompt now waits for the lock
        await env.service.close()
    with pytest.raises(ServiceClosedError):
        await prompting
    rec = env.service.get(agent_id)
    assert (rec["state"], rec["turnInFlight"], rec["turns"]) == ("idle", None, 0)
    assert env.harness.requests == []


async def test_a_subscription_made_after_close_ends_after_the_log(env: Env) -> None:
    await env.spawn(name="w")
    await env.service.close()
    async with asyncio.timeout(BOUND_S):
        seen = [e.seq async for e in env.service.subscribe(after=0)]
    assert seen == [1]
    assert env.service.subscriptions == 0


async def test_close_ends_live_subscriptions_and_cancels_turns(env: Env) -> None:
    env.harness.script("w", "hang")
    agent_id = await env.spawn(name="w", prompt="go")
    await settle(lambda: agent_id in env.harness.running)
    stream = env.service.subscribe()
    reading = asyncio.create_task(anext(stream, None))
    await idle()
    await env.service.close()
    async with asyncio.timeout(BOUND_S):
        assert await reading is None
    async with asyncio.timeout(BOUND_S):
        await env.service.settled()
    assert env.harness.cancelled == [agent_id]
    assert env.service.subscriptions == 0
    # nothing is written for the turn: the next start settles it as interrupted
    assert env.service.get(agent_id)["turnInFlight"] == 1


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"store": object()}, "store"),
        ({"home": 5}, "home"),
        ({"harnesses": ["command"]}, "harnesses"),
        ({"harnesses": {"command": object()}}, "harnesses"),
        ({"url": ""}, "url"),
        ({"clock": "now"}, "clock"),
        ({"subscriber_buffer": 0}, "subscriber_buffer"),
        ({"subscriber_buffer": True}, "subscriber_buffer"),
        ({"token": ""}, "token"),
        ({"token": 5}, "token"),
    ],
)
async def test_agent_service_refuses_bad_arguments(
    tmp_path: Path, kwargs: dict[str, Any], argument: str
) -> None:
    from corral.kernel import InvalidArgumentError

    store = SQLiteStore(tmp_path / "c.db")
    args: dict[str, Any] = {"home": tmp_path, "harnesses": {"command": ScriptedHarness()}}
    args.update(kwargs)
    with pytest.raises(InvalidArgumentError) as caught:
        AgentService(args.pop("store", store), **args)
    assert caught.value.where == "AgentService"
    assert caught.value.argument == argument


async def test_a_turn_may_not_outlive_the_agents_deadline(env: Env) -> None:
    agent_id = await env.spawn(name="w", prompt="go", turnTimeoutS=600, budget={"deadlineS": 30})
    await env.until(agent_id, "idle")
    (request,) = env.harness.requests
    assert request.timeout_s <= 30
    assert request.remaining.deadline_s is not None
    assert request.timeout_s == pytest.approx(request.remaining.deadline_s)
    plain = await env.spawn(name="p", prompt="go", turnTimeoutS=42)
    await env.until(plain, "idle")
    assert env.harness.requests[-1].timeout_s == 42


async def test_a_deleted_working_directory_is_recreated_and_said_so(env: Env) -> None:
    agent_id = await env.spawn(name="w", prompt="one")
    await env.until(agent_id, "idle")
    workdir = Path(env.service.get(agent_id)["workdir"])
    (workdir / "notes").write_text("kept by the agent")
    shutil.rmtree(workdir)
    await env.service.prompt(agent_id, "two")
    rec = await env.until(agent_id, "idle")
    assert rec["lastOutput"] == "ok"
    assert _listing(workdir) == []  # there again, empty
    types = await env.types(agent_id)
    recreated = types.index("agent.workdir_recreated")
    assert types[recreated - 1 : recreated + 2] == [
        "agent.turn_started",
        "agent.workdir_recreated",
        "agent.turn_completed",
    ]
    (event,) = [e for e in await env.events(agent_id) if e.type == "agent.workdir_recreated"]
    assert event.data == {"turn": 2, "workdir": str(workdir)}
    await env.assert_replay_matches()


def _listing(directory: Path) -> list[str] | None:
    """The names in ``directory``; None when it does not exist."""
    return sorted(p.name for p in directory.iterdir()) if directory.is_dir() else None
