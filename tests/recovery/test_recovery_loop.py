"""The background health-check loop, driven by a FakeClock (no real sleeps)."""

import asyncio
import logging

import pytest

from corral.guard import AgentGroup, Supervisor
from corral.kernel import UsageError
from corral.recovery import RecoveryManager, RecoveryPolicy, RecoveryResult
from corral.runtime import FakeClock
from tests.support.polling import idle, settle


def running(manager: RecoveryManager) -> bool:
    # Read through a call so the type checker does not keep an earlier narrowing.
    return manager.running


class Counting:
    def __init__(self, healthy: bool = True) -> None:
        self.calls = 0
        self.healthy = healthy

    def __call__(self, agent: object) -> bool:
        self.calls += 1
        return self.healthy


def make(clock: FakeClock, policy: RecoveryPolicy | None = None) -> RecoveryManager:
    group = AgentGroup("crew", {"worker-1": object(), "worker-2": object()})
    return RecoveryManager(Supervisor(group), policy or RecoveryPolicy(), clock=clock)


async def test_checks_run_each_interval_until_stopped() -> None:
    clock = FakeClock()
    manager = make(clock)
    check = Counting()
    manager.add_health_check("worker-1", check)
    manager.start(30)
    assert manager.running
    await idle()
    assert check.calls == 0  # the first run is one interval after the start
    clock.advance(29.9)
    await idle()
    assert check.calls == 0
    clock.advance(0.1)
    await settle(lambda: check.calls == 1)
    clock.advance(30)
    await settle(lambda: check.calls == 2)
    await manager.stop()
    assert not running(manager)
    clock.advance(300)
    await idle()
    assert check.calls == 2
    assert clock.pending_timers == 0


async def test_background_failures_start_recovery_attempts() -> None:
    clock = FakeClock()
    manager = make(clock, RecoveryPolicy(cooldown_s=10))
    manager.add_health_check("worker-1", Counting(healthy=False))
    manager.start(10)
    for expected in (1, 2, 3):
        clock.advance(10)
        await settle(lambda n=expected: manager.retry_count("worker-1") == n)  # type: ignore[misc]
    await manager.stop()
    assert [r.attempt for r in manager.history] == [1, 2, 3]


async def test_stop_is_idempotent_and_works_before_start() -> None:
    manager = make(FakeClock())
    await manager.stop()
    manager.start(5)
    await manager.stop()
    await manager.stop()
    assert not manager.running


async def test_starting_twice_is_an_error() -> None:
    clock = FakeClock()
    manager = make(clock)
    manager.start(5)
    with pytest.raises(UsageError, match="already running") as caught:
        manager.start(5)
    assert caught.value.code == "usage_error"
    await manager.stop()


async def test_it_can_start_again_after_a_stop() -> None:
    clock = FakeClock()
    manager = make(clock)
    check = Counting()
    manager.add_health_check("worker-2", check)
    manager.start(5)
    await manager.stop()
    manager.start(7)
    clock.advance(7)
    await settle(lambda: check.calls == 1)
    await manager.stop()


def test_start_needs_a_running_event_loop() -> None:
    manager = make(FakeClock())
    with pytest.raises(UsageError, match="needs a running event loop"):
        manager.start(5)
    assert not manager.running


async def test_the_loop_survives_a_failing_run(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    manager = make(clock)
    check = Counting()
    manager.add_health_check("worker-1", check)
    original = manager.run_health_checks
    runs = 0

    async def flaky() -> dict[str, object]:
        nonlocal runs
        runs += 1
        if runs == 1:
            raise RuntimeError("run exploded")
        return dict(await original())

    manager.run_health_checks = flaky  # type: ignore[method-assign,assignment]
    manager.start(5)
    with caplog.at_level(logging.ERROR, logger="corral.recovery"):
        clock.advance(5)
        await settle(lambda: runs == 1)
        clock.advance(5)
        await settle(lambda: check.calls == 1)
    assert "run exploded" in caplog.text
    assert manager.running
    await manager.stop()


async def test_the_loop_survives_a_listener_that_cancels_itself(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    manager = make(clock, RecoveryPolicy(cooldown_s=0))
    check = Counting(healthy=False)
    manager.add_health_check("worker-1", check)

    class CancelsItself:
        def on_recovery_attempt(self, result: RecoveryResult) -> None:
            raise asyncio.CancelledError

    manager.add_listener(CancelsItself())
    manager.start(5)
    with caplog.at_level(logging.ERROR, logger="corral.recovery"):
        clock.advance(5)
        await settle(lambda: "cancelled from inside" in caplog.text)
        assert manager.running
        clock.advance(5)
        await settle(lambda: manager.retry_count("worker-1") == 2)
    assert check.calls == 2
    await manager.stop()
    assert not running(manager)


async def test_a_slow_run_skips_the_ticks_it_overran() -> None:
    clock = FakeClock()
    manager = make(clock)
    release = asyncio.Event()
    starts: list[float] = []

    async def slow(agent: object) -> bool:
        starts.append(clock.monotonic())
        if len(starts) == 1:
            await release.wait()
        return True

    manager.add_health_check("worker-1", slow)
    manager.start(10)
    clock.advance(10)
    await settle(lambda: len(starts) == 1)
    clock.advance(25)  # now 35: the ticks at 20 and 30 pass while the first run is busy
    release.set()
    await idle()
    assert len(starts) == 1
    clock.advance(4.9)  # 39.9
    await idle()
    assert len(starts) == 1
    clock.advance(0.1)  # 40: the fixed-rate tick
    await settle(lambda: len(starts) == 2)
    assert starts == [10, 40]
    await manager.stop()


async def test_a_listener_may_stop_the_loop_from_inside() -> None:
    clock = FakeClock()
    manager = make(clock, RecoveryPolicy(cooldown_s=0))
    check = Counting(healthy=False)
    manager.add_health_check("worker-1", check)
    stopped: list[RecoveryResult] = []

    class StopOnFirst:
        async def on_recovery_attempt(self, result: RecoveryResult) -> None:
            stopped.append(result)
            await manager.stop()

    manager.add_listener(StopOnFirst())
    manager.start(5)
    clock.advance(5)
    await settle(lambda: not manager.running)
    clock.advance(50)
    await idle()
    assert check.calls == 1
    assert len(stopped) == 1


async def test_stop_cancels_a_run_in_progress_and_waits_for_it() -> None:
    clock = FakeClock()
    manager = make(clock)
    entered = asyncio.Event()
    cancelled: list[bool] = []

    async def hangs(agent: object) -> bool:
        entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return True

    manager.add_health_check("worker-1", hangs)
    manager.start(5)
    clock.advance(5)
    await entered.wait()
    await manager.stop()
    assert cancelled == [True]  # stop() returned only after the run had ended
    assert not manager.running
    assert manager.history == []


async def test_a_tick_already_due_when_the_loop_wakes_runs_at_once() -> None:
    clock = FakeClock()
    manager = make(clock)
    check = Counting()
    manager.add_health_check("worker-1", check)
    manager.start(10)
    clock.advance(10)  # before the background task has even started
    await settle(lambda: check.calls == 1)
    clock.advance(10)  # possibly before it is back asleep: the tick at 20 still runs once
    await settle(lambda: check.calls == 2)
    await idle()
    assert check.calls == 2
    await manager.stop()
