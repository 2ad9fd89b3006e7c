"""Asking before acting: what an action check takes, what it answers, and when an approval
is allowed. Pure functions; the service runs the rules and keeps the decisions."""

from __future__ import annotations

import json
import math
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from corral.daemon import _events as ev
from corral.daemon._errors import InvalidRequestError, TooManyApprovalsError
from corral.daemon._events import NewEvent
from corral.daemon._records import DecisionRecord
from corral.daemon._state import ENDED_STATES
from corral.daemon._text import json_problems
from corral.daemon.guardrails import action_problems
from corral.guard import GuardrailResult

MAX_CONTEXT_BYTES = 16_384
"""The largest context a check takes, as compact JSON (bytes)."""
MAX_WAIT_S = 300.0
"""The longest one request waits for a person (``waitS``); wait again for longer."""
MAX_PENDING_APPROVALS = 100
"""How many approvals one agent may have waiting on people at once."""
MAX_PENDING_RUN_APPROVALS = 500
"""How many approvals the agents of one run may have waiting at once (an agent that makes
helpers must not multiply the limit of one)."""

Json = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Verdict:
    """An action check's answer, shaped like ``corral.kernel.ActionVerdict`` (``allowed``,
    ``reason``) so a harness's ``ToolGuard`` takes it as it is."""

    verdict: str  # allowed | blocked | pending
    reason: str | None
    warnings: tuple[dict[str, str], ...] = ()
    decision: str | None = None

    @property
    def allowed(self) -> bool:
        return self.verdict == "allowed"

    def to_json(self) -> Json:
        return {
            "verdict": self.verdict,
            "reason": self.reason,
            "warnings": [dict(w) for w in self.warnings],
            "decision": self.decision,
        }


def new_check_id() -> str:
    return "c_" + secrets.token_hex(6)


def check_input(action: Any, context: Any, wait_s: Any) -> dict[str, Any]:
    """Refuse (``InvalidRequestError``, every problem) an action the rules cannot check
    (``guardrails.action_problems``: not a non-empty string of at most
    ``guardrails.MAX_ACTION_CHARS`` characters, or text no store keeps), a context that is
    not a JSON object of at most :data:`MAX_CONTEXT_BYTES` bytes, or a wait that is not a
    number from 0 to :data:`MAX_WAIT_S` (or infinity, for callers inside the daemon).
    Answers the context (an empty dict for None)."""
    problems = action_problems(action)
    if context is None:
        context = {}
    if not isinstance(context, dict):
        problems.append({"field": "context", "message": "must be a JSON object"})
    else:
        try:
            size = len(json.dumps(context, separators=(",", ":"), allow_nan=False).encode())
        except (TypeError, ValueError) as exc:
            problems.append({"field": "context", "message": f"must be plain JSON ({exc})"})
        else:
            if size > MAX_CONTEXT_BYTES:
                problems.append(
                    {
                        "field": "context",
                        "message": f"at most {MAX_CONTEXT_BYTES} bytes as JSON, got {size}",
                    }
                )
            problems += json_problems(context, "context", identifiers=())
    if (
        isinstance(wait_s, bool)
        or not isinstance(wait_s, int | float)
        or math.isnan(wait_s)
        or wait_s < 0
        or (wait_s > MAX_WAIT_S and not math.isinf(wait_s))
    ):
        problems.append(
            {"field": "waitS", "message": f"a number of seconds from 0 to {MAX_WAIT_S:g}"}
        )
    if problems:
        raise InvalidRequestError(problems, "action check")
    return dict(context)


def verdict_of(result: GuardrailResult, decision: str | None) -> Verdict:
    """The rules' result as a check's answer."""
    warnings = tuple({"rule": w.guardrail, "reason": w.reason} for w in result.warnings)
    return Verdict("allowed" if result.allowed else "blocked", result.reason, warnings, decision)


def pending(decision: DecisionRecord) -> Verdict:
    return Verdict("pending", decision.get("reason"), (), decision["id"])


def allowed(decision: DecisionRecord) -> bool:
    """Whether an answered approval lets the action go on: approved, or timed out with
    ``onTimeout`` allow."""
    return decision.get("answer") == "approve"


def timeout_answer(decision: DecisionRecord) -> str:
    """The answer a deadline gives: ``approve`` with ``onTimeout`` allow, else ``deny``."""
    return "approve" if decision.get("onTimeout") == "allow" else "deny"


def denial_reason(decision: DecisionRecord) -> str:
    """Why an answered approval blocks the action, for the agent to read."""
    if decision.get("timedOut"):
        deadline = decision.get("deadline")
        return f"nobody answered approval {decision['id']} before its deadline ({deadline})"
    if decision.get("answer") == "withdrawn":
        return f"approval {decision['id']} was withdrawn: {decision.get('why')}"
    who = decision.get("by") or "a person"
    why = decision.get("why")
    return f"denied by {who}" + (f": {why}" if why else "")


def deadline(now: datetime, timeout_s: float) -> str:
    return (now + timedelta(seconds=timeout_s)).isoformat()


def seconds_until(now: datetime, when: str) -> float:
    return (datetime.fromisoformat(when) - now).total_seconds()


def same_pending(
    decisions: Iterable[DecisionRecord],
    agent_id: str,
    rule_index: int,
    rule: Mapping[str, Any],
    action: str,
    context: Mapping[str, Any],
) -> str | None:
    """The id of a pending approval of ``agent_id`` for the same action, context and rule
    (at the same place, with the same content: ``rule`` as ``rule_to_json`` gives it), if
    there is one."""
    for found in decisions:
        if (
            found["kind"] == "approval"
            and found["state"] == "pending"
            and found["agentId"] == agent_id
            and found.get("ruleIndex") == rule_index
            and found.get("rule") == rule
            and found.get("action") == action
            and found.get("context") == dict(context)
        ):
            return found["id"]
    return None


def check_room(decisions: Iterable[DecisionRecord], agent_id: str, run_id: str) -> None:
    """Refuse (``TooManyApprovalsError``, retryable) a new approval for an agent that has
    :data:`MAX_PENDING_APPROVALS` waiting already, or whose run has
    :data:`MAX_PENDING_RUN_APPROVALS`."""
    mine = in_run = 0
    for found in decisions:
        if found["kind"] != "approval" or found["state"] != "pending":
            continue
        mine += found["agentId"] == agent_id
        in_run += found.get("runId") == run_id
    if mine >= MAX_PENDING_APPROVALS:
        raise TooManyApprovalsError(agent_id, MAX_PENDING_APPROVALS, mine)
    if in_run >= MAX_PENDING_RUN_APPROVALS:
        raise TooManyApprovalsError(agent_id, MAX_PENDING_RUN_APPROVALS, in_run, run=run_id)


def withdrawn_at_end(
    decisions: Iterable[DecisionRecord], events: Sequence[NewEvent]
) -> list[NewEvent]:
    """``events`` with every approval still pending of an agent they end withdrawn, just
    before its end: an approval asked between turns belongs to no turn, so no turn's end
    withdraws it, and an ended (then deleted) agent must leave none waiting on people."""
    ending = {
        e.agent_id: i
        for i, e in reversed(list(enumerate(events)))
        if e.type == ev.STATE_CHANGED and e.agent_id and e.data.get("to") in ENDED_STATES
    }
    if not ending:
        return list(events)
    answered = {e.data.get("decisionId") for e in events if e.type == ev.DECISION_RESOLVED}
    before: dict[int, list[NewEvent]] = {}
    for found in decisions:
        agent_id = found["agentId"]
        if (
            found["kind"] == "approval"
            and found["state"] == "pending"
            and agent_id in ending
            and found["id"] not in answered
        ):
            withdrawn = ev.resolved(found, "withdrawn", None, "the agent ended")
            before.setdefault(ending[agent_id], []).append(withdrawn)
    if not before:
        return list(events)
    return [w for i, e in enumerate(events) for w in (*before.get(i, ()), e)]
