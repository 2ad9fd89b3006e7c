"""``PATCH /agents/{id}``: change what may change of a live agent (see corral.daemon._patch)."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import Field

from corral.daemon._errors import InvalidRequestError
from corral.daemon._http._agents import BudgetChange
from corral.daemon._http._common import (
    RequestBody,
    api_of,
    body_route,
    command_response,
    errors,
)
from corral.daemon.guardrails import MAX_RULES

MAX_WHY_CHARS = 2_000


class PatchBody(RequestBody):
    """``PATCH /agents/{id}``: a JSON merge patch of what may change while the agent lives,
    recorded with who and why (``why`` required). A field left out stays as it is;
    ``budget`` changes the dimensions it gives (``null`` in one lifts it); ``notifyOn`` and
    ``guardrails`` replace the agent's whole list (``null``: none). Unknown fields are
    refused."""

    what = "patch body"
    required = True

    budget: BudgetChange | None = None
    notify_on: list[str] | None = None
    guardrails: list[dict[str, Any]] | None = Field(default=None, max_length=MAX_RULES)
    by: str | None = Field(default=None, min_length=1)
    why: str = Field(min_length=1, max_length=MAX_WHY_CHARS)
    idempotency_key: str | None = Field(default=None, min_length=1)

    def changes(self) -> dict[str, Any]:
        """What to change, camelCase; ``InvalidRequestError`` when it changes nothing."""
        given = self.model_fields_set
        problems = []
        found: dict[str, Any] = {}
        if "budget" in given:
            if self.budget is None or not self.budget.model_fields_set:
                problems.append(
                    {"field": "budget", "message": "must change at least one dimension"}
                )
            else:
                found["budget"] = self.budget.model_dump(
                    by_alias=True, include=self.budget.model_fields_set
                )
        if "notify_on" in given:
            found["notifyOn"] = self.notify_on
        if "guardrails" in given:
            found["guardrails"] = self.guardrails
        if not found and not problems:
            problems.append(
                {"field": "(body)", "message": "must change budget, notifyOn or guardrails"}
            )
        if problems:
            raise InvalidRequestError(problems, self.what)
        return found


async def patch(agent_id: str, request: Request) -> JSONResponse:
    api = api_of(request)
    api.check(agent_id)  # out of reach is refused before the body is read
    body = await PatchBody.read(request)
    result = await api.patch(
        agent_id, body.changes(), by=body.by, why=body.why, idempotency_key=body.idempotency_key
    )
    return command_response(result)


ROUTES = [
    body_route(
        "PATCH",
        "/agents/{agent_id}",
        patch,
        "Change a live agent: its budget (releases an agent held on its budget), notifyOn, "
        "guardrails",
        PatchBody,
        status_code=200,
        responses=errors(400, 401, 403, 404, 409, 413, 415, 422, 503),
    ),
]
