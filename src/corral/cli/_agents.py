"""Commands on agents: spawn, list, show, prompt, budget, an agent's inbox and its session
(stop, restart and rm: ``_lifecycle``)."""

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from corral.cli._calls import call, refusals
from corral.cli._options import (
    AgentArg,
    ByOpt,
    JsonAnswerOpt,
    JsonOpt,
    KeyOpt,
    WhyOpt,
    target,
)
from corral.cli._output import (
    cell,
    print_fitted,
    print_json,
    print_table,
    say,
    state,
    stdout,
    table,
)


def spawn(
    ctx: typer.Context,
    spec: Annotated[str, typer.Argument(help="The spec file (JSON), or - for stdin.")],
    key: KeyOpt = None,
    as_json: JsonOpt = False,
    node: Annotated[
        str | None,
        typer.Option(
            "--node",
            help="Several daemons on one store: the daemon the agent runs on (default: the "
            "least loaded; a child runs on its parent's).",
        ),
    ] = None,
) -> None:
    """Create an agent from a JSON spec."""
    with refusals():
        data = _load_spec(spec)
    agent = call(target(ctx), lambda api: api.spawn(data, idempotency_key=key, node=node))
    if as_json:
        print_json(agent)
        return
    stdout().print(
        f"{cell(agent['id'])}  {cell(agent.get('name', ''))}  {state(agent.get('state'))}"
    )


def agents(
    ctx: typer.Context,
    as_json: JsonOpt = False,
    state_: Annotated[str | None, typer.Option("--state", help="Only in this state.")] = None,
    run: Annotated[str | None, typer.Option(help="Only of this run.")] = None,
    parent: Annotated[str | None, typer.Option(help="Only this agent's children.")] = None,
    name: Annotated[str | None, typer.Option(help="Only of this name.")] = None,
) -> None:
    """Every agent (summaries, every page), as a table; `corral show ID` for one in full."""
    filters = {"state": state_, "run": run, "parent": parent, "name": name}
    found = call(target(ctx), lambda api: api.list_agents(**filters))
    if as_json:
        print_json(found)
        return
    print_table("agents", found, ["id", "name", "state", "reason", "turns", "parent"])


def show(ctx: typer.Context, agent_id: AgentArg, as_json: JsonOpt = False) -> None:
    """One agent's record."""
    agent = call(target(ctx), lambda api: api.get(agent_id))
    if as_json:
        print_json(agent)
        return
    shown = table("field", "value", show_header=False, title=f"agent {cell(agent.get('id'))}")
    for name, value in agent.items():
        if name == "spec":
            continue
        shown.add_row(cell(name), state(value) if name == "state" else cell(value))
    shown.add_row("spec", cell(agent.get("spec")))
    print_fitted(shown)


def prompt(
    ctx: typer.Context,
    agent_id: AgentArg,
    text: Annotated[
        str | None, typer.Argument(help="The prompt; without it the last one is re-sent.")
    ] = None,
    by: ByOpt = None,
    why: WhyOpt = None,
    key: KeyOpt = None,
    wait: Annotated[
        bool,
        typer.Option(
            "--wait",
            help="Wait for the turn to end and print its output; exit 0 when it succeeded, "
            "10 when it failed, 11 when it was interrupted.",
        ),
    ] = False,
    as_json: JsonAnswerOpt = False,
) -> None:
    """Start a turn of an idle or blocked agent (resolves a blocked agent's decision)."""
    if wait:
        from corral.cli._logs import prompt_and_wait

        prompt_and_wait(ctx, agent_id, text, by, why, key, as_json=as_json)
    answer = call(
        target(ctx),
        lambda api: api.prompt(agent_id, text, by=by, why=why, idempotency_key=key),
    )
    if as_json:
        print_json(answer)
        return
    say(f"{answer.get('id', agent_id)}: {answer.get('accepted', 'prompt')} accepted")


_DIMENSIONS = {
    "tokens": "maxTokens",
    "cost-usd": "maxCostUsd",
    "turns": "maxTurns",
    "deadline-s": "deadlineS",
}


def budget(
    ctx: typer.Context,
    agent_id: AgentArg,
    by: Annotated[str, typer.Option("--by", help="Who decides (recorded).")],
    why: Annotated[str, typer.Option("--why", help="Why (recorded).")],
    max_tokens: Annotated[int | None, typer.Option(min=0, help="Tokens in all.")] = None,
    max_cost_usd: Annotated[float | None, typer.Option(min=0, help="Dollars in all.")] = None,
    max_turns: Annotated[int | None, typer.Option(min=0, help="Turns in all.")] = None,
    deadline_s: Annotated[
        float | None, typer.Option(min=0, help="Seconds from the agent's creation.")
    ] = None,
    unlimited: Annotated[
        list[str] | None,
        typer.Option(help="Lift a limit: tokens, cost-usd, turns or deadline-s (repeatable)."),
    ] = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Change an agent's budget (releases an agent held on its budget; prompt it then)."""
    changes: dict[str, Any] = {
        name: value
        for name, value in (
            ("maxTokens", max_tokens),
            ("maxCostUsd", max_cost_usd),
            ("maxTurns", max_turns),
            ("deadlineS", deadline_s),
        )
        if value is not None
    }
    with refusals():
        for name in unlimited or []:
            if name not in _DIMENSIONS:
                from corral.kernel import InvalidArgumentError

                raise InvalidArgumentError(
                    "budget", "--unlimited", f"one of {', '.join(_DIMENSIONS)}", name
                )
            changes[_DIMENSIONS[name]] = None
    agent = call(
        target(ctx),
        lambda api: api.budget(agent_id, changes, by=by, why=why, idempotency_key=key),
    )
    if as_json:
        print_json(agent)
        return
    shown = ", ".join(f"{k}={'unlimited' if v is None else v}" for k, v in agent["budget"].items())
    stdout().print(
        f"{cell(agent.get('id', agent_id))}: budget {cell(shown)}  {state(agent.get('state'))}"
    )


def inbox(ctx: typer.Context, agent_id: AgentArg, as_json: JsonOpt = False) -> None:
    """The notices sent to an agent by its children."""
    notices = call(target(ctx), lambda api: api.inbox(agent_id))
    if as_json:
        print_json(notices)
        return
    shown = table("id", "from", "kind", "state", "detail", title=f"inbox of {cell(agent_id)}")
    for n in notices:
        detail = n.get("reason") or n.get("error") or n.get("output") or ""
        who = cell(f"{n.get('fromName', '')} ({n.get('from', '')})".strip())
        shown.add_row(
            cell(n.get("id")), who, cell(n.get("kind")), cell(n.get("state")), cell(detail)
        )
    print_fitted(shown)


SESSION_TEXT = 300  # characters of a message shown in the table (--json shows all)


def session(ctx: typer.Context, agent_id: AgentArg, as_json: JsonOpt = False) -> None:
    """An agent's session: the conversation of its turns, oldest first."""
    found = call(target(ctx), lambda api: api.session(agent_id))
    if as_json:
        print_json(found)
        return
    messages = found.get("messages") or []
    title = f"session of {cell(agent_id)} (history {cell(found.get('history'))})"
    shown = table("turn", "role", "content", "at", title=title)
    for m in messages:
        content = str(m.get("content") or "")
        for tool in m.get("toolCalls") or ():
            content += f" -> {tool.get('name')}({tool.get('arguments')})"
        if len(content) > SESSION_TEXT:
            content = content[:SESSION_TEXT] + f"... ({len(content)} characters)"
        role = str(m.get("role"))
        if m.get("name"):
            role += f" {m['name']}"
        shown.add_row(cell(m.get("turn")), cell(role), cell(content), cell(m.get("at")))
    print_fitted(shown)


def _load_spec(path: str) -> dict[str, Any]:
    """The JSON object in the file at ``path`` (``-``: stdin); InvalidSpecError otherwise."""
    from corral.daemon._errors import InvalidSpecError

    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidSpecError(
            [{"field": "(file)", "message": f"cannot read {path}: {exc.strerror or exc}"}]
        ) from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise InvalidSpecError(
            [{"field": "(file)", "message": f"{path} is not JSON: {exc}"}]
        ) from None
    if not isinstance(data, dict):
        raise InvalidSpecError([{"field": "(file)", "message": f"{path} must hold a JSON object"}])
    return data
