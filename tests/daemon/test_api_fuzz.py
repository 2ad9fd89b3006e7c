"""The HTTP API fuzzed from its own OpenAPI document (schemathesis): every operation, as the
operator, as an agent (its own token), with a wrong token and with none, against a real
``serve`` on loopback. No answer may be a 500, and every answer must be one the document
lists, with a body that matches it.

``make test`` runs a few examples an operation (``CORRAL_FUZZ_EXAMPLES``, default 6);
``make fuzz-api`` runs many more. Every harness is the scripted one, so specs the fuzzer
makes up never run a command or import a module. ``GET /events`` is asked for its JSON page
(a stream never ends; tests/daemon/test_sse.py covers it).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from corral.daemon import AgentService, ServeConfig, SQLiteStore, create_app, serve
from corral.daemon._auth import agent_token
from tests.support.harness import ScriptedHarness

TOKEN = "fuzz-token-0123456789abcdef"
EXAMPLES = int(os.environ.get("CORRAL_FUZZ_EXAMPLES", "6"))
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


class Served:
    """``serve`` (SQLite store, a SQLite database for the gateway) in a thread of its own, so
    the fuzzer's blocking calls do not block its loop."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.url = ""
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="fuzzed-serve", daemon=True)

    def _main(self) -> None:
        harness = ScriptedHarness()
        shop = self.tmp / "shop.db"
        import sqlite3

        with sqlite3.connect(shop) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, status TEXT)")
        conn.close()
        config = ServeConfig(
            port=0,
            store=f"sqlite:///{self.tmp / 'corral.db'}",
            home=self.tmp / "home",
            token=TOKEN,
            heartbeat_s=60,
            databases={"shop": f"sqlite:///{shop}"},
        )

        def ready(url: str) -> None:
            self.url = url
            self._ready.set()

        async def run() -> None:
            self._loop = asyncio.get_running_loop()
            harnesses = {"command": harness, "python": harness, "openai": harness}
            self._task = asyncio.current_task()
            await serve(config, harnesses=harnesses, ready=ready)

        try:
            asyncio.run(run())
        except asyncio.CancelledError:
            pass
        except BaseException as exc:  # reported by start()
            self._error = exc
            self._ready.set()

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(30) or self._error is not None:
            raise RuntimeError(f"serve did not start: {self._error!r}")

    def stop(self) -> None:
        if self._loop is not None and self._task is not None:
            self._loop.call_soon_threadsafe(self._task.cancel)
        self._thread.join(30)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    daemon = Served(tmp_path_factory.mktemp("fuzz"))
    daemon.start()
    try:
        yield daemon
    finally:
        daemon.stop()


@pytest.fixture(scope="module")
def agent(served: Served) -> str:
    """An agent of the daemon (with a child), whose own token is one of the callers."""
    bearer = {"authorization": f"Bearer {TOKEN}"}
    spec = {"name": "root", "harness": "command", "command": ["true"]}
    root = httpx.post(f"{served.url}/agents", json=spec, headers=bearer, timeout=10)
    assert root.status_code == 201, root.text
    agent_id = str(root.json()["id"])
    child = {**spec, "name": "child", "parent": agent_id}
    assert httpx.post(f"{served.url}/agents", json=child, headers=bearer, timeout=10).is_success
    return agent_id


def _document() -> dict[str, Any]:
    """The daemon's OpenAPI document, as ``serve`` answers it (checked by
    :func:`test_the_fuzzed_document_is_the_served_one`); the app is built, never run."""
    service = AgentService(SQLiteStore(":memory:"), home=".", harnesses={})
    return create_app(service, token=TOKEN).openapi()


DOCUMENT = _document()
schema = schemathesis.openapi.from_dict(DOCUMENT)
# The callers' tokens are the test's (``caller``), not made up from the security scheme.
schema.config.generation.update(
    modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE], with_security_parameters=False
)
# Invalid input must be refused: with any 4xx the document lists (an agent the fuzzer's
# refusals froze in the gateway answers 423 before its request is read).
schema.config.checks.negative_data_rejection.expected_statuses = [
    "400",
    "401",
    "403",
    "404",
    "405",
    "409",
    "413",
    "415",
    "422",
    "423",
    "429",
]


def test_the_fuzzed_document_is_the_served_one(served: Served) -> None:
    bearer = {"authorization": f"Bearer {TOKEN}"}
    served_document = httpx.get(f"{served.url}/openapi.json", headers=bearer, timeout=10)
    assert served_document.json() == DOCUMENT


@pytest.mark.timeout(max(30, EXAMPLES * 5))
@pytest.mark.parametrize("caller", ["operator", "agent", "wrong", "none"])
@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_every_operation_answers_as_documented(
    case: Any, caller: str, served: Served, agent: str
) -> None:
    headers = {
        "operator": {"authorization": f"Bearer {TOKEN}"},
        "agent": {"authorization": f"Bearer {agent_token(TOKEN, agent)}"},
        "wrong": {"authorization": "Bearer not-the-token"},
        "none": {},
    }[caller]
    if case.path == "/events" and case.method == "GET":
        # A stream never ends: ask for a page (tests/daemon/test_sse.py covers the stream);
        # a format the fuzzer made up is left alone, to be refused.
        query = dict(case.query or {})
        if query.get("format", "sse") == "sse":
            case.query = {**query, "format": "json"}
    response = case.call(base_url=served.url, headers=headers, timeout=10)
    case.validate_response(response, checks=CHECKS)
