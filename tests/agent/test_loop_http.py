"""The agent loop against a real OpenAI-compatible HTTP server on loopback."""

import asyncio
import json

import pytest

from corral.agent import Agent
from corral.kernel import (
    BudgetExhaustedError,
    CancellationError,
    DeadlineExceededError,
    ExecutionBudget,
    RunMeta,
)
from corral.runtime import (
    Cancellation,
    ModelHTTPError,
    ModelPrice,
    ModelResponseError,
    OpenAIClient,
    Retry,
    StopAfterAttempt,
    WaitFixed,
)
from tests.support.openai_server import OpenAIServer, completion, reply, tool_call
from tests.support.polling import settle

PRICES = {"test-model": ModelPrice(input_per_mtok_usd=1.0, output_per_mtok_usd=2.0)}


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def test_tool_loop_over_http(openai_server: OpenAIServer) -> None:
    openai_server.enqueue(
        completion(tool_calls=[tool_call("add", {"a": 2, "b": 3}, id="c1")], usage=(100, 10)),
        completion("the sum is 5", usage=(150, 5)),
    )
    async with OpenAIClient(openai_server.base_url, "test-model", prices=PRICES) as client:
        agent = Agent(client, instructions="You add numbers.", tools=[add])
        run = await agent.run("what is 2 + 3?")

    assert run.output == "the sum is 5"
    assert [(o.tool, o.status, o.output) for o in run.tool_calls] == [("add", "ok", "5")]
    assert run.usage.tokens == 265
    assert run.usage.turns == 2
    assert run.usage.cost_usd == pytest.approx((250 * 1.0 + 15 * 2.0) / 1e6)

    first, second = (r.json for r in openai_server.requests)
    assert first["messages"][0] == {"role": "system", "content": "You add numbers."}
    offered = first["tools"][0]["function"]
    assert offered["name"] == "add"
    assert offered["parameters"]["required"] == ["a", "b"]
    assert offered["parameters"]["properties"]["a"]["type"] == "integer"
    tool_message = second["messages"][-1]
    assert tool_message["role"] == "tool"
    assert tool_message["tool_call_id"] == "c1"
    assert tool_message["content"] == "5"
    assert json.loads(second["messages"][-2]["tool_calls"][0]["function"]["arguments"]) == {
        "a": 2,
        "b": 3,
    }


async def test_token_budget_stops_the_run_when_passed(openai_server: OpenAIServer) -> None:
    openai_server.enqueue(
        completion(tool_calls=[tool_call("add", {"a": 1, "b": 1})], usage=(20, 15)),
        completion("never asked"),
    )
    async with OpenAIClient(openai_server.base_url, "test-model") as client:
        agent = Agent(client, tools=[add], budget=ExecutionBudget(max_tokens=30))
        with pytest.raises(BudgetExhaustedError) as info:
            await agent.run("go")
    assert (info.value.dimension, info.value.limit, info.value.used) == ("tokens", 30, 35)
    assert "used 35 of a limit of 30" in str(info.value)
    assert any("stopped after 1 turns" in note for note in info.value.__notes__)
    assert len(openai_server.requests) == 1
    assert openai_server.pending == 1


async def test_turn_budget_refuses_the_call_that_would_pass_it(
    openai_server: OpenAIServer,
) -> None:
    for _ in range(3):
        openai_server.enqueue(completion(tool_calls=[tool_call("add", {"a": 1, "b": 1})]))
    async with OpenAIClient(openai_server.base_url, "test-model") as client:
        agent = Agent(client, tools=[add], budget=ExecutionBudget(max_turns=2))
        with pytest.raises(BudgetExhaustedError) as info:
            await agent.run("loop forever")
    assert (info.value.dimension, info.value.limit, info.value.used) == ("turns", 2, 2)
    assert len(openai_server.requests) == 2


async def test_deadline_abandons_a_slow_model_call(openai_server: OpenAIServer) -> None:
    openai_server.enqueue(reply(completion("too late"), delay_s=20))
    async with OpenAIClient(openai_server.base_url, "test-model") as client:
        agent = Agent(client, budget=ExecutionBudget(deadline_s=0.2))
        with pytest.raises(DeadlineExceededError) as info:
            await agent.run("take your time")
    assert info.value.code == "deadline_exceeded"


async def test_cancel_from_outside_interrupts_the_call(openai_server: OpenAIServer) -> None:
    openai_server.enqueue(reply(completion("too late"), delay_s=20))
    token = Cancellation()
    async with OpenAIClient(openai_server.base_url, "test-model") as client:
        agent = Agent(client)
        task = asyncio.create_task(agent.run("wait", meta=RunMeta(cancellation=token)))
        await settle(lambda: bool(openai_server.requests))
        token.cancel("operator pressed stop")
        with pytest.raises(CancellationError, match="operator pressed stop"):
            await task


async def test_outside_task_cancellation_passes_through(openai_server: OpenAIServer) -> None:
    openai_server.enqueue(reply(completion("too late"), delay_s=20))
    async with OpenAIClient(openai_server.base_url, "test-model") as client:
        task = asyncio.create_task(Agent(client).run("wait"))
        await settle(lambda: bool(openai_server.requests))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_http_500_ends_the_run_with_a_retryable_model_error(
    openai_server: OpenAIServer,
) -> None:
    openai_server.enqueue(reply("upstream exploded", status=500))
    async with OpenAIClient(openai_server.base_url, "test-model") as client:
        with pytest.raises(ModelHTTPError) as info:
            await Agent(client).run("hi")
    assert info.value.status_code == 500
    assert info.value.retryable


async def test_retry_middleware_recovers_from_a_500(openai_server: OpenAIServer) -> None:
    openai_server.enqueue(reply("blip", status=503), completion("fine now", usage=(5, 5)))
    retry = Retry(stop=StopAfterAttempt(3), wait=WaitFixed(0.0))
    async with OpenAIClient(openai_server.base_url, "test-model") as client:
        run = await Agent(client, middleware=[retry]).run("hi")
    assert run.output == "fine now"
    assert run.usage.turns == 2  # the failed attempt counts as a turn too
    assert run.usage.tokens == 10
    assert len(openai_server.requests) == 2


async def test_garbage_from_the_server_is_a_typed_error(openai_server: OpenAIServer) -> None:
    openai_server.enqueue(reply("<html>not json</html>"))
    async with OpenAIClient(openai_server.base_url, "test-model") as client:
        with pytest.raises(ModelResponseError) as info:
            await Agent(client).run("hi")
    assert info.value.code == "model_bad_response"
    assert not info.value.retryable
