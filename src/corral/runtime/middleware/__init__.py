"""corral.runtime.middleware: the pipeline around each TURN, CHAT and TOOL call, and its built-ins.

``MiddlewarePipeline`` runs ``Middleware`` objects around a handler; the built-ins cache,
retry, charge budgets, guard tools, redact PII, audit, rate-limit, stop cancelled runs
and trace (OpenTelemetry, when installed).
"""

from corral.runtime.middleware._audit import Audit, AuditEvent
from corral.runtime.middleware._budget import BudgetAccounting, WorstCaseBudget, input_bound
from corral.runtime.middleware._cache import ChatCache
from corral.runtime.middleware._cancel import CancellationCheck
from corral.runtime.middleware._guard import ToolGuard
from corral.runtime.middleware._pii import PIIRedaction
from corral.runtime.middleware._pipeline import (
    CallNext,
    Middleware,
    MiddlewareContext,
    MiddlewarePipeline,
)
from corral.runtime.middleware._ratelimit import TenantRateLimit
from corral.runtime.middleware._retry import (
    Retry,
    RetryState,
    StopAfterAttempt,
    StopAfterDelay,
    StopStrategy,
    WaitExponential,
    WaitFixed,
    WaitStrategy,
    is_transient,
)
from corral.runtime.middleware._tracing import Tracing

__all__ = [
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
