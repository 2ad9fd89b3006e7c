"""Agents in their own process (harness ``external``): what the service decides when such an
agent's process begins a turn or reports how one ended. Pure functions over the state.

The daemon never starts a turn of an external agent: its process does (``POST
/agents/{id}/turns``), and the turn runs from then on as any turn does -- turn record,
events, approvals, the stop that interrupts it -- while ``ExternalHarness`` waits for the
process's report (``POST /agents/{id}/turns/{n}/end``), which is settled as another
harness's result would be: usage against the budgets, ``onFailure``, the breaker, notices.

Where the daemon would start a turn by itself, for an external agent it does not:

- ``onFailure: retry``: the failed turn leaves the agent ``idle`` (reason ``retry``); the
  next turn its process begins is the retry (counted in ``retriesUsed``); after
  ``maxRetries`` of them the next failure holds it (``retries-exhausted``), as a daemon's
  retries would.
- a person's ``retry`` answer to a hold frees it (``idle``, reason ``answered``): its process
  may begin turns again. A prompt (``POST /agents/{id}/prompt``) is refused
  (``agent_external``): the daemon has nothing to run it with.
- a restart leaves it ``idle``; a resume after a preemption runs no turn (a cancelled turn
  was interrupted: its process begins the next one).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from corral.daemon import _budget, _notices, _tree_budget
from corral.daemon import _events as ev
from corral.daemon._decisions import resolve_hold
from corral.daemon._errors import (
    AgentBusyError,
    AgentHeldError,
    NotExternalError,
    TurnNotFoundError,
    TurnNotOpenError,
)
from corral.daemon._events import NewEvent
from corral.daemon._headcount import refuse_if_paused
from corral.daemon._policy import BUDGET_EXHAUSTED
from corral.daemon._records import AgentRecord
from corral.daemon._spec import AgentSpec
from corral.daemon._state import BUSY_STATES, State
from corral.daemon.harnesses import TurnFailedError, TurnResult

EXTERNAL = "external"
RETRY = "retry"  # the reason of an external agent left idle to retry by itself
BEGUN = "begun"  # the reason of the state change that runs a turn its process began
ANSWERED = "answered"  # the reason of a held external agent freed by a person's answer

Json = dict[str, Any]


def is_external(spec: AgentSpec) -> bool:
    return spec.harness == EXTERNAL


def check_begin(rec: AgentRecord, spec: AgentSpec) -> None:
    """Refuse a turn the agent cannot begin now: not ``external`` (``NotExternalError``),
    paused (``AgentPausedError``), in a turn (``AgentBusyError``), held on anything but its
    budget (``AgentHeldError``; a budget hold is told as the budget's refusal). The caller
    refuses an ended agent first."""
    if not is_external(spec):
        raise NotExternalError(rec["id"], spec.harness)
    refuse_if_paused(rec)
    if rec["state"] in BUSY_STATES:
        raise AgentBusyError(rec["id"])
    if rec["state"] == "blocked" and rec["reason"] != BUDGET_EXHAUSTED:
        raise AgentHeldError(rec["id"], rec["reason"], rec.get("decision"))


@dataclass(frozen=True, slots=True)
class Begin:
    """What beginning a turn commits, the turn's number and text (its prompt with pending
    notices in front), and the answer."""

    events: list[NewEvent]
    turn: int
    text: str
    body: Json


def begin(
    state: State,
    rec: AgentRecord,
    spec: AgentSpec,
    prompt: str,
    now: datetime,
    lookup: _tree_budget.Lookup,
) -> Begin:
    """Turn ``rec['turns'] + 1`` of the idle agent, begun by its process with ``prompt``: a
    retry when its last turn failed under ``onFailure: retry`` (left ``idle``, reason
    ``retry``). Notices waiting for it go in front of the prompt, as for any turn; the
    answer carries that ``text``, the turn's time limit (``timeoutS``) and what is left of
    its budget, the tightest of its own and its ancestors' (``remaining``, None:
    unlimited)."""
    agent_id = rec["id"]
    retry = rec["state"] == "idle" and rec["reason"] == RETRY
    pending = _notices.pending(state, agent_id)
    text = _notices.with_notices(prompt, pending)
    turn = rec["turns"] + 1
    events = [
        NewEvent(
            ev.STATE_CHANGED, agent_id, {"from": rec["state"], "to": "running", "reason": BEGUN}
        ),
        ev.turn_started(
            agent_id, turn, prompt, retry=retry, notices=[n["id"] for n in pending], text=text
        ),
    ]
    own = _budget.in_force(rec, spec).to_budget()
    left = _tree_budget.remaining(rec, own, lookup, now)
    timeout_s = spec.turn_timeout_s
    if left.deadline_s is not None:
        timeout_s = max(0.001, min(timeout_s, left.deadline_s))  # as _turns.request bounds it
    body: Json = {
        "id": agent_id,
        "accepted": "turn",
        "turn": turn,
        "retry": retry,
        "text": text,
        "timeoutS": timeout_s,
        "remaining": {
            "tokens": left.max_tokens,
            "costUsd": left.max_cost_usd,
            "deadlineS": left.deadline_s,
        },
    }
    return Begin(events, turn, text, body)


def instead_of_retry(
    rec: AgentRecord, events: Sequence[NewEvent], retry: int | None
) -> tuple[list[NewEvent], int | None]:
    """A failed turn's events with the retry the daemon would start (``retry``, its number)
    replaced: the agent is left ``idle`` (reason ``retry``) for its process to begin the
    retry. As they are when there is no retry."""
    if retry is None:
        return list(events), None
    agent_id = rec["id"]
    kept = [
        e
        for e in events
        if not (
            e.agent_id == agent_id
            and (
                e.type == ev.TURN_STARTED
                or (e.type == ev.STATE_CHANGED and e.data.get("reason") == "retry")
            )
        )
    ]
    data = {"from": rec["state"], "to": "idle", "reason": RETRY}
    return [*kept, NewEvent(ev.STATE_CHANGED, agent_id, data)], None


def freed(
    state: State, rec: AgentRecord, by: str | None, why: str | None, note: str | None
) -> list[NewEvent]:
    """A person answered ``retry`` to the held external agent: its decision is resolved and
    it waits, idle, for its process to begin a turn."""
    data = {"from": rec["state"], "to": "idle", "reason": ANSWERED, "by": by, "why": why}
    return [
        *resolve_hold(state, rec, "retry", by, why, note),
        NewEvent(ev.STATE_CHANGED, rec["id"], data),
    ]


# --- a turn's end -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Report:
    """How a turn ended, as the agent's process tells it: ``ok`` with its ``output``, or
    failed with ``error`` (the text its record shows); what it spent (``tokens``,
    ``cost_usd``: None when unknown, which a dollar budget cannot vouch for)."""

    ok: bool
    output: str = ""
    error: str = ""
    tokens: int = 0
    cost_usd: float | None = 0.0

    def outcome(self) -> TurnResult | TurnFailedError:
        """The outcome as a harness would give it."""
        if self.ok:
            return TurnResult(output=self.output, tokens=self.tokens, cost_usd=self.cost_usd)
        usage = {"tokens": self.tokens, "costUsd": self.cost_usd}
        return TurnFailedError(self.error, usage=usage)


def error_text(code: str | None, message: str | None) -> str:
    """A failed turn's error as its record shows it: ``code: message``."""
    message = message or "its process reported that the turn failed"
    return f"{code}: {message}" if code else message


def ended(
    agent_id: str, turn: int, record: Mapping[str, Any] | None, rec: AgentRecord | None
) -> Json:
    """The answer to a turn's end: its record (without output and log) and the agent as the
    outcome left it (``agent``: ``state``, ``reason``, ``error``, ``decision``). Raises
    ``TurnNotFoundError`` for a turn the agent never had, ``TurnNotOpenError`` (retryable)
    for one not settled yet."""
    if record is None:
        raise TurnNotFoundError(agent_id, turn)
    if record.get("outcome") == "running":
        raise TurnNotOpenError(agent_id, turn)
    body = {k: v for k, v in record.items() if k not in ("output", "logs")}
    if rec is not None:
        body["agent"] = {
            "state": rec["state"],
            "reason": rec.get("reason"),
            "error": rec.get("error"),
            "decision": rec.get("decision"),
        }
    return body
