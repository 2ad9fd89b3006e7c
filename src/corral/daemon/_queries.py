"""Read-only questions about the projections: who is in whose scope, what waits on a person."""

from __future__ import annotations

from typing import Any

from corral.daemon._records import DecisionRecord
from corral.daemon._state import ANSWERS, State


def in_scope(state: State, principal: str, agent_id: str) -> bool:
    """Whether ``agent_id`` is ``principal`` or one of its descendants (an unknown id is in
    no one's scope)."""
    current: str | None = agent_id
    seen: set[str] = set()
    while current is not None and current not in seen:
        rec = state.agents.get(current)
        if rec is None:
            return False
        if current == principal:
            return True
        seen.add(current)
        current = rec["parent"]
    return False


def answers_of(decision: DecisionRecord) -> list[str]:
    """The answers a pending decision takes (none once it is answered)."""
    if decision["state"] != "pending":
        return []
    return list(ANSWERS.get(decision["kind"], []))


def decisions(state: State, *, resolved: bool = False) -> list[dict[str, Any]]:
    """The pending decisions, oldest first; with ``resolved``, the answered ones, newest
    answer first. Each as the HTTP API shows it."""
    if resolved:
        done = [dict(d) for d in state.decisions.values() if d["state"] == "resolved"]
        return sorted(done, key=lambda d: str(d.get("at")), reverse=True)
    waiting = [dict(d) for d in state.decisions.values() if d["state"] == "pending"]
    return sorted(waiting, key=lambda d: str(d["since"]))
