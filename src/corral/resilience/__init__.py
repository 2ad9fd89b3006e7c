"""corral.resilience: keep one failing or greedy agent from taking the others down.

``FailureIsolator`` (a circuit breaker per agent, with degradation strategies), ``TokenBudget``
(token use per agent against allocations and a global budget) and ``run_sandboxed`` (one agent
task under a timeout, optionally in a child process held to a memory limit; ``SandboxWorker``
keeps such a child between runs).
"""

from corral.resilience._isolator import (
    CircuitOpenError,
    CircuitState,
    Degradation,
    FailureIsolator,
)
from corral.resilience._sandbox import DEFAULT_SANDBOX, run_sandboxed
from corral.resilience._sandbox_types import (
    READ_ONLY_PREFIX,
    SandboxAgentError,
    SandboxConfig,
    SandboxError,
    SandboxInterruptedError,
    SandboxMemoryError,
    SandboxResult,
    SandboxStartError,
    SandboxTask,
    SandboxTimeoutError,
)
from corral.resilience._sandbox_worker import SandboxWorker
from corral.resilience._tokens import NoAllocationError, TokenBudget

__all__ = [
    "DEFAULT_SANDBOX",
    "READ_ONLY_PREFIX",
    "CircuitOpenError",
    "CircuitState",
    "Degradation",
    "FailureIsolator",
    "NoAllocationError",
    "SandboxAgentError",
    "SandboxConfig",
    "SandboxError",
    "SandboxInterruptedError",
    "SandboxMemoryError",
    "SandboxResult",
    "SandboxStartError",
    "SandboxTask",
    "SandboxTimeoutError",
    "SandboxWorker",
    "TokenBudget",
    "run_sandboxed",
]
