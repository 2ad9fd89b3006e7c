"""The gateway's routes (a daemon started with ``--db NAME=DSN``): its databases, one request
for an agent, and an agent's breakers, freezes and reinstatements (docs/gateway.md)."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from corral.daemon._errors import InvalidRequestError
from corral.daemon._http._common import (
    ApiRoute,
    RequestBody,
    api_of,
    body_route,
    errors,
    json_value,
    read_body,
)
from corral.daemon._text import json_problems

# --- request bodies ---------------------------------------------------------------------------


class QueryBody(RequestBody):
    """``POST /gateway/query``: which database, which agent, and the request itself."""

    model_config = ConfigDict(extra="allow")
    required = True

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

    @staticmethod
    async def read_request(
        request: Request, *, operator: bool
    ) -> tuple[str | None, str | None, dict[str, Any]]:
        """``(target, agent, the gateway's request)``. The gateway checks the request itself
        (with its own codes), so only ``target`` and ``agent`` are read here; ``operator``
        (the daemon's token) must name the agent."""
        data = json_value(await read_body(request))
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
            elif value is not None:
                problems += json_problems({name: value})
        if operator and agent is None and not problems:
            problems.append({"field": "agent", "message": "required: the agent making it"})
        if problems:
            raise InvalidRequestError(problems, "gateway request")
        return target, agent, data


class FreezeBody(RequestBody):
    """``POST /gateway/{target}/agents/{agent}/freeze``."""

    what = "freeze body"
    required = True

    reason: str = Field(min_length=1)
    by: str | None = Field(default=None, min_length=1)


class ReinstateBody(RequestBody):
    """``POST /gateway/{target}/agents/{agent}/reinstate``: why (and ``by``, kept as a note:
    the record names the token's owner)."""

    what = "reinstate body"
    required = True

    by: str | None = Field(default=None, min_length=1)
    reason: str = Field(min_length=1)


# --- answers (described in the OpenAPI document) ----------------------------------------------


_ANSWER = ConfigDict(alias_generator=to_camel)


class TargetLimitsAnswer(BaseModel):
    """What a database's gateway enforces on every request."""

    model_config = _ANSWER

    max_rows: int = Field(description="Rows per answer at most (then `truncated`)")
    max_bytes: int = Field(
        description="Bytes of values per answer at most (then `truncated`, or "
        "`result_too_large` for a first row over it)"
    )
    max_statement_chars: int = Field(description="Longest statement taken")
    statement_timeout_s: float = Field(description="Per statement, in seconds")
    agent_role: bool = Field(
        description="Whether agents' SQL runs as a role of its own (which one is not shown)"
    )


class TargetAnswer(BaseModel):
    """One database the daemon fronts (its DSN is never shown)."""

    model_config = _ANSWER

    name: str
    dialect: str = Field(description="postgresql or sqlite")
    tables: int = Field(description="Tables agents may use")
    frozen_agents: int = Field(description="Agents frozen there")
    limits: TargetLimitsAnswer | None = Field(
        description="Null only for a gateway the daemon was handed already open (from Python)"
    )


class TargetsAnswer(BaseModel):
    """``GET /gateway``."""

    targets: list[TargetAnswer]


# --- endpoints --------------------------------------------------------------------------------


async def targets(request: Request) -> JSONResponse:
    return JSONResponse({"targets": api_of(request).targets()})


async def schema(target: str, request: Request) -> JSONResponse:
    return JSONResponse(api_of(request).schema(target))


async def query(request: Request) -> JSONResponse:
    api = api_of(request)
    target, agent, data = await QueryBody.read_request(request, operator=api.principal is None)
    answer = await api.query(target, agent, data)
    headers = {"Idempotency-Replayed": "true"} if answer["status"] == "replayed" else None
    return JSONResponse(answer, headers=headers)


async def status(target: str, agent_id: str, request: Request) -> JSONResponse:
    return JSONResponse(api_of(request).status(target, agent_id))


async def history(target: str, agent_id: str, request: Request) -> JSONResponse:
    return JSONResponse({"history": await api_of(request).history(target, agent_id)})


async def freeze(target: str, agent_id: str, request: Request) -> JSONResponse:
    api = api_of(request)
    api.check(agent_id)  # out of reach is refused before the body is read
    body = await FreezeBody.read(request)
    return JSONResponse(await api.freeze(target, agent_id, reason=body.reason, by=body.by))


async def reinstate(target: str, agent_id: str, request: Request) -> JSONResponse:
    api = api_of(request)
    api.check_reinstate()  # refused before the body is read
    body = await ReinstateBody.read(request)
    return JSONResponse(await api.reinstate(target, agent_id, by=body.by, reason=body.reason))


# --- the routes -------------------------------------------------------------------------------

_QUERY_ERRORS = {
    **errors(400, 401, 403, 404, 409, 413, 415, 422, 503),
    408: {"description": "The statement ran past the agent's statement timeout (retryable)"},
    423: {"description": "The agent is frozen in this database until a person reinstates it"},
    429: {"description": "The agent's connections are all in use (retryable)"},
}

ROUTES = [
    ApiRoute(
        "GET",
        "/gateway",
        targets,
        "The databases the daemon fronts, with the limits each enforces",
        responses={
            200: {"model": TargetsAnswer, "description": "The databases, by name"},
            **errors(401),
        },
    ),
    ApiRoute(
        "GET",
        "/gateway/{target}/schema",
        schema,
        "The tables and columns agents may use",
        responses=errors(401, 404),
    ),
    body_route(
        "POST",
        "/gateway/query",
        query,
        "Run one SQL request or structured operation for an agent",
        QueryBody,
        responses=_QUERY_ERRORS,
    ),
    ApiRoute(
        "GET",
        "/gateway/{target}/agents/{agent_id}",
        status,
        "An agent's breakers in one database",
        responses=errors(400, 401, 403, 404),
    ),
    ApiRoute(
        "GET",
        "/gateway/{target}/agents/{agent_id}/history",
        history,
        "An agent's freezes and reinstatements in one database, oldest first",
        responses=errors(400, 401, 403, 404),
    ),
    body_route(
        "POST",
        "/gateway/{target}/agents/{agent_id}/freeze",
        freeze,
        "Freeze an agent in one database (idempotent)",
        FreezeBody,
        responses=errors(400, 401, 403, 404, 413, 415),
    ),
    body_route(
        "POST",
        "/gateway/{target}/agents/{agent_id}/reinstate",
        reinstate,
        "Reinstate a frozen agent: a person's decision, recorded with by and reason",
        ReinstateBody,
        responses=errors(400, 401, 403, 404, 413, 415),
    ),
]
