"""The console's live stream: one server-sent event per event of the daemon's log (its seq
and type only, nothing an agent wrote), which tells the page's script to fetch the parts of
the page that may have changed. Ends when the session does."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.requests import Request
from starlette.responses import Response

from corral.console._sessions import Session

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
    cookie = request.cookies
    from corral.console._app import cookie_name

    session_id = cookie.get(cookie_name(request))
    yield ServerSentEvent(data=json.dumps({"seq": after}), event="hello", id=str(after))
    api = console.scoped(session)
    async with aclosing(api.subscribe(after, None)) as stream:
        async for event in stream:
            if console.sessions.get(session_id) is None:
                return  # logged out, expired or revoked: the stream ends with the session
            yield ServerSentEvent(
                data=json.dumps({"seq": event.seq, "type": event.type, "agent": event.agent_id}),
                event="change",
                id=str(event.seq),
            )
