"""Projections of the event log (agents, inboxes, decisions, commands) and the reducer.

The reducer is the only code that changes projections, and it reads nothing but the state and
the event, so replaying the log from the start rebuilds the projections exactly. Records are
plain JSON-ready dicts with camelCase keys (what the HTTP API returns). A record is never
mutated in place: the reducer works on copies (:class:`Tx`), and the store swaps them in only
after the transaction that wrote them has committed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from corral.daemon import _events as ev
from corral.daemon._events import Event

Record = dict[str, Any]

LIVE_STATES = frozenset({"running", "idle", "blocked"})
ENDED_STATES = frozenset({"failed", "stopped"})


@dataclass
class State:
    """Everything the projections hold, as of event ``last_seq``."""

    agents: dict[str, Record] = field(default_factory=dict)
    notices: dict[int, Record] = field(default_factory=dict)
    resolutions: dict[int, Record] = field(default_factory=dict)
    commands: dict[str, Record] = field(default_factory=dict)
    last_seq: int = 0

    def snapshot(self) -> dict[str, Any]:
        """A canonical, comparable copy (JSON round-trip)."""
        data = {
            "agents": self.agents,
            "notices": {str(k): v for k, v in self.notices.items()},
            "resolutions": {str(k): v for k, v in self.resolutions.items()},
            "commands": self.commands,
            "last_seq": self.last_seq,
        }
        loaded: dict[str, Any] = json.loads(json.dumps(data, sort_keys=True))
        return loaded


class ReplayError(Exception):
    """The log holds an event the reducer cannot apply (a bug or a corrupt log)."""


class Tx:
    """Copy-on-write changes to a :class:`State`, kept apart until :meth:`merge`."""

    def __init__(self, state: State) -> None:
        self.state = state
        self.agents: dict[str, Record] = {}
        self.notices: dict[int, Record] = {}
        self.resolutions: dict[int, Record] = {}
        self.commands: dict[str, Record] = {}
        self.last_seq = state.last_seq

    def agent(self, agent_id: str) -> Record:
        """A writable copy of the agent's record."""
        rec = self.agents.get(agent_id)
        if rec is None:
            base = self.state.agents.get(agent_id)
            if base is None:
                raise ReplayError(f"event for unknown agent {agent_id!r}")
            rec = dict(base)
            self.agents[agent_id] = rec
        return rec

    def get_agent(self, agent_id: str) -> Record | None:
        return self.agents.get(agent_id) or self.state.agents.get(agent_id)

    def notice(self, notice_id: int) -> Record:
        rec = self.notices.get(notice_id)
        if rec is None:
            rec = dict(self.state.notices[notice_id])
            self.notices[notice_id] = rec
        return rec

    def apply(self, event: Event) -> None:
        if event.seq != self.last_seq + 1:
            raise ReplayError(f"event {event.seq} follows {self.last_seq}: the log has a gap")
        handler = _HANDLERS.get(event.type)
        if handler is None:
            raise ReplayError(f"unknown event type {event.type!r} at seq {event.seq}")
        handler(self, event)
        self.last_seq = event.seq

    def merge(self) -> None:
        """Make the changes part of the state (call once the changes are durable)."""
        self.state.agents.update(self.agents)
        self.state.notices.update(self.notices)
        self.state.resolutions.update(self.resolutions)
        self.state.commands.update(self.commands)
        self.state.last_seq = self.last_seq


def replay(events: Iterable[Event]) -> State:
    """The projections that ``events`` (the whole log, in order) produce from nothing."""
    state = State()
    for event in events:
        tx = Tx(state)
        tx.apply(event)
        tx.merge()
    return state


# --- handlers -----------------------------------------------------------------------------


def _agent_id(event: Event) -> str:
    if event.agent_id is None:
        raise ReplayError(f"{event.type} at seq {event.seq} names no agent")
    return event.agent_id


def _created(tx: Tx, event: Event) -> None:
    rec = dict(event.data["agent"])
    rec.setdefault("createdAt", event.ts)
    rec.setdefault("updatedAt", event.ts)
    tx.agents[_agent_id(event)] = rec
    parent = rec.get("parent")
    if parent is not None:
        p = tx.agent(parent)
        p["children"] = [*p.get("children", []), rec["id"]]


def _turn_started(tx: Tx, event: Event) -> None:
    rec = tx.agent(_agent_id(event))
    data = event.data
    rec["turnInFlight"] = data["turn"]
    rec["turns"] = data["turn"]
    rec["lastPrompt"] = data["prompt"]
    if data.get("retry"):
        rec["retriesUsed"] = rec["retriesUsed"] + 1
    else:
        rec["retriesUsed"] = 0
        # A retry re-sends the notices that went in front of the prompt it repeats.
        rec["lastNotices"] = list(data.get("notices", []))
    rec["updatedAt"] = event.ts
    for notice_id in data.get("notices", []):
        notice = tx.notice(notice_id)
        notice["state"] = "delivered"
        notice["deliveredAt"] = event.ts


def add_usage(rec: Record, usage: dict[str, Any] | None) -> None:
    """Count one turn's ``usage`` (``tokens``, ``costUsd`` or None if unknown) into ``rec``."""
    if not usage:
        return
    old = rec["usage"]
    cost = usage.get("costUsd", 0.0)
    rec["usage"] = {
        "tokens": old["tokens"] + int(usage.get("tokens", 0)),
        "costUsd": old["costUsd"] + float(cost or 0.0),
        "turns": old["turns"] + 1,
        # Turns whose cost nobody could price: a dollar budget cannot vouch for them.
        "unpricedTurns": old.get("unpricedTurns", 0) + (1 if cost is None else 0),
    }


def _turn_completed(tx: Tx, event: Event) -> None:
    rec = tx.agent(_agent_id(event))
    rec["turnInFlight"] = None
    rec["consecutiveFailures"] = 0
    rec["lastOutput"] = event.data.get("output")
    rec["lastError"] = None
    add_usage(rec, event.data.get("usage") or {"tokens": 0})
    rec["updatedAt"] = event.ts


def _turn_failed(tx: Tx, event: Event) -> None:
    rec = tx.agent(_agent_id(event))
    rec["turnInFlight"] = None
    rec["consecutiveFailures"] = event.data["consecutiveFailures"]
    rec["lastError"] = event.data["error"]
    add_usage(rec, event.data.get("usage") or {"tokens": 0})
    rec["updatedAt"] = event.ts


def _turn_interrupted(tx: Tx, event: Event) -> None:
    rec = tx.agent(_agent_id(event))
    rec["turnInFlight"] = None
    rec["updatedAt"] = event.ts


def _state_changed(tx: Tx, event: Event) -> None:
    rec = tx.agent(_agent_id(event))
    rec["state"] = event.data["to"]
    rec["reason"] = event.data.get("reason")
    rec["error"] = event.data.get("error")
    rec["updatedAt"] = event.ts
    if event.data["to"] in ENDED_STATES:
        rec["endedAt"] = event.ts


def _no_projection(tx: Tx, event: Event) -> None:
    """An event that only informs (the log keeps it; no projection changes)."""


def _notice(tx: Tx, event: Event) -> None:
    notice = dict(event.data)
    notice["id"] = event.seq
    notice["createdAt"] = event.ts
    tx.notices[event.seq] = notice


def _dropped(tx: Tx, event: Event) -> None:
    for notice_id in event.data["ids"]:
        notice = tx.notice(notice_id)
        notice["state"] = "dropped"
        notice["droppedAt"] = event.ts


def _resolved(tx: Tx, event: Event) -> None:
    resolution = dict(event.data)
    resolution["id"] = event.seq
    resolution["at"] = event.ts
    tx.resolutions[event.seq] = resolution


def _command(tx: Tx, event: Event) -> None:
    tx.commands[event.data["key"]] = {
        "fingerprint": event.data["fingerprint"],
        "command": event.data["command"],
        "status": event.data["status"],
        "response": event.data["response"],
        "at": event.ts,
    }


_HANDLERS: dict[str, Callable[[Tx, Event], None]] = {
    ev.AGENT_CREATED: _created,
    ev.TURN_STARTED: _turn_started,
    ev.TURN_COMPLETED: _turn_completed,
    ev.TURN_FAILED: _turn_failed,
    ev.TURN_INTERRUPTED: _turn_interrupted,
    ev.STATE_CHANGED: _state_changed,
    ev.SUPERVISION_NEEDED: _no_projection,
    ev.NOTICE: _notice,
    ev.NOTICES_DROPPED: _dropped,
    ev.DECISION_RESOLVED: _resolved,
    ev.COMMAND_RECORDED: _command,
    ev.GATEWAY_FROZEN: _no_projection,
}
assert set(_HANDLERS) == ev.EVENT_TYPES
