"""The HTTP API of the agent service (FastAPI), with its event stream (SSE).

Every error answer is ``{"error": {"code", "message", "retryable", "details"}}`` with the
status of :func:`http_status`. Bad input (malformed JSON, wrong types, unknown fields, a body
over the limit, an unknown agent or route) is a 4xx with a code and never reaches the store;
an unexpected exception is a 500 ``internal_error`` whose body says nothing of its cause (the
traceback goes to the log).
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Annotated, Any, Literal, TypeVar
from urllib.parse import urlsplit

import pydantic
from fastapi import FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import corral
from corral.daemon._auth import AGENT_SCOPE_KEY, agent_of_token
from corral.daemon._databases import Databases, waiting_decisions
from corral.daemon._errors import (
    DaemonError,
    InvalidSpecError,
    OutOfScopeError,
    UnauthorizedError,
)
from corral.daemon._service import AgentService, CommandResult
from corral.daemon._spec import AgentSpec, parse_spec, problems_of
from corral.daemon._status import http_status
from corral.kernel import CorralError, InvalidArgumentError
from corral.kernel import _validate as v

logger = logging.getLogger("corral.daemon.http")

_EVENTS_PAGE = 1000
_M = TypeVar("_M", bound="BaseModel")


# --- errors of the HTTP layer -------------------------------------------------------------


class InvalidRequestError(InvalidSpecError):
    """A command body or a query parameter is invalid; ``problems`` lists every problem."""

    code = "invalid_request"

    def __init__(self, problems: list[dict[str, Any]], what: str = "request") -> None:
        super().__init__(problems, what)


class BodyTooLargeError(DaemonError):
    code = "body_too_large"

    def __init__(self, limit: int, seen: int, *, declared: bool) -> None:
        how = "declares" if declared else "sent at least"
        super().__init__(
            f"request body too large: the limit is {limit} bytes and the request {how} {seen}",
            limit=limit,
            seen=seen,
        )


class UnsupportedMediaTypeError(DaemonError):
    code = "unsupported_media_type"

    def __init__(self, content_type: str | None) -> None:
        super().__init__(
            f"request bodies must be JSON (Content-Type: application/json), got "
            f"{content_type or 'no Content-Type'}",
            content_type=content_type,
        )


class ForbiddenOriginError(DaemonError):
    """A browser request from another site (or a DNS-rebound name) is refused."""

    code = "forbidden_origin"

    def __init__(self, origin: str) -> None:
        super().__init__(
            f"requests from origin {origin!r} are refused: only pages on a loopback address "
            "(or, with a token, on this daemon's own address) may call the API",
            origin=origin,
        )


class RouteNotFoundError(DaemonError):
    code = "not_found"

    def __init__(self, method: str, path: str) -> None:
        super().__init__(f"no route for {method} {path}", method=method, path=path)


class MethodNotAllowedError(DaemonError):
    code = "method_not_allowed"

    def __init__(self, method: str, path: str) -> None:
        super().__init__(f"{path} does not take {method}", method=method, path=path)


class InternalError(DaemonError):
    code = "internal_error"

    def __init__(self) -> None:
        super().__init__("internal error; the daemon's log has the details")


# --- request bodies (also what the OpenAPI document describes) ------------------------------


class _Body(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, extra="forbid", frozen=True, strict=True)


class PromptBody(_Body):
    """``POST /agents/{id}/prompt``: every field optional; without ``text`` the last prompt is
    re-sent. ``by`` and ``why`` are recorded when the prompt resolves a blocked agent."""

    text: str | None = None
    by: str | None = Field(default=None, min_length=1)
    why: str | None = None
    idempotency_key: str | None = Field(default=None, min_length=1)


class StopBody(_Body):
    """``POST /agents/{id}/stop`` (the body itself is optional)."""

    by: str | None = Field(default=None, min_length=1)
    why: str | None = None
    idempotency_key: str | None = Field(default=None, min_length=1)


class SpawnBody(AgentSpec):
    """``POST /agents``: an agent spec plus an optional idempotency key."""

    idempotency_key: str | None = Field(default=None, min_length=1)


class ErrorDetail(BaseModel):
    code: str
    message: str
    retryable: bool
    details: dict[str, Any]


class ErrorBody(BaseModel):
    """Every error answer."""

    error: ErrorDetail


_ERROR_DESCRIPTIONS = {
    400: "Invalid input; `details.problems` lists every problem",
    401: "Missing or wrong bearer token",
    403: "An agent's token used beyond that agent and its descendants",
    404: "No agent with that id",
    409: "The agent (or its run) cannot take the command now",
    413: "Body over the size limit",
    415: "The body is not declared as JSON",
    422: "The idempotency key was used for another command",
    503: "The daemon is shutting down, or its store is unavailable (retryable)",
}


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {s: {"model": ErrorBody, "description": _ERROR_DESCRIPTIONS[s]} for s in statuses}


_COMMAND_ERRORS = _errors(400, 401, 403, 404, 409, 413, 415, 422, 503)


def _request_body(model: type[BaseModel], *, required: bool) -> dict[str, Any]:
    return {
        "requestBody": {
            "required": required,
            "content": {
                "application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}
            },
        }
    }


# --- the app ------------------------------------------------------------------------------


def create_app(
    service: AgentService,
    *,
    token: str | None = None,
    max_body_bytes: int = 1_048_576,
    heartbeat_s: float = 15.0,
    databases: Databases | None = None,
) -> FastAPI:
    """The HTTP API over ``service`` (and the gateway's routes over ``databases``, when
    given: see :mod:`corral.daemon._http_gateway`).

    With ``token``, every request but ``GET /healthz`` needs ``Authorization: Bearer <token>``
    (401 ``unauthorized`` otherwise). An agent's own token (``CORRAL_TOKEN`` in its
    environment, see :meth:`AgentService.in_scope`) is accepted too, for that agent and its
    descendants only: it lists and reads them, prompts and stops them, spawns children under
    them, reads their events (one agent at a time, ``?agent=``) and decisions, and the MCP
    tools at ``/mcp`` with the same reach (see :func:`~._mcp.build_mcp_server`); anything else
    is 403 ``out_of_scope``. Bodies over ``max_body_bytes`` (declared or
    streamed) are refused with 413 ``body_too_large``. ``GET /events`` sends a heartbeat
    comment every ``heartbeat_s`` seconds. Raises ``InvalidArgumentError`` for bad arguments.
    """
    where = "create_app"
    v.instance_of(where, "service", service, AgentService)
    v.non_empty_str(where, "token", token, optional=True)
    if token is not None and not _sendable(token):
        raise InvalidArgumentError(where, "token", "printable ASCII without spaces", "<hidden>")
    v.positive_int(where, "max_body_bytes", max_body_bytes)
    v.positive_number(where, "heartbeat_s", heartbeat_s)
    v.instance_of(where, "databases", databases, (Databases, type(None)))

    app = FastAPI(
        title="corral daemon",
        version=corral.__version__,
        description="Agents under supervision: spawn, prompt, stop, watch events, decide.",
    )
    app.openapi = lambda: _openapi(app, token is not None)  # type: ignore[method-assign]
    app.add_middleware(_Gate, token=token, max_body_bytes=max_body_bytes)
    app.add_exception_handler(CorralError, _corral_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]

    @app.get("/healthz", summary="Liveness (no token needed)")
    async def healthz() -> JSONResponse:
        return JSONResponse({"status": "ok"})

    @app.post(
        "/agents",
        status_code=201,
        summary="Create an agent from a spec",
        responses=_errors(400, 401, 403, 409, 413, 415, 422, 503),
        openapi_extra=_request_body(SpawnBody, required=True),
    )
    async def spawn(request: Request) -> JSONResponse:
        principal = _principal(request)
        data = _json_value(await _body(request))
        problems: list[dict[str, Any]] = []
        key = None
        if isinstance(data, dict):
            key = data.pop("idempotencyKey", None)
            if key is not None and not (isinstance(key, str) and key):
                problems.append(
                    {"field": "idempotencyKey", "message": "must be a non-empty string"}
                )
                key = None
        try:
            spec = parse_spec(data)
        except InvalidSpecError as exc:
            raise InvalidSpecError(exc.problems + problems) from None
        if problems:
            raise InvalidSpecError(problems)
        if principal is not None:
            if spec.parent is None:
                raise OutOfScopeError(principal, "a new root agent (give a parent)")
            _check(request, spec.parent)
        result = await service.spawn(spec, idempotency_key=key)
        location = {"Location": f"/agents/{result.body['id']}"} if "id" in result.body else {}
        return _command(result, location)

    @app.get("/agents", summary="Every agent", responses=_errors(401))
    async def list_agents(request: Request) -> JSONResponse:
        principal = _principal(request)
        found = service.list_agents()
        if principal is not None:
            found = [a for a in found if service.in_scope(principal, a["id"])]
        return JSONResponse({"agents": found})

    @app.get("/agents/{agent_id}", summary="One agent", responses=_errors(401, 403, 404))
    async def get_agent(agent_id: str, request: Request) -> JSONResponse:
        _check(request, agent_id)
        return JSONResponse(service.get(agent_id))

    @app.post(
        "/agents/{agent_id}/prompt",
        status_code=202,
        summary="Start a turn (retries a blocked agent)",
        responses=_COMMAND_ERRORS,
        openapi_extra=_request_body(PromptBody, required=False),
    )
    async def prompt(agent_id: str, request: Request) -> JSONResponse:
        _check(request, agent_id)
        body = _model(PromptBody, await _body(request), "prompt body")
        result = await service.prompt(
            agent_id, body.text, by=body.by, why=body.why, idempotency_key=body.idempotency_key
        )
        return _command(result)

    @app.post(
        "/agents/{agent_id}/stop",
        status_code=202,
        summary="End an agent",
        responses=_COMMAND_ERRORS,
        openapi_extra=_request_body(StopBody, required=False),
    )
    async def stop(agent_id: str, request: Request) -> JSONResponse:
        _check(request, agent_id)
        body = _model(StopBody, await _body(request), "stop body")
        result = await service.stop(
            agent_id, by=body.by, why=body.why, idempotency_key=body.idempotency_key
        )
        return _command(result)

    @app.get(
        "/agents/{agent_id}/inbox", summary="Notices to an agent", responses=_errors(401, 403, 404)
    )
    async def inbox(agent_id: str, request: Request) -> JSONResponse:
        _check(request, agent_id)
        return JSONResponse({"agentId": agent_id, "notices": service.inbox(agent_id)})

    @app.get("/decisions", summary="Everything waiting on a person", responses=_errors(400, 401))
    async def decisions(
        request: Request,
        resolved: Annotated[bool, Query(description="Add the recorded resolutions")] = False,
    ) -> JSONResponse:
        principal = _principal(request)

        def mine(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
            if principal is None:
                return items
            return [d for d in items if service.in_scope(principal, d["agentId"])]

        answer: dict[str, Any] = {"decisions": mine(waiting_decisions(service, databases))}
        if resolved:
            answer["resolutions"] = mine(service.resolutions())
        return JSONResponse(answer)

    @app.get(
        "/events",
        summary="The event log: SSE (resumable), or a page of JSON with format=json",
        responses={
            **_errors(400, 401, 404),
            200: {
                "description": "SSE: `id` is the event's seq, `event` its type, `data` the "
                "event as JSON; heartbeat comments keep the stream open",
                "content": {"text/event-stream": {}, "application/json": {}},
            },
        },
    )
    async def events(
        request: Request,
        after: Annotated[
            int | None, Query(ge=0, description="Only events with a greater seq")
        ] = None,
        agent: Annotated[str | None, Query(min_length=1, description="Only this agent's")] = None,
        fmt: Annotated[Literal["sse", "json"], Query(alias="format")] = "sse",
        limit: Annotated[int, Query(ge=1, le=_EVENTS_PAGE, description="format=json only")] = (
            _EVENTS_PAGE
        ),
        last_event_id: Annotated[
            str | None, Header(alias="Last-Event-ID", description="Resume after this seq")
        ] = None,
    ) -> Response:
        # A reconnecting EventSource sends the header with its original URL: the header wins.
        start = _cursor(last_event_id) if last_event_id is not None else (after or 0)
        last = service.store.state.last_seq
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
        principal = _principal(request)
        if principal is not None and agent is None:
            raise OutOfScopeError(principal, "the whole event log (add ?agent=ID)")
        if agent is not None:
            _check(request, agent)
            service.get(agent)  # 404 for an unknown agent
        if fmt == "json":
            page = await service.events(start, agent_id=agent, limit=limit)
            return JSONResponse(
                {"events": [e.to_dict() for e in page], "lastSeq": service.store.state.last_seq}
            )
        return EventSourceResponse(
            _stream(service, start, agent),
            ping=heartbeat_s,
            ping_message_factory=lambda: ServerSentEvent(comment="heartbeat"),
        )

    def _check(request: Request, agent_id: str) -> None:
        check_scope(service, request, agent_id)

    from corral.daemon._http_gateway import add_gateway_routes  # it imports this module

    # Without --db the routes answer too: no database (unknown_target), not no route.
    add_gateway_routes(app, service, databases or Databases({}, service=service))
    return app


# --- helpers ------------------------------------------------------------------------------


_PRINCIPAL = AGENT_SCOPE_KEY  # set by _Gate for a request with an agent's token


def check_scope(service: AgentService, request: Request, agent_id: str) -> None:
    """Refuse (403 ``out_of_scope``) a request with an agent's token for an agent outside
    that agent's subtree."""
    principal = _principal(request)
    if principal is not None and not service.in_scope(principal, agent_id):
        raise OutOfScopeError(principal, f"agent {agent_id!r}")


def _principal(request: Request) -> str | None:
    """The agent whose token the request carries; None for the daemon's own token (or none)."""
    principal: str | None = request.scope.get(_PRINCIPAL)
    return principal


async def _stream(service: AgentService, after: int, agent: str | None) -> AsyncIterator[Any]:
    async with aclosing(service.subscribe(after, agent_id=agent)) as events:
        async for event in events:
            yield ServerSentEvent(
                data=json.dumps(event.to_dict(), separators=(",", ":")),
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


def _command(result: CommandResult, headers: dict[str, str] | None = None) -> JSONResponse:
    extra = dict(headers or {})
    if result.replayed:
        extra["Idempotency-Replayed"] = "true"
    return JSONResponse(result.body, status_code=result.status, headers=extra)


async def _body(request: Request) -> bytes | None:
    """The raw body, or None when there is none; a body must be declared JSON."""
    raw = await request.body()
    if not raw.strip():
        return None
    content_type = request.headers.get("content-type")
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media != "application/json" and not (media.startswith("application/") and "+json" in media):
        raise UnsupportedMediaTypeError(content_type)
    return raw


def _json_value(raw: bytes | None) -> Any:
    if raw is None:
        raise InvalidSpecError([{"field": "(body)", "message": "a JSON object is required"}])
    try:
        return json.loads(raw, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:
        # ValueError covers JSONDecodeError, UnicodeDecodeError and the refused constants.
        message = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise InvalidSpecError(
            [{"field": "(body)", "message": f"malformed JSON: {message}"}]
        ) from None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _model(model: type[_M], raw: bytes | None, what: str) -> _M:
    try:
        return model() if raw is None else model.model_validate_json(raw)
    except pydantic.ValidationError as exc:
        raise InvalidRequestError(problems_of(exc), what) from None


def _error_response(error: CorralError, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": error.to_dict()}, status_code=http_status(error), headers=headers)


async def _corral_error(request: Request, exc: CorralError) -> JSONResponse:
    return _error_response(exc)


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    problems = []
    for error in exc.errors():
        where, *path = error["loc"] or ("request",)
        field = ".".join(str(p) for p in path) or str(where)
        problems.append({"field": field, "in": str(where), "message": error["msg"]})
    return _error_response(InvalidRequestError(problems))


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    error: CorralError
    if exc.status_code == 404:
        error = RouteNotFoundError(request.method, request.url.path)
    elif exc.status_code == 405:
        error = MethodNotAllowedError(request.method, request.url.path)
        # The router names only the first route that matched the path; name them all.
        allowed: set[str] = set()
        for route in request.app.routes:
            if route.matches(request.scope)[0] != Match.NONE:
                allowed |= getattr(route, "methods", None) or set()
        return _error_response(error, {"Allow": ", ".join(sorted(allowed))})
    else:
        error = InvalidRequestError([{"field": "(request)", "message": str(exc.detail)}])
    return _error_response(error, dict(exc.headers or {}))


def _sendable(token: str) -> bool:
    return token.isascii() and token.isprintable() and " " not in token


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` and loopback IP literals (127.0.0.0/8, ``::1``, bracketed or
    not); a name that merely resolves to loopback does not count."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.removeprefix("[").removesuffix("]")).is_loopback
    except ValueError:
        return False


class _Gate:
    """Before the app: the bearer token, the browser-origin rule and the body limit; around
    it: any unexpected exception becomes a bare 500 (and a log entry with the traceback)."""

    def __init__(self, app: ASGIApp, *, token: str | None, max_body_bytes: int) -> None:
        self.app = app
        self.secret = token
        self.token = None if token is None else token.encode()
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            extra = {"WWW-Authenticate": "Bearer"} if isinstance(refusal, UnauthorizedError) else {}
            await _error_response(refusal, extra)(scope, receive, send)
            return

        limit = self.max_body_bytes
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLargeError(limit, seen, declared=False)
            return message

        started = False

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except Exception as exc:
            if started:
                logger.exception("error after answering %s %s", scope["method"], scope["path"])
                raise
            if isinstance(exc, CorralError):
                await _error_response(exc)(scope, receive, send)
                return
            logger.exception("unexpected error answering %s %s", scope["method"], scope["path"])
            await _error_response(InternalError())(scope, receive, send)

    def _refusal(self, scope: Scope, headers: Headers) -> CorralError | None:
        public = scope["method"] in ("GET", "HEAD") and scope["path"] == "/healthz"
        scope.pop(_PRINCIPAL, None)  # only this gate says who is calling
        if self.secret is not None and self.token is not None and not public:
            scheme, _, given = headers.get("authorization", "").partition(" ")
            presented = given.strip()
            if scheme.lower() != "bearer":
                return UnauthorizedError()
            if not hmac.compare_digest(presented.encode(), self.token):
                principal = agent_of_token(self.secret, presented)
                if principal is None:
                    return UnauthorizedError()
                scope[_PRINCIPAL] = principal
        origin = headers.get("origin")
        if origin is not None and not self._origin_allowed(origin, headers.get("host")):
            return ForbiddenOriginError(origin)
        declared = headers.get("content-length")
        if declared is not None:
            if not (declared.isascii() and declared.isdigit()):
                return InvalidRequestError(
                    [{"field": "Content-Length", "message": f"not a length: {declared!r}"}]
                )
            if int(declared) > self.max_body_bytes:
                return BodyTooLargeError(self.max_body_bytes, int(declared), declared=True)
        return None

    def _origin_allowed(self, origin: str, host: str | None) -> bool:
        # Browsers send Origin on cross-site requests; a page elsewhere (or a DNS name rebound
        # to this address) must not drive a daemon that runs commands. Non-browser clients
        # send no Origin and are not affected.
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            return False
        if is_loopback_host(parts.hostname):
            return True
        return self.token is not None and host is not None and parts.netloc == host


def _openapi(app: FastAPI, secured: bool) -> dict[str, Any]:
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(
        title=app.title, version=app.version, description=app.description, routes=app.routes
    )
    components = schema.setdefault("components", {})
    models = components.setdefault("schemas", {})
    # The framework's 422 validation answers never happen here: bad input is a 400.
    for name in ("HTTPValidationError", "ValidationError"):
        models.pop(name, None)
    for path in schema.get("paths", {}).values():
        for operation in path.values():
            responses = operation.get("responses", {})
            if "HTTPValidationError" in json.dumps(responses.get("422", {})):
                del responses["422"]
    for model in (SpawnBody, PromptBody, StopBody, *getattr(app.state, "body_models", ())):
        found = model.model_json_schema(by_alias=True, ref_template="#/components/schemas/{model}")
        models.update(found.pop("$defs", {}))
        models[model.__name__] = found
    if secured:
        components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        schema["security"] = [{"bearer": []}]
    app.openapi_schema = schema
    return schema
