"""The clock seam: every time-dependent part of corral reads time through a ``Clock``.

The system clock is the default; ``corral.runtime.FakeClock`` stands in for it in tests so time
logic is deterministic.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Protocol, runtime_checkable


@runtime_checkable
class TimerHandle(Protocol):
    """A scheduled callback; ``cancel`` is idempotent."""

    def cancel(self) -> None: ...


@runtime_checkable
class Clock(Protocol):
    """Time for corral.

    ``monotonic`` is in seconds and only differences mean something; ``now`` is an aware UTC
    datetime; ``sleep`` waits ``seconds`` of this clock's time; ``call_later`` runs ``callback``
    once after ``delay`` seconds of this clock's time (on the running event loop).
    """

    def monotonic(self) -> float: ...

    def now(self) -> datetime: ...

    async def sleep(self, seconds: float) -> None: ...

    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerHandle: ...


class SystemClock:
    """The real clock: ``time.monotonic``, UTC wall time, and the running event loop."""

    __slots__ = ()

    def monotonic(self) -> float:
        return time.monotonic()

    def now(self) -> datetime:
        return datetime.now(UTC)

    # asyncio is imported where it is used: a command line that reads the clock should not
    # pay for importing it (a tenth of a second on a small machine).
    async def sleep(self, seconds: float) -> None:
        import asyncio

        await asyncio.sleep(max(0.0, seconds))

    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerHandle:
        import asyncio

        return asyncio.get_running_loop().call_later(max(0.0, delay), callback)

    def __repr__(self) -> str:
        return "SystemClock()"


SYSTEM_CLOCK: Clock = SystemClock()
"""The process-wide default clock."""
