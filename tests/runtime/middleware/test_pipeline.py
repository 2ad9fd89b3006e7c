import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from corral.kernel import (
    CancellationError,
    ChatMessage,
    InvalidArgumentError,
    MiddlewareStage,
    MiddlewareTermination,
    RunMeta,
    ToolCall,
    UsageError,
)
from corral.runtime import (
    CallNext,
    Cancellation,
    CancellationCheck,
    FakeClock,
    Middleware,
    MiddlewareContext,
    MiddlewarePipeline,
    ToolSpec,
)

CHAT, TOOL, TURN = MiddlewareStage.CHAT, MiddlewareStage.TOOL, MiddlewareStage.TURN


def make_meta(clock: FakeClock | None = None) -> RunMeta:
    clock = clock or FakeClock()
    return RunMeta(cancellation=Cancellation(clock=clock), clock=clock)


def make_ctx(stage: MiddlewareStage = CHAT, **fields: Any) -> MiddlewareContext:
    return MiddlewareContext(stage=stage, agent_id="agent-1", meta=make_meta(), **fields)


class Recorder:
    """Logs before/after around call_next into a shared list."""

    def __init__(self, name: str, log: list[str], stages: frozenset[MiddlewareStage] | None = None):
        self.name = name
        self.log = log
        if stages is not None:
            self.stages = stages

    async def process(self, ctx: MiddlewareContext, call_next: CallNext) -> None:
        self.log.append(f"{self.name}:before")
        await call_next()
        self.log.append(f"{self.name}:after")


class Raiser:
    def __init__(self, exc: Exception, *, after: bool = False) -> None:
        self.exc = exc
        self.after = after

    async def process(self, ctx: MiddlewareContext, call_next: CallNext) -> None:
        if self.after:
            await call_next()
        raise self.exc


class Passthrough:
    async def process(self, ctx: MiddlewareContext, call_next: CallNext) -> None:
        await call_next()


def handler_logging(
    log: list[str], value: Any = "done"
) -> Callable[[MiddlewareContext], Awaitable[None]]:
    async def handler(ctx: MiddlewareContext) -> None:
        log.append("handler")
        ctx.result = value

    return handler


async def set_result(ctx: MiddlewareContext) -> None:
    ctx.result = "done"


def our_notes(exc: BaseException) -> list[str]:
    return [n for n in getattr(exc, "__notes__", []) if n.startswith("raised by middleware")]


# --- order, short-circuit, re-run ---------------------------------------------------------


async def test_onion_order_and_result() -> None:
    log: list[str] = []
    pipeline = MiddlewarePipeline([Recorder("a", log), Recorder("b", log), Recorder("c", log)])
    result = await pipeline.run(make_ctx(), handler_logging(log, 42))
    assert result == 42
    assert log == [
        "a:before",
        "b:before",
        "c:before",
        "handler",
        "c:after",
        "b:after",
        "a:after",
    ]


async def test_empty_pipeline_calls_the_handler() -> None:
    log: list[str] = []
    ctx = make_ctx()
    assert await MiddlewarePipeline().run(ctx, handler_logging(log)) == "done"
    assert log == ["handler"]
    assert ctx.result == "done"


async def test_short_circuit_skips_inner_middlewares_and_handler() -> None:
    log: list[str] = []

    class Hit:
        async def process(self, ctx: MiddlewareContext, call_next: CallNext) -> None:
            log.append("hit")
            ctx.result = "from cache"

    pipeline = MiddlewarePipeline([Recorder("outer", log), Hit(), Recorder("inner", log)])
    assert await pipeline.run(make_ctx(), handler_logging(log)) == "from cache"
    assert log == ["outer:before", "hit", "outer:after"]


async def test_calling_call_next_twice_reruns_the_inner_chain() -> None:
    log: list[str] = []

    class Twice:
        async def process(self, ctx: MiddlewareContext, call_next: CallNext) -> None:
            await call_next()
            await call_next()

    pipeline = MiddlewarePipeline([Twice(), Recorder("inner", log)])
    await pipeline.run(make_ctx(), handler_logging(log))
    assert log == ["inner:before", "handler", "inner:after"] * 2


async def test_a_middleware_can_replace_the_request_seen_inside() -> None:
    class Rewrite:
        async def process(self, ctx: MiddlewareContext, call_next: CallNext) -> None:
            ctx.messages = [ChatMessage.user("rewritten")]
            await call_next()

    seen: list[str | None] = []

    async def handler(ctx: MiddlewareContext) -> None:
        seen.append(ctx.messages[0].content)

    original = [ChatMessage.user("original")]
    await MiddlewarePipeline([Rewrite()]).run(make_ctx(messages=original), handler)
    assert seen == ["rewritten"]
    assert original[0].content == "original"


# --- stages -------------------------------------------------------------------------------


async def test_middlewares_run_only_at_their_declared_stages() -> None:
    log: list[str] = []
    chat_only = Recorder("chat", log, frozenset({CHAT}))
    everywhere = Recorder("all", log)
    tool_turn = Recorder("tt", log, frozenset({TOOL, TURN}))
    pipeline = MiddlewarePipeline([chat_only, everywhere, tool_turn])
    assert pipeline.for_stage(CHAT) == (chat_only, everywhere)
    assert pipeline.for_stage(TOOL) == (everywhere, tool_turn)
    assert pipeline.for_stage(TURN) == (everywhere, tool_turn)
    assert pipeline.middlewares == (chat_only, everywhere, tool_turn)

    await pipeline.run(make_ctx(TOOL, tool_name="t"), handler_logging(log))
    assert log == ["all:before", "tt:before", "handler", "tt:after", "all:after"]
    log.clear()
    await pipeline.run(make_ctx(CHAT), handler_logging(log))
    assert log == ["chat:before", "all:before", "handler", "all:after", "chat:after"]


async def test_stages_are_read_once_at_construction() -> None:
    log: list[str] = []
    mw = Recorder("m", log, frozenset({CHAT}))
    pipeline = MiddlewarePipeline([mw])
    mw.stages = frozenset({TOOL})
    await pipeline.run(make_ctx(CHAT), handler_logging(log))
    assert log == ["m:before", "handler", "m:after"]


def test_stage_names_are_accepted_and_for_stage_validates() -> None:
    mw = Recorder("m", [], frozenset({CHAT}))
    mw.stages = {"tool"}  # type: ignore[assignment]
    pipeline = MiddlewarePipeline([mw])
    assert pipeline.for_stage(TOOL) == (mw,)
    assert pipeline.for_stage("chat") == ()  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="stage must be one of turn, chat, tool"):
        pipeline.for_stage("nope")  # type: ignore[arg-type]


@pytest.mark.parametrize("stages", ["chat", frozenset(), {"chat", "bogus"}, 3, CHAT])
def test_bad_stages_attribute_is_refused(stages: Any) -> None:
    mw = Recorder("m", [])
    mw.stages = stages
    with pytest.raises(InvalidArgumentError, match="Recorder: stages"):
        MiddlewarePipeline([mw])


@pytest.mark.parametrize("bad", [None, 5, "abc"])
def test_pipeline_refuses_a_non_iterable(bad: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="MiddlewarePipeline: middlewares"):
        MiddlewarePipeline(bad)


@pytest.mark.parametrize("bad", [object(), 5, "x"])
def test_pipeline_refuses_items_without_process(bad: Any) -> None:
    with pytest.raises(InvalidArgumentError, match=r"middlewares\[\] must be a Middleware"):
        MiddlewarePipeline([Passthrough(), bad])


def test_builtins_satisfy_the_protocol() -> None:
    assert isinstance(CancellationCheck(), Middleware)
    assert isinstance(Passthrough(), Middleware)
    assert not isinstance(object(), Middleware)
    assert "Passthrough" in repr(MiddlewarePipeline([Passthrough()]))


# --- exceptions and notes -----------------------------------------------------------------


async def test_a_raising_middleware_is_named_once_and_the_error_is_unchanged() -> None:
    error = MiddlewareTermination("blocked by policy")
    pipeline = MiddlewarePipeline([Passthrough(), Raiser(error), Passthrough()])
    with pytest.raises(MiddlewareTermination) as info:
        await pipeline.run(make_ctx(), set_result)
    assert info.value is error
    assert info.value.reason == "blocked by policy"
    assert our_notes(info.value) == ["raised by middleware Raiser at the chat stage (layer 2 of 3)"]


async def test_an_error_from_a_helper_names_the_middleware_that_called_it() -> None:
    meta = make_meta()
    meta.cancellation.cancel("user stopped")
    ctx = MiddlewareContext(stage=TOOL, agent_id="a", meta=meta, tool_name="t")
    pipeline = MiddlewarePipeline([Passthrough(), CancellationCheck()])
    with pytest.raises(CancellationError, match="cancelled: user stopped") as info:
        await pipeline.run(ctx, set_result)
    assert our_notes(info.value) == [
        "raised by middleware CancellationCheck at the tool stage (layer 2 of 2)"
    ]
    assert ctx.result is None


async def test_an_error_raised_after_call_next_names_that_middleware() -> None:
    pipeline = MiddlewarePipeline([Raiser(ValueError("late"), after=True), Passthrough()])
    with pytest.raises(ValueError, match="late") as info:
        await pipeline.run(make_ctx(), set_result)
    assert our_notes(info.value) == ["raised by middleware Raiser at the chat stage (layer 1 of 2)"]


async def test_an_error_from_the_handler_gets_no_note() -> None:
    async def failing(ctx: MiddlewareContext) -> None:
        raise RuntimeError("model down")

    pipeline = MiddlewarePipeline([Passthrough(), Passthrough()])
    with pytest.raises(RuntimeError, match="model down") as info:
        await pipeline.run(make_ctx(), failing)
    assert our_notes(info.value) == []


async def test_a_handler_that_raises_before_returning_an_awaitable_gets_no_note() -> None:
    def failing(ctx: MiddlewareContext) -> Awaitable[None]:
        raise KeyError("sync")

    with pytest.raises(KeyError) as info:
        await MiddlewarePipeline([Passthrough()]).run(make_ctx(), failing)
    assert our_notes(info.value) == []


async def test_a_handler_returning_a_failed_future_gets_no_note() -> None:
    def future_handler(ctx: MiddlewareContext) -> Awaitable[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        future.set_exception(OSError("io"))
        return future

    with pytest.raises(OSError, match="io") as info:
        await MiddlewarePipeline([Passthrough()]).run(make_ctx(), future_handler)
    assert our_notes(info.value) == []


async def test_a_handler_returning_a_future_works() -> None:
    def future_handler(ctx: MiddlewareContext) -> Awaitable[None]:
        ctx.result = "via future"
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        future.set_result(None)
        return future

    assert await MiddlewarePipeline([Passthrough()]).run(make_ctx(), future_handler) == "via future"


async def test_an_error_passing_through_catching_layers_names_only_the_raiser() -> None:
    class Reraise:
        async def process(self, ctx: MiddlewareContext, call_next: CallNext) -> None:
            try:
                await call_next()
            except ValueError:
                await asyncio.sleep(0)
                raise

    pipeline = MiddlewarePipeline([Reraise(), Reraise(), Raiser(ValueError("inner"))])
    with pytest.raises(ValueError, match="inner") as info:
        await pipeline.run(make_ctx(), set_result)
    assert our_notes(info.value) == ["raised by middleware Raiser at the chat stage (layer 3 of 3)"]


async def test_a_middleware_raising_a_new_error_is_the_one_named() -> None:
    class Translate:
        async def process(self, ctx: MiddlewareContext, call_next: CallNext) -> None:
            try:
                await call_next()
            except ValueError as exc:
                raise MiddlewareTermination("translated") from exc

    pipeline = MiddlewarePipeline([Translate(), Raiser(ValueError("inner"))])
    with pytest.raises(MiddlewareTermination) as info:
        await pipeline.run(make_ctx(), set_result)
    assert our_notes(info.value) == [
        "raised by middleware Translate at the chat stage (layer 1 of 2)"
    ]
    cause = info.value.__cause__
    assert isinstance(cause, ValueError)
    assert our_notes(cause) == []


async def test_the_same_class_twice_names_the_right_layer() -> None:
    class Maybe:
        def __init__(self, fail: bool) -> None:
            self.fail = fail

        async def process(self, ctx: MiddlewareContext, call_next: CallNext) -> None:
            if self.fail:
                raise LookupError("second")
            await call_next()

    pipeline = MiddlewarePipeline([Maybe(False), Maybe(True)])
    with pytest.raises(LookupError) as info:
        await pipeline.run(make_ctx(), set_result)
    assert our_notes(info.value) == ["raised by middleware Maybe at the chat stage (layer 2 of 2)"]


async def test_nested_pipelines_sharing_a_middleware_note_once() -> None:
    class FailAtChat:
        async def process(self, ctx: MiddlewareContext, call_next: CallNext) -> None:
            if ctx.stage is CHAT:
                raise ValueError("chat refused")
            await call_next()

    shared = FailAtChat()
    pipeline = MiddlewarePipeline([Passthrough(), shared])
    meta = make_meta()

    async def turn_handler(ctx: MiddlewareContext) -> None:
        chat = MiddlewareContext.chat("agent-1", meta, [ChatMessage.user("hi")])
        await pipeline.run(chat, set_result)

    turn = MiddlewareContext.turn("agent-1", meta, "hi")
    with pytest.raises(ValueError, match="chat refused") as info:
        await pipeline.run(turn, turn_handler)
    assert our_notes(info.value) == [
        "raised by middleware FailAtChat at the chat stage (layer 2 of 2)"
    ]


async def test_cancelled_error_propagates_untouched() -> None:
    started = asyncio.Event()

    async def hang(ctx: MiddlewareContext) -> None:
        started.set()
        await asyncio.Event().wait()

    class Cancels:
        async def process(self, ctx: MiddlewareContext, call_next: CallNext) -> None:
            raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError) as info:
        await MiddlewarePipeline([Passthrough(), Cancels()]).run(make_ctx(), set_result)
    assert getattr(info.value, "__notes__", []) == []

    task = asyncio.create_task(MiddlewarePipeline([Passthrough()]).run(make_ctx(), hang))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()


# --- concurrency and the call_next binding ------------------------------------------------


async def test_concurrent_runs_each_see_their_own_context() -> None:
    gate = asyncio.Event()
    waiting = 0

    class Interleave:
        async def process(self, ctx: MiddlewareContext, call_next: CallNext) -> None:
            nonlocal waiting
            waiting += 1
            if waiting == 2:
                gate.set()
            await gate.wait()  # both runs are suspended here before either goes inward
            await call_next()

    async def echo(ctx: MiddlewareContext) -> None:
        ctx.result = ctx.agent_id

    pipeline = MiddlewarePipeline([Interleave(), Passthrough()])
    meta = make_meta()
    contexts = [MiddlewareContext(stage=CHAT, agent_id=f"agent-{i}", meta=meta) for i in range(2)]
    results = await asyncio.gather(*(pipeline.run(c, echo) for c in contexts))
    assert results == ["agent-0", "agent-1"]


async def test_an_outer_layer_can_rerun_after_a_nested_run_of_the_same_pipeline() -> None:
    calls: list[str] = []

    class RerunAtTurn:
        stages = frozenset({TURN})

        async def process(self, ctx: MiddlewareContext, call_next: CallNext) -> None:
            await call_next()
            await call_next()

    class Seen:
        async def process(self, ctx: MiddlewareContext, call_next: CallNext) -> None:
            calls.append(f"{ctx.stage.value}:{ctx.agent_id}")
            await call_next()

    pipeline = MiddlewarePipeline([RerunAtTurn(), Seen()])
    meta = make_meta()

    async def turn_handler(ctx: MiddlewareContext) -> None:
        chat = MiddlewareContext(stage=CHAT, agent_id="inner", meta=meta)
        await pipeline.run(chat, set_result)
        ctx.result = "turn done"

    turn = MiddlewareContext(stage=TURN, agent_id="outer", meta=meta, prompt="p")
    assert await pipeline.run(turn, turn_handler) == "turn done"
    assert calls == ["turn:outer", "chat:inner", "turn:outer", "chat:inner"]


async def test_call_next_may_run_in_a_task_the_middleware_starts() -> None:
    class InTask:
        async def process(self, ctx: MiddlewareContext, call_next: CallNext) -> None:
            await asyncio.create_task(call_next())  # type: ignore[arg-type]

    log: list[str] = []
    pipeline = MiddlewarePipeline([InTask(), Recorder("inner", log)])
    assert await pipeline.run(make_ctx(), handler_logging(log, "ok")) == "ok"
    assert log == ["inner:before", "handler", "inner:after"]


async def test_call_next_outside_its_run_is_a_usage_error() -> None:
    kept: list[CallNext] = []

    class Keep:
        async def process(self, ctx: MiddlewareContext, call_next: CallNext) -> None:
            kept.append(call_next)
            await call_next()

    await MiddlewarePipeline([Keep(), Passthrough()]).run(make_ctx(), set_result)
    await MiddlewarePipeline([Keep()]).run(make_ctx(), set_result)
    for call_next in kept:
        with pytest.raises(UsageError, match="call_next was called outside the pipeline run"):
            call_next()


# --- the context --------------------------------------------------------------------------


def test_convenience_constructors_set_the_stage_and_copy_their_inputs() -> None:
    meta = make_meta()
    history = [ChatMessage.user("hi")]
    spec = ToolSpec(name="search")
    options = {"temperature": 0}
    chat = MiddlewareContext.chat("a", meta, history, tools=[spec], options=options)
    assert (chat.stage, chat.messages, chat.tools, chat.options) == (CHAT, history, [spec], options)
    assert chat.messages is not history
    assert chat.options is not options
    assert chat.result is None
    assert chat.metadata == {}

    turn = MiddlewareContext.turn("a", meta, "do it", messages=history, metadata={"k": 1})
    assert (turn.stage, turn.prompt, turn.messages, turn.metadata) == (
        TURN,
        "do it",
        history,
        {"k": 1},
    )
    assert turn.messages is not history

    args = {"q": "x"}
    tool = MiddlewareContext.tool("a", meta, "search", args, tool_call_id="c1")
    assert (tool.stage, tool.tool_name, tool.tool_call_id, tool.arguments) == (
        TOOL,
        "search",
        "c1",
        args,
    )
    assert tool.arguments is not args

    call = ToolCall(id="c2", name="search", arguments={"q": "y"})
    from_call = MiddlewareContext.from_tool_call("a", meta, call)
    assert (from_call.tool_name, from_call.tool_call_id, from_call.arguments) == (
        "search",
        "c2",
        {"q": "y"},
    )


def test_the_stage_may_be_given_by_name() -> None:
    assert MiddlewareContext(stage="tool", agent_id="a", meta=make_meta()).stage is TOOL  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("stage", "bogus", "stage must be one of turn, chat, tool"),
        ("agent_id", "", "agent_id must be a non-empty string"),
        ("agent_id", 7, "agent_id must be a non-empty string"),
        ("meta", "meta", "meta must be a RunMeta"),
        ("messages", (), "messages must be a list"),
        ("tools", None, "tools must be a list"),
        ("options", [], "options must be a dict"),
        ("arguments", "x=1", "arguments must be a dict"),
        ("metadata", None, "metadata must be a dict"),
        ("prompt", 5, "prompt must be a string or None"),
        ("tool_name", "", "tool_name must be a non-empty string or None"),
        ("tool_call_id", 3, "tool_call_id must be a non-empty string or None"),
    ],
)
def test_context_refuses_wrong_fields(field: str, value: Any, message: str) -> None:
    fields: dict[str, Any] = {"stage": CHAT, "agent_id": "a", "meta": make_meta()}
    fields[field] = value
    with pytest.raises(InvalidArgumentError, match=f"MiddlewareContext: {message}"):
        MiddlewareContext(**fields)


def test_from_tool_call_refuses_other_objects() -> None:
    with pytest.raises(InvalidArgumentError, match="call must be a ToolCall"):
        MiddlewareContext.from_tool_call("a", make_meta(), {"name": "x"})  # type: ignore[arg-type]
