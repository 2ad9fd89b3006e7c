"""The vocabulary of recovery: actions, the policy, health statuses, results, listeners."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from corral.kernel import _validate as v


class RecoveryAction(StrEnum):
    """What a recovery attempt does to an agent.

    EJECT and REPLACE remove it from the group with its health check and retry count (a
    replacement is the caller's to add); RESTART and RESTART_CLEAN call the restart hook when
    there is one and otherwise change nothing; ESCALATE changes nothing and tells the
    listeners' ``on_escalation``.
    """

    EJECT = "eject"
    REPLACE = "replace"
    RESTART = "restart"
    RESTART_CLEAN = "restart_clean"
    ESCALATE = "escalate"


@dataclass(frozen=True, slots=True, kw_only=True)
class RecoveryPolicy:
    """How an agent's recovery attempts go.

    An attempt's action comes from the agent's retry count (attempts made so far): EJECT once
    it reaches ``max_retries``, else ESCALATE once it reaches ``escalate_after``, else
    ``default_action``. With ``escalate_after`` at or above ``max_retries`` an agent is ejected
    without being escalated. ``cooldown_s`` (seconds, 0 for none) is the quiet time after an
    attempt during which a new attempt does nothing. Raises ``InvalidArgumentError`` for counts
    that are not integers >= 1, a negative or non-finite cooldown, or an unknown action.
    """

    max_retries: int = 3
    escalate_after: int = 3
    cooldown_s: float = 5.0
    default_action: RecoveryAction = RecoveryAction.RESTART

    def __post_init__(self) -> None:
        v.positive_int("RecoveryPolicy", "max_retries", self.max_retries)
        v.positive_int("RecoveryPolicy", "escalate_after", self.escalate_after)
        v.non_negative_number("RecoveryPolicy", "cooldown_s", self.cooldown_s)
        v.instance_of("RecoveryPolicy", "default_action", self.default_action, RecoveryAction)

    def action_for(self, retry_count: int) -> RecoveryAction:
        """The action of an attempt made when the agent's retry count is ``retry_count``."""
        if retry_count >= self.max_retries:
            return RecoveryAction.EJECT
        if retry_count >= self.escalate_after:
            return RecoveryAction.ESCALATE
        return self.default_action


@dataclass(frozen=True, slots=True, kw_only=True)
class RecoveryResult:
    """What one recovery attempt did.

    ``action_taken`` is None and ``success`` False when the attempt fell inside the cooldown
    and nothing happened (such results are returned but not kept in the history nor sent to
    listeners). ``attempt`` is the agent's retry count after the attempt (unchanged when
    nothing happened). ``reason`` is why recovery was wanted; ``detail`` what came of it.
    """

    agent_id: str
    action_taken: RecoveryAction | None
    success: bool
    reason: str
    detail: str
    attempt: int
    attempted_at: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class HealthStatus:
    """One health check's answer for one agent.

    ``reason`` says why it is unhealthy (None when healthy); ``recovery`` is the attempt the
    failure started (None when healthy, or when the agent left the group meanwhile).
    """

    agent_id: str
    healthy: bool
    reason: str | None
    checked_at: datetime
    recovery: RecoveryResult | None = None


HealthCheck = Callable[[object], "bool | Awaitable[bool]"]
"""``check(agent) -> bool``, plain or async: True is healthy; anything else, or raising, is not.

An async check runs on the event loop; a plain one runs in a worker thread (see
``RecoveryManager``), so it must not touch the event loop.
"""

RestartHook = Callable[[str, object, RecoveryAction], "object | Awaitable[object]"]
"""``hook(agent_id, agent, action)`` for RESTART and RESTART_CLEAN, plain or async."""


class RecoveryListener:
    """A base for recovery listeners: override the methods you need, plain or async.

    Any object having at least one of these methods can listen; the others are skipped. A
    listener that raises is logged and does not stop recovery or the other listeners.
    ``on_escalation`` gets the number of attempts made before the escalating one.
    """

    def on_health_check_failed(self, status: HealthStatus) -> object:
        return None

    def on_recovery_attempt(self, result: RecoveryResult) -> object:
        return None

    def on_escalation(self, agent_id: str, failed_attempts: int) -> object:
        return None


LISTENER_METHODS = ("on_health_check_failed", "on_recovery_attempt", "on_escalation")
