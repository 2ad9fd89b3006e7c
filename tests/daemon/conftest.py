"""Fixtures of the tests of the daemon's front doors (HTTP, MCP, clients): see
tests/support/front_door.py for what they hold."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from corral.daemon import HttpApi
from tests.support.front_door import (
    DAEMON_TOKEN,
    FrontDoor,
    front_door,
    running_daemon,
)


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
