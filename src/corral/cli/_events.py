"""Commands that watch the daemon: the event log."""

import asyncio
import json
from collections import deque
from contextlib import suppress
from typing import TYPE_CHECKING, Annotated, Any

import typer

from corral.cli._calls import call, refusals
from corral.cli._options import json_option, target
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
    as_json: Annotated[bool, json_option("One JSON object a line.")] = False,
    types: Annotated[
        list[str] | None,
        typer.Option("--type", "-t", help="Only events of this type (repeat it, or a, b)."),
    ] = None,
    run: Annotated[str | None, typer.Option(help="Only events of this run's agents.")] = None,
    tail: Annotated[
        int | None, typer.Option(min=1, help="Only the last N (matching) events.")
    ] = None,
) -> None:
    """The event log; with --follow, then live events (resumes across reconnects)."""
    conn = target(ctx)
    console = None if as_json else stdout()  # rich, for a person only

    def emit(event: Any) -> None:
        if as_json:
            write_line(json.dumps(event.to_dict(), default=str))
            return
        from rich.text import Text

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
        assert console is not None
        console.print(line, no_wrap=True, overflow="ellipsis", crop=True)

    wanted = {t.strip() for value in types or () for t in value.split(",")}
    if follow:
        from corral.daemon._client import follow_events

        async def stream() -> None:
            async for event in follow_events(
                conn.url, after, agent, token=conn.token, max_reconnects=None
            ):
                # --follow filters --type here (the stream itself is not filtered).
                if not wanted or event.type in wanted:
                    emit(event)

        with refusals(), suppress(KeyboardInterrupt):
            asyncio.run(stream())
        return

    async def page_all(api: "HttpApi") -> None:
        cursor = after or 0
        last: deque[Any] = deque(maxlen=tail)  # --tail: only the last N are printed
        while True:
            page, scanned = await api.events_page(cursor, agent, types=types or (), run=run)
            for event in page:
                if tail is None:
                    emit(event)
                else:
                    last.append(event)
            if scanned <= cursor:
                break
            cursor = scanned
        for event in last:
            emit(event)

    call(conn, page_all)
