"""corral inside the OpenAI Agents SDK: CorralRunner against the real SDK, with a fake
``Model`` (and the SDK's own ``ScriptedModel``) -- never the network, no tracing export."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import agents
import pytest
from agents import (
    Agent,
    FunctionTool,
    ModelResponse,
    ModelSettings,
    ModelTracing,
    RunConfig,
    Runner,
    Tool,
    TResponseInputItem,
    Usage,
    UserError,
    function_tool,
)
from agents.agent_output import AgentOutputSchemaBase
from agents.handoffs import Handoff
from agents.items import TResponseOutputItem, TResponseStreamEvent
from agents.models.interface import Model, ModelProvider
from agents.retry import ModelRetryAdviceRequest
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call
from openai.types.responses.response_prompt_param import ResponsePromptParam

from corral.gateway import Gateway
from corral.guard import AgentGroup, ApprovalRequest, GuardrailResult, HumanApproval, Supervisor
from corral.integrations import Oversight
from corral.integrations.openai_agents import CorralRunner, SupervisedModel, run_error_in
from corral.kernel import (
    BudgetExhaustedError,
    CancellationError,
    CostUnknownError,
    DeadlineExceededError,
    ExecutionBudget,
    InvalidArgumentError,
)
from corral.runtime import CallNext, Cancellation, FakeClock, MiddlewareContext, ModelPrice

Turn = Callable[[int, list[Any]], list[TResponseOutputItem]]


@pytest.fixture(autouse=True)
def _no_tracing() -> None:
    """Nothing is exported anywhere (each run also says tracing_disabled)."""
    agents.set_tracing_disabled(True)


def quiet() -> RunConfig:
    return RunConfig(tracing_disabled=True)


class FakeModel(Model):
    """A model for tests: call ``n`` (from 1) answers ``turn(n, input)`` with ``usage`` per
    call; ``hang`` makes every call wait for ever (``started`` is set, ``abandoned`` counts
    the calls that were cancelled). Never the network."""

    def __init__(
        self,
        turn: Turn,
        *,
        model: str = "fake-model",
        usage: tuple[int, int] = (300, 100),
        hang: bool = False,
    ) -> None:
        self.model = model
        self.turn = turn
        self.usage = usage
        self.hang = hang
        self.inputs: list[list[Any]] = []
        self.started = asyncio.Event()
        self.abandoned = 0

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> ModelResponse:
        seen = [{"role": "user", "content": input}] if isinstance(input, str) else list(input)
        self.inputs.append(seen)
        self.started.set()
        if self.hang:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.abandoned += 1
                raise
        given, taken = self.usage
        return ModelResponse(
            output=self.turn(len(self.inputs), seen),
            usage=Usage(
                requests=1,
                input_tokens=given,
                output_tokens=taken,
                total_tokens=given + taken,
            ),
            response_id=None,
        )

    async def stream_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> AsyncIterator[TResponseStreamEvent]:
        nothing: tuple[TResponseStreamEvent, ...] = ()
        for event in nothing:  # an async generator, as the interface expects
            yield event
        raise NotImplementedError("FakeModel does not stream; ScriptedModel does")


def calls_then_says(name: str, arguments: dict[str, Any], *, times: int = 1) -> Turn:
    """Calls ``name`` ``times`` times, then says the last tool output it read."""

    def turn(n: int, seen: list[Any]) -> list[TResponseOutputItem]:
        if n <= times:
            return [function_call(name, arguments, call_id=f"call_{n}")]
        return [assistant_message(last_tool_output(seen))]

    return turn


def forever(name: str) -> Turn:
    """A runaway loop: one more call of ``name`` every time."""
    return lambda n, seen: [function_call(name, {"query": f"attempt {n}"}, call_id=f"call_{n}")]


def last_tool_output(seen: Sequence[Any]) -> str:
    outputs = [
        i["output"] for i in seen if isinstance(i, dict) and i.get("type") == "function_call_output"
    ]
    return str(outputs[-1]) if outputs else ""


class NoDeletes:
    name = "no-deletes"

    def check(self, agent_id: str, action: str, context: Any) -> GuardrailResult:
        if action.startswith("delete_rows"):
            return GuardrailResult.blocked("deleting rows needs a person")
        return GuardrailResult.allow()


def crew(*rules: Any) -> Supervisor:
    return Supervisor(AgentGroup("crew"), list(rules))


class Table:
    """A tool's side effects, to see whether it ran."""

    def __init__(self) -> None:
        self.deleted: list[str] = []
        self.searches = 0

    def tools(self) -> list[Tool]:
        @function_tool
        def delete_rows(table: str) -> str:
            """Delete every row of a table."""
            self.deleted.append(table)
            return f"deleted the rows of {table}"

        @function_tool
        def search(query: str) -> str:
            """Search the knowledge base."""
            self.searches += 1
            return f"3 documents about {query}"

        return [delete_rows, search]


# --- tool calls ---------------------------------------------------------------------------


async def test_a_blocked_tool_call_is_refused_to_the_model_and_the_tool_never_runs() -> None:
    table = Table()
    runner = CorralRunner(agent_id="ops", supervisor=crew(NoDeletes()))
    model = FakeModel(calls_then_says("delete_rows", {"table": "users"}))
    agent = Agent(name="ops", model=model, tools=table.tools())

    result = await runner.run(agent, "clean up", run_config=quiet())

    assert table.deleted == []
    assert result.final_output == "tool 'delete_rows' refused: deleting rows needs a person"
    (verdict,) = result.tool_input_guardrail_results
    assert verdict.guardrail.get_name() == "corral"
    assert verdict.output.behavior["type"] == "reject_content"
    # the agent given is untouched: its tool carries no guardrail of corral's
    (original, _) = agent.tools
    assert isinstance(original, FunctionTool)
    assert not original.tool_input_guardrails


async def test_an_allowed_tool_call_runs() -> None:
    table = Table()
    runner = CorralRunner(supervisor=crew(NoDeletes()))
    model = FakeModel(calls_then_says("search", {"query": "corral"}))
    result = await runner.run(
        Agent(name="ops", model=model, tools=table.tools()),
        "find",
        run_config={"tracing_disabled": True},  # Runner.run takes a dict too
    )
    assert table.searches == 1
    assert result.final_output == "3 documents about corral"


async def test_a_person_approves_a_tool_call_and_it_runs() -> None:
    table = Table()
    asked: list[ApprovalRequest] = []

    async def person(request: ApprovalRequest) -> None:
        asked.append(request)
        request.approve()

    runner = CorralRunner(agent_id="ops", supervisor=crew(HumanApproval({"delete_rows"}, person)))
    model = FakeModel(calls_then_says("delete_rows", {"table": "staging"}))
    result = await runner.run(
        Agent(name="ops", model=model, tools=table.tools()), "clean up", run_config=quiet()
    )
    assert [(r.agent_id, r.action) for r in asked] == [("ops", 'delete_rows {"table": "staging"}')]
    assert table.deleted == ["staging"]
    assert result.final_output == "deleted the rows of staging"


async def test_a_person_refuses_a_tool_call_and_the_model_is_told() -> None:
    table = Table()

    def person(request: ApprovalRequest) -> None:
        request.deny()

    runner = CorralRunner(supervisor=crew(HumanApproval({"delete_rows"}, person)))
    model = FakeModel(calls_then_says("delete_rows", {"table": "users"}))
    result = await runner.run(
        Agent(name="ops", model=model, tools=table.tools()), "clean up", run_config=quiet()
    )
    assert table.deleted == []
    assert result.final_output == (
        "tool 'delete_rows' refused: Approval for action "
        """'delete_rows {"table": "users"}' was denied"""
    )


async def test_a_handoff_targets_tools_and_model_are_supervised() -> None:
    table = Table()
    specialist_model = FakeModel(calls_then_says("delete_rows", {"table": "users"}))
    specialist = Agent(name="cleaner", model=specialist_model, tools=table.tools())
    triage = Agent(
        name="triage",
        model=FakeModel(lambda n, seen: [function_call("transfer_to_cleaner", {}, call_id="h1")]),
        handoffs=[specialist],
    )
    specialist.handoffs = [triage]  # a cycle: supervising it must end
    runner = CorralRunner(supervisor=crew(NoDeletes()))
    result = await runner.run(triage, "clean up", run_config=quiet())
    assert table.deleted == []
    assert result.final_output == "tool 'delete_rows' refused: deleting rows needs a person"
    assert runner.usage().turns == 3  # triage once, the specialist twice: all counted


# --- budgets ------------------------------------------------------------------------------


async def test_a_token_budget_stops_a_runaway_tool_loop() -> None:
    table = Table()
    runner = CorralRunner(budget=ExecutionBudget(max_tokens=1_000))
    model = FakeModel(forever("search"), usage=(300, 100))
    with pytest.raises(BudgetExhaustedError) as caught:
        await runner.run(
            Agent(name="researcher", model=model, tools=table.tools()),
            "find everything",
            max_turns=100,  # the SDK's own limit is not what stops it
            run_config=quiet(),
        )
    assert (caught.value.dimension, caught.value.limit, caught.value.used) == ("tokens", 1000, 1200)
    assert len(model.inputs) == 3
    assert table.searches == 2
    assert runner.usage().tokens == 1200


async def test_a_dollar_budget_stops_a_runaway_tool_loop() -> None:
    table = Table()
    runner = CorralRunner(
        budget=ExecutionBudget(max_cost_usd=0.01),
        prices={"fake-model": ModelPrice(10.0, 30.0)},  # 300 in + 100 out: $0.006 a call
    )
    model = FakeModel(forever("search"), usage=(300, 100))
    with pytest.raises(BudgetExhaustedError) as caught:
        await runner.run(
            Agent(name="researcher", model=model, tools=table.tools()),
            "find everything",
            max_turns=100,
            run_config=quiet(),
        )
    assert caught.value.dimension == "cost_usd"
    assert len(model.inputs) == 2
    assert table.searches == 1
    assert runner.usage().cost_usd == pytest.approx(0.012)


async def test_a_model_without_a_price_under_a_dollar_budget_stops_with_cost_unknown() -> None:
    runner = CorralRunner(
        budget=ExecutionBudget(max_cost_usd=1.0), prices={"other": ModelPrice(1, 1)}
    )
    model = FakeModel(forever("search"), model="mystery-model")
    with pytest.raises(CostUnknownError, match="mystery-model"):
        await runner.run(
            Agent(name="a", model=model, tools=Table().tools()), "go", run_config=quiet()
        )
    assert len(model.inputs) == 1
    assert runner.usage().tokens == 400  # spent all the same


class FakeProvider(ModelProvider):
    def __init__(self) -> None:
        self.asked: list[str | None] = []
        self.model = FakeModel(calls_then_says("search", {"query": "x"}), model="served-name")

    def get_model(self, model_name: str | None) -> Model:
        self.asked.append(model_name)
        return self.model


async def test_a_model_named_by_a_string_is_supervised_through_the_provider() -> None:
    provider = FakeProvider()
    runner = CorralRunner(
        budget=ExecutionBudget(max_cost_usd=1.0),
        prices={"openai/gpt-4.1": ModelPrice(2.0, 8.0)},
    )
    agent = Agent(name="a", model="openai/gpt-4.1", tools=Table().tools())
    config = RunConfig(model_provider=provider, tracing_disabled=True)
    await runner.run(agent, "go", run_config=config)
    assert provider.asked == ["openai/gpt-4.1", "openai/gpt-4.1"]
    usage = runner.usage()
    assert (usage.turns, usage.tokens) == (2, 800)
    assert usage.cost_usd == pytest.approx(2 * (300 * 2.0 + 100 * 8.0) / 1e6)


async def test_a_model_object_is_priced_under_its_own_name_or_the_one_given() -> None:
    runner = CorralRunner(prices={"fake-model": ModelPrice(1.0, 1.0), "alias": ModelPrice(2, 2)})
    model = FakeModel(lambda n, seen: [assistant_message("hi")])
    await runner.run(Agent(name="a", model=model), "go", run_config=quiet())
    assert runner.usage().cost_usd == pytest.approx(400 / 1e6)
    aliased = runner.model(model, name="alias")
    assert aliased.name == "alias"
    assert runner.model(aliased) is aliased
    await runner.run(Agent(name="a", model=aliased), "go", run_config=quiet())
    assert runner.usage().cost_usd == pytest.approx(400 / 1e6 + 800 / 1e6)


async def test_a_streamed_run_is_counted_and_stopped_by_a_budget() -> None:
    runner = CorralRunner(budget=ExecutionBudget(max_tokens=100))
    usage = Usage(requests=1, input_tokens=40, output_tokens=20, total_tokens=60)
    scripted = ScriptedModel(
        [
            {"output": [function_call("search", {"query": "a"}, call_id="c1")], "usage": usage},
            {"output": [assistant_message("done")], "usage": usage},
        ]
    )
    agent = runner.agent(Agent(name="s", model=scripted, tools=Table().tools()))
    streamed = Runner.run_streamed(agent, "go", run_config=runner.run_config(quiet()))
    with pytest.raises(BudgetExhaustedError) as caught:
        async for _ in streamed.stream_events():
            pass
    assert (caught.value.limit, caught.value.used) == (100, 120)
    assert runner.usage().turns == 2


async def test_the_sdk_does_not_retry_a_request_corral_stopped() -> None:
    runner = CorralRunner()
    model = runner.model(FakeModel(forever("search")))
    stopped = model.get_retry_advice(
        ModelRetryAdviceRequest(error=CancellationError("stop"), attempt=1, stream=False)
    )
    assert stopped is not None
    assert stopped.suggested is False
    assert stopped.normalized is not None
    assert stopped.normalized.is_abort
    other = ModelRetryAdviceRequest(error=ConnectionError("down"), attempt=1, stream=False)
    assert model.get_retry_advice(other) is None  # the wrapped model's advice


# --- cancellation and deadline ------------------------------------------------------------


async def test_a_deadline_abandons_a_hanging_model_call() -> None:
    clock = FakeClock()
    runner = CorralRunner(budget=ExecutionBudget(deadline_s=30), clock=clock)
    model = FakeModel(forever("search"), hang=True)
    run = asyncio.ensure_future(
        runner.run(Agent(name="slow", model=model), "go", run_config=quiet())
    )
    await model.started.wait()
    clock.advance(30)
    with pytest.raises(DeadlineExceededError):
        await run
    assert model.abandoned == 1


async def test_a_cancellation_abandons_a_hanging_tool_and_refuses_the_next_run() -> None:
    started, abandoned = asyncio.Event(), []

    @function_tool
    async def migrate(table: str) -> str:
        """Migrate a table (hangs)."""
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            abandoned.append(table)
            raise
        return "never"

    parent = Cancellation()
    runner = CorralRunner(cancellation=parent)
    model = FakeModel(calls_then_says("migrate", {"table": "users"}))
    agent = Agent(name="m", model=model, tools=[migrate])
    run = asyncio.ensure_future(runner.run(agent, "go", run_config=quiet()))
    await started.wait()
    parent.cancel("operator said stop")
    with pytest.raises(CancellationError, match="operator said stop"):
        await run
    assert abandoned == ["users"]
    with pytest.raises(CancellationError):
        await runner.run(agent, "again", run_config=quiet())
    assert len(model.inputs) == 1  # the second run never reached the model


async def test_an_error_on_the_tools_path_reaches_the_caller_as_itself() -> None:
    class Stopping:
        async def query(self, agent_id: str, request: Any) -> Any:
            raise CancellationError("the gateway was told to stop")

    runner = CorralRunner(gateway=Stopping())
    model = FakeModel(calls_then_says("db_query", {"request": {"sql": "SELECT 1"}}))
    agent = Agent(name="g", model=model, tools=runner.gateway_tools())
    with pytest.raises(CancellationError, match="the gateway was told to stop"):
        await runner.run(agent, "go", run_config=quiet())
    # through Runner.run itself the SDK wraps it; run_error_in finds it
    model = FakeModel(calls_then_says("db_query", {"request": {"sql": "SELECT 1"}}))
    agent = Agent(name="g", model=model, tools=runner.gateway_tools())
    with pytest.raises(UserError) as caught:
        await Runner.run(runner.agent(agent), "go", run_config=runner.run_config(quiet()))
    found = run_error_in(caught.value)
    assert isinstance(found, CancellationError)
    assert run_error_in(ValueError("other")) is None


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
        runner = CorralRunner(agent_id="analyst", gateway=gateway)

        def turn(n: int, seen: list[Any]) -> list[TResponseOutputItem]:
            if n == 1:
                request = {"request": {"sql": "SELECT emial FROM users"}}
                return [function_call("db_query", request, call_id="q1")]
            if n == 2:
                refused = json.loads(last_tool_output(seen))
                column = refused["details"]["suggestions"][0]  # the model reads the hint
                request = {"request": {"sql": f"SELECT {column} FROM users"}}
                return [function_call("db_query", request, call_id="q2")]
            return [assistant_message(last_tool_output(seen))]

        model = FakeModel(turn)
        agent = Agent(name="analyst", model=model, tools=runner.gateway_tools())
        result = await runner.run(agent, "list the emails", run_config=quiet())
        refused = json.loads(last_tool_output(model.inputs[1]))
        assert refused["error"] == "unknown_column"
        assert "email" in refused["details"]["suggestions"]
        assert json.loads(str(result.final_output))["rows"] == [{"email": "ada@example.com"}]
    finally:
        await gateway.close()


# --- the runner itself --------------------------------------------------------------------


def test_an_oversight_or_its_arguments_not_both() -> None:
    oversight = Oversight()
    assert CorralRunner(oversight).oversight is oversight
    with pytest.raises(InvalidArgumentError, match="budget"):
        CorralRunner(oversight, budget=ExecutionBudget(max_tokens=1))
    with pytest.raises(InvalidArgumentError, match="oversight"):
        CorralRunner(object())  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="agent_id"):
        CorralRunner(agent_id="")


def test_supervising_an_agent_twice_changes_nothing() -> None:
    runner = CorralRunner()
    model = FakeModel(forever("search"))
    agent = Agent(name="a", model=model, tools=Table().tools())
    once = runner.agent(agent)
    assert runner.agent(once) is once
    assert runner.agent(agent) is once
    assert isinstance(once.model, SupervisedModel)
    assert once.model.inner is model
    assert agent.model is model
    assert [t.tool_input_guardrails for t in once.tools] == [  # type: ignore[union-attr]
        [runner.guardrail],
        [runner.guardrail],
    ]
    assert runner.guarded(once.tools) == once.tools


async def test_a_deadline_abandons_a_hanging_streamed_model_call() -> None:
    clock = FakeClock()
    runner = CorralRunner(budget=ExecutionBudget(deadline_s=30), clock=clock)
    started, abandoned = asyncio.Event(), []

    async def hangs(call: ModelCall) -> AsyncIterator[TResponseStreamEvent]:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            abandoned.append(call.streamed)
            raise
        nothing: tuple[TResponseStreamEvent, ...] = ()
        for event in nothing:  # an async generator
            yield event

    agent = runner.agent(Agent(name="s", model=ScriptedModel([ModelStep.stream(hangs)])))
    streamed = Runner.run_streamed(agent, "go", run_config=runner.run_config(quiet()))

    async def consume() -> None:
        async for _ in streamed.stream_events():
            pass

    consuming = asyncio.ensure_future(consume())
    await started.wait()
    clock.advance(30)
    with pytest.raises(DeadlineExceededError):
        await consuming
    assert abandoned == [True]


async def test_a_person_who_does_not_answer_in_time_refuses() -> None:
    clock = FakeClock()
    table, asked = Table(), asyncio.Event()
    approval = HumanApproval({"delete_rows"}, lambda r: asked.set(), timeout_s=300, clock=clock)
    runner = CorralRunner(supervisor=crew(approval), clock=clock)
    model = FakeModel(calls_then_says("delete_rows", {"table": "users"}))
    agent = Agent(name="ops", model=model, tools=table.tools())
    run = asyncio.ensure_future(runner.run(agent, "clean up", run_config=quiet()))
    await asyncio.wait_for(asked.wait(), 10)
    clock.advance(300)
    result = await run
    assert table.deleted == []
    assert "timed out after 300" in str(result.final_output)


async def test_middlewares_see_each_tool_call_with_the_sdks_call_id() -> None:
    seen: list[tuple[str | None, str | None]] = []

    class Spy:
        async def process(self, ctx: MiddlewareContext, call_next: CallNext) -> None:
            seen.append((ctx.tool_name, ctx.tool_call_id))
            await call_next()

    runner = CorralRunner(middleware=[Spy()])
    model = FakeModel(calls_then_says("search", {"query": "x"}))
    await runner.run(Agent(name="a", model=model, tools=Table().tools()), "go", run_config=quiet())
    assert seen == [("search", "call_1")]
