"""The oversight routes: an agent asks before it acts, and people answer from one inbox."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Query, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from corral.daemon._approvals import MAX_WAIT_S, Verdict
from corral.daemon._http._agents import BudgetChange
from corral.daemon._http._common import (
    ApiRoute,
    RequestBody,
    api_of,
    body_route,
    command_response,
    errors,
)

# --- request bodies ---------------------------------------------------------------------------


class ActionBody(RequestBody):
    """``POST /agents/{id}/actions``: may the agent do ``action``? ``context`` is kept with
    the decision a person sees; ``waitS`` is how long to wait for a person (0: answer
    ``pending`` at once when one is asked)."""

    what = "action check"
    required = True

    action: str = Field(min_length=1)
    context: dict[str, Any] | None = None
    wait_s: float = Field(default=0.0, ge=0, le=MAX_WAIT_S, allow_inf_nan=False)


class AnswerBody(RequestBody):
    """``POST /decisions/{id}``: the answer (one of the decision's ``answers``) and why.
    ``text`` goes with ``retry`` (the prompt to re-send, default the last one), ``budget``
    with ``budget`` (the dimensions to change). ``by`` is kept as a note: the record names
    the token's owner."""

    what = "answer"
    required = True

    answer: str = Field(min_length=1, max_length=40)
    why: str | None = None
    by: str | None = Field(default=None, min_length=1)
    text: str | None = None
    budget: BudgetChange | None = None
    idempotency_key: str | None = Field(default=None, min_length=1)


# --- endpoints --------------------------------------------------------------------------------


def _verdict_response(verdict: Verdict) -> JSONResponse:
    return JSONResponse(verdict.to_json(), status_code=202 if verdict.verdict == "pending" else 200)


async def check_action(agent_id: str, request: Request) -> JSONResponse:
    api = api_of(request)
    api.check(agent_id)  # out of reach is refused before the body is read
    body = await ActionBody.read(request)
    verdict = await api.check_action(agent_id, body.action, body.context, wait_s=body.wait_s)
    return _verdict_response(verdict)


async def action_verdict(
    decision_id: str,
    request: Request,
    wait_s: Annotated[
        float,
        Query(alias="waitS", ge=0, le=MAX_WAIT_S, description="Seconds to wait for a person"),
    ] = 0.0,
) -> JSONResponse:
    return _verdict_response(await api_of(request).action_verdict(decision_id, wait_s=wait_s))


async def decisions(
    request: Request,
    resolved: Annotated[
        bool, Query(description="The answered decisions instead, newest first")
    ] = False,
) -> JSONResponse:
    return JSONResponse({"decisions": api_of(request).decisions(resolved=resolved)})


async def decision(decision_id: str, request: Request) -> JSONResponse:
    return JSONResponse(api_of(request).decision(decision_id))


async def answer(decision_id: str, request: Request) -> JSONResponse:
    api = api_of(request)
    body = await AnswerBody.read(request)
    budget = None
    if body.budget is not None:
        budget = body.budget.model_dump(by_alias=True, include=body.budget.model_fields_set)
    result = await api.answer(
        decision_id,
        body.answer,
        by=body.by,
        why=body.why,
        text=body.text,
        budget=budget,
        idempotency_key=body.idempotency_key,
    )
    return command_response(result)


# --- the routes -------------------------------------------------------------------------------

_VERDICT: dict[int | str, dict[str, Any]] = {
    202: {
        "description": "A person was asked and has not answered yet: ask again with "
        "GET /actions/{decision}"
    }
}

ROUTES = [
    body_route(
        "POST",
        "/agents/{agent_id}/actions",
        check_action,
        "May the agent do this? Its guardrails answer, or a person",
        ActionBody,
        status_code=200,
        responses={**errors(400, 401, 403, 404, 409, 413, 415, 429, 503), **_VERDICT},
    ),
    ApiRoute(
        "GET",
        "/actions/{decision_id}",
        action_verdict,
        "The verdict of a check a person was asked about (waits up to waitS)",
        responses={**errors(400, 401, 404, 429), **_VERDICT},
    ),
    ApiRoute(
        "GET",
        "/decisions",
        decisions,
        "Everything waiting on a person (or, resolved=true, every answer given)",
        responses=errors(400, 401),
    ),
    ApiRoute(
        "GET",
        "/decisions/{decision_id}",
        decision,
        "One decision",
        responses=errors(400, 401, 404),
    ),
    body_route(
        "POST",
        "/decisions/{decision_id}",
        answer,
        "Answer a decision (approve, deny, retry, stop, budget, reinstate)",
        AnswerBody,
        status_code=200,
        responses=errors(400, 401, 403, 404, 409, 413, 415, 422, 503),
    ),
]
