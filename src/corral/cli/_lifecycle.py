"""Commands on an agent's lifecycle: stop (gracefully, with its descendants), restart, rm."""

from typing import Annotated

import typer

from corral.cli import _runs
from corral.cli._calls import call, refusals
from corral.cli._options import AgentArg, ByOpt, JsonAnswerOpt, KeyOpt, WhyOpt, target
from corral.cli._output import print_json, say


def stop(
    ctx: typer.Context,
    agent_id: Annotated[
        str | None, typer.Argument(help="The agent's id, like a_1f2e3d4c (or give --run).")
    ] = None,
    run: Annotated[
        str | None,
        typer.Option("--run", help="Stop every agent of this run instead, children first."),
    ] = None,
    now: Annotated[
        bool, typer.Option("--now", help="Kill its turn at once (no SIGTERM, no grace).")
    ] = False,
    keep_children: Annotated[
        bool, typer.Option("--keep-children", help="Leave its descendants running.")
    ] = False,
    by: ByOpt = None,
    why: WhyOpt = None,
    key: KeyOpt = None,
    as_json: JsonAnswerOpt = False,
) -> None:
    """End an agent and its descendants, children first (a turn in flight gets SIGTERM,
    then SIGKILL after the spec's stopGraceS); or with --run every agent of a run."""
    if (agent_id is None) == (run is None):
        from corral.kernel import InvalidArgumentError

        with refusals():
            raise InvalidArgumentError(
                "stop", "agent", "an agent id or --run RUN, not both", agent_id
            )
    if run is not None:
        _runs.stop_run(ctx, run, by, why, key, as_json=as_json)
        return
    assert agent_id is not None
    answer = call(
        target(ctx),
        lambda api: api.stop(
            agent_id, by=by, why=why, idempotency_key=key, now=now, keep_children=keep_children
        ),
    )
    if as_json:
        print_json(answer)
        return
    stopped = answer.get("stopped") or [agent_id]
    if len(stopped) == 1:
        say(f"{answer.get('id', agent_id)}: stop accepted")
        return
    say(f"{answer.get('id', agent_id)}: stop accepted, {len(stopped)} agents, children first")
    for one in stopped:
        say(f"  {one}")


def restart(
    ctx: typer.Context,
    agent_id: AgentArg,
    by: ByOpt = None,
    why: WhyOpt = None,
    key: KeyOpt = None,
    as_json: JsonAnswerOpt = False,
) -> None:
    """Run a stopped or failed agent again: its spec, session and working directory; it
    re-sends its last prompt (its budget is not refilled: see `corral budget`)."""
    answer = call(
        target(ctx), lambda api: api.restart(agent_id, by=by, why=why, idempotency_key=key)
    )
    if as_json:
        print_json(answer)
        return
    turn = answer.get("turn")
    runs = f"runs turn {turn}" if turn is not None else "runs no turn (idle, or held)"
    say(f"{answer.get('id', agent_id)}: restart accepted, {runs}")


def rm(
    ctx: typer.Context,
    agent_id: AgentArg,
    by: ByOpt = None,
    why: WhyOpt = None,
    key: KeyOpt = None,
    as_json: JsonAnswerOpt = False,
) -> None:
    """Delete an ended agent and its descendants: working directories, sessions and stored
    data go; their events stay in the log."""
    answer = call(
        target(ctx), lambda api: api.delete(agent_id, by=by, why=why, idempotency_key=key)
    )
    if as_json:
        print_json(answer)
        return
    deleted = answer.get("deleted") or [agent_id]
    say(f"{answer.get('id', agent_id)}: deleted, {len(deleted)} agent(s)")
    if len(deleted) > 1:
        for one in deleted:
            say(f"  {one}")
