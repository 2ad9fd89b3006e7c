"""The console's live stream: one server-sent event per event of the daemon's log (its seq
and type only, nothing an agent wrote), which tells the page's script to fetch the parts of
the page that may have changed. Ends when the session does."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.requests import Request
from starlette.responses import Response

from corral.console._sessions import Session
from corral.daemon._events import Event

if TYPE_CHECKING:
    from corral.console._app import Console


def response(console: Console, request: Request, session: Session) -> Response:
    api = console.scoped(session)
    after = api.service.store.state.last_seq
    return EventSourceResponse(
        _changes(console, request, session, after),
        ping=console.heartbeat_s,
        ping_message_factory=lambda: ServerSentEvent(comment="heartbeat"),
    )


async def _changes(
    console: Console, request: Request, session: Session, after: int
) -> AsyncIterator[Any]:
    from corral.console._app import cookie_name

    session_id = request.cookies.get(cookie_name(request))
    yield ServerSentEvent(data=json.dumps({"seq": after}), event="hello", id=str(after))
    api = console.scoped(session)
    async with aclosing(api.subscribe(after, None)) as stream:
        # The session is checked at every event and, when none comes, every heartbeat: a
        # stream whose session ended (logout, expiry, a revoked token) ends with it.
        coming: asyncio.Future[Event] | None = None
        try:
            while True:
                if coming is None:
                    coming = asyncio.ensure_future(anext(stream))
                done, _ = await asyncio.wait({coming}, timeout=console.heartbeat_s)
                if console.sessions.get(session_id) is None:
                    return  # logged out, expired or revoked: the stream ends with the session
                if not done:
                    continue
                try:
                    event = coming.result()
                except StopAsyncIteration:
                    return
                coming = None
                yield ServerSentEvent(
                    data=json.dumps(
                        {"seq": event.seq, "type": event.type, "agent": event.agent_id}
                    ),
                    event="change",
                    id=str(event.seq),
                )
        finally:
            if coming is not None and not coming.done():
                coming.cancel()
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                    await coming
