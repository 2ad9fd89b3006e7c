"""``ChatCache``: answer identical model requests from memory."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from corral.kernel import SYSTEM_CLOCK, ChatMessage, Clock, MiddlewareStage
from corral.kernel import _validate as v
from corral.runtime._llm import ChatResult, ToolSpec, Usage
from corral.runtime.middleware._pipeline import CallNext, MiddlewareContext

METADATA_KEY = "cache_hit"


def request_key(
    messages: Sequence[ChatMessage], tools: Sequence[ToolSpec], options: Mapping[str, Any]
) -> str | None:
    """A stable key (SHA-256 hex) of a model request: the same request gives the same key in
    every process. None when part of it (an option, a tool schema, tool-call arguments) is not
    plain JSON: such a request is not cached rather than keyed by something inexact."""
    payload = {
        "messages": [
            {
                "role": m.role.value,
                "content": m.content,
                "tool_calls": [
                    [c.id, c.name, dict(c.arguments), c.invalid_arguments] for c in m.tool_calls
                ],
                "tool_call_id": m.tool_call_id,
                "name": m.name,
            }
            for m in messages
        ],
        "tools": [[t.name, t.description, dict(t.parameters)] for t in tools],
        "options": dict(options),
    }
    try:
        text = json.dumps(payload, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):
        return None
    return hashlib.sha256(text.encode()).hexdigest()


class ChatCache:
    """Serves identical CHAT requests (messages, tools, options) from a bounded LRU cache.

    A hit does not call inward: ``ctx.result`` is a copy of the stored ``ChatResult`` with
    ``cached=True``, zero usage and ``cost_usd=0.0``. A miss calls inward and stores the
    result when the call succeeds; errors are never cached. ``max_entries`` bounds the cache
    (least recently used entries go first); with ``ttl_s`` an entry expires that many seconds
    (on ``clock``) after it was stored. ``ctx.metadata["cache_hit"]`` says which happened.
    Requests that are not plain JSON (see :func:`request_key`) always go inward. Concurrent
    identical misses each call the model.
    """

    __slots__ = ("_clock", "_entries", "hits", "max_entries", "misses", "ttl_s")

    stages = frozenset({MiddlewareStage.CHAT})

    def __init__(
        self, max_entries: int = 256, ttl_s: float | None = None, *, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        v.positive_int("ChatCache", "max_entries", max_entries)
        v.positive_number("ChatCache", "ttl_s", ttl_s, optional=True)
        v.instance_of("ChatCache", "clock", clock, Clock)
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self._clock = clock
        self._entries: OrderedDict[str, tuple[ChatResult, float]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Forget every entry (the hit and miss counts stay)."""
        self._entries.clear()

    async def process(self, ctx: MiddlewareContext, call_next: CallNext) -> None:
        key = request_key(ctx.messages, ctx.tools, ctx.options)
        if key is None:
            ctx.metadata[METADATA_KEY] = False
            await call_next()
            return
        entries = self._entries
        entry = entries.get(key)
        now = self._clock.monotonic()
        if entry is not None:
            result, stored_at = entry
            if self.ttl_s is None or now - stored_at < self.ttl_s:
                entries.move_to_end(key)
                self.hits += 1
                ctx.metadata[METADATA_KEY] = True
                ctx.result = dataclasses.replace(result, cached=True, usage=Usage(), cost_usd=0.0)
                return
            del entries[key]
        self.misses += 1
        ctx.metadata[METADATA_KEY] = False
        await call_next()
        result = ctx.result
        if isinstance(result, ChatResult) and not result.cached:
            entries[key] = (result, self._clock.monotonic())
            entries.move_to_end(key)
            while len(entries) > self.max_entries:
                entries.popitem(last=False)

    def __repr__(self) -> str:
        return (
            f"ChatCache(max_entries={self.max_entries}, ttl_s={self.ttl_s}, "
            f"size={len(self._entries)}, hits={self.hits}, misses={self.misses})"
        )
