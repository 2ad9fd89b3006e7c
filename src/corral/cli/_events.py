"""Commands that watch the daemon: the event log."""

import asyncio
import json
from contextlib import suppress
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.text import Text

from corral.cli._calls import call, refusals
from corral.cli._options import target
from corral.cli._output import stdout, visible, write_line

if TYPE_CHECKING:
    from corral.daemon._client import HttpApi


def events(
    ctx: typer.Context,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep streaming new events.")
    ] = False,
    agent: Annotated[str | None, typer.Option(help="Only this agent's events.")] = None,
    after: Annotated[
        int | None, typer.Option(min=0, help="Only events with a greater seq.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object a line.")] = False,
) -> None:
    """The event log; with --follow, then live events (resumes across reconnects)."""
    conn = target(ctx)
    console = stdout()

    def emit(event: Any) -> None:
        if as_json:
            write_line(json.dumps(event.to_dict(), default=str))
            return
        # JSON's own escapes (ASCII only) keep the data's control characters visible.
        line = Text.assemble(
            f"{event.seq:>6}  ",
            (visible(event.ts), "dim"),
            "  ",
            (visible(event.type), "bold"),
            f"  {visible(event.agent_id or '-')}  ",
            json.dumps(event.data, separators=(",", ":"), default=str),
        )
        # One line an event; --json has every field in full.
        console.print(line, no_wrap=True, overflow="ellipsis", crop=True)

    if follow:
        from corral.daemon._client import follow_events

        async def stream() -> None:
            async for event in follow_events(
                conn.url, after, agent, token=conn.token, max_reconnects=None
            ):
                emit(event)

        with refusals(), suppress(KeyboardInterrupt):
            asyncio.run(stream())
        return

    async def page_all(api: "HttpApi") -> None:
        cursor = after or 0
        while True:
            page = await api.events(cursor, agent)
            for event in page:
                emit(event)
                cursor = event.seq
            if len(page) < 1000:
                return

    call(conn, page_all)
