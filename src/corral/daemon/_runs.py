"""Runs: the tree of agents a root agent starts, as ``GET /runs/{id}`` shows it, and the order
in which stopping a run ends its agents.

Pure functions over the projections. A run's agents share its ``runId``; its root is the one
without a parent.
"""

from __future__ import annotations

from typing import Any, TypedDict

from corral.daemon import _tree_budget
from corral.daemon._errors import RunNotFoundError
from corral.daemon._headcount import headcount
from corral.daemon._records import AgentRecord, Usage
from corral.daemon._state import LIVE_STATES, State


class RunNode(TypedDict):
    """One agent of the tree: ``depth`` 0 is the top of what is shown; ``usage`` its own
    turns', ``treeUsage`` its and its descendants', ``budget`` its limits in force (None:
    unlimited; ``treeUsage`` counts against them)."""

    id: str
    name: str
    parent: str | None
    depth: int
    state: str
    reason: str | None
    usage: Usage
    treeUsage: Usage
    budget: dict[str, Any]


def root_of(state: State, run_id: str) -> AgentRecord:
    """The run's root agent; :class:`RunNotFoundError` when no agent is in that run."""
    for rec in state.agents.values():
        if rec["runId"] == run_id and rec["parent"] is None:
            return rec
    raise RunNotFoundError(run_id)


def tree(state: State, top: AgentRecord) -> list[RunNode]:
    """``top`` and its descendants, depth first (each agent before its children, children in
    the order they were made): a flat list, so that no depth of tree is too deep to
    serve."""
    nodes: list[RunNode] = []
    stack: list[tuple[str, int]] = [(top["id"], 0)]
    seen: set[str] = set()
    while stack:
        agent_id, depth = stack.pop()
        rec = state.agents.get(agent_id)
        if rec is None or agent_id in seen:
            continue
        seen.add(agent_id)
        nodes.append(_node(rec, depth))
        stack.extend((child, depth + 1) for child in reversed(rec["children"]))
    return nodes


def view(state: State, run_id: str, top: AgentRecord | None = None) -> dict[str, Any]:
    """``GET /runs/{id}``: the run's id, its root, the headcount against its cap, and the
    tree from ``top`` down (the root's, unless told): ``agents`` (see :func:`tree`)."""
    root = root_of(state, run_id)
    shown = root if top is None else top
    return {
        "runId": run_id,
        "rootId": root["id"],
        "top": shown["id"],
        "headcount": headcount(state, run_id),
        "agents": tree(state, shown),
    }


def stop_order(state: State, top: AgentRecord) -> list[AgentRecord]:
    """The live agents of ``top``'s subtree, deepest first (children before their parents;
    at one depth, in tree order)."""
    nodes = tree(state, top)
    order = sorted(range(len(nodes)), key=lambda i: -nodes[i]["depth"])
    found = [state.agents[nodes[i]["id"]] for i in order]
    return [rec for rec in found if rec["state"] in LIVE_STATES]


def _node(rec: AgentRecord, depth: int) -> RunNode:
    return {
        "id": rec["id"],
        "name": rec["name"],
        "parent": rec["parent"],
        "depth": depth,
        "state": rec["state"],
        "reason": rec["reason"],
        # Copies: a caller in this process must not reach into the projections.
        "usage": Usage(**rec["usage"]),
        "treeUsage": Usage(**_tree_budget.tree_usage(rec)),
        "budget": dict(rec.get("budget") or rec["spec"].get("budget") or {}),
    }
