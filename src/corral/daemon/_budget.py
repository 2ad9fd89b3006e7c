"""An agent's budget: whether it leaves room for another turn, and what is left of it.

Pure functions over the budget, what the agent's turns have spent (its ``usage``) and its age.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import pydantic

from corral.daemon._errors import InvalidSpecError
from corral.daemon._records import AgentRecord, Usage
from corral.daemon._spec import AgentSpec, BudgetSpec, problems_of
from corral.kernel import BudgetExhaustedError, ExecutionBudget
from corral.runtime import ExecutionTracker

_FIELDS = frozenset(BudgetSpec.model_json_schema(by_alias=True)["properties"])

# What a new agent has spent (read-only).
NOTHING_SPENT: Usage = {"tokens": 0, "costUsd": 0.0, "turns": 0, "unpricedTurns": 0}


def age_s(created_at: str, now: datetime) -> float:
    """Seconds since the agent was created (ISO-8601 ``createdAt``), across restarts."""
    return (now - datetime.fromisoformat(created_at)).total_seconds()


def exhausted(budget: ExecutionBudget, used: Usage, age: float) -> BudgetExhaustedError | None:
    """Why ``budget`` leaves no room for another turn of an agent that spent ``used`` and is
    ``age`` seconds old, or None if it does.

    A dollar limit cannot vouch for turns whose cost is unknown (``unpricedTurns``): they
    exhaust it rather than be guessed at.
    """
    if budget.unlimited:
        return None
    # The age comes from the agent's creation, which a fresh tracker's monotonic start cannot
    # know: the tracker gets the budget without its deadline, and the age is checked below.
    tracker = ExecutionTracker(dataclasses.replace(budget, deadline_s=None))
    try:
        tracker.record(tokens=used["tokens"], cost_usd=float(used["costUsd"]), turns=used["turns"])
        tracker.check()
    except BudgetExhaustedError as exc:
        return exc
    unpriced = used.get("unpricedTurns", 0)
    if budget.max_cost_usd is not None and unpriced:
        unknown = BudgetExhaustedError("cost_usd", budget.max_cost_usd, used["costUsd"])
        unknown.message = (
            f"cost_usd budget of {budget.max_cost_usd:g} cannot be enforced: the cost of "
            f"{unpriced} turn(s) is unknown (give the model's price)"
        )
        unknown.args = (unknown.message,)
        return unknown
    if budget.deadline_s is not None and age >= budget.deadline_s:
        return BudgetExhaustedError("deadline_s", budget.deadline_s, round(age, 3))
    return None


def remaining(budget: ExecutionBudget, used: Usage, age: float) -> ExecutionBudget:
    """What is left of ``budget`` for the next turn (None dimensions stay unlimited; turns are
    counted by the service, not by the harness)."""
    return ExecutionBudget(
        max_tokens=None
        if budget.max_tokens is None
        else max(0, budget.max_tokens - used["tokens"]),
        max_cost_usd=None
        if budget.max_cost_usd is None
        else max(0.0, budget.max_cost_usd - used["costUsd"]),
        max_turns=None,
        deadline_s=None if budget.deadline_s is None else max(0.0, budget.deadline_s - age),
    )


def in_force(rec: AgentRecord, spec: AgentSpec) -> BudgetSpec:
    """The agent's budget now: the last one set by a change (``PATCH /agents/{id}``), else
    the spec's."""
    changed = rec.get("budget")
    return spec.budget if changed is None else BudgetSpec.model_validate(changed)


def changed(current: BudgetSpec, changes: Mapping[str, Any]) -> BudgetSpec:
    """``current`` with ``changes`` (camelCase keys; a None value is unlimited) applied;
    ``InvalidSpecError`` lists every problem, and refuses a change of nothing."""
    if not isinstance(changes, Mapping) or not changes:
        names = ", ".join(BudgetSpec.model_json_schema(by_alias=True)["properties"])
        raise InvalidSpecError(
            [{"field": "budget", "message": f"must change at least one of {names}"}],
            "budget change",
        )
    problems = [
        {"field": f"budget.{k}", "message": "unknown field"} for k in changes if k not in _FIELDS
    ]
    known = {k: value for k, value in changes.items() if k in _FIELDS}
    try:
        new = BudgetSpec.model_validate({**current.model_dump(by_alias=True), **known})
    except pydantic.ValidationError as exc:
        problems += [{**p, "field": f"budget.{p['field']}"} for p in problems_of(exc)]
    if problems:
        raise InvalidSpecError(problems, "budget change")
    return new


def raises(new: BudgetSpec, old: BudgetSpec) -> bool:
    """Whether ``new`` gives more room than ``old`` in any dimension."""
    for name in BudgetSpec.model_fields:
        before, after = getattr(old, name), getattr(new, name)
        if before is not None and (after is None or after > before):
            return True
    return False
