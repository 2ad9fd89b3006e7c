"""``corral session``: an agent's session as a table (agents' text escaped) or exact JSON."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.front_door import FrontDoor
from tests.support.harness import fail
from tests.support.polling import settle
from tests.test_cli import cli_home, corral, daemon, ok, spawn

__all__ = ["cli_home", "daemon"]  # the fixtures of tests/test_cli.py, used here too

HOSTILE = "\x1b[2Jforged\nline [bold]x[/bold]"


async def test_session_shows_the_turns_as_a_table_or_json(
    daemon: FrontDoor, tmp_path: Path
) -> None:
    daemon.harness.script("w", fail(HOSTILE), "done it")
    agent = await spawn(daemon, tmp_path, prompt="count the users", onFailure="ask")
    await settle(lambda: daemon.state(agent) == "blocked")
    # Through the API: the daemon's log line of this prompt may go to a stream an earlier
    # CLI test left closed, which a command run meanwhile would show on its stderr.
    await daemon.api.prompt(agent, "use users_v2")
    await settle(lambda: daemon.state(agent) == "idle")

    table = ok(await corral("--url", daemon.url, "session", agent))
    assert f"session of {agent} (history run)" in table
    rows = [line.split("│") for line in table.splitlines() if "│" in line]
    assert [(row[1].strip(), row[2].strip()) for row in rows] == [
        ("1", "user"),
        ("1", "error"),
        ("2", "user"),
        ("2", "assistant"),
    ]
    assert "\x1b" not in table
    assert "[bold]x[/bold]" in table  # markup shown as it is, never interpreted

    shown = json.loads(ok(await corral("--url", daemon.url, "session", agent, "--json")))
    assert shown["agentId"] == agent
    assert [m["content"] for m in shown["messages"]] == [
        "count the users",
        HOSTILE,
        "use users_v2",
        "done it",
    ]
