"""corral.agent: a small tool-using agent loop that honours budgets, cancellation and middleware."""

from corral.agent._loop import Agent, AgentRun, ToolOutcome
from corral.agent._tool import (
    Tool,
    ToolArgumentsError,
    ToolError,
    ToolFailedError,
    UnknownToolError,
    tool,
)

__all__ = [
    "Agent",
    "AgentRun",
    "Tool",
    "ToolArgumentsError",
    "ToolError",
    "ToolFailedError",
    "ToolOutcome",
    "UnknownToolError",
    "tool",
]
