"""Events: the append-only log that is the agent service's source of truth."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Agent lifecycle
AGENT_CREATED = "agent.created"
TURN_STARTED = "agent.turn_started"
TURN_COMPLETED = "agent.turn_completed"
TURN_FAILED = "agent.turn_failed"
TURN_INTERRUPTED = "agent.turn_interrupted"
STATE_CHANGED = "agent.state_changed"
SUPERVISION_NEEDED = "agent.supervision_needed"
# Inboxes, decisions, commands
NOTICE = "inbox.notice"
NOTICES_DROPPED = "inbox.dropped"
DECISION_RESOLVED = "decision.resolved"
COMMAND_RECORDED = "command.recorded"
# The gateway (daemons started with --db)
GATEWAY_FROZEN = "gateway.agent_frozen"

EVENT_TYPES = frozenset(
    {
        AGENT_CREATED,
        TURN_STARTED,
        TURN_COMPLETED,
        TURN_FAILED,
        TURN_INTERRUPTED,
        STATE_CHANGED,
        SUPERVISION_NEEDED,
        NOTICE,
        NOTICES_DROPPED,
        DECISION_RESOLVED,
        COMMAND_RECORDED,
        GATEWAY_FROZEN,
    }
)


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event not yet in the log."""

    type: str
    agent_id: str | None
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Event:
    """An event in the log: ``seq`` is gapless and increasing from 1; ``ts`` ISO-8601 UTC."""

    seq: int
    ts: str
    type: str
    agent_id: str | None
    data: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "ts": self.ts,
            "type": self.type,
            "agentId": self.agent_id,
            "data": self.data,
        }
