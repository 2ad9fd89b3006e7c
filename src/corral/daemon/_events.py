"""Events: the append-only log that is the agent service's source of truth.

One constructor per event type builds its ``data`` with the keys the log has always held; the
reducer (``_state.py``) reads them back through the same typed shapes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NotRequired, TypedDict

from corral.daemon._records import AgentRecord, TurnUsage

# Agent lifecycle
AGENT_CREATED = "agent.created"
TURN_STARTED = "agent.turn_started"
TURN_COMPLETED = "agent.turn_completed"
TURN_FAILED = "agent.turn_failed"
TURN_INTERRUPTED = "agent.turn_interrupted"
STATE_CHANGED = "agent.state_changed"
SUPERVISION_NEEDED = "agent.supervision_needed"
BUDGET_CHANGED = "agent.budget_changed"
# A person (or an agent, tightening) changed a live agent's notifyOn or guardrails (_patch)
SPEC_CHANGED = "agent.spec_changed"
WORKDIR_RECREATED = "agent.workdir_recreated"
TURN_STALLED = "agent.turn_stalled"
STALL_RECOVERY = "agent.stall_recovery"
# A started turn waits for one of the daemon's concurrent-turn slots, then has one
TURN_QUEUED = "agent.turn_queued"
TURN_GRANTED = "agent.turn_granted"
# A person's lifecycle commands (see _lifecycle): an ended agent runs again, or is deleted.
AGENT_RESTARTED = "agent.restarted"
AGENT_DELETED = "agent.deleted"
# Inboxes, decisions, commands
NOTICE = "inbox.notice"
NOTICES_DROPPED = "inbox.dropped"
DECISION_REQUESTED = "decision.requested"
DECISION_RESOLVED = "decision.resolved"
COMMAND_RECORDED = "command.recorded"
# The gateway (daemons started with --db)
GATEWAY_FROZEN = "gateway.agent_frozen"
# Named operator tokens (only a hash of each secret is kept)
TOKEN_CREATED = "token.created"
TOKEN_REVOKED = "token.revoked"
# Sessions (see _sessions): a run's sessions deleted as their history policy says
SESSIONS_CLEARED = "sessions.cleared"

EVENT_TYPES = frozenset(
    {
        AGENT_CREATED,
        TURN_STARTED,
        TURN_COMPLETED,
        TURN_FAILED,
        TURN_INTERRUPTED,
        STATE_CHANGED,
        SUPERVISION_NEEDED,
        BUDGET_CHANGED,
        SPEC_CHANGED,
        WORKDIR_RECREATED,
        TURN_STALLED,
        STALL_RECOVERY,
        TURN_QUEUED,
        TURN_GRANTED,
        NOTICE,
        NOTICES_DROPPED,
        DECISION_REQUESTED,
        DECISION_RESOLVED,
        COMMAND_RECORDED,
        GATEWAY_FROZEN,
        TOKEN_CREATED,
        TOKEN_REVOKED,
        SESSIONS_CLEARED,
        AGENT_RESTARTED,
        AGENT_DELETED,
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


# --- the shapes of ``data`` the reducer reads ----------------------------------------------


class TurnStartedData(TypedDict):
    """``text``: what the agent got, the notices in front of ``prompt``, when it had any."""

    turn: int
    prompt: str
    retry: bool
    notices: list[int]
    restart: NotRequired[bool]  # a stalled turn started again (see _stall)
    woken: NotRequired[bool]  # the daemon started it for notices (a ``wake`` agent)
    text: NotRequired[str]


class TurnEndedData(TypedDict, total=False):
    """``agent.turn_completed`` (``output``) and ``agent.turn_failed`` (``error``,
    ``consecutiveFailures``); both carry ``usage`` (None: nothing reported)."""

    turn: int
    output: str
    error: str
    consecutiveFailures: int
    usage: TurnUsage | None
    messages: list[dict[str, Any]]  # what the harness said in the turn (_sessions.turn_messages)


class StateChangedData(TypedDict, total=False):
    to: str
    reason: str | None
    error: str | None
    dimension: str
    decision: str  # the decision a blocked or waiting agent waits on
    by: str | None  # who stopped it; to ``paused``: the agent it was preempted for
    resumeTo: str  # to ``paused``: idle, blocked, retry or turn (see _headcount)


class ResolvedData(TypedDict, total=False):
    """``decision.resolved``: which decision, the answer, who gave it (``by``, the caller's
    token name; ``note``, a name typed by the caller), why, and whether nobody answered in
    time. Logs written before decisions had ids name the agent (``agentId``) and the answer
    as ``action``."""

    decisionId: str
    kind: str
    agentId: str
    reason: str | None
    error: str | None
    target: str
    freezeId: str | None
    answer: str
    action: str
    by: str | None
    note: str | None
    why: str | None
    timedOut: bool


class BudgetChangedData(TypedDict):
    """``agent.budget_changed``: the budget in force from now on and the one before, as the
    spec's ``budget`` (camelCase; None is unlimited), and who changed it and why;
    ``capped``: the dimensions asked beyond what the agent's ancestors had left (each
    ``{dimension, asked, granted}``), when any were."""

    budget: dict[str, Any]
    previous: dict[str, Any]
    by: str | None
    why: str | None
    capped: NotRequired[list[dict[str, Any]]]


class CommandData(TypedDict):
    key: str
    fingerprint: str
    command: dict[str, Any]
    status: int
    response: dict[str, Any]


# --- constructors ---------------------------------------------------------------------------


def agent_created(record: AgentRecord) -> NewEvent:
    return NewEvent(AGENT_CREATED, record["id"], {"agent": record})


def turn_started(
    agent_id: str,
    turn: int,
    prompt: str,
    *,
    retry: bool,
    notices: Sequence[int],
    restart: bool = False,
    woken: bool = False,
    text: str | None = None,
) -> NewEvent:
    """Turn ``turn`` starts: a retry of the failure policy (``retry``), the restart of a
    stalled turn (``restart``: the same prompt and notices, counted as neither), a turn the
    daemon started for notices (``woken``), or a new prompt with ``notices`` in front of it.
    ``text`` is what the agent gets when it is not the prompt alone (notices in front of
    it): the agent's session keeps that."""
    data: dict[str, Any] = {
        "turn": turn,
        "prompt": prompt,
        "retry": retry,
        "notices": list(notices),
    }
    if restart:
        data["restart"] = True
    if woken:
        data["woken"] = True
    if text is not None and text != prompt:
        data["text"] = text
    return NewEvent(TURN_STARTED, agent_id, data)


def turn_completed(
    agent_id: str,
    turn: int,
    output: str,
    usage: TurnUsage,
    messages: Sequence[Mapping[str, Any]] = (),
) -> NewEvent:
    """The turn succeeded; ``messages`` are what its harness said in it (checked and
    bounded by ``_sessions.turn_messages``), kept in the agent's session."""
    data: dict[str, Any] = {"turn": turn, "output": output, "usage": usage}
    if messages:
        data["messages"] = [dict(m) for m in messages]
    return NewEvent(TURN_COMPLETED, agent_id, data)


def turn_failed(
    agent_id: str,
    turn: int,
    error: str,
    failures: int,
    usage: Mapping[str, Any] | None,
    messages: Sequence[Mapping[str, Any]] = (),
) -> NewEvent:
    """The turn failed; ``messages`` are what its harness said in it before (as for
    :func:`turn_completed`)."""
    data: dict[str, Any] = {
        "turn": turn,
        "error": error,
        "consecutiveFailures": failures,
        "usage": dict(usage) if usage else None,
    }
    if messages:
        data["messages"] = [dict(m) for m in messages]
    return NewEvent(TURN_FAILED, agent_id, data)


def turn_queued(agent_id: str, turn: int) -> NewEvent:
    """Turn ``turn`` waits for a concurrent-turn slot: it has not started, and a daemon that
    starts finds it so and runs it rather than count it as cut short."""
    return NewEvent(TURN_QUEUED, agent_id, {"turn": turn})


def turn_granted(agent_id: str, turn: int) -> NewEvent:
    """Turn ``turn``, which waited, has its slot and starts."""
    return NewEvent(TURN_GRANTED, agent_id, {"turn": turn})


def turn_interrupted(
    agent_id: str, turn: int, reason: str, usage: Mapping[str, Any] | None = None
) -> NewEvent:
    """Turn ``turn`` was cut short; ``usage``: what it had spent, when its harness could
    tell (it counts against the budgets, but not as a turn)."""
    data: dict[str, Any] = {"turn": turn, "reason": reason}
    if usage is not None:
        data["usage"] = dict(usage)
    return NewEvent(TURN_INTERRUPTED, agent_id, data)


def prompted(agent_id: str, was: str) -> NewEvent:
    """The agent runs a turn a person or its parent asked for."""
    return NewEvent(STATE_CHANGED, agent_id, {"from": was, "to": "running", "reason": "prompted"})


def woken(agent_id: str) -> NewEvent:
    """The idle agent runs a turn the daemon started for the notices that reached it."""
    data = {"from": "idle", "to": "running", "reason": "woken"}
    return NewEvent(STATE_CHANGED, agent_id, data)


def turn_done(agent_id: str, was: str = "running") -> NewEvent:
    """The agent's turn succeeded: it waits, idle, for the next prompt (``was``: ``waiting``
    for a turn that ended while it waited on a person)."""
    data = {"from": was, "to": "idle", "reason": "turn-done"}
    return NewEvent(STATE_CHANGED, agent_id, data)


def stopped(
    agent_id: str,
    was: str,
    by: str | None,
    why: str | None = None,
    *,
    run: str | None = None,
    with_: str | None = None,
) -> NewEvent:
    """The agent was stopped, by whom and why (``why`` is in the log since it was added; an
    older ``stopped`` event has no such key); ``run``: as part of stopping that whole run
    (``runStop``, the same ``by`` and ``why`` on each of its agents); ``with_``: as a
    descendant of that stopped agent (``stoppedWith``)."""
    data = {"from": was, "to": "stopped", "reason": "stopped", "by": by, "why": why}
    if run is not None:
        data["runStop"] = run
    if with_ is not None:
        data["stoppedWith"] = with_
    return NewEvent(STATE_CHANGED, agent_id, data)


def restarted(agent_id: str, was: str, by: str | None, why: str | None, restarts: int) -> NewEvent:
    """The ended agent (``was``: stopped or failed) runs again, by whom and why: its
    consecutive failures and retries start again from nothing (its ``restarts``-th restart).
    The ``agent.state_changed`` that makes it live comes next."""
    data = {"from": was, "by": by, "why": why, "restarts": restarts}
    return NewEvent(AGENT_RESTARTED, agent_id, data)


def deleted(agent_id: str, by: str | None, why: str | None, *, with_: str | None) -> NewEvent:
    """The ended agent's record, session and stored data are deleted (its events stay in the
    log, this one marking where it ends); ``with_``: deleted with that ancestor."""
    data: dict[str, Any] = {"by": by, "why": why}
    if with_ is not None:
        data["with"] = with_
    return NewEvent(AGENT_DELETED, agent_id, data)


def failed(
    agent_id: str, error: str, reason: str = "turn-failed", *, was: str = "running"
) -> NewEvent:
    """The agent ends failed: its policy gave up after a failed turn (or, ``reason``
    ``stalled``, its recovery ejected it); ``was`` as for :func:`turn_done`."""
    data = {"from": was, "to": "failed", "reason": reason, "error": error}
    return NewEvent(STATE_CHANGED, agent_id, data)


def held(
    agent_id: str,
    was: str,
    reason: str,
    error: str | None,
    *,
    decision: str,
    dimension: str | None = None,
    ancestor: str | None = None,
) -> list[NewEvent]:
    """The agent is held in ``blocked`` until a person answers ``decision``; ``dimension``
    names the budget that ran out, when one did, and ``ancestor`` the ancestor whose budget
    it was (see _tree_budget)."""
    extra = {} if dimension is None else {"dimension": dimension}
    if ancestor is not None:
        extra["ancestor"] = ancestor
    changed = {
        "from": was,
        "to": "blocked",
        "reason": reason,
        "error": error,
        "decision": decision,
        **extra,
    }
    needed = {"reason": reason, "error": error, "decision": decision, **extra}
    return [
        NewEvent(STATE_CHANGED, agent_id, changed),
        NewEvent(SUPERVISION_NEEDED, agent_id, needed),
    ]


def approval_requested(record: AgentRecord, decision: Mapping[str, Any]) -> NewEvent:
    """An agent asked to act and a rule wants a person to approve: ``decision`` holds the
    ``id``, ``action``, ``context``, ``rule``, ``checkId``, ``ruleIndex``, ``reason``,
    ``deadline`` and ``onTimeout``."""
    return NewEvent(DECISION_REQUESTED, record["id"], {"kind": "approval", **decision})


def waiting(agent_id: str, decision: str, *, was: str = "running") -> NewEvent:
    """The agent's turn waits on a person's answer to ``decision``."""
    data = {"from": was, "to": "waiting", "reason": "approval", "decision": decision}
    return NewEvent(STATE_CHANGED, agent_id, data)


def resumed(agent_id: str) -> NewEvent:
    """The decisions the agent's turn waited on are answered: the turn goes on."""
    data = {"from": "waiting", "to": "running", "reason": "answered"}
    return NewEvent(STATE_CHANGED, agent_id, data)


def paused(
    agent_id: str, was: str, by: str | None, resume_to: str, *, decision: str | None = None
) -> NewEvent:
    """The agent is paused: preempted at its run's headcount cap for agent ``by`` (``was``
    paused: what it resumes to changed, its turn in flight having ended). ``resume_to``:
    ``idle``, ``blocked`` (on ``decision``), ``retry`` or ``turn`` (see ``_headcount``)."""
    data: dict[str, Any] = {
        "from": was,
        "to": "paused",
        "reason": "preempted",
        "by": by,
        "resumeTo": resume_to,
    }
    if decision is not None:
        data["decision"] = decision
    return NewEvent(STATE_CHANGED, agent_id, data)


def unpaused(agent_id: str, to: str, *, reason: str | None = "resumed", **fields: Any) -> NewEvent:
    """A paused agent resumes (headcount freed): ``to`` idle, running (its turn still in
    flight, or run again) or blocked (``fields``: the ``error``, ``decision``, ...)."""
    data = {"from": "paused", "to": to, "reason": reason, **fields}
    return NewEvent(STATE_CHANGED, agent_id, data)


def budget_changed(
    agent_id: str,
    budget: Mapping[str, Any],
    previous: Mapping[str, Any],
    by: str | None,
    why: str | None,
    capped: Sequence[Mapping[str, Any]] = (),
) -> NewEvent:
    """A person (or an agent, lowering it) changed the agent's budget; ``capped``: what it
    asked beyond what the agent's ancestors had left."""
    data: BudgetChangedData = {
        "budget": dict(budget),
        "previous": dict(previous),
        "by": by,
        "why": why,
    }
    if capped:
        data["capped"] = [dict(c) for c in capped]
    return NewEvent(BUDGET_CHANGED, agent_id, dict(data))


def released(agent_id: str) -> NewEvent:
    """A blocked agent whose budget was raised waits, idle, for its next prompt."""
    data = {"from": "blocked", "to": "idle", "reason": "budget-raised"}
    return NewEvent(STATE_CHANGED, agent_id, data)


def workdir_recreated(agent_id: str, turn: int, workdir: str) -> NewEvent:
    """The agent's working directory was gone when its turn started: it was made again, empty."""
    return NewEvent(WORKDIR_RECREATED, agent_id, {"turn": turn, "workdir": workdir})


def turn_stalled(agent_id: str, turn: int, silence_s: float, heartbeat_s: float) -> NewEvent:
    """Turn ``turn`` showed no sign of life for ``silence_s`` seconds, past the spec's
    ``heartbeatS``."""
    data = {"turn": turn, "silenceS": round(silence_s, 3), "heartbeatS": heartbeat_s}
    return NewEvent(TURN_STALLED, agent_id, data)


class StallRecoveryData(TypedDict):
    """``agent.stall_recovery``: what the recovery policy made of a stalled turn.

    ``action`` is ``restart``, ``escalate`` or ``eject``, or None when the stall came inside
    the cooldown (nothing done yet: ``waitS`` seconds later, a turn still silent is
    recovered). ``attempt`` is the agent's count of stall recoveries after this one (since
    its last completed turn); the policy's limits come with it; ``detail`` says why."""

    turn: int
    action: str | None
    attempt: int
    maxRetries: int
    escalateAfter: int
    cooldownS: float
    waitS: NotRequired[float]
    detail: str


def stall_recovery(agent_id: str, data: StallRecoveryData) -> NewEvent:
    return NewEvent(STALL_RECOVERY, agent_id, dict(data))


def notice(to: str, sender: AgentRecord, kind: str, state: str, **fields: Any) -> NewEvent:
    """A notice to agent ``to`` about ``sender``; ``fields`` (``reason``, ``error``,
    ``output``, ``target``) are kept as given."""
    data = {
        "to": to,
        "from": sender["id"],
        "fromName": sender["name"],
        "kind": kind,
        "state": state,
        **fields,
    }
    return NewEvent(NOTICE, to, data)


def notices_dropped(agent_id: str, ids: Sequence[int]) -> NewEvent:
    return NewEvent(NOTICES_DROPPED, agent_id, {"ids": list(ids)})


def resolved(
    decision: Mapping[str, Any],
    answer: str,
    by: str | None,
    why: str | None,
    *,
    note: str | None = None,
    timed_out: bool = False,
) -> NewEvent:
    """A person (or, ``timed_out``, the daemon at the deadline) answered ``decision``."""
    data: ResolvedData = {
        "decisionId": decision["id"],
        "kind": decision["kind"],
        "agentId": decision["agentId"],
        "reason": decision.get("reason"),
        "answer": answer,
        "by": by,
        "why": why,
    }
    if note is not None:
        data["note"] = note
    if timed_out:
        data["timedOut"] = True
    if decision.get("error") is not None:
        data["error"] = decision["error"]
    if decision.get("target") is not None:
        data["target"] = decision["target"]
        data["freezeId"] = decision.get("freezeId")
    return NewEvent(DECISION_RESOLVED, decision["agentId"], dict(data))


def gateway_decision_id(freeze_id: str | None, target: str, agent_id: str) -> str:
    """The stable id of the decision a gateway freeze opens."""
    return f"g_{freeze_id}" if freeze_id else f"g_{target}_{agent_id}"


def gateway_frozen(target: str, freeze: Mapping[str, Any]) -> NewEvent:
    """The gateway froze an agent in ``target``: ``freeze`` is its journal entry as JSON."""
    return NewEvent(GATEWAY_FROZEN, freeze["agentId"], {"target": target, **freeze})


def command_recorded(
    key: str,
    fingerprint: str,
    command: dict[str, Any],
    status: int,
    response: dict[str, Any],
) -> NewEvent:
    data: CommandData = {
        "key": key,
        "fingerprint": fingerprint,
        "command": command,
        "status": status,
        "response": response,
    }
    return NewEvent(COMMAND_RECORDED, None, dict(data))


# --- named operator tokens ---------------------------------------------------------------------


class TokenCreatedData(TypedDict):
    """``token.created``: a named operator token, by the SHA-256 (hex) of its secret (the
    secret itself is never written), and the operator who made it (None: in-process code)."""

    name: str
    sha256: str
    by: str | None


class TokenRevokedData(TypedDict):
    """``token.revoked``: the token of that name no longer opens the daemon."""

    name: str
    by: str | None


def sessions_cleared(run_id: str, agent_ids: Sequence[str], reason: str) -> NewEvent:
    """The sessions of ``agent_ids``, agents of run ``run_id``, are deleted (``reason``:
    ``run ended``). An event of the run, not of one agent: it names no agent."""
    data = {"runId": run_id, "agents": list(agent_ids), "reason": reason}
    return NewEvent(SESSIONS_CLEARED, None, data)


def token_created(name: str, sha256: str, by: str | None) -> NewEvent:
    data: TokenCreatedData = {"name": name, "sha256": sha256, "by": by}
    return NewEvent(TOKEN_CREATED, None, dict(data))


def token_revoked(name: str, by: str | None) -> NewEvent:
    data: TokenRevokedData = {"name": name, "by": by}
    return NewEvent(TOKEN_REVOKED, None, dict(data))
