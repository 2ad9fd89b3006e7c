"""``ExecutionTracker``: counts one agent's consumption against its ExecutionBudget."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from corral.kernel import SYSTEM_CLOCK, BudgetExhaustedError, Clock, ExecutionBudget
from corral.kernel import _validate as v

_INF = float("inf")


@dataclass(frozen=True, slots=True, kw_only=True)
class BudgetUsage:
    """A snapshot of what an agent has consumed (``elapsed_s`` since the tracker started)."""

    tokens: int
    cost_usd: float
    turns: int
    elapsed_s: float


class CallOverBudgetError(BudgetExhaustedError):
    """The next call's worst case could pass what is left of a limit: it is not made.

    ``bound`` is the most the call could spend in ``dimension`` (None: its cost is unknown).
    Same code as :class:`BudgetExhaustedError` (``budget_exhausted``): the budget has no room
    for that call.
    """

    def __init__(self, dimension: str, limit: float, used: float, bound: float | None) -> None:
        super().__init__(dimension, limit, used)
        left = max(0.0, limit - used)
        if bound is None:
            why = "its cost is unknown (no price for the model)"
        else:
            why = f"it could spend up to {_num(bound)} and {_num(left)} is left"
        self.message = (
            f"{dimension} budget: the next model call was not made: {why} "
            f"(used {_num(used)} of a limit of {_num(limit)})"
        )
        self.args = (self.message,)
        self.details["bound"] = bound
        self.bound = bound


def _num(value: float) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


class ExecutionTracker:
    """Counts tokens, dollars, turns and elapsed time against an :class:`ExecutionBudget`.

    - :meth:`record` adds what a call consumed and raises :class:`BudgetExhaustedError` the
      instant a limit is passed (the usage is counted all the same: it was spent).
    - :meth:`check`, before a call, raises when a dimension has no room left (used >= limit)
      or the deadline (``deadline_s`` after the tracker was created) has passed.

    Thread-safe. The deadline is read on ``clock.monotonic()``.
    """

    __slots__ = ("_clock", "_cost", "_lock", "_started", "_tokens", "_turns", "budget")

    def __init__(self, budget: ExecutionBudget | None = None, *, clock: Clock = SYSTEM_CLOCK):
        budget = ExecutionBudget() if budget is None else budget
        v.instance_of("ExecutionTracker", "budget", budget, ExecutionBudget)
        v.instance_of("ExecutionTracker", "clock", clock, Clock)
        self.budget = budget
        self._clock = clock
        self._started = clock.monotonic()
        self._tokens = 0
        self._cost = 0.0
        self._turns = 0
        self._lock = threading.Lock()

    def record(self, *, tokens: int = 0, cost_usd: float = 0.0, turns: int = 0) -> None:
        """Add consumption; raise BudgetExhaustedError if a limit is now passed."""
        # Exact-type fast paths first: record runs on every model call.
        if type(tokens) is not int or tokens < 0:
            v.non_negative_int("ExecutionTracker.record", "tokens", tokens)
        if type(cost_usd) is not float or not 0.0 <= cost_usd < _INF:
            v.non_negative_number("ExecutionTracker.record", "cost_usd", cost_usd)
        if type(turns) is not int or turns < 0:
            v.non_negative_int("ExecutionTracker.record", "turns", turns)
        budget = self.budget
        with self._lock:
            self._tokens += tokens
            self._cost += cost_usd
            self._turns += turns
            used_tokens, used_cost, used_turns = self._tokens, self._cost, self._turns
        if budget.max_tokens is not None and used_tokens > budget.max_tokens:
            raise BudgetExhaustedError("tokens", budget.max_tokens, used_tokens)
        if budget.max_cost_usd is not None and used_cost > budget.max_cost_usd:
            raise BudgetExhaustedError("cost_usd", budget.max_cost_usd, used_cost)
        if budget.max_turns is not None and used_turns > budget.max_turns:
            raise BudgetExhaustedError("turns", budget.max_turns, used_turns)

    def check(self) -> None:
        """Raise BudgetExhaustedError unless every limited dimension has room for a call."""
        budget = self.budget
        with self._lock:
            used_tokens, used_cost, used_turns = self._tokens, self._cost, self._turns
        if budget.max_tokens is not None and used_tokens >= budget.max_tokens:
            raise BudgetExhaustedError("tokens", budget.max_tokens, used_tokens)
        if budget.max_cost_usd is not None and used_cost >= budget.max_cost_usd:
            raise BudgetExhaustedError("cost_usd", budget.max_cost_usd, used_cost)
        if budget.max_turns is not None and used_turns >= budget.max_turns:
            raise BudgetExhaustedError("turns", budget.max_turns, used_turns)
        if budget.deadline_s is not None:
            elapsed = self._clock.monotonic() - self._started
            if elapsed >= budget.deadline_s:
                raise BudgetExhaustedError("deadline_s", budget.deadline_s, round(elapsed, 6))

    def check_call(self, *, tokens: int, cost_usd: float | None) -> None:
        """Raise :class:`CallOverBudgetError` when a call that may spend up to ``tokens`` and
        ``cost_usd`` (its worst case) could pass what is left of a limit; also what
        :meth:`check` raises. ``cost_usd`` None is an unknown cost: with a dollar limit, the
        call is refused too."""
        self.check()
        budget = self.budget
        with self._lock:
            used_tokens, used_cost = self._tokens, self._cost
        if budget.max_tokens is not None and used_tokens + tokens > budget.max_tokens:
            raise CallOverBudgetError("tokens", budget.max_tokens, used_tokens, tokens)
        if budget.max_cost_usd is not None and (
            cost_usd is None or used_cost + cost_usd > budget.max_cost_usd
        ):
            raise CallOverBudgetError("cost_usd", budget.max_cost_usd, used_cost, cost_usd)

    def usage(self) -> BudgetUsage:
        with self._lock:
            return BudgetUsage(
                tokens=self._tokens,
                cost_usd=self._cost,
                turns=self._turns,
                elapsed_s=self._clock.monotonic() - self._started,
            )

    def remaining_turns(self) -> int | None:
        limit = self.budget.max_turns
        return None if limit is None else max(0, limit - self._turns)

    def __repr__(self) -> str:
        u = self.usage()
        return (
            f"ExecutionTracker(tokens={u.tokens}, cost_usd={u.cost_usd:g}, turns={u.turns}, "
            f"budget={self.budget})"
        )
