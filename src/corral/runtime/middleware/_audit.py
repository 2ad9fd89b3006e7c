"""``Audit``: one event per call, at every stage, success or failure."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, Literal

from corral.kernel import SYSTEM_CLOCK, Clock, CorralError, InvalidArgumentError, MiddlewareStage
from corral.kernel import _validate as v
from corral.runtime._llm import ChatResult
from corral.runtime.middleware._pipeline import CallNext, MiddlewareContext, maybe_await

logger = logging.getLogger("corral.runtime.audit")

AuditSink = Callable[["AuditEvent"], "Awaitable[None] | None"]


@dataclass(frozen=True, slots=True, kw_only=True)
class AuditEvent:
    """What happened in one call.

    ``outcome`` is ``"ok"`` or ``"error"``; ``error_code`` is the ``CorralError`` code, or the
    exception's class name for other exceptions (``"CancelledError"`` when the task was
    cancelled). ``duration_s`` is measured on the middleware's clock; ``started_at`` is the
    clock's wall time when the call began. ``model`` is the model that answered (CHAT), else
    the ``model`` option when one was given.
    """

    stage: MiddlewareStage
    agent_id: str
    run_id: str
    trace_id: str
    tenant_id: str | None
    tool_name: str | None
    model: str | None
    outcome: Literal["ok", "error"]
    error_code: str | None
    duration_s: float
    started_at: datetime

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view (``stage`` as its value, ``started_at`` in ISO 8601)."""
        data = asdict(self)
        data["stage"] = self.stage.value
        data["started_at"] = self.started_at.isoformat()
        return data


class Audit:
    """Sends one :class:`AuditEvent` to ``sink`` (plain or async) after every call ends.

    The event is sent on success and on failure; a failure still propagates unchanged. When
    the sink raises: with ``on_sink_error="log"`` the failure is logged (``logger.exception``)
    and counted in ``sink_failures``; with ``"raise"`` it propagates, unless the call itself
    failed, whose error then propagates with a note about the sink failure (and the failure
    is logged and counted as well). Runs at every stage.
    """

    __slots__ = ("_clock", "on_sink_error", "sink", "sink_failures")

    def __init__(
        self,
        sink: AuditSink,
        *,
        on_sink_error: Literal["log", "raise"] = "log",
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        v.callable_("Audit", "sink", sink)
        if on_sink_error not in ("log", "raise"):
            raise InvalidArgumentError("Audit", "on_sink_error", "'log' or 'raise'", on_sink_error)
        v.instance_of("Audit", "clock", clock, Clock)
        self.sink = sink
        self.on_sink_error = on_sink_error
        self._clock = clock
        self.sink_failures = 0

    async def process(self, ctx: MiddlewareContext, call_next: CallNext) -> None:
        clock = self._clock
        started_at = clock.now()
        start = clock.monotonic()
        try:
            await call_next()
        except BaseException as exc:
            code = exc.code if isinstance(exc, CorralError) else type(exc).__name__
            event = self._event(ctx, "error", code, clock.monotonic() - start, started_at)
            try:
                await maybe_await(self.sink(event))
            except Exception as sink_exc:
                self._sink_failed(sink_exc, event)
                if self.on_sink_error == "raise":
                    exc.add_note(
                        f"the audit sink failed too: {type(sink_exc).__name__}: {sink_exc}"
                    )
            raise
        event = self._event(ctx, "ok", None, clock.monotonic() - start, started_at)
        try:
            await maybe_await(self.sink(event))
        except Exception as sink_exc:
            self._sink_failed(sink_exc, event)
            if self.on_sink_error == "raise":
                raise

    def _sink_failed(self, exc: BaseException, event: AuditEvent) -> None:
        self.sink_failures += 1
        logger.exception(
            "audit sink %r failed for a %s call of agent %r (run %s): %s",
            self.sink,
            event.stage.value,
            event.agent_id,
            event.run_id,
            exc,
        )

    @staticmethod
    def _event(
        ctx: MiddlewareContext,
        outcome: Literal["ok", "error"],
        error_code: str | None,
        duration_s: float,
        started_at: datetime,
    ) -> AuditEvent:
        meta = ctx.meta
        result = ctx.result
        model: Any = None
        if ctx.stage is MiddlewareStage.CHAT and isinstance(result, ChatResult):
            model = result.model
        if model is None:
            model = ctx.options.get("model")
        return AuditEvent(
            stage=ctx.stage,
            agent_id=ctx.agent_id,
            run_id=meta.id,
            trace_id=meta.trace_id,
            tenant_id=meta.tenant_id,
            tool_name=ctx.tool_name,
            model=model if isinstance(model, str) else None,
            outcome=outcome,
            error_code=error_code,
            duration_s=duration_s,
            started_at=started_at,
        )

    def __repr__(self) -> str:
        return f"Audit({self.sink!r}, on_sink_error={self.on_sink_error!r})"
