"""The routes of runs: a run's tree (``GET /runs/{id}``) and stopping a whole run."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import Field

from corral.daemon._http._common import (
    ApiRoute,
    RequestBody,
    api_of,
    body_route,
    command_response,
    errors,
)


class RunStopBody(RequestBody):
    """``POST /runs/{id}/stop`` (the body itself is optional): who stops it and why, kept on
    every agent it stops."""

    what = "run stop body"

    by: str | None = Field(default=None, min_length=1)
    why: str | None = None
    idempotency_key: str | None = Field(default=None, min_length=1)


async def get_run(run_id: str, request: Request) -> JSONResponse:
    return JSONResponse(api_of(request).run(run_id))


async def stop_run(run_id: str, request: Request) -> JSONResponse:
    api = api_of(request)
    body = await RunStopBody.read(request)
    result = await api.stop_run(
        run_id, by=body.by, why=body.why, idempotency_key=body.idempotency_key
    )
    return command_response(result)


ROUTES = [
    ApiRoute(
        "GET",
        "/runs/{run_id}",
        get_run,
        "A run's tree: each agent's state and usage against its limits, and the headcount",
        responses=errors(401, 403, 404),
    ),
    body_route(
        "POST",
        "/runs/{run_id}/stop",
        stop_run,
        "Stop every agent of a run, children first, with one reason",
        RunStopBody,
        status_code=202,
        responses=errors(400, 401, 403, 404, 409, 413, 415, 422, 503),
    ),
]
