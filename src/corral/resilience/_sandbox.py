"""``run_sandboxed``: run one agent task under a timeout, in this process or a child process."""

from __future__ import annotations

import asyncio
import inspect
import traceback
from collections.abc import Callable
from typing import Any

from corral.kernel import SYSTEM_CLOCK, Clock, InvalidArgumentError
from corral.kernel import _validate as v
from corral.resilience._sandbox_process import agent_callable
from corral.resilience._sandbox_types import (
    SandboxAgentError,
    SandboxConfig,
    SandboxError,
    SandboxInterruptedError,
    SandboxResult,
    SandboxTask,
    SandboxTimeoutError,
)
from corral.resilience._sandbox_worker import SandboxWorker

DEFAULT_SANDBOX = SandboxConfig()
"""The defaults: 30 s, no memory limit, no actions, not read-only, task isolation."""


async def run_sandboxed(
    agent: Any,
    task: str,
    config: SandboxConfig = DEFAULT_SANDBOX,
    *,
    clock: Clock = SYSTEM_CLOCK,
) -> SandboxResult[Any]:
    """Run ``agent`` on ``task`` under ``config`` and say how it went; never raises for the run.

    ``agent`` is an object with a ``chat(task)`` method, or a callable ``agent(task)``; either
    may be a plain function or a coroutine function. It receives the task as a
    :class:`SandboxTask` (a ``str``, marked read-only when ``config.read_only``).

    A return gives ``completed=True`` and the value. A timeout, an interruption (the agent's
    task cancelled from inside, the child process ended by a signal) or an exception from the
    agent gives ``completed=False`` and a :class:`SandboxError` on ``error``:
    ``sandbox_timeout``, ``sandbox_interrupted``, ``sandbox_agent_failed``,
    ``sandbox_memory_limit``, ``sandbox_start_failed``. Only cancellation of the caller
    propagates (``asyncio.CancelledError``); the agent is then cancelled, or its child process
    killed. Bad arguments (not an agent, a task that is not a ``str``, a config that is not a
    :class:`SandboxConfig`) raise :class:`InvalidArgumentError` before anything runs.

    With ``isolation="task"`` a plain-function agent runs on a worker thread that cannot be
    stopped: at the timeout the result is returned, and the thread finishes in the background.
    With ``isolation="process"`` the agent (and what it returns or raises) must be picklable;
    the child runs under ``max_memory_bytes`` and at the timeout its process group is killed.
    ``duration_s`` and the timeout are measured on ``clock``.
    """
    where = "run_sandboxed"
    call = agent_callable(agent)
    if call is None:
        raise InvalidArgumentError(
            where, "agent", "an object with a chat(task) method, or a callable", agent
        )
    v.instance_of(where, "task", task, str)
    v.instance_of(where, "config", config, SandboxConfig)
    v.instance_of(where, "clock", clock, Clock)
    marked = SandboxTask(task, config.read_only, config.allowed_actions)
    started = clock.monotonic()
    if config.isolation == "process":
        # One run on a worker of its own, ended after it (kept workers: SandboxWorker).
        worker = SandboxWorker(
            max_memory_bytes=config.max_memory_bytes, preload=config.preload, clock=clock
        )
        try:
            ran = await worker.run(agent, marked, timeout_s=config.timeout_s)
        finally:
            if not worker.ended:
                await worker.close()
        completed, result, error = ran.completed, ran.result, ran.error
    else:
        completed, result, error = await _run_in_task(call, marked, config.timeout_s, clock)
    return SandboxResult(
        result=result if completed else None,
        completed=completed,
        duration_s=clock.monotonic() - started,
        error=error,
    )


async def _invoke(call: Callable[[str], Any], task: SandboxTask) -> Any:
    if inspect.iscoroutinefunction(call):
        result = call(task)
    else:
        # A plain function may block: keep it off the event loop.
        result = await asyncio.to_thread(call, task)
    if inspect.isawaitable(result):
        result = await result
    return result


def _retrieve(done: asyncio.Future[Any]) -> None:
    # The run has been answered already; fetch the late outcome so nothing reports it lost.
    if not done.cancelled():
        done.exception()


async def _run_in_task(
    call: Callable[[str], Any], task: SandboxTask, timeout_s: float, clock: Clock
) -> tuple[bool, Any, SandboxError | None]:
    loop = asyncio.get_running_loop()
    work = asyncio.ensure_future(_invoke(call, task))
    expired: asyncio.Future[None] = loop.create_future()

    def expire() -> None:
        if not expired.done():
            expired.set_result(None)

    started = clock.monotonic()
    timer = clock.call_later(timeout_s, expire)
    try:
        await asyncio.wait((work, expired), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        work.cancel()
        work.add_done_callback(_retrieve)
        raise
    finally:
        timer.cancel()
        expired.cancel()
    if not work.done():
        work.cancel()
        work.add_done_callback(_retrieve)
        return False, None, SandboxTimeoutError(timeout_s, clock.monotonic() - started)
    if work.cancelled():
        return False, None, SandboxInterruptedError("the agent's task was cancelled from inside")
    exc = work.exception()
    if exc is None:
        return True, work.result(), None
    text = "".join(traceback.format_exception(exc))
    error = SandboxAgentError(type(exc).__qualname__, str(exc), text)
    error.__cause__ = exc
    return False, None, error
