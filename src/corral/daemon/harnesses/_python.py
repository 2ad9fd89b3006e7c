"""``PythonHarness``: one turn is one call of a Python function named ``module:function``."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import importlib
import inspect
import math
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corral.daemon.harnesses._base import TurnFailedError, TurnRequest, TurnResult
from corral.kernel import InvalidArgumentError
from corral.kernel import _validate as v

_RESULT_KEYS = frozenset({"output", "tokens", "costUsd"})


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnContext:
    """What a python-harness function is told about its turn (its second argument).

    ``env`` is the spec's ``env`` with the request's ``env`` on top (the daemon's own
    environment is ``os.environ``, as for any code in the process).
    """

    agent_id: str
    turn: int
    workdir: Path
    env: Mapping[str, str] = field(default_factory=dict)


class PythonHarness:
    """Calls ``spec.function`` (``package.module:function``) as ``function(prompt, context)``.

    ``context`` is a :class:`TurnContext`. A coroutine function is awaited on the daemon's
    loop; a plain function runs in a thread of its own (its result may be an awaitable, which
    is then awaited). The function returns the output as a ``str``, or a dict
    ``{"output": str, "tokens": int, "costUsd": float | None}`` (``tokens`` and ``costUsd``
    optional, 0 by default; no other keys), or raises :class:`TurnFailedError` itself to
    report a failure with its usage.

    Failed turns (:class:`TurnFailedError`): the module cannot be imported (any error raised
    while importing it) or has no such callable; the function raises (the message names the
    exception type and its message); it returns anything else (the message says what); it
    runs longer than ``request.timeout_s`` ("turn timed out after N s").

    A coroutine function that times out or whose task is cancelled is cancelled. A plain
    function cannot be stopped: on timeout or cancellation its thread runs on to its end in
    the background and its result is dropped; the thread is a daemon thread, so it does not
    hold up the process's exit. A thread of its own, rather than the loop's shared executor,
    keeps such a function from starving other work.

    Modules are imported once (Python caches them); a first import runs in a thread too.
    """

    def __repr__(self) -> str:
        return "PythonHarness()"

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
        limit = asyncio.timeout(request.timeout_s)
        try:
            async with limit:
                function = await _resolve(target)
                result = await _call(function, request.prompt, context)
        except TurnFailedError:
            raise
        except TimeoutError as exc:
            if not limit.expired():
                raise _raised(target, exc) from exc  # the function's own TimeoutError
            raise TurnFailedError(
                f"turn timed out after {request.timeout_s:g} s (function {target!r})",
                timeout_s=request.timeout_s,
                function=target,
            ) from None
        except (Exception, SystemExit) as exc:
            raise _raised(target, exc) from exc
        return _result(target, result)

    async def reap(self, agent_id: str, state_dir: Path) -> bool:
        """Nothing of a python turn survives the daemon: always False."""
        v.non_empty_str("PythonHarness.reap", "agent_id", agent_id)
        v.instance_of("PythonHarness.reap", "state_dir", state_dir, Path)
        return False


async def _resolve(target: str) -> Callable[..., Any]:
    module_name, _, name = target.partition(":")
    module = sys.modules.get(module_name)
    if module is None:
        try:
            module = await _in_thread(importlib.import_module, module_name)
        except (Exception, SystemExit) as exc:
            raise TurnFailedError(
                f"could not import module {module_name!r} of function {target!r}: "
                f"{type(exc).__name__}: {exc}",
                function=target,
            ) from exc
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


async def _call(function: Callable[..., Any], prompt: str, context: TurnContext) -> Any:
    if _is_async(function):
        result = function(prompt, context)
    else:
        result = await _in_thread(function, prompt, context)
    if inspect.isawaitable(result):
        result = await result
    return result


async def _in_thread(function: Callable[..., Any], *args: Any) -> Any:
    """Run ``function(*args)`` in a new daemon thread; its outcome comes back to the loop.

    Abandoning the await (timeout, cancellation) leaves the thread running to its end.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    run = contextvars.copy_context().run

    def settle(ok: bool, value: Any) -> None:
        if future.done():
            return  # abandoned
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)

    def main() -> None:
        try:
            value = run(function, *args)
        except BaseException as exc:
            outcome: tuple[bool, Any] = (False, _forwardable(exc))
        else:
            outcome = (True, value)
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
            loop.call_soon_threadsafe(settle, *outcome)

    threading.Thread(target=main, name=f"corral-python-turn:{function!r}"[:60], daemon=True).start()
    return await future


def _forwardable(exc: BaseException) -> BaseException:
    # A Future refuses StopIteration, and a KeyboardInterrupt raised in a worker thread is
    # not the process being interrupted: both come back as an ordinary failure.
    if isinstance(exc, Exception | SystemExit) and not isinstance(exc, StopIteration):
        return exc
    return RuntimeError(f"{type(exc).__name__}: {exc}")


def _result(target: str, result: Any) -> TurnResult:
    if isinstance(result, str):
        return TurnResult(output=result)
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
