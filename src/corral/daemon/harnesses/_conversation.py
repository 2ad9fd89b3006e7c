"""An ``openai`` agent's session as chat messages: what goes to the model before a turn's
prompt (shaped by the spec's ``compaction``), and what the turn said, back as session
messages."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from corral.daemon._records import SessionMessage
from corral.daemon._spec import CompactionSpec
from corral.kernel import ChatMessage, CompactionStrategy, MiddlewareStage, Role, ToolCall
from corral.runtime import (
    CallNext,
    ChatResult,
    ExecutionTracker,
    LLMClient,
    LLMSummarization,
    MiddlewareContext,
    SlidingWindow,
    TokenTruncation,
)
from corral.runtime._compaction import compaction_tracker

# What a strategy uses when the spec leaves an option out.
WINDOW_MESSAGES = 40
TRUNCATE_TOKENS = 8000
SUMMARY_KEEP_LAST = 6
SUMMARY_TRIGGER = 20


def chat_history(session: Sequence[SessionMessage]) -> list[ChatMessage]:
    """``session`` as the chat messages a model takes, oldest first.

    ``user``, ``assistant`` and ``tool`` messages are sent as they are; an ``error`` (a
    failed turn) is told as a user message (``[corral] turn N failed: ...``). Whatever a
    chat API would refuse is mended: a tool call no result answers is left out of its
    message, and a tool result that answers no call in the message before it is dropped.
    """
    messages: list[ChatMessage] = []
    for i, item in enumerate(session):
        role, content = item["role"], item.get("content") or ""
        if role == "user":
            messages.append(ChatMessage.user(content))
        elif role == "error":
            messages.append(ChatMessage.user(f"[corral] turn {item['turn']} failed: {content}"))
        elif role == "assistant":
            answered = _answered(session, i + 1)
            calls = tuple(
                _tool_call(call) for call in item.get("toolCalls") or () if call["id"] in answered
            )
            if content or calls:
                messages.append(ChatMessage.assistant(content or None, calls))
        elif role == "tool":
            call_id = item.get("toolCallId") or ""
            opener = _opener(messages)
            if opener is not None and any(c.id == call_id for c in opener.tool_calls):
                messages.append(ChatMessage.tool(call_id, content, name=item.get("name") or None))
    return messages


def _answered(session: Sequence[SessionMessage], start: int) -> set[str]:
    """The tool-call ids answered by the tool results right after ``start``."""
    found: set[str] = set()
    for item in session[start:]:
        if item["role"] != "tool":
            break
        found.add(item.get("toolCallId") or "")
    return found


def _opener(messages: list[ChatMessage]) -> ChatMessage | None:
    """The assistant message whose tool results end ``messages``."""
    for message in reversed(messages):
        if message.role is not Role.TOOL:
            return message if message.role is Role.ASSISTANT else None
    return None


def _tool_call(call: Mapping[str, Any]) -> ToolCall:
    text = str(call.get("arguments") or "{}")
    try:
        arguments = json.loads(text)
    except ValueError:
        arguments = None
    if isinstance(arguments, dict):
        return ToolCall(str(call["id"]), str(call["name"]), arguments)
    return ToolCall(str(call["id"]), str(call["name"]), {}, invalid_arguments=text)


def strategy(spec: CompactionSpec | None, client: LLMClient) -> CompactionStrategy | None:
    """The runtime's strategy for the spec's ``compaction`` (None: the whole session)."""
    if spec is None:
        return None
    if spec.strategy == "window":
        return SlidingWindow(spec.max_messages or WINDOW_MESSAGES)
    if spec.strategy == "truncate":
        return TokenTruncation(spec.max_tokens or TRUNCATE_TOKENS)
    options: dict[str, Any] = {}
    if spec.instructions is not None:
        options["instructions"] = spec.instructions
    return LLMSummarization(
        client,
        keep_last=SUMMARY_KEEP_LAST if spec.keep_last is None else spec.keep_last,
        trigger_messages=spec.trigger_messages or SUMMARY_TRIGGER,
        **options,
    )


async def prior_messages(
    session: Sequence[SessionMessage],
    compaction: CompactionSpec | None,
    client: LLMClient,
    tracker: ExecutionTracker,
) -> list[ChatMessage]:
    """What goes to the model before the turn's prompt: the session, compacted. A summary
    is a model call paid from ``tracker`` (the turn's budget: its tokens and dollars count
    in the turn's usage); it raises as the model or the budget does."""
    history = chat_history(session)
    shaper = strategy(compaction, client)
    if shaper is None or not history:
        return history
    paying = compaction_tracker.set(tracker)
    try:
        return await shaper.compact(history)
    finally:
        compaction_tracker.reset(paying)


class Transcript:
    """A middleware (CHAT, put first) that keeps the conversation as of the last model call:
    the request, then the reply when one came. So what a turn said is known when it fails
    too (a budget that refuses the next call, a model error, a timeout).

    ``start`` is where the turn's own messages begin (after the instructions, the history
    and the prompt); until it is set, :meth:`said` is empty."""

    stages = frozenset({MiddlewareStage.CHAT})

    def __init__(self) -> None:
        self.messages: list[ChatMessage] = []
        self.start: int | None = None

    async def process(self, ctx: MiddlewareContext, call_next: CallNext) -> None:
        self.messages = list(ctx.messages)
        await call_next()
        if isinstance(ctx.result, ChatResult):
            self.messages.append(ctx.result.message)

    def said(self) -> tuple[dict[str, Any], ...]:
        """The turn's messages so far, as the session keeps them."""
        if self.start is None:
            return ()
        return turn_messages(self.messages[self.start :])


def turn_messages(messages: Sequence[ChatMessage]) -> tuple[dict[str, Any], ...]:
    """A turn's messages after its prompt (model replies, tool results), as the session
    keeps them (see :class:`SessionMessage`)."""
    found: list[dict[str, Any]] = []
    for message in messages:
        if message.role is Role.ASSISTANT:
            item: dict[str, Any] = {"role": "assistant", "content": message.content or ""}
            if message.tool_calls:
                item["toolCalls"] = [
                    {
                        "id": call.id,
                        "name": call.name,
                        "arguments": call.invalid_arguments
                        if call.invalid_arguments is not None
                        else json.dumps(dict(call.arguments), default=str),
                    }
                    for call in message.tool_calls
                ]
            found.append(item)
        elif message.role is Role.TOOL and message.tool_call_id is not None:
            item = {
                "role": "tool",
                "content": message.content or "",
                "toolCallId": message.tool_call_id,
            }
            if message.name:
                item["name"] = message.name
            found.append(item)
    return tuple(found)
