"""HttpApi on the blocking wire (http.client, no event loop): what the command line runs on.

It must give the same answers and errors as on httpx, survive a kept-alive connection the
daemon dropped, and keep the command line free of asyncio and httpx.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import sys
from collections.abc import Coroutine, Iterator
from typing import Any, ClassVar

import pytest

from corral.cli._calls import drive
from corral.daemon import DaemonUnreachableError, HttpApi, UnauthorizedError
from corral.kernel import InvalidArgumentError
from tests.daemon.test_client import exercise
from tests.support.front_door import FrontDoor, free_port, running_daemon
from tests.support.http_server import serving


class InThread:
    """``HttpApi(blocking=True)`` seen as an async API: each call is driven to its end without
    an event loop, in a worker thread (the daemon under test shares this test's loop)."""

    def __init__(self, api: HttpApi) -> None:
        self._api = api

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._api, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            coroutine: Coroutine[Any, Any, Any] = method(*args, **kwargs)
            return await asyncio.to_thread(drive, coroutine)

        return call


async def test_the_blocking_wire_gives_the_same_answers_and_errors(daemon: FrontDoor) -> None:
    api = HttpApi(daemon.url, blocking=True)
    try:
        await exercise(InThread(api), daemon.harness, daemon.state)
    finally:
        drive(api.aclose())


async def test_the_blocking_wire_sends_the_token_and_maps_refusals(tmp_path: Any) -> None:
    async with running_daemon(tmp_path, token="s3cret") as d:
        good = InThread(HttpApi(d.url, token="s3cret", blocking=True))
        assert await good.list_agents() == []
        bad = InThread(HttpApi(d.url, token="wrong", blocking=True))
        with pytest.raises(UnauthorizedError) as refused:
            await bad.list_agents()
        await good.aclose()
        await bad.aclose()
    assert refused.value.message == "a valid bearer token is required"


def test_no_daemon_is_unreachable_with_a_reason() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    api = HttpApi(url, blocking=True)
    with pytest.raises(DaemonUnreachableError) as unreachable:
        drive(api.list_agents())
    assert unreachable.value.retryable is True
    assert unreachable.value.message.startswith(f"no daemon answers at {url} (connection refused)")


def test_a_transport_and_the_blocking_wire_do_not_mix() -> None:
    import httpx

    with pytest.raises(InvalidArgumentError, match="blocking"):
        HttpApi(transport=httpx.MockTransport(lambda r: httpx.Response(200)), blocking=True)
    with pytest.raises(InvalidArgumentError, match="blocking"):
        HttpApi(blocking="yes")  # type: ignore[arg-type]


class _DropsIdleConnections(http.server.BaseHTTPRequestHandler):
    """Answers on HTTP/1.1 (a keep-alive the client reuses), then closes the connection,
    as a server does with a connection idle past its keep-alive timeout."""

    protocol_version = "HTTP/1.1"
    seen: ClassVar[list[tuple[str, str, bytes]]] = []

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.seen.append((self.command, self.path, body))
        data = json.dumps({"agents": [], "nextCursor": None}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.close_connection = True  # without saying so: the client finds out on reuse

    do_GET = _answer
    do_POST = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def dropping_server() -> Iterator[str]:
    _DropsIdleConnections.seen = []
    with serving(_DropsIdleConnections, "drops-idle-connections") as url:
        yield url


def test_a_dropped_keep_alive_connection_is_opened_again_once(dropping_server: str) -> None:
    api = HttpApi(dropping_server, token="t", blocking=True)
    try:
        assert drive(api.list_agents()) == []
        assert drive(api.list_agents(state="idle")) == []  # the first connection was dropped
    finally:
        drive(api.aclose())
    seen = _DropsIdleConnections.seen
    assert [(m, p.split("?")[0]) for m, p, _ in seen] == [("GET", "/agents"), ("GET", "/agents")]
    assert "state=idle" in seen[1][1]
    assert len(seen) == 2  # each request reached the server once


def test_drive_refuses_work_that_needs_an_event_loop() -> None:
    async def sleeps() -> None:
        await asyncio.sleep(0)

    with pytest.raises(RuntimeError, match="loop=True"):
        drive(sleeps())


@pytest.mark.parametrize("json_out", [True, False])
async def test_corral_agents_imports_neither_asyncio_nor_httpx_nor_rich(
    daemon: FrontDoor, json_out: bool
) -> None:
    # the table is drawn without rich's console too (cli/_output.py print_fitted)
    args = ["corral", "--url", daemon.url, "agents", *(["--json"] if json_out else [])]
    code = (
        "import sys\n"
        "from corral.cli._app import main\n"
        f"sys.argv = {args!r}\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as exit:\n"
        "    code = exit.code\n"
        "print(sorted(m for m in ('asyncio', 'httpx', 'anyio', 'rich') if m in sys.modules),\n"
        "      code, file=sys.stderr)\n"
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        code,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    if json_out:
        assert json.loads(out) == []
    else:
        assert "┏" in out.decode()
        assert "state" in out.decode()
    assert err.decode().strip().splitlines()[-1] == "[] 0"
