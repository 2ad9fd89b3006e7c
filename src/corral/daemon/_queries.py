"""Read-only questions about the projections: who is in whose scope, what waits on a person."""

from __future__ import annotations

from typing import Any

from corral.daemon._policy import BUDGET_EXHAUSTED
from corral.daemon._records import AgentRecord
from corral.daemon._state import State


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


def _resolutions(rec: AgentRecord) -> dict[str, str]:
    """How a blocked agent's decision is resolved: an agent held on its budget needs a
    bigger one (a prompt is refused until then)."""
    agent = rec["id"]
    if rec["reason"] == BUDGET_EXHAUSTED:
        first = {"budget": f"PATCH /agents/{agent}"}
    else:
        first = {"prompt": f"POST /agents/{agent}/prompt"}
    return {**first, "stop": f"POST /agents/{agent}/stop"}


def blocked(state: State) -> list[dict[str, Any]]:
    """The decisions blocked agents wait for, oldest first, as the HTTP API shows them."""
    waiting = [
        {
            "kind": "agent_blocked",
            "agentId": rec["id"],
            "name": rec["name"],
            "reason": rec["reason"],
            "error": rec["error"],
            "since": rec["updatedAt"],
            "resolve": _resolutions(rec),
        }
        for rec in state.agents.values()
        if rec["state"] == "blocked"
    ]
    return sorted(waiting, key=lambda d: str(d["since"]))
