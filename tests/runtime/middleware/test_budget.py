from typing import Any

import pytest

from corral.kernel import (
    BudgetExhaustedError,
    ChatMessage,
    CostUnknownError,
    ExecutionBudget,
    InvalidArgumentError,
    MiddlewareStage,
    RunMeta,
)
from corral.runtime import (
    BudgetAccounting,
    CallOverBudgetError,
    Cancellation,
    ChatResult,
    ExecutionTracker,
    FakeClock,
    MiddlewareContext,
    MiddlewarePipeline,
    ModelPrice,
    ModelUnavailableError,
    Retry,
    StopAfterAttempt,
    Usage,
    WaitFixed,
    WorstCaseBudget,
    input_bound,
)

CHAT, TOOL, TURN = MiddlewareStage.CHAT, MiddlewareStage.TOOL, MiddlewareStage.TURN


def make_meta(clock: FakeClock) -> RunMeta:
    return RunMeta(cancellation=Cancellation(clock=clock), clock=clock)


def reply(
    tokens: int = 30, cost: float | None = 0.01, *, cached: bool = False, model: str | None = "m1"
) -> ChatResult:
    return ChatResult(
        message=ChatMessage.assistant("hi"),
        usage=Usage(prompt_tokens=tokens - 10, completion_tokens=10),
        cost_usd=cost,
        model=model,
        cached=cached,
    )


class Model:
    def __init__(self, *outcomes: ChatResult | Exception) -> None:
        self.outcomes = list(outcomes)
        self.calls = 0

    async def __call__(self, ctx: MiddlewareContext) -> None:
        self.calls += 1
        outcome = self.outcomes.pop(0) if len(self.outcomes) > 1 else self.outcomes[0]
        if isinstance(outcome, Exception):
            raise outcome
        ctx.result = outcome


def chat_ctx(clock: FakeClock, **options: Any) -> MiddlewareContext:
    return MiddlewareContext(stage=CHAT, agent_id="a", meta=make_meta(clock), options=options)


async def test_a_successful_call_records_tokens_cost_and_a_turn() -> None:
    clock = FakeClock()
    tracker = ExecutionTracker(ExecutionBudget(max_tokens=1000), clock=clock)
    pipeline = MiddlewarePipeline([BudgetAccounting(tracker)])
    await pipeline.run(chat_ctx(clock), Model(reply(tokens=30, cost=0.01)))
    await pipeline.run(chat_ctx(clock), Model(reply(tokens=50, cost=0.02)))
    usage = tracker.usage()
    assert (usage.tokens, usage.turns) == (80, 2)
    assert usage.cost_usd == pytest.approx(0.03)


async def test_check_before_the_call_refuses_when_no_room_is_left() -> None:
    clock = FakeClock()
    tracker = ExecutionTracker(ExecutionBudget(max_turns=1), clock=clock)
    pipeline = MiddlewarePipeline([BudgetAccounting(tracker)])
    model = Model(reply())
    await pipeline.run(chat_ctx(clock), model)
    with pytest.raises(
        BudgetExhaustedError, match="turns budget exhausted: used 1 of a limit of 1"
    ) as info:
        await pipeline.run(chat_ctx(clock), model)
    assert (info.value.dimension, info.value.limit, info.value.used) == ("turns", 1, 1)
    assert model.calls == 1


async def test_passing_the_token_limit_raises_after_the_call() -> None:
    clock = FakeClock()
    tracker = ExecutionTracker(ExecutionBudget(max_tokens=100), clock=clock)
    ctx = chat_ctx(clock)
    with pytest.raises(BudgetExhaustedError) as info:
        await MiddlewarePipeline([BudgetAccounting(tracker)]).run(ctx, Model(reply(tokens=120)))
    assert (info.value.dimension, info.value.limit, info.value.used) == ("tokens", 100, 120)
    assert tracker.usage().tokens == 120  # spent, so counted


async def test_a_failed_call_counts_a_turn_and_its_error_propagates() -> None:
    clock = FakeClock()
    tracker = ExecutionTracker(ExecutionBudget(max_turns=5), clock=clock)
    error = ModelUnavailableError("u", "down")
    with pytest.raises(ModelUnavailableError) as info:
        await MiddlewarePipeline([BudgetAccounting(tracker)]).run(chat_ctx(clock), Model(error))
    assert info.value is error
    assert tracker.usage().turns == 1
    assert tracker.usage().tokens == 0


async def test_the_call_error_wins_over_a_turn_limit_passed_while_it_failed() -> None:
    clock = FakeClock()
    tracker = ExecutionTracker(ExecutionBudget(max_turns=1), clock=clock)
    error = ModelUnavailableError("u", "down")

    async def others_spend_meanwhile(ctx: MiddlewareContext) -> None:
        tracker.record(turns=1)  # another call sharing the tracker finished first
        raise error

    with pytest.raises(ModelUnavailableError):
        await MiddlewarePipeline([BudgetAccounting(tracker)]).run(
            chat_ctx(clock), others_spend_meanwhile
        )
    assert tracker.usage().turns == 2
    with pytest.raises(BudgetExhaustedError, match="used 2 of a limit of 1"):
        tracker.check()


async def test_a_retry_loop_outside_is_bounded_by_the_turn_budget() -> None:
    clock = FakeClock(auto_advance=True)
    tracker = ExecutionTracker(ExecutionBudget(max_turns=3), clock=clock)
    model = Model(ModelUnavailableError("u", "down"))
    retry = Retry(stop=StopAfterAttempt(100), wait=WaitFixed(1), clock=clock)
    pipeline = MiddlewarePipeline([retry, BudgetAccounting(tracker)])
    with pytest.raises(
        BudgetExhaustedError, match="turns budget exhausted: used 3 of a limit of 3"
    ):
        await pipeline.run(chat_ctx(clock), model)
    assert model.calls == 3
    assert clock.sleeps == [1.0, 1.0, 1.0]


async def test_unknown_cost_under_a_dollar_budget_is_refused() -> None:
    clock = FakeClock()
    tracker = ExecutionTracker(ExecutionBudget(max_cost_usd=2.5), clock=clock)
    with pytest.raises(CostUnknownError) as info:
        await MiddlewarePipeline([BudgetAccounting(tracker)]).run(
            chat_ctx(clock), Model(reply(tokens=40, cost=None, model="mystery-7b"))
        )
    assert (info.value.model, info.value.limit) == ("mystery-7b", 2.5)
    assert "dollar budget of 2.5" in info.value.message
    assert "'mystery-7b'" in info.value.message
    usage = tracker.usage()
    assert (usage.tokens, usage.turns, usage.cost_usd) == (40, 1, 0.0)


async def test_unknown_cost_names_the_model_option_when_the_result_has_none() -> None:
    clock = FakeClock()
    tracker = ExecutionTracker(ExecutionBudget(max_cost_usd=1.0), clock=clock)
    with pytest.raises(CostUnknownError) as info:
        await MiddlewarePipeline([BudgetAccounting(tracker)]).run(
            chat_ctx(clock, model="opt-model"), Model(reply(cost=None, model=None))
        )
    assert info.value.model == "opt-model"


async def test_unknown_cost_is_fine_without_a_dollar_budget_or_when_cached() -> None:
    clock = FakeClock()
    plain = ExecutionTracker(ExecutionBudget(max_tokens=1000), clock=clock)
    await MiddlewarePipeline([BudgetAccounting(plain)]).run(
        chat_ctx(clock), Model(reply(cost=None))
    )
    assert plain.usage().tokens == 30

    dollars = ExecutionTracker(ExecutionBudget(max_cost_usd=1.0), clock=clock)
    cached = reply(tokens=30, cost=None, cached=True)
    await MiddlewarePipeline([BudgetAccounting(dollars)]).run(chat_ctx(clock), Model(cached))
    assert dollars.usage().turns == 1


async def test_tool_calls_are_checked_but_not_counted() -> None:
    clock = FakeClock()
    tracker = ExecutionTracker(ExecutionBudget(deadline_s=10), clock=clock)
    pipeline = MiddlewarePipeline([BudgetAccounting(tracker)])
    ran: list[str] = []

    async def tool(ctx: MiddlewareContext) -> None:
        ran.append("tool")
        ctx.result = "out"

    ctx = MiddlewareContext(stage=TOOL, agent_id="a", meta=make_meta(clock), tool_name="t")
    assert await pipeline.run(ctx, tool) == "out"
    assert tracker.usage().turns == 0
    clock.advance(10)
    with pytest.raises(
        BudgetExhaustedError, match="deadline_s budget exhausted: used 10 of a limit of 10"
    ):
        await pipeline.run(ctx, tool)
    assert ran == ["tool"]


def test_runs_at_chat_and_tool_only() -> None:
    tracker = ExecutionTracker()
    accounting = BudgetAccounting(tracker)
    pipeline = MiddlewarePipeline([accounting])
    assert pipeline.for_stage(CHAT) == (accounting,)
    assert pipeline.for_stage(TOOL) == (accounting,)
    assert pipeline.for_stage(TURN) == ()


@pytest.mark.parametrize("bad", [None, "tracker", ExecutionBudget()])
def test_refuses_anything_but_a_tracker(bad: Any) -> None:
    with pytest.raises(
        InvalidArgumentError, match=r"BudgetAccounting: tracker must be an? ExecutionTracker"
    ):
        BudgetAccounting(bad)


# --- WorstCaseBudget: no call whose worst case could pass what is left -------------------


def worst_ctx(clock: FakeClock, text: str = "hello", **options: Any) -> MiddlewareContext:
    return MiddlewareContext(
        stage=CHAT,
        agent_id="a",
        meta=make_meta(clock),
        messages=[ChatMessage.user(text)],
        options=options,
    )


PRICE = ModelPrice(1.0, 2.0)


def test_the_input_bound_counts_every_byte_and_each_message() -> None:
    one = input_bound([ChatMessage.user("x")])
    assert input_bound([ChatMessage.user("x" * 101)]) == one + 100
    assert input_bound([ChatMessage.user("é")]) == one + 1  # two bytes of UTF-8
    assert input_bound([ChatMessage.user("x"), ChatMessage.user("x")]) > 2 * one - 9


async def test_a_call_whose_cap_could_pass_the_money_left_is_refused_before_it_starts() -> None:
    clock = FakeClock()
    tracker = ExecutionTracker(ExecutionBudget(max_cost_usd=0.001), clock=clock)
    pipeline = MiddlewarePipeline([WorstCaseBudget(tracker, PRICE), BudgetAccounting(tracker)])
    model = Model(reply())
    with pytest.raises(CallOverBudgetError) as caught:
        await pipeline.run(worst_ctx(clock, max_tokens=1000), model)
    assert model.calls == 0
    assert caught.value.code == "budget_exhausted"
    assert isinstance(caught.value, BudgetExhaustedError)
    assert caught.value.dimension == "cost_usd"
    assert caught.value.bound is not None
    assert caught.value.bound > 0.002


async def test_without_a_cap_one_is_set_that_what_is_left_affords() -> None:
    clock = FakeClock()
    tracker = ExecutionTracker(ExecutionBudget(max_cost_usd=0.001), clock=clock)
    ctx = worst_ctx(clock)
    await MiddlewarePipeline([WorstCaseBudget(tracker, PRICE)]).run(ctx, Model(reply()))
    cap = ctx.options["max_tokens"]
    assert 0 < cap < 500  # $0.001 at $2/Mtok, less the input's worst case
    inputs = input_bound(ctx.messages)
    assert (inputs * 1.0 + cap * 2.0) / 1e6 <= 0.001


async def test_tokens_are_bounded_like_dollars_and_no_price_refuses_a_dollar_limit() -> None:
    clock = FakeClock()
    tokens = ExecutionTracker(ExecutionBudget(max_tokens=10), clock=clock)
    with pytest.raises(CallOverBudgetError, match="tokens budget: the next model call"):
        await MiddlewarePipeline([WorstCaseBudget(tokens, None)]).run(
            worst_ctx(clock), Model(reply())
        )
    dollars = ExecutionTracker(ExecutionBudget(max_cost_usd=5.0), clock=clock)
    with pytest.raises(CallOverBudgetError, match="its cost is unknown"):
        await MiddlewarePipeline([WorstCaseBudget(dollars, None)]).run(
            worst_ctx(clock), Model(reply())
        )


async def test_an_unlimited_budget_adds_no_cap() -> None:
    clock = FakeClock()
    ctx = worst_ctx(clock)
    await MiddlewarePipeline([WorstCaseBudget(ExecutionTracker(), PRICE)]).run(ctx, Model(reply()))
    assert "max_tokens" not in ctx.options
