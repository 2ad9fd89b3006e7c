"""Chat messages: the one type history, compaction and model clients all speak."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from corral.kernel import _validate as v
from corral.kernel._errors import InvalidArgumentError


class Role(StrEnum):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A model's request to call a tool.

    ``arguments`` is the decoded JSON object. When the model sent arguments that are not a
    JSON object, ``arguments`` is empty and ``invalid_arguments`` holds the raw text, so the
    loop can tell the model instead of guessing.
    """

    id: str
    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)
    invalid_arguments: str | None = None

    def __post_init__(self) -> None:
        v.non_empty_str("ToolCall", "id", self.id)
        v.non_empty_str("ToolCall", "name", self.name)
        v.instance_of("ToolCall", "arguments", self.arguments, Mapping)
        invalid: Any = self.invalid_arguments
        if invalid is not None and not isinstance(invalid, str):
            raise InvalidArgumentError("ToolCall", "invalid_arguments", "a string or None", invalid)


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One message of a conversation.

    ``tool_calls`` only on assistant messages; ``tool_call_id`` only (and always) on tool
    messages.
    """

    role: Role
    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        where = "ChatMessage"
        # Fields are typed, but callers build messages from JSON: check them at run time.
        role: Any = self.role
        if not isinstance(role, Role):
            try:
                object.__setattr__(self, "role", Role(role))
            except ValueError:
                raise InvalidArgumentError(
                    where, "role", "one of system, user, assistant, tool", role
                ) from None
        content: Any = self.content
        if content is not None and not isinstance(content, str):
            raise InvalidArgumentError(where, "content", "a string or None", content)
        calls: Any = self.tool_calls
        if not isinstance(calls, tuple):
            if isinstance(calls, str | bytes | Mapping) or not isinstance(calls, Iterable):
                raise InvalidArgumentError(where, "tool_calls", "a sequence of ToolCall", calls)
            object.__setattr__(self, "tool_calls", tuple(calls))
        for call in self.tool_calls:
            v.instance_of(where, "tool_calls[]", call, ToolCall)
        if self.tool_calls and self.role is not Role.ASSISTANT:
            raise InvalidArgumentError(where, "tool_calls", "empty unless role is assistant", 1)
        if self.role is Role.TOOL:
            v.non_empty_str(where, "tool_call_id", self.tool_call_id)
        elif self.tool_call_id is not None:
            raise InvalidArgumentError(
                where, "tool_call_id", "None unless role is tool", self.tool_call_id
            )
        v.non_empty_str(where, "name", self.name, optional=True)

    @classmethod
    def system(cls, content: str) -> ChatMessage:
        return cls(Role.SYSTEM, content)

    @classmethod
    def user(cls, content: str) -> ChatMessage:
        return cls(Role.USER, content)

    @classmethod
    def assistant(cls, content: str | None, tool_calls: tuple[ToolCall, ...] = ()) -> ChatMessage:
        return cls(Role.ASSISTANT, content, tuple(tool_calls))

    @classmethod
    def tool(cls, tool_call_id: str, content: str, name: str | None = None) -> ChatMessage:
        return cls(Role.TOOL, content, tool_call_id=tool_call_id, name=name)
