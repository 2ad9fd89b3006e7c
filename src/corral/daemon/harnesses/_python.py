"""``PythonHarness``: one turn is one call of a Python function named ``module:function``,
made in a worker process of its own so that nothing the function does can take the daemon
down."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import math
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corral.daemon.harnesses._base import TurnFailedError, TurnRequest, TurnResult
from corral.kernel import InvalidArgumentError
from corral.kernel import _validate as v
from corral.resilience import (
    SandboxConfig,
    SandboxError,
    SandboxInterruptedError,
    SandboxMemoryError,
    SandboxStartError,
    SandboxTimeoutError,
    run_sandboxed,
)

_RESULT_KEYS = frozenset({"output", "tokens", "costUsd"})

DEFAULT_MAX_MEMORY_BYTES = 1024**3
"""A worker process's address-space limit unless told: 1 GiB."""

PRELOAD = ("corral.daemon",)
"""What the worker processes' fork server imports once (what agent modules usually import)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnContext:
    """What a python-harness function is told about its turn (its second argument).

    ``env`` is the spec's ``env`` with the request's ``env`` on top (the worker process's
    own environment, ``os.environ``, is the daemon's).
    """

    agent_id: str
    turn: int
    workdir: Path
    env: Mapping[str, str] = field(default_factory=dict)


class PythonHarness:
    """Calls ``spec.function`` (``package.module:function``) as ``function(prompt, context)``
    in a worker process.

    ``context`` is a :class:`TurnContext`. Each turn runs in a fresh process (through
    :func:`corral.resilience.run_sandboxed` with ``isolation="process"``), forked from a
    server that has imported ``corral.daemon`` once; the process imports the function's
    module, calls it and sends its result back. A coroutine function is run to its end with
    ``asyncio.run``; a plain function is called (its result may be an awaitable, which is
    then run too). The function returns the output as a ``str``, or a dict ``{"output": str,
    "tokens": int, "costUsd": float | None}`` (``tokens`` and ``costUsd`` optional, 0 by
    default; no other keys), or raises :class:`TurnFailedError` itself to report a failure
    with its usage.

    Nothing the function does reaches the daemon: its process is limited to
    ``max_memory_bytes`` of address space, and is killed (its whole process group) at the
    turn's timeout and when the turn is cancelled (a stop, a shutdown). A fresh process per
    turn means module state does not outlive a turn: keep what must last in ``workdir``.

    Failed turns (:class:`TurnFailedError`): the module cannot be imported in the worker
    (any error raised while importing it) or has no such callable; the function raises (the
    message names the exception type and its message; ``SystemExit`` and
    ``KeyboardInterrupt`` included); it returns anything else, or something that cannot be
    sent back (the message says what); it runs longer than ``request.timeout_s`` ("turn
    timed out after N s", its process killed); it goes over its memory limit ("over its
    memory limit of N bytes"); its process ends without answering ("worker process exited
    with code N", "was killed by signal SIGSEGV": ``os._exit``, a crash in C code).
    """

    def __init__(
        self,
        *,
        max_memory_bytes: int = DEFAULT_MAX_MEMORY_BYTES,
        preload: Sequence[str] = PRELOAD,
    ) -> None:
        v.non_negative_int("PythonHarness", "max_memory_bytes", max_memory_bytes)
        self.max_memory_bytes = max_memory_bytes
        self.preload = tuple(preload)

    def __repr__(self) -> str:
        return f"PythonHarness(max_memory_bytes={self.max_memory_bytes})"

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
        context = TurnContext(
            agent_id=request.agent_id,
            turn=request.turn,
            workdir=request.workdir,
            env={**request.spec.env, **request.env},
        )
        config = SandboxConfig(
            timeout_s=request.timeout_s,
            max_memory_bytes=self.max_memory_bytes,
            isolation="process",
            preload=self.preload,
        )
        ran = await run_sandboxed(_Turn(target, context), request.prompt, config)
        if ran.error is not None:
            raise _worker_failed(target, ran.error, request.timeout_s)
        outcome = ran.result
        if isinstance(outcome, TurnResult):
            return outcome
        assert isinstance(outcome, _Failed)
        raise TurnFailedError(
            outcome.message, usage=outcome.usage, dimension=outcome.dimension, **outcome.details
        )

    async def reap(self, agent_id: str, state_dir: Path) -> bool:
        """A python turn's worker ends with its turn, and by itself when the daemon dies
        (see ``corral.resilience``'s process isolation): always False."""
        v.non_empty_str("PythonHarness.reap", "agent_id", agent_id)
        v.instance_of("PythonHarness.reap", "state_dir", state_dir, Path)
        return False


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
    """One turn, sent to the worker process: ``_Turn(target, context)(prompt)``."""

    target: str
    context: TurnContext

    def __call__(self, prompt: str) -> TurnResult | _Failed:
        target = self.target
        try:
            function = _resolve(target)
            if _is_async(function):
                result = asyncio.run(function(str(prompt), self.context))
            else:
                result = function(str(prompt), self.context)
                if inspect.isawaitable(result):
                    result = asyncio.run(_awaited(result))
            return _result(target, result)
        except TurnFailedError as exc:
            kept = ("message", "retryable", "dimension")
            details = {k: v for k, v in exc.details.items() if k not in kept}
            return _Failed(exc.message, exc.usage, details, exc.dimension)
        except MemoryError:
            raise  # the sandbox reports it against the memory limit
        except BaseException as exc:  # SystemExit and KeyboardInterrupt are the agent's too
            failed = _raised(target, exc)
            return _Failed(failed.message, None, dict(failed.details))


async def _awaited(value: Any) -> Any:
    return await value


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


def _is_async(function: Callable[..., Any]) -> bool:
    if inspect.iscoroutinefunction(function):
        return True
    call = getattr(function, "__call__", None)  # noqa: B004 -- an object with async __call__
    return call is not None and inspect.iscoroutinefunction(call)


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
