"""The examples of "Connected to the daemon" (docs/integrations.md) and "Agents in their own
process" (docs/daemon.md) run against a daemon served on loopback, with what they take from
the environment."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.front_door import DAEMON_TOKEN, FrontDoor, running_daemon

DOCS = Path(__file__).resolve().parents[2] / "docs"


def example(doc: str, heading: str) -> str:
    """The first python block of the section ``heading`` of ``doc`` (a later one, a framework's
    agent connected, is run by tests/integrations/test_daemon_oversight.py)."""
    text = (DOCS / doc).read_text()
    section = text.split(heading, 1)[1].split("\n## ", 1)[0]
    return str(re.findall(r"```python\n(.*?)```", section, flags=re.S)[0])


@pytest.fixture
async def daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FrontDoor]:
    async with running_daemon(tmp_path, token=DAEMON_TOKEN) as door:
        monkeypatch.setenv("CORRAL_URL", door.url)
        monkeypatch.setenv("CORRAL_TOKEN", DAEMON_TOKEN)
        yield door


@pytest.mark.parametrize(
    ("doc", "heading"),
    [
        ("integrations.md", "## Connected to the daemon"),
        ("daemon.md", "## Agents in their own process"),
    ],
)
async def test_the_example_reports_a_turn_to_the_daemon(
    daemon: FrontDoor, doc: str, heading: str
) -> None:
    namespace: dict[str, Any] = {"__name__": "doc_example"}
    exec(compile(example(doc, heading), f"<{doc}>", "exec"), namespace)
    await namespace["main"]()
    async with httpx.AsyncClient(
        base_url=daemon.url, headers={"authorization": f"Bearer {DAEMON_TOKEN}"}
    ) as api:
        (found,) = (await api.get("/agents", params={"name": "researcher"})).json()["agents"]
        record = (await api.get(f"/agents/{found['id']}")).json()
    assert (record["spec"]["harness"], record["state"], record["turns"]) == ("external", "idle", 1)
    assert record["usage"]["tokens"] == 1200
    assert record["lastOutput"]
