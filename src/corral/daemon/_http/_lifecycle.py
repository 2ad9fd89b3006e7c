"""The routes of an ended agent's lifecycle: ``POST /agents/{id}/restart`` and
``DELETE /agents/{id}`` (see ``corral.daemon._lifecycle``)."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import Field

from corral.daemon._http._common import (
    RequestBody,
    api_of,
    body_route,
    command_response,
    errors,
)


class LifecycleBody(RequestBody):
    """``POST /agents/{id}/restart``, ``DELETE /agents/{id}`` (the body itself is optional):
    who does it and why, kept in the log."""

    what = "lifecycle body"

    by: str | None = Field(default=None, min_length=1)
    why: str | None = None
    idempotency_key: str | None = Field(default=None, min_length=1)


async def restart(agent_id: str, request: Request) -> JSONResponse:
    api = api_of(request)
    api.check(agent_id)  # out of reach is refused before the body is read
    body = await LifecycleBody.read(request)
    result = await api.restart(
        agent_id, by=body.by, why=body.why, idempotency_key=body.idempotency_key
    )
    return command_response(result)


async def delete(agent_id: str, request: Request) -> JSONResponse:
    api = api_of(request)
    body = await LifecycleBody.read(request)
    result = await api.delete(
        agent_id, by=body.by, why=body.why, idempotency_key=body.idempotency_key
    )
    return command_response(result)


_ERRORS = errors(400, 401, 403, 404, 409, 413, 415, 422, 503)

ROUTES = [
    body_route(
        "POST",
        "/agents/{agent_id}/restart",
        restart,
        "Run a stopped or failed agent again (its spec, session and working directory)",
        LifecycleBody,
        status_code=202,
        responses=_ERRORS,
    ),
    body_route(
        "DELETE",
        "/agents/{agent_id}",
        delete,
        "Delete an ended agent and its descendants (their events stay in the log)",
        LifecycleBody,
        status_code=200,
        responses=_ERRORS,
    ),
]
