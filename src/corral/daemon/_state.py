"""Projections of the event log (agents, inboxes, decisions, commands) and the reducer.

The reducer is the only code that computes state after an event: the stores apply it to what
they commit, and the service asks it (:func:`preview`) what a decision would lead to. See
"Seed 001" in docs/architecture.md for its rules.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from corral.daemon import _events as ev
from corral.daemon import _sessions
from corral.daemon._events import (
    BudgetChangedData,
    CommandData,
    Event,
    NewEvent,
    ResolvedData,
    StallRecoveryData,
    StateChangedData,
    TokenCreatedData,
    TokenRevokedData,
    TurnEndedData,
    TurnStartedData,
)
from corral.daemon._records import (
    AgentRecord,
    CommandRecord,
    DecisionRecord,
    Notice,
    SessionMessage,
    TokenRecord,
    TurnUsage,
    Usage,
)

LIVE_STATES = frozenset({"running", "waiting", "idle", "blocked", "paused"})
PAUSED = "paused"  # preempted at its run's headcount cap (see _headcount); holds no slot
ENDED_STATES = frozenset({"failed", "stopped"})
BUSY_STATES = frozenset({"running", "waiting"})  # a turn is in flight

PROJECTIONS_VERSION = 6
"""Bumped whenever the reducer builds the projections differently: a store whose stored
projections carry another version rebuilds them from the log when it opens."""

# The answers each kind of decision takes while pending.
ANSWERS: dict[str, list[str]] = {
    "approval": ["approve", "deny"],
    "blocked": ["retry", "stop"],
    "budget_exhausted": ["budget", "stop"],
    "gateway_frozen": ["reinstate"],
}
BUDGET_HELD = "budget-exhausted"  # the hold reason of corral.daemon._policy


@dataclass
class State:
    """Everything the projections hold, as of event ``last_seq``."""

    agents: dict[str, AgentRecord] = field(default_factory=dict)
    notices: dict[int, Notice] = field(default_factory=dict)
    decisions: dict[str, DecisionRecord] = field(default_factory=dict)
    commands: dict[str, CommandRecord] = field(default_factory=dict)
    tokens: dict[str, TokenRecord] = field(default_factory=dict)
    # Each agent's session (see _sessions); an agent with none has no key.
    sessions: dict[str, list[SessionMessage]] = field(default_factory=dict)
    last_seq: int = 0

    def snapshot(self) -> dict[str, Any]:
        """A canonical, comparable copy (JSON round-trip)."""
        data = {
            "agents": self.agents,
            "notices": {str(k): v for k, v in self.notices.items()},
            "decisions": self.decisions,
            "commands": self.commands,
            "tokens": self.tokens,
            "sessions": self.sessions,
            "last_seq": self.last_seq,
        }
        loaded: dict[str, Any] = json.loads(json.dumps(data, sort_keys=True))
        return loaded


class ReplayError(Exception):
    """The log holds an event the reducer cannot apply (a bug or a corrupt log)."""


class Tx:
    """Copy-on-write changes to a :class:`State`, kept apart until :meth:`merge`.

    A record is never mutated in place: the reducer works on copies, which the store swaps in
    only after the transaction that wrote them has committed.
    """

    def __init__(self, state: State) -> None:
        self.state = state
        self.agents: dict[str, AgentRecord] = {}
        self.notices: dict[int, Notice] = {}
        self.decisions: dict[str, DecisionRecord] = {}
        self.commands: dict[str, CommandRecord] = {}
        self.tokens: dict[str, TokenRecord] = {}
        # The sessions changed: a new list, or None for one cleared (its row is deleted).
        self.sessions: dict[str, list[SessionMessage] | None] = {}
        # The agents deleted (``agent.deleted``), each with the notices to it that go too:
        # the stores delete their rows (``delete_agent_data``).
        self.deleted: dict[str, list[int]] = {}
        self.last_seq = state.last_seq

    def agent(self, agent_id: str) -> AgentRecord:
        """A writable copy of the agent's record."""
        rec = self.agents.get(agent_id)
        if rec is None:
            base = self.state.agents.get(agent_id)
            if base is None:
                raise ReplayError(f"event for unknown agent {agent_id!r}")
            rec = base.copy()
            self.agents[agent_id] = rec
        return rec

    def get_agent(self, agent_id: str) -> AgentRecord | None:
        if agent_id in self.deleted:
            return None
        return self.agents.get(agent_id) or self.state.agents.get(agent_id)

    def notice(self, notice_id: int) -> Notice:
        rec = self.notices.get(notice_id)
        if rec is None:
            rec = self.state.notices[notice_id].copy()
            self.notices[notice_id] = rec
        return rec

    def session(self, agent_id: str) -> list[SessionMessage]:
        """The agent's session as of this transaction (read-only: replace, never mutate)."""
        if agent_id in self.sessions:
            return self.sessions[agent_id] or []
        return self.state.sessions.get(agent_id, [])

    def decision(self, decision_id: str) -> DecisionRecord | None:
        """A writable copy of the decision's record, or None when there is none."""
        rec = self.decisions.get(decision_id)
        if rec is None:
            base = self.state.decisions.get(decision_id)
            if base is None:
                return None
            rec = base.copy()
            self.decisions[decision_id] = rec
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
        self.state.decisions.update(self.decisions)
        self.state.commands.update(self.commands)
        self.state.tokens.update(self.tokens)
        for agent_id, session in self.sessions.items():
            if session is None:
                self.state.sessions.pop(agent_id, None)
            else:
                self.state.sessions[agent_id] = session
        for agent_id, notices in self.deleted.items():
            self.state.agents.pop(agent_id, None)
            for notice_id in notices:
                self.state.notices.pop(notice_id, None)
        self.state.last_seq = self.last_seq


def replay(events: Iterable[Event]) -> State:
    """The projections that ``events`` (the whole log, in order) produce from nothing."""
    state = State()
    for event in events:
        tx = Tx(state)
        tx.apply(event)
        tx.merge()
    return state


def preview(state: State, events: Sequence[NewEvent], ts: str) -> Tx:
    """What appending ``events`` at time ``ts`` would make of ``state``, kept apart in a
    :class:`Tx` that is never merged: ``state`` is left as it is."""
    tx = Tx(state)
    for new in events:
        tx.apply(Event(tx.last_seq + 1, ts, new.type, new.agent_id, new.data))
    return tx


# --- handlers -----------------------------------------------------------------------------


def _agent_id(event: Event) -> str:
    if event.agent_id is None:
        raise ReplayError(f"{event.type} at seq {event.seq} names no agent")
    return event.agent_id


def _created(tx: Tx, event: Event) -> None:
    rec = cast(AgentRecord, dict(event.data["agent"]))
    rec.setdefault("createdAt", event.ts)
    rec.setdefault("updatedAt", event.ts)
    # What the agent and its descendants spend (see _tree_budget): nothing yet.
    rec.setdefault("treeUsage", cast(Usage, dict(rec["usage"])))
    tx.agents[_agent_id(event)] = rec
    parent = rec.get("parent")
    if parent is not None:
        p = tx.agent(parent)
        p["children"] = [*p.get("children", []), rec["id"]]


def _turn_started(tx: Tx, event: Event) -> None:
    rec = tx.agent(_agent_id(event))
    rec.pop("queuedTurn", None)
    data = cast(TurnStartedData, event.data)
    rec["turnInFlight"] = data["turn"]
    rec["turns"] = data["turn"]
    rec["lastPrompt"] = data["prompt"]
    if data.get("restart"):
        pass  # a stalled turn started again: the same prompt, notices and retries
    elif data.get("retry"):
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
    # What the agent got: the prompt with its notices in front (``text``), when it had any.
    text = data.get("text") or data["prompt"]
    _add_to_session(tx, rec, [_sessions.message("user", data["turn"], text, event.ts)])


def _add_to_session(tx: Tx, rec: AgentRecord, messages: list[SessionMessage]) -> None:
    """Append ``messages`` to the agent's session, within its bounds (nothing is kept for
    an agent whose ``history`` is ``none``)."""
    if _sessions.history_of(rec) == "none":
        return
    tx.sessions[rec["id"]] = _sessions.appended(tx.session(rec["id"]), messages)


def _add_usage(rec: AgentRecord, usage: TurnUsage | None) -> None:
    """Count one turn's ``usage`` (``tokens``, ``costUsd`` or None if unknown) into ``rec``;
    a turn that reported nothing counts as a turn that spent nothing."""
    rec["usage"] = _plus(rec["usage"], usage)


def _plus(old: Usage, usage: TurnUsage | None, *, turns: int = 1) -> Usage:
    """``old`` with ``turns`` more turns (one, or none for a turn cut short) that spent
    ``usage``."""
    usage = usage or {"tokens": 0}
    cost = usage.get("costUsd", 0.0)
    return {
        "tokens": old["tokens"] + int(usage.get("tokens", 0)),
        "costUsd": old["costUsd"] + float(cost or 0.0),
        "turns": old["turns"] + turns,
        # Turns whose cost nobody could price: a dollar budget cannot vouch for them.
        "unpricedTurns": old.get("unpricedTurns", 0) + (1 if cost is None else 0),
    }


def _add_tree_usage(tx: Tx, rec: AgentRecord, usage: TurnUsage | None, *, turns: int = 1) -> None:
    """Count one turn of ``rec`` into the ``treeUsage`` of ``rec`` and of each ancestor:
    every turn counts against the agent and each of its ancestors (see _tree_budget)."""
    current: AgentRecord | None = rec
    seen: set[str] = set()
    while current is not None and current["id"] not in seen:
        seen.add(current["id"])
        current["treeUsage"] = _plus(
            current.get("treeUsage") or current["usage"], usage, turns=turns
        )
        parent = current["parent"]
        current = None if parent is None else tx.agent(parent)


def _turn_completed(tx: Tx, event: Event) -> None:
    rec = tx.agent(_agent_id(event))
    rec.pop("queuedTurn", None)
    data = cast(TurnEndedData, event.data)
    rec["turnInFlight"] = None
    rec["consecutiveFailures"] = 0
    rec.pop("stallRecoveries", None)  # it finished a turn: its stalls are behind it
    rec["lastOutput"] = data.get("output")
    rec["lastError"] = None
    _add_tree_usage(tx, rec, data.get("usage"))
    _add_usage(rec, data.get("usage"))
    rec["updatedAt"] = event.ts
    turn, reported = data.get("turn", rec["turns"]), data.get("messages")
    if reported:
        said = _sessions.stamped(reported, turn, event.ts)
    else:
        said = [_sessions.message("assistant", turn, data.get("output") or "", event.ts)]
    _add_to_session(tx, rec, said)


def _turn_failed(tx: Tx, event: Event) -> None:
    rec = tx.agent(_agent_id(event))
    rec.pop("queuedTurn", None)
    data = cast(TurnEndedData, event.data)
    rec["turnInFlight"] = None
    rec["consecutiveFailures"] = data["consecutiveFailures"]
    rec["lastError"] = data["error"]
    _add_tree_usage(tx, rec, data.get("usage"))
    _add_usage(rec, data.get("usage"))
    rec["updatedAt"] = event.ts
    turn = data.get("turn", rec["turns"])
    said = _sessions.stamped(data.get("messages") or [], turn, event.ts)
    _add_to_session(tx, rec, [*said, _sessions.message("error", turn, data["error"], event.ts)])


def _turn_queued(tx: Tx, event: Event) -> None:
    rec = tx.agent(_agent_id(event))
    turn = rec["turnInFlight"]
    if turn is not None and turn == event.data.get("turn"):
        rec["queuedTurn"] = turn


def _turn_granted(tx: Tx, event: Event) -> None:
    tx.agent(_agent_id(event)).pop("queuedTurn", None)


def _turn_interrupted(tx: Tx, event: Event) -> None:
    rec = tx.agent(_agent_id(event))
    rec.pop("queuedTurn", None)
    rec["turnInFlight"] = None
    rec["updatedAt"] = event.ts
    spent = event.data.get("usage")
    if spent is not None:
        # What a turn cut short had spent counts against every budget above it (so stopping
        # or restarting turns cannot spend past them), but it was not a turn that ran.
        usage = cast(TurnUsage, spent)
        _add_tree_usage(tx, rec, usage, turns=0)  # first: it starts from the own usage
        rec["usage"] = _plus(rec["usage"], usage, turns=0)


def _state_changed(tx: Tx, event: Event) -> None:
    rec = tx.agent(_agent_id(event))
    data = cast(StateChangedData, event.data)
    rec["state"] = data["to"]
    rec["reason"] = data.get("reason")
    rec["error"] = data.get("error")
    # The budget dimension an agent is held on, while it is.
    if data.get("dimension") is not None:
        rec["dimension"] = data["dimension"]
    else:
        rec.pop("dimension", None)
    # The decision a blocked or waiting agent waits on (older logs name it only in
    # agent.supervision_needed, which comes next).
    if data.get("decision") is not None:
        rec["decision"] = data["decision"]
    else:
        rec.pop("decision", None)
    rec["updatedAt"] = event.ts
    if data["to"] in ENDED_STATES:
        rec["endedAt"] = event.ts
    _paused(rec, event.data, event.ts)


def _paused(rec: AgentRecord, data: dict[str, Any], ts: str) -> None:
    """A paused agent keeps who preempted it, since when, and what it resumes to; nothing
    of it is left once it is not paused."""
    if data["to"] != PAUSED:
        for key in ("pausedBy", "pausedAt", "resumeTo"):
            rec.pop(key, None)  # type: ignore[misc]
        return
    if data.get("by") is not None:
        rec["pausedBy"] = data["by"]
    if data.get("from") != PAUSED or "pausedAt" not in rec:
        rec["pausedAt"] = ts
    rec["resumeTo"] = data.get("resumeTo") or "idle"


def _budget_changed(tx: Tx, event: Event) -> None:
    rec = tx.agent(_agent_id(event))
    data = cast(BudgetChangedData, event.data)
    rec["budget"] = dict(data["budget"])
    # What the change asked beyond what the ancestors had left (see _tree_budget), if any.
    if data.get("capped"):
        rec["budgetCapped"] = list(data["capped"])
    else:
        rec.pop("budgetCapped", None)
    rec["updatedAt"] = event.ts


def _spec_changed(tx: Tx, event: Event) -> None:
    # The spec's fields a live agent may have changed (see _patch), replaced whole.
    rec = tx.agent(_agent_id(event))
    rec["spec"] = {**rec["spec"], **event.data["changes"]}
    rec["updatedAt"] = event.ts


def _stall_recovery(tx: Tx, event: Event) -> None:
    rec = tx.agent(_agent_id(event))
    data = cast(StallRecoveryData, event.data)
    if data.get("action") is not None:
        rec["stallRecoveries"] = data["attempt"]
    rec["updatedAt"] = event.ts


def _no_projection(tx: Tx, event: Event) -> None:
    """An event that only informs (the log keeps it; no projection changes)."""


def _notice(tx: Tx, event: Event) -> None:
    notice = cast(Notice, dict(event.data))
    notice["id"] = event.seq
    notice["createdAt"] = event.ts
    tx.notices[event.seq] = notice


def _dropped(tx: Tx, event: Event) -> None:
    for notice_id in event.data["ids"]:
        notice = tx.notice(notice_id)
        notice["state"] = "dropped"
        notice["droppedAt"] = event.ts


def _supervision_needed(tx: Tx, event: Event) -> None:
    """A hold opens a decision: ``blocked``, or ``budget_exhausted`` for a budget hold."""
    rec = tx.agent(_agent_id(event))
    data = event.data
    decision_id = str(data.get("decision") or f"d_{event.seq}")
    kind = "budget_exhausted" if data.get("reason") == BUDGET_HELD else "blocked"
    opened: DecisionRecord = {
        "id": decision_id,
        "kind": kind,
        "state": "pending",
        "agentId": rec["id"],
        "name": rec["name"],
        "runId": rec["runId"],
        "reason": data.get("reason"),
        "error": data.get("error"),
        "since": event.ts,
        "answers": list(ANSWERS[kind]),
    }
    if data.get("dimension") is not None:
        opened["dimension"] = data["dimension"]
    if data.get("ancestor") is not None:
        opened["ancestor"] = data["ancestor"]
    tx.decisions[decision_id] = opened
    rec["decision"] = decision_id


def _requested(tx: Tx, event: Event) -> None:
    """An agent asked to act and a rule wants a person's approval."""
    rec = tx.agent(_agent_id(event))
    data = dict(event.data)
    decision = cast(DecisionRecord, data)
    decision["state"] = "pending"
    decision["agentId"] = rec["id"]
    decision["name"] = rec["name"]
    decision["runId"] = rec["runId"]
    decision["since"] = event.ts
    decision["answers"] = list(ANSWERS["approval"])
    tx.decisions[decision["id"]] = decision


def _resolved(tx: Tx, event: Event) -> None:
    data = cast(ResolvedData, event.data)
    agent_id = data.get("agentId") or _agent_id(event)
    kind = data.get("kind", "blocked")
    decision_id = data.get("decisionId")
    if decision_id is None:  # a log from before decisions had ids
        if kind == "gateway_frozen":
            decision_id = ev.gateway_decision_id(
                data.get("freezeId"), data.get("target", ""), agent_id
            )
        else:
            held = tx.get_agent(agent_id)
            waited_on = None if held is None else held.get("decision")
            decision_id = waited_on or f"d_{event.seq}"
    found = tx.decision(decision_id)
    if found is None:
        # A decision the log did not open (a gateway freeze, listed live from the gateway).
        found = {
            "id": decision_id,
            "kind": "blocked" if kind == "agent_blocked" else kind,
            "state": "pending",
            "agentId": agent_id,
            "reason": data.get("reason"),
            "since": event.ts,
            "answers": [],
        }
        if "error" in data:
            found["error"] = data["error"]
        if "target" in data:
            found["target"] = data["target"]
            found["freezeId"] = data.get("freezeId")
        tx.decisions[decision_id] = found
    found["state"] = "resolved"
    found["answer"] = data.get("answer") or data.get("action") or ""
    found["by"] = data.get("by")
    found["why"] = data.get("why")
    if data.get("note") is not None:
        found["note"] = data["note"]
    found["timedOut"] = bool(data.get("timedOut", False))
    found["at"] = event.ts
    found["answers"] = []


def _command(tx: Tx, event: Event) -> None:
    data = cast(CommandData, event.data)
    tx.commands[data["key"]] = {
        "fingerprint": data["fingerprint"],
        "command": data["command"],
        "status": data["status"],
        "response": data["response"],
        "at": event.ts,
    }


def _sessions_cleared(tx: Tx, event: Event) -> None:
    """The sessions of a run's agents are deleted (their policy says so: see _retention)."""
    for agent_id in event.data["agents"]:
        tx.sessions[agent_id] = None


def _restarted(tx: Tx, event: Event) -> None:
    """An ended agent runs again: its failure counts start from nothing (its usage, and so
    its budget, is kept; see _lifecycle). The state change that makes it live comes next."""
    rec = tx.agent(_agent_id(event))
    rec["consecutiveFailures"] = 0
    rec["retriesUsed"] = 0
    rec["restarts"] = int(event.data.get("restarts", rec.get("restarts", 0) + 1))
    rec.pop("endedAt", None)
    rec["updatedAt"] = event.ts


def _deleted(tx: Tx, event: Event) -> None:
    """An ended agent is deleted: its record, its session and the notices to it go (its
    parent forgets it); its events, and the decisions it had, stay as history."""
    agent_id = _agent_id(event)
    rec = tx.get_agent(agent_id)
    if rec is None:
        raise ReplayError(f"agent.deleted at seq {event.seq} names no agent: {agent_id!r}")
    parent = rec.get("parent")
    if parent is not None and tx.get_agent(parent) is not None:
        p = tx.agent(parent)
        p["children"] = [c for c in p.get("children", []) if c != agent_id]
    notices = [
        n
        for n, notice in {**tx.state.notices, **tx.notices}.items()
        if notice.get("to") == agent_id
    ]
    for notice_id in notices:
        tx.notices.pop(notice_id, None)
    tx.agents.pop(agent_id, None)
    tx.sessions[agent_id] = None
    tx.deleted[agent_id] = notices


def _token_created(tx: Tx, event: Event) -> None:
    data = cast(TokenCreatedData, event.data)
    tx.tokens[data["name"]] = {
        "name": data["name"],
        "sha256": data["sha256"],
        "by": data["by"],
        "createdAt": event.ts,
        "revokedAt": None,
        "revokedBy": None,
    }


def _token_revoked(tx: Tx, event: Event) -> None:
    data = cast(TokenRevokedData, event.data)
    base = tx.tokens.get(data["name"]) or tx.state.tokens.get(data["name"])
    if base is None:
        raise ReplayError(f"token.revoked at seq {event.seq} names no token: {data['name']!r}")
    tx.tokens[data["name"]] = {**base, "revokedAt": event.ts, "revokedBy": data["by"]}


_HANDLERS: dict[str, Callable[[Tx, Event], None]] = {
    ev.AGENT_CREATED: _created,
    ev.SPEC_CHANGED: _spec_changed,
    ev.TURN_STARTED: _turn_started,
    ev.TURN_COMPLETED: _turn_completed,
    ev.TURN_FAILED: _turn_failed,
    ev.TURN_INTERRUPTED: _turn_interrupted,
    ev.STATE_CHANGED: _state_changed,
    ev.SUPERVISION_NEEDED: _supervision_needed,
    ev.BUDGET_CHANGED: _budget_changed,
    ev.WORKDIR_RECREATED: _no_projection,
    ev.TURN_STALLED: _no_projection,
    ev.STALL_RECOVERY: _stall_recovery,
    ev.TURN_QUEUED: _turn_queued,
    ev.TURN_GRANTED: _turn_granted,
    ev.NOTICE: _notice,
    ev.NOTICES_DROPPED: _dropped,
    ev.DECISION_REQUESTED: _requested,
    ev.DECISION_RESOLVED: _resolved,
    ev.COMMAND_RECORDED: _command,
    ev.GATEWAY_FROZEN: _no_projection,
    ev.TOKEN_CREATED: _token_created,
    ev.TOKEN_REVOKED: _token_revoked,
    ev.SESSIONS_CLEARED: _sessions_cleared,
    ev.AGENT_RESTARTED: _restarted,
    ev.AGENT_DELETED: _deleted,
}
assert set(_HANDLERS) == ev.EVENT_TYPES
