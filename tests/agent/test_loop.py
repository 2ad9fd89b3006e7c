"""The agent loop's rules, driven by the scripted client."""

import asyncio
import threading
from typing import Any

import pytest

from corral.agent import Agent, Tool, tool
from corral.kernel import (
    CancellationError,
    ChatMessage,
    CostUnknownError,
    DeadlineExceededError,
    ExecutionBudget,
    InvalidArgumentError,
    MiddlewareStage,
    MiddlewareTermination,
    Role,
    RunMeta,
    Supervision,
    ToolCall,
    UsageError,
)
from corral.runtime import (
    Cancellation,
    ChatResult,
    ExecutionTracker,
    FakeClock,
    MiddlewareContext,
    ScriptedClient,
    ToolGuard,
    Usage,
)

text = ScriptedClient.text_reply
call = ScriptedClient.tool_call_reply


class Verdict:
    def __init__(self, allowed: bool, reason: str | None = None) -> None:
        self.allowed = allowed
        self.reason = reason


class Recorder:
    """A middleware that records the stages it sees, in order."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def process(self, ctx: MiddlewareContext, call_next: Any) -> None:
        self.seen.append(f">{ctx.stage.value}")
        await call_next()
        self.seen.append(f"<{ctx.stage.value}")


def tool_messages(client: ScriptedClient, request: int) -> list[ChatMessage]:
    return [m for m in client.requests[request].messages if m.role is Role.TOOL]


async def test_stages_nest_turn_chat_tool() -> None:
    client = ScriptedClient([call("echo", {"text": "hi"}), text("done")])
    recorder = Recorder()

    def echo(text: str) -> str:
        return text

    run = await Agent(client, tools=[echo], middleware=[recorder]).run("go")
    assert run.output == "done"
    assert recorder.seen == [">turn", ">chat", "<chat", ">tool", "<tool", ">chat", "<chat", "<turn"]


async def test_a_refused_tool_does_not_run_and_the_model_is_told() -> None:
    ran: list[str] = []

    def delete_file(path: str) -> str:
        ran.append(path)
        return "deleted"

    def guard(agent_id: str, action: str, context: dict[str, object]) -> Verdict:
        if action.startswith("delete_file"):
            return Verdict(False, "deleting files needs a person")
        return Verdict(True)

    client = ScriptedClient([call("delete_file", {"path": "/etc/passwd"}), text("ok, I won't")])
    run = await Agent(client, tools=[delete_file], middleware=[ToolGuard(guard)]).run("clean up")

    assert ran == []
    assert run.output == "ok, I won't"
    (outcome,) = run.tool_calls
    assert outcome.status == "refused"
    assert outcome.error_code == "tool_refused"
    assert "deleting files needs a person" in outcome.output
    (seen,) = tool_messages(client, 1)
    assert seen.content == outcome.output


async def test_unknown_tool_and_bad_arguments_are_reported_to_the_model() -> None:
    def add(a: int, b: int) -> int:
        return a + b

    bad_json = ChatResult(
        message=ChatMessage.assistant(None, (ToolCall("c3", "add", {}, invalid_arguments="{a:"),))
    )
    client = ScriptedClient(
        [
            call("launch_rockets", {}),
            call("add", {"a": "two", "b": 3}),
            bad_json,
            call("add", {"a": 1, "b": 2, "c": 3}),
            text("giving up"),
        ]
    )
    run = await Agent(client, tools=[add]).run("go")
    statuses = [(o.status, o.error_code) for o in run.tool_calls]
    assert statuses == [
        ("invalid", "unknown_tool"),
        ("invalid", "tool_arguments_invalid"),
        ("invalid", "tool_arguments_invalid"),
        ("invalid", "tool_arguments_invalid"),
    ]
    assert "'launch_rockets', which does not exist" in run.tool_calls[0].output
    assert "a:" in run.tool_calls[1].output
    assert "not a JSON object" in run.tool_calls[2].output
    assert "c:" in run.tool_calls[3].output
    assert run.output == "giving up"


async def test_a_tool_that_raises_is_reported_and_the_run_goes_on() -> None:
    async def fetch(url: str) -> str:
        raise ConnectionError(f"cannot reach {url}")

    client = ScriptedClient([call("fetch", {"url": "http://x"}), text("it failed")])
    run = await Agent(client, tools=[fetch]).run("go")
    (outcome,) = run.tool_calls
    assert outcome.status == "error"
    assert outcome.error_code == "tool_failed"
    assert "ConnectionError: cannot reach http://x" in outcome.output
    assert run.output == "it failed"


async def test_sync_tools_run_off_the_event_loop() -> None:
    threads: list[int] = []

    def where() -> str:
        threads.append(threading.get_ident())
        return "ok"

    await Agent(ScriptedClient([call("where"), text("done")]), tools=[where]).run("go")
    assert threads
    assert threads[0] != threading.get_ident()


async def test_non_string_results_are_sent_as_json() -> None:
    @tool(description="Look up a user.")
    async def lookup(user_id: int) -> dict[str, object]:
        return {"id": user_id, "name": "Ada"}

    client = ScriptedClient([call("lookup", {"user_id": 7}), text("found")])
    run = await Agent(client, tools=[lookup]).run("go")
    assert run.tool_calls[0].output == '{"id": 7, "name": "Ada"}'
    assert lookup.spec.description == "Look up a user."


async def test_termination_at_the_chat_stage_ends_the_run() -> None:
    class Stop:
        async def process(self, ctx: MiddlewareContext, call_next: Any) -> None:
            if ctx.stage is MiddlewareStage.CHAT:
                raise MiddlewareTermination("content policy")
            await call_next()

    client = ScriptedClient([text("never")])
    with pytest.raises(MiddlewareTermination, match="content policy"):
        await Agent(client, middleware=[Stop()]).run("go")
    assert client.requests == []


async def test_a_raising_middleware_propagates_unchanged_with_a_note() -> None:
    class Broken:
        async def process(self, ctx: MiddlewareContext, call_next: Any) -> None:
            if ctx.stage is MiddlewareStage.CHAT:
                raise RuntimeError("bug in middleware")
            await call_next()

    with pytest.raises(RuntimeError, match="bug in middleware") as info:
        await Agent(ScriptedClient([text("x")]), middleware=[Broken()]).run("go")
    assert any("Broken" in note for note in info.value.__notes__)


async def test_short_circuit_without_a_result_is_a_usage_error() -> None:
    class Swallow:
        async def process(self, ctx: MiddlewareContext, call_next: Any) -> None:
            if ctx.stage is not MiddlewareStage.CHAT:
                await call_next()

    with pytest.raises(UsageError, match="produced no ChatResult"):
        await Agent(ScriptedClient([text("x")]), middleware=[Swallow()]).run("go")


async def test_dollar_budget_with_unknown_cost_stops_loudly() -> None:
    client = ScriptedClient([text("hi", cost_usd=None, model="mystery-1")])
    agent = Agent(client, budget=ExecutionBudget(max_cost_usd=1.0))
    with pytest.raises(CostUnknownError, match="mystery-1") as info:
        await agent.run("go")
    assert info.value.code == "cost_unknown"


async def test_budget_comes_from_the_supervision_and_a_shared_tracker() -> None:
    sup = Supervision.root("boss", execution_budget=ExecutionBudget(max_turns=3))
    tracker = ExecutionTracker(sup.execution_budget)
    client = ScriptedClient([text("one", prompt_tokens=3), text("two", prompt_tokens=4)])
    agent = Agent(client, agent_id="boss")
    await agent.run(
        "a", meta=RunMeta(cancellation=Cancellation(), supervision=sup), tracker=tracker
    )
    run = await agent.run(
        "b", meta=RunMeta(cancellation=Cancellation(), supervision=sup), tracker=tracker
    )
    assert run.run_id == sup.run_id
    assert tracker.usage().turns == 2
    assert run.usage.tokens == 7


async def test_deadline_on_the_fake_clock_interrupts_a_slow_model() -> None:
    clock = FakeClock()
    started = asyncio.Event()

    async def slow(messages: list[ChatMessage], tools: object) -> ChatResult:
        started.set()
        await clock.sleep(60)
        return text("late")

    agent = Agent(ScriptedClient([slow]), budget=ExecutionBudget(deadline_s=30), clock=clock)
    task = asyncio.create_task(agent.run("go"))
    await asyncio.wait_for(started.wait(), 5)
    clock.advance(29)
    await asyncio.sleep(0)
    assert not task.done()
    clock.advance(1)
    with pytest.raises(DeadlineExceededError):
        await asyncio.wait_for(task, 5)


async def test_history_and_instructions_lead_the_conversation() -> None:
    client = ScriptedClient([text("fine")])
    history = [ChatMessage.user("earlier"), ChatMessage.assistant("reply")]
    run = await Agent(client, instructions="be brief").run("now", history=history)
    sent = client.requests[0].messages
    assert [m.content for m in sent] == ["be brief", "earlier", "reply", "now"]
    assert [m.content for m in run.messages] == ["be brief", "earlier", "reply", "now", "fine"]


@pytest.mark.parametrize(
    ("build", "argument"),
    [
        (lambda: Agent("not a client"), "client"),  # type: ignore[arg-type]
        (lambda: Agent(ScriptedClient(), agent_id=""), "agent_id"),
        (lambda: Agent(ScriptedClient(), budget={"max_turns": 1}), "budget"),  # type: ignore[arg-type]
        (lambda: Agent(ScriptedClient(), middleware=[object()]), "middleware[]"),  # type: ignore[list-item]
        (lambda: Agent(ScriptedClient(), tools=[len, Tool(len)]), "tools"),
        (lambda: Tool(lambda *a: a, name="star"), "fn"),
        (lambda: Tool(42), "fn"),  # type: ignore[arg-type]
        (lambda: Tool(_takes_a_lock), "fn"),
        (lambda: Agent(ScriptedClient(), tools=len), "tools"),  # type: ignore[arg-type]
        (lambda: Agent(ScriptedClient(), tools="echo"), "tools"),  # type: ignore[arg-type]
        (lambda: Agent(ScriptedClient(), middleware=5), "middleware"),  # type: ignore[arg-type]
        (lambda: Agent(ScriptedClient(), model_options=5), "model_options"),  # type: ignore[arg-type]
        (lambda: Agent(ScriptedClient(), model_options={1: 2}), "model_options key"),  # type: ignore[dict-item]
        (lambda: Agent(ScriptedClient(), clock="system"), "clock"),  # type: ignore[arg-type]
    ],
)
def test_bad_construction_is_refused(build: Any, argument: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        build()
    assert info.value.argument == argument


def _takes_a_lock(lock: threading.Lock) -> str:  # pydantic cannot describe a lock
    return "locked"


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"tracker": "shared"}, "tracker"),
        ({"history": 5}, "history"),
        ({"history": "earlier"}, "history"),
        ({"history": ["earlier"]}, "history[]"),
    ],
)
async def test_bad_run_arguments_are_refused_before_any_call(
    kwargs: dict[str, Any], argument: str
) -> None:
    client = ScriptedClient([text("never")])
    with pytest.raises(InvalidArgumentError) as info:
        await Agent(client).run("go", **kwargs)
    assert info.value.where == "Agent.run"
    assert info.value.argument == argument
    assert client.requests == []


def test_a_middleware_with_bad_stages_is_refused_at_construction() -> None:
    class Odd:
        stages = "chat"  # a string, not a set of stages

        async def process(self, ctx: MiddlewareContext, call_next: Any) -> None:
            await call_next()

    with pytest.raises(InvalidArgumentError, match="Odd: stages must be a non-empty set"):
        Agent(ScriptedClient(), middleware=[Odd()])


async def test_middleware_given_as_a_generator_is_used_whole() -> None:
    recorder = Recorder()
    agent = Agent(ScriptedClient([text("done")]), middleware=(m for m in [recorder]))
    await agent.run("go")
    assert recorder.seen == [">turn", ">chat", "<chat", "<turn"]


async def test_tool_parameters_named_like_pydantic_internals_or_positional_only() -> None:
    def lookup(key: str, /, schema: str, _scope: int = 1, model_config: bool = False) -> str:
        return f"{key}|{schema}|{_scope}|{model_config}"

    t = Tool(lookup)
    assert sorted(t.spec.parameters["properties"]) == ["_scope", "key", "model_config", "schema"]
    assert t.spec.parameters["required"] == ["key", "schema"]
    assert await t.call({"key": "k", "schema": "s", "_scope": 2}) == "k|s|2|False"
    client = ScriptedClient([call("lookup", {"key": "a", "schema": "b"}), text("done")])
    run = await Agent(client, tools=[t]).run("go")
    assert [(o.status, o.output) for o in run.tool_calls] == [("ok", "a|b|1|False")]


async def test_an_object_with_an_async_call_is_awaited() -> None:
    class Fetch:
        __name__ = "fetch"

        async def __call__(self, url: str) -> str:
            await asyncio.sleep(0)
            return f"fetched {url}"

    assert await Tool(Fetch()).call({"url": "u"}) == "fetched u"


async def test_a_plain_tool_returning_an_awaitable_has_it_awaited() -> None:
    async def later(n: int) -> int:
        return n * 2

    def double(n: int) -> Any:
        return later(n)

    assert await Tool(double).call({"n": 21}) == "42"


async def test_tool_call_refuses_arguments_that_are_not_a_mapping() -> None:
    with pytest.raises(InvalidArgumentError, match=r"Tool\.call: arguments must be a Mapping"):
        await Tool(len).call(["x"])  # type: ignore[arg-type]


def _other_tasks() -> set[asyncio.Task[Any]]:
    return {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}


async def test_a_finished_run_leaves_no_task_behind() -> None:
    client = ScriptedClient([call("echo", {"text": "hi"}), text("done")])

    def echo(text: str) -> str:
        return text

    await Agent(client, tools=[echo]).run("go")
    assert _other_tasks() == set()


async def test_outside_cancellation_waits_for_the_abandoned_call_to_clean_up() -> None:
    started = asyncio.Event()
    cleaned: list[str] = []

    async def hangs(messages: list[ChatMessage], tools: object) -> ChatResult:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            for _ in range(3):  # cleanup that takes a few loop turns (closing a socket)
                await asyncio.sleep(0)
            cleaned.append("closed")
        raise AssertionError("unreachable")

    task = asyncio.create_task(Agent(ScriptedClient([hangs])).run("go"))
    await asyncio.wait_for(started.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned == ["closed"]
    assert _other_tasks() == set()


async def test_a_cancelled_token_abandons_a_tool_and_leaves_no_task() -> None:
    token = Cancellation()
    started = asyncio.Event()
    cleaned: list[str] = []

    async def wait_forever() -> str:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0)
            cleaned.append("closed")
        return "never"

    client = ScriptedClient([call("wait_forever"), text("never")])
    agent = Agent(client, tools=[wait_forever])
    task = asyncio.create_task(agent.run("go", meta=RunMeta(cancellation=token)))
    await asyncio.wait_for(started.wait(), 5)
    token.cancel("operator stop")
    with pytest.raises(CancellationError, match="operator stop"):
        await task
    assert cleaned == ["closed"]
    assert _other_tasks() == set()
    assert len(client.requests) == 1


async def test_empty_prompt_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="prompt"):
        await Agent(ScriptedClient()).run("")


async def test_usage_is_reported_for_a_successful_run() -> None:
    client = ScriptedClient(
        [
            ChatResult(
                message=ChatMessage.assistant("hi"), usage=Usage(prompt_tokens=4), cost_usd=0.5
            )
        ]
    )
    run = await Agent(client).run("go")
    assert (run.usage.tokens, run.usage.cost_usd, run.usage.turns) == (4, 0.5, 1)
