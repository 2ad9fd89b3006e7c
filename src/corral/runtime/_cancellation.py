"""``Cancellation``: the concrete cooperative stop button of a run."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from datetime import datetime, timedelta
from typing import Any, TypeVar

from corral.kernel import (
    SYSTEM_CLOCK,
    CancellationError,
    Clock,
    DeadlineExceededError,
    TimerHandle,
    UsageError,
)
from corral.kernel import _validate as v
from corral.kernel._protocols import CancellationToken

logger = logging.getLogger("corral.runtime.cancellation")

Callback = Callable[[CancellationToken], object]

# Tasks running async callbacks: held here so they are not collected before they finish.
_CALLBACK_TASKS: set[asyncio.Task[None]] = set()


class _Scheduled:
    """The handle ``cancel_after``/``cancel_at`` return; ``cancel`` calls the timer off."""

    __slots__ = ("_timer", "_token", "when")

    def __init__(self, token: Cancellation, when: datetime) -> None:
        self._token = token
        self.when = when
        self._timer: TimerHandle | None = None

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._token._unschedule(self)

    def __repr__(self) -> str:
        return f"<scheduled cancellation at {self.when.isoformat()}>"


class Cancellation:
    """A cancellation token (implements :class:`corral.kernel.CancellationToken`).

    - ``cancel`` is idempotent: the first reason is kept, later calls do nothing.
    - Callbacks run exactly once, in the order added; one added after cancellation runs at
      once. A callback that raises is logged and does not stop the others or ``cancel``. A
      callback may be a coroutine function: what it returns is awaited in a task of its own
      on the running loop (its failure is logged too); without a running loop it cannot run,
      and that is logged as an error.
    - A ``child()`` is cancelled with its parent (same reason); cancelling a child never
      touches the parent. A child keeps its parent alive, not the reverse, so a chain of
      children whose middle links nobody holds still passes a cancellation down.
    - ``cancel_after`` / ``cancel_at`` schedule a deadline on the token's clock; when it fires,
      ``check`` raises :class:`DeadlineExceededError`. With the system clock both need a
      running event loop (``UsageError`` otherwise).

    Call its methods from the event loop's thread. ``wait`` may be awaited on one loop after
    another (an agent built once and run by ``asyncio.run`` twice): ``cancel`` wakes each
    waiter on its own loop.
    """

    __slots__ = (
        "__weakref__",
        "_callbacks",
        "_children",
        "_clock",
        "_deadline",
        "_error",
        "_parent",
        "_timers",
        "_waiters",
    )

    def __init__(self, *, clock: Clock = SYSTEM_CLOCK) -> None:
        v.instance_of("Cancellation", "clock", clock, Clock)
        self._clock = clock
        self._parent: Cancellation | None = None
        self._error: CancellationError | None = None
        # One future per wait() in progress, each on the loop of its waiter: a token outlives
        # event loops (an agent built once and run by asyncio.run twice), which an
        # asyncio.Event, bound to the first loop that waits on it, does not.
        self._waiters: set[asyncio.Future[None]] = set()
        self._callbacks: list[Callback] = []
        self._children: weakref.WeakSet[Cancellation] = weakref.WeakSet()
        self._timers: list[_Scheduled] = []
        self._deadline: datetime | None = None

    @property
    def is_cancelled(self) -> bool:
        return self._error is not None

    @property
    def reason(self) -> str | None:
        """The first reason given (``"deadline exceeded"`` for a fired deadline)."""
        return None if self._error is None else self._error.reason

    @property
    def deadline(self) -> datetime | None:
        """The earliest instant armed with ``cancel_at``/``cancel_after``, if any.

        A timer called off no longer counts; once the token is cancelled the value stays.
        """
        return self._deadline

    @property
    def clock(self) -> Clock:
        return self._clock

    def cancel(self, reason: str | None = None) -> None:
        """Cancel with ``reason``. Idempotent: only the first call has any effect."""
        v.non_empty_str("Cancellation.cancel", "reason", reason, optional=True)
        self._cancel_with(CancellationError(reason))

    def _cancel_with(self, error: CancellationError) -> None:
        if self._error is not None:
            return
        self._error = error
        timers, self._timers = self._timers, []
        for scheduled in timers:
            if scheduled._timer is not None:
                scheduled._timer.cancel()
        waiters, self._waiters = self._waiters, set()
        for waiter in waiters:
            _wake(waiter)
        callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            self._run_callback(fn)
        for child in list(self._children):
            child._cancel_with(error)

    def _run_callback(self, fn: Callback) -> None:
        try:
            result = fn(self)
        except Exception:
            logger.exception("cancellation callback %r raised; the others still run", fn)
            return
        if inspect.isawaitable(result):
            _start_callback(fn, result)

    def check(self) -> None:
        """Raise the cancellation error (a fresh instance each time) if cancelled."""
        error = self._error
        if error is None:
            return
        if isinstance(error, DeadlineExceededError):
            raise DeadlineExceededError(error.deadline, error.now)
        raise CancellationError(error.reason)

    async def wait(self) -> None:
        """Return once the token is cancelled (at once if it already is)."""
        if self._error is not None:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.add(waiter)
        try:
            await waiter
        finally:
            self._waiters.discard(waiter)

    def add_callback(self, fn: Callback) -> None:
        """Run ``fn(token)`` once on cancellation (at once if already cancelled)."""
        v.callable_("Cancellation.add_callback", "fn", fn)
        if self._error is not None:
            self._run_callback(fn)
        else:
            self._callbacks.append(fn)

    def child(self) -> Cancellation:
        """A token cancelled whenever this one is; cancelling it leaves this one alone."""
        kid = Cancellation(clock=self._clock)
        if self._error is not None:
            kid._cancel_with(self._error)
        else:
            kid._parent = self  # the chain up stays alive while a descendant is held
            self._children.add(kid)
        return kid

    def cancel_after(self, seconds: float, reason: str | None = None) -> TimerHandle:
        """Cancel ``seconds`` from now on the token's clock (a deadline when reason is None).

        Returns the timer; cancelling it calls the deadline off.
        """
        v.non_negative_number("Cancellation.cancel_after", "seconds", seconds)
        v.non_empty_str("Cancellation.cancel_after", "reason", reason, optional=True)
        when = self._clock.now() + timedelta(seconds=seconds)
        return self._schedule(when, seconds, reason)

    def cancel_at(self, when: datetime, reason: str | None = None) -> TimerHandle:
        """Cancel at the absolute instant ``when`` (timezone-aware) on the token's clock."""
        v.aware_datetime("Cancellation.cancel_at", "when", when)
        v.non_empty_str("Cancellation.cancel_at", "reason", reason, optional=True)
        delay = (when - self._clock.now()).total_seconds()
        return self._schedule(when, delay, reason)

    def _schedule(self, when: datetime, delay: float, reason: str | None) -> TimerHandle:
        scheduled = _Scheduled(self, when)
        if self._error is not None:
            return scheduled

        def fire() -> None:
            if reason is None:
                self._cancel_with(
                    DeadlineExceededError(when.isoformat(), self._clock.now().isoformat())
                )
            else:
                self._cancel_with(CancellationError(reason))

        try:
            scheduled._timer = self._clock.call_later(delay, fire)
        except RuntimeError as exc:  # the system clock's timers live on the running loop
            raise UsageError(
                f"Cancellation could not schedule a cancellation {delay:g} s ahead: {exc}; "
                "call cancel_after/cancel_at from a running event loop",
                delay_s=delay,
            ) from None
        self._timers.append(scheduled)
        if self._deadline is None or when < self._deadline:
            self._deadline = when
        return scheduled

    def _unschedule(self, scheduled: _Scheduled) -> None:
        if self._error is not None or scheduled not in self._timers:
            return
        self._timers.remove(scheduled)
        self._deadline = min((s.when for s in self._timers), default=None)

    def __repr__(self) -> str:
        state = f"cancelled, reason={self.reason!r}" if self.is_cancelled else "active"
        return f"Cancellation({state})"


def _wake(waiter: asyncio.Future[None]) -> None:
    """Resolve ``waiter`` on its own loop (at once when that loop is the running one)."""
    loop = waiter.get_loop()
    try:
        running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        _resolve(waiter)
        return
    with contextlib.suppress(RuntimeError):  # its loop has closed: nobody waits any more
        loop.call_soon_threadsafe(_resolve, waiter)


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _start_callback(fn: Callback, awaitable: Awaitable[object]) -> None:
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        close = getattr(awaitable, "close", None)
        if callable(close):
            close()  # never started: closing it keeps "never awaited" warnings away
        logger.error(
            "cancellation callback %r is async but no event loop is running; it did not run", fn
        )
        return

    async def drive() -> None:
        await awaitable

    task = loop.create_task(drive())
    _CALLBACK_TASKS.add(task)

    def done(finished: asyncio.Task[None]) -> None:
        _CALLBACK_TASKS.discard(finished)
        if finished.cancelled():
            return
        error = finished.exception()
        if error is not None:
            logger.error(
                "cancellation callback %r raised; the others still run",
                fn,
                exc_info=(type(error), error, error.__traceback__),
            )

    task.add_done_callback(done)


T = TypeVar("T")


async def race(call: Coroutine[Any, Any, T], token: CancellationToken) -> T:
    """Await ``call`` unless ``token`` is cancelled first; then abandon it and raise.

    Leaves no task behind: whichever way it ends (result, error, token, or the caller's own
    cancellation), both helper tasks have finished before it returns or raises.
    """
    try:
        token.check()
    except BaseException:
        call.close()  # never started
        raise
    task = asyncio.ensure_future(call)
    waiter = asyncio.ensure_future(token.wait())
    try:
        await asyncio.wait((task, waiter), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        await _finish(task, waiter)
        raise
    if task.done():
        await _finish(waiter)
        return task.result()
    await _finish(task)
    token.check()
    raise AssertionError("unreachable: the token was cancelled")  # pragma: no cover


async def _finish(*tasks: asyncio.Future[Any]) -> None:
    """Cancel ``tasks`` and wait until they have ended, whatever the caller's own state."""
    for task in tasks:
        task.cancel()
    pending = {t for t in tasks if not t.done()}
    while pending:
        try:
            _, pending = await asyncio.wait(pending)
        except asyncio.CancelledError:
            # Cancelled again while cleaning up: the tasks are already cancelled; keep waiting
            # so none outlives the call, then let the caller's cancellation through.
            for task in pending:
                task.cancel()
            await asyncio.wait(pending)
            raise
    for task in tasks:
        if task.done() and not task.cancelled():
            task.exception()  # retrieved: an abandoned failure is not "never retrieved"
