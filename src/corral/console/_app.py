"""The console as an ASGI app in front of the daemon's HTTP API: ``/`` and ``/console/...``
are the console's; every other path goes to the API unchanged (its gate, its token).

The console does not call the API over HTTP: it is in the same process, so it calls the
same :class:`~corral.daemon._api.ScopedService` the API's routes call, as the logged-in
person (``as_caller``): same scope, same checks, same records (``by`` is the token's name).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from importlib import resources
from pathlib import PurePosixPath
from typing import Any, Final
from urllib.parse import quote, urlsplit

import jinja2
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from corral.console import _pages, _stream
from corral.console._errors import LoginRefusedError, SessionRequiredError
from corral.console._security import HEADERS, check_csrf, check_origin, read_form
from corral.console._sessions import Session, Sessions
from corral.daemon._api import ScopedService
from corral.daemon._auth import Caller, sendable
from corral.daemon._callers import Callers
from corral.daemon._status import http_status
from corral.daemon._text import visible
from corral.kernel import SYSTEM_CLOCK, Clock, CorralError, InvalidArgumentError

logger = logging.getLogger("corral.console")

PREFIX: Final = "/console"
"""Every console path but the home page (``/``) is under this."""

MAX_TOKEN_CHARS: Final = 512

Handler = Callable[[Request], Awaitable[Response]]


class Console:
    """The console in front of ``api_app`` (the app of :func:`corral.daemon.create_app`,
    whose ``state`` has the scoped API and the token identification): an ASGI app that
    serves ``/`` and ``/console/...`` itself and passes everything else to ``api_app``.

    ``idle_s`` and ``max_age_s`` bound a session (see :class:`._sessions.Sessions`);
    ``heartbeat_s`` spaces the live stream's heartbeats. Raises ``InvalidArgumentError``
    when ``api_app`` has no token identification (an app made without a token: the console
    needs people to log in).
    """

    def __init__(
        self,
        api_app: Any,
        *,
        idle_s: float = 8 * 3600.0,
        max_age_s: float = 24 * 3600.0,
        heartbeat_s: float = 15.0,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        state = getattr(api_app, "state", None)
        callers = getattr(state, "callers", None)
        api = getattr(state, "api", None)
        if not isinstance(callers, Callers) or not isinstance(api, ScopedService):
            raise InvalidArgumentError(
                "Console", "api_app", "the app of create_app(service, token=...)", api_app
            )
        self.api_app: ASGIApp = api_app
        self.api = api
        self.sessions = Sessions(callers, idle_s=idle_s, max_age_s=max_age_s, clock=clock)
        self.heartbeat_s = heartbeat_s
        self.templates = _templates()
        self.app = Starlette(routes=self._routes())
        self.app.state.console = self

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and is_console_path(scope["path"]):
            await self.app(scope, receive, _with_headers(send))
            return
        await self.api_app(scope, receive, send)

    # --- routes -------------------------------------------------------------------------------

    def _routes(self) -> list[Route]:
        page = self._page
        act = self._action
        return [
            Route("/", page(_pages.waiting), methods=["GET"]),
            Route(PREFIX, _home_redirect, methods=["GET"]),
            Route(f"{PREFIX}/", _home_redirect, methods=["GET"]),
            Route(f"{PREFIX}/login", self._guarded(self._login_page), methods=["GET"]),
            Route(f"{PREFIX}/login", self._guarded(self._login), methods=["POST"]),
            Route(f"{PREFIX}/logout", act(self._logout), methods=["POST"]),
            Route(f"{PREFIX}/agents", page(_pages.agents), methods=["GET"]),
            Route(f"{PREFIX}/agents/{{agent_id}}", page(_pages.agent), methods=["GET"]),
            Route(
                f"{PREFIX}/agents/{{agent_id}}/turns/{{n:int}}", page(_pages.turn), methods=["GET"]
            ),
            Route(
                f"{PREFIX}/agents/{{agent_id}}/{{command}}", act(_pages.command), methods=["POST"]
            ),
            Route(f"{PREFIX}/decisions/{{decision_id}}", act(_pages.answer), methods=["POST"]),
            Route(f"{PREFIX}/events", page(_pages.events), methods=["GET"]),
            Route(f"{PREFIX}/databases", page(_pages.databases), methods=["GET"]),
            Route(f"{PREFIX}/stream", self._guarded(self._stream), methods=["GET"]),
            Route(f"{PREFIX}/static/{{name}}", self._guarded(_static), methods=["GET"]),
            Route(f"{PREFIX}/{{rest:path}}", self._guarded(_not_found)),
        ]

    def _guarded(self, handler: Handler) -> Handler:
        """Every answer with the security headers; every refusal as a typed error page."""

        async def run(request: Request) -> Response:
            try:
                response = await handler(request)
            except CorralError as exc:
                response = self.error_page(request, exc)
            except Exception:
                logger.exception("console: unexpected error answering %s", request.url.path)
                from corral.daemon._http._common import InternalError

                response = self.error_page(request, InternalError())
            for name, value in HEADERS.items():
                response.headers.setdefault(name, value)
            return response

        return run

    def _page(self, view: Callable[[Request, View], Awaitable[Response]]) -> Handler:
        """A page: needs a session (else to the login page, coming back here after)."""

        async def run(request: Request) -> Response:
            session = self.session_of(request)
            if session is None:
                if request.headers.get(_pages.FRAGMENT_HEADER):
                    raise SessionRequiredError()
                here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                return RedirectResponse(f"{PREFIX}/login?next={quote(here)}", status_code=303)
            return await view(request, View(self, request, session))

        return self._guarded(run)

    def _action(
        self, act: Callable[[Request, View, dict[str, str]], Awaitable[Response]]
    ) -> Handler:
        """A state-changing request: the origin rule, then a session, then its form token;
        only then is the form acted on."""

        async def run(request: Request) -> Response:
            check_origin(request)
            session = self.session_of(request)
            if session is None:
                raise SessionRequiredError()
            form = await read_form(request)
            check_csrf(request, form, session)
            return await act(request, View(self, request, session), form)

        return self._guarded(run)

    # --- login, logout, the stream -------------------------------------------------------

    async def _login_page(self, request: Request) -> Response:
        if self.session_of(request) is not None:
            return RedirectResponse(_next_of(request.query_params.get("next")), status_code=303)
        return self.render(
            request, "login.html", {"next": _next_of(request.query_params.get("next"))}
        )

    async def _login(self, request: Request) -> Response:
        check_origin(request, vouched=True)  # login CSRF: no session's form token yet
        form = await read_form(request)
        token = form.get("token", "").strip()
        target = _next_of(form.get("next"))
        try:
            caller = self._operator(token)
        except LoginRefusedError as exc:
            context = {"next": target, "refusal": exc}
            return self.render(request, "login.html", context, status=401)
        session = self.sessions.open(token, caller)
        redirect = RedirectResponse(target, status_code=303)
        redirect.set_cookie(
            cookie_name(request),
            session.id,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path="/",
        )
        logger.info("console: %s logged in", caller.name)
        return redirect

    def _operator(self, token: str) -> Caller:
        if not token:
            raise LoginRefusedError("no token given")
        if len(token) > MAX_TOKEN_CHARS or not sendable(token):
            raise LoginRefusedError("that is not a token of this daemon")
        caller = self.sessions.identify(token)
        if caller is None:
            raise LoginRefusedError("that is not a token of this daemon (or it was revoked)")
        if not caller.is_operator:
            raise LoginRefusedError(
                "an agent's token cannot open the console: log in with the daemon's token or "
                "a person's token (corral token create NAME)"
            )
        return caller

    async def _logout(self, request: Request, view: View, form: dict[str, str]) -> Response:
        self.sessions.close(view.session.id)
        response = RedirectResponse(f"{PREFIX}/login", status_code=303)
        response.delete_cookie(cookie_name(request), path="/", httponly=True, samesite="strict")
        return response

    async def _stream(self, request: Request) -> Response:
        session = self.session_of(request)
        if session is None:
            raise SessionRequiredError()
        return _stream.response(self, request, session)

    # --- helpers ------------------------------------------------------------------------------

    def session_of(self, request: Request) -> Session | None:
        return self.sessions.get(request.cookies.get(cookie_name(request)))

    def scoped(self, session: Session) -> ScopedService:
        """The API as the session's person sees it (their name on what they do)."""
        return self.api.as_caller(Caller(session.name))

    def render(
        self,
        request: Request,
        template: str,
        context: dict[str, Any],
        *,
        status: int = 200,
        session: Session | None = None,
    ) -> HTMLResponse:
        body = self.templates.get_template(template).render(
            {"prefix": PREFIX, "path": request.url.path, "session": session, **context}
        )
        return HTMLResponse(body, status_code=status)

    def error_page(self, request: Request, error: CorralError) -> HTMLResponse:
        session = self.session_of(request)
        status = http_status(error)
        if request.headers.get(_pages.FRAGMENT_HEADER):
            return HTMLResponse("", status_code=status)
        return self.render(
            request,
            "error.html",
            {"error": error, "status": status},
            status=status,
            session=session,
        )


class View:
    """What a page or an action handler gets: the console, the request, the session, and
    the API as the session's person."""

    __slots__ = ("api", "console", "request", "session")

    def __init__(self, console: Console, request: Request, session: Session) -> None:
        self.console = console
        self.request = request
        self.session = session
        self.api = console.scoped(session)

    def render(
        self, template: str, context: dict[str, Any], fragments: dict[str, str] | None = None
    ) -> HTMLResponse:
        """The page, or only the fragment the live script asked for (``X-Corral-Fragment``)."""
        wanted = self.request.headers.get(_pages.FRAGMENT_HEADER)
        if wanted is not None and fragments and wanted in fragments:
            template = fragments[wanted]
        return self.console.render(self.request, template, context, session=self.session)


_RAW_HEADERS: Final = [(k.lower().encode(), v.encode()) for k, v in HEADERS.items()]


def _with_headers(send: Send) -> Send:
    """``send`` that adds the security headers an answer lacks: also to the answers no
    console handler makes (a method a route does not take, 405, answered by the router)."""

    async def sending(message: Any) -> None:
        if message["type"] == "http.response.start":
            headers = list(message.get("headers", []))
            present = {name.lower() for name, _ in headers}
            headers += [(k, v) for k, v in _RAW_HEADERS if k not in present]
            message = {**message, "headers": headers}
        await send(message)

    return sending


def is_console_path(path: str) -> bool:
    """Whether the console answers ``path`` (the API answers every other)."""
    return path == "/" or path == PREFIX or path.startswith(PREFIX + "/")


def cookie_name(request: Request) -> str:
    """The session cookie's name, with the port the daemon serves on: cookies do not tell
    ports apart, so two daemons on one host would otherwise log each other out."""
    server = request.scope.get("server")
    port = server[1] if server and server[1] else 0
    return f"corral_console_{port}"


def _next_of(raw: str | None) -> str:
    """Where to go after logging in: a console path of this site only (no open redirect)."""
    if not raw or len(raw) > 2000:
        return "/"
    parts = urlsplit(raw)
    if parts.scheme or parts.netloc or not raw.startswith("/") or raw.startswith("//"):
        return "/"
    if "\\" in raw or any(ord(c) < 0x20 for c in raw):
        return "/"
    return raw if is_console_path(parts.path) else "/"


async def _home_redirect(request: Request) -> Response:
    return RedirectResponse("/", status_code=303)


async def _not_found(request: Request) -> Response:
    from corral.daemon._http._common import RouteNotFoundError

    raise RouteNotFoundError(request.method, request.url.path[:200])


_STATIC_TYPES: Final = {".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8"}


async def _static(request: Request) -> Response:
    name = request.path_params["name"]
    suffix = PurePosixPath(name).suffix
    if "/" in name or name.startswith(".") or suffix not in _STATIC_TYPES:
        return await _not_found(request)
    found = resources.files("corral.console").joinpath("static", name)
    if not found.is_file():
        return await _not_found(request)
    response = Response(found.read_bytes(), media_type=_STATIC_TYPES[suffix])
    response.headers["Cache-Control"] = "no-cache"
    return response


def _templates() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("corral.console", "templates"),
        autoescape=True,  # every value escaped, whatever the template's name
        undefined=jinja2.ChainableUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["json"] = _pages.pretty_json
    env.filters["when"] = _pages.when
    env.filters["visible"] = _visible
    return env


def _visible(value: Any, lines: bool = False) -> str:
    """Text from an agent with its control characters shown as escapes (``\\x1b[31m``),
    newlines and tabs kept with ``lines`` (for a ``<pre>``); escaped as HTML after, as every
    value is."""
    return visible("" if value is None else str(value), lines=lines)
