"""corral.runtime: the working primitives agents run on.

Cancellation tokens with deadlines, budget trackers, the spawn tracker, the middleware
pipeline and its built-ins, compaction and history, and the model seam.
"""

from corral.runtime._budget import BudgetUsage, ExecutionTracker
from corral.runtime._cancellation import Cancellation
from corral.runtime._fakeclock import FakeClock
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

__all__ = [
    "BudgetUsage",
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
]
