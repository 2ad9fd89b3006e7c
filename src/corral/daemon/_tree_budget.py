"""Budgets across the tree: a child's budget is bounded by what is left of its ancestors',
and every turn's usage counts against the agent and each of its ancestors.

Each record keeps ``treeUsage``, what its turns and all its descendants' have spent (the
reducer in ``_state`` counts a turn into the agent and each ancestor). A node's room is its
budget in force less its ``treeUsage`` (and, for the deadline, less its age); an agent's room
for a turn is the tightest of its own and each ancestor's. Pure functions over records: an
ancestor is found with ``lookup`` (``state.agents.get``, or a preview's ``get_agent``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, TypedDict

from corral.daemon import _budget
from corral.daemon._errors import AncestorBudgetExhaustedError
from corral.daemon._records import AgentRecord, Usage
from corral.daemon._spec import BudgetSpec
from corral.kernel import BudgetExhaustedError, ExecutionBudget

Lookup = Callable[[str], AgentRecord | None]

# The budget's JSON names (what ``budgetCapped`` says) and the ExecutionBudget fields.
DIMENSIONS = (
    ("maxTokens", "max_tokens"),
    ("maxCostUsd", "max_cost_usd"),
    ("maxTurns", "max_turns"),
    ("deadlineS", "deadline_s"),
)


class Capped(TypedDict):
    """One dimension of a budget set (at spawn, or by a change) that asked for more than the
    agent's ancestors had left: ``asked`` (None: unlimited) and what it was ``granted``."""

    dimension: str
    asked: float | None
    granted: float


def tree_usage(rec: AgentRecord) -> Usage:
    """What the agent and its descendants have spent (a record from before trees counted
    has only its own)."""
    return rec.get("treeUsage") or rec["usage"]


def budget_of(rec: AgentRecord) -> ExecutionBudget:
    """The budget in force on a record: the last change's, else its spec's (read from the
    record's JSON, which the service wrote)."""
    data: Mapping[str, Any] = rec.get("budget") or rec["spec"].get("budget") or {}
    return ExecutionBudget(
        max_tokens=data.get("maxTokens"),
        max_cost_usd=data.get("maxCostUsd"),
        max_turns=data.get("maxTurns"),
        deadline_s=data.get("deadlineS"),
    )


def ancestors(rec: AgentRecord, lookup: Lookup) -> list[AgentRecord]:
    """The agent's parent, its parent's parent, ..., the root (a cycle or a missing record
    ends the walk: neither can happen in a log the service wrote)."""
    found: list[AgentRecord] = []
    seen = {rec["id"]}
    parent = rec["parent"]
    while parent is not None and parent not in seen:
        above = lookup(parent)
        if above is None:
            break
        found.append(above)
        seen.add(parent)
        parent = above["parent"]
    return found


def exhausted(
    rec: AgentRecord, own: ExecutionBudget, lookup: Lookup, now: datetime
) -> BudgetExhaustedError | None:
    """Why the agent has no room for another turn at ``now``: its own budget ``own``
    against what its subtree spent, then each ancestor's against what the ancestor's subtree
    spent (:class:`AncestorBudgetExhaustedError`, naming it); None when all have room."""
    why = _budget.exhausted(own, tree_usage(rec), _budget.age_s(rec["createdAt"], now))
    if why is not None:
        return why
    for above in ancestors(rec, lookup):
        age = _budget.age_s(above["createdAt"], now)
        why = _budget.exhausted(budget_of(above), tree_usage(above), age)
        if why is not None:
            return AncestorBudgetExhaustedError(above["id"], above["name"], why)
    return None


def remaining(
    rec: AgentRecord, own: ExecutionBudget, lookup: Lookup, now: datetime
) -> ExecutionBudget:
    """What is left for the agent's next turn: in each dimension the least of what its own
    budget and each ancestor's leave (turns are counted by the service, not the harness)."""
    left = _budget.remaining(own, tree_usage(rec), _budget.age_s(rec["createdAt"], now))
    for above in ancestors(rec, lookup):
        age = _budget.age_s(above["createdAt"], now)
        left = _tightest(left, _budget.remaining(budget_of(above), tree_usage(above), age))
    return left


def room(parent: AgentRecord, lookup: Lookup, now: datetime) -> ExecutionBudget:
    """What ``parent``'s subtree may still spend, in every dimension (turns too): the least
    of what ``parent``'s budget and each of its ancestors' leave."""
    left = _left(parent, now)
    for above in ancestors(parent, lookup):
        left = _tightest(left, _left(above, now))
    return left


def cap(
    asked: BudgetSpec,
    spent: Usage,
    age: float,
    room_left: ExecutionBudget,
    current: BudgetSpec | None = None,
) -> tuple[BudgetSpec, list[Capped]]:
    """``asked`` bounded by ``room_left`` (what the ancestors leave) for an agent that has
    spent ``spent`` and is ``age`` seconds old: each dimension is at most what it spent plus
    the room (the deadline: its age plus the room). The budget granted, and the dimensions
    capped (a spec asking unlimited under a limited ancestor is capped too).

    With ``current`` (the budget in force, for a change), only the dimensions ``asked``
    raises are capped, never below ``current``: a change capped by the ancestors' room
    does not lower what the agent had."""
    used = {
        "max_tokens": spent["tokens"],
        "max_cost_usd": spent["costUsd"],
        "max_turns": spent["turns"],
        "deadline_s": age,
    }
    granted: dict[str, Any] = {}
    capped: list[Capped] = []
    for name, field in DIMENSIONS:
        wanted = getattr(asked, field)
        left = getattr(room_left, field)
        before = None if current is None else getattr(current, field)
        raised = current is None or (before is not None and (wanted is None or wanted > before))
        if left is None or not raised:
            granted[name] = wanted
            continue
        # Counts stay whole numbers; dollars and seconds drop float noise past a nanounit.
        whole = field in ("max_tokens", "max_turns")
        bound = int(used[field] + left) if whole else round(float(used[field] + left), 9)
        if before is not None:
            bound = max(bound, before)
        if wanted is None or wanted > bound:
            granted[name] = bound
            capped.append({"dimension": name, "asked": wanted, "granted": bound})
        else:
            granted[name] = wanted
    return BudgetSpec.model_validate(granted), capped


def at_spawn(
    asked: BudgetSpec, parent: AgentRecord | None, lookup: Lookup, now: datetime
) -> tuple[BudgetSpec, list[Capped]]:
    """The budget a new agent is created with: what its spec asks, bounded by what its
    parent and their ancestors have left (a root gets what it asks)."""
    if parent is None:
        return asked, []
    return cap(asked, _budget.NOTHING_SPENT, 0.0, room(parent, lookup, now))


def on_change(
    rec: AgentRecord, current: BudgetSpec, new: BudgetSpec, lookup: Lookup, now: datetime
) -> tuple[BudgetSpec, list[Capped]]:
    """A budget change (``PATCH /agents/{id}``) from ``current`` to ``new`` bounded as a
    spawn is: what it raises is at most what the agent's subtree spent plus what its
    ancestors have left (never less than ``current``)."""
    parent = lookup(rec["parent"]) if rec["parent"] is not None else None
    if parent is None:
        return new, []
    age = _budget.age_s(rec["createdAt"], now)
    return cap(new, tree_usage(rec), age, room(parent, lookup, now), current)


def _left(rec: AgentRecord, now: datetime) -> ExecutionBudget:
    """What ``rec``'s budget leaves of every dimension against what its subtree spent."""
    budget, used = budget_of(rec), tree_usage(rec)
    left = _budget.remaining(budget, used, _budget.age_s(rec["createdAt"], now))
    turns = None if budget.max_turns is None else max(0, budget.max_turns - used["turns"])
    return ExecutionBudget(
        max_tokens=left.max_tokens,
        max_cost_usd=left.max_cost_usd,
        max_turns=turns,
        deadline_s=left.deadline_s,
    )


def _tightest(a: ExecutionBudget, b: ExecutionBudget) -> ExecutionBudget:
    def least(x: Any, y: Any) -> Any:
        return y if x is None else x if y is None else min(x, y)

    return ExecutionBudget(
        max_tokens=least(a.max_tokens, b.max_tokens),
        max_cost_usd=least(a.max_cost_usd, b.max_cost_usd),
        max_turns=least(a.max_turns, b.max_turns),
        deadline_s=least(a.deadline_s, b.deadline_s),
    )
