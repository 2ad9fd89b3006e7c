import pytest

from corral.kernel import ChatMessage, InvalidArgumentError, Role, ToolCall


def test_factories_build_each_role() -> None:
    call = ToolCall("c1", "search", {"q": "x"})
    assert ChatMessage.system("s").role is Role.SYSTEM
    assert ChatMessage.user("u").content == "u"
    assistant = ChatMessage.assistant(None, (call,))
    assert assistant.tool_calls == (call,)
    tool = ChatMessage.tool("c1", "result", name="search")
    assert (tool.role, tool.tool_call_id, tool.name) == (Role.TOOL, "c1", "search")


def test_role_given_as_text_is_coerced() -> None:
    assert ChatMessage("user", "hi").role is Role.USER  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("build", "argument"),
    [
        (lambda: ChatMessage("robot", "x"), "role"),  # type: ignore[arg-type]
        (lambda: ChatMessage(Role.USER, 5), "content"),  # type: ignore[arg-type]
        (lambda: ChatMessage(Role.USER, "x", (ToolCall("c", "t"),)), "tool_calls"),
        (lambda: ChatMessage(Role.TOOL, "x"), "tool_call_id"),
        (lambda: ChatMessage(Role.USER, "x", tool_call_id="c"), "tool_call_id"),
        (lambda: ToolCall("", "t"), "id"),
        (lambda: ToolCall("c", ""), "name"),
        (lambda: ToolCall("c", "t", ["not", "a", "mapping"]), "arguments"),  # type: ignore[arg-type]
        (lambda: ToolCall("c", "t", {}, invalid_arguments=5), "invalid_arguments"),  # type: ignore[arg-type]
        (lambda: ChatMessage(Role.ASSISTANT, "x", 5), "tool_calls"),  # type: ignore[arg-type]
        (lambda: ChatMessage(Role.ASSISTANT, "x", "ab"), "tool_calls"),  # type: ignore[arg-type]
        (lambda: ChatMessage(Role.USER, "x", name=5), "name"),  # type: ignore[arg-type]
        (lambda: ChatMessage(Role.USER, "x", name=""), "name"),
    ],
)
def test_invalid_messages_are_refused(build: object, argument: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        build()  # type: ignore[operator]
    assert info.value.argument == argument


def test_tool_calls_given_as_a_list_become_a_tuple() -> None:
    call = ToolCall("c1", "search")
    message = ChatMessage(Role.ASSISTANT, None, [call])  # type: ignore[arg-type]
    assert message.tool_calls == (call,)
