"""The routes of named operator tokens: make one (its secret shown once), list them, revoke
one. A person's business: an agent's token is refused (403 ``out_of_scope``)."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import Field

from corral.daemon._http._common import (
    ApiRoute,
    ErrorBody,
    RequestBody,
    api_of,
    body_route,
    errors,
)
from corral.daemon._tokens import MAX_NAME


class TokenBody(RequestBody):
    """``POST /tokens``: the new token's name (a letter, then letters, digits, ``_``, ``.``,
    ``@`` or ``-``; at most 64 characters; not ``operator``)."""

    what = "token body"
    required = True

    # Checked by the service (one message for every way a name is wrong); described here.
    name: str = Field(
        min_length=1,
        json_schema_extra={"maxLength": MAX_NAME, "pattern": r"^[A-Za-z][A-Za-z0-9_.@-]*$"},
    )


async def create_token(request: Request) -> JSONResponse:
    api = api_of(request)
    api.check_operator("making an operator token")  # before the body is read
    body = await TokenBody.read(request)
    made = await api.create_token(body.name)
    return JSONResponse(made, status_code=201, headers={"Cache-Control": "no-store"})


async def list_tokens(request: Request) -> JSONResponse:
    return JSONResponse({"tokens": api_of(request).tokens()})


async def revoke_token(name: str, request: Request) -> JSONResponse:
    return JSONResponse(await api_of(request).revoke_token(name))


def _said(status: int, description: str) -> dict[int | str, dict[str, object]]:
    return {status: {"model": ErrorBody, "description": description}}


ROUTES = [
    body_route(
        "POST",
        "/tokens",
        create_token,
        "Make a named operator token (its secret is in this answer only)",
        TokenBody,
        status_code=201,
        responses={
            **errors(400, 401, 403, 413, 415, 503),
            **_said(409, "A live token has that name (or it is `operator`)"),
        },
    ),
    ApiRoute(
        "GET",
        "/tokens",
        list_tokens,
        "The live named operator tokens (names, never secrets)",
        responses=errors(401, 403),
    ),
    ApiRoute(
        "DELETE",
        "/tokens/{name}",
        revoke_token,
        "Revoke a named operator token, from the next request on",
        responses={**errors(401, 403, 503), **_said(404, "No live token of that name")},
    ),
]
