"""``PythonHarness``: one turn is one call of a Python function named ``module:function``,
made in a worker process kept for its agent, so that nothing the function does can take the
daemon down and a turn costs a message over a pipe, not a fork."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import logging
import math
import os
import signal
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corral.daemon._records import SessionMessage
from corral.daemon.harnesses import _liveness, _python_log, _state_files
from corral.daemon.harnesses._base import TurnFailedError, TurnRequest, TurnResult
from corral.daemon.harnesses._call_log import CallLog
from corral.daemon.harnesses._log_tail import LogTail, following, read_bound
from corral.daemon.harnesses._timer import TurnTimer
from corral.kernel import SYSTEM_CLOCK, Clock, InvalidArgumentError
from corral.kernel import _validate as v
from corral.resilience import (
    SandboxError,
    SandboxInterruptedError,
    SandboxMemoryError,
    SandboxStartError,
    SandboxTimeoutError,
    SandboxWorker,
)
from corral.runtime import Middleware

logger = logging.getLogger("corral.daemon")

_RESULT_KEYS = frozenset({"output", "tokens", "costUsd"})

DEFAULT_MAX_MEMORY_BYTES = 1024**3
"""A worker process's address-space limit unless told: 1 GiB."""

PRELOAD = ("corral.daemon", "corral.daemon.harnesses", "corral.agent", "corral.runtime")
"""What the worker processes' fork server imports once (what agent modules usually import:
``corral.daemon`` itself imports its names on first use)."""

_BACKSTOP_S = 30 * 24 * 3600.0  # a turn's worker limit when the turn's timer pauses

DEFAULT_IDLE_S = 60.0
"""How long an agent's worker is kept without a turn unless told."""

DEFAULT_MAX_WORKERS = 256
"""How many workers are kept at most unless told (the least recently used end first)."""

DEFAULT_LOG_BYTES = 1024 * 1024
"""A turn's log is kept up to this many bytes in the worker unless told (the daemon's
``--turn-log-bytes``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnContext:
    """What a python-harness function is told about its turn (its second argument).

    ``env`` is the spec's ``env`` with the request's ``env`` on top (the worker process's
    own environment, ``os.environ``, is the daemon's). ``session`` is the agent's
    conversation before this turn, oldest first (:class:`SessionMessage` dicts: ``role``,
    ``turn``, ``content``, ...; empty when its ``history`` is ``none``).

    ``heartbeat_file`` is the turn's heartbeat file: :meth:`heartbeat` touches it, which
    keeps a turn watched for stalls (the spec's ``heartbeatS``) alive while the function
    works without returning.

    What the function prints and logs during the turn goes to the turn's log (see
    ``_python_log``); :meth:`call_log` adds the model and tool calls of an agent loop.
    """

    agent_id: str
    turn: int
    workdir: Path
    env: Mapping[str, str] = field(default_factory=dict)
    session: tuple[SessionMessage, ...] = ()
    heartbeat_file: Path | None = None

    def heartbeat(self) -> None:
        """Tell the daemon the turn is alive (touch :attr:`heartbeat_file`). Never raises:
        a file that cannot be touched only leaves the turn silent."""
        if self.heartbeat_file is None:
            return
        try:
            os.utime(self.heartbeat_file)
        except OSError:
            with contextlib.suppress(OSError):
                self.heartbeat_file.touch()

    def call_log(self) -> Middleware:
        """A middleware for a :class:`corral.agent.Agent` the function runs (``Agent(...,
        middleware=[context.call_log()])``): each model call and tool call it makes during
        the turn goes to the turn's log (streams ``model`` and ``tool``), as the ``openai``
        harness's do. Outside a turn it writes nothing."""
        return CallLog(_python_log.Routed())


class PythonHarness:
    """Calls ``spec.function`` (``package.module:function``) as ``function(prompt, context)``
    in a worker process kept for its agent.

    ``context`` is a :class:`TurnContext`. An agent's first turn starts its worker (a
    :class:`corral.resilience.SandboxWorker`, forked from a server that has imported
    ``corral.daemon`` once); later turns reuse it, one at a time. The worker imports the
    function's module, calls it and sends its result back. A coroutine function is run to its
    end on the worker's own event loop; a plain function is called in the worker (its result
    may be an awaitable, which is then run too). The function returns the output as a
    ``str``, or a dict ``{"output": str, "tokens": int, "costUsd": float | None}`` (``tokens``
    and ``costUsd`` optional, 0 by default; no other keys), or raises
    :class:`TurnFailedError` itself to report a failure with its usage.

    Nothing the function does reaches the daemon: its worker is limited to
    ``max_memory_bytes`` of address space, and is killed (its whole process group) at the
    turn's timeout, when it goes over its memory limit, when it dies, and when the turn is
    cancelled (a stop, a shutdown); the agent's next turn starts a fresh worker. Module state
    (what the function's module keeps in globals) lasts as long as the agent's worker, which
    is never shared with another agent; it is lost when the worker ends (see above, and:
    after ``idle_s`` seconds without a turn, when more than ``max_workers`` are kept (the
    least recently used first), at :meth:`release` and :meth:`aclose`). Keep what must last
    in ``workdir``.

    Failed turns (:class:`TurnFailedError`): the module cannot be imported in the worker
    (any error raised while importing it) or has no such callable; the function raises (the
    message names the exception type and its message; ``SystemExit`` and
    ``KeyboardInterrupt`` included); it returns anything else, or something that cannot be
    sent back (the message says what); it runs longer than ``request.timeout_s`` ("turn
    timed out after N s", its process killed; time it spends waiting on a person,
    ``request.paused_s``, does not count); it goes over its memory limit ("over its
    memory limit of N bytes"); its process ends without answering ("worker process exited
    with code N", "was killed by signal SIGSEGV": ``os._exit``, a crash in C code).

    Log: with ``request.log``, what the function writes to ``sys.stdout`` and ``sys.stderr``
    and the ``logging`` records it emits during the turn (and its agent loop's model and
    tool calls, with :meth:`TurnContext.call_log`) go there while the turn runs, at most
    ``log_bytes`` of them (capped in the worker, the rest counted as dropped); see
    ``_python_log``.

    Liveness: when the daemon watches the turn (``request.heartbeat``, the spec's
    ``heartbeatS``), the turn's start and each ``context.heartbeat()`` (it touches the turn's
    heartbeat file, see ``_liveness``) are its signs of life.
    """

    def __init__(
        self,
        *,
        max_memory_bytes: int = DEFAULT_MAX_MEMORY_BYTES,
        preload: Sequence[str] = PRELOAD,
        idle_s: float = DEFAULT_IDLE_S,
        max_workers: int = DEFAULT_MAX_WORKERS,
        clock: Clock = SYSTEM_CLOCK,
        log_bytes: int = DEFAULT_LOG_BYTES,
    ) -> None:
        where = "PythonHarness"
        v.non_negative_int(where, "max_memory_bytes", max_memory_bytes)
        v.positive_int(where, "log_bytes", log_bytes)
        self.log_bytes = log_bytes
        v.positive_number(where, "idle_s", idle_s)
        v.positive_int(where, "max_workers", max_workers)
        v.instance_of(where, "clock", clock, Clock)
        self.max_memory_bytes = max_memory_bytes
        self.preload = tuple(preload)
        self.idle_s = idle_s
        self.max_workers = max_workers
        self.clock = clock
        # Agent id -> its worker and when its last turn ended; least recently used first.
        self._workers: OrderedDict[str, _Kept] = OrderedDict()
        self._sweeper: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return (
            f"PythonHarness(max_memory_bytes={self.max_memory_bytes}, idle_s={self.idle_s:g}, "
            f"max_workers={self.max_workers})"
        )

    @property
    def workers(self) -> dict[str, int | None]:
        """The kept workers: agent id -> worker pid (None while it starts)."""
        return {agent_id: kept.worker.pid for agent_id, kept in self._workers.items()}

    async def run_turn(self, request: TurnRequest) -> TurnResult:
        """Run one turn; see the class docstring. Raises ``InvalidArgumentError`` when the
        request is not a TurnRequest for a ``python`` spec."""
        v.instance_of("PythonHarness.run_turn", "request", request, TurnRequest)
        target = request.spec.function
        if request.spec.harness != "python" or not target:
            raise InvalidArgumentError(
                "PythonHarness.run_turn",
                "request.spec",
                "a spec of harness 'python' with a function",
                request.spec.harness,
            )
        kept = await self._worker_for(request.agent_id)
        log_file, tail = self._log_for(request)
        try:
            async with (
                _liveness.alive(request) as heartbeat_file,
                following(tail, _python_log.LOG_POLL_S),
            ):
                context = TurnContext(
                    agent_id=request.agent_id,
                    turn=request.turn,
                    workdir=request.workdir,
                    env={**request.spec.env, **request.env},
                    heartbeat_file=heartbeat_file,
                    session=request.session,
                )
                turn = _Turn(target, context, log_file, self.log_bytes)
                if request.paused_s is None:
                    ran = await kept.worker.run(turn, request.prompt, timeout_s=request.timeout_s)
                else:
                    ran = await self._run_pausing(kept, turn, request)
        finally:
            kept.used = self.clock.monotonic()
            if kept.worker.ended and self._workers.get(request.agent_id) is kept:
                del self._workers[request.agent_id]
            if tail is not None and log_file is not None:
                tail.poll(until_end=True)  # what the worker wrote last (at most max_bytes)
                with contextlib.suppress(OSError):
                    _state_files.made_empty(log_file)  # read: kept empty for the next turn
        if ran.error is not None:
            raise _worker_failed(target, ran.error, request.timeout_s)
        outcome = ran.result
        if isinstance(outcome, TurnResult):
            return outcome
        assert isinstance(outcome, _Failed)
        raise TurnFailedError(
            outcome.message, usage=outcome.usage, dimension=outcome.dimension, **outcome.details
        )

    def _log_for(self, request: TurnRequest) -> tuple[Path | None, LogTail | None]:
        """The agent's log file (made empty) and the turn's tail of it, when the daemon keeps
        the turn's log. The file is kept from turn to turn (emptied at each turn's end), and
        made anew only when the agent's code put something else in its place: a FIFO (which
        the daemon must not block on), a link (whose target it must not empty), a file with
        another name (see ``_state_files``)."""
        if request.log is None:
            return None, None
        path = _python_log.log_path(request.state_dir)
        try:
            _state_files.made_empty(path)
        except OSError as exc:
            logger.warning("python harness: no log for turn %d: %s", request.turn, exc)
            return None, None
        limit = read_bound(self.log_bytes)
        tail = LogTail(path, request.log, streams=_python_log.STREAMS, counts=True, max_bytes=limit)
        return path, tail

    async def _run_pausing(self, kept: Any, turn: Any, request: TurnRequest) -> Any:
        """Run the turn under a :class:`TurnTimer`: time the turn spends waiting on a person
        (``request.paused_s``) does not count against ``request.timeout_s``. Reaching the
        limit cancels the run, which kills the worker process, as the worker's own timeout
        does."""
        timer = TurnTimer(request.timeout_s, request.paused_s, clock=self.clock)
        try:
            async with timer.limit() as scope:
                # The worker's own limit only backs the timer up: it cannot see the pauses.
                return await kept.worker.run(turn, request.prompt, timeout_s=_BACKSTOP_S)
        except TimeoutError:
            if not scope.expired():
                raise
            raise TurnFailedError(
                f"{timer.timeout_message()}; its worker process was killed at the turn timeout",
                timeout_s=request.timeout_s,
            ) from None

    async def reap(self, agent_id: str, state_dir: Path) -> bool:
        """A python agent's worker is this process's child and ends by itself when the daemon
        dies (see ``corral.resilience``'s process isolation): a new daemon has nothing to end,
        always False."""
        v.non_empty_str("PythonHarness.reap", "agent_id", agent_id)
        v.instance_of("PythonHarness.reap", "state_dir", state_dir, Path)
        _liveness.discard(state_dir)  # the heartbeat file of the interrupted turn
        return False

    async def terminate(self, agent_id: str, state_dir: Path) -> bool:
        """Send SIGTERM to the process group of ``agent_id``'s worker while it runs a turn
        (a graceful stop); True when one was signalled. The worker dies of it unless the
        function installed a handler (``signal.signal`` in the worker): then it may end its
        turn in its own way; the daemon kills the worker when the stop's grace has passed."""
        v.non_empty_str("PythonHarness.terminate", "agent_id", agent_id)
        kept = self._workers.get(agent_id)
        if kept is None or kept.worker.ended or not kept.worker.busy:
            return False
        pid = kept.worker.pid
        if pid is None:
            return False
        try:
            os.killpg(pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    async def release(self, agent_id: str) -> None:
        """End ``agent_id``'s worker, if one is kept (the agent has ended). A turn still in
        its worker fails (the daemon cancels an agent's turn before it releases it)."""
        v.non_empty_str("PythonHarness.release", "agent_id", agent_id)
        kept = self._workers.pop(agent_id, None)
        if kept is not None:
            kept.worker.kill()
            await kept.worker.close()

    async def end_idle(self) -> int:
        """End the workers that have had no turn for ``idle_s`` seconds (on ``clock``); how
        many were ended. Called on its own every ``idle_s / 2`` seconds while workers are
        kept."""
        now = self.clock.monotonic()
        idle = [
            agent_id
            for agent_id, kept in self._workers.items()
            if not kept.worker.busy and now - kept.used >= self.idle_s
        ]
        await self._end(idle)
        return len(idle)

    async def aclose(self) -> None:
        """End every kept worker (a turn still in one fails) and the idle sweep; the harness
        may be used again afterwards (it starts workers anew)."""
        sweeper, self._sweeper = self._sweeper, None
        if sweeper is not None:
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper
        kept = list(self._workers.values())
        self._workers.clear()
        for one in kept:
            one.worker.kill()
        await asyncio.gather(*(one.worker.close() for one in kept))

    # --- the kept workers -------------------------------------------------------------------

    async def _worker_for(self, agent_id: str) -> _Kept:
        kept = self._workers.get(agent_id)
        if kept is None or kept.worker.ended:
            over = len(self._workers) + 1 - self.max_workers
            if over > 0:
                # Least recently used first; a worker in a turn is left to finish it.
                lru = [a for a, k in self._workers.items() if not k.worker.busy][:over]
                await self._end(lru)
            worker = SandboxWorker(
                max_memory_bytes=self.max_memory_bytes, preload=self.preload, clock=self.clock
            )
            kept = _Kept(worker, self.clock.monotonic())
            self._workers[agent_id] = kept
        self._workers.move_to_end(agent_id)
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.create_task(self._sweep(), name="corral-python-idle")
        return kept

    async def _end(self, agent_ids: Sequence[str]) -> None:
        ending = [self._workers.pop(a) for a in agent_ids if a in self._workers]
        await asyncio.gather(*(kept.worker.close() for kept in ending))

    async def _sweep(self) -> None:
        """End idle workers every ``idle_s / 2`` seconds, until none is kept."""
        while self._workers:
            await self.clock.sleep(self.idle_s / 2)
            try:
                await self.end_idle()
            except Exception:
                logger.exception("python harness: could not end idle workers")


@dataclass(slots=True)
class _Kept:
    """An agent's worker and when its last turn ended (on the harness's clock)."""

    worker: SandboxWorker
    used: float


# --- the worker's side --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Failed:
    """A failed turn as the worker sends it back (exceptions do not always pickle)."""

    message: str
    usage: dict[str, Any] | None
    details: dict[str, Any]
    dimension: str | None = None


@dataclass(frozen=True, slots=True)
class _Turn:
    """One turn, sent to the worker process: ``_Turn(target, context, ...)(prompt)``; what
    the function prints and logs goes to ``log_file`` (None: nowhere new), at most
    ``log_bytes`` of it."""

    target: str
    context: TurnContext
    log_file: Path | None = None
    log_bytes: int = DEFAULT_LOG_BYTES

    def __call__(
        self, prompt: str
    ) -> TurnResult | _Failed | Coroutine[Any, Any, TurnResult | _Failed]:
        """The turn's outcome; for a coroutine function (or an awaitable result), a coroutine
        the worker runs to its end on its own event loop, giving the outcome."""
        target = self.target
        captured = contextlib.ExitStack()
        captured.enter_context(_python_log.capturing(self.log_file, self.log_bytes))
        try:
            function = _resolve(target)
            result = function(str(prompt), self.context)
            if inspect.isawaitable(result):
                finish = self._finish(result, captured)
                captured = contextlib.ExitStack()  # the coroutine ends the capture
                return finish
            return _settled(target, result)
        except BaseException as exc:
            return _caught(target, exc)
        finally:
            captured.close()

    async def _finish(self, result: Any, captured: contextlib.ExitStack) -> TurnResult | _Failed:
        with captured:
            try:
                value = await result
            except BaseException as exc:
                return _caught(self.target, exc)
            return _settled(self.target, value)


def _settled(target: str, result: Any) -> TurnResult | _Failed:
    try:
        return _result(target, result)
    except TurnFailedError as exc:
        return _caught(target, exc)


def _caught(target: str, exc: BaseException) -> _Failed:
    """The failed turn an exception from the function stands for."""
    if isinstance(exc, TurnFailedError):
        kept = ("message", "retryable", "dimension")
        details = {k: v for k, v in exc.details.items() if k not in kept}
        return _Failed(exc.message, exc.usage, details, exc.dimension)
    if isinstance(exc, MemoryError):
        raise exc  # the worker reports it against the memory limit
    failed = _raised(target, exc)  # SystemExit and KeyboardInterrupt are the agent's too
    return _Failed(failed.message, None, dict(failed.details))


def _resolve(target: str) -> Callable[..., Any]:
    module_name, _, name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except BaseException as exc:
        raise TurnFailedError(
            f"could not import module {module_name!r} of function {target!r} in the worker "
            f"process: {type(exc).__name__}: {exc}",
            function=target,
        ) from None
    function = getattr(module, name, None)
    if function is None:
        raise TurnFailedError(
            f"module {module_name!r} has no attribute {name!r} (function {target!r})",
            function=target,
        )
    if not callable(function):
        raise TurnFailedError(
            f"{target!r} is a {type(function).__name__}, not a function", function=target
        )
    return function  # type: ignore[no-any-return]


# --- the daemon's side --------------------------------------------------------------------


def _worker_failed(target: str, error: SandboxError, timeout_s: float) -> TurnFailedError:
    """The failed turn a worker process that did not answer stands for."""
    where = f"function {target!r}"
    if isinstance(error, SandboxTimeoutError):
        return TurnFailedError(
            f"turn timed out after {timeout_s:g} s ({where}); its worker process was killed "
            "at the turn timeout",
            timeout_s=timeout_s,
            function=target,
        )
    if isinstance(error, SandboxMemoryError):
        return TurnFailedError(
            f"{where} went over its memory limit of {error.max_memory_bytes} bytes "
            f"({error.detail}); its worker process was stopped",
            function=target,
            max_memory_bytes=error.max_memory_bytes,
        )
    if isinstance(error, SandboxInterruptedError):
        code = error.details.get("exitcode")
        if isinstance(code, int) and code < 0:
            try:
                how = f"was killed by signal {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        elif code is None:
            how = "ended without an exit status"
        else:
            how = f"exited with code {code}"
        return TurnFailedError(
            f"the worker process of {where} {how} before the turn ended",
            function=target,
            exit_code=code,
        )
    if isinstance(error, SandboxStartError):
        return TurnFailedError(
            f"could not start a worker process for {where}: {error.why}", function=target
        )
    message = getattr(error, "error_message", error.message)
    return TurnFailedError(f"{where}: {message}", function=target)


def _raised(target: str, exc: BaseException) -> TurnFailedError:
    return TurnFailedError(
        f"function {target!r} raised {type(exc).__name__}: {exc}",
        function=target,
        exception=type(exc).__name__,
    )


def _result(target: str, result: Any) -> TurnResult:
    if isinstance(result, str):
        return TurnResult(output=str(result))
    if not isinstance(result, dict):
        raise TurnFailedError(
            f"function {target!r} returned {_shown(result)}; expected a str or a dict "
            '{"output": str, "tokens": int, "costUsd": float}',
            function=target,
        )
    problems: list[str] = []
    extra = sorted(str(k) for k in result if k not in _RESULT_KEYS)
    if extra:
        problems.append(f"unknown keys {extra}")
    output = result.get("output")
    if not isinstance(output, str):
        problems.append(f"'output' must be a str, got {_shown(output)}")
    tokens = result.get("tokens", 0)
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        problems.append(f"'tokens' must be an int >= 0, got {_shown(tokens)}")
    cost = result.get("costUsd", 0.0)
    if cost is not None and (
        isinstance(cost, bool)
        or not isinstance(cost, int | float)
        or not math.isfinite(cost)
        or cost < 0
    ):
        problems.append(f"'costUsd' must be a finite number >= 0 or null, got {_shown(cost)}")
    if problems:
        raise TurnFailedError(
            f"function {target!r} returned a dict that is not a turn result: "
            + "; ".join(problems),
            function=target,
        )
    assert isinstance(output, str)
    assert isinstance(tokens, int)
    return TurnResult(output=output, tokens=tokens, cost_usd=None if cost is None else float(cost))


def _shown(value: Any) -> str:
    text = repr(value)
    if len(text) > 200:
        text = text[:200] + "..."
    return f"{type(value).__name__} {text}"
