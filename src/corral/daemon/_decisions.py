"""What the service decides after a turn or before one, as events: pure functions of the state.

A turn's outcome under the failure policy and the budget, and holding an agent for a person.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from corral.daemon import _budget, _notices, _tree_budget
from corral.daemon import _events as ev
from corral.daemon._events import NewEvent
from corral.daemon._policy import BUDGET_EXHAUSTED, after_failure
from corral.daemon._records import AgentRecord, TurnUsage
from corral.daemon._spec import AgentSpec, BudgetSpec
from corral.daemon._state import State, preview
from corral.kernel import BudgetExhaustedError


def exhausted(
    rec: AgentRecord, spec: AgentSpec, now: datetime, lookup: _tree_budget.Lookup
) -> BudgetExhaustedError | None:
    """Why the agent's budget, or an ancestor's (found with ``lookup``), leaves no room for
    another turn at ``now``, or None (see :mod:`._tree_budget`)."""
    own = _budget.in_force(rec, spec).to_budget()
    return _tree_budget.exhausted(rec, own, lookup, now)


def held_on_budget(rec: AgentRecord, spec: AgentSpec, now: datetime) -> BudgetExhaustedError:
    """Why an agent held ``budget-exhausted`` takes no prompt: its hold's own error."""
    dimension = rec.get("dimension") or "cost_usd"
    budget = _budget.in_force(rec, spec).to_budget()
    used = _tree_budget.tree_usage(rec)
    limit, spent = {
        "tokens": (budget.max_tokens, used["tokens"]),
        "cost_usd": (budget.max_cost_usd, used["costUsd"]),
        "turns": (budget.max_turns, used["turns"]),
        "deadline_s": (budget.deadline_s, round(_budget.age_s(rec["createdAt"], now), 3)),
    }.get(dimension, (None, 0))
    why = BudgetExhaustedError(dimension, -1 if limit is None else limit, spent)
    why.message = f"held on its budget: {rec['error'] or 'no room left'}"
    why.args = (why.message,)
    return why


def new_decision_id() -> str:
    """A fresh decision id (``d_`` and 12 hex digits): known before the event is written,
    so a command can answer it at once."""
    return "d_" + secrets.token_hex(6)


def resolve_hold(
    state: State,
    rec: AgentRecord,
    answer: str,
    by: str | None,
    why: str | None,
    note: str | None = None,
) -> list[NewEvent]:
    """Resolve the decision the blocked agent waits on with ``answer`` (``retry``, ``stop``,
    ``budget``); nothing when it waits on none."""
    decision_id = rec.get("decision")
    found = state.decisions.get(decision_id) if decision_id else None
    if found is None or found["state"] != "pending":
        return []
    return [ev.resolved(found, answer, by, why, note=note)]


def hold(
    state: State,
    rec: AgentRecord,
    reason: str,
    error: str | None,
    *,
    dimension: str | None = None,
    ancestor: str | None = None,
) -> list[NewEvent]:
    """Hold the agent in blocked: state change, supervision needed (a decision opens), notice
    to the parent. ``ancestor``: the ancestor whose budget has no room."""
    events = ev.held(
        rec["id"],
        rec["state"],
        reason,
        error,
        decision=new_decision_id(),
        dimension=dimension,
        ancestor=ancestor,
    )
    if rec["parent"] is not None:
        events.append(_notices.to_parent(state, rec, "supervision", reason=reason, error=error))
    return events


def budget_hold(state: State, rec: AgentRecord, why: BudgetExhaustedError) -> list[NewEvent]:
    """Hold the agent because its budget, or an ancestor's, leaves no room for a turn."""
    ancestor = getattr(why, "ancestor", None)
    return hold(
        state, rec, BUDGET_EXHAUSTED, why.message, dimension=why.dimension, ancestor=ancestor
    )


def budget_changed(
    state: State,
    rec: AgentRecord,
    spec: AgentSpec,
    new: BudgetSpec,
    by: str | None,
    why: str | None,
    now: datetime,
    note: str | None = None,
    capped: Sequence[_tree_budget.Capped] = (),
) -> list[NewEvent]:
    """The agent's budget becomes ``new`` (``capped``: what the change asked beyond what
    its ancestors had left). An agent held ``budget-exhausted`` whose budget is raised so
    that it has room again is released: its decision is resolved (action ``budget``) and it
    waits, idle, for a prompt; so is each descendant held on this agent's budget
    (``ancestor``) that now has room. Otherwise its state stays as it is (a budget below
    what is spent only holds the agent at its next prompt)."""
    previous = _budget.in_force(rec, spec)
    events = [
        ev.budget_changed(
            rec["id"],
            new.model_dump(by_alias=True),
            previous.model_dump(by_alias=True),
            by,
            why,
            capped=[dict(c) for c in capped],
        )
    ]
    if not _budget.raises(new, previous):
        return events
    after = preview(state, events, now.isoformat())
    for held in _held_on(state, rec["id"]):
        found = after.get_agent(held["id"])
        assert found is not None
        own = _tree_budget.budget_of(found)
        if held["id"] == rec["id"]:
            own = _budget.in_force(found, spec).to_budget()
        if _tree_budget.exhausted(found, own, after.get_agent, now) is None:
            events += resolve_hold(state, held, "budget", by, why, note)
            events.append(ev.released(held["id"]))
    return events


def _held_on(state: State, agent_id: str) -> list[AgentRecord]:
    """The agent itself, if it is held on its budget, and each descendant held on
    ``agent_id``'s budget (its decision names it as the ``ancestor``)."""
    found = []
    for rec in state.agents.values():
        if rec["state"] != "blocked" or rec["reason"] != BUDGET_EXHAUSTED:
            continue
        decision = state.decisions.get(rec.get("decision") or "")
        if rec["id"] == agent_id or (decision is not None and decision.get("ancestor") == agent_id):
            found.append(rec)
    return found


def drop_pending(state: State, agent_id: str) -> list[NewEvent]:
    """Drop the notices waiting for an agent that has ended (it reads no more)."""
    pending = [n["id"] for n in _notices.pending(state, agent_id)]
    return [ev.notices_dropped(agent_id, pending)] if pending else []


def turn_succeeded(
    state: State,
    rec: AgentRecord,
    spec: AgentSpec,
    turn: int,
    output: str,
    usage: TurnUsage,
    *,
    messages: Sequence[Mapping[str, Any]] = (),
) -> list[NewEvent]:
    """The turn's output (and ``messages``, what its harness said in it) is kept, the agent
    goes idle, and its parent hears if it asked to."""
    return [
        ev.turn_completed(rec["id"], turn, output, usage, messages),
        ev.turn_done(rec["id"], rec["state"]),
        *_notices.on_turn(state, rec, spec, "done", output=output),
    ]


RETRIED_FROM_WAITING = {"from": "waiting", "to": "running", "reason": "retry"}


def turn_failed(
    state: State,
    rec: AgentRecord,
    spec: AgentSpec,
    turn: int,
    error: str,
    usage: Mapping[str, Any] | None,
    now: datetime,
    *,
    before: list[NewEvent],
    dimension: str | None = None,
    messages: Sequence[Mapping[str, Any]] = (),
) -> tuple[list[NewEvent], int | None]:
    """The failed turn and what the policy makes of it, after the events ``before``: the
    events to commit, and the number of the retry to start (None when there is none).

    A turn that stopped because budget ``dimension`` had no room holds the agent
    ``budget-exhausted``, whatever the policy: only a bigger budget can help it."""
    agent_id = rec["id"]
    failures = rec["consecutiveFailures"] + 1
    events = [*before, ev.turn_failed(agent_id, turn, error, failures, usage, messages)]
    # The policy and the budget judge the agent as the failed turn leaves it.
    after_tx = preview(state, events, now.isoformat())
    after = after_tx.get_agent(agent_id)
    assert after is not None
    if dimension is not None:
        return events + hold(state, after, BUDGET_EXHAUSTED, error, dimension=dimension), None
    decision = after_failure(after, spec, failures)
    if decision.action == "retry":
        why = exhausted(after, spec, now, after_tx.get_agent)
        if why is not None:
            return events + budget_hold(state, after, why), None
        assert rec["lastPrompt"] is not None
        retry = turn + 1
        text = _notices.resend_text(state, rec)
        if rec["state"] == "waiting":
            # The failed turn's approvals are withdrawn (``before``): the retry waits on none.
            events.append(NewEvent(ev.STATE_CHANGED, agent_id, dict(RETRIED_FROM_WAITING)))
        events.append(
            ev.turn_started(agent_id, retry, rec["lastPrompt"], retry=True, notices=[], text=text)
        )
        return events, retry
    if decision.action == "hold":
        assert decision.reason is not None
        return events + hold(state, after, decision.reason, error), None
    events.append(ev.failed(agent_id, error, was=rec["state"]))
    events += _notices.on_turn(state, after, spec, "failed", error=error)
    events += drop_pending(state, agent_id)
    return events, None
