"""Commands on an agent's turns and logs: ``corral logs`` and ``corral prompt --wait``.

What an agent printed is untrusted: each line is printed with its control characters shown
as escapes (``_output.visible``), so it cannot move the cursor or forge a line.

``corral prompt ID TEXT --wait`` exits with the turn's outcome: :data:`EXIT_CODES`.
"""

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import suppress
from typing import TYPE_CHECKING, Annotated, Any

import typer

from corral.cli._calls import Target, call, refusals
from corral.cli._options import AgentArg, json_option, target
from corral.cli._output import print_json, say, visible, write_line

if TYPE_CHECKING:
    pass

EXIT_CODES = {"succeeded": 0, "failed": 10, "interrupted": 11}
"""``prompt --wait``: 0 the turn succeeded, 10 it failed, 11 it was interrupted (the agent
stopped, its stalled turn restarted, the daemon restarted). Refusals keep their codes (2 for
bad input or a 4xx answer, 1 otherwise)."""


def logs(
    ctx: typer.Context,
    agent_id: AgentArg,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Then stream new lines as the agent prints.")
    ] = False,
    turn: Annotated[int | None, typer.Option(min=1, help="Only this turn's log.")] = None,
    tail: Annotated[int | None, typer.Option(min=0, help="Only the last N lines.")] = None,
    turns: Annotated[
        int, typer.Option(min=1, max=20, help="Without --turn: the last N turns' logs.")
    ] = 1,
    as_json: Annotated[bool, json_option("One JSON object a line.")] = False,
) -> None:
    """An agent's output and logs, turn by turn; with --follow, live as it prints."""
    conn = target(ctx)
    params: dict[str, Any] = {"turns": turns}
    if turn is not None:
        params["turn"] = turn
    if tail is not None:
        params["tail"] = tail

    def emit(line: dict[str, Any]) -> None:
        if as_json:
            write_line(json.dumps(line, separators=(",", ":")))
        elif line.get("stream") == "stderr":
            say(str(line.get("text", "")), err=True)
        else:
            write_line(visible(str(line.get("text", ""))))

    if follow:

        async def stream() -> None:
            async for kind, item in _follow(conn, agent_id, params):
                if kind == "log":
                    emit(item)
                elif as_json:
                    write_line(json.dumps({"event": "turn", **item}, separators=(",", ":")))
                elif item.get("event") == "ended":
                    say(f"-- turn {item.get('turn')} {item.get('outcome')}", err=True)
                else:
                    say(f"-- turn {item.get('turn')} started", err=True)

        with refusals(), suppress(KeyboardInterrupt):
            asyncio.run(stream())
        return

    async def fetch(api: Any) -> Any:
        return await api.logs(agent_id, **params)

    answer = call(conn, fetch)
    for line in answer.get("lines", []) if isinstance(answer, dict) else []:
        emit(line)


def prompt_and_wait(
    ctx: typer.Context,
    agent_id: str,
    text: str | None,
    by: str | None,
    why: str | None,
    key: str | None,
    *,
    as_json: bool = False,
) -> None:
    """``corral prompt --wait``: prompt, wait for the turn to end, print its output (or error;
    with ``as_json`` its whole record) and exit with :data:`EXIT_CODES`."""
    conn = target(ctx)

    async def run(api: Any) -> dict[str, Any]:
        answer = await api.prompt(agent_id, text, by=by, why=why, idempotency_key=key)
        real_id = str(answer["id"])
        number = answer.get("turn")
        if not isinstance(number, int):
            # A replayed answer of a daemon from before answers carried the turn: its latest.
            number = int((await api.get(real_id)).get("turns") or 1)
        while True:
            # The stream of that turn ends when it does (at once when it is over already).
            async for _ in _follow(conn, real_id, {"turn": number, "tail": 0}):
                pass
            record: dict[str, Any] = await api.turn(real_id, number)
            if record.get("outcome") not in (None, "running"):
                return record

    record = call(conn, run, loop=True)  # follows the turn's stream
    outcome = str(record.get("outcome"))
    if as_json:
        print_json(record)
    elif outcome == "succeeded":
        for line in str(record.get("output") or "").splitlines():
            write_line(visible(line))  # each line escaped: the newlines stay newlines
    else:
        say(f"turn {record.get('turn')} {outcome}: {record.get('error') or ''}", err=True)
    raise typer.Exit(EXIT_CODES.get(outcome, 1))


async def _follow(
    conn: Target, agent_id: str, params: dict[str, Any]
) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """The SSE stream of ``GET /agents/{id}/logs?follow=true``: ``("log", line)`` and
    ``("turn", {turn, event, outcome})`` until the daemon ends it."""
    from corral.daemon._client import path_segment, read_stream

    path = f"/agents/{path_segment(agent_id)}/logs"
    async for kind, item in read_stream(
        conn.url, path, token=conn.token, params={**params, "follow": "true"}
    ):
        yield kind, item
