"""How ``HttpApi``'s requests travel: over httpx on an event loop (the default), or blocking
over the standard library's ``http.client`` -- what the command line uses for a request and
its answer, so that ``corral agents`` imports neither httpx nor asyncio (together a third of
a second of every command's start on a small machine).

Both wires answer ``(status, body bytes)`` and raise :class:`WireError` with a short reason
when no answer came (refused, unresolvable, timed out, dropped).
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlencode, urlsplit

if TYPE_CHECKING:
    import http.client

    import httpx


class WireError(Exception):
    """No answer came; ``reason`` says why in a few words."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Wire(Protocol):
    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, Any] | None = None,
        extra_s: float = 0.0,
    ) -> tuple[int, bytes]:
        """Send one request (``body`` as JSON when not None); ``extra_s`` more seconds to
        wait for an answer the daemon holds back on purpose (``waitS``)."""
        ...

    async def aclose(self) -> None: ...


def tls_for(url: str) -> ssl.SSLContext | bool:
    """httpx's ``verify`` for a client of ``url``: the CA certificates (loading them costs a
    command line tens of milliseconds) for an https:// URL only. An http:// client gets a
    context that verifies like the default one but trusts no CA: it never speaks TLS (its
    requests go to the base URL, redirects are not followed), and if it did it would refuse."""
    if url.startswith("https://"):
        return True
    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


def headers_for(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def _json_body(body: Any) -> bytes:
    # as httpx writes ``json=``: compact, UTF-8, no NaN
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


class HttpxWire:
    """Requests over an ``httpx.AsyncClient`` (``transport`` replaces the network: an
    ``httpx.ASGITransport`` runs an app in process)."""

    def __init__(
        self,
        url: str,
        token: str | None,
        timeout_s: float,
        transport: httpx.AsyncBaseTransport | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        import httpx

        self._httpx = httpx
        self._client = httpx.AsyncClient(
            base_url=url,
            headers={**headers_for(token), **(headers or {})},
            transport=transport,
            timeout=timeout_s,
            verify=tls_for(url),
        )

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, Any] | None = None,
        extra_s: float = 0.0,
    ) -> tuple[int, bytes]:
        httpx = self._httpx
        read_s = self._client.timeout.read
        timeout: Any = httpx.USE_CLIENT_DEFAULT
        if extra_s and read_s is not None:
            timeout = httpx.Timeout(self._client.timeout.connect, read=read_s + extra_s)
        try:
            response = await self._client.request(
                method, path, json=body, params=params, timeout=timeout
            )
        except httpx.TransportError as exc:
            raise WireError(httpx_reason(exc)) from exc
        return response.status_code, response.content

    async def aclose(self) -> None:
        await self._client.aclose()


def httpx_reason(exc: Exception) -> str:
    """A few words on why httpx got no answer."""
    import httpx

    if isinstance(exc, httpx.ConnectError):
        return f"cannot connect: {exc}" if str(exc) else "connection refused"
    if isinstance(exc, httpx.TimeoutException):
        return "timed out"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class BlockingWire:
    """Requests over ``http.client``, one kept-alive connection, blocking the thread.

    Its ``request`` never suspends: a caller without an event loop drives the coroutine to
    its end with one ``send(None)``. Never use it inside a running event loop (it would block
    the loop for the whole request).
    """

    def __init__(self, url: str, token: str | None, timeout_s: float) -> None:
        parts = urlsplit(url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = parts.port
        self._prefix = parts.path.rstrip("/")
        self._timeout_s = timeout_s
        self._headers = {
            **headers_for(token),
            "Accept": "application/json",
            "User-Agent": "corral-cli",
        }
        self._conn: http.client.HTTPConnection | None = None
        self._used = False  # the connection has answered once (a keep-alive it may drop)

    def _connect(self) -> http.client.HTTPConnection:
        import http.client

        if self._https:
            return http.client.HTTPSConnection(
                self._host,
                self._port,
                timeout=self._timeout_s,
                context=ssl.create_default_context(),
            )
        return http.client.HTTPConnection(self._host, self._port, timeout=self._timeout_s)

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, Any] | None = None,
        extra_s: float = 0.0,
    ) -> tuple[int, bytes]:
        target = self._prefix + path
        if params:
            query = urlencode({k: _param(v) for k, v in params.items() if v is not None})
            target += ("&" if "?" in target else "?") + query
        headers = dict(self._headers)
        data = None
        if body is not None:
            data = _json_body(body)
            headers["Content-Type"] = "application/json"
        return self._send(method, target, data, headers, extra_s)

    def _send(
        self, method: str, target: str, data: bytes | None, headers: dict[str, str], extra_s: float
    ) -> tuple[int, bytes]:
        import http.client

        for attempt in (1, 2):
            reused = self._conn is not None and self._used
            if self._conn is None:
                self._conn = self._connect()
                self._used = False
            conn = self._conn
            try:
                conn.timeout = self._timeout_s + extra_s
                if conn.sock is not None:
                    conn.sock.settimeout(conn.timeout)
                conn.request(method, target, body=data, headers=headers)
                response = conn.getresponse()
                content = response.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as exc:
                self._drop()
                # A kept-alive connection the daemon closed while idle: the request never
                # reached it, so sending it again on a new connection is safe.
                if reused and attempt == 1:
                    continue
                reason = f"{type(exc).__name__}: {exc}" if str(exc) else "dropped"
                raise WireError(reason) from exc
            except TimeoutError as exc:
                self._drop()
                raise WireError("timed out") from exc
            except ConnectionRefusedError as exc:
                self._drop()
                raise WireError("connection refused") from exc
            except (OSError, http.client.HTTPException) as exc:
                self._drop()
                reason = f"cannot connect: {exc}" if str(exc) else type(exc).__name__
                raise WireError(reason) from exc
            self._used = True
            if response.will_close:
                self._drop()
            return response.status, content
        raise AssertionError("unreachable")  # pragma: no cover

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = None

    async def aclose(self) -> None:
        self._drop()


def _param(value: Any) -> str:
    # as httpx encodes query values
    if value is True:
        return "true"
    if value is False:
        return "false"
    return str(value)
