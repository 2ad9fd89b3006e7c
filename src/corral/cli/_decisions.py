"""Commands of oversight: what waits on a person, answering it, and an agent asking first."""

import asyncio
import json
import time
from typing import TYPE_CHECKING, Annotated, Any

import typer

from corral.cli._calls import call, fail, refusals
from corral.cli._options import ByOpt, JsonAnswerOpt, JsonOpt, KeyOpt, json_option, target
from corral.cli._output import print_json, print_table, say, stderr
from corral.kernel import InvalidArgumentError

if TYPE_CHECKING:
    from corral.daemon._client import HttpApi

DecisionArg = Annotated[str, typer.Argument(help="The decision's id, like d_1f2e3d4c5b6a.")]
WhyOpt = Annotated[str | None, typer.Option("--why", help="Why (recorded with your name).")]
_HINTS = {
    "approval": "approve with: corral approve ID --why TEXT, or corral deny ID --why TEXT",
    "blocked": "resolve with: corral decide ID retry [--text PROMPT] --why TEXT, "
    "or corral decide ID stop --why TEXT",
    "budget_exhausted": "held on a budget: corral decide ID budget --budget "
    "'{\"maxCostUsd\": 5}' --why TEXT (or corral budget AGENT ...)",
    "gateway_frozen": "frozen in a database: corral decide ID reinstate --why TEXT",
}
_ROUND_S = 30.0  # one request's wait; a longer wait is several requests
_RETRY_FIRST_S, _RETRY_MAX_S = 0.5, 5.0  # while the daemon cannot be reached


def decisions(
    ctx: typer.Context,
    resolved: Annotated[
        bool, typer.Option("--resolved", help="The answered ones instead, newest first.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Everything waiting on a person, oldest first (or, --resolved, every answer given)."""
    found = call(target(ctx), lambda api: api.decisions(resolved=resolved))
    if as_json:
        print_json(found)
        return
    if resolved:
        columns = ["id", "kind", "agentId", "answer", "by", "why", "at"]
        print_table("answered decisions", found, columns, headers={"agentId": "agent"})
        return
    for item in found:
        item["about"] = item.get("action") or item.get("error") or item.get("target") or ""
        item["accepts"] = " | ".join(item.get("answers", []))
    columns = ["id", "kind", "agentId", "name", "reason", "about", "since", "deadline", "accepts"]
    print_table("decisions", found, columns, headers={"agentId": "agent"})
    kinds = {d.get("kind") for d in found}
    for kind, hint in _HINTS.items():
        if kind in kinds:
            stderr().print(hint, markup=False, highlight=False)


def decide(
    ctx: typer.Context,
    decision: DecisionArg,
    answer: Annotated[
        str,
        typer.Argument(
            help="approve, deny (approval); retry, stop (blocked); budget, stop "
            "(budget_exhausted); reinstate (gateway_frozen)."
        ),
    ],
    why: WhyOpt = None,
    text: Annotated[
        str | None, typer.Option("--text", help="With retry: the prompt to re-send.")
    ] = None,
    budget: Annotated[
        str | None,
        typer.Option(
            "--budget", help='With budget: the new dimensions as JSON, {"maxCostUsd": 5}.'
        ),
    ] = None,
    by: ByOpt = None,
    key: KeyOpt = None,
    as_json: JsonAnswerOpt = False,
) -> None:
    """Answer a decision (recorded with your token's name, and --why)."""
    changes = None
    if budget is not None:
        with refusals():
            changes = _json_object(
                "decide", "--budget", budget, 'a JSON object like {"maxCostUsd": 5}'
            )
    _answer(
        ctx, decision, answer, why=why, text=text, budget=changes, by=by, key=key, as_json=as_json
    )


def approve(
    ctx: typer.Context,
    decision: DecisionArg,
    why: WhyOpt = None,
    key: KeyOpt = None,
    as_json: JsonAnswerOpt = False,
) -> None:
    """Approve an agent's action (``corral decide ID approve``)."""
    _answer(ctx, decision, "approve", why=why, key=key, as_json=as_json)


def deny(
    ctx: typer.Context,
    decision: DecisionArg,
    why: WhyOpt = None,
    key: KeyOpt = None,
    as_json: JsonAnswerOpt = False,
) -> None:
    """Deny an agent's action (``corral decide ID deny``)."""
    _answer(ctx, decision, "deny", why=why, key=key, as_json=as_json)


def _answer(
    ctx: typer.Context,
    decision: str,
    answer: str,
    *,
    why: str | None,
    text: str | None = None,
    budget: dict[str, Any] | None = None,
    by: str | None = None,
    key: str | None = None,
    as_json: bool = False,
) -> None:
    done = call(
        target(ctx),
        lambda api: api.answer(
            decision, answer, why=why, by=by, text=text, budget=budget, idempotency_key=key
        ),
    )
    if as_json:
        print_json(done)
        return
    say(f"{done.get('decision', decision)}: {done.get('answer', answer)} recorded")


def _json_object(where: str, option: str, raw: str, example: str) -> dict[str, Any]:
    """``raw`` as a JSON object, or ``InvalidArgumentError`` naming the option."""
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise InvalidArgumentError(where, option, example, raw)
    return value


def check(
    ctx: typer.Context,
    action: Annotated[
        str, typer.Argument(help='What the agent is about to do: "deploy web to prod".')
    ],
    wait: Annotated[
        float | None,
        typer.Option(
            "--wait",
            min=0,
            help="Seconds to wait for a person when a rule asks one (default: until answered).",
        ),
    ] = None,
    agent: Annotated[
        str | None,
        typer.Option(
            "--agent", envvar="CORRAL_AGENT_ID", help="The agent asking (default: this one)."
        ),
    ] = None,
    context: Annotated[
        str | None, typer.Option("--context", help="Details for the person, as a JSON object.")
    ] = None,
    as_json: Annotated[
        bool, json_option("Print the verdict as JSON on stdout (the exit status is the same).")
    ] = False,
) -> None:
    """Ask before acting: exit 0 when allowed; 1 when blocked, denied, timed out or still
    waiting after --wait (the reason on stderr). Inside an agent the daemon's URL, token
    and the agent's id come from its environment: ``corral check "deploy" || exit 3``."""
    if not agent:
        fail(InvalidArgumentError("check", "--agent", "an agent id (or CORRAL_AGENT_ID)", agent))
    details: dict[str, Any] | None = None
    if context is not None:
        with refusals():
            details = _json_object("check", "--context", context, "a JSON object")
    deadline = None if wait is None else time.monotonic() + wait
    verdict = call(
        target(ctx), lambda api: _check(api, agent, action, details, deadline), loop=True
    )
    if as_json:
        print_json(verdict)
        if verdict.get("verdict") != "allowed":
            raise typer.Exit(1)
        return
    for warning in verdict.get("warnings", []):
        say(f"warning ({warning.get('rule')}): {warning.get('reason')}", err=True)
    outcome = verdict.get("verdict")
    reason = verdict.get("reason") or ""
    if outcome == "allowed":
        say(f"allowed{': ' + reason if reason else ''}", err=True)
        return
    if outcome == "pending":
        say(f"still waiting on decision {verdict.get('decision')}: {reason}", err=True)
    else:
        say(f"blocked: {reason}", err=True)
    raise typer.Exit(1)


async def _check(
    api: "HttpApi",
    agent: str,
    action: str,
    context: dict[str, Any] | None,
    deadline: float | None,
) -> dict[str, Any]:
    """Ask, then wait for a person in rounds until the verdict or ``deadline``; a daemon
    that cannot be reached (restarting) is asked again (the decision survives it)."""
    from corral.daemon._client import DaemonUnreachableError

    def left() -> float:
        return (
            _ROUND_S if deadline is None else max(0.0, min(_ROUND_S, deadline - time.monotonic()))
        )

    verdict: dict[str, Any] | None = None
    delay = _RETRY_FIRST_S
    while True:
        try:
            if verdict is None:
                # Ask without waiting, so the decision's id is known before any wait: a
                # daemon that dies during the wait is then asked for that decision's verdict
                # when it is back, rather than asked afresh (a second approval for the
                # person, and its full timeout again).
                verdict = await api.check_action(agent, action, context, wait_s=0.0)
            else:
                verdict = await api.action_verdict(str(verdict["decision"]), wait_s=left())
            delay = _RETRY_FIRST_S
        except DaemonUnreachableError:
            if deadline is not None and time.monotonic() >= deadline:
                raise
            await asyncio.sleep(delay if deadline is None else min(delay, left() or delay))
            delay = min(delay * 2, _RETRY_MAX_S)
            continue
        if verdict.get("verdict") != "pending":
            return verdict
        if deadline is not None and time.monotonic() >= deadline:
            return verdict
