"""Running one health check under a timeout: async checks on the loop, plain ones in a thread."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import threading
from collections.abc import Awaitable
from typing import Any

from corral.kernel import Clock, TimerHandle
from corral.recovery._types import HealthCheck

logger = logging.getLogger("corral.recovery")


class CheckUnanswered(Exception):
    """The check gave no answer: it timed out, or an earlier call of it is still hung."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _ThreadCall:
    """One plain check running in its worker thread."""

    __slots__ = ("check", "finished")

    def __init__(self, check: HealthCheck) -> None:
        # Holding the check keeps its id() unique while the call is remembered.
        self.check = check
        self.finished = False


class CheckRunner:
    """Runs health checks for one manager, each under ``timeout_s`` seconds of ``clock``.

    A coroutine function (or an object whose ``__call__`` is one) runs on the event loop; at
    the timeout its task is cancelled. Any other check is called in a fresh daemon thread, so a
    blocking check freezes neither the loop nor the run; a thread cannot be interrupted, so at
    the timeout it is left to finish on its own, its late answer is dropped, and until it has
    finished the same check of the same agent is not started again (each run reports it as
    still hung instead), so a hung check holds one thread, not one per run. An awaitable that a
    plain check returns is awaited on the loop within the same deadline. ``timeout_s`` None
    waits as long as the check takes.
    """

    __slots__ = ("_abandoned", "_clock", "_lock", "_timeout_s")

    def __init__(self, clock: Clock, timeout_s: float | None) -> None:
        self._clock = clock
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._abandoned: dict[tuple[str, int], _ThreadCall] = {}

    @property
    def timeout_s(self) -> float | None:
        return self._timeout_s

    async def run(self, agent_id: str, check: HealthCheck, agent: object) -> object:
        """The check's answer, or what it raised; ``CheckUnanswered`` when it gave none.

        Cancelling the caller cancels an async check and waits for it to end; a plain check's
        thread goes on, and its answer is dropped.
        """
        loop = asyncio.get_running_loop()
        expired: asyncio.Future[None] | None = None
        timer: TimerHandle | None = None
        if self._timeout_s is not None:
            expired = loop.create_future()
            timer = self._clock.call_later(self._timeout_s, functools.partial(_settle, expired))
        try:
            if is_async_check(check):
                outcome: object = check(agent)
            else:
                outcome = await self._in_thread(loop, agent_id, check, agent, expired)
            if inspect.isawaitable(outcome):
                outcome = await self._await(outcome, expired)
            return outcome
        finally:
            if timer is not None:
                timer.cancel()

    async def _await(self, awaitable: Awaitable[Any], expired: asyncio.Future[None] | None) -> Any:
        if expired is None:
            return await awaitable
        # A task of its own, so the check can be cancelled alone when it overruns.
        task = asyncio.ensure_future(awaitable)
        task.add_done_callback(_retrieve)
        try:
            await asyncio.wait((task, expired), return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            # Cancelled from outside: the check goes with the run, which ends after it.
            task.cancel()
            await asyncio.wait((task,))
            raise
        if not task.done():
            task.cancel()
            raise CheckUnanswered(f"health check {self._timed_out()}")
        return task.result()

    async def _in_thread(
        self,
        loop: asyncio.AbstractEventLoop,
        agent_id: str,
        check: HealthCheck,
        agent: object,
        expired: asyncio.Future[None] | None,
    ) -> object:
        key = (agent_id, id(check))
        call = _ThreadCall(check)
        with self._lock:
            if key in self._abandoned:
                raise CheckUnanswered(
                    f"health check {self._timed_out()} in an earlier run and is still "
                    "running; not started again"
                )
        answer: asyncio.Future[object] = loop.create_future()

        def work() -> None:
            outcome: object = None
            error: BaseException | None = None
            try:
                outcome = check(agent)
            except BaseException as exc:  # handed over whole: the loop side sorts it out
                error = exc
            with self._lock:
                call.finished = True
                if self._abandoned.get(key) is call:
                    del self._abandoned[key]
            # RuntimeError: the loop has closed, so nobody waits for this answer any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_deliver, answer, outcome, error)

        thread = threading.Thread(target=work, name=f"corral-health-check[{agent_id}]", daemon=True)
        thread.start()
        waiting: tuple[asyncio.Future[Any], ...] = (
            (answer,) if expired is None else (answer, expired)
        )
        try:
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            answer.cancel()
            raise
        if answer.done():
            return answer.result()
        answer.cancel()
        with self._lock:
            if not call.finished:
                self._abandoned[key] = call
        logger.warning(
            "health check of agent %r %s; its thread is left running", agent_id, self._timed_out()
        )
        raise CheckUnanswered(f"health check {self._timed_out()}")

    def _timed_out(self) -> str:
        return f"timed out after {self._timeout_s:g} s"


def is_async_check(check: object) -> bool:
    """Whether calling ``check`` starts a coroutine (a coroutine function or async ``__call__``)."""
    return inspect.iscoroutinefunction(check) or inspect.iscoroutinefunction(
        getattr(check, "__call__", None)  # noqa: B004 - the method itself is inspected
    )


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _deliver(answer: asyncio.Future[object], outcome: object, error: BaseException | None) -> None:
    if answer.done():
        return  # timed out or cancelled meanwhile: the late answer is dropped
    if error is None:
        answer.set_result(outcome)
    else:
        answer.set_exception(error)


def _retrieve(task: asyncio.Future[Any]) -> None:
    # A check cancelled at its timeout may still end in an error that nobody awaits any more:
    # mark it seen so asyncio does not report it as lost.
    if not task.cancelled():
        task.exception()
