"""``corral patch``: change what may change of a live agent (``PATCH /agents/{id}``): its
budget, notifyOn and guardrails, recorded with who and why."""

import json
from typing import Annotated, Any, NoReturn

import typer

from corral.cli._calls import call, refusals
from corral.cli._options import AgentArg, ByOpt, JsonAnswerOpt, KeyOpt, target
from corral.cli._output import cell, print_json, state, stdout

PatchOpt = Annotated[
    str | None,
    typer.Option(
        "--patch",
        "-p",
        help='A JSON merge patch: {"budget": {"maxTurns": 5}, "notifyOn": [...], '
        '"guardrails": [...]}. Left out stays; notifyOn and guardrails are replaced whole.',
    ),
]
NotifyOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--notify-on",
        help="Replace notifyOn: done, failed or blocked (repeatable); none for no notices.",
    ),
]
RuleOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--add-rule",
        help='Append a guardrail rule (JSON, like {"match": "deploy", "verdict": "ask"}) to '
        "the agent's own rules (repeatable).",
    ),
]


def patch(
    ctx: typer.Context,
    agent_id: AgentArg,
    why: Annotated[str, typer.Option("--why", help="Why (recorded; required).")],
    patch_json: PatchOpt = None,
    notify_on: NotifyOpt = None,
    add_rule: RuleOpt = None,
    by: ByOpt = None,
    key: KeyOpt = None,
    as_json: JsonAnswerOpt = False,
) -> None:
    """Change a live agent: its budget, notifyOn or guardrails (kubectl patch's merge patch)."""
    with refusals():
        changes = _changes(patch_json, notify_on)
        rules = [_json("--add-rule", raw) for raw in add_rule or []]
        if rules and "guardrails" in changes:
            _refuse("--add-rule", "not with guardrails in --patch (give the whole list there)")
        if not changes and not rules:
            _refuse("--patch", "give --patch, --notify-on or --add-rule")

    async def work(api: Any) -> dict[str, Any]:
        target_id = agent_id
        if rules:
            found = await api.get(agent_id)
            # Its id (the argument may be a name): the agent read is the agent changed.
            target_id = found["id"]
            changes["guardrails"] = [*(found["spec"].get("guardrails") or []), *rules]
        answer: dict[str, Any] = await api.patch(
            target_id, changes, by=by, why=why, idempotency_key=key
        )
        return answer

    agent = call(target(ctx), work)
    if as_json:
        print_json(agent)
        return
    spec = agent.get("spec") or {}
    shown = [f"notifyOn={spec.get('notifyOn')}", f"guardrails={len(spec.get('guardrails') or [])}"]
    if "budget" in agent:
        shown.append(f"budget={agent['budget']}")
    stdout().print(
        f"{cell(agent.get('id', agent_id))}: {cell(', '.join(shown))}  {state(agent.get('state'))}"
    )


def _changes(patch_json: str | None, notify_on: list[str] | None) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    if patch_json is not None:
        found = _json("--patch", patch_json)
        if not isinstance(found, dict):
            _refuse("--patch", "a JSON object")
        changes.update(found)
    if notify_on is not None:
        if "notifyOn" in changes:
            _refuse("--notify-on", "not with notifyOn in --patch")
        changes["notifyOn"] = [] if notify_on == ["none"] else list(notify_on)
    return changes


def _json(option: str, raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError as exc:
        _refuse(option, f"JSON ({exc})")


def _refuse(option: str, expected: str) -> NoReturn:
    from corral.kernel import InvalidArgumentError

    raise InvalidArgumentError("patch", option, expected, None)
