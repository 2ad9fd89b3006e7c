"""What guards every console request: the answer headers (CSP, no framing), the origin rule
and the form token of state-changing requests, and forms read within a size limit."""

from __future__ import annotations

from typing import Final
from urllib.parse import parse_qs, urlsplit

from starlette.requests import Request

from corral.console._errors import CsrfRefusedError, FormInvalidError
from corral.console._sessions import Session, same_secret
from corral.daemon._errors import InvalidRequestError
from corral.daemon._http._common import ForbiddenOriginError
from corral.daemon._text import text_problem

MAX_FORM_BYTES: Final = 64 * 1024
"""The largest form body the console reads (a prompt, a reason)."""

MAX_FIELD_CHARS: Final = 16_000
"""The longest value of one form field."""

CSRF_FIELD: Final = "csrf"
CSRF_HEADER: Final = "x-corral-csrf"

HEADERS: Final = {
    # No inline script or style, nothing from elsewhere, no framing, no plugins.
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def own_origin(request: Request) -> str:
    """The origin the request was sent to: its scheme and its Host header."""
    host = request.headers.get("host") or ""
    return f"{request.url.scheme}://{host}".lower()


def check_origin(request: Request, *, vouched: bool = False) -> None:
    """A state-changing request must come from a console page of this very origin: an
    ``Origin`` header naming another (another site, another port of the same host, a DNS
    name rebound here) is refused, as is a browser's ``Sec-Fetch-Site`` saying cross-site.
    SameSite cookies alone would not do: every port of ``localhost`` is the same site.

    With ``vouched`` (the login, which has no session's form token to check) one of the two
    headers must be there to say so: every current browser sends ``Origin`` with a POST."""
    origin = request.headers.get("origin")
    if vouched and origin is None and request.headers.get("sec-fetch-site") is None:
        raise ForbiddenOriginError("(none: neither Origin nor Sec-Fetch-Site was sent)")
    if origin is not None:
        parts = urlsplit(origin)
        if origin == "null" or f"{parts.scheme}://{parts.netloc}".lower() != own_origin(request):
            raise ForbiddenOriginError(origin[:200])
    fetch_site = request.headers.get("sec-fetch-site")
    if fetch_site is not None and fetch_site not in ("same-origin", "none"):
        raise ForbiddenOriginError(f"(Sec-Fetch-Site: {fetch_site[:40]})")


async def read_form(request: Request) -> dict[str, str]:
    """The urlencoded form of ``request``: at most :data:`MAX_FORM_BYTES`, one value per
    field, each of text the daemon can store (``FormInvalidError`` otherwise)."""
    media = (request.headers.get("content-type") or "").split(";", 1)[0].strip().lower()
    if media != "application/x-www-form-urlencoded":
        raise FormInvalidError("(body)", f"must be a urlencoded form, got {media or 'nothing'!r}")
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > MAX_FORM_BYTES):
        raise FormInvalidError("(body)", f"larger than {MAX_FORM_BYTES} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise FormInvalidError("(body)", f"larger than {MAX_FORM_BYTES} bytes")
    try:
        text = body.decode("utf-8")
        parsed = parse_qs(text, keep_blank_values=True, strict_parsing=False, max_num_fields=20)
    except (UnicodeDecodeError, ValueError) as exc:
        raise FormInvalidError("(body)", f"cannot be read: {exc}") from None
    form: dict[str, str] = {}
    for name, values in parsed.items():
        if len(values) != 1:
            raise FormInvalidError(name[:40], "given more than once")
        value = values[0]
        if len(value) > MAX_FIELD_CHARS:
            raise FormInvalidError(name[:40], f"longer than {MAX_FIELD_CHARS} characters")
        problem = text_problem(value)
        if problem is not None:
            raise InvalidRequestError([{"field": name[:40], "message": problem}], "form")
        form[name] = value
    return form


def check_csrf(request: Request, form: dict[str, str], session: Session) -> None:
    """The form (or the header) must carry the session's form token."""
    given = form.get(CSRF_FIELD) or request.headers.get(CSRF_HEADER)
    if given is None:
        raise CsrfRefusedError("the form token is missing")
    if not same_secret(given, session.csrf):
        raise CsrfRefusedError("the form token is not this session's")
