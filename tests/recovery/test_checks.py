"""Health checks under ``check_timeout_s``, driven by a FakeClock (no real sleeps)."""

import asyncio
import math
import threading
import time
from typing import Any

import pytest

from corral.guard import AgentGroup, Supervisor
from corral.kernel import InvalidArgumentError
from corral.recovery import (
    HealthStatus,
    RecoveryAction,
    RecoveryListener,
    RecoveryManager,
    RecoveryPolicy,
    RecoveryResult,
)
from corral.runtime import FakeClock
from tests.support.polling import idle, settle


class Failures(RecoveryListener):
    def __init__(self) -> None:
        self.failed: list[HealthStatus] = []

    def on_health_check_failed(self, status: HealthStatus) -> None:
        self.failed.append(status)


class Hangs:
    """An async check that never answers and records its cancellation."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.calls = 0
        self.cancelled = 0

    async def __call__(self, agent: object) -> bool:
        self.calls += 1
        self.entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return True


def make(
    clock: FakeClock, policy: RecoveryPolicy | None = None, **kwargs: Any
) -> tuple[RecoveryManager, Failures]:
    group = AgentGroup("crew", {"worker-1": object(), "worker-2": object()})
    manager = RecoveryManager(Supervisor(group), policy or RecoveryPolicy(), clock=clock, **kwargs)
    failures = Failures()
    manager.add_listener(failures)
    return manager, failures


async def test_a_hung_async_check_times_out_and_starts_recovery() -> None:
    clock = FakeClock()
    manager, failures = make(clock, check_timeout_s=5)
    hung = Hangs()
    answered: list[float] = []

    async def answers(agent: object) -> bool:
        answered.append(clock.monotonic())
        return False

    manager.add_health_check("worker-1", hung)
    manager.add_health_check("worker-2", answers)
    run = asyncio.create_task(manager.run_health_checks())
    await hung.entered.wait()
    # The other agent's check answers (and its recovery starts) while worker-1 hangs.
    await settle(lambda: manager.retry_count("worker-2") == 1)
    assert answered == [0]
    clock.advance(4.9)
    await idle()
    assert not run.done()
    clock.advance(0.1)
    statuses = await run
    timed_out = statuses["worker-1"]
    assert timed_out.healthy is False
    assert timed_out.reason == "health check timed out after 5 s"
    assert timed_out.checked_at == clock.now()
    assert timed_out.recovery is not None
    assert timed_out.recovery.action_taken is RecoveryAction.RESTART
    assert timed_out.recovery.reason == "health check timed out after 5 s"
    assert statuses["worker-2"].reason == "health check returned False"
    assert [s.agent_id for s in failures.failed] == ["worker-2", "worker-1"]
    assert manager.retry_count("worker-1") == 1
    await settle(lambda: hung.cancelled == 1)  # the hung check's task was cancelled
    assert clock.pending_timers == 0


async def test_a_check_that_answers_in_time_is_unaffected() -> None:
    clock = FakeClock()
    manager, failures = make(clock, check_timeout_s=5)

    async def slow_but_fine(agent: object) -> bool:
        await clock.sleep(4.9)
        return True

    async def slow_and_failing(agent: object) -> bool:
        await clock.sleep(4.9)
        return False

    manager.add_health_check("worker-1", slow_but_fine)
    manager.add_health_check("worker-2", slow_and_failing)
    run = asyncio.create_task(manager.run_health_checks())
    await idle()
    clock.advance(4.9)
    statuses = await run
    assert statuses["worker-1"].healthy is True
    assert statuses["worker-1"].reason is None
    assert statuses["worker-2"].reason == "health check returned False"
    assert [r.agent_id for r in manager.history] == ["worker-2"]
    assert clock.pending_timers == 0  # the timeouts were cancelled with the answers
    clock.advance(60)
    await idle()
    assert len(failures.failed) == 1


async def test_without_a_timeout_a_check_may_take_as_long_as_it_likes() -> None:
    clock = FakeClock()
    manager, _ = make(clock, check_timeout_s=None)
    assert manager.check_timeout_s is None

    async def very_slow(agent: object) -> bool:
        await clock.sleep(3600)
        return True

    manager.add_health_check("worker-1", very_slow)
    run = asyncio.create_task(manager.run_health_checks())
    await idle()
    clock.advance(3599)
    await idle()
    assert not run.done()
    clock.advance(1)
    assert (await run)["worker-1"].healthy is True


async def test_the_background_loop_keeps_ticking_after_a_timeout() -> None:
    clock = FakeClock()
    manager, _ = make(clock, RecoveryPolicy(cooldown_s=0), check_timeout_s=5)
    hung = Hangs()
    calls: list[float] = []

    async def fine(agent: object) -> bool:
        calls.append(clock.monotonic())
        return True

    manager.add_health_check("worker-1", hung)
    manager.add_health_check("worker-2", fine)
    manager.start(30)
    for tick in (1, 2, 3):
        clock.advance(30 - 5 * (tick > 1))
        await settle(lambda n=tick: hung.calls == n)  # type: ignore[misc]
        clock.advance(5)
        await settle(lambda n=tick: manager.retry_count("worker-1") == n)  # type: ignore[misc]
    assert calls == [30, 60, 90]
    await settle(lambda: hung.cancelled == 3)
    assert [r.reason for r in manager.history] == ["health check timed out after 5 s"] * 3
    assert manager.running
    await manager.stop()
    assert clock.pending_timers == 0


async def test_outside_cancellation_still_propagates_and_cancels_the_check() -> None:
    clock = FakeClock()
    manager, failures = make(clock, check_timeout_s=5)
    hung = Hangs()
    manager.add_health_check("worker-1", hung)
    run = asyncio.create_task(manager.run_health_checks())
    await hung.entered.wait()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert hung.cancelled == 1  # ended before the run did
    assert clock.pending_timers == 0
    assert manager.history == []
    assert failures.failed == []


async def test_stop_cancels_a_timed_check_in_progress() -> None:
    clock = FakeClock()
    manager, _ = make(clock, check_timeout_s=5)
    hung = Hangs()
    manager.add_health_check("worker-1", hung)
    manager.start(10)
    clock.advance(10)
    await hung.entered.wait()
    await manager.stop()
    assert hung.cancelled == 1
    assert not manager.running
    assert clock.pending_timers == 0
    assert manager.history == []


async def test_an_object_with_an_async_call_runs_on_the_loop_and_is_cancelled() -> None:
    clock = FakeClock()
    manager, _ = make(clock, check_timeout_s=2)
    hung = Hangs()
    manager.add_health_check("worker-1", hung)
    run = asyncio.create_task(manager.run_health_checks())
    await hung.entered.wait()  # an asyncio.Event set from the loop's own thread
    clock.advance(2)
    assert (await run)["worker-1"].reason == "health check timed out after 2 s"
    assert hung.cancelled == 1


async def test_an_awaitable_from_a_plain_check_shares_the_deadline() -> None:
    clock = FakeClock()
    manager, _ = make(clock, check_timeout_s=3)
    hung = Hangs()
    manager.add_health_check("worker-1", lambda agent: hung(agent))
    run = asyncio.create_task(manager.run_health_checks())
    await hung.entered.wait()
    clock.advance(3)
    assert (await run)["worker-1"].reason == "health check timed out after 3 s"
    assert hung.cancelled == 1


# --- plain checks in a worker thread -------------------------------------------------------


async def test_a_plain_check_runs_in_a_worker_thread() -> None:
    manager, _ = make(FakeClock())
    threads: list[int] = []

    def check(agent: object) -> bool:
        threads.append(threading.get_ident())
        return True

    manager.add_health_check("worker-1", check)
    statuses = await manager.run_health_checks()
    assert statuses["worker-1"].healthy is True
    assert len(threads) == 1
    assert threads[0] != threading.get_ident()


async def test_a_blocking_plain_check_times_out_without_freezing_the_loop() -> None:
    clock = FakeClock()
    # Never ejected: the polling below may fail the check many times while its thread ends.
    policy = RecoveryPolicy(cooldown_s=0, max_retries=10_000, escalate_after=10_000)
    manager, _ = make(clock, policy, check_timeout_s=5)
    release = threading.Event()
    started = threading.Event()
    calls = 0

    def blocks(agent: object) -> bool:
        nonlocal calls
        calls += 1
        started.set()
        release.wait(10)  # bounded, so a broken test cannot leave it behind for long
        return True

    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    manager.add_health_check("worker-1", blocks)
    manager.add_health_check("worker-2", lambda agent: True)
    beat = asyncio.create_task(ticker())
    try:
        run = asyncio.create_task(manager.run_health_checks())
        await settle(started.is_set)
        before = ticks
        await idle()
        assert ticks > before  # the loop goes on while the check blocks its thread
        assert not run.done()
        clock.advance(5)
        statuses = await run
        assert statuses["worker-1"].reason == "health check timed out after 5 s"
        assert statuses["worker-1"].recovery is not None
        assert statuses["worker-2"].healthy is True
        # Still blocked: the next run does not start a second thread for it.
        again = await manager.run_health_checks()
        assert again["worker-1"].reason == (
            "health check timed out after 5 s in an earlier run and is still running; "
            "not started again"
        )
        assert calls == 1
        assert manager.retry_count("worker-1") == 2
    finally:
        release.set()
        beat.cancel()
    # Once its thread has finished, the check runs again as usual.
    deadline = time.monotonic() + 5
    while True:
        statuses = await manager.run_health_checks()
        if statuses["worker-1"].healthy:
            break
        assert time.monotonic() < deadline, "the released check never ran again"
        await asyncio.sleep(0.001)
    assert calls == 2
    assert clock.pending_timers == 0


async def test_a_plain_check_raising_in_its_thread_is_a_failure() -> None:
    manager, _ = make(FakeClock())

    def raises(agent: object) -> bool:
        raise ConnectionError("agent unreachable")

    def cancels(agent: object) -> bool:
        raise asyncio.CancelledError

    manager.add_health_check("worker-1", raises)
    manager.add_health_check("worker-2", cancels)
    statuses = await manager.run_health_checks()
    assert statuses["worker-1"].reason == "health check raised ConnectionError: agent unreachable"
    assert statuses["worker-2"].reason == "health check was cancelled"


async def test_cancelling_a_run_waiting_on_a_plain_check_propagates() -> None:
    clock = FakeClock()
    manager, failures = make(clock, check_timeout_s=5)
    release = threading.Event()
    started = threading.Event()

    def blocks(agent: object) -> bool:
        started.set()
        release.wait(10)
        return True

    manager.add_health_check("worker-1", blocks)
    run = asyncio.create_task(manager.run_health_checks())
    try:
        await settle(started.is_set)
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
    finally:
        release.set()
    assert clock.pending_timers == 0
    assert failures.failed == []
    assert manager.history == []


# --- arguments -----------------------------------------------------------------------------


def test_the_timeout_defaults_to_ten_seconds() -> None:
    manager, _ = make(FakeClock())
    assert manager.check_timeout_s == 10.0
    assert "check_timeout_s=10.0" in repr(manager)


@pytest.mark.parametrize("value", [0, -1, math.nan, math.inf, "10", True])
def test_check_timeout_s_must_be_a_finite_positive_number_or_none(value: object) -> None:
    with pytest.raises(
        InvalidArgumentError, match="check_timeout_s must be a finite number > 0 or None"
    ) as caught:
        make(FakeClock(), check_timeout_s=value)
    assert caught.value.code == "invalid_argument"
    assert caught.value.where == "RecoveryManager"


def test_a_fractional_timeout_is_kept() -> None:
    manager, _ = make(FakeClock(), check_timeout_s=0.25)
    assert manager.check_timeout_s == 0.25


async def test_recovery_results_of_a_timeout_reach_listeners() -> None:
    clock = FakeClock()
    manager, _ = make(clock, check_timeout_s=1)
    attempts: list[RecoveryResult] = []

    class Attempts:
        def on_recovery_attempt(self, result: RecoveryResult) -> None:
            attempts.append(result)

    manager.add_listener(Attempts())
    hung = Hangs()
    manager.add_health_check("worker-2", hung)
    run = asyncio.create_task(manager.run_health_checks())
    await hung.entered.wait()
    clock.advance(1)
    await run
    assert [(r.agent_id, r.reason) for r in attempts] == [
        ("worker-2", "health check timed out after 1 s")
    ]
