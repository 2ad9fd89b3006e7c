"""corral.runtime: the working primitives agents run on.

Cancellation tokens with deadlines, budget trackers, the spawn tracker, the middleware
pipeline and its built-ins, compaction and history, and the model seam.
"""

from corral.kernel import UnknownAgentError  # re-exported: the one class for every layer
from corral.runtime._budget import BudgetUsage, CallOverBudgetError, ExecutionTracker
from corral.runtime._cancellation import Cancellation
from corral.runtime._compaction import (
    LLMSummarization,
    SlidingWindow,
    TokenTruncation,
    approx_tokens,
)
from corral.runtime._fakeclock import FakeClock
from corral.runtime._history import AgentContext, HistoryStore, InMemoryHistoryStore
from corral.runtime._llm import (
    ChatResult,
    LLMClient,
    ModelError,
    ModelHTTPError,
    ModelResponseError,
    ModelUnavailableError,
    ToolSpec,
    Usage,
)
from corral.runtime._openai import ModelPrice, OpenAIClient
from corral.runtime._scripted import ScriptedClient, ScriptedRequest, ScriptExhaustedError
from corral.runtime._spawn import (
    AgentAlreadyTrackedError,
    AgentCallback,
    PauseGate,
    SpawnSnapshot,
    SpawnTracker,
    TrackedAgent,
)
from corral.runtime.middleware import (
    Audit,
    AuditEvent,
    BudgetAccounting,
    CallNext,
    CancellationCheck,
    ChatCache,
    Middleware,
    MiddlewareContext,
    MiddlewarePipeline,
    PIIRedaction,
    Retry,
    RetryState,
    StopAfterAttempt,
    StopAfterDelay,
    StopStrategy,
    TenantRateLimit,
    ToolGuard,
    Tracing,
    WaitExponential,
    WaitFixed,
    WaitStrategy,
    WorstCaseBudget,
    input_bound,
    is_transient,
)

__all__ = [
    "AgentAlreadyTrackedError",
    "AgentCallback",
    "PauseGate",
    "SpawnSnapshot",
    "SpawnTracker",
    "TrackedAgent",
    "UnknownAgentError",
    "BudgetUsage",
    "CallOverBudgetError",
    "Cancellation",
    "ChatResult",
    "ExecutionTracker",
    "FakeClock",
    "LLMClient",
    "ModelError",
    "ModelHTTPError",
    "ModelResponseError",
    "ModelUnavailableError",
    "ToolSpec",
    "Usage",
    "AgentContext",
    "HistoryStore",
    "InMemoryHistoryStore",
    "LLMSummarization",
    "ModelPrice",
    "OpenAIClient",
    "ScriptExhaustedError",
    "ScriptedClient",
    "ScriptedRequest",
    "SlidingWindow",
    "TokenTruncation",
    "approx_tokens",
    "Audit",
    "AuditEvent",
    "BudgetAccounting",
    "WorstCaseBudget",
    "input_bound",
    "CallNext",
    "CancellationCheck",
    "ChatCache",
    "Middleware",
    "MiddlewareContext",
    "MiddlewarePipeline",
    "PIIRedaction",
    "Retry",
    "RetryState",
    "StopAfterAttempt",
    "StopAfterDelay",
    "StopStrategy",
    "TenantRateLimit",
    "ToolGuard",
    "Tracing",
    "WaitExponential",
    "WaitFixed",
    "WaitStrategy",
    "is_transient",
]
