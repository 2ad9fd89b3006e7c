"""Headcount and priority, in process: a run's cap held by its SpawnTracker, preemption to
``paused`` (``onPreempt`` finish and cancel), resume in priority order as headcount frees,
refusals, restarts; and the daemon's concurrent turns shared by priority (``_slots``)."""

from __future__ import annotations

import asyncio
import contextlib
import random
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.daemon import (
    AgentPausedError,
    AgentService,
    SpawnRefusedError,
    SQLiteStore,
    TurnRequest,
    TurnResult,
    http_status,
)
from corral.daemon import _events as ev
from corral.daemon._headcount import headcount
from corral.daemon._slots import TurnSlots
from corral.kernel import Priority
from tests.daemon.conftest import MakeService
from tests.support.harness import ScriptedHarness, fail
from tests.support.polling import settle

BOUND_S = 10.0  # bound on a wait that must not hang; never a guess at how long it takes


class Run:
    """A service and helpers to spawn into one run (the root made by :meth:`root`)."""

    def __init__(self, service: AgentService, harness: ScriptedHarness) -> None:
        self.service = service
        self.harness = harness
        self.root_id = ""

    async def spawn(self, name: str, **spec: Any) -> str:
        spec.setdefault("harness", "command")
        spec.setdefault("command", ["true"])
        if self.root_id:
            spec.setdefault("parent", self.root_id)
        result = await self.service.spawn({"name": name, **spec})
        return str(result.body["id"])

    async def root(self, max_agents: int, *, allow_preempt: bool = True, **spec: Any) -> str:
        budget = {"maxAgents": max_agents, "allowPreempt": allow_preempt}
        self.root_id = await self.spawn("root", spawnBudget=budget, **spec)
        return self.root_id

    def rec(self, agent_id: str) -> dict[str, Any]:
        return self.service.get(agent_id)

    def state(self, agent_id: str) -> str:
        return str(self.rec(agent_id)["state"])

    def count(self) -> dict[str, Any]:
        return dict(headcount(self.service.store.state, self.rec(self.root_id)["runId"]))

    async def settled(self, agent_id: str, *states: str) -> dict[str, Any]:
        await settle(lambda: self.state(agent_id) in states)
        async with asyncio.timeout(BOUND_S):
            await self.service.settled(agent_id)
        return self.rec(agent_id)

    async def state_changes(self, agent_id: str) -> list[dict[str, Any]]:
        events = await self.service.events(0, agent_id=agent_id)
        return [e.data for e in events if e.type == ev.STATE_CHANGED]


@pytest.fixture
async def run(service: AgentService, harness: ScriptedHarness) -> Run:
    return Run(service, harness)


# --- preemption -------------------------------------------------------------------------------


async def test_a_critical_spawn_pauses_the_lowest_priority_most_recent_agent(run: Run) -> None:
    await run.root(4)
    low_old = await run.spawn("low-old", priority="low")
    low_new = await run.spawn("low-new", priority="low")
    normal = await run.spawn("normal")
    assert run.count() == {"active": 4, "paused": 0, "max": 4, "allowPreempt": True}
    boss = await run.spawn("boss", priority="critical")
    assert run.state(low_new) == "paused"
    assert {run.state(a) for a in (low_old, normal, boss, run.root_id)} == {"idle"}
    rec = run.rec(low_new)
    assert rec["pausedBy"] == boss
    assert rec["reason"] == "preempted"
    assert rec["resumeTo"] == "idle"
    changed = (await run.state_changes(low_new))[-1]
    assert changed == {
        "from": "idle",
        "to": "paused",
        "reason": "preempted",
        "by": boss,
        "resumeTo": "idle",
    }
    assert run.count() == {"active": 4, "paused": 1, "max": 4, "allowPreempt": True}


async def test_only_high_and_critical_preempt_and_never_a_person_s_agent(
    run: Run, harness: ScriptedHarness
) -> None:
    await run.root(3, priority="critical")
    harness.script("held", fail("boom"))
    held = await run.spawn("held", priority="low", prompt="go", onFailure="ask")
    await run.settled(held, "blocked")
    await run.spawn("normal")
    with pytest.raises(SpawnRefusedError) as normal:
        await run.spawn("another", priority="normal")
    assert "priority NORMAL may not preempt" in normal.value.message
    # The blocked LOW agent waits on a person: it keeps its slot; the NORMAL one is paused.
    high = await run.spawn("high", priority="high")
    assert [run.state(a) for a in (held, high)] == ["blocked", "idle"]
    with pytest.raises(SpawnRefusedError) as refused:
        await run.spawn("high2", priority="high")
    # Nobody below HIGH may be paused now (and a paused NORMAL agent does not block HIGH).
    assert "may be paused" in refused.value.message
    assert run.count()["active"] == 3


async def test_without_allow_preempt_a_spawn_at_the_cap_is_refused_naming_cap_and_count(
    run: Run,
) -> None:
    await run.root(2, allow_preempt=False)
    await run.spawn("low", priority="low")
    before = run.service.store.state.last_seq
    with pytest.raises(SpawnRefusedError) as info:
        await run.spawn("boss", priority="critical")
    error = info.value
    assert error.code == "spawn_budget_exceeded"
    assert error.retryable
    assert http_status(error) == 409
    assert error.details["max_agents"] == 2
    assert error.details["live"] == 2
    assert "2 live agents of a cap of 2" in error.message
    assert "preemption is off" in error.message
    assert run.service.store.state.last_seq == before  # nothing written


async def test_a_paused_agent_refuses_prompts_and_its_notices_wait_for_it(
    run: Run, harness: ScriptedHarness
) -> None:
    await run.root(3)
    mid = await run.spawn("mid", priority="low")
    leaf = await run.spawn("leaf", parent=mid, notifyOn=["done"])
    boss = await run.spawn("boss", priority="critical")
    assert run.state(mid) == "paused"
    with pytest.raises(AgentPausedError) as info:
        await run.service.prompt(mid, "work")
    assert info.value.code == "agent_paused"
    assert info.value.retryable
    assert http_status(info.value) == 409
    assert boss in info.value.message
    # Its child's notice queues for it.
    await run.service.prompt(leaf, "leaf work")
    await run.settled(leaf, "idle")
    assert [n["state"] for n in run.service.inbox(mid)] == ["pending"]
    # Headcount frees: it resumes idle, and its next turn reads the notice.
    await run.service.stop(boss)
    assert run.state(mid) == "idle"
    await run.service.prompt(mid, "now")
    await run.settled(mid, "idle")
    assert "leaf (" in harness.prompts(mid)[-1]
    assert "finished a turn" in harness.prompts(mid)[-1]


# --- a turn in flight ---------------------------------------------------------------------------


async def test_on_preempt_finish_lets_the_turn_end_and_keeps_the_agent_paused(
    run: Run, harness: ScriptedHarness
) -> None:
    await run.root(2)
    harness.script("worker", "hang")
    worker = await run.spawn("worker", priority="low", prompt="long job")
    await settle(lambda: worker in harness.running)
    boss = await run.spawn("boss", priority="critical")
    rec = run.rec(worker)
    assert rec["state"] == "paused"
    assert rec["turnInFlight"] == 1
    harness.release("worker")
    async with asyncio.timeout(BOUND_S):
        await run.service.settled(worker)
    rec = run.rec(worker)
    # The outcome is kept (output, usage), but the agent stays paused.
    assert rec["state"] == "paused"
    assert rec["turnInFlight"] is None
    assert rec["lastOutput"] == "released"
    assert rec["usage"]["turns"] == 1
    assert rec["resumeTo"] == "idle"
    assert rec["pausedBy"] == boss
    await run.service.stop(boss)
    assert run.state(worker) == "idle"


class GatedHarness(ScriptedHarness):
    """A scripted harness whose :class:`Gated` outcomes wait for their gate, then raise."""

    async def run_turn(self, request: TurnRequest) -> TurnResult:
        queue = self.outcomes[request.spec.name]
        if queue and isinstance(queue[0], Gated):
            gated = queue.popleft()
            assert isinstance(gated, Gated)
            self.requests.append(request)
            self.running.add(request.agent_id)
            try:
                await gated.gate.wait()
                raise gated.error
            finally:
                self.running.discard(request.agent_id)
        return await super().run_turn(request)


class Gated:
    def __init__(self, error: BaseException) -> None:
        self.gate = asyncio.Event()
        self.error = error


async def test_a_finishing_turn_that_asks_a_person_resumes_waiting(
    run: Run, harness: ScriptedHarness
) -> None:
    await run.root(2)
    harness.script("worker", "hang")
    rules = [{"match": "deploy", "verdict": "ask", "reason": "a person decides"}]
    worker = await run.spawn("worker", priority="low", prompt="job", guardrails=rules)
    await settle(lambda: worker in harness.running)
    boss = await run.spawn("boss", priority="critical")
    verdict = await run.service.check_action(worker, "deploy web")
    assert verdict.decision is not None
    assert run.state(worker) == "paused"
    await run.service.stop(boss)
    rec = run.rec(worker)
    assert rec["state"] == "waiting"
    assert rec["decision"] == verdict.decision
    await run.service.answer(verdict.decision, "approve")
    assert run.state(worker) == "running"
    harness.release("worker")
    await run.settled(worker, "idle")


async def test_a_failed_turn_while_paused_keeps_its_retry_for_the_resume(
    make_service: MakeService, sqlite_store: SQLiteStore
) -> None:
    harness = GatedHarness()
    run = Run(await make_service(sqlite_store, harness=harness), harness)
    await run.root(2)
    gated = Gated(fail("flaky"))
    harness.script("worker", gated, "second try")
    worker = await run.spawn(
        "worker", priority="low", prompt="job", onFailure="retry", maxRetries=2
    )
    await settle(lambda: worker in harness.running)
    boss = await run.spawn("boss", priority="critical")
    gated.gate.set()
    async with asyncio.timeout(BOUND_S):
        await run.service.settled(worker)
    rec = run.rec(worker)
    # The failure is counted; the retry its policy asks for waits for the resume.
    assert rec["state"] == "paused"
    assert rec["resumeTo"] == "retry"
    assert rec["lastError"] == "flaky"
    assert len(harness.prompts(worker)) == 1
    await run.service.stop(boss)
    rec = await run.settled(worker, "idle")
    assert harness.prompts(worker) == ["job", "job"]
    assert rec["lastOutput"] == "second try"
    assert rec["retriesUsed"] == 1


async def test_a_hold_while_paused_opens_its_decision_and_resumes_blocked(
    make_service: MakeService, sqlite_store: SQLiteStore
) -> None:
    harness = GatedHarness()
    run = Run(await make_service(sqlite_store, harness=harness), harness)
    await run.root(2)
    gated = Gated(fail("needs a person"))
    harness.script("worker", gated)
    worker = await run.spawn("worker", priority="low", prompt="job", onFailure="ask")
    await settle(lambda: worker in harness.running)
    boss = await run.spawn("boss", priority="critical")
    gated.gate.set()
    async with asyncio.timeout(BOUND_S):
        await run.service.settled(worker)
    rec = run.rec(worker)
    assert rec["state"] == "paused"
    assert rec["resumeTo"] == "blocked"
    (decision,) = [d for d in run.service.decisions() if d["agentId"] == worker]
    assert rec["decision"] == decision["id"]
    # Answering retry is a prompt: refused while paused; the decision stays open.
    with pytest.raises(AgentPausedError):
        await run.service.answer(decision["id"], "retry")
    await run.service.stop(boss)
    rec = run.rec(worker)
    assert rec["state"] == "blocked"
    assert rec["decision"] == decision["id"]
    assert rec["error"] == "needs a person"
    await run.service.answer(decision["id"], "retry", text="try again")
    await run.settled(worker, "idle")


async def test_on_preempt_cancel_interrupts_the_turn_and_runs_it_again_on_resume(
    run: Run, harness: ScriptedHarness
) -> None:
    await run.root(2)
    harness.script("worker", "hang", "done again")
    worker = await run.spawn("worker", priority="low", prompt="job", onPreempt="cancel")
    await settle(lambda: worker in harness.running)
    boss = await run.spawn("boss", priority="critical")
    assert harness.cancelled == [worker]
    rec = run.rec(worker)
    assert rec["state"] == "paused"
    assert rec["turnInFlight"] is None
    # Interrupted, not failed: no failure counted.
    assert rec["consecutiveFailures"] == 0
    assert rec["resumeTo"] == "turn"
    types = [e.type for e in await run.service.events(0, agent_id=worker)]
    assert ev.TURN_INTERRUPTED in types
    assert ev.TURN_FAILED not in types
    await run.service.stop(boss)
    rec = await run.settled(worker, "idle")
    assert harness.prompts(worker) == ["job", "job"]
    assert rec["lastOutput"] == "done again"


# --- resume -----------------------------------------------------------------------------------


async def test_paused_agents_resume_in_priority_order_as_headcount_frees(run: Run) -> None:
    await run.root(3, priority="critical")
    low = await run.spawn("low", priority="low")
    normal = await run.spawn("normal")
    high = await run.spawn("high", priority="high")  # pauses low
    boss = await run.spawn("boss", priority="critical")  # pauses normal
    assert [run.state(a) for a in (low, normal)] == ["paused", "paused"]
    await run.service.stop(high)
    assert [run.state(a) for a in (low, normal)] == ["paused", "idle"]
    await run.service.stop(boss)
    assert run.state(low) == "idle"
    assert run.count() == {"active": 3, "paused": 0, "max": 3, "allowPreempt": True}


async def test_a_failed_agent_frees_its_slot_too(run: Run, harness: ScriptedHarness) -> None:
    await run.root(2)
    low = await run.spawn("low", priority="low")
    harness.script("boss", "hang")
    boss = await run.spawn("boss", priority="critical", prompt="go")
    assert run.state(low) == "paused"
    harness.outcomes["boss"].clear()
    await run.service.stop(boss)
    assert run.state(low) == "idle"


async def test_a_restart_rebuilds_the_tracker_and_paused_agents_stay_paused(
    make_service: MakeService, sqlite_store: SQLiteStore, harness: ScriptedHarness
) -> None:
    first = Run(await make_service(sqlite_store), harness)
    await first.root(2, priority="critical")
    low = await first.spawn("low", priority="low")
    boss = await first.spawn("boss", priority="critical")
    await first.service.close()
    again = Run(await make_service(sqlite_store), harness)
    again.root_id = first.root_id
    assert again.state(low) == "paused"
    run_id = again.rec(low)["runId"]
    tracker = again.service._headcount.tracker(run_id)
    assert tracker is not None
    assert list(tracker.paused) == [low]
    # The cap still holds after the restart, and a stop still resumes.
    with pytest.raises(SpawnRefusedError):
        await again.spawn("high", priority="high")
    await again.service.stop(boss)
    assert again.state(low) == "idle"


# --- the cap is never passed --------------------------------------------------------------------

PRIORITY_NAMES = ["low", "normal", "high", "critical"]
OPS = st.lists(
    st.tuples(
        st.sampled_from(["spawn", "stop"]), st.sampled_from(PRIORITY_NAMES), st.integers(0, 50)
    ),
    min_size=1,
    max_size=25,
)


@settings(
    max_examples=15,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(max_agents=st.integers(1, 4), allow_preempt=st.booleans(), ops=OPS)
def test_the_cap_is_never_passed_across_spawns_and_stops(
    tmp_path: Path, max_agents: int, allow_preempt: bool, ops: list[tuple[str, str, int]]
) -> None:
    asyncio.run(_spawns_and_stops(tmp_path / uuid.uuid4().hex, max_agents, allow_preempt, ops))


async def _spawns_and_stops(
    where: Path, max_agents: int, allow_preempt: bool, ops: list[tuple[str, str, int]]
) -> None:
    harness = ScriptedHarness()
    store = SQLiteStore(where / "corral.db")
    await store.open()
    service = AgentService(store, home=where / "home", harnesses={"command": harness})
    await service.start()
    try:
        run = Run(service, harness)
        await run.root(max_agents, allow_preempt=allow_preempt, priority="critical")
        run_id = run.rec(run.root_id)["runId"]
        children: list[str] = []
        for op, priority, pick in ops:
            if op == "spawn":
                with contextlib.suppress(SpawnRefusedError):
                    children.append(await run.spawn(f"c{len(children)}", priority=priority))
            else:
                live = [c for c in children if run.state(c) not in ("stopped", "failed")]
                if live:
                    await service.stop(live[pick % len(live)])
            count = headcount(store.state, run_id)
            assert count["active"] <= max_agents
            if count["paused"]:
                assert count["active"] == max_agents  # a free slot never beside a paused one
            tracker = service._headcount.tracker(run_id)
            assert tracker is not None
            paused = {a for a, r in store.state.agents.items() if r["state"] == "paused"}
            assert set(tracker.paused) == paused
            if not allow_preempt:
                assert not paused
    finally:
        await service.close()
        await store.close()


# --- concurrent turns -------------------------------------------------------------------------


async def test_turn_slots_go_to_a_critical_turn_before_waiting_low_ones(
    make_service: MakeService, sqlite_store: SQLiteStore, harness: ScriptedHarness
) -> None:
    service = await make_service(sqlite_store, max_concurrent_turns=1)
    run = Run(service, harness)
    harness.script("blocker", "hang")
    blocker = await run.spawn("blocker", prompt="hold the slot")
    await settle(lambda: blocker in harness.running)
    lows = [await run.spawn(f"low{i}", priority="low", prompt="low work") for i in range(3)]
    boss = await run.spawn("boss", priority="critical", prompt="urgent")
    # Waiting turns: their agents are running, marked queued; no harness has them yet.
    await settle(lambda: all(run.rec(a).get("queued") for a in (*lows, boss)))
    assert run.state(boss) == "running"
    assert "queued" not in run.rec(blocker)
    assert [r.agent_id for r in harness.requests] == [blocker]
    harness.release("blocker")
    await settle(lambda: len(harness.requests) == 5)
    async with asyncio.timeout(BOUND_S):
        await service.settled()
    assert [r.agent_id for r in harness.requests] == [blocker, boss, *lows]
    assert all("queued" not in run.rec(a) for a in (*lows, boss))


async def test_a_turn_stopped_while_it_waits_for_a_slot_never_starts(
    make_service: MakeService, sqlite_store: SQLiteStore, harness: ScriptedHarness
) -> None:
    service = await make_service(sqlite_store, max_concurrent_turns=1)
    run = Run(service, harness)
    harness.script("blocker", "hang")
    blocker = await run.spawn("blocker", prompt="hold the slot")
    await settle(lambda: blocker in harness.running)
    waiting = await run.spawn("waiting", prompt="never")
    await service.stop(waiting)
    harness.release("blocker")
    async with asyncio.timeout(BOUND_S):
        await service.settled()
    assert [r.agent_id for r in harness.requests] == [blocker]
    # The slot it never took is free for the next turn.
    await service.prompt(blocker, "again")
    await run.settled(blocker, "idle")


async def test_turn_slots_share_by_weights_and_starve_nobody() -> None:
    slots = TurnSlots(1)
    order: list[Priority] = []
    hold = asyncio.Event()

    async def holder() -> None:
        await hold.wait()

    first = asyncio.create_task(slots.run("first", Priority.LOW, holder))
    await settle(lambda: slots.running == 1)

    def turn(priority: Priority) -> Callable[[], Any]:
        async def work() -> None:
            order.append(priority)

        return work

    rng = random.Random(7)
    waiters = []
    for priority in [Priority.CRITICAL, Priority.HIGH, Priority.NORMAL, Priority.LOW] * 30:
        waiters.append(asyncio.create_task(slots.run("a", priority, turn(priority))))
    rng.shuffle(waiters)
    await settle(lambda: slots.waiting() == 120)
    hold.set()
    async with asyncio.timeout(BOUND_S):
        await asyncio.gather(first, *waiters)
    # Critical first; in the first 30 grants the shares are 8:4:2:1 (16, 8, 4, 2).
    assert order[0] == Priority.CRITICAL
    firsts = order[:30]
    counts = [firsts.count(p) for p in (Priority.CRITICAL, Priority.HIGH, Priority.NORMAL)]
    assert counts == [16, 8, 4]
    assert Priority.LOW in firsts  # not starved while higher ones wait
    assert slots.running == 0
    assert slots.waiting() == 0


async def test_turn_slots_without_a_limit_run_at_once() -> None:
    slots = TurnSlots()
    ran: list[str] = []

    async def work() -> None:
        ran.append("x")

    await slots.run("a", Priority.LOW, work)
    assert ran == ["x"]
    assert slots.running == 0


async def test_turn_slots_count_each_agent_s_waiting_turns_without_walking_the_queues() -> None:
    # GET /agents asks waiting(id) of every agent it lists: the counts are kept per agent as
    # turns join, are granted or are cancelled (walking the queues each time made a listing
    # quadratic), so they must stay right through all three.
    slots = TurnSlots(1)
    hold = asyncio.Event()

    async def held() -> None:
        await hold.wait()

    first = asyncio.create_task(slots.run("first", Priority.LOW, held))
    await settle(lambda: slots.running == 1)

    async def work() -> None:
        pass

    n = 2_000
    waiters = [asyncio.create_task(slots.run(f"a{i}", Priority.NORMAL, work)) for i in range(n)]
    waiters.append(asyncio.create_task(slots.run("a0", Priority.HIGH, work)))
    await settle(lambda: slots.waiting() == n + 1)
    counts = [slots.waiting(f"a{i}") for i in range(n)]
    assert counts == [2] + [1] * (n - 1)
    waiters[1].cancel()  # a1 stops while it waits
    await asyncio.wait({waiters[1]})
    assert (slots.waiting("a1"), slots.waiting(), slots.waiting("first")) == (0, n, 0)
    hold.set()
    async with asyncio.timeout(BOUND_S):
        await asyncio.gather(first, *waiters[2:], waiters[0], return_exceptions=True)
    assert (slots.waiting(), slots.waiting("a0"), slots.running) == (0, 0, 0)
