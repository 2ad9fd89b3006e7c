import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from corral.kernel import Clock, InvalidArgumentError
from corral.runtime import FakeClock


def test_implements_the_clock_protocol() -> None:
    assert isinstance(FakeClock(), Clock)


def test_time_moves_only_when_advanced() -> None:
    start = datetime(2030, 5, 1, tzinfo=UTC)
    clock = FakeClock(start)
    assert clock.now() == start
    assert clock.monotonic() == 0
    clock.advance(2.5)
    assert clock.monotonic() == 2.5
    assert clock.now() == start + timedelta(seconds=2.5)


def test_timers_fire_in_order_each_at_its_own_time() -> None:
    clock = FakeClock()
    seen: list[tuple[str, float]] = []
    clock.call_later(3, lambda: seen.append(("c", clock.monotonic())))
    clock.call_later(1, lambda: seen.append(("a", clock.monotonic())))
    cancelled = clock.call_later(2, lambda: seen.append(("x", clock.monotonic())))
    cancelled.cancel()
    clock.advance(10)
    assert seen == [("a", 1), ("c", 3)]
    assert clock.pending_timers == 0


async def test_sleep_parks_until_advanced() -> None:
    clock = FakeClock()
    sleeper = asyncio.create_task(clock.sleep(5))
    await asyncio.sleep(0)
    clock.advance(4)
    await asyncio.sleep(0)
    assert not sleeper.done()
    clock.advance(1)
    await asyncio.wait_for(sleeper, 1)
    assert clock.sleeps == [5]


async def test_auto_advance_moves_time_by_each_sleep() -> None:
    clock = FakeClock(auto_advance=True)
    await clock.sleep(1.5)
    await clock.sleep(-1)
    assert clock.sleeps == [1.5, 0.0]
    assert clock.monotonic() == 1.5


async def test_cancelled_sleep_leaves_no_timer() -> None:
    clock = FakeClock()
    sleeper = asyncio.create_task(clock.sleep(5))
    await asyncio.sleep(0)
    sleeper.cancel()
    with pytest.raises(asyncio.CancelledError):
        await sleeper
    assert clock.pending_timers == 0


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="start"):
        FakeClock(datetime(2030, 1, 1))
    with pytest.raises(InvalidArgumentError, match="seconds"):
        FakeClock().advance(-1)
    with pytest.raises(InvalidArgumentError, match="auto_advance must be a bool"):
        FakeClock(auto_advance="yes")  # type: ignore[arg-type]
