"""Whether a new agent may be created (its parent, its harness), and the record it starts
with. Its run's headcount is ``_headcount``'s."""

from __future__ import annotations

from collections.abc import Container

from corral.daemon._budget import NOTHING_SPENT
from corral.daemon._errors import InvalidSpecError
from corral.daemon._records import AgentRecord
from corral.daemon._spec import AgentSpec
from corral.daemon._state import ENDED_STATES, State


def parent_of(state: State, spec: AgentSpec, harnesses: Container[str]) -> AgentRecord | None:
    """The new agent's parent; :class:`InvalidSpecError` if it cannot have children, or if the
    spec's harness is not one of ``harnesses``."""
    parent = state.agents.get(spec.parent) if spec.parent else None
    if spec.parent is not None:
        if parent is None:
            raise InvalidSpecError(
                [{"field": "parent", "message": f"no agent with id {spec.parent!r}"}]
            )
        if parent["state"] in ENDED_STATES:
            message = f"agent {spec.parent!r} has ended ({parent['state']})"
            raise InvalidSpecError([{"field": "parent", "message": message}])
    if spec.harness not in harnesses:
        raise InvalidSpecError(
            [{"field": "harness", "message": f"harness {spec.harness!r} is not available"}]
        )
    return parent


def new_record(
    agent_id: str,
    spec: AgentSpec,
    parent: AgentRecord | None,
    run_id: str,
    workdir: str,
    now: str,
    *,
    starts: bool,
) -> AgentRecord:
    """The record ``agent.created`` carries (the reducer then applies what follows);
    ``starts`` when its first turn starts with it."""
    return {
        "id": agent_id,
        "name": spec.name,
        "spec": spec.to_json(),
        "state": "running" if starts else "idle",
        "reason": "spawned",
        "error": None,
        "parent": spec.parent,
        "runId": run_id,
        "rootId": parent["rootId"] if parent else agent_id,
        "children": [],
        "turns": 0,
        "turnInFlight": None,
        "consecutiveFailures": 0,
        "retriesUsed": 0,
        "lastPrompt": None,
        "lastNotices": [],
        "lastOutput": None,
        "lastError": None,
        "usage": NOTHING_SPENT.copy(),
        "workdir": workdir,
        "createdAt": now,
        "updatedAt": now,
    }
