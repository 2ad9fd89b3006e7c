import asyncio
import gc
import logging
from datetime import datetime, timedelta

import pytest

from corral.kernel import (
    CancellationError,
    CancellationToken,
    DeadlineExceededError,
    InvalidArgumentError,
    UsageError,
)
from corral.runtime import Cancellation, FakeClock
from tests.support.polling import settle


def test_implements_the_kernel_protocol() -> None:
    assert isinstance(Cancellation(), CancellationToken)


def test_cancel_is_idempotent_and_the_first_reason_wins() -> None:
    token = Cancellation()
    token.check()
    token.cancel("first")
    token.cancel("second")
    assert token.is_cancelled
    assert token.reason == "first"
    with pytest.raises(CancellationError, match="first"):
        token.check()


def test_check_raises_a_fresh_error_each_time() -> None:
    token = Cancellation()
    token.cancel()
    errors = []
    for _ in range(2):
        with pytest.raises(CancellationError) as info:
            token.check()
        errors.append(info.value)
    assert errors[0] is not errors[1]
    assert errors[0].message == "cancelled"


def test_callbacks_run_once_in_order_and_late_ones_at_once() -> None:
    token = Cancellation()
    seen: list[str] = []
    token.add_callback(lambda t: seen.append(f"a:{t.reason}"))
    token.add_callback(lambda t: seen.append("b"))
    token.cancel("go")
    token.cancel("again")
    assert seen == ["a:go", "b"]
    token.add_callback(lambda t: seen.append("late"))
    assert seen == ["a:go", "b", "late"]


def test_a_raising_callback_is_logged_and_the_others_still_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    token = Cancellation()
    seen: list[str] = []

    def boom(_: object) -> None:
        raise RuntimeError("callback failed")

    token.add_callback(boom)
    token.add_callback(lambda t: seen.append("after"))
    with caplog.at_level(logging.ERROR, logger="corral.runtime.cancellation"):
        token.cancel("x")
    assert seen == ["after"]
    assert "callback failed" in caplog.text


async def test_async_callbacks_are_awaited_on_the_loop() -> None:
    token = Cancellation()
    seen: list[str] = []

    async def on_cancel(t: CancellationToken) -> None:
        await asyncio.sleep(0)
        seen.append(f"async:{t.reason}")

    token.add_callback(on_cancel)
    token.add_callback(lambda t: seen.append("sync"))
    token.cancel("stop")
    await settle(lambda: len(seen) == 2)
    assert seen == ["sync", "async:stop"]


async def test_a_raising_async_callback_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    token = Cancellation()
    seen: list[str] = []

    async def boom(_: object) -> None:
        raise RuntimeError("async callback failed")

    token.add_callback(boom)
    token.add_callback(lambda t: seen.append("after"))
    with caplog.at_level(logging.ERROR, logger="corral.runtime.cancellation"):
        token.cancel("x")
        await settle(lambda: "async callback failed" in caplog.text)
    assert seen == ["after"]


def test_an_async_callback_without_a_loop_is_logged_not_leaked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    token = Cancellation()

    async def on_cancel(_: object) -> None:
        raise AssertionError("cannot run without a loop")

    token.add_callback(on_cancel)
    with caplog.at_level(logging.ERROR, logger="corral.runtime.cancellation"):
        token.cancel("x")
    gc.collect()  # an un-awaited coroutine would warn here (warnings are errors)
    assert "is async but no event loop is running" in caplog.text


def test_children_follow_the_parent_never_the_reverse() -> None:
    parent = Cancellation()
    child = parent.child()
    grandchild = child.child()
    sibling = parent.child()
    child.cancel("child only")
    assert child.is_cancelled
    assert grandchild.is_cancelled
    assert not parent.is_cancelled
    assert not sibling.is_cancelled
    parent.cancel("everyone")
    assert sibling.reason == "everyone"
    assert child.reason == "child only"  # first reason kept


def test_child_of_a_cancelled_token_starts_cancelled() -> None:
    parent = Cancellation()
    parent.cancel("done")
    assert parent.child().reason == "done"


def test_a_grandchild_is_cancelled_even_when_nobody_holds_its_parent() -> None:
    root = Cancellation()
    grandchild = root.child().child()
    gc.collect()
    root.cancel("everyone")
    assert grandchild.reason == "everyone"


def test_children_are_not_kept_alive_by_the_parent() -> None:
    parent = Cancellation()
    for _ in range(100):
        parent.child()
    gc.collect()
    assert len(parent._children) == 0


async def test_wait_returns_when_cancelled() -> None:
    token = Cancellation()
    waiter = asyncio.create_task(token.wait())
    await asyncio.sleep(0)
    assert not waiter.done()
    token.cancel("now")
    await asyncio.wait_for(waiter, 1)
    await token.wait()  # already cancelled: returns at once


def test_a_token_is_waited_on_from_one_event_loop_after_another() -> None:
    # an agent built once and run by asyncio.run twice: the token outlives the first loop
    token = Cancellation()

    async def wait_then_cancel() -> None:
        waiter = asyncio.create_task(token.wait())
        await asyncio.sleep(0)
        assert not waiter.done()
        waiter.cancel()  # the first loop's wait ends without a cancellation
        with pytest.raises(asyncio.CancelledError):
            await waiter

    asyncio.run(wait_then_cancel())

    async def second() -> None:
        waiter = asyncio.create_task(token.wait())
        await asyncio.sleep(0)
        token.cancel("from the second loop")
        await asyncio.wait_for(waiter, 1)

    asyncio.run(second())
    assert token.reason == "from the second loop"


def test_cancel_from_another_thread_wakes_the_waiter_on_its_loop() -> None:
    import threading

    token = Cancellation()

    async def main() -> None:
        waiter = asyncio.create_task(token.wait())
        await asyncio.sleep(0)
        thread = threading.Thread(target=token.cancel, args=("from a thread",))
        thread.start()
        await asyncio.wait_for(waiter, 5)
        thread.join()

    asyncio.run(main())


async def test_cancel_after_fires_on_the_clock_as_a_deadline() -> None:
    clock = FakeClock()
    token = Cancellation(clock=clock)
    token.cancel_after(5)
    assert token.deadline == clock.now() + timedelta(seconds=5)
    clock.advance(4.9)
    token.check()  # not yet
    clock.advance(0.1)
    assert token.reason == "deadline exceeded"
    with pytest.raises(DeadlineExceededError):
        token.check()


async def test_cancel_at_with_a_reason_and_timer_cancel() -> None:
    clock = FakeClock()
    token = Cancellation(clock=clock)
    timer = token.cancel_at(clock.now() + timedelta(seconds=3), reason="shift over")
    clock.advance(3)
    assert token.reason == "shift over"
    with pytest.raises(CancellationError) as info:
        token.check()
    assert not isinstance(info.value, DeadlineExceededError)

    other = Cancellation(clock=clock)
    timer = other.cancel_after(1)
    timer.cancel()
    clock.advance(2)
    assert not other.is_cancelled


async def test_a_called_off_timer_is_no_longer_the_deadline() -> None:
    clock = FakeClock()
    token = Cancellation(clock=clock)
    soon = token.cancel_after(5)
    token.cancel_after(10)
    assert token.deadline == clock.now() + timedelta(seconds=5)
    soon.cancel()
    soon.cancel()  # idempotent
    assert token.deadline == clock.now() + timedelta(seconds=10)
    clock.advance(10)
    assert token.reason == "deadline exceeded"
    assert clock.pending_timers == 0


async def test_scheduling_on_a_cancelled_token_arms_nothing() -> None:
    clock = FakeClock()
    token = Cancellation(clock=clock)
    token.cancel("done")
    token.cancel_after(5).cancel()
    assert clock.pending_timers == 0
    assert token.deadline is None


def test_scheduling_on_the_system_clock_needs_a_running_loop() -> None:
    token = Cancellation()
    with pytest.raises(UsageError, match="from a running event loop") as info:
        token.cancel_after(1)
    assert info.value.code == "usage_error"
    assert info.value.details["delay_s"] == 1
    assert token.deadline is None


async def test_cancel_at_in_the_past_fires_immediately() -> None:
    clock = FakeClock()
    token = Cancellation(clock=clock)
    token.cancel_at(clock.now() - timedelta(seconds=1))
    clock.advance(0)
    assert token.is_cancelled


async def test_deadline_on_real_clock_wakes_a_waiter() -> None:
    token = Cancellation()
    token.cancel_after(0.01)
    await asyncio.wait_for(token.wait(), 5)
    assert token.reason == "deadline exceeded"


@pytest.mark.parametrize(
    "call",
    [
        lambda t: t.cancel_after(-1),
        lambda t: t.cancel_after(float("nan")),
        lambda t: t.cancel_at(datetime(2026, 1, 1)),
        lambda t: t.cancel(""),
        lambda t: t.add_callback("not callable"),
    ],
)
async def test_bad_arguments_are_refused(call: object) -> None:
    with pytest.raises(InvalidArgumentError):
        call(Cancellation())  # type: ignore[operator]


def test_a_clock_that_is_not_a_clock_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="Cancellation: clock must be a Clock"):
        Cancellation(clock="system")  # type: ignore[arg-type]
