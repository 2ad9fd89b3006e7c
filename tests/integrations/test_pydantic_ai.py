"""CorralCapability: corral's supervision inside Pydantic AI agents, against the real package
with its own test models (TestModel, FunctionModel), no network."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Awaitable, Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_ai import Agent, ModelRetry, RunContext
from pydantic_ai.capabilities import AbstractCapability, ModelFallback
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel
from pydantic_ai.usage import RequestUsage

from corral.gateway import Gateway
from corral.guard import AgentGroup, ApprovalRequest, GuardrailResult, HumanApproval, Supervisor
from corral.integrations import Oversight
from corral.integrations.pydantic_ai import CorralCapability
from corral.kernel import (
    BudgetExhaustedError,
    CancellationError,
    CostUnknownError,
    DeadlineExceededError,
    ExecutionBudget,
    InvalidArgumentError,
)
from corral.runtime import Cancellation, FakeClock, ModelPrice

Respond = Callable[[list[ModelMessage], AgentInfo], Awaitable[ModelResponse]]


class NoRefunds:
    name = "no-refunds"

    def __init__(self) -> None:
        self.seen: list[str] = []

    def check(self, agent_id: str, action: str, context: Any) -> GuardrailResult:
        self.seen.append(action)
        if action.startswith("refund"):
            return GuardrailResult.blocked("refunds need a person")
        return GuardrailResult.allow()


def calls_then_answers(*calls: tuple[str, dict[str, Any]]) -> tuple[Respond, list[ModelRequest]]:
    """A FunctionModel function: one tool call per step, then a text answer; and the
    requests it was sent (to read what the model was told)."""
    seen: list[ModelRequest] = []

    async def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        last = messages[-1]
        assert isinstance(last, ModelRequest)
        seen.append(last)
        step = len(seen) - 1
        if step < len(calls):
            name, args = calls[step]
            return ModelResponse(parts=[ToolCallPart(name, args, tool_call_id=f"c{step}")])
        return ModelResponse(parts=[TextPart("done")])

    return respond, seen


def tool_returns(request: ModelRequest) -> list[ToolReturnPart]:
    return [part for part in request.parts if isinstance(part, ToolReturnPart)]


def forever(
    tool: str, *, input_tokens: int, output_tokens: int, cost: Decimal | None = None
) -> tuple[Respond, list[int]]:
    """A runaway model: it calls ``tool`` at every step and never answers, each response
    costing the given tokens (and ``cost``, as a priced provider reports one)."""
    made: list[int] = []

    async def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        made.append(1)
        usage = RequestUsage(input_tokens=input_tokens, output_tokens=output_tokens, cost=cost)
        return ModelResponse(
            parts=[ToolCallPart(tool, {"query": f"attempt {len(made)}"})], usage=usage
        )

    return respond, made


def search_agent(respond: Respond, corral: CorralCapability, *, name: str = "looper") -> Agent:
    agent = Agent(FunctionModel(respond, model_name=name), capabilities=[corral])

    @agent.tool_plain
    def search(query: str) -> str:
        """Search the knowledge base."""
        return f"3 documents about {query}"

    return agent


# --- tool calls ---------------------------------------------------------------------------


async def test_a_refused_tool_does_not_run_and_the_model_reads_why() -> None:
    guard = NoRefunds()
    corral = CorralCapability(agent_id="a1", supervisor=Supervisor(AgentGroup("g"), [guard]))
    respond, seen = calls_then_answers(("refund", {"order_id": 7}), ("lookup", {"order_id": 7}))
    agent = Agent(FunctionModel(respond), capabilities=[corral])
    ran: list[str] = []

    @agent.tool_plain
    def refund(order_id: int) -> str:
        ran.append("refund")
        return "refunded"

    @agent.tool_plain
    def lookup(order_id: int) -> str:
        ran.append("lookup")
        return "paid"

    result = await agent.run("refund order 7")
    assert result.output == "done"  # the run went on after the refusal
    assert ran == ["lookup"]
    [refused] = tool_returns(seen[1])
    assert refused.outcome == "failed"
    assert refused.content == "tool 'refund' refused: refunds need a person"
    [allowed] = tool_returns(seen[2])
    assert (allowed.outcome, allowed.content) == ("success", "paid")
    # the action text corral's own loop uses: the same guardrail rules match
    assert guard.seen == ['refund {"order_id": 7}', 'lookup {"order_id": 7}']


class Order(BaseModel):
    id: int
    reason: str


async def test_the_guard_reads_validated_arguments_as_json() -> None:
    guard = NoRefunds()
    corral = CorralCapability(supervisor=Supervisor(AgentGroup("g"), [guard]))
    respond, _ = calls_then_answers(("inspect", {"order": {"id": "7", "reason": "late"}}))
    agent = Agent(FunctionModel(respond), capabilities=[corral])

    @agent.tool_plain
    def inspect(order: Order) -> str:
        return order.reason

    await agent.run("go")
    assert guard.seen == ['inspect {"order": {"id": 7, "reason": "late"}}']


async def test_a_person_approves_one_call_and_refuses_another() -> None:
    asked: asyncio.Queue[ApprovalRequest] = asyncio.Queue()
    approval = HumanApproval({"refund"}, asked.put_nowait, timeout_s=300)
    corral = CorralCapability(agent_id="a1", supervisor=Supervisor(AgentGroup("g"), [approval]))
    respond, seen = calls_then_answers(("refund", {"order_id": 7}), ("refund", {"order_id": 8}))
    agent = Agent(FunctionModel(respond), capabilities=[corral])
    refunded: list[int] = []

    @agent.tool_plain
    def refund(order_id: int) -> str:
        refunded.append(order_id)
        return f"order {order_id} refunded"

    run = asyncio.ensure_future(agent.run("refund orders 7 and 8"))
    first = await asyncio.wait_for(asked.get(), 10)
    assert (first.agent_id, first.action) == ("a1", 'refund {"order_id": 7}')
    assert refunded == []  # the call waits for the person
    first.approve()
    second = await asyncio.wait_for(asked.get(), 10)
    assert second.action == 'refund {"order_id": 8}'
    second.deny()
    assert (await asyncio.wait_for(run, 10)).output == "done"
    assert refunded == [7]
    [approved] = tool_returns(seen[1])
    assert approved.content == "order 7 refunded"
    [denied] = tool_returns(seen[2])
    assert denied.outcome == "failed"
    assert str(denied.content).startswith("tool 'refund' refused:")


async def test_no_answer_before_the_timeout_refuses_the_call() -> None:
    clock = FakeClock()
    asked: asyncio.Queue[ApprovalRequest] = asyncio.Queue()
    approval = HumanApproval({"refund"}, asked.put_nowait, timeout_s=60, clock=clock)
    corral = CorralCapability(supervisor=Supervisor(AgentGroup("g"), [approval]), clock=clock)
    respond, seen = calls_then_answers(("refund", {"order_id": 7}))
    agent = Agent(FunctionModel(respond), capabilities=[corral])

    @agent.tool_plain
    def refund(order_id: int) -> str:
        raise AssertionError("must not run")

    run = asyncio.ensure_future(agent.run("refund order 7"))
    await asyncio.wait_for(asked.get(), 10)
    clock.advance(60)
    assert (await asyncio.wait_for(run, 10)).output == "done"
    [refused] = tool_returns(seen[1])
    assert "timed out after 60" in str(refused.content)


# --- budgets ------------------------------------------------------------------------------


async def test_a_token_budget_stops_a_runaway_tool_loop() -> None:
    corral = CorralCapability(budget=ExecutionBudget(max_tokens=1_000))
    respond, made = forever("search", input_tokens=350, output_tokens=50)
    with pytest.raises(BudgetExhaustedError) as caught:
        await search_agent(respond, corral).run("find everything")
    assert (caught.value.dimension, caught.value.limit, caught.value.used) == ("tokens", 1000, 1200)
    assert len(made) == 3
    assert (corral.usage().tokens, corral.usage().turns) == (1200, 3)


async def test_a_dollar_budget_stops_a_runaway_tool_loop() -> None:
    # 350 input tokens at $1000/Mtok and 50 output at $2000/Mtok: $0.45 a step
    corral = CorralCapability(
        budget=ExecutionBudget(max_cost_usd=1.0), prices={"looper": ModelPrice(1000.0, 2000.0)}
    )
    respond, made = forever("search", input_tokens=350, output_tokens=50)
    with pytest.raises(BudgetExhaustedError) as caught:
        await search_agent(respond, corral).run("find everything")
    assert caught.value.dimension == "cost_usd"
    assert caught.value.used == pytest.approx(1.35)
    assert len(made) == 3


async def test_the_cost_pydantic_ai_reports_is_used_as_is() -> None:
    corral = CorralCapability(budget=ExecutionBudget(max_cost_usd=0.6))  # no prices at all
    respond, made = forever("search", input_tokens=10, output_tokens=5, cost=Decimal("0.25"))
    with pytest.raises(BudgetExhaustedError) as caught:
        await search_agent(respond, corral).run("find everything")
    assert caught.value.dimension == "cost_usd"
    assert caught.value.used == pytest.approx(0.75)
    assert len(made) == 3


async def test_a_dollar_budget_without_a_price_stops_with_cost_unknown() -> None:
    corral = CorralCapability(budget=ExecutionBudget(max_cost_usd=5.0))
    respond, made = forever("search", input_tokens=350, output_tokens=50)
    with pytest.raises(CostUnknownError, match="'mystery'"):
        await search_agent(respond, corral, name="mystery").run("find everything")
    assert len(made) == 1
    assert corral.usage().tokens == 400  # spent all the same


async def test_tokens_are_pydantic_ais_input_and_output_cache_and_reasoning_included() -> None:
    async def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        usage = RequestUsage(
            input_tokens=1000,  # of which 800 read from the cache, 100 written to it
            cache_read_tokens=800,
            cache_write_tokens=100,
            output_tokens=60,  # of which 40 reasoning
            output_reasoning_tokens=40,
        )
        return ModelResponse(parts=[TextPart("ok")], usage=usage)

    corral = CorralCapability(prices={"m": ModelPrice(1.0, 10.0)})
    agent = Agent(FunctionModel(respond, model_name="m"), capabilities=[corral])
    await agent.run("hi")
    assert (corral.usage().tokens, corral.usage().turns) == (1060, 1)
    assert corral.usage().cost_usd == pytest.approx((1000 * 1.0 + 60 * 10.0) / 1e6)


async def test_a_turn_budget_counts_steps_and_one_capability_spans_runs() -> None:
    corral = CorralCapability(budget=ExecutionBudget(max_turns=3))
    agent = Agent(TestModel(call_tools=[]), capabilities=[corral])
    for _ in range(3):
        await agent.run("hi")
    with pytest.raises(BudgetExhaustedError, match="turns"):
        await agent.run("once more")


async def test_a_model_that_fails_still_counts_a_turn() -> None:
    async def down(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        raise ConnectionError("model down")

    corral = CorralCapability(budget=ExecutionBudget(max_turns=1))
    agent = Agent(FunctionModel(down), capabilities=[corral])
    with pytest.raises(ConnectionError):
        await agent.run("hi")
    with pytest.raises(BudgetExhaustedError):
        await agent.run("hi")


async def test_a_response_another_capability_rejects_is_counted_too() -> None:
    class RejectsTheFirst(AbstractCapability[Any]):
        rejected = False

        async def after_model_request(
            self, ctx: RunContext[Any], *, request_context: Any, response: ModelResponse
        ) -> ModelResponse:
            if not self.rejected:
                self.rejected = True
                raise ModelRetry("say it again")
            return response

    async def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return ModelResponse(
            parts=[TextPart("ok")], usage=RequestUsage(input_tokens=100, output_tokens=10)
        )

    corral = CorralCapability(prices={"m": ModelPrice(1.0, 1.0)})
    agent = Agent(FunctionModel(respond, model_name="m"), capabilities=[corral, RejectsTheFirst()])
    assert (await agent.run("hi")).output == "ok"
    assert (corral.usage().tokens, corral.usage().turns) == (220, 2)
    assert corral.usage().cost_usd == pytest.approx(220 / 1e6)


async def test_the_attempts_a_fallback_moved_on_from_count_at_their_own_price() -> None:
    async def refuses(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        usage = RequestUsage(input_tokens=50, output_tokens=5)
        return ModelResponse(parts=[TextPart("no")], usage=usage, finish_reason="content_filter")

    async def answers(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        usage = RequestUsage(input_tokens=100, output_tokens=10)
        return ModelResponse(parts=[TextPart("ok")], usage=usage)

    corral = CorralCapability(
        budget=ExecutionBudget(max_cost_usd=1.0),
        prices={"first": ModelPrice(1000.0, 1000.0), "second": ModelPrice(1.0, 1.0)},
    )
    fallback = ModelFallback(FunctionModel(answers, model_name="second"))
    agent = Agent(FunctionModel(refuses, model_name="first"), capabilities=[corral, fallback])
    assert (await agent.run("hi")).output == "ok"
    assert (corral.usage().tokens, corral.usage().turns) == (165, 1)
    assert corral.usage().cost_usd == pytest.approx((55 * 1000.0 + 110 * 1.0) / 1e6)


async def test_concurrent_delegates_sharing_the_runs_usage_count_only_their_own() -> None:
    # Pydantic AI's delegation pattern: a tool runs another agent with usage=ctx.usage, here
    # twice at once, both under the same capability (one budget for the whole task).
    corral = CorralCapability(prices={"m": ModelPrice(1.0, 1.0)})
    both_asked = asyncio.Barrier(2)

    async def delegate_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        await both_asked.wait()  # both delegates' model calls are in flight together
        return ModelResponse(
            parts=[TextPart("sub done")], usage=RequestUsage(input_tokens=100, output_tokens=10)
        )

    delegate = Agent(FunctionModel(delegate_model, model_name="m"), capabilities=[corral])

    async def lead_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        usage = RequestUsage(input_tokens=7, output_tokens=3)
        if len(messages) == 1:
            calls = [ToolCallPart("ask", {"question": q}, tool_call_id=q) for q in ("a", "b")]
            return ModelResponse(parts=calls, usage=usage)
        return ModelResponse(parts=[TextPart("done")], usage=usage)

    lead = Agent(FunctionModel(lead_model, model_name="m"), capabilities=[corral])

    @lead.tool
    async def ask(ctx: RunContext[None], question: str) -> str:
        return (await delegate.run(question, usage=ctx.usage)).output

    result = await lead.run("go")
    assert result.output == "done"
    assert result.usage.total_tokens == 2 * 10 + 2 * 110  # Pydantic AI's own count
    assert (corral.usage().tokens, corral.usage().turns) == (240, 4)


# --- deadline and cancellation ------------------------------------------------------------


async def test_a_deadline_abandons_a_hanging_model_call() -> None:
    clock = FakeClock()
    started = asyncio.Event()

    async def hangs(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        started.set()
        await asyncio.Event().wait()
        raise AssertionError("never answers")

    corral = CorralCapability(budget=ExecutionBudget(deadline_s=30), clock=clock)
    run = asyncio.ensure_future(Agent(FunctionModel(hangs), capabilities=[corral]).run("hi"))
    await asyncio.wait_for(started.wait(), 10)
    clock.advance(30)
    with pytest.raises(DeadlineExceededError):
        await asyncio.wait_for(run, 10)


async def test_a_deadline_abandons_a_hanging_streamed_model_call() -> None:
    clock = FakeClock()
    started = asyncio.Event()

    async def hangs(messages: list[ModelMessage], info: AgentInfo) -> Any:
        yield "partial "
        await asyncio.Event().wait()

    corral = CorralCapability(budget=ExecutionBudget(deadline_s=30), clock=clock)
    agent = Agent(FunctionModel(stream_function=hangs), capabilities=[corral])
    read: list[str] = []

    async def consume() -> None:
        async with agent.run_stream("hi") as stream:
            async for text in stream.stream_text(debounce_by=None):
                read.append(text)
                started.set()

    run = asyncio.ensure_future(consume())
    await asyncio.wait_for(started.wait(), 10)
    clock.advance(30)
    with pytest.raises(DeadlineExceededError):
        await asyncio.wait_for(run, 10)
    assert read == ["partial "]


async def test_a_cancellation_stops_the_tool_in_flight_and_the_next_run() -> None:
    stop = Cancellation()
    corral = CorralCapability(cancellation=stop)
    respond, seen = calls_then_answers(("slow", {}))
    agent = Agent(FunctionModel(respond), capabilities=[corral])
    started = asyncio.Event()

    @agent.tool_plain
    async def slow() -> str:
        started.set()
        await asyncio.Event().wait()
        return "never"

    run = asyncio.ensure_future(agent.run("go"))
    await asyncio.wait_for(started.wait(), 10)
    stop.cancel("operator said stop")
    with pytest.raises(CancellationError, match="operator said stop"):
        await asyncio.wait_for(run, 10)
    with pytest.raises(CancellationError):
        await agent.run("again")
    assert len(seen) == 1  # the second run never reached the model


# --- the gateway --------------------------------------------------------------------------


async def test_the_gateway_tool_refuses_an_unknown_column_with_its_suggestion(
    tmp_path: Path,
) -> None:
    path = tmp_path / "shop.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, email TEXT)")
        db.execute("INSERT INTO users VALUES (1, 'ada@example.com')")
    gateway = await Gateway.connect(f"sqlite:///{path}")
    try:
        guard = NoRefunds()
        corral = CorralCapability(
            agent_id="a1", gateway=gateway, supervisor=Supervisor(AgentGroup("g"), [guard])
        )
        respond, seen = calls_then_answers(
            ("db_query", {"request": {"sql": "SELECT emial FROM users"}}),
            ("db_query", {"request": {"sql": "SELECT email FROM users"}}),
        )
        agent = Agent(FunctionModel(respond), capabilities=[corral])
        assert (await agent.run("what is the user's email?")).output == "done"
        [refused] = tool_returns(seen[1])
        answer = json.loads(str(refused.content))
        assert answer["error"] == "unknown_column"
        assert "email" in json.dumps(answer["details"])
        [rows] = tool_returns(seen[2])
        assert json.loads(str(rows.content))["rows"] == [{"email": "ada@example.com"}]
        # the guardrails saw each query once, as any other tool call
        assert guard.seen == [
            'db_query {"request": {"sql": "SELECT emial FROM users"}}',
            'db_query {"request": {"sql": "SELECT email FROM users"}}',
        ]
    finally:
        await gateway.close()


# --- shapes -------------------------------------------------------------------------------


async def test_streamed_runs_are_guarded_and_counted_too() -> None:
    guard = NoRefunds()
    corral = CorralCapability(supervisor=Supervisor(AgentGroup("g"), [guard]))
    agent = Agent(TestModel(), capabilities=[corral])
    ran: list[int] = []

    @agent.tool_plain
    def refund(order_id: int) -> str:
        ran.append(order_id)
        return "refunded"

    async with agent.run_stream("refund order 7") as stream:
        output = await stream.get_output()
    assert "refunds need a person" in output
    assert ran == []
    assert corral.usage().turns == 2
    assert corral.usage().tokens == stream.usage.total_tokens


def test_a_capability_with_a_deadline_can_be_made_before_the_loop_runs() -> None:
    # as for run_sync (the example runs it that way), which starts its loop after
    corral = CorralCapability(budget=ExecutionBudget(deadline_s=60, max_turns=5))
    agent = Agent(TestModel(call_tools=[]), capabilities=[corral])
    assert asyncio.run(agent.run("hi")).output == "success (no tool calls)"
    assert corral.usage().turns == 1
    assert asyncio.run(agent.run("hi")).output == "success (no tool calls)"  # a second loop
    assert corral.usage().turns == 2


def test_it_takes_an_oversight_or_its_arguments_not_both() -> None:
    oversight = Oversight(agent_id="a1")
    assert CorralCapability(oversight).oversight is oversight
    assert CorralCapability(agent_id="a2").oversight.agent_id == "a2"
    with pytest.raises(InvalidArgumentError, match="not both"):
        CorralCapability(oversight, budget=ExecutionBudget(max_turns=1))
    with pytest.raises(InvalidArgumentError, match="oversight"):
        CorralCapability(object())  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="agent_id"):
        CorralCapability(agent_id="")
