"""``corral gateway ...``: the databases a daemon fronts (started with ``--db``).

Each subcommand is a function decorated on the module's ``app``, listed in that order.
"""

import json
from typing import Annotated, Any

import typer

from corral.cli._calls import call, refusals
from corral.cli._options import JsonAnswerOpt, JsonOpt, target
from corral.cli._output import cell, print_fitted, print_json, print_table, say, table
from corral.kernel import InvalidArgumentError

app = typer.Typer(
    help="The database gateway of a daemon started with --db NAME=DSN: targets, queries, "
    "breakers, freezes and reinstatements.",
    no_args_is_help=True,
    add_completion=False,
)

AgentArg = Annotated[str, typer.Argument(help="The agent's id.")]
TargetOpt = Annotated[
    str | None,
    typer.Option("--target", "-t", help="The database's name (when there are several)."),
]


@app.command("targets")
def targets(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """The databases the daemon fronts."""
    found = call(target(ctx), lambda api: api.db_targets())
    if as_json:
        print_json(found)
        return
    print_table("databases", found, ["name", "dialect", "tables", "frozenAgents"])


@app.command("query")
def query(
    ctx: typer.Context,
    agent_id: AgentArg,
    request: Annotated[
        str,
        typer.Argument(help='SQL text, or a structured operation as JSON ({"op": ...}).'),
    ],
    param: Annotated[
        list[str] | None,
        typer.Option("--param", "-p", help="A parameter ($1, $2, ... in order), as JSON."),
    ] = None,
    key: Annotated[
        str | None, typer.Option("--key", help="Idempotency key (required on writes).")
    ] = None,
    plan_hash: Annotated[str | None, typer.Option("--plan-hash")] = None,
    target_name: TargetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Run one request through the gateway as AGENT_ID."""
    body: dict[str, Any]
    if request.lstrip().startswith("{"):
        with refusals():
            body = _load_json_object(request)
    else:
        body = {"sql": request}
    if param:
        body["params"] = [_param(p) for p in param]
    if key is not None:
        body["idempotency_key"] = key
    if plan_hash is not None:
        body["plan_hash"] = plan_hash
    answer = call(target(ctx), lambda api: api.db_query(agent_id, body, target_name))
    if as_json:
        print_json(answer)
        return
    columns = list(answer.get("columns") or [])
    if columns:
        print_table(f"{answer.get('target')}: {answer.get('status')}", answer["rows"], columns)
    notes = [f"{answer.get('rowCount')} row(s)"]
    if answer.get("status") == "replayed":
        notes.append("replayed: the stored result, nothing ran")
    if answer.get("emptiness"):
        notes.append(str(answer["emptiness"]))
    if answer.get("truncated"):
        notes.append("truncated at the row cap")
    say(", ".join(notes))
    for warning in answer.get("warnings") or []:
        say(f"warning: {warning}", err=True)


@app.command("status")
def status(
    ctx: typer.Context,
    agent_id: Annotated[
        str | None, typer.Argument(help="The agent's id; without it, every frozen agent.")
    ] = None,
    target_name: TargetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """An agent's breakers in a database, or every agent frozen anywhere."""
    if agent_id is None:
        waiting = call(target(ctx), lambda api: api.decisions())
        frozen = [
            d
            for d in waiting
            if d.get("kind") == "gateway_frozen"
            and (target_name is None or d.get("target") == target_name)
        ]
        if as_json:
            print_json(frozen)
            return
        print_table(
            "frozen agents",
            frozen,
            ["target", "agentId", "reason", "since"],
            headers={"agentId": "agent"},
        )
        return
    found = call(target(ctx), lambda api: api.db_status(agent_id, target_name))
    if as_json:
        print_json(found)
        return
    shown = table("signal", "count", "threshold", title=_status_title(found))
    thresholds = found.get("thresholds") or {}
    for name, count in (found.get("counts") or {}).items():
        shown.add_row(cell(name), cell(count), cell(thresholds.get(name)))
    print_fitted(shown)
    freeze = found.get("freeze")
    if freeze:
        say(f"frozen since {freeze.get('at')}: {freeze.get('reason')}")


@app.command("freeze")
def freeze(
    ctx: typer.Context,
    agent_id: AgentArg,
    reason: Annotated[str, typer.Option("--reason", help="Why (recorded).")],
    by: Annotated[str | None, typer.Option("--by", help="Who (recorded).")] = None,
    target_name: TargetOpt = None,
    as_json: JsonAnswerOpt = False,
) -> None:
    """Freeze an agent in a database: every request refused until reinstated."""
    done = call(target(ctx), lambda api: api.db_freeze(agent_id, reason, by, target_name))
    if as_json:
        print_json(done)
        return
    say(f"{agent_id} frozen in {done.get('target')}: {done.get('reason')}")


@app.command("reinstate")
def reinstate(
    ctx: typer.Context,
    agent_id: AgentArg,
    reason: Annotated[str, typer.Option("--reason", help="Why (recorded).")],
    by: Annotated[
        str | None,
        typer.Option("--by", help="A name kept as a note (the record names your token's owner)."),
    ] = None,
    target_name: TargetOpt = None,
    as_json: JsonAnswerOpt = False,
) -> None:
    """Lift an agent's freeze in a database (a person's decision, recorded)."""
    done = call(target(ctx), lambda api: api.db_reinstate(agent_id, by, reason, target_name))
    if as_json:
        print_json(done)
        return
    say(f"{agent_id} reinstated in {done.get('target')} by {done.get('by')}")


@app.command("history")
def history(
    ctx: typer.Context,
    agent_id: AgentArg,
    target_name: TargetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """An agent's freezes and reinstatements in a database, oldest first."""
    found = call(target(ctx), lambda api: api.db_history(agent_id, target_name))
    if as_json:
        print_json(found)
        return
    rows = [
        {**r, "why": r.get("reason"), "who": r.get("by"), "signal": r.get("signal")} for r in found
    ]
    print_table(f"history of {agent_id}", rows, ["at", "kind", "who", "why", "signal"])


def _status_title(found: dict[str, Any]) -> str:
    state = "[yellow]frozen[/yellow]" if found.get("frozen") else "[green]open[/green]"
    who, where = cell(found.get("agentId")), cell(found.get("target"))
    return f"{who} in {where}: {state} (window {cell(found.get('windowS'))} s)"


def _param(text: str) -> Any:
    """A --param value: JSON when it parses (7, true, null, "7", [1,2]), else the text
    (NaN and Infinity, which are not JSON, stay text)."""
    try:
        return json.loads(text, parse_constant=_not_json)
    except ValueError:
        return text


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _load_json_object(text: str) -> dict[str, Any]:
    """A ``gateway query`` request given as JSON: it must be an object."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise InvalidArgumentError("gateway query", "request", "valid JSON", str(exc)) from None
    if not isinstance(value, dict):
        raise InvalidArgumentError("gateway query", "request", "a JSON object", value)
    return value
