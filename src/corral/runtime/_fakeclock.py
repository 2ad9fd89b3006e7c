"""A clock that only moves when told to, for deterministic time logic in tests."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from corral.kernel import _validate as v

_EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


class _FakeTimer:
    __slots__ = ("_cancelled", "callback", "when")

    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when = when
        self.callback = callback
        self._cancelled = False

    def cancel(self) -> None:
        self._cancelled = True

    @property
    def cancelled(self) -> bool:
        return self._cancelled


class FakeClock:
    """A :class:`corral.kernel.Clock` whose time moves only through :meth:`advance`.

    ``sleep`` parks the caller until the clock has been advanced past its wake time; with
    ``auto_advance=True`` a sleep instead moves the clock forward by its own length and
    returns at once (handy for backoff logic). Every sleep length is recorded in ``sleeps``.
    Timers and sleepers fire in time order during :meth:`advance`, each seeing the clock at
    its own due time.
    """

    def __init__(self, start: datetime = _EPOCH, *, auto_advance: bool = False) -> None:
        v.aware_datetime("FakeClock", "start", start)
        v.instance_of("FakeClock", "auto_advance", auto_advance, bool)
        self._start = start
        self._mono = 0.0
        self.auto_advance = auto_advance
        self.sleeps: list[float] = []
        self._timers: list[tuple[float, int, _FakeTimer]] = []
        self._seq = itertools.count()

    def monotonic(self) -> float:
        return self._mono

    def now(self) -> datetime:
        return self._start + timedelta(seconds=self._mono)

    def call_later(self, delay: float, callback: Callable[[], None]) -> _FakeTimer:
        timer = _FakeTimer(self._mono + max(0.0, delay), callback)
        heapq.heappush(self._timers, (timer.when, next(self._seq), timer))
        return timer

    async def sleep(self, seconds: float) -> None:
        seconds = max(0.0, seconds)
        self.sleeps.append(seconds)
        if self.auto_advance:
            self.advance(seconds)
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not future.done():
                future.set_result(None)

        timer = self.call_later(seconds, wake)
        try:
            await future
        finally:
            timer.cancel()

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``, firing every timer that falls due on the way."""
        v.non_negative_number("FakeClock.advance", "seconds", seconds)
        target = self._mono + seconds
        while self._timers and self._timers[0][0] <= target:
            when, _, timer = heapq.heappop(self._timers)
            if timer.cancelled:
                continue
            self._mono = max(self._mono, when)
            timer.callback()
        self._mono = target

    @property
    def pending_timers(self) -> int:
        """How many timers (sleepers included) are still waiting."""
        return sum(1 for _, _, t in self._timers if not t.cancelled)

    def __repr__(self) -> str:
        return f"FakeClock(now={self.now().isoformat()})"
