"""The middleware seam: ``Middleware``, ``MiddlewareContext`` and ``MiddlewarePipeline``.

A middleware wraps one call at one stage (a TURN, a CHAT model call, a TOOL call): work before,
``await call_next()`` to go inward, work after. The pipeline runs the middlewares in the order
given, the first one outermost, with the caller's handler innermost.
"""

from __future__ import annotations

import contextvars
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import CodeType, CoroutineType, FrameType, MethodType
from typing import Any, Protocol, runtime_checkable

from corral.kernel import (
    ChatMessage,
    InvalidArgumentError,
    MiddlewareStage,
    RunMeta,
    ToolCall,
    UsageError,
)
from corral.kernel import _validate as v
from corral.runtime._llm import ToolSpec

CallNext = Callable[[], Awaitable[None]]
Handler = Callable[["MiddlewareContext"], Awaitable[None]]

logger = logging.getLogger("corral.runtime.middleware")

ALL_STAGES: frozenset[MiddlewareStage] = frozenset(MiddlewareStage)


@runtime_checkable
class Middleware(Protocol):
    """An interceptor around one call.

    ``process`` does its work before, awaits ``call_next()`` to run the rest of the chain, and
    does its work after. Not awaiting ``call_next`` short-circuits the call (the middleware
    sets ``ctx.result`` itself); awaiting it again re-runs the inner chain. Raise to abort,
    typically with ``corral.kernel.MiddlewareTermination``.

    A middleware may also carry ``stages: frozenset[MiddlewareStage]``; without it, it runs at
    every stage. The pipeline reads ``stages`` once, when it is built.
    """

    async def process(self, ctx: MiddlewareContext, call_next: CallNext) -> None: ...


@dataclass(slots=True, kw_only=True)
class MiddlewareContext:
    """What a middleware sees of one call; mutable, one per call.

    - ``messages``: at CHAT the request sent to the model (a middleware may replace the list;
      it must never mutate a list it did not create); at TURN the conversation so far.
    - ``tools``, ``options``: the tools offered and the model options (CHAT).
    - ``prompt``: the input of a TURN.
    - ``tool_name``, ``tool_call_id``, ``arguments``: the tool call (TOOL).
    - ``result``: set by the handler or by a short-circuiting middleware: a ``ChatResult`` at
      CHAT, the tool's output (``str``) at TOOL, the final answer at TURN.
    - ``metadata``: free-form notes middlewares leave for one another and for the caller.

    Raises ``InvalidArgumentError`` at construction for a field of the wrong type.
    """

    stage: MiddlewareStage
    agent_id: str
    meta: RunMeta
    messages: list[ChatMessage] = field(default_factory=list)
    tools: list[ToolSpec] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    prompt: str | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)
    result: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        where = "MiddlewareContext"
        self.stage = _stage(where, "stage", self.stage)
        v.non_empty_str(where, "agent_id", self.agent_id)
        v.instance_of(where, "meta", self.meta, RunMeta)
        v.instance_of(where, "messages", self.messages, list)
        v.instance_of(where, "tools", self.tools, list)
        v.instance_of(where, "options", self.options, dict)
        v.instance_of(where, "arguments", self.arguments, dict)
        v.instance_of(where, "metadata", self.metadata, dict)
        if self.prompt is not None and not isinstance(self.prompt, str):
            raise InvalidArgumentError(where, "prompt", "a string or None", self.prompt)
        v.non_empty_str(where, "tool_name", self.tool_name, optional=True)
        v.non_empty_str(where, "tool_call_id", self.tool_call_id, optional=True)

    @classmethod
    def turn(
        cls,
        agent_id: str,
        meta: RunMeta,
        prompt: str,
        *,
        messages: Sequence[ChatMessage] = (),
        metadata: Mapping[str, Any] | None = None,
    ) -> MiddlewareContext:
        """A TURN context for ``prompt`` (``messages`` is copied into a new list)."""
        return cls(
            stage=MiddlewareStage.TURN,
            agent_id=agent_id,
            meta=meta,
            prompt=prompt,
            messages=list(messages),
            metadata=dict(metadata or {}),
        )

    @classmethod
    def chat(
        cls,
        agent_id: str,
        meta: RunMeta,
        messages: Sequence[ChatMessage],
        *,
        tools: Sequence[ToolSpec] = (),
        options: Mapping[str, Any] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> MiddlewareContext:
        """A CHAT context; ``messages``, ``tools`` and ``options`` are copied."""
        return cls(
            stage=MiddlewareStage.CHAT,
            agent_id=agent_id,
            meta=meta,
            messages=list(messages),
            tools=list(tools),
            options=dict(options or {}),
            metadata=dict(metadata or {}),
        )

    @classmethod
    def tool(
        cls,
        agent_id: str,
        meta: RunMeta,
        tool_name: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        tool_call_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> MiddlewareContext:
        """A TOOL context; ``arguments`` is copied."""
        return cls(
            stage=MiddlewareStage.TOOL,
            agent_id=agent_id,
            meta=meta,
            tool_name=tool_name,
            tool_call_id=tool_call_id,
            arguments=dict(arguments or {}),
            metadata=dict(metadata or {}),
        )

    @classmethod
    def from_tool_call(
        cls,
        agent_id: str,
        meta: RunMeta,
        call: ToolCall,
        *,
        metadata: Mapping[str, Any] | None = None,
    ) -> MiddlewareContext:
        """A TOOL context for a model's ``ToolCall``."""
        v.instance_of("MiddlewareContext.from_tool_call", "call", call, ToolCall)
        return cls.tool(
            agent_id, meta, call.name, call.arguments, tool_call_id=call.id, metadata=metadata
        )


# --- the pipeline -------------------------------------------------------------------------

# The run in progress in this asyncio context: [ctx, handler, last handler awaitable]. The
# per-layer ``call_next`` callables are built once per pipeline and read the call from here,
# so a call allocates no closure or partial per layer. Tasks copy the context when created,
# so concurrent runs (and runs nested in a handler) each see their own entry.
_RUN: contextvars.ContextVar[list[Any]] = contextvars.ContextVar("corral_middleware_run")
_get_run = _RUN.get


def _outside_run() -> UsageError:
    return UsageError(
        "call_next was called outside the pipeline run it belongs to (after the run ended, "
        "or from a thread); call it from the middleware's process, or from a task it starts"
    )


def _call_handler() -> Awaitable[None]:
    try:
        run = _get_run()
    except LookupError:
        raise _outside_run() from None
    awaitable = run[1](run[0])
    if type(awaitable) is not CoroutineType:
        awaitable = _await(awaitable)
    run[2] = awaitable  # its code object tells handler frames apart in a traceback
    return awaitable  # type: ignore[no-any-return]


async def _await(awaitable: Awaitable[None]) -> None:
    await awaitable


_HANDLER_CODES = frozenset({_call_handler.__code__, _await.__code__})


def _layer(
    process: Callable[[MiddlewareContext, CallNext], Awaitable[None]], inner: CallNext
) -> CallNext:
    def call_next() -> Awaitable[None]:
        try:
            ctx = _get_run()[0]
        except LookupError:
            raise _outside_run() from None
        return process(ctx, inner)

    return call_next


class _Chain:
    """The middlewares of one stage, with their ``call_next`` callables built once."""

    __slots__ = ("by_code", "call_next", "first", "layers", "stage")

    def __init__(self, stage: MiddlewareStage, layers: tuple[Middleware, ...]) -> None:
        self.stage = stage
        self.layers = layers
        self.first: Callable[[MiddlewareContext, CallNext], Awaitable[None]] | None = None
        self.call_next: CallNext = _call_handler
        if layers:
            self.first = layers[0].process
            for mw in reversed(layers[1:]):
                self.call_next = _layer(mw.process, self.call_next)
        # code object of each layer's ``process`` -> the positions that use it
        self.by_code: dict[CodeType, list[int]] = {}
        for position, mw in enumerate(layers):
            code = _code_of(mw.process)
            if code is not None:
                self.by_code.setdefault(code, []).append(position)

    def annotate(self, exc: BaseException, handler_awaitable: object) -> None:
        """Add a note naming the layer that raised ``exc``; none when the handler raised it.

        The traceback runs from the pipeline's frame inward: layers appear in order, each
        layer's frame followed by the frames it called. The innermost layer frame met before
        any handler frame is the one that raised. Reading the traceback once, on the error
        path, keeps the success path free of a try block per layer. A layer whose ``process``
        is not a Python function cannot be recognised there and is never named.
        """
        handler_code = getattr(handler_awaitable, "cr_code", None)
        tb = exc.__traceback__
        tb = tb.tb_next if tb is not None else None  # the pipeline's own frame
        found: int | None = None
        while tb is not None:
            code = tb.tb_frame.f_code
            if code is handler_code or code in _HANDLER_CODES:
                return
            positions = self.by_code.get(code)
            if positions is not None:
                found = self._position(tb.tb_frame, code, positions)
            tb = tb.tb_next
        if found is None:
            return
        mw = self.layers[found]
        note = (
            f"raised by middleware {type(mw).__name__} at the {self.stage.value} stage "
            f"(layer {found + 1} of {len(self.layers)})"
        )
        if note not in getattr(exc, "__notes__", ()):
            exc.add_note(note)

    def _position(self, frame: FrameType, code: CodeType, positions: list[int]) -> int:
        if len(positions) == 1 or not code.co_varnames:
            return positions[0]
        owner = frame.f_locals.get(code.co_varnames[0])
        for position in positions:
            if getattr(self.layers[position].process, "__self__", None) is owner:
                return position
        return positions[0]


def _code_of(fn: Any) -> CodeType | None:
    if isinstance(fn, MethodType):
        fn = fn.__func__
    code = getattr(fn, "__code__", None)
    return code if isinstance(code, CodeType) else None


class MiddlewarePipeline:
    """Runs middlewares around a handler, the first middleware outermost.

    Each middleware runs only at the stages it declares (``stages``; all when absent); the
    per-stage chains are fixed at construction, so a skipped middleware costs nothing per call.

    :meth:`run` returns ``ctx.result``. Exceptions propagate unchanged (never wrapped;
    ``asyncio.CancelledError`` untouched); an ``Exception`` raised by a middleware (not by
    the handler, not by another pipeline nested in it) gets one PEP 678 note naming that
    middleware, and only that one. Safe to share between concurrent runs.
    """

    __slots__ = ("_chains", "_middlewares")

    def __init__(self, middlewares: Iterable[Middleware] = ()) -> None:
        where = "MiddlewarePipeline"
        given: object = middlewares
        if isinstance(given, str | bytes) or not isinstance(given, Iterable):
            raise InvalidArgumentError(where, "middlewares", "an iterable of Middleware", given)
        items: tuple[Middleware, ...] = tuple(given)
        staged: list[tuple[Middleware, frozenset[MiddlewareStage]]] = []
        for mw in items:
            if not callable(getattr(mw, "process", None)):
                raise InvalidArgumentError(
                    where, "middlewares[]", "a Middleware (with process)", mw
                )
            staged.append((mw, stages_of(mw)))
        self._middlewares = items
        self._chains = {
            stage: _Chain(stage, tuple(mw for mw, on in staged if stage in on))
            for stage in MiddlewareStage
        }

    @property
    def middlewares(self) -> tuple[Middleware, ...]:
        """Every middleware, in order."""
        return self._middlewares

    def for_stage(self, stage: MiddlewareStage) -> tuple[Middleware, ...]:
        """The middlewares that run at ``stage``, outermost first."""
        return self._chains[_stage("MiddlewarePipeline.for_stage", "stage", stage)].layers

    async def run(self, ctx: MiddlewareContext, handler: Handler) -> Any:
        """Run ``ctx.stage``'s chain around ``handler`` (which sets ``ctx.result``).

        Returns ``ctx.result``; raises whatever a middleware or the handler raised.
        """
        chain = self._chains[ctx.stage]
        first = chain.first
        if first is None:
            await handler(ctx)
            return ctx.result
        run = [ctx, handler, None]
        token = _RUN.set(run)
        try:
            await first(ctx, chain.call_next)
        except Exception as exc:
            try:
                chain.annotate(exc, run[2])
            except Exception:  # a note is a courtesy: never let it replace the real error
                logger.debug("could not annotate %r", exc, exc_info=True)
            raise
        finally:
            _RUN.reset(token)
        return ctx.result

    def __repr__(self) -> str:
        names = ", ".join(type(mw).__name__ for mw in self._middlewares)
        return f"MiddlewarePipeline([{names}])"


# --- helpers for middlewares --------------------------------------------------------------


def stages_of(middleware: object) -> frozenset[MiddlewareStage]:
    """The stages ``middleware`` runs at: its ``stages`` attribute, or every stage.

    Raises ``InvalidArgumentError`` when ``stages`` is not a non-empty collection of stages.
    """
    declared = getattr(middleware, "stages", None)
    if declared is None:
        return ALL_STAGES
    return stage_set(type(middleware).__name__, "stages", declared)


def stage_set(where: str, name: str, value: Any) -> frozenset[MiddlewareStage]:
    """``value`` as a non-empty frozenset of stages (names such as ``"chat"`` accepted)."""
    expected = "a non-empty set of MiddlewareStage"
    if isinstance(value, str | bytes | MiddlewareStage) or not isinstance(value, Iterable):
        raise InvalidArgumentError(where, name, expected, value)
    stages = frozenset(_stage(where, f"{name}[]", item) for item in value)
    if not stages:
        raise InvalidArgumentError(where, name, expected, value)
    return stages


def _stage(where: str, name: str, value: Any) -> MiddlewareStage:
    if isinstance(value, MiddlewareStage):
        return value
    try:
        return MiddlewareStage(value)
    except ValueError:
        raise InvalidArgumentError(where, name, "one of turn, chat, tool", value) from None


async def maybe_await(value: Any) -> Any:
    """``value``, awaited first when it is awaitable (for plain-or-async callbacks)."""
    if inspect.isawaitable(value):
        return await value
    return value
