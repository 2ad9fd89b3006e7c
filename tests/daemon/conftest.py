"""Fixtures for the daemon's tests: SQLite stores, a scripted harness and services over them;
the front doors (a service with its scoped API, a real server on loopback, an HTTP client; see
tests/support/front_door.py for what they hold)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Protocol

import pytest

from corral.daemon import AgentService, Harness, HttpApi, SQLiteStore, Store
from corral.runtime import FakeClock
from tests.support.front_door import (
    DAEMON_TOKEN,
    FrontDoor,
    front_door,
    running_daemon,
)
from tests.support.harness import ScriptedHarness
from tests.support.store_backends import Backend, postgres_backend, sqlite_backend


class OpenSQLite(Protocol):
    async def __call__(self, path: Path | None = None) -> SQLiteStore: ...


class MakeService(Protocol):
    async def __call__(
        self, store: Store, *, harness: Harness | None = None, **options: Any
    ) -> AgentService: ...


@pytest.fixture
def harness() -> ScriptedHarness:
    """The scripted harness the services of :func:`make_service` run as ``command``."""
    return ScriptedHarness()


@pytest.fixture
async def open_sqlite(tmp_path: Path) -> AsyncIterator[OpenSQLite]:
    """Opens a SQLite store (at ``tmp_path/corral.db`` unless told); each one is closed after
    the test, after the services over it. Opening the same path again reopens that store."""
    opened: list[SQLiteStore] = []

    async def open_store(path: Path | None = None) -> SQLiteStore:
        store = SQLiteStore(tmp_path / "corral.db" if path is None else path)
        opened.append(store)
        await store.open()
        return store

    yield open_store
    for store in reversed(opened):
        await store.close()


@pytest.fixture
async def sqlite_store(open_sqlite: OpenSQLite) -> SQLiteStore:
    """An open SQLite store at ``tmp_path/corral.db``."""
    return await open_sqlite()


@pytest.fixture
async def make_service(
    tmp_path: Path, harness: ScriptedHarness, open_sqlite: OpenSQLite
) -> AsyncIterator[MakeService]:
    """Builds a started :class:`AgentService` over ``store``, its home ``tmp_path/home``,
    with ``harness`` (the scripted one unless told) as ``command``; ``options`` go to
    ``AgentService``. Each one is closed after the test (closing it earlier is fine)."""
    made: list[AgentService] = []

    default = harness

    async def make(store: Store, *, harness: Harness | None = None, **options: Any) -> AgentService:
        options.setdefault("home", tmp_path / "home")
        options.setdefault("harnesses", {"command": default if harness is None else harness})
        service = AgentService(store, **options)
        made.append(service)
        await service.start()
        return service

    yield make
    for service in reversed(made):
        await service.close()


@pytest.fixture
async def service(make_service: MakeService, sqlite_store: SQLiteStore) -> AgentService:
    """A started service over :func:`sqlite_store` with the scripted :func:`harness`."""
    return await make_service(sqlite_store)


# --- front doors ----------------------------------------------------------------------


@pytest.fixture
async def front(tmp_path: Path) -> AsyncIterator[FrontDoor]:
    """A started service with a scripted harness, and no token."""
    async with front_door(tmp_path) as door:
        yield door


@pytest.fixture
async def scoped_front(tmp_path: Path) -> AsyncIterator[FrontDoor]:
    """A started service whose daemon has a token (:data:`DAEMON_TOKEN`), so that each agent
    gets one of its own."""
    async with front_door(tmp_path, token=DAEMON_TOKEN, name="scoped") as door:
        yield door


@pytest.fixture
async def daemon(tmp_path: Path) -> AsyncIterator[FrontDoor]:
    """A :func:`front`-like service whose HTTP app is served on a loopback port (``url``)."""
    async with running_daemon(tmp_path) as door:
        yield door


@pytest.fixture
async def http_api(daemon: FrontDoor) -> AsyncIterator[HttpApi]:
    """An :class:`HttpApi` of :func:`daemon`."""
    async with HttpApi(daemon.url) as api:
        yield api


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ]
)
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    """Each store in turn (tests/support/store_backends.py); what the test opened is closed
    after it."""
    clock = FakeClock()
    if request.param == "sqlite":
        chosen = sqlite_backend(tmp_path / "corral.db", clock)
    else:
        chosen = postgres_backend(request.getfixturevalue("postgres_dsn"), clock)
    yield chosen
    for store in chosen.opened:
        await store.close()
