"""``TurnTimer``: a turn's time limit that does not count time spent waiting on a person."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Callable
from typing import Any

from corral.kernel import SYSTEM_CLOCK, Clock, TimerHandle
from corral.kernel import _validate as v

PausedSeconds = Callable[[], float]
"""``paused_s()``: seconds a turn has spent waiting on a person so far, a wait in progress
included (so it grows while the turn waits)."""

DEFAULT_RECHECK_S = 0.25


class TurnTimer:
    """The time limit of one turn: ``timeout_s`` seconds of the turn's own time.

    The turn's own time is the time on ``clock`` since the timer was made, less
    ``paused_s()``: time spent waiting on a person (an approval) does not count, the
    approval's own timeout decides how long that wait may be. ``paused_s`` is read when the
    timer checks; it must only grow. A value that does not fit -- not a finite number,
    smaller than the last one seen, or a ``paused_s`` that raises -- counts as no new pause
    (the last good value stands), and pauses never count for more than the time gone by: a
    broken ``paused_s`` cannot make the turn's time negative, nor stop the clock for good
    unless it keeps growing.

    Without pauses the limit fires exactly ``timeout_s`` after the start. While a pause is
    in progress the timer checks again every ``recheck_s`` seconds at the most often, so a
    turn may run up to ``recheck_s`` past its limit when a pause ended just before the limit.

    :meth:`wait` and :meth:`limit` watch the limit for a future or a block of code; neither
    is tied to one task, and a timer may be watched more than once (one after the other).
    Raises ``InvalidArgumentError`` for a ``timeout_s`` or ``recheck_s`` that is not a
    positive finite number, a ``paused_s`` that is not callable, a ``clock`` that is not a
    ``Clock``.
    """

    __slots__ = ("_last_paused", "_paused_s", "_start", "clock", "recheck_s", "timeout_s")

    def __init__(
        self,
        timeout_s: float,
        paused_s: PausedSeconds | None = None,
        *,
        clock: Clock = SYSTEM_CLOCK,
        recheck_s: float = DEFAULT_RECHECK_S,
    ) -> None:
        where = "TurnTimer"
        v.positive_number(where, "timeout_s", timeout_s)
        v.positive_number(where, "recheck_s", recheck_s)
        if paused_s is not None:
            v.callable_(where, "paused_s", paused_s)
        v.instance_of(where, "clock", clock, Clock)
        self.timeout_s = float(timeout_s)
        self.recheck_s = float(recheck_s)
        self.clock = clock
        self._paused_s = paused_s
        self._start = clock.monotonic()
        self._last_paused = 0.0

    def __repr__(self) -> str:
        return f"TurnTimer(timeout_s={self.timeout_s:g}, left_s={self.left_s():.3f})"

    def paused_s(self) -> float:
        """Seconds of the turn spent waiting on a person so far (see the class docstring)."""
        gone = max(0.0, self.clock.monotonic() - self._start)
        if self._paused_s is not None:
            try:
                seen: Any = self._paused_s()
            except Exception:
                seen = None  # the last good value stands
            if (
                isinstance(seen, int | float)
                and not isinstance(seen, bool)
                and math.isfinite(seen)
                and seen > self._last_paused
            ):
                self._last_paused = float(seen)
        return min(self._last_paused, gone)

    def active_s(self) -> float:
        """Seconds of the turn's own time so far: time gone by less :meth:`paused_s`."""
        paused = self.paused_s()  # read first: it may move the time it is bounded by
        return max(0.0, self.clock.monotonic() - self._start - paused)

    def left_s(self) -> float:
        """Seconds of the turn's own time left; 0 or less once the limit is reached."""
        return self.timeout_s - self.active_s()

    def timeout_message(self) -> str:
        """``"turn timed out after N s"``, and the time it waited on a person when it did."""
        paused = self.paused_s()
        if paused <= 0:
            return f"turn timed out after {self.timeout_s:g} s"
        return (
            f"turn timed out after {self.timeout_s:g} s of its own time "
            f"(not counting {paused:.1f} s waiting on a person)"
        )

    async def wait(self, future: asyncio.Future[Any]) -> bool:
        """Wait until ``future`` is done or the limit is reached; whether ``future`` is done.

        ``future`` is never cancelled (a turn that runs out of time decides what to do with
        it). A cancellation of the caller propagates.
        """
        if future.done():
            return True
        expiry: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def expire() -> None:
            if not expiry.done():
                expiry.set_result(None)

        watch = _Watch(self, expire)
        try:
            await asyncio.wait({future, expiry}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            expiry.cancel()
        return future.done()

    @contextlib.asynccontextmanager
    async def limit(self) -> AsyncIterator[asyncio.Timeout]:
        """``async with timer.limit() as scope``: the block is cancelled when the limit is
        reached and ``TimeoutError`` is raised, as with :func:`asyncio.timeout`;
        ``scope.expired()`` tells that timeout from any other ``TimeoutError``. Must be used
        inside a task."""
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(None) as scope:
            watch = _Watch(self, lambda: scope.reschedule(loop.time()))
            try:
                yield scope
            finally:
                watch.cancel()


class _Watch:
    """Checks a timer's limit on its clock and calls ``fire`` once when it is reached.

    It wakes when the limit would be reached if no pause came; a pause (``paused_s`` grew
    since the last check) pushes the limit back, so it checks again, no sooner than
    ``recheck_s`` later while the pause may still be in progress.
    """

    __slots__ = ("_fire", "_handle", "_seen", "_timer")

    def __init__(self, timer: TurnTimer, fire: Callable[[], None]) -> None:
        self._timer = timer
        self._fire = fire
        self._seen = timer.paused_s()
        self._handle: TimerHandle | None = None
        self._arm(timer.left_s())

    def _arm(self, delay: float) -> None:
        self._handle = self._timer.clock.call_later(max(0.0, delay), self._check)

    def _check(self) -> None:
        self._handle = None
        timer = self._timer
        paused = timer.paused_s()
        left = timer.left_s()
        if left <= 0:
            self._fire()
            return
        grew = paused > self._seen
        self._seen = paused
        self._arm(max(left, timer.recheck_s) if grew else left)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
