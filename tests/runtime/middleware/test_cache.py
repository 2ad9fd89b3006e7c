import subprocess
import sys
from typing import Any

import pytest

from corral.kernel import ChatMessage, InvalidArgumentError, MiddlewareStage, RunMeta, ToolCall
from corral.runtime import (
    BudgetAccounting,
    Cancellation,
    ChatCache,
    ChatResult,
    ExecutionTracker,
    FakeClock,
    MiddlewareContext,
    MiddlewarePipeline,
    ModelUnavailableError,
    ToolSpec,
    Usage,
)
from corral.runtime.middleware._cache import request_key


def make_meta(clock: FakeClock) -> RunMeta:
    return RunMeta(cancellation=Cancellation(clock=clock), clock=clock)


class Model:
    def __init__(self) -> None:
        self.calls = 0
        self.fail_next = False

    async def __call__(self, ctx: MiddlewareContext) -> None:
        self.calls += 1
        if self.fail_next:
            self.fail_next = False
            raise ModelUnavailableError("u", "down")
        ctx.result = ChatResult(
            message=ChatMessage.assistant(f"answer {self.calls}"),
            usage=Usage(prompt_tokens=12, completion_tokens=8),
            cost_usd=0.004,
            model="m1",
        )


def ctx_for(clock: FakeClock, text: str = "hello", **options: Any) -> MiddlewareContext:
    return MiddlewareContext.chat(
        "a",
        make_meta(clock),
        [ChatMessage.system("sys"), ChatMessage.user(text)],
        tools=[ToolSpec(name="search")],
        options=options or {"temperature": 0},
    )


async def test_an_identical_request_is_served_from_the_cache() -> None:
    clock = FakeClock()
    cache, model = ChatCache(clock=clock), Model()
    pipeline = MiddlewarePipeline([cache])
    first_ctx, second_ctx = ctx_for(clock), ctx_for(clock)
    first = await pipeline.run(first_ctx, model)
    second = await pipeline.run(second_ctx, model)
    assert model.calls == 1
    assert (first.cached, first.cost_usd, first.usage.total_tokens) == (False, 0.004, 20)
    assert (second.cached, second.cost_usd, second.usage) == (True, 0.0, Usage())
    assert (second.message, second.model) == (first.message, "m1")
    assert (first_ctx.metadata["cache_hit"], second_ctx.metadata["cache_hit"]) == (False, True)
    assert (cache.hits, cache.misses, len(cache)) == (1, 1, 1)
    third = await pipeline.run(ctx_for(clock), model)
    assert third.cached
    assert first.cached is False


@pytest.mark.parametrize(
    "change",
    [
        lambda c: setattr(c, "messages", [*c.messages, ChatMessage.user("more")]),
        lambda c: setattr(c, "tools", [ToolSpec(name="other")]),
        lambda c: c.options.update(temperature=1),
        lambda c: c.options.update(model="m2"),
    ],
)
async def test_a_different_request_is_a_miss(change: Any) -> None:
    clock = FakeClock()
    model = Model()
    pipeline = MiddlewarePipeline([ChatCache(clock=clock)])
    await pipeline.run(ctx_for(clock), model)
    other = ctx_for(clock)
    change(other)
    result = await pipeline.run(other, model)
    assert model.calls == 2
    assert not result.cached


async def test_errors_are_never_cached() -> None:
    clock = FakeClock()
    model = Model()
    model.fail_next = True
    pipeline = MiddlewarePipeline([ChatCache(clock=clock)])
    with pytest.raises(ModelUnavailableError):
        await pipeline.run(ctx_for(clock), model)
    result = await pipeline.run(ctx_for(clock), model)
    assert not result.cached
    assert model.calls == 2
    assert (await pipeline.run(ctx_for(clock), model)).cached


async def test_least_recently_used_entries_go_first() -> None:
    clock = FakeClock()
    cache, model = ChatCache(max_entries=2, clock=clock), Model()
    pipeline = MiddlewarePipeline([cache])

    async def ask(text: str) -> bool:
        result: ChatResult = await pipeline.run(ctx_for(clock, text), model)
        return result.cached

    assert [await ask("a"), await ask("b"), await ask("a")] == [False, False, True]
    assert await ask("c") is False  # evicts b, the least recently used
    assert len(cache) == 2
    assert await ask("a") is True
    assert await ask("b") is False


async def test_entries_expire_after_the_ttl_on_the_clock() -> None:
    clock = FakeClock()
    cache, model = ChatCache(ttl_s=10, clock=clock), Model()
    pipeline = MiddlewarePipeline([cache])
    await pipeline.run(ctx_for(clock), model)
    clock.advance(9.5)
    assert (await pipeline.run(ctx_for(clock), model)).cached
    clock.advance(0.5)
    assert not (await pipeline.run(ctx_for(clock), model)).cached
    assert model.calls == 2
    cache.clear()
    assert len(cache) == 0


async def test_requests_that_are_not_json_go_inward_every_time() -> None:
    clock = FakeClock()
    model = Model()
    pipeline = MiddlewarePipeline([ChatCache(clock=clock)])
    for _ in range(2):
        result = await pipeline.run(ctx_for(clock, callback=object()), model)
        assert not result.cached
    assert model.calls == 2


async def test_a_hit_costs_no_turn_when_the_cache_is_outside_the_budget() -> None:
    clock = FakeClock()
    tracker = ExecutionTracker(clock=clock)
    pipeline = MiddlewarePipeline([ChatCache(clock=clock), BudgetAccounting(tracker)])
    model = Model()
    await pipeline.run(ctx_for(clock), model)
    await pipeline.run(ctx_for(clock), model)
    assert (tracker.usage().turns, tracker.usage().tokens) == (1, 20)


def test_the_key_is_stable_and_ignores_option_order() -> None:
    messages = [
        ChatMessage.user("hi"),
        ChatMessage.assistant(None, (ToolCall(id="1", name="f", arguments={"b": 1, "a": 2}),)),
    ]
    tools = [ToolSpec(name="f", parameters={"type": "object", "properties": {}})]
    key = request_key(messages, tools, {"temperature": 0, "top_p": 1})
    assert key == request_key(list(messages), list(tools), {"top_p": 1, "temperature": 0})
    assert key is not None
    assert len(key) == 64
    script = (
        "from corral.kernel import ChatMessage, ToolCall\n"
        "from corral.runtime import ToolSpec\n"
        "from corral.runtime.middleware._cache import request_key\n"
        "m = [ChatMessage.user('hi'), ChatMessage.assistant(None, "
        "(ToolCall(id='1', name='f', arguments={'a': 2, 'b': 1}),))]\n"
        "t = [ToolSpec(name='f', parameters={'properties': {}, 'type': 'object'})]\n"
        "print(request_key(m, t, {'top_p': 1, 'temperature': 0}))\n"
    )
    other_process = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=20
    )
    assert other_process.stdout.strip() == key
    assert request_key(messages, tools, {"x": float("nan")}) is None


def test_runs_at_the_chat_stage_only() -> None:
    cache = ChatCache()
    pipeline = MiddlewarePipeline([cache])
    assert pipeline.for_stage(MiddlewareStage.CHAT) == (cache,)
    assert pipeline.for_stage(MiddlewareStage.TOOL) == ()
    assert pipeline.for_stage(MiddlewareStage.TURN) == ()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_entries": 0}, "max_entries must be a positive integer"),
        ({"max_entries": 2.5}, "max_entries must be a positive integer"),
        ({"ttl_s": 0}, "ttl_s must be a finite number > 0 or None"),
        ({"ttl_s": -1}, "ttl_s must be a finite number > 0 or None"),
        ({"ttl_s": "10"}, "ttl_s must be a finite number > 0 or None"),
        ({"clock": "now"}, "clock must be a Clock"),
    ],
)
def test_bad_arguments(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=f"ChatCache: {message}"):
        ChatCache(**kwargs)
