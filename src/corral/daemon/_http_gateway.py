"""The gateway's routes in the HTTP API (a daemon started with ``--db NAME=DSN``).

- ``GET /gateway``: the databases (name, dialect, tables, agents frozen).
- ``GET /gateway/{target}/schema``: the tables and columns agents may use.
- ``POST /gateway/query``: one request, ``{"target", "agent", ...}`` where the rest is the
  gateway's own request: ``{"sql", "params"}`` or ``{"op", "table", "where", ...}``, with
  ``idempotencyKey`` / ``planHash`` (or their snake_case spellings) on writes. ``target``
  may be left out when the daemon fronts one database. An agent's token queries as that
  agent (``agent`` may be left out, or must name it).
- ``GET /gateway/{target}/agents/{agent}``: the agent's breakers now.
- ``GET /gateway/{target}/agents/{agent}/history``: its freezes and reinstatements.
- ``POST /gateway/{target}/agents/{agent}/freeze`` ``{"reason", "by"}``.
- ``POST /gateway/{target}/agents/{agent}/reinstate`` ``{"by", "reason"}``: a person's
  decision, so an agent's token is refused (403).

A gateway refusal answers with the status of its code (400 refused at parse or invalid data,
408 statement timeout, 409 key in flight, outcome unknown, constraint violation or
transaction conflict, 422 idempotency conflict, 423 agent frozen, 429 pool exhausted, 500
database error, 503 database unavailable) and the usual error body.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import ConfigDict, Field

from corral.daemon._databases import Databases
from corral.daemon._errors import OutOfScopeError
from corral.daemon._http import (
    InvalidRequestError,
    _Body,
    _body,
    _errors,
    _json_value,
    _model,
    _principal,
    _request_body,
    check_scope,
)
from corral.daemon._service import AgentService


class QueryBody(_Body):
    """``POST /gateway/query``: which database, which agent, and the request itself."""

    model_config = ConfigDict(extra="allow")

    target: str | None = Field(
        default=None, min_length=1, description="The database's name (--db NAME=...)"
    )
    agent: str | None = Field(
        default=None, min_length=1, description="The agent making the request"
    )
    sql: str | None = Field(default=None, description="A SQL statement ($1, $2... parameters)")
    params: list[Any] | None = None
    op: str | None = Field(default=None, description="find, count, insert, update or delete")
    table: str | None = None
    where: dict[str, Any] | None = None
    idempotency_key: str | None = Field(default=None, description="Required on writes")
    plan_hash: str | None = None


class FreezeBody(_Body):
    """``POST /gateway/{target}/agents/{agent}/freeze``."""

    reason: str = Field(min_length=1)
    by: str | None = Field(default=None, min_length=1)


class ReinstateBody(_Body):
    """``POST /gateway/{target}/agents/{agent}/reinstate``: who decides and why."""

    by: str = Field(min_length=1)
    reason: str = Field(min_length=1)


_BODIES = (QueryBody, FreezeBody, ReinstateBody)

_GATEWAY_ERRORS = {
    **_errors(400, 401, 403, 404, 409, 413, 415, 422, 503),
    408: {"description": "The statement ran past the agent's statement timeout (retryable)"},
    423: {"description": "The agent is frozen in this database until a person reinstates it"},
    429: {"description": "The agent's connections are all in use (retryable)"},
}


def add_gateway_routes(app: FastAPI, service: AgentService, databases: Databases) -> None:
    """Route the gateway's endpoints (see the module docstring) to ``databases``."""
    app.state.body_models = (*getattr(app.state, "body_models", ()), *_BODIES)

    @app.get("/gateway", summary="The databases the daemon fronts", responses=_errors(401))
    async def targets() -> JSONResponse:
        return JSONResponse({"targets": databases.targets()})

    @app.get(
        "/gateway/{target}/schema",
        summary="The tables and columns agents may use",
        responses=_errors(401, 404),
    )
    async def schema(target: str) -> JSONResponse:
        return JSONResponse(databases.schema(target))

    @app.post(
        "/gateway/query",
        summary="Run one SQL request or structured operation for an agent",
        responses=_GATEWAY_ERRORS,
        openapi_extra=_request_body(QueryBody, required=True),
    )
    async def query(request: Request) -> JSONResponse:
        data = _json_value(await _body(request))
        if not isinstance(data, dict):
            raise InvalidRequestError(
                [{"field": "(body)", "message": "a JSON object is required"}], "gateway request"
            )
        target = data.pop("target", None)
        agent = data.pop("agent", None)
        problems = []
        for name, value in (("target", target), ("agent", agent)):
            if value is not None and not (isinstance(value, str) and value):
                problems.append({"field": name, "message": "must be a non-empty string"})
        principal = _principal(request)
        if principal is None and agent is None and not problems:
            problems.append({"field": "agent", "message": "required: the agent making it"})
        if problems:
            raise InvalidRequestError(problems, "gateway request")
        if principal is not None:
            if agent is not None and agent != principal:
                raise OutOfScopeError(principal, f"queries as agent {agent!r}")
            agent = principal
        answer = await databases.query(target, agent, data)
        headers = {"Idempotency-Replayed": "true"} if answer["status"] == "replayed" else None
        return JSONResponse(answer, headers=headers)

    @app.get(
        "/gateway/{target}/agents/{agent_id}",
        summary="An agent's breakers in one database",
        responses=_errors(400, 401, 403, 404),
    )
    async def status(target: str, agent_id: str, request: Request) -> JSONResponse:
        check_scope(service, request, agent_id)
        return JSONResponse(databases.status(target, agent_id))

    @app.get(
        "/gateway/{target}/agents/{agent_id}/history",
        summary="An agent's freezes and reinstatements in one database, oldest first",
        responses=_errors(400, 401, 403, 404),
    )
    async def history(target: str, agent_id: str, request: Request) -> JSONResponse:
        check_scope(service, request, agent_id)
        return JSONResponse({"history": await databases.history(target, agent_id)})

    @app.post(
        "/gateway/{target}/agents/{agent_id}/freeze",
        summary="Freeze an agent in one database (idempotent)",
        responses=_errors(400, 401, 403, 404, 413, 415),
        openapi_extra=_request_body(FreezeBody, required=True),
    )
    async def freeze(target: str, agent_id: str, request: Request) -> JSONResponse:
        check_scope(service, request, agent_id)
        body = _model(FreezeBody, await _body(request) or b"{}", "freeze body")
        by = body.by
        principal = _principal(request)
        if principal is not None:
            # An agent freezes in its own name: the record must not say a person did it.
            if by is not None and by != principal:
                raise OutOfScopeError(principal, f"freezing in the name of {by!r}")
            by = principal
        return JSONResponse(await databases.freeze(target, agent_id, reason=body.reason, by=by))

    @app.post(
        "/gateway/{target}/agents/{agent_id}/reinstate",
        summary="Reinstate a frozen agent: a person's decision, recorded with by and reason",
        responses=_errors(400, 401, 403, 404, 413, 415),
        openapi_extra=_request_body(ReinstateBody, required=True),
    )
    async def reinstate(target: str, agent_id: str, request: Request) -> JSONResponse:
        principal = _principal(request)
        if principal is not None:
            raise OutOfScopeError(principal, "reinstating a frozen agent (a person decides)")
        body = _model(ReinstateBody, await _body(request) or b"{}", "reinstate body")
        return JSONResponse(
            await databases.reinstate(target, agent_id, by=body.by, reason=body.reason)
        )
