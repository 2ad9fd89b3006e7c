"""Compaction strategies: sliding window, token truncation, LLM summarisation.

Each implements ``corral.kernel.CompactionStrategy`` and keeps an assistant message with tool
calls and the tool results after it together as one turn (docs/runtime.md has the rules).
"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from typing import TypeVar

from corral.kernel import ChatMessage, CostUnknownError, InvalidArgumentError, Role
from corral.kernel import _validate as v
from corral.runtime._budget import ExecutionTracker
from corral.runtime._llm import LLMClient, ModelResponseError

_T = TypeVar("_T")

TokenCounter = Callable[[ChatMessage], "int | Awaitable[int]"]

DEFAULT_SUMMARY_INSTRUCTIONS = (
    "Summarise the conversation below for whoever continues it. Keep every fact, decision, "
    "open question, name, number and tool result that later turns may need; drop pleasantries "
    "and repetition. Answer with the summary only."
)
SUMMARY_PREFIX = "Summary of the earlier conversation:\n"


def approx_tokens(message: ChatMessage) -> int:
    """A cheap estimate of the tokens ``message`` takes in a prompt.

    One token per four characters (rounded up) of its content, name, tool-call names and
    JSON arguments, plus four tokens of per-message overhead. Close for English prose with
    common tokenizers; not exact for any model. Pass a real tokenizer as ``count_tokens``
    when the limit is tight.
    """
    chars = len(message.content or "") + len(message.name or "")
    for call in message.tool_calls:
        chars += len(call.name) + len(call.id)
        chars += len(
            call.invalid_arguments
            if call.invalid_arguments is not None
            else json.dumps(dict(call.arguments), default=str)
        )
    if message.tool_call_id is not None:
        chars += len(message.tool_call_id)
    return 4 + math.ceil(chars / 4)


def sequence_of(where: str, name: str, value: object, kind: type[_T]) -> list[_T]:
    """``value`` as a list, after checking it is a sequence (not a string) of ``kind``."""
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise InvalidArgumentError(where, name, f"a sequence of {kind.__name__}", value)
    for item in value:
        v.instance_of(where, f"{name}[]", item, kind)
    return list(value)


def _checked(where: str, history: object) -> list[ChatMessage]:
    return sequence_of(where, "history", history, ChatMessage)


def _turns(indices: list[int], history: list[ChatMessage]) -> list[list[int]]:
    """Group the messages at ``indices`` into turns (lists of indices).

    A tool message joins the turn of the assistant tool call it answers; one that follows no
    such turn (already orphaned in the input) forms an orphan turn of its own.
    """
    turns: list[list[int]] = []
    open_calls = False  # whether the last turn is an assistant-with-tool-calls turn
    for i in indices:
        message = history[i]
        if message.role is Role.TOOL and open_calls:
            turns[-1].append(i)
            continue
        turns.append([i])
        open_calls = message.role is Role.ASSISTANT and bool(message.tool_calls)
    return turns


def _is_orphan(turn: list[int], history: list[ChatMessage]) -> bool:
    return history[turn[0]].role is Role.TOOL


def _window(
    history: list[ChatMessage],
    keep_system: bool,
    fits: Callable[[list[int]], bool],
) -> list[ChatMessage]:
    """Keep pinned system messages plus the newest whole turns for which ``fits`` holds.

    ``fits(turn)`` is asked newest turn first and accounts for the turn when it answers True;
    the first False stops the walk. The newest turn is kept regardless, and alone when it does
    not fit.
    """
    pinned = {i for i, m in enumerate(history) if keep_system and m.role is Role.SYSTEM}
    rest = [i for i in range(len(history)) if i not in pinned]
    turns = _turns(rest, history)
    kept: list[list[int]] = []
    for turn in reversed(turns):
        if fits(turn):
            kept.append(turn)
            continue
        if not kept:
            kept.append(turn)
        break
    kept.reverse()
    # Never open the window with a tool result whose call is not in it.
    while len(kept) > 1 and _is_orphan(kept[0], history):
        kept.pop(0)
    chosen = pinned | {i for turn in kept for i in turn}
    return [m for i, m in enumerate(history) if i in chosen]


class SlidingWindow:
    """Keeps the newest ``max_messages`` messages, whole turns only, plus system messages.

    With ``keep_system=True`` system messages are kept in place and not counted; with False
    they are ordinary messages that count and may be dropped. Raises
    :class:`InvalidArgumentError` for a ``max_messages`` that is not a positive integer.
    """

    def __init__(self, max_messages: int, *, keep_system: bool = True) -> None:
        v.positive_int("SlidingWindow", "max_messages", max_messages)
        v.instance_of("SlidingWindow", "keep_system", keep_system, bool)
        self.max_messages = max_messages
        self.keep_system = keep_system

    def __repr__(self) -> str:
        return f"SlidingWindow(max_messages={self.max_messages}, keep_system={self.keep_system})"

    async def compact(self, history: list[ChatMessage]) -> list[ChatMessage]:
        messages = _checked("SlidingWindow.compact", history)
        room = self.max_messages

        def fits(turn: list[int]) -> bool:
            nonlocal room
            if len(turn) > room:
                return False
            room -= len(turn)
            return True

        return _window(messages, self.keep_system, fits)


class TokenTruncation:
    """Keeps the newest whole turns whose tokens, with the system messages', fit ``max_tokens``.

    ``count_tokens(message)`` (plain or async, default :func:`approx_tokens`) must return a
    non-negative integer. With ``keep_system=True`` system messages are always kept and their
    tokens are spent first. Raises :class:`InvalidArgumentError` for a ``max_tokens`` that is
    not a positive integer, a ``count_tokens`` that is not callable, or a count that is not a
    non-negative integer.
    """

    def __init__(
        self,
        max_tokens: int,
        *,
        count_tokens: TokenCounter = approx_tokens,
        keep_system: bool = True,
    ) -> None:
        v.positive_int("TokenTruncation", "max_tokens", max_tokens)
        v.callable_("TokenTruncation", "count_tokens", count_tokens)
        v.instance_of("TokenTruncation", "keep_system", keep_system, bool)
        self.max_tokens = max_tokens
        self.count_tokens = count_tokens
        self.keep_system = keep_system

    def __repr__(self) -> str:
        return f"TokenTruncation(max_tokens={self.max_tokens}, keep_system={self.keep_system})"

    async def _count(self, message: ChatMessage) -> int:
        result = self.count_tokens(message)
        if inspect.isawaitable(result):
            result = await result
        v.non_negative_int("TokenTruncation", "count_tokens(message)", result)
        return int(result)

    async def compact(self, history: list[ChatMessage]) -> list[ChatMessage]:
        messages = _checked("TokenTruncation.compact", history)
        counts = [await self._count(m) for m in messages]
        room = self.max_tokens
        if self.keep_system:
            room -= sum(c for c, m in zip(counts, messages, strict=True) if m.role is Role.SYSTEM)

        def fits(turn: list[int]) -> bool:
            nonlocal room
            cost = sum(counts[i] for i in turn)
            if cost > room:
                return False
            room -= cost
            return True

        return _window(messages, self.keep_system, fits)


compaction_tracker: ContextVar[ExecutionTracker | None] = ContextVar(
    "corral_compaction_tracker", default=None
)
"""The budget that pays for the model calls a compaction makes. ``Agent.run`` sets it to the
run's tracker around the compaction of its session's history; code that compacts on its own
may set it too."""


class LLMSummarization:
    """Past ``trigger_messages`` non-system messages, summarises all but the newest
    ``keep_last`` into one system message written by ``client``.

    The result is: the system messages of the older part (in order), then
    ``system("Summary of the earlier conversation:\\n<summary>")``, then the kept tail. The
    split moves earlier when it would cut a turn, so the tail may hold more than
    ``keep_last`` messages. At or below the trigger the history comes back unchanged (a new
    list). A model error propagates as raised by the client (a ``ModelError``); a reply with
    no text raises :class:`ModelResponseError`. When :data:`compaction_tracker` holds a
    tracker (an agent's run), the summary is paid from it: ``check()`` before the call (so
    ``BudgetExhaustedError`` when nothing is left), its tokens and dollars recorded after (a
    summary is not a turn), and ``CostUnknownError`` for a reply of unknown price under a
    dollar limit. ``keep_last`` must be a non-negative integer
    below ``trigger_messages``, a positive integer; ``instructions`` a non-empty string.
    """

    def __init__(
        self,
        client: LLMClient,
        *,
        keep_last: int = 6,
        trigger_messages: int = 20,
        instructions: str = DEFAULT_SUMMARY_INSTRUCTIONS,
    ) -> None:
        where = "LLMSummarization"
        v.instance_of(where, "client", client, LLMClient)
        v.non_negative_int(where, "keep_last", keep_last)
        v.positive_int(where, "trigger_messages", trigger_messages)
        if keep_last >= trigger_messages:
            raise InvalidArgumentError(
                where, "keep_last", f"below trigger_messages ({trigger_messages})", keep_last
            )
        v.non_empty_str(where, "instructions", instructions)
        self.client = client
        self.keep_last = keep_last
        self.trigger_messages = trigger_messages
        self.instructions = instructions

    def __repr__(self) -> str:
        return (
            f"LLMSummarization(keep_last={self.keep_last}, "
            f"trigger_messages={self.trigger_messages})"
        )

    async def compact(self, history: list[ChatMessage]) -> list[ChatMessage]:
        messages = _checked("LLMSummarization.compact", history)
        rest = [i for i, m in enumerate(messages) if m.role is not Role.SYSTEM]
        if len(rest) <= self.trigger_messages:
            return messages
        turns = _turns(rest, messages)
        # Walk back from the newest turn until at least keep_last messages are in the tail.
        tail_turns = 0
        tail_size = 0
        while tail_turns < len(turns) and tail_size < self.keep_last:
            tail_turns += 1
            tail_size += len(turns[-tail_turns])
        # A tail that would open with an orphaned tool result takes it into the summary.
        while tail_turns > 0 and _is_orphan(turns[-tail_turns], messages):
            tail_turns -= 1
        split = turns[-tail_turns][0] if tail_turns else len(messages)
        older = [m for m in messages[:split] if m.role is not Role.SYSTEM]
        if not older:
            return messages
        summary = await self._summarise(older)
        head_systems = [m for m in messages[:split] if m.role is Role.SYSTEM]
        return [*head_systems, ChatMessage.system(SUMMARY_PREFIX + summary), *messages[split:]]

    async def _summarise(self, older: list[ChatMessage]) -> str:
        prompt = [
            ChatMessage.system(self.instructions),
            ChatMessage.user(_transcript(older)),
        ]
        tracker = compaction_tracker.get()
        if tracker is not None:
            tracker.check()
        result = await self.client.generate(prompt)
        if tracker is not None:
            cost = result.cost_usd
            tracker.record(
                tokens=result.usage.total_tokens, cost_usd=cost if cost is not None else 0.0
            )
            limit = tracker.budget.max_cost_usd
            if cost is None and limit is not None and not result.cached:
                raise CostUnknownError(result.model, limit)
        text = (result.text or "").strip()
        if not text:
            where = str(getattr(self.client, "base_url", type(self.client).__name__))
            raise ModelResponseError(where, "the summarisation reply has no text")
        return text


def _transcript(messages: list[ChatMessage]) -> str:
    lines: list[str] = []
    for message in messages:
        if message.role is Role.TOOL:
            label = f"tool result ({message.name or message.tool_call_id})"
            lines.append(f"{label}: {message.content or ''}")
            continue
        if message.content:
            lines.append(f"{message.role.value}: {message.content}")
        for call in message.tool_calls:
            arguments = (
                call.invalid_arguments
                if call.invalid_arguments is not None
                else json.dumps(dict(call.arguments), default=str)
            )
            lines.append(f"{message.role.value} called {call.name}({arguments})")
    return "\n".join(lines)
