"""A LangChain chat model for tests: scripted replies with tool calls and usage, no network.

LangChain's own fake chat models (``GenericFakeChatModel``, ...) cannot bind tools; this one,
like the test model of LangChain's agent tests, ignores the tools it is bound to and answers
what its ``script`` says.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable
from pydantic import ConfigDict, PrivateAttr

Script = Callable[[int, Sequence[BaseMessage]], AIMessage]
"""``script(n, messages)``: the n-th reply (from 1) to ``messages``."""


class ScriptedChatModel(BaseChatModel):
    """Answers ``script(n, messages)`` with ``usage_metadata`` of ``input_tokens`` and
    ``output_tokens`` added (none when ``usage`` is False); ``hang`` makes every call wait
    for ever (after setting ``started``). ``calls`` counts the calls."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    script: Script
    model_name: str = "fake-model"
    input_tokens: int = 10
    output_tokens: int = 5
    usage: bool = True
    hang: bool = False
    started: asyncio.Event | None = None
    _calls: int = PrivateAttr(default=0)

    @property
    def calls(self) -> int:
        return self._calls

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Runnable[Any, AIMessage]:
        return self

    def _reply(self, messages: list[BaseMessage]) -> ChatResult:
        self._calls += 1
        reply = self.script(self._calls, messages)
        if self.usage:
            reply = reply.model_copy(
                update={
                    "usage_metadata": {
                        "input_tokens": self.input_tokens,
                        "output_tokens": self.output_tokens,
                        "total_tokens": self.input_tokens + self.output_tokens,
                    }
                }
            )
        return ChatResult(generations=[ChatGeneration(message=reply)])

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return self._reply(messages)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        if self.hang:
            if self.started is not None:
                self.started.set()
            await asyncio.Event().wait()
        return self._reply(messages)


def call_tool(name: str, args: dict[str, Any], call_id: str = "call_1") -> AIMessage:
    """A reply asking for one tool call."""
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": call_id}])


def last_tool_result(messages: Sequence[BaseMessage]) -> str:
    """The text of the last tool result in ``messages`` ("" when none)."""
    for message in reversed(messages):
        if isinstance(message, ToolMessage):
            return message.text
    return ""


def forever(name: str, args: dict[str, Any]) -> Script:
    """A runaway model: asks for the same tool on every call."""
    return lambda n, messages: call_tool(name, args, f"call_{n}")


def then_answer(*calls: AIMessage) -> Script:
    """The given replies in order, then a final answer repeating the last tool result."""

    def script(n: int, messages: Sequence[BaseMessage]) -> AIMessage:
        if n <= len(calls):
            return calls[n - 1]
        return AIMessage(content=f"done: {last_tool_result(messages)}")

    return script
