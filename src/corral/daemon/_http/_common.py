"""What every route of the HTTP API shares: its errors, request bodies read and described by
one model, the route table's entries, and the caller's scoped API."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

import pydantic
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

from corral.daemon._api import ScopedService
from corral.daemon._auth import CALLER_SCOPE_KEY, Caller
from corral.daemon._errors import DaemonError, InvalidRequestError, InvalidSpecError
from corral.daemon._service import CommandResult
from corral.daemon._spec import problems_of
from corral.daemon._status import http_status
from corral.daemon._text import json_problems, text_problem
from corral.kernel import CorralError

# --- errors of the HTTP layer (their statuses are in corral.daemon._status) --------------------


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


def error_response(error: CorralError, headers: dict[str, str] | None = None) -> JSONResponse:
    """Every error answer: ``{"error": {code, message, retryable, details}}``."""
    return JSONResponse({"error": error.to_dict()}, status_code=http_status(error), headers=headers)


# --- error answers in the OpenAPI document ----------------------------------------------------


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
    403: "An agent's token used beyond that agent and its descendants (or for a person's business)",
    404: "No agent with that id",
    409: "The agent (or its run) cannot take the command now, or the name given is held by "
    "several agents (ambiguous_name: give the id)",
    413: "Body over the size limit",
    415: "The body is not declared as JSON",
    422: "The idempotency key was used for another command",
    429: "The agent has as many approvals waiting on people as it may (retryable)",
    503: "The daemon is shutting down, or its store is unavailable (retryable)",
}


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI ``responses`` of these error statuses."""
    return {s: {"model": ErrorBody, "description": _ERROR_DESCRIPTIONS[s]} for s in statuses}


# --- request bodies ---------------------------------------------------------------------------


async def read_body(request: Request) -> bytes | None:
    """The raw body, or None when there is none; a body must be declared JSON (415)."""
    raw = await request.body()
    if not raw.strip():
        return None
    content_type = request.headers.get("content-type")
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media != "application/json" and not (media.startswith("application/") and "+json" in media):
        raise UnsupportedMediaTypeError(content_type)
    return raw


def json_value(raw: bytes | None) -> Any:
    """The JSON in ``raw``; ``InvalidSpecError`` when there is none or it is malformed, or
    when a string in it holds a lone surrogate (``"\\ud800"``: valid JSON, but no UTF-8
    text can hold it)."""
    if raw is None:
        raise InvalidSpecError([{"field": "(body)", "message": "a JSON object is required"}])
    try:
        value = json.loads(raw, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:
        # ValueError covers JSONDecodeError, UnicodeDecodeError and the refused constants.
        message = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise InvalidSpecError(
            [{"field": "(body)", "message": f"malformed JSON: {message}"}]
        ) from None
    problems = json_problems(value, surrogates_only=True)
    if problems:
        raise InvalidSpecError(problems)
    return value


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


class RequestBody(BaseModel):
    """A JSON request body in camelCase: the model both reads it (:meth:`read`) and describes
    it in the OpenAPI document (as the ``body`` of its :class:`ApiRoute`).

    ``what`` names it in error messages; without a body, ``required`` reads ``{}`` (so the
    required fields are reported missing), otherwise the defaults.
    """

    model_config = ConfigDict(alias_generator=to_camel, extra="forbid", frozen=True, strict=True)

    what: ClassVar[str] = "request body"
    required: ClassVar[bool] = False

    @classmethod
    async def read(cls, request: Request) -> Self:
        """The body, checked: its fields, then its text (no lone surrogate or NUL anywhere,
        no control character in an identifier: ``corral.daemon._text``)."""
        raw = await read_body(request)
        if raw is None and cls.required:
            raw = b"{}"
        # Lone surrogates are named by field (pydantic's message is obscure); JSON can only
        # spell one as a \u escape, so a body without one skips that parse.
        if raw is not None and b"\\u" in raw:
            cls._parsed(raw)
        try:
            body = cls() if raw is None else cls.model_validate_json(raw)
        except pydantic.ValidationError as exc:
            if raw is not None:
                cls._parsed(raw)  # malformed JSON is told as the other bodies tell it
            raise InvalidRequestError(problems_of(exc), cls.what) from None
        problems = json_problems(body.model_dump(by_alias=True, exclude_none=True))
        if problems:
            raise InvalidRequestError(problems, cls.what)
        return body

    @classmethod
    def _parsed(cls, raw: bytes) -> None:
        """Refuse malformed JSON and lone surrogates with their own messages."""
        try:
            json_value(raw)
        except InvalidSpecError as exc:
            raise InvalidRequestError(exc.problems, cls.what) from None


def request_body_schema(model: type[BaseModel], *, required: bool) -> dict[str, Any]:
    """The ``openapi_extra`` naming ``model`` as an operation's JSON body."""
    return {
        "requestBody": {
            "required": required,
            "content": {
                "application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}
            },
        }
    }


# --- routes -----------------------------------------------------------------------------------

Endpoint = Callable[..., Awaitable[Response]]


@dataclass(frozen=True, slots=True)
class ApiRoute:
    """One route of the HTTP API: an endpoint at a method and path, with what the OpenAPI
    document says of it. ``body`` is the model the endpoint reads its body with (its
    ``required`` says whether the body may be left out)."""

    method: str
    path: str
    endpoint: Endpoint
    summary: str
    responses: dict[int | str, dict[str, Any]] = field(default_factory=dict)
    status_code: int | None = None
    body: type[BaseModel] | None = None
    body_required: bool = False

    def add_to(self, app: FastAPI) -> None:
        extra = None
        if self.body is not None:
            extra = request_body_schema(self.body, required=self.body_required)
        # Every route checks its parameters (check_parameters): each may answer 400, and
        # one naming an agent 409 (a name several agents hold: ambiguous_name).
        responses = {**errors(400), **self.responses}
        if "{agent_id}" in self.path:
            responses = {**errors(409), **responses}
        app.add_api_route(
            self.path,
            self.endpoint,
            methods=[self.method],
            status_code=self.status_code,
            summary=self.summary,
            responses=responses,
            openapi_extra=extra,
            dependencies=[Depends(check_parameters)],
        )


async def check_parameters(request: Request) -> None:
    """Refuse (400 ``invalid_request``) a query parameter the route does not declare, and a
    query or path parameter holding what no identifier may (control characters, NUL, lone
    surrogates): unknown body fields are refused too, so a misspelt parameter is never
    silently ignored. Then an ``agent_id`` path parameter that names an agent is replaced by
    its id. Runs before the endpoint, on every route of the API (async: a plain function
    would be sent to a worker thread on every request)."""
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    declared = {p.alias for p in dependant.query_params} if dependant is not None else set()
    problems: list[dict[str, Any]] = []
    for name, value in request.query_params.multi_items():
        if name not in declared:
            accepted = ", ".join(sorted(declared)) or "none"
            problems.append(
                {"field": name, "message": f"unknown query parameter (accepted: {accepted})"}
            )
            continue
        message = text_problem(value, identifier=True)
        if message is not None:
            problems.append({"field": name, "message": message})
    for name, value in request.path_params.items():
        message = text_problem(str(value), identifier=True)
        if message is not None:
            problems.append({"field": name, "message": message})
    if problems:
        raise InvalidRequestError(problems, "request parameters")
    agent = request.path_params.get("agent_id")
    if isinstance(agent, str):
        # An agent is addressed by its id or its name (corral.daemon._names): the endpoint
        # is given the id.
        request.path_params["agent_id"] = api_of(request).resolve(agent)


def body_route(
    method: str,
    path: str,
    endpoint: Endpoint,
    summary: str,
    body: type[RequestBody],
    **options: Any,
) -> ApiRoute:
    """An :class:`ApiRoute` whose body is a :class:`RequestBody` (``required`` its own)."""
    return ApiRoute(
        method, path, endpoint, summary, body=body, body_required=body.required, **options
    )


# --- the caller -------------------------------------------------------------------------------


def caller_of(request: Request) -> Caller | None:
    """Who the request is from, as the gate identified it by its token (None: an app
    without a token, used in process)."""
    caller = request.scope.get(CALLER_SCOPE_KEY)
    return caller if isinstance(caller, Caller) else None


def api_of(request: Request) -> ScopedService:
    """The service as the request's caller sees it (see :func:`caller_of`)."""
    trusted: ScopedService = request.app.state.api
    return trusted.as_caller(caller_of(request))


def command_response(result: CommandResult, headers: dict[str, str] | None = None) -> JSONResponse:
    """A command's answer, with ``Idempotency-Replayed`` when its key replayed it."""
    extra = dict(headers or {})
    if result.replayed:
        extra["Idempotency-Replayed"] = "true"
    return JSONResponse(result.body, status_code=result.status, headers=extra)
