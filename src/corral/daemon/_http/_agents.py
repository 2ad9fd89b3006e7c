"""The agent service's routes: agents, their commands, decisions, the event log, liveness."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Annotated, Any, Literal

from fastapi import Header, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import Field
from sse_starlette import EventSourceResponse, ServerSentEvent

from corral.daemon import _listing
from corral.daemon._api import ScopedService
from corral.daemon._errors import InvalidRequestError, InvalidSpecError, NodeNotFoundError
from corral.daemon._events import Event
from corral.daemon._http._common import (
    ApiRoute,
    RequestBody,
    api_of,
    body_route,
    command_response,
    errors,
    json_value,
    read_body,
)
from corral.daemon._spec import AgentSpec, parse_spec
from corral.daemon._text import json_problems

EVENTS_PAGE = 1000


# --- request bodies ---------------------------------------------------------------------------


class PromptBody(RequestBody):
    """``POST /agents/{id}/prompt``: every field optional; without ``text`` the last prompt is
    re-sent. ``by`` and ``why`` are recorded when the prompt resolves a blocked agent."""

    what = "prompt body"

    text: str | None = None
    by: str | None = Field(default=None, min_length=1)
    why: str | None = None
    idempotency_key: str | None = Field(default=None, min_length=1)


class StopBody(RequestBody):
    """``POST /agents/{id}/stop`` (the body itself is optional): ``now`` kills its turn at
    once (no ``stopGraceS``), ``keepChildren`` leaves its descendants running."""

    what = "stop body"

    by: str | None = Field(default=None, min_length=1)
    why: str | None = None
    idempotency_key: str | None = Field(default=None, min_length=1)
    now: bool = False
    keep_children: bool = False


class BudgetChange(RequestBody):
    """The dimensions of a budget to change; a field left out stays as it is, ``null`` makes
    it unlimited."""

    what = "budget change"

    max_tokens: int | None = Field(default=None, ge=0)
    max_cost_usd: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    max_turns: int | None = Field(default=None, ge=0)
    deadline_s: float | None = Field(default=None, ge=0, allow_inf_nan=False)


class SpawnBody(AgentSpec):
    """``POST /agents``: an agent spec plus an optional idempotency key."""

    idempotency_key: str | None = Field(default=None, min_length=1)

    @staticmethod
    async def read(request: Request) -> tuple[AgentSpec, str | None]:
        """The spec and the key; ``InvalidSpecError`` lists every problem of both.

        The spec is checked by :func:`parse_spec`, as any spec is (its fields, then the rules
        across fields), and the key beside it, so that one answer lists the problems of both.
        """
        data = json_value(await read_body(request))
        problems: list[dict[str, Any]] = []
        key = None
        if isinstance(data, dict):
            key = data.pop("idempotencyKey", None)
            if key is not None and not (isinstance(key, str) and key):
                problems.append(
                    {"field": "idempotencyKey", "message": "must be a non-empty string"}
                )
                key = None
            elif key is not None:
                problems += json_problems({"idempotencyKey": key})
        try:
            spec = parse_spec(data)
        except InvalidSpecError as exc:
            raise InvalidSpecError(exc.problems + problems) from None
        if problems:
            raise InvalidSpecError(problems)
        return spec, key


# --- endpoints --------------------------------------------------------------------------------


async def healthz() -> JSONResponse:
    return JSONResponse({"status": "ok"})


async def spawn(
    request: Request,
    node: Annotated[
        str | None,
        Query(
            min_length=1,
            description="Several daemons: the one a new top-level agent runs on (default: "
            "the least loaded; a child runs on its parent's)",
        ),
    ] = None,
) -> JSONResponse:
    here = getattr(request.app.state, "node", None)
    if node is not None and here is None:
        # Alone on its store, this daemon is the only one there is (the forwarding layer
        # of a daemon with --node has placed the agent already).
        raise NodeNotFoundError(node, [])
    spec, key = await SpawnBody.read(request)
    result = await api_of(request).spawn(spec, idempotency_key=key)
    location = {"Location": f"/agents/{result.body['id']}"} if "id" in result.body else {}
    return command_response(result, location)


async def list_agents(
    request: Request,
    # Taken as text and checked by _listing, so that every refusal is one typed 422
    # (invalid_query) naming the parameter, the bound and the value seen.
    limit: Annotated[
        str | None, Query(description="Agents per page: an integer from 1 to 1000 (100)")
    ] = None,
    cursor: Annotated[str | None, Query(description="The nextCursor of the previous page")] = None,
    state: Annotated[str | None, Query(description="Only in this state")] = None,
    run: Annotated[str | None, Query(description="Only of this run")] = None,
    parent: Annotated[str | None, Query(description="Only its children")] = None,
    name: Annotated[str | None, Query(description="Only of this name")] = None,
) -> JSONResponse:
    page = api_of(request).list_page(
        limit=_listing.DEFAULT_LIMIT if limit is None else _listing.check_limit(limit),
        cursor=cursor,
        state=state,
        run=run,
        parent=parent,
        name=name,
    )
    return JSONResponse(page)


async def get_agent(agent_id: str, request: Request) -> JSONResponse:
    return JSONResponse(api_of(request).get(agent_id))


async def prompt(agent_id: str, request: Request) -> JSONResponse:
    api = api_of(request)
    api.check(agent_id)  # out of reach is refused before the body is read
    body = await PromptBody.read(request)
    result = await api.prompt(
        agent_id, body.text, by=body.by, why=body.why, idempotency_key=body.idempotency_key
    )
    return command_response(result)


async def stop(agent_id: str, request: Request) -> JSONResponse:
    api = api_of(request)
    api.check(agent_id)  # out of reach is refused before the body is read
    body = await StopBody.read(request)
    result = await api.stop(
        agent_id,
        by=body.by,
        why=body.why,
        idempotency_key=body.idempotency_key,
        now=body.now,
        keep_children=body.keep_children,
    )
    return command_response(result)


async def inbox(agent_id: str, request: Request) -> JSONResponse:
    return JSONResponse({"agentId": agent_id, "notices": api_of(request).inbox(agent_id)})


async def session(agent_id: str, request: Request) -> JSONResponse:
    return JSONResponse(api_of(request).session(agent_id))


async def events(
    request: Request,
    after: Annotated[int | None, Query(ge=0, description="Only events with a greater seq")] = None,
    agent: Annotated[str | None, Query(min_length=1, description="Only this agent's")] = None,
    types: Annotated[
        list[str] | None,
        Query(alias="type", description="Only these types (repeat it, or a comma list)"),
    ] = None,
    run: Annotated[str | None, Query(min_length=1, description="Only this run's agents'")] = None,
    fmt: Annotated[Literal["sse", "json"], Query(alias="format")] = "sse",
    limit: Annotated[int, Query(ge=1, le=EVENTS_PAGE, description="format=json only")] = (
        EVENTS_PAGE
    ),
    last_event_id: Annotated[
        str | None, Header(alias="Last-Event-ID", description="Resume after this seq")
    ] = None,
) -> Response:
    api = api_of(request)
    # A reconnecting EventSource sends the header with its original URL: the header wins.
    start = _cursor(last_event_id) if last_event_id is not None else (after or 0)
    if start > api.service.store.state.last_seq:
        # Another daemon's cursor (several daemons): this one may not have read that far.
        await api.service.store.refresh()
    last = api.service.store.state.last_seq
    if start > last:
        raise InvalidRequestError(
            [
                {
                    "field": "Last-Event-ID" if last_event_id is not None else "after",
                    "message": f"{start} is beyond the last event ({last})",
                }
            ],
            "event cursor",
        )
    if agent is not None:
        agent = api.resolve(agent)  # an id or a name
    api.check_events(agent)
    if agent is not None:
        await api.service.known(agent)  # 404 for an unknown agent (a deleted one is known)
    wanted = _Wanted(api, _listing.event_types(types), _listing.check_filter("run", run))
    if fmt == "json":
        page, scanned = await _filtered_page(api, start, agent, limit, wanted)
        return JSONResponse(
            {
                "events": [_listing.redact_event(e.to_dict()) for e in page],
                "lastSeq": api.service.store.state.last_seq,
                # Where the next page starts (?after=): past what was read, matching or not.
                "scannedTo": scanned,
            }
        )
    return EventSourceResponse(
        _stream(api, start, agent, wanted),
        ping=request.app.state.heartbeat_s,
        ping_message_factory=lambda: ServerSentEvent(comment="heartbeat"),
    )


class _Wanted:
    """The ``?type=`` and ``?run=`` filters of an event read."""

    def __init__(self, api: ScopedService, types: frozenset[str] | None, run: str | None):
        self.agents = api.service.store.state.agents
        self.types = types
        self.run = run

    @property
    def everything(self) -> bool:
        return self.types is None and self.run is None

    def __call__(self, event: Event) -> bool:
        return _listing.event_matches(self.agents, event.type, event.agent_id, self.types, self.run)


_SCAN_PAGES = 20  # a filtered page reads at most this many pages of the log, then answers


async def _filtered_page(
    api: ScopedService, start: int, agent: str | None, limit: int, wanted: _Wanted
) -> tuple[list[Event], int]:
    """Up to ``limit`` matching events after ``start``, and the seq read up to."""
    if wanted.everything:
        page = await api.events(start, agent, limit)
        return page, page[-1].seq if page else start
    found: list[Event] = []
    scanned = start
    for _ in range(_SCAN_PAGES):
        page = await api.events(scanned, agent, EVENTS_PAGE)
        for event in page:
            scanned = event.seq
            if wanted(event):
                found.append(event)
                if len(found) == limit:
                    return found, scanned
        if len(page) < EVENTS_PAGE:
            break
    return found, scanned


async def _stream(
    api: ScopedService, after: int, agent: str | None, wanted: _Wanted
) -> AsyncIterator[Any]:
    async with aclosing(api.subscribe(after, agent)) as stream:
        async for event in stream:
            if not wanted(event):
                continue
            yield ServerSentEvent(
                data=json.dumps(_listing.redact_event(event.to_dict()), separators=(",", ":")),
                id=str(event.seq),
                event=event.type,
            )


_CURSOR_DIGITS = 20  # past any sequence number; int() refuses very long digit strings


def _cursor(raw: str) -> int:
    if raw.isascii() and raw.isdigit() and len(raw) <= _CURSOR_DIGITS:
        return int(raw)
    shown = raw if len(raw) <= 40 else f"{raw[:40]}... ({len(raw)} characters)"
    raise InvalidRequestError(
        [
            {
                "field": "Last-Event-ID",
                "message": f"must be a non-negative integer of at most {_CURSOR_DIGITS} "
                f"digits, got {shown!r}",
            }
        ],
        "event cursor",
    )


# --- the routes -------------------------------------------------------------------------------

_COMMAND_ERRORS = errors(400, 401, 403, 404, 409, 413, 415, 422, 503)

ROUTES = [
    ApiRoute("GET", "/healthz", healthz, "Liveness (no token needed)"),
    ApiRoute(
        "POST",
        "/agents",
        spawn,
        "Create an agent from a spec",
        status_code=201,
        responses=errors(400, 401, 403, 409, 413, 415, 422, 503),
        body=SpawnBody,
        body_required=True,
    ),
    ApiRoute(
        "GET",
        "/agents",
        list_agents,
        "Agent summaries, oldest first, a page at a time (follow nextCursor)",
        responses=errors(401, 403, 422),
    ),
    ApiRoute("GET", "/agents/{agent_id}", get_agent, "One agent", responses=errors(401, 403, 404)),
    body_route(
        "POST",
        "/agents/{agent_id}/prompt",
        prompt,
        "Start a turn (retries a blocked agent)",
        PromptBody,
        status_code=202,
        responses=_COMMAND_ERRORS,
    ),
    body_route(
        "POST",
        "/agents/{agent_id}/stop",
        stop,
        "End an agent and its descendants (SIGTERM, then SIGKILL after stopGraceS)",
        StopBody,
        status_code=202,
        responses=_COMMAND_ERRORS,
    ),
    ApiRoute(
        "GET",
        "/agents/{agent_id}/inbox",
        inbox,
        "Notices to an agent",
        responses=errors(401, 403, 404),
    ),
    ApiRoute(
        "GET",
        "/agents/{agent_id}/session",
        session,
        "An agent's session: the conversation of its turns, oldest first",
        responses=errors(401, 403, 404),
    ),
    ApiRoute(
        "GET",
        "/events",
        events,
        "The event log: SSE (resumable), or a page of JSON with format=json",
        responses={
            # 422: a ?type= or ?run= filter refused (invalid_query), as the lists answer.
            **errors(400, 401, 403, 404, 422),
            200: {
                "description": "SSE: `id` is the event's seq, `event` its type, `data` the "
                "event as JSON; heartbeat comments keep the stream open",
                "content": {"text/event-stream": {}, "application/json": {}},
            },
        },
    ),
]
