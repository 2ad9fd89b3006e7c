"""CorralMiddleware: corral's supervision inside LangChain v1 agents (``create_agent``), run
against the real LangChain and LangGraph with a scripted chat model (no network)."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import (
    InputAgentState,
    ModelRetryMiddleware,
    ToolRetryMiddleware,
)
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.tools import BaseTool, tool

from corral.gateway import Gateway
from corral.guard import AgentGroup, ApprovalRequest, GuardrailResult, HumanApproval, Supervisor
from corral.integrations import Oversight
from corral.integrations.langchain import CorralMiddleware, SyncPathError
from corral.kernel import (
    BudgetExhaustedError,
    CancellationError,
    CostUnknownError,
    DeadlineExceededError,
    ExecutionBudget,
    InvalidArgumentError,
    MiddlewareStage,
)
from corral.runtime import (
    CallNext,
    Cancellation,
    FakeClock,
    MiddlewareContext,
    ModelPrice,
)
from tests.support.langchain_models import ScriptedChatModel, call_tool, forever, then_answer


def test_langsmith_tracing_is_off() -> None:
    # LangChain would report every run to LangSmith's service with tracing on: no network.
    assert not any(os.environ.get(k) for k in ("LANGSMITH_TRACING", "LANGCHAIN_TRACING_V2"))


class NoDeletes:
    name = "no-deletes"

    def check(self, agent_id: str, action: str, context: Any) -> GuardrailResult:
        if action.startswith("delete_rows"):
            return GuardrailResult.blocked("deleting rows needs a person")
        return GuardrailResult.allow()


class Spy:
    name = "spy"

    def __init__(self) -> None:
        self.actions: list[str] = []

    def check(self, agent_id: str, action: str, context: Any) -> GuardrailResult:
        self.actions.append(action)
        return GuardrailResult.allow()


class Tools:
    """Tools that remember what ran."""

    def __init__(self) -> None:
        self.ran: list[str] = []
        self.started = asyncio.Event()

    def all(self) -> list[BaseTool]:
        ran, started = self.ran, self.started

        @tool
        async def delete_rows(table: str) -> str:
            """Delete every row of a table."""
            ran.append(f"delete_rows {table}")
            return f"deleted the rows of {table}"

        @tool
        async def deploy(service: str) -> str:
            """Deploy a service."""
            ran.append(f"deploy {service}")
            return f"{service} deployed"

        @tool
        async def lookup(query: str) -> str:
            """Look something up."""
            ran.append(f"lookup {query}")
            return f"3 documents about {query}"

        @tool
        async def wait_forever() -> str:
            """Never answers."""
            started.set()
            await asyncio.Event().wait()
            return "never"

        return [delete_rows, deploy, lookup, wait_forever]


def ask(prompt: str = "go") -> InputAgentState:
    return {"messages": [{"role": "user", "content": prompt}]}


def shop(tmp_path: Path) -> str:
    """A SQLite database with one user; its URL."""
    path = tmp_path / "shop.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, email TEXT)")
        db.execute("INSERT INTO users VALUES (1, 'ada@example.com')")
    return f"sqlite:///{path}"


def tool_results(messages: list[BaseMessage]) -> list[ToolMessage]:
    return [m for m in messages if isinstance(m, ToolMessage)]


async def test_a_blocked_tool_call_is_a_refusal_the_model_reads_and_the_tool_never_runs() -> None:
    tools = Tools()
    model = ScriptedChatModel(script=then_answer(call_tool("delete_rows", {"table": "users"})))
    corral = CorralMiddleware(supervisor=Supervisor(AgentGroup("crew"), [NoDeletes()]))
    agent = create_agent(model, tools=tools.all(), middleware=[corral])
    result = await agent.ainvoke(ask())
    assert tools.ran == []
    [refusal] = tool_results(result["messages"])
    assert refusal.status == "error"
    assert refusal.tool_call_id == "call_1"
    assert refusal.text == "tool 'delete_rows' refused: deleting rows needs a person"
    # the run went on: the model read the refusal and answered
    assert result["messages"][-1].text == f"done: {refusal.text}"
    assert model.calls == 2


async def test_the_supervisor_sees_the_action_text_of_corrals_own_loop() -> None:
    spy = Spy()
    tools = Tools()
    model = ScriptedChatModel(script=then_answer(call_tool("lookup", {"query": "bees"})))
    corral = CorralMiddleware(supervisor=Supervisor(AgentGroup("crew"), [spy]), agent_id="a1")
    result = await create_agent(model, tools=tools.all(), middleware=[corral]).ainvoke(ask())
    assert spy.actions == ['lookup {"query": "bees"}']
    assert tools.ran == ["lookup bees"]
    assert result["messages"][-1].text == "done: 3 documents about bees"


@pytest.mark.parametrize("answer", [True, False])
async def test_a_person_approves_or_refuses_a_tool_call(answer: bool) -> None:
    asked: list[ApprovalRequest] = []

    def person(request: ApprovalRequest) -> None:
        asked.append(request)
        request.resolve(answer)

    tools = Tools()
    model = ScriptedChatModel(script=then_answer(call_tool("deploy", {"service": "api"})))
    supervisor = Supervisor(AgentGroup("crew"), [HumanApproval({"deploy"}, person)])
    agent = create_agent(
        model, tools=tools.all(), middleware=[CorralMiddleware(supervisor=supervisor)]
    )
    result = await agent.ainvoke(ask())
    assert [r.action for r in asked] == ['deploy {"service": "api"}']
    [outcome] = tool_results(result["messages"])
    if answer:
        assert tools.ran == ["deploy api"]
        assert (outcome.status, outcome.text) == ("success", "api deployed")
    else:
        assert tools.ran == []
        assert outcome.status == "error"
        assert outcome.text.startswith("tool 'deploy' refused:")


async def test_an_approval_nobody_answers_times_out_into_a_refusal() -> None:
    clock = FakeClock()
    asked = asyncio.Event()
    tools = Tools()
    model = ScriptedChatModel(script=then_answer(call_tool("deploy", {"service": "api"})))
    gate = HumanApproval({"deploy"}, lambda request: asked.set(), timeout_s=60, clock=clock)
    corral = CorralMiddleware(supervisor=Supervisor(AgentGroup("crew"), [gate]), clock=clock)
    run = asyncio.ensure_future(
        create_agent(model, tools=tools.all(), middleware=[corral]).ainvoke(ask())
    )
    await asyncio.wait_for(asked.wait(), 10)
    clock.advance(60)
    result = await asyncio.wait_for(run, 10)
    [refusal] = tool_results(result["messages"])
    assert tools.ran == []
    assert refusal.status == "error"
    assert "timed out after 60 s" in refusal.text


async def test_a_token_budget_stops_a_runaway_tool_loop() -> None:
    tools = Tools()
    model = ScriptedChatModel(script=forever("lookup", {"query": "more"}))  # 15 tokens a call
    corral = CorralMiddleware(budget=ExecutionBudget(max_tokens=100))
    agent = create_agent(model, tools=tools.all(), middleware=[corral])
    with pytest.raises(BudgetExhaustedError) as caught:
        await agent.ainvoke(ask())
    assert (caught.value.dimension, caught.value.limit, caught.value.used) == ("tokens", 100, 105)
    assert model.calls == 7  # 7 x 15 = 105: the call that went over is the last
    assert len(tools.ran) == 6
    assert corral.oversight.usage().tokens == 105


async def test_a_dollar_budget_stops_a_runaway_tool_loop() -> None:
    tools = Tools()
    # 10 input tokens at $1,000 and 5 output tokens at $2,000 per million: $0.02 a call
    model = ScriptedChatModel(script=forever("lookup", {"query": "more"}))
    corral = CorralMiddleware(
        budget=ExecutionBudget(max_cost_usd=0.05),
        prices={"fake-model": ModelPrice(1000.0, 2000.0)},
    )
    agent = create_agent(model, tools=tools.all(), middleware=[corral])
    with pytest.raises(BudgetExhaustedError) as caught:
        await agent.ainvoke(ask())
    assert caught.value.dimension == "cost_usd"
    assert caught.value.used == pytest.approx(0.06)
    assert model.calls == 3
    assert len(tools.ran) == 2


async def test_the_price_of_the_model_the_provider_names_comes_first() -> None:
    def dated(n: int, messages: Any) -> AIMessage:
        return AIMessage(content="hi", response_metadata={"model_name": "fake-model-2025-01-01"})

    model = ScriptedChatModel(script=dated)
    corral = CorralMiddleware(
        prices={
            "fake-model": ModelPrice(1.0, 1.0),
            "fake-model-2025-01-01": ModelPrice(1000.0, 2000.0),
        },
    )
    await create_agent(model, middleware=[corral]).ainvoke(ask())
    usage = corral.oversight.usage()
    assert (usage.tokens, usage.turns) == (15, 1)
    assert usage.cost_usd == pytest.approx(0.02)


async def test_a_model_without_a_price_under_a_dollar_budget_stops_with_cost_unknown() -> None:
    tools = Tools()
    model = ScriptedChatModel(script=forever("lookup", {"query": "more"}))
    corral = CorralMiddleware(budget=ExecutionBudget(max_cost_usd=1.0))
    agent = create_agent(model, tools=tools.all(), middleware=[corral])
    with pytest.raises(CostUnknownError, match="'fake-model'") as caught:
        await agent.ainvoke(ask())
    assert caught.value.code == "cost_unknown"
    assert model.calls == 1
    assert tools.ran == []
    assert corral.oversight.usage().tokens == 15  # spent all the same


async def test_a_reply_without_usage_has_an_unknown_cost() -> None:
    model = ScriptedChatModel(script=then_answer(), usage=False)
    priced = {"fake-model": ModelPrice(1.0, 1.0)}
    counted = CorralMiddleware(prices=priced)  # no dollar budget: counted as nothing
    await create_agent(model, middleware=[counted]).ainvoke(ask())
    assert (counted.oversight.usage().tokens, counted.oversight.usage().turns) == (0, 1)
    # a price times no usage is not $0: under a dollar budget the run stops
    bounded = CorralMiddleware(prices=priced, budget=ExecutionBudget(max_cost_usd=1.0))
    with pytest.raises(CostUnknownError):
        await create_agent(model, middleware=[bounded]).ainvoke(ask())


async def test_a_deadline_abandons_a_hanging_model_call() -> None:
    clock = FakeClock()
    started = asyncio.Event()
    model = ScriptedChatModel(script=then_answer(), hang=True, started=started)
    corral = CorralMiddleware(budget=ExecutionBudget(deadline_s=30), clock=clock)
    run = asyncio.ensure_future(create_agent(model, middleware=[corral]).ainvoke(ask()))
    await asyncio.wait_for(started.wait(), 10)
    clock.advance(30)
    with pytest.raises(DeadlineExceededError):
        await asyncio.wait_for(run, 10)
    assert model.calls == 0  # the call never returned
    assert corral.oversight.usage().turns == 0


async def test_a_cancellation_stops_the_tool_in_flight_and_the_next_run() -> None:
    parent = Cancellation()
    tools = Tools()
    model = ScriptedChatModel(script=then_answer(call_tool("wait_forever", {})))
    corral = CorralMiddleware(cancellation=parent)
    agent = create_agent(model, tools=tools.all(), middleware=[corral])
    run = asyncio.ensure_future(agent.ainvoke(ask()))
    await asyncio.wait_for(tools.started.wait(), 10)
    parent.cancel("operator said stop")
    with pytest.raises(CancellationError, match="operator said stop"):
        await asyncio.wait_for(run, 10)
    with pytest.raises(CancellationError):
        await agent.ainvoke(ask())
    assert model.calls == 1  # the second run was refused before its model call


async def test_the_gateway_tool_refuses_an_unknown_column_with_its_suggestion(
    tmp_path: Path,
) -> None:
    gateway = await Gateway.connect(shop(tmp_path))
    try:
        spy = Spy()
        model = ScriptedChatModel(
            script=then_answer(
                call_tool("db_query", {"request": {"sql": "SELECT emial FROM users"}}, "q1"),
                call_tool("db_query", {"request": {"sql": "SELECT email FROM users"}}, "q2"),
            )
        )
        corral = CorralMiddleware(
            agent_id="shop-agent",
            gateway=gateway,
            supervisor=Supervisor(AgentGroup("crew"), [spy]),
        )
        assert [t.name for t in corral.tools] == ["db_query"]
        agent = create_agent(model, tools=[], middleware=[corral])  # the tool comes with corral
        result = await agent.ainvoke(ask("what is the email of user 1?"))
        refused, answered = tool_results(result["messages"])
        refusal = json.loads(refused.text)
        assert refusal["error"] == "unknown_column"
        assert "email" in json.dumps(refusal["details"])
        assert json.loads(answered.text)["rows"] == [{"email": "ada@example.com"}]
        # each call checked once (inside the tool), as corral's loop would write it
        assert spy.actions == [
            'db_query {"request": {"sql": "SELECT emial FROM users"}}',
            'db_query {"request": {"sql": "SELECT email FROM users"}}',
        ]
    finally:
        await gateway.close()


async def test_a_refused_gateway_call_is_a_refusal_the_model_reads(tmp_path: Path) -> None:
    class NoQueries:
        name = "no-queries"

        def check(self, agent_id: str, action: str, context: Any) -> GuardrailResult:
            return GuardrailResult.blocked("no database today")

    gateway = await Gateway.connect(shop(tmp_path))
    try:
        model = ScriptedChatModel(
            script=then_answer(call_tool("db_query", {"request": {"sql": "SELECT 1"}}))
        )
        corral = CorralMiddleware(
            gateway=gateway, supervisor=Supervisor(AgentGroup("crew"), [NoQueries()])
        )
        result = await create_agent(model, middleware=[corral]).ainvoke(ask())
        [refused] = tool_results(result["messages"])
        assert json.loads(refused.text) == {
            "error": "tool_refused",
            "message": "tool 'db_query' refused: no database today",
        }
    finally:
        await gateway.close()


async def test_the_sync_path_is_refused_before_the_model_is_called() -> None:
    model = ScriptedChatModel(script=then_answer())
    agent = create_agent(model, middleware=[CorralMiddleware()])
    with pytest.raises(SyncPathError, match=r"ainvoke") as caught:
        await asyncio.to_thread(lambda: agent.invoke(ask()))
    assert caught.value.code == "sync_path"
    assert model.calls == 0


async def test_an_oversight_or_its_arguments_not_both() -> None:
    oversight = Oversight(agent_id="a1", budget=ExecutionBudget(max_turns=1))
    corral = CorralMiddleware(oversight)
    assert corral.oversight is oversight
    model = ScriptedChatModel(script=forever("lookup", {"query": "x"}))
    agent = create_agent(model, tools=Tools().all(), middleware=[corral])
    with pytest.raises(BudgetExhaustedError, match="turns"):
        await agent.ainvoke(ask())
    with pytest.raises(InvalidArgumentError, match="budget"):
        CorralMiddleware(oversight, budget=ExecutionBudget(max_turns=2))
    with pytest.raises(InvalidArgumentError, match="oversight"):
        CorralMiddleware("not an oversight")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="agent_id"):
        CorralMiddleware(agent_id="")


async def test_a_failing_tool_raises_as_itself_and_a_failing_model_counts_a_turn() -> None:
    @tool
    async def broken() -> str:
        """Always fails."""
        raise ConnectionError("backend down")

    model = ScriptedChatModel(script=then_answer(call_tool("broken", {})))
    corral = CorralMiddleware()
    with pytest.raises(ConnectionError, match="backend down"):
        await create_agent(model, tools=[broken], middleware=[corral]).ainvoke(ask())

    def fails(n: int, messages: Any) -> AIMessage:
        raise TimeoutError("model down")

    failing = CorralMiddleware(budget=ExecutionBudget(max_turns=5))
    with pytest.raises(TimeoutError, match="model down"):
        await create_agent(ScriptedChatModel(script=fails), middleware=[failing]).ainvoke(ask())
    assert failing.oversight.usage().turns == 1


async def test_a_corral_middleware_that_answers_in_the_tools_place_is_the_tools_result() -> None:
    class Cached:
        stages = frozenset({MiddlewareStage.TOOL})

        async def process(self, ctx: MiddlewareContext, call_next: CallNext) -> None:
            ctx.result = {"cached": ctx.arguments["query"]}

    tools = Tools()
    model = ScriptedChatModel(script=then_answer(call_tool("lookup", {"query": "bees"})))
    corral = CorralMiddleware(middleware=[Cached()])
    result = await create_agent(model, tools=tools.all(), middleware=[corral]).ainvoke(ask())
    [answer] = tool_results(result["messages"])
    assert tools.ran == []
    assert (answer.text, answer.tool_call_id) == ('{"cached": "bees"}', "call_1")


@pytest.mark.parametrize("corral_first", [True, False])
async def test_a_stop_reaches_the_caller_even_through_langchains_retry_middlewares(
    corral_first: bool,
) -> None:
    # ModelRetryMiddleware retries every exception and then answers with a message; listed
    # before corral (outside it) it would turn the budget's stop into the run's answer.
    tools = Tools()
    model = ScriptedChatModel(script=forever("lookup", {"query": "more"}))
    corral = CorralMiddleware(budget=ExecutionBudget(max_tokens=100))
    retry = ModelRetryMiddleware(initial_delay=0, jitter=False)
    layers = [corral, retry] if corral_first else [retry, corral]
    agent = create_agent(model, tools=tools.all(), middleware=layers)
    with pytest.raises(BudgetExhaustedError, match="tokens budget exhausted"):
        await agent.ainvoke(ask())
    assert model.calls == 7


async def test_a_cancellation_reaches_the_caller_through_tool_and_model_retries() -> None:
    parent = Cancellation()
    tools = Tools()
    model = ScriptedChatModel(script=then_answer(call_tool("wait_forever", {})))
    layers = [
        ToolRetryMiddleware(initial_delay=0, jitter=False),
        ModelRetryMiddleware(initial_delay=0, jitter=False),
        CorralMiddleware(cancellation=parent),
    ]
    run = asyncio.ensure_future(
        create_agent(model, tools=tools.all(), middleware=layers).ainvoke(ask())
    )
    await asyncio.wait_for(tools.started.wait(), 10)
    parent.cancel("operator said stop")
    with pytest.raises(CancellationError, match="operator said stop"):
        await asyncio.wait_for(run, 10)
    assert model.calls == 1


def test_an_agent_built_once_runs_in_one_event_loop_after_another() -> None:
    # asyncio.run(agent.ainvoke(...)) twice, as a script or a notebook does
    tools = Tools()
    model = ScriptedChatModel(script=then_answer(call_tool("lookup", {"query": "bees"})))
    corral = CorralMiddleware(budget=ExecutionBudget(max_turns=10))
    agent = create_agent(model, tools=tools.all(), middleware=[corral])
    for _ in range(2):
        result = asyncio.run(agent.ainvoke(ask()))
        assert result["messages"][-1].text.startswith("done")
    assert tools.ran == ["lookup bees"]  # the second run's script answers at once
    assert corral.oversight.usage().turns == 3
