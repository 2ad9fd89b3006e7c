"""``ScriptedClient``: an LLMClient that plays a script, for tests and demos."""

from __future__ import annotations

import inspect
import itertools
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from corral.kernel import ChatMessage, InvalidArgumentError, ToolCall, UsageError
from corral.kernel import _validate as v
from corral.runtime._compaction import sequence_of
from corral.runtime._llm import ChatResult, ToolSpec, Usage

ReplyFn: TypeAlias = Callable[
    [list[ChatMessage], list[ToolSpec] | None], "ChatResult | str | Awaitable[ChatResult | str]"
]
ScriptItem: TypeAlias = "ChatResult | str | BaseException | ReplyFn"

_call_ids = itertools.count(1)


class ScriptExhaustedError(UsageError):
    """A :class:`ScriptedClient` was asked for more replies than its script holds."""

    code = "script_exhausted"

    def __init__(self, replies: int) -> None:
        super().__init__(
            f"scripted client has no reply left: its script had {replies} "
            f"repl{'y' if replies == 1 else 'ies'} and request {replies + 1} asked for another",
            replies=replies,
        )
        self.replies = replies


@dataclass(frozen=True, slots=True, kw_only=True)
class ScriptedRequest:
    """One call a :class:`ScriptedClient` received."""

    messages: tuple[ChatMessage, ...]
    tools: tuple[ToolSpec, ...] | None
    options: Mapping[str, Any] = field(default_factory=dict)


class ScriptedClient:
    """An :class:`~corral.runtime.LLMClient` that answers each call with the next script item.

    Items: a :class:`ChatResult` (returned as is), a ``str`` (a text reply with zero usage and
    ``cost_usd=0.0``), an exception instance (raised), or a callable ``fn(messages, tools)``,
    plain or async, returning a ``ChatResult`` or a ``str``. Every call is recorded in
    :attr:`requests`, the one that finds the script empty included; that one raises
    :class:`ScriptExhaustedError`. :meth:`text_reply` and :meth:`tool_call_reply` build
    results with usage and cost.
    """

    def __init__(self, script: Iterable[ScriptItem] = (), *, model: str = "scripted") -> None:
        v.non_empty_str("ScriptedClient", "model", model)
        if isinstance(script, str | bytes) or not isinstance(script, Iterable):
            raise InvalidArgumentError("ScriptedClient", "script", "an iterable of items", script)
        self.model = model
        self._script: deque[ScriptItem] = deque()
        self._requests: list[ScriptedRequest] = []
        self._total = 0
        self._lock = threading.Lock()
        self.add(*script)

    def add(self, *items: ScriptItem) -> None:
        """Append items to the script."""
        for item in items:
            _check_item("ScriptedClient", f"script[{self._total}]", item)
            with self._lock:
                self._script.append(item)
                self._total += 1

    @property
    def requests(self) -> list[ScriptedRequest]:
        """Every call received, oldest first (a copy)."""
        with self._lock:
            return list(self._requests)

    @property
    def remaining(self) -> int:
        """How many script items are left."""
        with self._lock:
            return len(self._script)

    async def generate(
        self,
        messages: Sequence[ChatMessage],
        *,
        tools: Sequence[ToolSpec] | None = None,
        **options: Any,
    ) -> ChatResult:
        where = "ScriptedClient.generate"
        checked = sequence_of(where, "messages", messages, ChatMessage)
        specs = None if tools is None else sequence_of(where, "tools", tools, ToolSpec)
        request = ScriptedRequest(
            messages=tuple(checked),
            tools=None if specs is None else tuple(specs),
            options=dict(options),
        )
        with self._lock:
            self._requests.append(request)
            if not self._script:
                raise ScriptExhaustedError(self._total)
            item = self._script.popleft()
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, ChatResult | str):
            return self._as_result(item)
        produced = item(checked, specs)
        if inspect.isawaitable(produced):
            produced = await produced
        if not isinstance(produced, ChatResult | str):
            raise InvalidArgumentError(
                where, "script callable result", "a ChatResult or a str", produced
            )
        return self._as_result(produced)

    def _as_result(self, item: ChatResult | str) -> ChatResult:
        if isinstance(item, str):
            return self.text_reply(item, model=self.model)
        return item

    @staticmethod
    def text_reply(
        text: str,
        *,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
        cost_usd: float | None = 0.0,
        model: str | None = "scripted",
        finish_reason: str | None = "stop",
    ) -> ChatResult:
        """A final text answer with the given usage and cost (``None`` cost: unknown)."""
        v.instance_of("ScriptedClient.text_reply", "text", text, str)
        return ChatResult(
            message=ChatMessage.assistant(text),
            usage=Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens),
            cost_usd=cost_usd,
            model=model,
            finish_reason=finish_reason,
        )

    @staticmethod
    def tool_call_reply(
        name: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        call_id: str | None = None,
        text: str | None = None,
        more: Sequence[ToolCall] = (),
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
        cost_usd: float | None = 0.0,
        model: str | None = "scripted",
    ) -> ChatResult:
        """A reply that calls tool ``name`` with ``arguments`` (then the calls in ``more``).

        ``call_id`` defaults to a fresh ``call_<n>``.
        """
        where = "ScriptedClient.tool_call_reply"
        args = {} if arguments is None else arguments
        v.instance_of(where, "arguments", args, Mapping)
        v.non_empty_str(where, "call_id", call_id, optional=True)
        first = ToolCall(call_id or f"call_{next(_call_ids)}", name, dict(args))
        for call in more:
            v.instance_of(where, "more[]", call, ToolCall)
        return ChatResult(
            message=ChatMessage.assistant(text, (first, *more)),
            usage=Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens),
            cost_usd=cost_usd,
            model=model,
            finish_reason="tool_calls",
        )


def _check_item(where: str, name: str, item: object) -> None:
    if isinstance(item, ChatResult | str | BaseException):
        return
    if isinstance(item, type):
        # An exception class is callable but would be "called" as a reply function.
        raise InvalidArgumentError(
            where, name, "a ChatResult, str, exception instance or callable", item
        )
    if callable(item):
        return
    raise InvalidArgumentError(
        where, name, "a ChatResult, str, exception instance or callable", item
    )
