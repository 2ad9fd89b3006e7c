"""The routes of an agent in its own process (harness ``external``): ``POST
/agents/{id}/turns`` begins a turn, ``POST /agents/{id}/turns/{n}/end`` reports how it ended
(see ``corral.daemon._external`` and docs/daemon.md, "Agents in their own process").

Scoped as the other agent routes, and more: an agent's token begins and ends its own turns
only.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import Path, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from corral.daemon._errors import InvalidRequestError
from corral.daemon._external import Report, error_text
from corral.daemon._http._common import RequestBody, api_of, body_route, command_response, errors
from corral.daemon._http._turns import MAX_TURN
from corral.daemon._turns import MAX_TOKENS

# --- request bodies ---------------------------------------------------------------------------


class BeginTurnBody(RequestBody):
    """``POST /agents/{id}/turns``: the turn's ``prompt`` (what the agent was asked)."""

    what = "turn"
    required = True

    prompt: str = Field(min_length=1)
    idempotency_key: str | None = Field(default=None, min_length=1)


class TurnErrorBody(RequestBody):
    """Why a turn failed: a machine-readable ``code`` and a ``message`` for people."""

    what = "turn error"

    code: str | None = Field(default=None, min_length=1, max_length=200)
    message: str = Field(min_length=1)


class TurnUsageBody(RequestBody):
    """What a turn spent: ``tokens`` (a whole number), ``costUsd`` (dollars; null when
    unknown, which a dollar budget cannot vouch for)."""

    what = "turn usage"

    tokens: int = Field(default=0, ge=0, le=MAX_TOKENS)
    cost_usd: float | None = Field(default=0.0, ge=0, allow_inf_nan=False)


class EndTurnBody(RequestBody):
    """``POST /agents/{id}/turns/{n}/end``: ``ok`` with its ``output``, or ``failed`` with
    its ``error``; ``usage``, what it spent (nothing when left out)."""

    what = "turn end"
    required = True

    outcome: Literal["ok", "failed"]
    output: str | None = None
    error: TurnErrorBody | None = None
    usage: TurnUsageBody | None = None

    def report(self) -> Report:
        """The report, once its fields agree (``InvalidRequestError`` naming each that
        does not)."""
        problems = []
        if self.outcome == "ok" and self.error is not None:
            problems.append({"field": "error", "message": "only with outcome 'failed'"})
        if self.outcome == "failed" and self.output is not None:
            problems.append({"field": "output", "message": "only with outcome 'ok'"})
        if problems:
            raise InvalidRequestError(problems, self.what)
        usage = self.usage or TurnUsageBody()
        error = self.error
        return Report(
            ok=self.outcome == "ok",
            output=self.output or "",
            error=""
            if self.outcome == "ok"
            else error_text(
                None if error is None else error.code, None if error is None else error.message
            ),
            tokens=usage.tokens,
            cost_usd=usage.cost_usd,
        )


# --- endpoints --------------------------------------------------------------------------------


async def begin_turn(agent_id: str, request: Request) -> JSONResponse:
    api = api_of(request)
    api.check_own(agent_id, "beginning the turns")  # refused before the body is read
    body = await BeginTurnBody.read(request)
    result = await api.begin_turn(agent_id, body.prompt, idempotency_key=body.idempotency_key)
    where = {"Location": f"/agents/{agent_id}/turns/{result.body['turn']}"}
    return command_response(result, where if "turn" in result.body else None)


async def end_turn(
    agent_id: str,
    n: Annotated[int, Path(ge=1, le=MAX_TURN, description="The turn's number")],
    request: Request,
) -> JSONResponse:
    api = api_of(request)
    api.check_own(agent_id, "ending the turns")
    body = await EndTurnBody.read(request)
    return JSONResponse(await api.end_turn(agent_id, n, body.report()))


_ERRORS = errors(400, 401, 403, 404, 409, 413, 415, 422, 503)

ROUTES = [
    body_route(
        "POST",
        "/agents/{agent_id}/turns",
        begin_turn,
        "An agent in its own process (harness external) begins a turn",
        BeginTurnBody,
        status_code=201,
        responses=_ERRORS,
    ),
    body_route(
        "POST",
        "/agents/{agent_id}/turns/{n}/end",
        end_turn,
        "An agent in its own process reports how its turn ended (idempotent)",
        EndTurnBody,
        status_code=200,
        responses=_ERRORS,
    ),
]
