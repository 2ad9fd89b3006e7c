"""The HTTP API's app: the routes of ``_agents`` and ``_gateway`` behind a gate (token,
browser origin, body limit), every error in one shape, and the OpenAPI document."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import corral
from corral.daemon._api import ScopedService
from corral.daemon._auth import (
    ACTING_AS_HEADER,
    CALLER_SCOPE_KEY,
    OPERATOR,
    Caller,
    is_loopback_host,
    sendable,
)
from corral.daemon._callers import Callers
from corral.daemon._databases import Databases
from corral.daemon._errors import InvalidRequestError, UnauthorizedError
from corral.daemon._http import (
    _agents,
    _decisions,
    _external,
    _gateway,
    _lifecycle,
    _metrics,
    _nodes,
    _patch,
    _runs,
    _tokens,
    _turns,
)
from corral.daemon._http._common import (
    ApiRoute,
    BodyTooLargeError,
    ForbiddenOriginError,
    InternalError,
    MethodNotAllowedError,
    RouteNotFoundError,
    error_response,
)
from corral.daemon._metrics import Metrics
from corral.daemon._service import AgentService
from corral.daemon._tokens import TokenIndex, name_problem
from corral.kernel import CorralError, InvalidArgumentError
from corral.kernel import _validate as v

if TYPE_CHECKING:
    from corral.daemon._cluster._node import Node

logger = logging.getLogger("corral.daemon.http")

ROUTES: list[ApiRoute] = [
    *_agents.ROUTES,
    *_turns.ROUTES,
    *_external.ROUTES,
    *_patch.ROUTES,
    *_lifecycle.ROUTES,
    *_runs.ROUTES,
    *_decisions.ROUTES,
    *_tokens.ROUTES,
    *_gateway.ROUTES,
    *_metrics.ROUTES,
    *_nodes.ROUTES,
]


# --- the app ------------------------------------------------------------------------------


def create_app(
    service: AgentService,
    *,
    token: str | None = None,
    max_body_bytes: int = 1_048_576,
    heartbeat_s: float = 15.0,
    databases: Databases | None = None,
    metrics: Metrics | None = None,
    metrics_public: bool = False,
    node: Node | None = None,
) -> FastAPI:
    """The HTTP API over ``service`` (and the gateway's routes over ``databases``, when
    given; without, they answer ``unknown_target``).

    With ``token``, every request but ``GET /healthz`` needs ``Authorization: Bearer <token>``
    (401 ``unauthorized`` otherwise), and the gate says who is calling (a
    :class:`~._auth.Caller` in the request's scope): ``token`` itself is the operator named
    ``operator``; a named operator token (``POST /tokens``, looked up by its digest, revoked
    from the next request on) is an operator of that name. Without ``token`` nothing is
    asked and every request is trusted in-process code (for tests and embedding only: a
    daemon always has a token). An agent's own token (``CORRAL_TOKEN`` in its
    environment, see :meth:`AgentService.in_scope`) is accepted too, for that agent and its
    descendants only: it lists and reads them, prompts and stops them, spawns children under
    them, reads their events (one agent at a time, ``?agent=``) and decisions, and the MCP
    tools at ``/mcp`` with the same reach (both call :class:`~._api.ScopedService`); anything
    else is 403 ``out_of_scope``. Bodies over ``max_body_bytes`` (declared or
    streamed) are refused with 413 ``body_too_large``. ``GET /events`` sends a heartbeat
    comment every ``heartbeat_s`` seconds. ``GET /metrics`` answers ``metrics`` (made for
    the app when None; an agent's token is refused), without a token when
    ``metrics_public``. Raises ``InvalidArgumentError`` for bad arguments.
    """
    where = "create_app"
    v.instance_of(where, "service", service, AgentService)
    v.non_empty_str(where, "token", token, optional=True)
    if token is not None and not sendable(token):
        raise InvalidArgumentError(where, "token", "printable ASCII without spaces", "<hidden>")
    v.positive_int(where, "max_body_bytes", max_body_bytes)
    v.positive_number(where, "heartbeat_s", heartbeat_s)
    v.instance_of(where, "databases", databases, (Databases, type(None)))
    v.instance_of(where, "metrics", metrics, (Metrics, type(None)))

    public = {_metrics.PATH} if metrics_public else set()
    app = FastAPI(
        title="corral daemon",
        version=corral.__version__,
        description="Agents under supervision: spawn, prompt, stop, watch events, decide.",
    )
    app.openapi = lambda: _openapi(app, token is not None, public)  # type: ignore[method-assign]
    callers = None if token is None else Callers(token, TokenIndex(lambda: service.store.state))
    app.state.node = node
    if node is not None:
        # Inside the gate (added first, so it runs after): forwarded requests carry a
        # checked token and a bounded body.
        from corral.daemon._cluster._forward import Forwarding

        app.add_middleware(Forwarding, node=node, service=service)
    app.add_middleware(
        _Gate, token=token, callers=callers, max_body_bytes=max_body_bytes, public=public
    )
    app.add_exception_handler(CorralError, _corral_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]

    databases = databases or Databases({}, service=service)
    app.state.api = ScopedService(service, databases)
    app.state.metrics = metrics or Metrics.of(service, databases)
    app.state.heartbeat_s = heartbeat_s
    app.state.callers = callers  # for other front doors of this daemon (the console's login)
    for route in ROUTES:
        route.add_to(app)
    return app


# --- helpers ------------------------------------------------------------------------------


async def _corral_error(request: Request, exc: CorralError) -> JSONResponse:
    return error_response(exc)


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    problems = []
    for error in exc.errors():
        where, *path = error["loc"] or ("request",)
        field = ".".join(str(p) for p in path) or str(where)
        message = error["msg"]
        if where == "query" and isinstance(error.get("input"), str):
            # A query value is short text the caller typed: say which one was refused.
            seen = error["input"]
            message += f", got {seen if len(seen) <= 40 else seen[:40] + '...'!r}"
        problems.append({"field": field, "in": str(where), "message": message})
    return error_response(InvalidRequestError(problems))


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
        return error_response(error, {"Allow": ", ".join(sorted(allowed))})
    else:
        error = InvalidRequestError([{"field": "(request)", "message": str(exc.detail)}])
    return error_response(error, dict(exc.headers or {}))


class _Gate:
    """Before the app: the bearer token, the browser-origin rule and the body limit; around
    it: any unexpected exception becomes a bare 500 (and a log entry with the traceback)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        token: str | None,
        callers: Callers | None,
        max_body_bytes: int,
        public: set[str],
    ) -> None:
        self.app = app
        self.secret = token
        self.token = None if token is None else token.encode()
        self.callers = callers
        self.max_body_bytes = max_body_bytes
        self.public = {"/healthz", *public}  # GET and HEAD without a token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            extra = {"WWW-Authenticate": "Bearer"} if isinstance(refusal, UnauthorizedError) else {}
            await error_response(refusal, extra)(scope, receive, send)
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
                await error_response(exc)(scope, receive, send)
                return
            logger.exception("unexpected error answering %s %s", scope["method"], scope["path"])
            await error_response(InternalError())(scope, receive, send)

    def _refusal(self, scope: Scope, headers: Headers) -> CorralError | None:
        public = scope["method"] in ("GET", "HEAD") and scope["path"] in self.public
        scope.pop(CALLER_SCOPE_KEY, None)  # only this gate says who is calling
        if self.secret is not None and not public:
            scheme, _, given = headers.get("authorization", "").partition(" ")
            assert self.callers is not None
            caller = self.callers.of(given.strip()) if scheme.lower() == "bearer" else None
            if caller is None:
                return UnauthorizedError()
            acting_as = headers.get(ACTING_AS_HEADER)
            if acting_as is not None and caller.name == OPERATOR and caller.is_operator:
                # Another daemon of the store relays a person's command (the daemon token
                # is every daemon's, and it may name any operator anyway).
                problem = name_problem(acting_as)
                if problem is not None:
                    return InvalidRequestError([{"field": ACTING_AS_HEADER, "message": problem}])
                caller = Caller(acting_as)
            scope[CALLER_SCOPE_KEY] = caller  # read by the routes' api_of and by MCP
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


def _openapi(app: FastAPI, secured: bool, public: set[str]) -> dict[str, Any]:
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
    for model in (route.body for route in ROUTES if route.body is not None):
        found = model.model_json_schema(by_alias=True, ref_template="#/components/schemas/{model}")
        models.update(found.pop("$defs", {}))
        models[model.__name__] = found
    if secured:
        components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        schema["security"] = [{"bearer": []}]
        # The gate lets liveness through without a token: the document says so.
        for path in {"/healthz", *public}:
            schema["paths"][path]["get"]["security"] = []
    app.openapi_schema = schema
    return schema
