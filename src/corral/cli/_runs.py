"""Commands on runs: a run's tree (``corral run ID``) and stopping a whole run (``corral stop
--run ID``)."""

from typing import Annotated, Any

import typer

from corral.cli._calls import call
from corral.cli._options import JsonOpt, target
from corral.cli._output import cell, print_json, say, state, stdout

# The dimensions shown per node: (label, usage key, budget key).
_SHOWN = (
    ("tokens", "tokens", "maxTokens"),
    ("$", "costUsd", "maxCostUsd"),
    ("turns", "turns", "maxTurns"),
)


def run(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="The run's id (an agent's runId).")],
    as_json: JsonOpt = False,
) -> None:
    """A run as a tree: each agent's state, and what its subtree spent against its limits."""
    found = call(target(ctx), lambda api: api.run(run_id))
    if as_json:
        print_json(found)
        return
    # One line an agent, cut to the terminal's width (--json has it all).
    stdout().print(render(found), no_wrap=True, overflow="ellipsis", crop=True)


def render(found: dict[str, Any]) -> Any:
    """The run view (``GET /runs/{id}``) as a rich Tree: ``name (id) state  tokens 42/100 ...``
    per agent, under a title with the headcount."""
    from rich.tree import Tree

    count = found.get("headcount") or {}
    title = (
        f"run {cell(found.get('runId'))}  agents {cell(count.get('active'))}/"
        f"{cell(count.get('max'))} active"
    )
    if count.get("paused"):
        title += f", {cell(count.get('paused'))} paused"
    tree = Tree(title)
    # The nodes come depth first, each after its parent: a stack of the open branches.
    branches: list[Any] = [tree]
    for node in found.get("agents") or []:
        depth = node.get("depth", 0)
        if not isinstance(depth, int) or depth < 0:
            depth = 0
        del branches[depth + 1 :]
        branches.append(branches[-1].add(_label(node)))
    return tree


def _label(node: dict[str, Any]) -> str:
    used = node.get("treeUsage") or node.get("usage") or {}
    budget = node.get("budget") or {}
    parts = [f"{cell(node.get('name'))} ({cell(node.get('id'))})", state(node.get("state"))]
    for label, key, limit in _SHOWN:
        spent = used.get(key, 0)
        if key == "costUsd":
            spent = f"{spent:.4g}" if isinstance(spent, int | float) else spent
        cap = budget.get(limit)
        parts.append(f"{label} {cell(spent)}/{'-' if cap is None else cell(cap)}")
    if budget.get("deadlineS") is not None:
        parts.append(f"deadline {cell(budget['deadlineS'])} s")
    return "  ".join(parts)


def stop_run(
    ctx: typer.Context,
    run_id: str,
    by: str | None,
    why: str | None,
    key: str | None,
    *,
    as_json: bool = False,
) -> None:
    """``corral stop --run ID``: every live agent of the run, children first."""
    answer = call(
        target(ctx), lambda api: api.stop_run(run_id, by=by, why=why, idempotency_key=key)
    )
    if as_json:
        print_json(answer)
        return
    stopped = answer.get("stopped") or []
    say(f"run {answer.get('runId', run_id)}: stop accepted, {len(stopped)} agent(s) stopped")
    for agent_id in stopped:
        say(f"  {agent_id}")
