"""Lean lists through a real ``corral serve``: an agent printing 5 MB leaves the list small,
its env's values are never served, and ``corral agents`` follows the cursor."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

import pytest

from tests.support.serve_process import CLI, ServeProcess, wait_for

SECRET = "sk-e2e-secret"
# Prints 5 MB on stdout (the turn's output), then ends the turn.
LOUD = "python3 -c \"import sys; sys.stdout.write('y' * 5_000_000)\""


@pytest.mark.timeout(60)
def test_a_loud_agent_leaves_the_list_small(tmp_path: Path) -> None:
    with ServeProcess(tmp_path) as daemon, daemon.client() as api:
        spec = {
            "name": "loud",
            "harness": "command",
            "command": ["sh", "-c", LOUD],
            "env": {"API_KEY": SECRET},
            "prompt": "shout",
        }
        created = api.post("/agents", json=spec)
        assert created.status_code == 201, created.text
        loud = created.json()["id"]
        quiet = [
            api.post("/agents", json={**spec, "name": f"q{i}", "prompt": None}).json()["id"]
            for i in range(3)
        ]

        def settled() -> bool:
            return bool(api.get(f"/agents/{loud}").json()["state"] in ("idle", "failed"))

        wait_for(settled, "the loud agent's turn")
        listed = api.get("/agents")
        assert listed.status_code == 200
        assert len(listed.content) < 4_000, len(listed.content)
        assert [a["id"] for a in listed.json()["agents"]] == [loud, *quiet]
        assert SECRET not in listed.text
        shown = api.get(f"/agents/{loud}").json()
        assert shown["spec"]["env"] == {"API_KEY": "***"}
        assert len(shown["lastOutput"] or "") >= 1_000_000  # the record in full still has it
        events = api.get("/events", params={"format": "json", "type": "agent.created"})
        assert SECRET not in events.text
        assert len(events.json()["events"]) == 4
        refused = api.get("/agents", params={"limit": "5000"})
        assert (refused.status_code, refused.json()["error"]["code"]) == (422, "invalid_query")

        env = {"CORRAL_URL": daemon.url, "CORRAL_TOKEN": daemon.token}
        cli = subprocess.run(
            [*CLI, "agents", "--json"],
            capture_output=True,
            text=True,
            timeout=20,
            env={**os.environ, **env},
            check=True,
        )
        assert [a["id"] for a in json.loads(cli.stdout)] == [loud, *quiet]


@pytest.mark.timeout(90)
def test_paging_neither_repeats_nor_skips_while_another_client_spawns(tmp_path: Path) -> None:
    # Two clients of one real daemon: one spawns without pause, the other pages with a small
    # limit at the same time. Every agent there before the paging began is seen exactly once,
    # oldest first, and no agent is seen twice (cursor paging on (createdAt, id)).
    spec = {"harness": "command", "command": ["true"]}
    with ServeProcess(tmp_path) as daemon, daemon.client() as api, daemon.client() as other:
        before = [
            api.post("/agents", json={**spec, "name": f"b{i}"}).json()["id"] for i in range(30)
        ]
        stop = threading.Event()
        spawned: list[str] = []

        def spawner() -> None:
            i = 0
            while not stop.is_set() and i < 300:
                answer = other.post("/agents", json={**spec, "name": f"c{i}"})
                assert answer.status_code == 201, answer.text
                spawned.append(answer.json()["id"])
                i += 1

        thread = threading.Thread(target=spawner)
        thread.start()
        try:
            wait_for(lambda: len(spawned) >= 3, "the spawner's first agents")
            seen: list[str] = []
            cursor: str | None = None
            while True:
                params: dict[str, str | int] = {"limit": 3}
                if cursor is not None:
                    params["cursor"] = cursor
                page = api.get("/agents", params=params).json()
                seen += [a["id"] for a in page["agents"]]
                cursor = page["nextCursor"]
                if cursor is None or len(seen) > 400:
                    break
        finally:
            stop.set()
            thread.join(timeout=30)
        assert len(seen) == len(set(seen)), "an agent was listed twice"
        assert seen[: len(before)] == before
        assert spawned, "the spawner made no agent while the list was paged"
        assert set(spawned[:3]) <= set(seen)  # made before the paging began
