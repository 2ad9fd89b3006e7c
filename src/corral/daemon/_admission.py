"""Whether a new agent may be created (its parent, its harness, its run's headcount), and the
record it starts with."""

from __future__ import annotations

from collections.abc import Callable, Container

from corral.daemon._budget import NOTHING_SPENT
from corral.daemon._errors import InvalidSpecError, SpawnRefusedError
from corral.daemon._records import AgentRecord
from corral.daemon._spec import AgentSpec
from corral.daemon._state import ENDED_STATES, LIVE_STATES, State

DEFAULT_MAX_AGENTS = 50  # a run's headcount when its root sets no spawn budget


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


def check_headcount(
    state: State, run_id: str, spec: AgentSpec, spec_of: Callable[[str], AgentSpec]
) -> None:
    """:class:`SpawnRefusedError` when run ``run_id`` has as many live agents as its root's
    spawn budget allows (``spec_of`` gives an agent's parsed spec)."""
    limit = DEFAULT_MAX_AGENTS
    if spec.parent is None:
        if spec.spawn_budget:
            limit = spec.spawn_budget.max_agents
    else:
        for rec in state.agents.values():
            if rec["runId"] == run_id and rec["parent"] is None:
                root = spec_of(rec["id"])
                limit = root.spawn_budget.max_agents if root.spawn_budget else DEFAULT_MAX_AGENTS
                break
    live = sum(
        1 for a in state.agents.values() if a["runId"] == run_id and a["state"] in LIVE_STATES
    )
    if live >= limit:
        raise SpawnRefusedError(run_id, limit, live)


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
