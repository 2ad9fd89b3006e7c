"""open_store, ServeConfig (the loopback/token rule) and serve's life cycle."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.daemon import (
    AgentService,
    ServeConfig,
    SQLiteStore,
    StoreUnavailableError,
    open_store,
    serve,
)
from corral.daemon._auth import agent_token
from corral.daemon._server import ListenError, TokenRequiredError
from corral.kernel import InvalidArgumentError
from corral.runtime import FakeClock
from tests.support.front_door import BOUND_S, bearer, running_serve
from tests.support.harness import ScriptedHarness
from tests.support.polling import settle

ROOT = Path(__file__).resolve().parents[2]
WORKER = {"name": "w", "harness": "command", "command": ["worker"]}


@pytest.fixture(autouse=True)
def _no_token_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CORRAL_TOKEN", raising=False)


def refused(url: str) -> bool:
    address = httpx.URL(url)
    assert address.port is not None
    try:
        socket.create_connection((address.host, address.port), timeout=BOUND_S).close()
    except ConnectionRefusedError:
        return True
    return False


# --- open_store --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "path"),
    [
        ("sqlite:///.corral/corral.db", ".corral/corral.db"),
        ("sqlite:////var/lib/corral/c.db", "/var/lib/corral/c.db"),
        ("SQLITE:///x.db", "x.db"),
        ("data/corral.db", "data/corral.db"),
        ("/abs/corral.db", "/abs/corral.db"),
    ],
)
def test_open_store_gives_sqlite_for_sqlite_urls_and_bare_paths(url: str, path: str) -> None:
    store = open_store(url)
    assert isinstance(store, SQLiteStore)
    assert store.path == Path(path)


async def test_open_store_passes_the_clock(tmp_path: Path) -> None:
    clock = FakeClock()
    store = open_store(f"sqlite:///{tmp_path / 'c.db'}", clock=clock)
    await store.open()
    service = AgentService(
        store, home=tmp_path / "home", harnesses={"command": ScriptedHarness()}, clock=clock
    )
    try:
        await service.spawn(WORKER)
        (event,) = await store.read()
    finally:
        await service.close()
        await store.close()
    assert event.ts == clock.now().isoformat()


@pytest.mark.parametrize("scheme", ["postgresql", "postgres"])
def test_open_store_gives_postgres_for_postgresql_urls(scheme: str) -> None:
    pytest.importorskip("psycopg")
    from corral.daemon.stores import PostgresStore

    store = open_store(f"{scheme}://corral:pw@db.internal:5432/corral")
    assert isinstance(store, PostgresStore)
    assert store.dsn == f"{scheme}://corral:pw@db.internal:5432/corral"


@pytest.mark.parametrize(
    "dsn",
    [
        "user=postgres dbname=corral host=127.0.0.1 port=5432",
        "host=db.internal dbname=corral",
        "  dbname = corral",
        "service=corral",
    ],
)
def test_open_store_gives_postgres_for_a_keyword_connection_string(dsn: str) -> None:
    pytest.importorskip("psycopg")
    from corral.daemon.stores import PostgresStore

    store = open_store(dsn)
    assert isinstance(store, PostgresStore)
    assert store.dsn == dsn


@pytest.mark.parametrize("path", ["data/a=b.db", "x=1", "hostname.db"])
def test_paths_that_merely_hold_an_equals_sign_stay_sqlite(path: str) -> None:
    store = open_store(path)
    assert isinstance(store, SQLiteStore)
    assert store.path == Path(path)


@pytest.mark.parametrize(
    ("store", "secret"),
    [
        ("host=db password=hunter2 dbname=x", "hunter2"),
        ("host=db password='two words' dbname=x", "two words"),
        ("postgresql://u:hunter2@db/x", "hunter2"),
    ],
)
def test_the_store_shown_at_start_hides_its_password(store: str, secret: str) -> None:
    from corral.daemon._server import _shown_store

    shown = _shown_store(ServeConfig(store=store))
    assert secret not in shown
    assert "***" in shown
    assert "db" in shown


async def test_a_store_that_is_not_a_database_is_a_clear_error_and_leaks_nothing(
    tmp_path: Path,
) -> None:
    import threading

    path = tmp_path / "corral.db"
    path.write_text("this is not a database, " * 40)
    config = ServeConfig(port=0, store=f"sqlite:///{path}", home=tmp_path / "home")
    before = set(threading.enumerate())
    with pytest.raises(StoreUnavailableError) as caught:
        await serve(config, harnesses={"command": ScriptedHarness()})
    assert caught.value.code == "store_unavailable"
    assert caught.value.retryable is False
    assert "file is not a database" in caught.value.message
    assert str(path) in caught.value.message
    assert not [t for t in set(threading.enumerate()) - before if t.name.startswith("corral-")]


@pytest.mark.parametrize(
    "url", ["mysql://u@h/db", "sqlite://host/x.db", "sqlite:///", "sqlite:///  ", "", "  ", 5, None]
)
def test_open_store_refuses_other_urls(url: Any) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        open_store(url)
    assert caught.value.where == "open_store"
    assert caught.value.argument == "url"


def test_a_refused_store_url_does_not_show_its_password() -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        open_store("mysql://admin:hunter2@db/x")
    assert "hunter2" not in str(caught.value)
    assert "mysql://admin:***@db/x" in str(caught.value)


# --- ServeConfig ---------------------------------------------------------------------------------


def test_serve_config_defaults() -> None:
    config = ServeConfig()
    assert (config.host, config.port) == ("127.0.0.1", 4600)
    assert config.store == "sqlite:///.corral/corral.db"
    assert config.home == ".corral"
    assert config.token is None
    assert config.heartbeat_s == 15.0


@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.9.10", "::1", "[::1]", "localhost"])
def test_loopback_hosts_need_no_token(host: str) -> None:
    assert ServeConfig(host=host).host == host


@pytest.mark.parametrize(
    "host", ["0.0.0.0", "::", "192.168.1.10", "10.0.0.1", "example.com", "localhost.example.com"]
)
def test_other_hosts_without_a_token_are_refused(host: str) -> None:
    with pytest.raises(TokenRequiredError) as caught:
        ServeConfig(host=host)
    error = caught.value
    assert error.code == "token_required"
    assert repr(host) in error.message
    assert "CORRAL_TOKEN" in error.message
    assert error.details == {"host": host}


def test_other_hosts_are_allowed_with_a_token_argument_or_env(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert ServeConfig(host="0.0.0.0", token="tok-123").token == "tok-123"
    monkeypatch.setenv("CORRAL_TOKEN", "from-env")
    config = ServeConfig(host="0.0.0.0")
    assert config.token == "from-env"
    assert ServeConfig(token="explicit").token == "explicit"


def test_an_empty_token_env_counts_as_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORRAL_TOKEN", "")
    with pytest.raises(TokenRequiredError):
        ServeConfig(host="0.0.0.0")


def test_the_token_is_not_in_the_repr() -> None:
    assert "hidden-value" not in repr(ServeConfig(token="hidden-value"))


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"host": ""}, "host"),
        ({"host": 1}, "host"),
        ({"port": -1}, "port"),
        ({"port": 65536}, "port"),
        ({"port": True}, "port"),
        ({"port": "80"}, "port"),
        ({"store": "mysql://x"}, "url"),
        ({"store": ""}, "url"),
        ({"home": ""}, "home"),
        ({"home": 3}, "home"),
        ({"token": ""}, "token"),
        ({"token": "two words"}, "token"),
        ({"heartbeat_s": 0}, "heartbeat_s"),
        ({"heartbeat_s": float("inf")}, "heartbeat_s"),
        ({"max_body_bytes": 0}, "max_body_bytes"),
        ({"shutdown_timeout_s": -1}, "shutdown_timeout_s"),
        ({"databases": {"9x": "shop.db"}}, "databases"),
        ({"databases": {"shop": "mysql://h/db"}}, "DSN"),
    ],
)
def test_serve_config_refuses_bad_values(kwargs: dict[str, Any], argument: str) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        ServeConfig(**kwargs)
    assert caught.value.argument == argument


# --- serve ----------------------------------------------------------------------------------------


# A command-harness worker that calls the daemon back with what its environment gives it.
CALL_HOME = """
import json, os, sys, urllib.error, urllib.request
sys.stdin.read()
me = os.environ["CORRAL_AGENT_ID"]
def get(path):
    request = urllib.request.Request(
        os.environ["CORRAL_URL"] + path,
        headers={"Authorization": "Bearer " + os.environ.get("CORRAL_TOKEN", "")},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as refused:
        return refused.code
print(json.dumps({
    "self": get("/agents/" + me),
    "parent": get("/agents/" + os.environ["CORRAL_PARENT_ID"]),
    "admin": os.environ.get("CORRAL_TOKEN") == os.environ["ADMIN_TOKEN_SEEN_BY_TEST"],
}))
"""


async def test_an_agent_calls_back_with_its_own_token_never_the_daemons(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from corral.daemon import CommandHarness

    admin = "admin-token-0123456789"
    # The daemon takes its token from the environment, which its command agents inherit.
    monkeypatch.setenv("CORRAL_TOKEN", admin)
    monkeypatch.setenv("ADMIN_TOKEN_SEEN_BY_TEST", admin)
    config = ServeConfig(port=0, store=f"sqlite:///{tmp_path / 'c.db'}", home=tmp_path / "home")
    url: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(
        serve(config, harnesses={"command": CommandHarness()}, ready=url.set_result)
    )
    try:
        async with asyncio.timeout(BOUND_S):
            base = await url
        headers = {"authorization": f"Bearer {admin}"}
        async with httpx.AsyncClient(base_url=base, headers=headers, timeout=BOUND_S) as client:
            lead = (await client.post("/agents", json=WORKER)).json()["id"]
            spec = {
                "name": "caller",
                "harness": "command",
                "command": [sys.executable, "-c", CALL_HOME],
                "prompt": "go",
                "parent": lead,
            }
            caller = (await client.post("/agents", json=spec)).json()["id"]
            deadline = asyncio.get_running_loop().time() + BOUND_S
            while (record := (await client.get(f"/agents/{caller}")).json())["state"] == "running":
                assert asyncio.get_running_loop().time() < deadline, "the turn did not end"
                await asyncio.sleep(0.02)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert record["state"] == "idle", record
    assert json.loads(record["lastOutput"]) == {"self": 200, "parent": 403, "admin": False}


async def test_serve_listens_on_a_free_port_and_gives_agents_its_url(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with running_serve(tmp_path) as daemon, daemon.client() as client:
        assert daemon.url.startswith("http://127.0.0.1:")
        assert (await client.get("/healthz")).json() == {"status": "ok"}
        spawned = await client.post("/agents", json={**WORKER, "prompt": "go"})
        assert spawned.status_code == 201
        await _settle_requests(daemon.harness, 1)
    (request,) = daemon.harness.requests
    assert request.env["CORRAL_URL"] == daemon.url
    # No token was given: the agent's own is derived from the one serve made in its home.
    assert daemon.token is not None
    assert request.env["CORRAL_TOKEN"] == agent_token(daemon.token, request.agent_id)
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    assert f"corral: listening on {daemon.url}" in out
    assert str(tmp_path / "corral.db") in out


async def _settle_requests(harness: ScriptedHarness, count: int) -> None:
    await settle(lambda: len(harness.requests) >= count, within_s=BOUND_S)


async def test_cancelling_serve_closes_the_port_and_the_store(tmp_path: Path) -> None:
    async with running_serve(tmp_path) as daemon, daemon.client() as client:
        agent_id = (await client.post("/agents", json=WORKER)).json()["id"]
        daemon.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await daemon.task
    assert refused(daemon.url)
    # A clean close checkpoints the WAL and removes it.
    assert not (tmp_path / "corral.db-wal").exists()
    store = SQLiteStore(tmp_path / "corral.db")
    await store.open()
    try:
        assert list(store.state.agents) == [agent_id]
    finally:
        await store.close()


async def test_serve_settles_turns_left_in_flight_on_the_same_store(tmp_path: Path) -> None:
    async with running_serve(tmp_path) as daemon, daemon.client() as client:
        daemon.harness.script("w", "hang")
        agent_id = (await client.post("/agents", json={**WORKER, "prompt": "go"})).json()["id"]
        await _settle_requests(daemon.harness, 1)
    async with running_serve(tmp_path) as daemon, daemon.client() as client:
        agent = (await client.get(f"/agents/{agent_id}")).json()
        events = (await client.get("/events", params={"format": "json"})).json()["events"]
    assert agent["state"] == "failed"
    assert agent["error"] == "daemon restarted during turn"
    assert "agent.turn_interrupted" in [e["type"] for e in events]
    assert daemon.harness.reaped == [agent_id]


async def test_serve_with_a_wildcard_host_and_token_gives_a_loopback_url(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    token = "wild-token-0123456789"
    async with running_serve(tmp_path, host="0.0.0.0", token=token) as daemon:
        async with httpx.AsyncClient(base_url=daemon.url) as anonymous:
            assert (await anonymous.get("/agents")).status_code == 401
            assert (await anonymous.get("/healthz")).status_code == 200
        async with daemon.client() as client:
            assert (await client.get("/agents")).status_code == 200
    assert daemon.url.startswith("http://127.0.0.1:")
    port = daemon.url.rsplit(":", 1)[1]
    out = capsys.readouterr().out
    assert f"listening on http://0.0.0.0:{port}" in out
    assert "bearer token required" in out
    assert token not in out


async def test_ready_may_be_a_coroutine_function(tmp_path: Path) -> None:
    seen: list[str] = []

    async def ready(url: str) -> None:
        seen.append(url)

    config = ServeConfig(port=0, store=str(tmp_path / "c.db"), home=tmp_path / "home")
    task = asyncio.create_task(serve(config, harnesses={}, ready=ready))
    try:
        await settle(lambda: bool(seen), within_s=BOUND_S)
        async with httpx.AsyncClient(base_url=seen[0]) as client:
            assert (await client.get("/healthz")).status_code == 200
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_failing_ready_stops_the_server_and_is_raised(tmp_path: Path) -> None:
    urls: list[str] = []

    def ready(url: str) -> None:
        urls.append(url)
        raise RuntimeError("ready broke")

    config = ServeConfig(port=0, store=str(tmp_path / "c.db"), home=tmp_path / "home")
    with pytest.raises(RuntimeError, match="ready broke"):
        async with asyncio.timeout(BOUND_S):
            await serve(config, harnesses={}, ready=ready)
    assert refused(urls[0])
    assert not (tmp_path / "c.db-wal").exists()


async def test_a_busy_port_is_a_listen_error_before_the_store_is_touched(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = ServeConfig(port=port, store=str(tmp_path / "c.db"), home=tmp_path / "home")
        with pytest.raises(ListenError) as caught:
            await serve(config, harnesses={})
    error = caught.value
    assert error.code == "listen_failed"
    assert error.retryable is True
    assert f"127.0.0.1:{port}" in error.message
    assert not (tmp_path / "c.db").exists()


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"config": {"port": 0}}, "config"),
        ({"harnesses": ["command"]}, "harnesses"),
        ({"ready": "not callable"}, "ready"),
    ],
)
async def test_serve_refuses_bad_arguments(
    tmp_path: Path, kwargs: dict[str, Any], argument: str
) -> None:
    arguments: dict[str, Any] = {
        "config": ServeConfig(port=0, store=str(tmp_path / "c.db"), home=tmp_path / "home"),
        **kwargs,
    }
    config = arguments.pop("config")
    with pytest.raises(InvalidArgumentError) as caught:
        await serve(config, **arguments)
    assert caught.value.argument == argument
    assert not (tmp_path / "c.db").exists()


_SIGTERM_SCRIPT = textwrap.dedent(
    """
    import asyncio, sys
    from corral.daemon import ServeConfig, serve
    from tests.support.harness import ScriptedHarness

    config = ServeConfig(port=0, store=sys.argv[1], home=sys.argv[2])
    asyncio.run(serve(config, harnesses={"command": ScriptedHarness()}))
    print("serve returned", flush=True)
    """
)


async def test_sigterm_shuts_down_cleanly_and_returns(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("CORRAL_TOKEN", None)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _SIGTERM_SCRIPT,
        str(db),
        str(tmp_path / "home"),
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        async with asyncio.timeout(BOUND_S * 2):
            line = (await process.stdout.readline()).decode()
        assert line.startswith("corral: listening on http://127.0.0.1:"), line
        url = line.split()[3]
        headers = bearer(tmp_path / "home")  # the token it made, as no token was given
        async with httpx.AsyncClient(base_url=url, headers=headers) as client:
            assert (await client.post("/agents", json=WORKER)).status_code == 201
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(BOUND_S):
            out, err = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, err.decode()
    assert out.decode() == "serve returned\n"
    assert refused(url)
    assert not (tmp_path / "c.db-wal").exists()
    store = SQLiteStore(db)
    await store.open()
    try:
        assert len(store.state.agents) == 1
    finally:
        await store.close()


async def test_an_agent_token_uses_the_served_mcp_endpoint_within_its_scope(
    tmp_path: Path,
) -> None:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    token = "serve-token-0123456789"
    async with running_serve(tmp_path, token=token) as daemon:
        headers = {"authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(base_url=daemon.url, headers=headers) as admin:
            lead = (await admin.post("/agents", json=WORKER)).json()["id"]
            other = (await admin.post("/agents", json=WORKER)).json()["id"]
        as_lead = {"Authorization": f"Bearer {agent_token(token, lead)}"}
        async with (
            httpx2.AsyncClient(headers=as_lead) as http,
            Client(streamable_http_client(daemon.url + "/mcp", http_client=http)) as client,
        ):
            listed = await client.call_tool("agent_list")
            refused = await client.call_tool("agent_status", {"agentId": other})
    assert listed.structured_content is not None
    assert [a["id"] for a in listed.structured_content["agents"]] == [lead]
    assert refused.is_error
    assert refused.structured_content is not None
    assert refused.structured_content["error"]["code"] == "out_of_scope"


def test_the_log_goes_to_stderr_as_it_is_when_a_line_is_logged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A handler bound to the stream of its day kept writing to a closed one after a test (or
    # an embedding program) swapped stderr: "I/O operation on closed file" on every line.
    import io
    import logging

    from corral.daemon._server import log_to_stderr

    root = logging.getLogger("corral")
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(root, "level", root.level)
    first = io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    log_to_stderr()
    first.close()
    now = io.StringIO()
    monkeypatch.setattr(sys, "stderr", now)
    logging.getLogger("corral.daemon").info("agent a_1: idle -> running")
    assert now.getvalue().endswith("corral.daemon: agent a_1: idle -> running\n")
