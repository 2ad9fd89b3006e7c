"""Fixtures for the console's tests: a started service over SQLite with the daemon's token,
the console in front of its HTTP API, and browser-like clients of it in process; and a real
browser, headless Chromium (tests/support/browser.py), for the tests against a real
``corral serve``."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from corral.console import Console
from tests.support.browser import browser, page
from tests.support.front_door import DAEMON_TOKEN, LOCAL_URL, FrontDoor, front_door

__all__ = ["browser", "page"]

CSRF = re.compile(r'name="corral-csrf" content="([^"]+)"')


@dataclass
class Site:
    """The console over a :class:`FrontDoor` (the daemon's token is :data:`DAEMON_TOKEN`)."""

    door: FrontDoor
    console: Console

    def browser(self, **headers: str) -> httpx.AsyncClient:
        """A client that keeps cookies and follows no redirect (each is asserted); like a
        browser on a console page it sends the console's ``Origin`` unless told otherwise
        (an empty ``origin`` header: none)."""
        transport = httpx.ASGITransport(app=self.console)
        headers = {"origin": LOCAL_URL, **headers}
        client = httpx.AsyncClient(transport=transport, base_url=LOCAL_URL, headers=headers)
        client.event_hooks["request"].append(_drop_empty_origin)
        return client

    async def login(self, browser: httpx.AsyncClient, token: str = DAEMON_TOKEN) -> str:
        """Log ``browser`` in with ``token``; its session's form token."""
        answer = await browser.post("/console/login", data={"token": token, "next": "/"})
        assert answer.status_code == 303, answer.text
        home = await browser.get("/")
        assert home.status_code == 200, home.text
        found = CSRF.search(home.text)
        assert found is not None
        return found.group(1)


async def _drop_empty_origin(request: httpx.Request) -> None:
    if request.headers.get("origin") == "":
        del request.headers["origin"]


@pytest.fixture
async def site(tmp_path: Path) -> AsyncIterator[Site]:
    async with front_door(tmp_path, token=DAEMON_TOKEN) as door:
        yield Site(door, Console(door.app(heartbeat_s=60)))
