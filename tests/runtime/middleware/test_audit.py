import asyncio
import json
import logging
from typing import Any

import pytest

from corral.kernel import (
    ChatMessage,
    InvalidArgumentError,
    MiddlewareStage,
    MiddlewareTermination,
    RunMeta,
)
from corral.runtime import (
    Audit,
    AuditEvent,
    Cancellation,
    ChatResult,
    FakeClock,
    MiddlewareContext,
    MiddlewarePipeline,
)

CHAT, TOOL, TURN = MiddlewareStage.CHAT, MiddlewareStage.TOOL, MiddlewareStage.TURN


def make_meta(clock: FakeClock) -> RunMeta:
    return RunMeta(
        cancellation=Cancellation(clock=clock), clock=clock, tenant_id="acme", trace_id="trace-9"
    )


def slow_model(clock: FakeClock, seconds: float, model: str = "m-large") -> Any:
    async def handler(ctx: MiddlewareContext) -> None:
        clock.advance(seconds)
        ctx.result = ChatResult(message=ChatMessage.assistant("hi"), model=model)

    return handler


async def test_one_ok_event_per_call_with_its_fields() -> None:
    clock = FakeClock()
    events: list[AuditEvent] = []
    audit = Audit(events.append, clock=clock)
    meta = make_meta(clock)
    started = clock.now()
    ctx = MiddlewareContext.chat("agent-1", meta, [ChatMessage.user("q")])
    await MiddlewarePipeline([audit]).run(ctx, slow_model(clock, 1.5))
    assert events == [
        AuditEvent(
            stage=CHAT,
            agent_id="agent-1",
            run_id=meta.id,
            trace_id="trace-9",
            tenant_id="acme",
            tool_name=None,
            model="m-large",
            outcome="ok",
            error_code=None,
            duration_s=1.5,
            started_at=started,
        )
    ]
    data = events[0].to_dict()
    assert json.loads(json.dumps(data))["stage"] == "chat"
    assert data["started_at"] == started.isoformat()


async def test_a_failure_is_audited_and_still_propagates() -> None:
    clock = FakeClock()
    events: list[AuditEvent] = []
    error = MiddlewareTermination("nope")

    async def refuse(ctx: MiddlewareContext) -> None:
        clock.advance(0.25)
        raise error

    ctx = MiddlewareContext.tool("agent-1", make_meta(clock), "deploy", {"env": "prod"})
    with pytest.raises(MiddlewareTermination) as info:
        await MiddlewarePipeline([Audit(events.append, clock=clock)]).run(ctx, refuse)
    assert info.value is error
    (event,) = events
    assert (event.stage, event.tool_name, event.outcome, event.error_code, event.duration_s) == (
        TOOL,
        "deploy",
        "error",
        "middleware_terminated",
        0.25,
    )


async def test_other_exceptions_are_named_by_class_and_the_model_option_is_used() -> None:
    clock = FakeClock()
    events: list[AuditEvent] = []

    async def crash(ctx: MiddlewareContext) -> None:
        raise ZeroDivisionError

    ctx = MiddlewareContext.chat("a", make_meta(clock), [], options={"model": "opt-model"})
    with pytest.raises(ZeroDivisionError):
        await MiddlewarePipeline([Audit(events.append, clock=clock)]).run(ctx, crash)
    assert (events[0].error_code, events[0].model) == ("ZeroDivisionError", "opt-model")


async def test_every_stage_is_audited_by_an_async_sink() -> None:
    clock = FakeClock()
    events: list[AuditEvent] = []

    async def sink(event: AuditEvent) -> None:
        await asyncio.sleep(0)
        events.append(event)

    audit = Audit(sink, clock=clock)
    pipeline = MiddlewarePipeline([audit])
    assert (
        pipeline.for_stage(TURN) == pipeline.for_stage(CHAT) == pipeline.for_stage(TOOL) == (audit,)
    )
    meta = make_meta(clock)

    async def answer(ctx: MiddlewareContext) -> None:
        ctx.result = "final"

    await pipeline.run(MiddlewareContext.turn("a", meta, "go"), answer)
    await pipeline.run(MiddlewareContext.tool("a", meta, "t"), answer)
    assert [(e.stage, e.outcome, e.model) for e in events] == [
        (TURN, "ok", None),
        (TOOL, "ok", None),
    ]


async def test_a_cancelled_call_is_audited_as_an_error() -> None:
    clock = FakeClock()
    events: list[AuditEvent] = []
    started = asyncio.Event()

    async def hang(ctx: MiddlewareContext) -> None:
        started.set()
        await asyncio.Event().wait()

    ctx = MiddlewareContext.chat("a", make_meta(clock), [])
    task = asyncio.create_task(
        MiddlewarePipeline([Audit(events.append, clock=clock)]).run(ctx, hang)
    )
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [(e.outcome, e.error_code) for e in events] == [("error", "CancelledError")]


async def test_a_raising_sink_is_logged_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()

    def sink(event: AuditEvent) -> None:
        raise OSError("disk full")

    audit = Audit(sink, clock=clock)
    ctx = MiddlewareContext.chat("agent-1", make_meta(clock), [])
    with caplog.at_level(logging.ERROR, logger="corral.runtime.audit"):
        result = await MiddlewarePipeline([audit]).run(ctx, slow_model(clock, 0))
    assert isinstance(result, ChatResult)
    assert audit.sink_failures == 1
    (record,) = caplog.records
    assert "audit sink" in record.getMessage()
    assert "disk full" in record.getMessage()
    assert record.exc_info is not None
    assert record.exc_info[0] is OSError


async def test_a_raising_sink_propagates_with_on_sink_error_raise() -> None:
    clock = FakeClock()

    async def sink(event: AuditEvent) -> None:
        raise OSError("disk full")

    audit = Audit(sink, on_sink_error="raise", clock=clock)
    ctx = MiddlewareContext.chat("a", make_meta(clock), [])
    with pytest.raises(OSError, match="disk full"):
        await MiddlewarePipeline([audit]).run(ctx, slow_model(clock, 0))
    assert audit.sink_failures == 1


async def test_with_raise_a_failed_call_keeps_its_error_and_notes_the_sink_failure() -> None:
    clock = FakeClock()

    def sink(event: AuditEvent) -> None:
        raise OSError("disk full")

    async def fail(ctx: MiddlewareContext) -> None:
        raise ValueError("model broke")

    audit = Audit(sink, on_sink_error="raise", clock=clock)
    ctx = MiddlewareContext.chat("a", make_meta(clock), [])
    with pytest.raises(ValueError, match="model broke") as info:
        await MiddlewarePipeline([audit]).run(ctx, fail)
    assert "the audit sink failed too: OSError: disk full" in info.value.__notes__
    assert audit.sink_failures == 1


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((None,), {}, "Audit: sink must be callable"),
        (("log",), {}, "Audit: sink must be callable"),
        ((print,), {"on_sink_error": "ignore"}, "on_sink_error must be 'log' or 'raise'"),
        ((print,), {"clock": "now"}, "Audit: clock must be a Clock"),
    ],
)
def test_bad_arguments(args: tuple[Any, ...], kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        Audit(*args, **kwargs)
