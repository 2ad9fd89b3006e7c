"""SpawnTracker: the headcount cap, cooperative preemption, resume order; PauseGate."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from corral.kernel import (
    InvalidArgumentError,
    Priority,
    SpawnBudget,
    SpawnBudgetExceeded,
    UsageError,
)
from corral.runtime import (
    AgentAlreadyTrackedError,
    FakeClock,
    PauseGate,
    SpawnSnapshot,
    SpawnTracker,
    UnknownAgentError,
)

P = Priority


def tracker(max_agents: int, *, allow_preempt: bool = True, **kw: Any) -> SpawnTracker:
    return SpawnTracker(SpawnBudget(max_agents=max_agents, allow_preempt=allow_preempt), **kw)


def assert_invariants(t: SpawnTracker) -> None:
    active, paused = t.active, t.paused
    assert len(active) <= t.max_agents
    assert t.free_slots == t.max_agents - len(active)
    assert not set(active) & set(paused)
    # A free slot never coexists with a waiting paused agent.
    if paused:
        assert t.free_slots == 0


async def until(cond: Callable[[], bool], limit: int = 1000) -> None:
    for _ in range(limit):
        if cond():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not reached")


def gate_states(gate: PauseGate) -> str:
    return "paused" if gate.is_paused else "open"


class Recorder:
    """Sync callbacks that record ``(event, agent_id)``."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def pause(self, agent_id: str) -> None:
        self.events.append(("pause", agent_id))

    def resume(self, agent_id: str) -> None:
        self.events.append(("resume", agent_id))


# --- the cap ------------------------------------------------------------------------------


async def test_cap_counts_the_root_and_refusal_names_cap_and_count() -> None:
    t = tracker(3)
    assert await t.acquire("root") is None
    assert await t.acquire("a") is None
    assert t.free_slots == 1
    assert await t.acquire("b") is None
    assert t.free_slots == 0
    with pytest.raises(SpawnBudgetExceeded) as info:
        await t.acquire("c")
    err = info.value
    assert err.code == "spawn_budget_exceeded"
    assert err.retryable is True
    assert (err.max_agents, err.active, err.agent_id) == (3, 3, "c")
    assert "3 of a cap of 3 agents" in err.message
    assert "'c'" in err.message
    assert "NORMAL may not preempt" in err.message
    assert t.state_of("c") is None
    assert list(t.active) == ["root", "a", "b"]


async def test_cap_of_one_is_the_root_alone() -> None:
    t = tracker(1)
    await t.acquire("root", P.CRITICAL)
    with pytest.raises(SpawnBudgetExceeded) as info:
        await t.acquire("child", P.CRITICAL)
    assert (info.value.max_agents, info.value.active) == (1, 1)
    assert "no active agent has a priority below CRITICAL" in info.value.message


async def test_release_frees_a_slot_and_an_id_can_be_acquired_again() -> None:
    t = tracker(2)
    await t.acquire("root")
    await t.acquire("a")
    assert await t.release("a") is None
    assert t.free_slots == 1
    await t.acquire("b")
    await t.release("b")
    await t.acquire("a", P.LOW)
    assert t.active == {"root": P.NORMAL, "a": P.LOW}


@pytest.mark.parametrize("requester", [P.NORMAL, P.LOW, P.BACKGROUND])
async def test_below_high_never_preempts(requester: Priority) -> None:
    t = tracker(2)
    await t.acquire("root", P.BACKGROUND)
    await t.acquire("a", P.BACKGROUND)
    with pytest.raises(SpawnBudgetExceeded) as info:
        await t.acquire("x", requester)
    assert f"priority {requester.name} may not preempt" in info.value.message
    assert t.active == {"root": P.BACKGROUND, "a": P.BACKGROUND}
    assert t.paused == {}


async def test_allow_preempt_false_refuses_critical() -> None:
    t = tracker(2, allow_preempt=False)
    pauses = Recorder()
    await t.acquire("root", P.BACKGROUND, on_pause=pauses.pause)
    await t.acquire("a", P.BACKGROUND, on_pause=pauses.pause)
    with pytest.raises(SpawnBudgetExceeded) as info:
        await t.acquire("x", P.CRITICAL)
    assert "allow_preempt=False" in info.value.message
    assert "2 of a cap of 2" in info.value.message
    assert pauses.events == []
    assert t.paused == {}


# --- preemption ---------------------------------------------------------------------------


async def test_preemption_pauses_lowest_then_most_recent() -> None:
    t = tracker(4)
    rec = Recorder()
    await t.acquire("root", P.NORMAL, on_pause=rec.pause)
    await t.acquire("a", P.LOW, on_pause=rec.pause)
    await t.acquire("b", P.BACKGROUND, on_pause=rec.pause)
    await t.acquire("c", P.BACKGROUND, on_pause=rec.pause)

    assert await t.acquire("x1", P.CRITICAL) == "c"  # lowest, most recently admitted
    assert await t.acquire("x2", P.CRITICAL) == "b"
    assert await t.acquire("x3", P.HIGH) == "a"  # LOW before NORMAL
    assert await t.acquire("x4", P.HIGH) == "root"
    assert rec.events == [("pause", "c"), ("pause", "b"), ("pause", "a"), ("pause", "root")]
    assert t.state_of("c") == "paused"
    assert t.active == {"x1": P.CRITICAL, "x2": P.CRITICAL, "x3": P.HIGH, "x4": P.HIGH}
    assert_invariants(t)


async def test_no_preemption_of_equal_or_higher_priority() -> None:
    t = tracker(3)
    rec = Recorder()
    await t.acquire("root", P.CRITICAL, on_pause=rec.pause)
    await t.acquire("a", P.HIGH, on_pause=rec.pause)
    await t.acquire("b", P.HIGH, on_pause=rec.pause)
    with pytest.raises(SpawnBudgetExceeded) as info:
        await t.acquire("x", P.HIGH)
    assert "no active agent has a priority below HIGH" in info.value.message
    # CRITICAL may pause a HIGH one, never the CRITICAL root.
    assert await t.acquire("y", P.CRITICAL) == "b"
    assert await t.acquire("z", P.CRITICAL) == "a"
    with pytest.raises(SpawnBudgetExceeded):
        await t.acquire("w", P.CRITICAL)
    assert rec.events == [("pause", "b"), ("pause", "a")]
    assert t.state_of("root") == "active"


async def test_freed_slot_goes_to_paused_agents_highest_priority_then_fifo() -> None:
    t = tracker(4)
    rec = Recorder()
    await t.acquire("root", P.CRITICAL)
    for agent_id, prio in (("a", P.LOW), ("b", P.NORMAL), ("c", P.LOW)):
        await t.acquire(agent_id, prio, on_pause=rec.pause, on_resume=rec.resume)
    assert await t.acquire("x1", P.CRITICAL) == "c"
    assert await t.acquire("x2", P.CRITICAL) == "a"
    assert await t.acquire("x3", P.CRITICAL) == "b"
    # NORMAL first; then the two LOW ones in the order they were paused.
    assert list(t.paused) == ["b", "c", "a"]

    assert await t.release("x1") == "b"
    assert t.state_of("b") == "active"
    assert t.free_slots == 0
    # The freed slot went to the paused agent, not to a newcomer.
    with pytest.raises(SpawnBudgetExceeded):
        await t.acquire("newcomer", P.NORMAL)
    assert await t.release("x2") == "c"
    assert await t.release("x3") == "a"
    assert await t.release("root") is None
    assert t.free_slots == 1
    assert t.paused == {}
    assert [e for e in rec.events if e[0] == "resume"] == [
        ("resume", "b"),
        ("resume", "c"),
        ("resume", "a"),
    ]


async def test_releasing_a_paused_agent_leaves_the_queue_without_resuming_anyone() -> None:
    t = tracker(2)
    rec = Recorder()
    await t.acquire("root", P.LOW, on_resume=rec.resume)
    await t.acquire("a", P.LOW, on_resume=rec.resume)
    assert await t.acquire("x", P.HIGH) == "a"
    assert await t.release("a") is None
    assert t.paused == {}
    assert t.free_slots == 0
    assert await t.release("x") is None
    assert t.free_slots == 1
    assert rec.events == []


async def test_newcomer_never_overtakes_a_paused_agent_of_equal_or_higher_priority() -> None:
    t = tracker(2)
    await t.acquire("root", P.CRITICAL)
    await t.acquire("a", P.NORMAL)
    assert await t.acquire("x", P.HIGH) == "a"
    await t.reprioritize("x", P.LOW)  # now an active LOW agent could be preempted
    await t.reprioritize("a", P.HIGH)  # but a paused HIGH agent waits first
    with pytest.raises(SpawnBudgetExceeded) as info:
        await t.acquire("y", P.HIGH)
    assert "paused agent 'a' (HIGH) waits for a slot first" in info.value.message
    # A CRITICAL newcomer outranks the paused HIGH agent and may preempt.
    assert await t.acquire("z", P.CRITICAL) == "x"
    assert list(t.paused) == ["a", "x"]


# --- reprioritize -------------------------------------------------------------------------


async def test_reprioritize_active_changes_who_is_preempted() -> None:
    t = tracker(3)
    await t.acquire("root", P.NORMAL)
    await t.acquire("a", P.LOW)
    await t.acquire("b", P.NORMAL)
    await t.reprioritize("a", P.HIGH)
    await t.reprioritize("root", P.BACKGROUND)
    assert t.active == {"root": P.BACKGROUND, "a": P.HIGH, "b": P.NORMAL}
    assert await t.acquire("x", P.HIGH) == "root"
    with pytest.raises(SpawnBudgetExceeded):
        await t.acquire("y", P.NORMAL)
    assert await t.acquire("y", P.HIGH) == "b"  # "a" is HIGH now: not below HIGH


async def test_reprioritize_paused_changes_resume_order_but_never_preempts() -> None:
    t = tracker(3)
    rec = Recorder()
    await t.acquire("root", P.CRITICAL)
    await t.acquire("a", P.LOW, on_pause=rec.pause, on_resume=rec.resume)
    await t.acquire("b", P.LOW, on_pause=rec.pause, on_resume=rec.resume)
    await t.acquire("x", P.CRITICAL)  # pauses b
    await t.acquire("y", P.CRITICAL)  # pauses a
    assert list(t.paused) == ["b", "a"]
    await t.reprioritize("a", P.NORMAL)
    assert t.paused == {"a": P.NORMAL, "b": P.LOW}
    # Raising a paused agent above active ones does not resume it or pause anyone.
    await t.reprioritize("x", P.BACKGROUND)
    await t.reprioritize("b", P.CRITICAL)
    assert t.state_of("b") == "paused"
    assert t.state_of("x") == "active"
    assert rec.events == [("pause", "b"), ("pause", "a")]
    assert await t.release("y") == "b"
    assert_invariants(t)


async def test_reprioritize_same_priority_keeps_fifo_place() -> None:
    t = tracker(3)
    await t.acquire("root", P.CRITICAL)
    await t.acquire("a", P.LOW)
    await t.acquire("b", P.LOW)
    await t.acquire("x", P.HIGH)  # pauses b
    await t.acquire("y", P.HIGH)  # pauses a
    await t.reprioritize("b", P.NORMAL)
    await t.reprioritize("b", P.LOW)
    assert list(t.paused) == ["b", "a"]


# --- callbacks ----------------------------------------------------------------------------


async def test_async_callbacks_are_awaited_before_the_call_returns() -> None:
    t = tracker(1)
    events: list[str] = []

    async def on_pause(agent_id: str) -> None:
        await asyncio.sleep(0)
        events.append(f"paused {agent_id}")

    async def on_resume(agent_id: str) -> None:
        await asyncio.sleep(0)
        events.append(f"resumed {agent_id}")

    await t.acquire("root", P.NORMAL, on_pause=on_pause, on_resume=on_resume)
    await t.acquire("x", P.HIGH)
    assert events == ["paused root"]
    await t.release("x")
    assert events == ["paused root", "resumed root"]


async def test_callback_state_is_consistent_when_callbacks_run() -> None:
    t = tracker(1)
    seen: list[tuple[str, dict[str, Priority], dict[str, Priority]]] = []

    def look(agent_id: str) -> None:
        seen.append((agent_id, t.active, t.paused))

    await t.acquire("root", P.NORMAL, on_pause=look, on_resume=look)
    await t.acquire("x", P.HIGH)
    await t.release("x")
    assert seen == [
        ("root", {"x": P.HIGH}, {"root": P.NORMAL}),
        ("root", {"root": P.NORMAL}, {}),
    ]


async def test_raising_callbacks_are_logged_and_the_state_change_stands(
    caplog: pytest.LogCaptureFixture,
) -> None:
    t = tracker(1)

    def on_pause(agent_id: str) -> None:
        raise RuntimeError(f"pause hook of {agent_id} broke")

    async def on_resume(agent_id: str) -> None:
        raise RuntimeError(f"resume hook of {agent_id} broke")

    await t.acquire("root", P.LOW, on_pause=on_pause, on_resume=on_resume)
    with caplog.at_level(logging.ERROR, logger="corral.runtime.spawn"):
        assert await t.acquire("x", P.CRITICAL) == "root"
        assert t.state_of("root") == "paused"
        assert await t.release("x") == "root"
        assert t.state_of("root") == "active"
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [r.getMessage() for r in errors] == [
        "on_pause callback of agent 'root' raised; the state change stands",
        "on_resume callback of agent 'root' raised; the state change stands",
    ]
    raised = [r.exc_info[1] if r.exc_info else None for r in errors]
    assert [str(e) for e in raised] == ["pause hook of root broke", "resume hook of root broke"]


async def test_callbacks_of_one_agent_are_delivered_in_order() -> None:
    t = tracker(1)
    events: list[str] = []
    hold = asyncio.Event()

    async def on_pause(agent_id: str) -> None:
        events.append("pause-start")
        await hold.wait()
        events.append("pause-end")

    def on_resume(agent_id: str) -> None:
        events.append("resume")

    await t.acquire("root", P.LOW, on_pause=on_pause, on_resume=on_resume)
    acquiring = asyncio.create_task(t.acquire("x", P.HIGH))
    await until(lambda: events == ["pause-start"])
    # The release resumes root at once, but its on_resume waits for on_pause to finish.
    assert await t.release("x") == "root"
    assert t.state_of("root") == "active"
    assert events == ["pause-start"]
    hold.set()
    assert await acquiring == "root"
    assert events == ["pause-start", "pause-end", "resume"]


async def test_cancelled_delivery_still_delivers_later_callbacks() -> None:
    t = tracker(1)
    events: list[str] = []
    never = asyncio.Event()

    async def on_pause(agent_id: str) -> None:
        events.append("pause")
        await never.wait()

    await t.acquire("root", P.LOW, on_pause=on_pause, on_resume=lambda a: events.append(a))
    acquiring = asyncio.create_task(t.acquire("x", P.HIGH))
    await until(lambda: events == ["pause"])
    assert await t.release("x") == "root"
    acquiring.cancel()
    with pytest.raises(asyncio.CancelledError):
        await acquiring
    # The requester's slot was granted before the callback ran; the release above freed it.
    assert t.active == {"root": P.LOW}
    await until(lambda: events == ["pause", "root"])


# --- misuse -------------------------------------------------------------------------------


async def test_unknown_and_double_release_raise_unknown_agent() -> None:
    t = tracker(2)
    with pytest.raises(UnknownAgentError) as info:
        await t.release("ghost")
    assert info.value.code == "unknown_agent"
    assert info.value.retryable is False
    assert isinstance(info.value, UsageError)
    assert info.value.agent_id == "ghost"
    assert "SpawnTracker.release: agent 'ghost' holds no slot" in info.value.message
    await t.acquire("a")
    await t.release("a")
    with pytest.raises(UnknownAgentError, match="already released"):
        await t.release("a")
    with pytest.raises(UnknownAgentError, match=r"SpawnTracker\.reprioritize"):
        await t.reprioritize("a", P.HIGH)


async def test_acquiring_an_active_or_paused_id_again_is_an_error() -> None:
    t = tracker(1)
    await t.acquire("root", P.LOW)
    with pytest.raises(AgentAlreadyTrackedError) as info:
        await t.acquire("root", P.LOW)
    assert info.value.code == "agent_already_tracked"
    assert info.value.state == "active"
    await t.acquire("x", P.HIGH)
    with pytest.raises(AgentAlreadyTrackedError, match="'root' is already paused"):
        await t.acquire("root", P.CRITICAL)
    assert t.active == {"x": P.HIGH}
    assert t.paused == {"root": P.LOW}


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"spawn_budget": 5}, "spawn_budget"),
        ({"spawn_budget": None}, "spawn_budget"),
        ({"spawn_budget": SpawnBudget(), "clock": object()}, "clock"),
    ],
)
def test_constructor_rejects_bad_arguments(kwargs: dict[str, Any], argument: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        SpawnTracker(**kwargs)
    assert info.value.code == "invalid_argument"
    assert (info.value.where, info.value.argument) == ("SpawnTracker", argument)


@pytest.mark.parametrize(
    ("args", "kwargs", "argument"),
    [
        (("",), {}, "agent_id"),
        (("  ",), {}, "agent_id"),
        ((7,), {}, "agent_id"),
        (("a", 4), {}, "priority"),
        (("a", "HIGH"), {}, "priority"),
        (("a",), {"on_pause": 3}, "on_pause"),
        (("a",), {"on_resume": "resume"}, "on_resume"),
    ],
)
async def test_acquire_rejects_bad_arguments(
    args: tuple[Any, ...], kwargs: dict[str, Any], argument: str
) -> None:
    t = tracker(2)
    with pytest.raises(InvalidArgumentError) as info:
        await t.acquire(*args, **kwargs)
    assert (info.value.where, info.value.argument) == ("SpawnTracker.acquire", argument)
    assert t.active == {}


async def test_release_and_reprioritize_reject_bad_arguments() -> None:
    t = tracker(2)
    await t.acquire("a")
    bad: Any = ""
    with pytest.raises(InvalidArgumentError, match=r"SpawnTracker\.release: agent_id"):
        await t.release(bad)
    with pytest.raises(InvalidArgumentError, match=r"SpawnTracker\.reprioritize: agent_id"):
        await t.reprioritize(bad, P.HIGH)
    with pytest.raises(InvalidArgumentError, match=r"SpawnTracker\.reprioritize: priority"):
        await t.reprioritize("a", 8)  # type: ignore[arg-type]
    assert t.active == {"a": P.NORMAL}


# --- introspection ------------------------------------------------------------------------


async def test_snapshot_for_a_status_page() -> None:
    clock = FakeClock()
    t = tracker(2, clock=clock)
    start = clock.now()
    await t.acquire("root", P.NORMAL)
    clock.advance(5)
    await t.acquire("a", P.LOW)
    clock.advance(5)
    await t.acquire("x", P.CRITICAL)
    with pytest.raises(SpawnBudgetExceeded):
        await t.acquire("y", P.NORMAL)

    snap = t.snapshot()
    assert isinstance(snap, SpawnSnapshot)
    assert (snap.max_agents, snap.allow_preempt, snap.free_slots) == (2, True, 0)
    assert (snap.preemptions, snap.refusals) == (1, 1)
    assert [(a.agent_id, a.priority) for a in snap.active] == [
        ("root", P.NORMAL),
        ("x", P.CRITICAL),
    ]
    assert [(a.agent_id, a.pauses) for a in snap.paused] == [("a", 1)]
    assert snap.paused[0].changed_at == start + timedelta(seconds=10)
    assert snap.to_dict() == {
        "max_agents": 2,
        "allow_preempt": True,
        "active": [
            {
                "agent_id": "root",
                "priority": "NORMAL",
                "changed_at": start.isoformat(),
                "pauses": 0,
            },
            {
                "agent_id": "x",
                "priority": "CRITICAL",
                "changed_at": (start + timedelta(seconds=10)).isoformat(),
                "pauses": 0,
            },
        ],
        "paused": [
            {
                "agent_id": "a",
                "priority": "LOW",
                "changed_at": (start + timedelta(seconds=10)).isoformat(),
                "pauses": 1,
            }
        ],
        "free_slots": 0,
        "preemptions": 1,
        "refusals": 1,
    }
    assert "a" in t
    assert "y" not in t
    assert repr(t) == "SpawnTracker(active=2/2, paused=1, allow_preempt=True)"
    clock.advance(1)
    await t.release("x")
    resumed = t.snapshot().active[1]
    assert (resumed.agent_id, resumed.changed_at) == ("a", start + timedelta(seconds=11))


async def test_introspection_returns_copies() -> None:
    t = tracker(2)
    await t.acquire("a")
    t.active["b"] = P.HIGH
    t.paused["c"] = P.HIGH
    assert t.active == {"a": P.NORMAL}
    assert t.paused == {}


# --- concurrency --------------------------------------------------------------------------


async def test_many_concurrent_agents_never_exceed_the_cap() -> None:
    cap = 5
    t = tracker(cap)
    rng = random.Random(20260101)
    priorities = list(Priority)
    peak = 0
    resumes = 0
    outcomes: dict[str, str] = {}

    def check() -> None:
        nonlocal peak
        assert_invariants(t)
        peak = max(peak, len(t.active))

    async def agent(agent_id: str, priority: Priority, delay: int, steps: int) -> None:
        gate = PauseGate()

        async def on_pause(aid: str) -> None:
            check()
            gate.pause(aid)
            await asyncio.sleep(0)  # an async hook that yields after closing the gate

        def on_resume(aid: str) -> None:
            nonlocal resumes
            check()
            resumes += 1
            gate.resume(aid)

        for _ in range(delay):
            await asyncio.sleep(0)
        for _attempt in range(3):  # SpawnBudgetExceeded is retryable
            refusal: SpawnBudgetExceeded | None = None
            try:
                await t.acquire(agent_id, priority, on_pause=on_pause, on_resume=on_resume)
            except SpawnBudgetExceeded as exc:
                refusal = exc
            if refusal is None:
                break
            assert refusal.retryable
            assert (refusal.max_agents, refusal.active) == (cap, cap)
            check()
            for _ in range(steps):
                await asyncio.sleep(0)
        else:
            outcomes[agent_id] = "refused"
            return
        check()
        for _ in range(steps):
            await gate.wait_resumed()
            assert t.state_of(agent_id) == "active"
            await asyncio.sleep(0)
            check()
        await t.release(agent_id)
        check()
        outcomes[agent_id] = "done"

    async with asyncio.timeout(10):
        await asyncio.gather(
            *(
                agent(f"agent-{i}", rng.choice(priorities), rng.randint(0, 40), rng.randint(1, 8))
                for i in range(80)
            )
        )

    assert len(outcomes) == 80
    assert peak == cap
    snap = t.snapshot()
    assert snap.active == ()
    assert snap.paused == ()
    assert snap.free_slots == cap
    assert snap.preemptions > 0
    assert resumes > 0
    assert snap.refusals >= 3 * sum(1 for o in outcomes.values() if o == "refused")
    assert "done" in outcomes.values()


# --- PauseGate ----------------------------------------------------------------------------


async def test_pause_gate_open_returns_at_once() -> None:
    gate = PauseGate()
    assert gate.is_paused is False
    coro = gate.wait_resumed()
    with pytest.raises(StopIteration):
        coro.send(None)  # finished without suspending
    assert repr(gate) == "PauseGate(open)"


async def test_pause_gate_blocks_until_resumed_and_is_idempotent() -> None:
    gate = PauseGate()
    gate.pause("a")
    gate.pause()
    assert gate.is_paused is True
    assert repr(gate) == "PauseGate(paused)"
    waiters = [asyncio.create_task(gate.wait_resumed()) for _ in range(3)]
    for _ in range(5):
        await asyncio.sleep(0)
    assert not any(w.done() for w in waiters)
    gate.resume("a")
    gate.resume()
    await asyncio.gather(*waiters)
    assert gate.is_paused is False


async def test_pause_gate_repaused_before_the_waiter_runs_keeps_it_waiting() -> None:
    gate = PauseGate()
    gate.pause()
    waiter = asyncio.create_task(gate.wait_resumed())
    await asyncio.sleep(0)
    gate.resume()
    gate.pause()
    for _ in range(5):
        await asyncio.sleep(0)
    assert not waiter.done()
    gate.resume()
    await waiter


def test_pause_gate_rejects_bad_agent_ids() -> None:
    gate = PauseGate()
    bad: Any = 5
    with pytest.raises(InvalidArgumentError, match=r"PauseGate\.pause: agent_id"):
        gate.pause(bad)
    with pytest.raises(InvalidArgumentError, match=r"PauseGate\.resume: agent_id"):
        gate.resume("")
    assert gate.is_paused is False


async def test_agent_loop_stops_at_its_checkpoint_and_continues_after_release() -> None:
    t = tracker(2)
    gate = PauseGate()
    ticks: asyncio.Queue[None] = asyncio.Queue()
    done_steps: list[int] = []

    async def worker_loop() -> None:
        for step in range(4):
            await ticks.get()
            await gate.wait_resumed()  # the checkpoint
            done_steps.append(step)

    await t.acquire("root", P.NORMAL)
    await t.acquire("worker", P.LOW, on_pause=gate.pause, on_resume=gate.resume)
    loop_task = asyncio.create_task(worker_loop())
    ticks.put_nowait(None)
    ticks.put_nowait(None)
    await until(lambda: done_steps == [0, 1])

    assert await t.acquire("urgent", P.CRITICAL) == "worker"
    assert gate_states(gate) == "paused"
    ticks.put_nowait(None)
    for _ in range(10):
        await asyncio.sleep(0)
    assert done_steps == [0, 1]  # held at the checkpoint

    assert await t.release("urgent") == "worker"
    assert gate_states(gate) == "open"
    ticks.put_nowait(None)
    await loop_task
    assert done_steps == [0, 1, 2, 3]
    await t.release("worker")
    await t.release("root")
    assert t.free_slots == 2


def test_the_tracker_keeps_the_shared_budget_object() -> None:
    budget = SpawnBudget(max_agents=7, allow_preempt=False)
    t = SpawnTracker(budget)
    assert t.spawn_budget is budget
    assert (t.max_agents, t.free_slots) == (7, 7)


# --- pausable and restore (the daemon's headcount) ---------------------------------------------


async def test_pausable_narrows_who_may_be_paused() -> None:
    t = tracker(2)
    await t.acquire("waits", P.LOW)
    await t.acquire("works", P.LOW)
    # The most recent LOW agent may not be paused: the other one is.
    assert await t.acquire("boss", P.CRITICAL, pausable=lambda a: a != "works") == "waits"
    with pytest.raises(SpawnBudgetExceeded) as info:
        await t.acquire("boss2", P.CRITICAL, pausable=lambda a: a != "works")
    assert "may be paused" in info.value.why
    assert_invariants(t)


async def test_restore_rebuilds_active_and_paused_in_order() -> None:
    t = tracker(2)
    t.restore("old", P.LOW)
    t.restore("new", P.LOW)
    t.restore("p_normal", P.NORMAL, paused=True)
    t.restore("p_high", P.HIGH, paused=True)
    assert list(t.active) == ["old", "new"]
    assert list(t.paused) == ["p_high", "p_normal"]
    # The most recently restored LOW agent is paused first; the best paused resumes first.
    assert await t.acquire("boss", P.CRITICAL) == "new"
    with pytest.raises(AgentAlreadyTrackedError):
        t.restore("boss", P.LOW)


async def test_restore_then_release_resumes_by_priority() -> None:
    t = tracker(1)
    t.restore("a", P.LOW)
    t.restore("p_low", P.LOW, paused=True)
    t.restore("p_crit", P.CRITICAL, paused=True)
    assert await t.release("a") == "p_crit"
    assert_invariants(t)
