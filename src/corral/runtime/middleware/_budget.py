"""``BudgetAccounting``: charge model and tool calls to an ``ExecutionTracker``."""

from __future__ import annotations

import contextlib

from corral.kernel import BudgetExhaustedError, CostUnknownError, MiddlewareStage
from corral.kernel import _validate as v
from corral.runtime._budget import ExecutionTracker
from corral.runtime._llm import ChatResult
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
