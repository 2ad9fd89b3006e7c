"""corral.kernel: the frozen contracts every other layer builds on.

Standard library only, no I/O. Budgets and positions (``Supervision``, ``SpawnBudget``,
``ExecutionBudget``), the run badge (``RunMeta``), the protocols of cancellation, compaction and
agent context, chat messages, the clock seam, and the error families.
"""

# The parts are imported when first used (PEP 562): a command line that needs the error
# classes does not pay for messages, supervision and run badges (and what they import).
import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from corral.kernel._clock import SYSTEM_CLOCK, Clock, SystemClock, TimerHandle
    from corral.kernel._errors import (
        BudgetExhaustedError,
        CancellationError,
        CorralError,
        CostUnknownError,
        DeadlineExceededError,
        InvalidArgumentError,
        MiddlewareTermination,
        RateLimitedError,
        RefusalError,
        RunError,
        SpawnBudgetExceeded,
        ToolRefused,
        UnknownAgentError,
        UsageError,
    )
    from corral.kernel._messages import ChatMessage, Role, ToolCall
    from corral.kernel._protocols import (
        ActionCheck,
        ActionVerdict,
        AgentContextProtocol,
        CancellationToken,
        CompactionStrategy,
        MiddlewareStage,
    )
    from corral.kernel._runmeta import RunMeta
    from corral.kernel._supervision import (
        ExecutionBudget,
        HistoryRetention,
        Priority,
        SpawnBudget,
        Supervision,
        new_id,
    )

_WHERE = {
    "ActionCheck": "corral.kernel._protocols",
    "ActionVerdict": "corral.kernel._protocols",
    "AgentContextProtocol": "corral.kernel._protocols",
    "BudgetExhaustedError": "corral.kernel._errors",
    "CancellationError": "corral.kernel._errors",
    "CancellationToken": "corral.kernel._protocols",
    "ChatMessage": "corral.kernel._messages",
    "Clock": "corral.kernel._clock",
    "CompactionStrategy": "corral.kernel._protocols",
    "CorralError": "corral.kernel._errors",
    "CostUnknownError": "corral.kernel._errors",
    "DeadlineExceededError": "corral.kernel._errors",
    "ExecutionBudget": "corral.kernel._supervision",
    "HistoryRetention": "corral.kernel._supervision",
    "InvalidArgumentError": "corral.kernel._errors",
    "MiddlewareStage": "corral.kernel._protocols",
    "MiddlewareTermination": "corral.kernel._errors",
    "Priority": "corral.kernel._supervision",
    "RateLimitedError": "corral.kernel._errors",
    "RefusalError": "corral.kernel._errors",
    "Role": "corral.kernel._messages",
    "RunError": "corral.kernel._errors",
    "RunMeta": "corral.kernel._runmeta",
    "SYSTEM_CLOCK": "corral.kernel._clock",
    "SpawnBudget": "corral.kernel._supervision",
    "SpawnBudgetExceeded": "corral.kernel._errors",
    "Supervision": "corral.kernel._supervision",
    "SystemClock": "corral.kernel._clock",
    "TimerHandle": "corral.kernel._clock",
    "ToolCall": "corral.kernel._messages",
    "ToolRefused": "corral.kernel._errors",
    "UnknownAgentError": "corral.kernel._errors",
    "UsageError": "corral.kernel._errors",
    "new_id": "corral.kernel._supervision",
}


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value  # the next access is a plain lookup
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "SYSTEM_CLOCK",
    "ActionCheck",
    "ActionVerdict",
    "AgentContextProtocol",
    "BudgetExhaustedError",
    "CancellationError",
    "CancellationToken",
    "ChatMessage",
    "Clock",
    "CompactionStrategy",
    "CorralError",
    "CostUnknownError",
    "DeadlineExceededError",
    "ExecutionBudget",
    "HistoryRetention",
    "InvalidArgumentError",
    "MiddlewareStage",
    "MiddlewareTermination",
    "Priority",
    "RateLimitedError",
    "RefusalError",
    "Role",
    "RunError",
    "RunMeta",
    "SpawnBudget",
    "SpawnBudgetExceeded",
    "Supervision",
    "SystemClock",
    "TimerHandle",
    "ToolCall",
    "ToolRefused",
    "UnknownAgentError",
    "UsageError",
    "new_id",
]
