"""corral.kernel: the frozen contracts every other layer builds on.

Standard library only, no I/O. Budgets and positions (``Supervision``, ``SpawnBudget``,
``ExecutionBudget``), the run badge (``RunMeta``), the protocols of cancellation, compaction and
agent context, chat messages, the clock seam, and the error families.
"""

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
