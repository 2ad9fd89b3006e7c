"""The daemon's front doors under test: a service with a scripted harness, its HTTP app and an
httpx client over it, the app served on a loopback port, and ``serve`` itself."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI
from starlette.types import ASGIApp

from corral.daemon import (
    AgentService,
    LocalApi,
    ServeConfig,
    SQLiteStore,
    create_app,
    read_token_file,
    serve,
    token_path,
)
from corral.daemon._auth import agent_token
from tests.support.harness import ScriptedHarness
from tests.support.polling import settle

BOUND_S = 10.0  # upper bound on any wait for a server; never a guess at how long it takes
LOCAL_URL = "http://127.0.0.1:4600"  # the base URL of in-process clients
DAEMON_TOKEN = "s3cret-token-0123456789"


@dataclass
class FrontDoor:
    """A started service over a SQLite store, with a scripted ``command`` harness.

    ``token`` is the daemon's (each agent then gets its own); ``url`` is set once the app is
    served (:func:`running_daemon`).
    """

    store: SQLiteStore
    service: AgentService
    harness: ScriptedHarness
    token: str | None = None
    url: str = ""
    api: LocalApi = field(init=False)

    def __post_init__(self) -> None:
        self.api = LocalApi(self.service)

    def app(self, **options: Any) -> FastAPI:
        """``create_app`` over the service, with its token unless ``options`` say otherwise."""
        options.setdefault("token", self.token)
        return create_app(self.service, **options)

    def client(self, app: ASGIApp | None = None, **headers: str) -> httpx.AsyncClient:
        """An httpx client of ``app`` (default: the app without a token) in process."""
        transport = httpx.ASGITransport(app=app or create_app(self.service))
        return httpx.AsyncClient(transport=transport, base_url=LOCAL_URL, headers=headers)

    def agent_token(self, agent_id: str) -> str:
        """The token the daemon gives ``agent_id`` (``CORRAL_TOKEN`` in its environment)."""
        assert self.token is not None, "agent tokens need a daemon token"
        return agent_token(self.token, agent_id)

    def agent_client(self, agent_id: str, **options: Any) -> httpx.AsyncClient:
        """A client of the app (with the daemon's token) carrying ``agent_id``'s own token."""
        bearer = f"Bearer {self.agent_token(agent_id)}"
        return self.client(self.app(**options), authorization=bearer)

    async def spawn(self, **spec: Any) -> str:
        """A new agent (the ``command`` harness unless given), by the service; its id."""
        spec.setdefault("harness", "command")
        spec.setdefault("command", ["worker"])
        result = await self.service.spawn(spec)
        return str(result.body["id"])

    def state(self, agent_id: str) -> str:
        return str(self.service.get(agent_id)["state"])

    async def until(self, agent_id: str, *states: str) -> None:
        """Wait until the agent is in one of ``states``."""
        await settle(lambda: self.state(agent_id) in states)

    async def settled(self, agent_id: str, *states: str) -> None:
        """Wait until the agent is in one of ``states`` with no turn in flight."""
        await settle(lambda: self.state(agent_id) in states)
        await asyncio.wait_for(self.service.settled(agent_id), 10)
        await settle(lambda: self.state(agent_id) in states)


@contextlib.asynccontextmanager
async def front_door(
    tmp_path: Path, *, token: str | None = None, name: str = "corral"
) -> AsyncIterator[FrontDoor]:
    """A started :class:`FrontDoor` (store ``<name>.db`` and home ``<name>`` in ``tmp_path``),
    closed on exit."""
    store = SQLiteStore(tmp_path / f"{name}.db")
    await store.open()
    harness = ScriptedHarness()
    service = AgentService(store, home=tmp_path / name, harnesses={"command": harness}, token=token)
    try:
        await service.start()
        yield FrontDoor(store, service, harness, token)
    finally:
        await service.close()
        await store.close()


@contextlib.asynccontextmanager
async def serving(app: ASGIApp) -> AsyncIterator[str]:
    """``app`` on a loopback port chosen by the OS; yields its base URL."""
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    )
    task = asyncio.create_task(server.serve())
    await settle(lambda: server.started or task.done())
    if task.done():
        task.result()
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


@contextlib.asynccontextmanager
async def running_daemon(tmp_path: Path, token: str | None = None) -> AsyncIterator[FrontDoor]:
    """A :class:`FrontDoor` whose app is served on a loopback port (``url``)."""
    async with (
        front_door(tmp_path, token=token, name="daemon") as door,
        serving(door.app(heartbeat_s=60)) as url,
    ):
        door.url = url
        yield door
        await door.service.close()  # ends the event streams, so the server can stop


def token_of(home: Path) -> str:
    """The token a daemon given no token made in its ``home`` (``<home>/token``)."""
    token = read_token_file(token_path(home))
    assert token is not None, f"no token file in {home}"
    return token


def bearer(home: Path) -> dict[str, str]:
    """The ``Authorization`` header with the token of the daemon whose state is in ``home``."""
    return {"authorization": f"Bearer {token_of(home)}"}


def serve_env(**extra: str) -> dict[str, str]:
    """This process's environment for a ``corral serve`` subprocess, without the token and
    home this environment may hold (each test's daemon makes and keeps its own)."""
    env = {k: v for k, v in os.environ.items() if k not in ("CORRAL_TOKEN", "CORRAL_HOME")}
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


@dataclass
class ServedDaemon:
    """``serve`` running in this loop (see :func:`running_serve`)."""

    url: str
    harness: ScriptedHarness
    task: asyncio.Task[None]
    token: str | None = None

    def client(self, **headers: str) -> httpx.AsyncClient:
        """An httpx client of the daemon, with its token."""
        if self.token is not None:
            headers.setdefault("authorization", f"Bearer {self.token}")
        return httpx.AsyncClient(base_url=self.url, headers=headers, timeout=BOUND_S)


@contextlib.asynccontextmanager
async def running_serve(tmp_path: Path, **overrides: Any) -> AsyncIterator[ServedDaemon]:
    """``serve`` on port 0 in this loop (``overrides`` for its ``ServeConfig``); cancelled
    (and awaited) on exit. Its ``token`` is the one given, else the one it made."""
    harness = ScriptedHarness()
    config = ServeConfig(
        port=0,
        store=f"sqlite:///{tmp_path / 'corral.db'}",
        home=tmp_path / "home",
        **overrides,
    )
    url: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(serve(config, harnesses={"command": harness}, ready=url.set_result))
    try:
        either: set[asyncio.Future[Any]] = {url, task}
        async with asyncio.timeout(BOUND_S):
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            await task  # raises what stopped it
        token = config.token if config.token is not None else token_of(Path(config.home))
        yield ServedDaemon(url.result(), harness, task, token)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def free_port() -> int:
    """A loopback port free at the time of the call."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
