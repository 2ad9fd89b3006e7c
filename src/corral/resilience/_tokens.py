"""``TokenBudget``: token use per agent against an allocation and one global budget."""

from __future__ import annotations

import logging
import threading

from corral.kernel import InvalidArgumentError, UsageError
from corral.kernel import _validate as v

logger = logging.getLogger("corral.resilience.tokens")


class NoAllocationError(UsageError):
    """Tokens were consumed, or an agent's figures asked for, before ``allocate``."""

    code = "no_allocation"

    def __init__(self, agent_id: str, operation: str) -> None:
        super().__init__(
            f"agent {agent_id!r} has no token allocation; call allocate({agent_id!r}, tokens) "
            f"before {operation}",
            agent_id=agent_id,
            operation=operation,
        )
        self.agent_id = agent_id
        self.operation = operation


class TokenBudget:
    """Counts tokens per agent against its allocation, and all of them against a global budget.

    It records and reports; it does not stop anything: ask :meth:`can_consume` before a call
    and :meth:`consume` what the call used.

    - :meth:`allocate` sets an agent's allocation; allocating again replaces it and starts the
      agent's count from zero (the global count keeps what was spent).
    - :meth:`consume` adds to the agent's and the global count. It raises
      :class:`NoAllocationError` for an agent with no allocation. Use beyond the allocation or
      the global budget is recorded all the same, and every consume that leaves the agent or
      the global count at or above ``warn_ratio`` (90 % by default) of its limit logs a
      warning on the ``corral.resilience.tokens`` logger.
    - :meth:`can_consume` is True when both the allocation and the global budget have room
      for the tokens (False for an agent with no allocation).

    Token amounts are integers. Thread-safe.
    """

    __slots__ = ("_allocations", "_global_budget", "_global_used", "_lock", "_used", "_warn_ratio")

    def __init__(self, global_budget: int, *, warn_ratio: float = 0.9) -> None:
        v.positive_int("TokenBudget", "global_budget", global_budget)
        if (
            isinstance(warn_ratio, bool)
            or not isinstance(warn_ratio, int | float)
            or not 0 < warn_ratio <= 1
        ):
            raise InvalidArgumentError(
                "TokenBudget", "warn_ratio", "a number in (0, 1]", warn_ratio
            )
        self._global_budget = global_budget
        self._warn_ratio = float(warn_ratio)
        self._global_used = 0
        self._allocations: dict[str, int] = {}
        self._used: dict[str, int] = {}
        self._lock = threading.Lock()

    @property
    def global_budget(self) -> int:
        return self._global_budget

    def allocate(self, agent_id: str, tokens: int) -> None:
        """Set the agent's allocation to ``tokens`` (> 0) and its count to zero."""
        v.non_empty_str("TokenBudget.allocate", "agent_id", agent_id)
        v.positive_int("TokenBudget.allocate", "tokens", tokens)
        with self._lock:
            self._allocations[agent_id] = tokens
            self._used[agent_id] = 0

    def consume(self, agent_id: str, tokens: int) -> None:
        """Record ``tokens`` (>= 0) used by the agent; raises NoAllocationError without one."""
        v.non_empty_str("TokenBudget.consume", "agent_id", agent_id)
        v.non_negative_int("TokenBudget.consume", "tokens", tokens)
        with self._lock:
            allocation = self._allocations.get(agent_id)
            if allocation is None:
                raise NoAllocationError(agent_id, "consume")
            used = self._used[agent_id] + tokens
            self._used[agent_id] = used
            self._global_used += tokens
            global_used = self._global_used
        if used >= self._warn_ratio * allocation:
            logger.warning(
                "agent %r has used %d of its %d-token allocation (%.1f%%)",
                agent_id,
                used,
                allocation,
                100.0 * used / allocation,
            )
        if global_used >= self._warn_ratio * self._global_budget:
            logger.warning(
                "the global token budget is %.1f%% used: %d of %d tokens (last by agent %r)",
                100.0 * global_used / self._global_budget,
                global_used,
                self._global_budget,
                agent_id,
            )

    def can_consume(self, agent_id: str, tokens: int) -> bool:
        """True when the agent's allocation and the global budget both have room for ``tokens``."""
        v.non_empty_str("TokenBudget.can_consume", "agent_id", agent_id)
        v.non_negative_int("TokenBudget.can_consume", "tokens", tokens)
        with self._lock:
            allocation = self._allocations.get(agent_id)
            if allocation is None:
                return False
            return (
                self._used[agent_id] + tokens <= allocation
                and self._global_used + tokens <= self._global_budget
            )

    def used(self, agent_id: str) -> int:
        """Tokens the agent consumed since its last allocation."""
        return self._figures(agent_id, "used")[1]

    def remaining(self, agent_id: str) -> int:
        """Tokens left in the agent's allocation (0 once it is used up or overspent)."""
        allocation, used = self._figures(agent_id, "remaining")
        return max(0, allocation - used)

    def usage_percent(self, agent_id: str) -> float:
        """The agent's use as a percentage of its allocation (above 100 when overspent)."""
        allocation, used = self._figures(agent_id, "usage_percent")
        return 100.0 * used / allocation

    def global_used(self) -> int:
        """Tokens consumed by every agent, including counts replaced by a new allocation."""
        with self._lock:
            return self._global_used

    def global_remaining(self) -> int:
        """Tokens left in the global budget (0 once it is used up or overspent)."""
        with self._lock:
            return max(0, self._global_budget - self._global_used)

    def global_usage_percent(self) -> float:
        """Global use as a percentage of the global budget (above 100 when overspent)."""
        with self._lock:
            return 100.0 * self._global_used / self._global_budget

    def allocations(self) -> dict[str, int]:
        """A copy of every agent's allocation."""
        with self._lock:
            return dict(self._allocations)

    def _figures(self, agent_id: str, operation: str) -> tuple[int, int]:
        v.non_empty_str(f"TokenBudget.{operation}", "agent_id", agent_id)
        with self._lock:
            allocation = self._allocations.get(agent_id)
            if allocation is None:
                raise NoAllocationError(agent_id, operation)
            return allocation, self._used[agent_id]

    def __repr__(self) -> str:
        with self._lock:
            return (
                f"TokenBudget(global_used={self._global_used}, "
                f"global_budget={self._global_budget}, agents={len(self._allocations)})"
            )
