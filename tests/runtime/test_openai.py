"""OpenAIClient against a real OpenAI-compatible HTTP server on the loopback interface."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import httpx
import pytest

from corral.kernel import ChatMessage, InvalidArgumentError, ToolCall, UsageError
from corral.runtime import (
    FakeClock,
    LLMClient,
    ModelHTTPError,
    ModelPrice,
    ModelResponseError,
    ModelUnavailableError,
    OpenAIClient,
    ToolSpec,
    Usage,
)
from tests.support.openai_server import OpenAIServer, completion, reply, tool_call

PRICE = ModelPrice(2.0, 8.0)  # $ per million tokens


@pytest.fixture
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer() as srv:
        yield srv


def client_for(server: OpenAIServer, **kwargs: Any) -> OpenAIClient:
    kwargs.setdefault("prices", {"test-model": PRICE})
    return OpenAIClient(server.base_url, "test-model", **kwargs)


HELLO = [ChatMessage.user("hello")]


# --- request shape ------------------------------------------------------------------------


async def test_request_carries_messages_tools_options_and_bearer_auth(
    server: OpenAIServer,
) -> None:
    server.enqueue(completion("ok"))
    weather = ToolSpec(
        name="weather",
        description="Weather for a city",
        parameters={"type": "object", "properties": {"city": {"type": "string"}}},
    )
    history = [
        ChatMessage.system("be brief"),
        ChatMessage.user("weather in Paris?"),
        ChatMessage.assistant(
            None,
            (
                ToolCall("c1", "weather", {"city": "Paris"}),
                ToolCall("c2", "weather", {}, invalid_arguments="{city: Oslo"),
            ),
        ),
        ChatMessage.tool("c1", "sunny", name="weather"),
        ChatMessage.tool("c2", "bad arguments"),
    ]
    async with client_for(
        server, api_key="sk-test", default_options={"temperature": 0.5, "max_tokens": 50}
    ) as client:
        await client.generate(history, tools=[weather], max_tokens=10, seed=7)

    (request,) = server.requests
    assert request.method == "POST"
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == "Bearer sk-test"
    assert request.headers["content-type"] == "application/json"
    body = request.json
    assert body["model"] == "test-model"
    assert body["temperature"] == 0.5
    assert body["max_tokens"] == 10  # the per-call option wins over the default
    assert body["seed"] == 7
    assert "stream" not in body
    assert body["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "weather", "arguments": "{city: Oslo"},
                },
            ],
        },
        {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
        {"role": "tool", "content": "bad arguments", "tool_call_id": "c2"},
    ]
    assert json.loads(body["messages"][2]["tool_calls"][0]["function"]["arguments"]) == {
        "city": "Paris"
    }
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "weather",
                "description": "Weather for a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]


async def test_no_api_key_sends_no_authorization_and_no_tools_key(server: OpenAIServer) -> None:
    server.enqueue(completion("ok"))
    async with client_for(server) as client:
        await client.generate(HELLO, tools=[])
    (request,) = server.requests
    assert "authorization" not in request.headers
    assert "tools" not in request.json


async def test_model_option_overrides_the_model_for_one_call(server: OpenAIServer) -> None:
    server.enqueue(completion("ok", model="other", usage=(1_000_000, 0)))
    prices = {"other": ModelPrice(1.5, 0.0)}
    async with client_for(server, prices=prices) as client:
        result = await client.generate(HELLO, model="other")
    assert server.requests[0].json["model"] == "other"
    assert result.cost_usd == pytest.approx(1.5)


# --- replies ------------------------------------------------------------------------------


async def test_text_reply_with_usage_and_cost(server: OpenAIServer) -> None:
    server.enqueue(completion("Hello there", usage=(1000, 500)))
    async with client_for(server) as client:
        result = await client.generate(HELLO)
    assert result.text == "Hello there"
    assert result.tool_calls == ()
    assert result.finish_reason == "stop"
    assert result.model == "test-model"
    assert result.usage == Usage(prompt_tokens=1000, completion_tokens=500)
    assert result.cost_usd == pytest.approx(1000 * 2.0 / 1e6 + 500 * 8.0 / 1e6)
    assert result.cached is False


async def test_tool_call_reply(server: OpenAIServer) -> None:
    server.enqueue(
        completion(
            None,
            tool_calls=[
                tool_call("weather", {"city": "Paris"}, id="call_a"),
                tool_call("clock", "{}", id="call_b"),
            ],
            usage=(20, 10),
        )
    )
    async with client_for(server) as client:
        result = await client.generate(HELLO)
    assert result.text is None
    assert result.finish_reason == "tool_calls"
    assert result.tool_calls == (
        ToolCall("call_a", "weather", {"city": "Paris"}),
        ToolCall("call_b", "clock", {}),
    )
    assert all(call.invalid_arguments is None for call in result.tool_calls)


@pytest.mark.parametrize("raw", ["{city: Paris", "[1, 2]", '"text"', "42", "null"])
async def test_arguments_that_are_not_a_json_object_are_kept_raw(
    server: OpenAIServer, raw: str
) -> None:
    server.enqueue(completion(None, tool_calls=[tool_call("weather", raw, id="c9")]))
    async with client_for(server) as client:
        result = await client.generate(HELLO)
    (call,) = result.tool_calls
    assert call.id == "c9"
    assert call.name == "weather"
    assert dict(call.arguments) == {}
    assert call.invalid_arguments == raw


async def test_lenient_tool_call_shapes(server: OpenAIServer) -> None:
    body = completion(None, tool_calls=[tool_call("a", "")])
    calls = body["choices"][0]["message"]["tool_calls"]
    calls.append({"type": "function", "function": {"name": "b", "arguments": {"x": 1}}})
    server.enqueue(body)
    async with client_for(server) as client:
        result = await client.generate(HELLO)
    first, second = result.tool_calls
    assert (dict(first.arguments), first.invalid_arguments) == ({}, None)  # "" means no args
    assert second.id == "call_1"  # a server that sends no id gets a positional one
    assert dict(second.arguments) == {"x": 1}


async def test_missing_usage_gives_zero_usage_and_unknown_cost(server: OpenAIServer) -> None:
    server.enqueue(completion("hi", usage=None))
    async with client_for(server) as client:
        result = await client.generate(HELLO)
    assert result.usage == Usage()
    assert result.cost_usd is None


async def test_unknown_model_has_no_cost(server: OpenAIServer) -> None:
    server.enqueue(completion("hi", model="mystery-model", usage=(10, 10)))
    async with OpenAIClient(server.base_url, "mystery-model") as client:
        result = await client.generate(HELLO)
    assert result.usage.total_tokens == 20
    assert result.cost_usd is None


async def test_price_falls_back_to_the_requested_model(server: OpenAIServer) -> None:
    # Servers often answer with a dated name ("test-model-2024-01-01") for an alias.
    server.enqueue(completion("hi", model="test-model-2024-01-01", usage=(500_000, 0)))
    async with client_for(server) as client:
        result = await client.generate(HELLO)
    assert result.model == "test-model-2024-01-01"
    assert result.cost_usd == pytest.approx(1.0)


async def test_reply_without_model_names_the_requested_model(server: OpenAIServer) -> None:
    body = completion("hi")
    del body["model"]
    server.enqueue(body)
    async with client_for(server) as client:
        result = await client.generate(HELLO)
    assert result.model == "test-model"


# --- HTTP errors --------------------------------------------------------------------------


async def test_http_500_is_a_retryable_model_http_error(server: OpenAIServer) -> None:
    server.enqueue(reply({"error": {"message": "upstream exploded"}}, status=500))
    async with client_for(server) as client:
        with pytest.raises(ModelHTTPError) as caught:
            await client.generate(HELLO)
    error = caught.value
    assert error.code == "model_http_error"
    assert error.status_code == 500
    assert error.retryable is True
    assert error.retry_after_s is None
    assert "HTTP 500" in error.message
    assert "upstream exploded" in error.message
    assert server.base_url in error.message


async def test_http_429_parses_retry_after_seconds(server: OpenAIServer) -> None:
    server.enqueue(reply("slow down", status=429, headers={"Retry-After": "2.5"}))
    async with client_for(server) as client:
        with pytest.raises(ModelHTTPError) as caught:
            await client.generate(HELLO)
    assert caught.value.status_code == 429
    assert caught.value.retryable is True
    assert caught.value.retry_after_s == 2.5
    assert caught.value.details["retry_after_s"] == 2.5


async def test_http_429_parses_retry_after_http_date(server: OpenAIServer) -> None:
    clock = FakeClock(start=datetime(2030, 1, 1, 12, 0, 0, tzinfo=UTC))
    later = format_datetime(clock.now() + timedelta(seconds=30), usegmt=True)
    server.enqueue(reply("slow down", status=429, headers={"Retry-After": later}))
    async with client_for(server, clock=clock) as client:
        with pytest.raises(ModelHTTPError) as caught:
            await client.generate(HELLO)
    assert caught.value.retry_after_s == pytest.approx(30.0)


@pytest.mark.parametrize("header", ["soon", "-3", "nan"])
async def test_unusable_retry_after_is_none(server: OpenAIServer, header: str) -> None:
    server.enqueue(reply("slow down", status=429, headers={"Retry-After": header}))
    async with client_for(server) as client:
        with pytest.raises(ModelHTTPError) as caught:
            await client.generate(HELLO)
    assert caught.value.retry_after_s is None


async def test_http_400_is_not_retryable(server: OpenAIServer) -> None:
    server.enqueue(reply({"error": {"message": "bad request: tools"}}, status=400))
    async with client_for(server) as client:
        with pytest.raises(ModelHTTPError) as caught:
            await client.generate(HELLO)
    assert caught.value.status_code == 400
    assert caught.value.retryable is False
    assert "bad request: tools" in caught.value.message


# --- garbage 2xx bodies -------------------------------------------------------------------


def _mutated(path: list[str | int], value: Any) -> dict[str, Any]:
    body = completion("x", tool_calls=[tool_call("t", "{}", id="c")], usage=(1, 1))
    target: Any = body
    for key in path[:-1]:
        target = target[key]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return body


_DELETE = object()
_MSG: list[str | int] = ["choices", 0, "message"]
_CALL: list[str | int] = [*_MSG, "tool_calls", 0]

GARBAGE: list[tuple[str, bytes | str | dict[str, Any] | list[Any], str]] = [
    ("html", "<html>gateway</html>", "not JSON"),
    ("empty", b"", "not JSON"),
    ("bad utf-8", b'{"choices": "\xff\xfe"}', "not JSON"),
    ("array", [1, 2, 3], "JSON list, not an object"),
    ("no choices", {"id": "x", "object": "chat.completion"}, "'choices' is missing"),
    ("empty choices", _mutated(["choices"], []), "'choices' is missing, empty"),
    ("choices not a list", _mutated(["choices"], {"0": {}}), "not a list"),
    ("choice not an object", _mutated(["choices", 0], "x"), "choices[0] is not an object"),
    ("no message", _mutated(["choices", 0, "message"], _DELETE), "message is missing"),
    ("content a number", _mutated([*_MSG, "content"], 5), "content is not a string"),
    ("tool_calls an object", _mutated([*_MSG, "tool_calls"], {}), "tool_calls is not a list"),
    ("tool call a string", _mutated([*_MSG, "tool_calls", 0], "c"), "is not an object"),
    ("tool call id a number", _mutated([*_CALL, "id"], 3), "id is not a non-empty string"),
    ("no function", _mutated([*_CALL, "function"], _DELETE), "function is missing"),
    ("no name", _mutated([*_CALL, "function", "name"], _DELETE), "function.name is missing"),
    ("arguments a number", _mutated([*_CALL, "function", "arguments"], 1), "arguments is not"),
    ("finish_reason a number", _mutated(["choices", 0, "finish_reason"], 1), "finish_reason"),
    ("model a number", _mutated(["model"], 1), "'model' is not a string"),
    ("usage a list", _mutated(["usage"], [1]), "'usage' is not an object"),
    ("negative tokens", _mutated(["usage", "prompt_tokens"], -1), "usage.prompt_tokens"),
    ("string tokens", _mutated(["usage", "completion_tokens"], "9"), "completion_tokens"),
]


@pytest.mark.parametrize(
    ("body", "problem"), [(b, p) for _, b, p in GARBAGE], ids=[n for n, _, _ in GARBAGE]
)
async def test_garbage_2xx_bodies_are_model_response_errors(
    server: OpenAIServer, body: bytes | str | dict[str, Any] | list[Any], problem: str
) -> None:
    server.enqueue(reply(body, status=200))
    async with client_for(server) as client:
        with pytest.raises(ModelResponseError) as caught:
            await client.generate(HELLO)
    error = caught.value
    assert error.code == "model_bad_response"
    assert error.retryable is False
    assert problem in error.message
    assert "chat/completions" in error.message


async def test_body_excerpt_is_kept_on_a_bad_response(server: OpenAIServer) -> None:
    server.enqueue(reply("<html>" + "x" * 1000 + "</html>", status=200))
    async with client_for(server) as client:
        with pytest.raises(ModelResponseError) as caught:
            await client.generate(HELLO)
    assert caught.value.details["body"].startswith("<html>xxx")
    assert len(caught.value.details["body"]) == 300


# --- transport failures -------------------------------------------------------------------


async def test_connection_refused_is_model_unavailable() -> None:
    with OpenAIServer() as gone:
        base_url = gone.base_url
    async with OpenAIClient(base_url, "test-model") as client:
        with pytest.raises(ModelUnavailableError) as caught:
            await client.generate(HELLO)
    assert caught.value.code == "model_unavailable"
    assert caught.value.retryable is True
    assert "ConnectError" in caught.value.message
    assert base_url in caught.value.message


async def test_slow_server_times_out_as_model_unavailable(server: OpenAIServer) -> None:
    server.enqueue(reply(completion("late"), delay_s=10.0))
    async with client_for(server, timeout_s=0.2) as client:
        with pytest.raises(ModelUnavailableError) as caught:
            await client.generate(HELLO)
    assert "no answer within 0.2 s" in caught.value.message
    assert "ReadTimeout" in caught.value.message
    assert caught.value.retryable is True


# --- lifecycle ----------------------------------------------------------------------------


async def test_given_http_client_is_used_and_not_closed(server: OpenAIServer) -> None:
    server.enqueue(completion("ok"))
    async with httpx.AsyncClient(headers={"X-Trace": "t-1"}) as http:
        async with client_for(server, http_client=http) as client:
            result = await client.generate(HELLO)
        assert result.text == "ok"
        assert not http.is_closed
        assert server.requests[0].headers["x-trace"] == "t-1"


async def test_given_transport_is_used_and_closed_with_the_client(server: OpenAIServer) -> None:
    server.enqueue(completion("ok"))
    transport = httpx.AsyncHTTPTransport(retries=0)
    client = client_for(server, transport=transport)
    assert (await client.generate(HELLO)).text == "ok"
    await client.aclose()
    await client.aclose()  # idempotent
    with pytest.raises(UsageError, match="is closed"):
        await client.generate(HELLO)


async def test_is_an_llm_client_and_exposes_its_settings() -> None:
    async with OpenAIClient("http://127.0.0.1:9/v1/", "m", prices={"m": PRICE}) as client:
        assert isinstance(client, LLMClient)
        assert client.base_url == "http://127.0.0.1:9/v1"
        assert client.model == "m"
        assert client.prices == {"m": PRICE}
        assert "127.0.0.1:9" in repr(client)


# --- bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "kwargs", "argument"),
    [
        (("", "m"), {}, "base_url"),
        (("ftp://host/v1", "m"), {}, "base_url"),
        ((42, "m"), {}, "base_url"),
        (("http:///v1", "m"), {}, "base_url"),
        (("http://h:99999/v1", "m"), {}, "base_url"),
        (("http://h/v1", ""), {}, "model"),
        (("http://h/v1", None), {}, "model"),
        (("http://h/v1", "m"), {"api_key": ""}, "api_key"),
        (("http://h/v1", "m"), {"prices": [("m", PRICE)]}, "prices"),
        (("http://h/v1", "m"), {"prices": {"m": (1.0, 2.0)}}, "prices['m']"),
        (("http://h/v1", "m"), {"prices": {"": PRICE}}, "prices key"),
        (("http://h/v1", "m"), {"timeout_s": 0}, "timeout_s"),
        (("http://h/v1", "m"), {"timeout_s": float("inf")}, "timeout_s"),
        (("http://h/v1", "m"), {"timeout_s": "5"}, "timeout_s"),
        (("http://h/v1", "m"), {"http_client": object()}, "http_client"),
        (("http://h/v1", "m"), {"transport": object()}, "transport"),
        (("http://h/v1", "m"), {"default_options": {"stream": True}}, "default_options['stream']"),
        (
            ("http://h/v1", "m"),
            {"default_options": {"messages": []}},
            "default_options['messages']",
        ),
        (("http://h/v1", "m"), {"default_options": [1]}, "default_options"),
        (("http://h/v1", "m"), {"default_options": {1: 2}}, "default_options key"),
        (("http://h/v1", "m"), {"clock": "now"}, "clock"),
    ],
)
def test_constructor_refuses_bad_arguments(
    args: tuple[Any, ...], kwargs: dict[str, Any], argument: str
) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        OpenAIClient(*args, **kwargs)
    assert caught.value.code == "invalid_argument"
    assert caught.value.argument == argument
    assert caught.value.message.startswith(f"OpenAIClient: {argument} must be")


async def test_http_client_and_transport_together_are_refused() -> None:
    async with httpx.AsyncClient() as http:
        with pytest.raises(InvalidArgumentError, match="transport must be None when"):
            OpenAIClient("http://h/v1", "m", http_client=http, transport=httpx.AsyncHTTPTransport())


@pytest.mark.parametrize(
    ("messages", "kwargs", "argument"),
    [
        ([], {}, "messages"),
        ("hello", {}, "messages"),
        (["hello"], {}, "messages[]"),
        (HELLO, {"tools": "weather"}, "tools"),
        (HELLO, {"tools": [{"name": "weather"}]}, "tools[]"),
        (HELLO, {"stream": True}, "options['stream']"),
        (HELLO, {"model": ""}, "model option"),
        (HELLO, {"metadata": object()}, "messages, tools and options"),
    ],
)
async def test_generate_refuses_bad_arguments_without_calling(
    server: OpenAIServer, messages: Any, kwargs: dict[str, Any], argument: str
) -> None:
    async with client_for(server) as client:
        with pytest.raises(InvalidArgumentError) as caught:
            await client.generate(messages, **kwargs)
    assert caught.value.argument == argument
    assert server.requests == []


def test_model_price_computes_cost_and_refuses_bad_values() -> None:
    price = ModelPrice(input_per_mtok_usd=3.0, output_per_mtok_usd=15.0)
    usage = Usage(prompt_tokens=2_000, completion_tokens=1_000)
    assert price.cost(usage) == pytest.approx(0.006 + 0.015)
    with pytest.raises(InvalidArgumentError, match="input_per_mtok_usd must be a finite number"):
        ModelPrice(-1.0, 1.0)
    with pytest.raises(InvalidArgumentError, match="output_per_mtok_usd"):
        ModelPrice(1.0, float("nan"))
