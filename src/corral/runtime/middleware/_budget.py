"""``BudgetAccounting``: charge model and tool calls to an ``ExecutionTracker``; and
``WorstCaseBudget``: make no model call whose worst case could pass what is left."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
from collections.abc import Sequence
from typing import Any

from corral.kernel import BudgetExhaustedError, ChatMessage, CostUnknownError, MiddlewareStage
from corral.kernel import _validate as v
from corral.runtime._budget import ExecutionTracker
from corral.runtime._llm import ChatResult
from corral.runtime._openai import ModelPrice
from corral.runtime.middleware._pipeline import CallNext, MiddlewareContext


class BudgetAccounting:
    """Keeps calls inside an :class:`ExecutionTracker`'s budget.

    CHAT:

    - before the call, ``tracker.check()`` (raises ``BudgetExhaustedError`` when a dimension
      has no room left or the budget's deadline has passed; the model is not called);
    - every call that went inward counts one turn, failed ones too, so a retry loop outside
      this middleware cannot run for ever;
    - on success, ``usage.total_tokens`` and ``cost_usd`` of the ``ChatResult`` are recorded,
      and ``BudgetExhaustedError`` is raised the instant a limit is passed;
    - when the budget has ``max_cost_usd`` and a result that is not ``cached`` has
      ``cost_usd is None``, its tokens and turn are recorded and ``CostUnknownError`` is
      raised: a dollar limit that cannot be enforced is refused, not ignored.

    When a call fails, its error propagates even if counting its turn passes the limit (the
    next ``check`` stops the run). TOOL: ``tracker.check()`` before the call.
    """

    __slots__ = ("tracker",)

    stages = frozenset({MiddlewareStage.CHAT, MiddlewareStage.TOOL})

    def __init__(self, tracker: ExecutionTracker) -> None:
        v.instance_of("BudgetAccounting", "tracker", tracker, ExecutionTracker)
        self.tracker = tracker

    async def process(self, ctx: MiddlewareContext, call_next: CallNext) -> None:
        tracker = self.tracker
        tracker.check()
        if ctx.stage is not MiddlewareStage.CHAT:
            await call_next()
            return
        try:
            await call_next()
        except BaseException:
            # the call's own failure is the one to report; the next check() stops the run
            with contextlib.suppress(BudgetExhaustedError):
                tracker.record(turns=1)
            raise
        result = ctx.result
        if not isinstance(result, ChatResult):
            tracker.record(turns=1)
            return
        cost = result.cost_usd
        tracker.record(
            tokens=result.usage.total_tokens,
            cost_usd=cost if cost is not None else 0.0,
            turns=1,
        )
        limit = tracker.budget.max_cost_usd
        if cost is None and limit is not None and not result.cached:
            model = result.model if result.model is not None else ctx.options.get("model")
            raise CostUnknownError(model if isinstance(model, str) else None, limit)

    def __repr__(self) -> str:
        return f"BudgetAccounting({self.tracker!r})"


# What a message costs beyond its text, in tokens (role, separators), and what priming the
# reply costs: real chat formats spend 3 to 4 of each; these leave a margin.
MESSAGE_OVERHEAD_TOKENS = 8
REPLY_OVERHEAD_TOKENS = 8
DEFAULT_MAX_TOKENS = 4096
"""The output cap :class:`WorstCaseBudget` sets on a call that has none."""

_CAP_OPTIONS = ("max_completion_tokens", "max_tokens")


def input_bound(messages: Sequence[ChatMessage], tools: Sequence[Any] | None = None) -> int:
    """An upper bound on the input tokens of a call: the UTF-8 bytes of its messages and tools
    as JSON (a token is never shorter than one byte), plus each message's overhead."""
    size = sum(_json_bytes(message) for message in messages)
    size += sum(_json_bytes(tool) for tool in tools or ())
    return size + MESSAGE_OVERHEAD_TOKENS * len(messages) + REPLY_OVERHEAD_TOKENS


def _json_bytes(value: Any) -> int:
    is_instance = dataclasses.is_dataclass(value) and not isinstance(value, type)
    plain = dataclasses.asdict(value) if is_instance else value
    return len(json.dumps(plain, default=str, ensure_ascii=False).encode())


class WorstCaseBudget:
    """Makes no CHAT call that could pass what is left of a tracker's budget.

    Before each model call, its worst case: input tokens at most :func:`input_bound`, output
    tokens at most the call's ``max_completion_tokens`` or ``max_tokens`` option, dollars
    those tokens at ``price``. A call without a cap gets one when the budget limits tokens or
    dollars: ``default_max_tokens``, lowered to what is left affords (the cap is this
    middleware's own, so it may pick it; a cap the caller gave is kept as it is). A call whose
    worst case could pass a limit raises :class:`CallOverBudgetError` and is not made; so
    does a dollar limit with no ``price`` (the cost cannot be bounded). Put it outside
    :class:`BudgetAccounting` (the agent loop adds that one innermost), with the same tracker.
    """

    __slots__ = ("default_max_tokens", "price", "tracker")

    stages = frozenset({MiddlewareStage.CHAT})

    def __init__(
        self,
        tracker: ExecutionTracker,
        price: ModelPrice | None,
        *,
        default_max_tokens: int = DEFAULT_MAX_TOKENS,
    ) -> None:
        v.instance_of("WorstCaseBudget", "tracker", tracker, ExecutionTracker)
        v.instance_of("WorstCaseBudget", "price", price, (ModelPrice, type(None)))
        v.positive_int("WorstCaseBudget", "default_max_tokens", default_max_tokens)
        self.tracker = tracker
        self.price = price
        self.default_max_tokens = default_max_tokens

    async def process(self, ctx: MiddlewareContext, call_next: CallNext) -> None:
        budget = self.tracker.budget
        if budget.max_tokens is None and budget.max_cost_usd is None:
            await call_next()
            return
        given = next((ctx.options[k] for k in _CAP_OPTIONS if k in ctx.options), None)
        cap = given if isinstance(given, int) and not isinstance(given, bool) else None
        inputs = input_bound(ctx.messages, ctx.tools)
        if cap is None:
            cap = min(self.default_max_tokens, self._affordable(inputs))
            if cap >= 1:
                ctx.options["max_tokens"] = cap
            else:
                cap = self.default_max_tokens  # nothing fits: the check below refuses it
        self.tracker.check_call(tokens=inputs + cap, cost_usd=self._cost(inputs, cap))
        await call_next()

    def _cost(self, inputs: int, outputs: int) -> float | None:
        price = self.price
        if price is None:
            return None
        return (inputs * price.input_per_mtok_usd + outputs * price.output_per_mtok_usd) / 1e6

    def _affordable(self, inputs: int) -> int:
        """How many output tokens what is left pays for, after the input's worst case."""
        budget, spent = self.tracker.budget, self.tracker.usage()
        room = self.default_max_tokens
        if budget.max_tokens is not None:
            room = min(room, budget.max_tokens - spent.tokens - inputs)
        price = self.price
        if budget.max_cost_usd is not None and price is not None:
            left = budget.max_cost_usd - spent.cost_usd - inputs * price.input_per_mtok_usd / 1e6
            if price.output_per_mtok_usd > 0:
                room = min(room, math.floor(left * 1e6 / price.output_per_mtok_usd))
            elif left < 0:
                room = 0
        return room

    def __repr__(self) -> str:
        return f"WorstCaseBudget({self.tracker!r}, price={self.price!r})"
