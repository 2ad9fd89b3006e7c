"""corral.recovery: watch agent health and recover failing agents by policy.

:class:`RecoveryManager` runs health checks on the agents of a supervisor's group, on demand or
on a background task, and on a failure (or a trigger) takes the action the
:class:`RecoveryPolicy` picks from the agent's retry count.
"""

from corral.recovery._manager import RecoveryManager
from corral.recovery._types import (
    HealthCheck,
    HealthStatus,
    RecoveryAction,
    RecoveryListener,
    RecoveryPolicy,
    RecoveryResult,
    RestartHook,
)

__all__ = [
    "HealthCheck",
    "HealthStatus",
    "RecoveryAction",
    "RecoveryListener",
    "RecoveryManager",
    "RecoveryPolicy",
    "RecoveryResult",
    "RestartHook",
]
