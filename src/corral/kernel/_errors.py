"""The error families every corral layer raises.

Every failure carries a stable machine-readable ``code``, a sentence that names the limit and
the value seen, a ``retryable`` flag, and typed fields (also collected in ``details`` so they
serialise). ``asyncio.CancelledError`` from outside is never turned into one of these.
"""

from __future__ import annotations

from typing import Any, ClassVar


class CorralError(Exception):
    """Base of every corral error.

    ``code`` is stable and machine-readable; ``message`` is for people; ``retryable`` says
    whether the same call may succeed later without changes; ``details`` holds the typed
    fields of the subclass as plain values.
    """

    code: ClassVar[str] = "corral_error"
    default_retryable: ClassVar[bool] = False

    def __init__(self, message: str, *, retryable: bool | None = None, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = self.default_retryable if retryable is None else retryable
        self.details: dict[str, Any] = details

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view: ``{"code", "message", "retryable", "details"}``."""
        return {
            "code": self.code,
            "message": self.message,
            "retryable": self.retryable,
            "details": dict(self.details),
        }

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, message={self.message!r})"


# --- misuse -------------------------------------------------------------------------------


class UsageError(CorralError):
    """The caller used an API wrongly; fix the call, retrying will not help."""

    code = "usage_error"


class InvalidArgumentError(UsageError, ValueError, TypeError):
    """An argument has the wrong type or value.

    Also a ``ValueError`` and a ``TypeError`` so code written against the builtins still
    catches it.
    """

    code = "invalid_argument"

    def __init__(self, where: str, argument: str, expected: str, value: Any) -> None:
        shown = _short_repr(value)
        super().__init__(
            f"{where}: {argument} must be {expected}, got {shown}",
            where=where,
            argument=argument,
            expected=expected,
            value=shown,
        )
        self.where = where
        self.argument = argument
        self.expected = expected
        self.value = value


class UnknownAgentError(UsageError, LookupError):
    """An agent id names no agent where one is required (also a ``LookupError``).

    ``where`` names the call (when that helps), ``group`` the agent group (when there is one).
    """

    code = "unknown_agent"

    def __init__(
        self,
        agent_id: str,
        message: str,
        *,
        where: str | None = None,
        group: str | None = None,
        **details: Any,
    ) -> None:
        extra: dict[str, Any] = {
            k: v for k, v in (("where", where), ("group", group)) if v is not None
        }
        super().__init__(message, agent_id=agent_id, **extra, **details)
        self.agent_id = agent_id
        self.where = where
        self.group = group


# --- run failures -------------------------------------------------------------------------


class RunError(CorralError):
    """A run could not go on: budget, cancellation, deadline or headcount."""

    code = "run_error"


class BudgetExhaustedError(RunError):
    """A budget dimension has no room left.

    ``dimension`` is one of ``tokens``, ``cost_usd``, ``turns``, ``deadline_s``; ``limit`` is
    the configured limit and ``used`` the amount consumed (seconds elapsed for the deadline).
    """

    code = "budget_exhausted"

    def __init__(self, dimension: str, limit: float, used: float) -> None:
        super().__init__(
            f"{dimension} budget exhausted: used {_num(used)} of a limit of {_num(limit)}",
            dimension=dimension,
            limit=limit,
            used=used,
        )
        self.dimension = dimension
        self.limit = limit
        self.used = used


class CancellationError(RunError):
    """The run was cancelled; ``reason`` is the first reason given to ``cancel``."""

    code = "cancelled"

    def __init__(self, reason: str | None = None, **details: Any) -> None:
        text = reason or "cancelled"
        super().__init__(
            text if reason is None else f"cancelled: {reason}", reason=reason, **details
        )
        self.reason = reason


class DeadlineExceededError(CancellationError):
    """The run's deadline has passed (``deadline`` and ``now`` are ISO-8601 strings)."""

    code = "deadline_exceeded"

    def __init__(self, deadline: str, now: str) -> None:
        super().__init__("deadline exceeded", deadline=deadline, now=now)
        self.message = f"deadline exceeded: the deadline was {deadline}, it is now {now}"
        self.args = (self.message,)
        self.deadline = deadline
        self.now = now


class SpawnBudgetExceeded(RunError):
    """The run's headcount cap is reached and no lower-priority agent can be paused.

    Retryable: a slot may free up when another agent of the run finishes.
    """

    code = "spawn_budget_exceeded"
    default_retryable = True

    def __init__(self, max_agents: int, active: int, agent_id: str, why: str) -> None:
        super().__init__(
            f"spawn budget exceeded: {active} of a cap of {max_agents} agents hold a slot; "
            f"{agent_id!r} cannot start ({why})",
            max_agents=max_agents,
            active=active,
            agent_id=agent_id,
        )
        self.max_agents = max_agents
        self.active = active
        self.agent_id = agent_id
        self.why = why


class CostUnknownError(RunError):
    """A dollar budget is set but the cost of a model call cannot be computed."""

    code = "cost_unknown"

    def __init__(self, model: str | None, limit: float) -> None:
        super().__init__(
            f"a dollar budget of {_num(limit)} is set but the cost of model {model!r} is "
            "unknown; give its price to the client so the budget can be enforced",
            model=model,
            limit=limit,
        )
        self.model = model
        self.limit = limit


# --- refusals -----------------------------------------------------------------------------


class RefusalError(CorralError):
    """A policy (guardrail, middleware, rate limit) refused the call."""

    code = "refused"


class MiddlewareTermination(RefusalError):
    """Raised by a middleware to abort the call it wraps, with a reason."""

    code = "middleware_terminated"

    def __init__(self, reason: str, **details: Any) -> None:
        super().__init__(reason, reason=reason, **details)
        self.reason = reason


class ToolRefused(MiddlewareTermination):
    """A guardrail refused a tool call before it ran."""

    code = "tool_refused"

    def __init__(self, tool: str, reason: str) -> None:
        super().__init__(f"tool {tool!r} refused: {reason}", tool=tool)
        self.tool = tool


class RateLimitedError(RefusalError):
    """A per-tenant rate limit is reached; ``retry_after_s`` says when a call fits again."""

    code = "rate_limited"
    default_retryable = True

    def __init__(self, tenant: str, rate_per_s: float, burst: int, retry_after_s: float) -> None:
        super().__init__(
            f"tenant {tenant!r} is over its rate limit of {_num(rate_per_s)} calls/s "
            f"(burst {burst}); retry after {retry_after_s:.3f} s",
            tenant=tenant,
            rate_per_s=rate_per_s,
            burst=burst,
            retry_after_s=retry_after_s,
        )
        self.tenant = tenant
        self.retry_after_s = retry_after_s


def _num(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _short_repr(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
