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
)
from corral.runtime import Cancellation, FakeClock


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
