"""The routes of an agent's turns and logs: ``GET /agents/{id}/turns``, ``.../turns/{n}`` and
``.../logs`` (JSON, text, or SSE with ``follow=true``); see docs/daemon.md, "Turns and logs".

They are scoped as every agent route: an agent's token reaches itself and its descendants.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import Path, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from sse_starlette import EventSourceResponse, ServerSentEvent

from corral.daemon._api import ScopedService
from corral.daemon._errors import TurnNotFoundError
from corral.daemon._http._common import ApiRoute, api_of, errors
from corral.daemon._service import AgentService
from corral.daemon._state import ENDED_STATES
from corral.daemon._turn_log import lines_of

MAX_TURNS_PAGE = 200
MAX_LOG_TURNS = 20
MAX_TAIL = 100_000
MAX_TURN = 2**31 - 1
"""The highest turn number a route takes (the stores keep it as a 32-bit integer): a bigger
one is refused as bad input rather than failing in the store."""

Json = dict[str, Any]


def _agent(request: Request, agent_id: str) -> tuple[ScopedService, AgentService, str]:
    """The caller's view, the service and the agent's id (404 unknown, 403 out of reach)."""
    api = api_of(request)
    found = api.get(agent_id)
    return api, api.service, str(found["id"])


async def list_turns(
    agent_id: str,
    request: Request,
    before: Annotated[
        int | None, Query(ge=1, le=MAX_TURN, description="Only turns numbered below")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_TURNS_PAGE, description="Turns per page")] = 50,
) -> JSONResponse:
    _, service, agent_id = _agent(request, agent_id)
    turns = await service.turn_book.list(agent_id, before=before, limit=limit)
    after = turns[-1]["turn"] if len(turns) == limit and turns[-1]["turn"] > 1 else None
    return JSONResponse({"agentId": agent_id, "turns": turns, "nextBefore": after})


async def get_turn(
    agent_id: str,
    n: Annotated[int, Path(ge=1, le=MAX_TURN, description="The turn's number")],
    request: Request,
) -> JSONResponse:
    _, service, agent_id = _agent(request, agent_id)
    found = await service.turn_book.get(agent_id, n)
    if found is None:
        raise TurnNotFoundError(agent_id, n)
    return JSONResponse(found)


async def logs(
    agent_id: str,
    request: Request,
    turn: Annotated[
        int | None, Query(ge=1, le=MAX_TURN, description="Only this turn's log")
    ] = None,
    turns: Annotated[
        int, Query(ge=1, le=MAX_LOG_TURNS, description="Without turn: the last N turns' logs")
    ] = 1,
    tail: Annotated[
        int | None, Query(ge=0, le=MAX_TAIL, description="Only the last N lines")
    ] = None,
    follow: Annotated[bool, Query(description="SSE: then stream new lines as they come")] = False,
    fmt: Annotated[Literal["json", "text"], Query(alias="format")] = "json",
) -> Response:
    _, service, agent_id = _agent(request, agent_id)
    book = service.turn_book
    if follow:
        # Registered before anything is read: no line is missed between the backlog and
        # the live ones (the backlog of a running turn is taken in the same step).
        follower = book.fanout.follow(agent_id)
        live = book.live(agent_id)
        backlog: list[Json]
        if live is not None and (turn is None or live[0]["turn"] == turn):
            backlog = lines_of(live[1].snapshot(), live[0]["turn"])
            following: int | None = live[0]["turn"]
        else:
            try:
                backlog = await _backlog(service, agent_id, turn, turns)
            except BaseException:
                book.fanout.unfollow(follower)
                raise
            following = None
        rec = service.store.state.agents.get(agent_id)  # gone: deleted while reading
        ended = rec is None or rec["state"] in ENDED_STATES
        if turn is not None and following is None:
            ended = True  # that turn is over: its log, then the end
        if tail is not None:
            backlog = backlog[-tail:] if tail else []
        return EventSourceResponse(
            _stream(service, follower, backlog, turn, ended),
            ping=request.app.state.heartbeat_s,
            ping_message_factory=lambda: ServerSentEvent(comment="heartbeat"),
        )
    lines = await _backlog(service, agent_id, turn, turns)
    if tail is not None:
        lines = lines[-tail:] if tail else []
    if fmt == "text":
        return PlainTextResponse("".join(f"{line['text']}\n" for line in lines))
    return JSONResponse({"agentId": agent_id, "lines": lines})


async def _backlog(
    service: AgentService, agent_id: str, turn: int | None, count: int
) -> list[Json]:
    """The lines of turn ``turn`` (404 when there is none), or of the last ``count`` turns."""
    book = service.turn_book
    if turn is not None:
        found = await book.get(agent_id, turn)
        if found is None:
            raise TurnNotFoundError(agent_id, turn)
        return lines_of(found["logs"], turn)
    lines: list[Json] = []
    for record in reversed(await book.list(agent_id, limit=count)):
        found = await book.get(agent_id, record["turn"])
        if found is not None:
            lines += lines_of(found["logs"], record["turn"])
    return lines


async def _stream(
    service: AgentService, follower: Any, backlog: list[Json], turn: int | None, ended: bool
) -> AsyncIterator[ServerSentEvent]:
    fanout = service.turn_book.fanout
    source = fanout.lines(follower)
    try:
        for line in backlog:
            yield _log_event(line)
        if ended:
            return
        async for item in source:
            if turn is not None and item.get("turn") not in (None, turn):
                continue
            if "event" in item:
                yield ServerSentEvent(data=_dumps(item), event="turn")
                if turn is not None and item["event"] == "ended":
                    return
                continue
            # A line arrives whole (text ending in a newline), or as several lines merged.
            for line in lines_of([item], item.get("turn")):
                if "lagged" in item:
                    line["lagged"] = item["lagged"]
                yield _log_event(line)
    finally:
        await source.aclose()
        fanout.unfollow(follower)


def _log_event(line: Json) -> ServerSentEvent:
    return ServerSentEvent(data=_dumps(line), event="log")


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


_ERRORS = errors(401, 403, 404)

ROUTES = [
    ApiRoute(
        "GET",
        "/agents/{agent_id}/turns",
        list_turns,
        "An agent's turns, newest first, without their output and logs (follow nextBefore)",
        responses=_ERRORS,
    ),
    ApiRoute(
        "GET",
        "/agents/{agent_id}/turns/{n}",
        get_turn,
        "One turn with its output and log (a running turn's log so far)",
        responses=_ERRORS,
    ),
    ApiRoute(
        "GET",
        "/agents/{agent_id}/logs",
        logs,
        "An agent's logs: the last turns' lines as JSON or text, or SSE with follow=true",
        responses={
            **_ERRORS,
            200: {
                "description": "JSON `{agentId, lines}`, text, or SSE: `event: log` with a "
                "line `{turn, stream, text}`, `event: turn` when a turn starts or ends",
                "content": {
                    "application/json": {},
                    "text/plain": {},
                    "text/event-stream": {},
                },
            },
        },
    ),
]
