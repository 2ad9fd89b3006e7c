"""TurnTimer: a turn's time limit that leaves out the time it waits on a person (fake clock)."""

from __future__ import annotations

import asyncio
import math

import pytest

from corral.daemon.harnesses import TurnTimer
from corral.kernel import SYSTEM_CLOCK, InvalidArgumentError
from corral.runtime import FakeClock
from tests.support.polling import idle


class Pauses:
    """What a daemon reports as ``paused_s``: closed waits plus the one in progress."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.closed = 0.0
        self.since: float | None = None

    def start(self) -> None:
        self.since = self.clock.monotonic()

    def end(self) -> None:
        assert self.since is not None
        self.closed += self.clock.monotonic() - self.since
        self.since = None

    def __call__(self) -> float:
        running = 0.0 if self.since is None else self.clock.monotonic() - self.since
        return self.closed + running


async def started_wait(timer: TurnTimer) -> tuple[asyncio.Future[None], asyncio.Task[bool]]:
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    task = asyncio.ensure_future(timer.wait(future))
    await idle()
    return future, task


async def test_without_pauses_the_limit_is_the_timeout() -> None:
    clock = FakeClock()
    timer = TurnTimer(10, clock=clock)
    _, waiting = await started_wait(timer)
    clock.advance(9.999)
    await idle()
    assert not waiting.done()
    assert timer.left_s() == pytest.approx(0.001)
    clock.advance(0.001)
    await idle()
    assert waiting.done()
    assert waiting.result() is False
    assert timer.timeout_message() == "turn timed out after 10 s"


async def test_a_future_done_in_time_is_reported_and_the_watch_ends() -> None:
    clock = FakeClock()
    timer = TurnTimer(10, clock=clock)
    future, waiting = await started_wait(timer)
    clock.advance(3)
    future.set_result(None)
    assert await waiting is True
    assert clock.pending_timers == 0


async def test_a_wait_on_a_person_longer_than_the_timeout_does_not_end_the_turn() -> None:
    clock = FakeClock()
    pauses = Pauses(clock)
    timer = TurnTimer(10, pauses, clock=clock, recheck_s=0.5)
    _, waiting = await started_wait(timer)
    clock.advance(4)  # 4 s of the turn's own time
    pauses.start()
    for _ in range(100):  # a person takes 100 s to answer
        clock.advance(1)
        await idle(2)
    assert not waiting.done()
    assert timer.paused_s() == pytest.approx(100)
    pauses.end()
    clock.advance(5.9)  # 9.9 s of its own time
    await idle()
    assert not waiting.done()
    clock.advance(0.1 + timer.recheck_s)  # the limit, and at most one recheck past it
    await idle()
    assert waiting.result() is False
    assert timer.timeout_message() == (
        "turn timed out after 10 s of its own time (not counting 100.0 s waiting on a person)"
    )


async def test_a_pause_that_ended_before_the_limit_moves_it_exactly() -> None:
    clock = FakeClock()
    pauses = Pauses(clock)
    timer = TurnTimer(10, pauses, clock=clock)
    _, waiting = await started_wait(timer)
    clock.advance(2)
    pauses.start()
    clock.advance(30)
    pauses.end()
    clock.advance(7.99)  # 9.99 s of its own time, 39.99 s gone by
    await idle()
    assert not waiting.done()
    clock.advance(0.01 + timer.recheck_s)
    await idle()
    assert waiting.result() is False


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(lambda: math.nan, id="nan"),
        pytest.param(lambda: math.inf, id="inf"),
        pytest.param(lambda: -5.0, id="negative"),
        pytest.param(lambda: True, id="bool"),
        pytest.param(lambda: "100", id="str"),
        pytest.param(lambda: 1 / 0, id="raises"),
    ],
)
async def test_a_broken_paused_s_counts_as_no_pause(answer: object) -> None:
    clock = FakeClock()
    timer = TurnTimer(10, answer, clock=clock)  # type: ignore[arg-type]
    _, waiting = await started_wait(timer)
    clock.advance(10)
    await idle()
    assert waiting.result() is False
    assert timer.paused_s() == 0


async def test_pauses_never_count_for_more_than_the_time_gone_by_nor_shrink() -> None:
    clock = FakeClock()
    told = [1_000.0]
    timer = TurnTimer(10, lambda: told[0], clock=clock)
    clock.advance(4)
    assert timer.paused_s() == 4  # not 1000: the turn is only 4 s old
    assert timer.active_s() == 0
    told[0] = 2.0  # went down: the last good value stands
    assert timer.paused_s() == 4


async def test_limit_cancels_the_block_with_a_timeout_error() -> None:
    clock = FakeClock()
    timer = TurnTimer(5, clock=clock)
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def body() -> bool:
        async with timer.limit() as scope:
            try:
                await never
            finally:
                assert scope.expired()
        return False  # pragma: no cover

    task = asyncio.ensure_future(body())
    await idle()
    clock.advance(5)
    with pytest.raises(TimeoutError):
        await task
    assert clock.pending_timers == 0


async def test_limit_leaves_a_block_that_ends_in_time_alone() -> None:
    clock = FakeClock()
    timer = TurnTimer(5, clock=clock)
    async with timer.limit() as scope:
        clock.advance(4)
        await idle()
    assert not scope.expired()
    assert clock.pending_timers == 0
    clock.advance(10)  # nothing left to fire
    await idle()


def test_arguments_are_checked() -> None:
    with pytest.raises(InvalidArgumentError, match="timeout_s"):
        TurnTimer(0)
    with pytest.raises(InvalidArgumentError, match="timeout_s"):
        TurnTimer(math.inf)
    with pytest.raises(InvalidArgumentError, match="paused_s"):
        TurnTimer(1, 5.0)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="recheck_s"):
        TurnTimer(1, recheck_s=-1)
    with pytest.raises(InvalidArgumentError, match="clock"):
        TurnTimer(1, clock=object())  # type: ignore[arg-type]
    assert TurnTimer(1).clock is SYSTEM_CLOCK
