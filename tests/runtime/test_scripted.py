"""ScriptedClient: plays its script in order, records requests, fails loudly when exhausted."""

from __future__ import annotations

from typing import Any

import pytest

from corral.kernel import ChatMessage, InvalidArgumentError, ToolCall, UsageError
from corral.runtime import (
    ChatResult,
    LLMClient,
    ModelHTTPError,
    ScriptedClient,
    ScriptedRequest,
    ScriptExhaustedError,
    ToolSpec,
    Usage,
)

HELLO = [ChatMessage.user("hello")]
TOOL = ToolSpec(name="search")


async def test_plays_items_in_order() -> None:
    canned = ScriptedClient.text_reply("canned", prompt_tokens=3, completion_tokens=4)
    client = ScriptedClient(["first", canned], model="demo")
    first = await client.generate(HELLO)
    assert first.text == "first"
    assert first.usage == Usage()
    assert first.cost_usd == 0.0
    assert first.model == "demo"
    assert first.finish_reason == "stop"
    assert await client.generate(HELLO) is canned
    assert client.remaining == 0


async def test_exception_item_is_raised() -> None:
    error = ModelHTTPError(503, "busy", url="http://model/v1/chat/completions")
    client = ScriptedClient([error, "after"])
    with pytest.raises(ModelHTTPError) as caught:
        await client.generate(HELLO)
    assert caught.value is error
    assert (await client.generate(HELLO)).text == "after"


async def test_callables_plain_and_async_see_messages_and_tools() -> None:
    seen: list[tuple[list[ChatMessage], list[ToolSpec] | None]] = []

    def plain(messages: list[ChatMessage], tools: list[ToolSpec] | None) -> str:
        seen.append((messages, tools))
        return f"you said {messages[-1].content}"

    async def coroutine(messages: list[ChatMessage], tools: list[ToolSpec] | None) -> ChatResult:
        seen.append((messages, tools))
        return ScriptedClient.tool_call_reply("search", {"q": "x"}, call_id="c1")

    client = ScriptedClient([plain, coroutine])
    assert (await client.generate(HELLO)).text == "you said hello"
    result = await client.generate(HELLO, tools=[TOOL])
    assert result.tool_calls == (ToolCall("c1", "search", {"q": "x"}),)
    assert seen == [(HELLO, None), (HELLO, [TOOL])]


async def test_callable_returning_something_else_is_refused() -> None:
    def broken(messages: list[ChatMessage], tools: list[ToolSpec] | None) -> Any:
        return 42

    client = ScriptedClient([broken])
    with pytest.raises(InvalidArgumentError, match="must be a ChatResult or a str, got 42"):
        await client.generate(HELLO)


async def test_requests_are_recorded_with_tools_and_options() -> None:
    client = ScriptedClient(["a", "b"])
    await client.generate(HELLO, tools=[TOOL], temperature=0.1)
    await client.generate((*HELLO, ChatMessage.assistant("a")))
    first, second = client.requests
    assert first == ScriptedRequest(
        messages=tuple(HELLO), tools=(TOOL,), options={"temperature": 0.1}
    )
    assert second.tools is None
    assert second.options == {}
    assert [m.content for m in second.messages] == ["hello", "a"]


async def test_requests_are_a_snapshot_of_the_messages() -> None:
    client = ScriptedClient(["a"])
    messages = list(HELLO)
    await client.generate(messages)
    messages.append(ChatMessage.user("later"))
    assert len(client.requests[0].messages) == 1


async def test_exhausted_script_raises_and_still_records_the_request() -> None:
    client = ScriptedClient(["one", "two"])
    await client.generate(HELLO)
    await client.generate(HELLO)
    with pytest.raises(ScriptExhaustedError) as caught:
        await client.generate(HELLO)
    error = caught.value
    assert isinstance(error, UsageError)
    assert error.code == "script_exhausted"
    assert error.retryable is False
    assert error.replies == 2
    assert "its script had 2 replies and request 3 asked for another" in error.message
    assert len(client.requests) == 3


async def test_empty_script_and_one_reply_wording() -> None:
    with pytest.raises(ScriptExhaustedError, match="had 0 replies and request 1"):
        await ScriptedClient().generate(HELLO)
    client = ScriptedClient(["x"])
    await client.generate(HELLO)
    with pytest.raises(ScriptExhaustedError, match="had 1 reply and request 2"):
        await client.generate(HELLO)


async def test_add_extends_the_script() -> None:
    client = ScriptedClient()
    client.add("late", "later")
    assert client.remaining == 2
    assert (await client.generate(HELLO)).text == "late"
    assert client.remaining == 1


def test_text_reply_helper_carries_usage_and_cost() -> None:
    result = ScriptedClient.text_reply(
        "done", prompt_tokens=100, completion_tokens=20, cost_usd=0.25, model="m"
    )
    assert result.text == "done"
    assert result.usage.total_tokens == 120
    assert result.cost_usd == 0.25
    assert result.model == "m"
    assert ScriptedClient.text_reply("x", cost_usd=None).cost_usd is None


def test_tool_call_reply_helper() -> None:
    extra = ToolCall("c9", "fetch", {"url": "u"})
    result = ScriptedClient.tool_call_reply(
        "search",
        {"q": "corral"},
        call_id="c1",
        text="looking",
        more=[extra],
        prompt_tokens=7,
        completion_tokens=2,
        cost_usd=0.01,
    )
    assert result.tool_calls == (ToolCall("c1", "search", {"q": "corral"}), extra)
    assert result.text == "looking"
    assert result.finish_reason == "tool_calls"
    assert result.usage == Usage(prompt_tokens=7, completion_tokens=2)
    assert result.cost_usd == 0.01
    a = ScriptedClient.tool_call_reply("search")
    b = ScriptedClient.tool_call_reply("search")
    assert a.tool_calls[0].id != b.tool_calls[0].id
    assert dict(a.tool_calls[0].arguments) == {}


def test_is_an_llm_client() -> None:
    assert isinstance(ScriptedClient(), LLMClient)


@pytest.mark.parametrize(
    ("script", "argument"),
    [
        ("hello", "script"),
        (42, "script"),
        ([42], "script[0]"),
        (["ok", ValueError], "script[1]"),
        ([None], "script[0]"),
    ],
)
def test_bad_scripts_are_refused(script: Any, argument: str) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        ScriptedClient(script)
    assert caught.value.argument == argument


def test_bad_model_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="model must be a non-empty string"):
        ScriptedClient(model="")


@pytest.mark.parametrize(
    ("messages", "kwargs", "argument"),
    [
        ("hello", {}, "messages"),
        ([{"role": "user"}], {}, "messages[]"),
        (HELLO, {"tools": TOOL}, "tools"),
        (HELLO, {"tools": ["search"]}, "tools[]"),
    ],
)
async def test_generate_refuses_bad_arguments(
    messages: Any, kwargs: dict[str, Any], argument: str
) -> None:
    client = ScriptedClient(["unused"])
    with pytest.raises(InvalidArgumentError) as caught:
        await client.generate(messages, **kwargs)
    assert caught.value.argument == argument
    assert client.remaining == 1
    assert client.requests == []


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"arguments": ["q"]}, "arguments"),
        ({"call_id": ""}, "call_id"),
        ({"more": ["c"]}, "more[]"),
    ],
)
def test_tool_call_reply_refuses_bad_arguments(kwargs: dict[str, Any], argument: str) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        ScriptedClient.tool_call_reply("search", **kwargs)
    assert caught.value.argument == argument


def test_text_reply_refuses_non_text() -> None:
    with pytest.raises(InvalidArgumentError, match="text must be a str"):
        ScriptedClient.text_reply(None)  # type: ignore[arg-type]
