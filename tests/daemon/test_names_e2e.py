"""Names and PATCH through a real ``corral serve`` and the ``corral`` command: ``corral show
NAME``, a clash refused with the holder's id, and ``corral patch`` recorded with who and
why."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.serve_process import CLI, ServeProcess


def corral(daemon: ServeProcess, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"CORRAL_URL": daemon.url, "CORRAL_TOKEN": daemon.token}
    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        timeout=20,
        env={**os.environ, **env},
        check=False,
    )


def spec(name: str, **more: Any) -> dict[str, Any]:
    return {"name": name, "harness": "command", "command": ["cat"], **more}


@pytest.mark.timeout(60)
def test_names_and_patch_through_serve_and_the_cli(tmp_path: Path) -> None:
    with ServeProcess(tmp_path) as daemon, daemon.client() as api:
        lead = api.post("/agents", json=spec("lead")).json()["id"]
        ask = api.post("/agents", json=spec("ask-1", parent=lead)).json()["id"]

        shown = corral(daemon, "show", "ask-1", "--json")
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["id"] == ask

        clash = api.post("/agents", json=spec("ask-1", parent=lead))
        assert clash.status_code == 409
        assert clash.json()["error"]["code"] == "name_taken"
        assert ask in clash.json()["error"]["message"]

        patched = corral(
            daemon,
            "patch",
            "ask-1",
            "--notify-on",
            "done",
            "--add-rule",
            '{"match": "deploy", "verdict": "block"}',
            "--why",
            "release day",
            "--json",
        )
        assert patched.returncode == 0, patched.stderr
        rec = json.loads(patched.stdout)
        assert rec["spec"]["notifyOn"] == ["done"]
        assert [r["match"] for r in rec["spec"]["guardrails"]] == ["deploy"]

        events = api.get(
            "/events", params={"format": "json", "agent": "ask-1", "type": "agent.spec_changed"}
        ).json()["events"]
        assert [(e["data"]["by"], e["data"]["why"]) for e in events] == [
            ("operator", "release day")
        ]

        unknown = corral(daemon, "patch", "nobody", "--notify-on", "done", "--why", "x")
        assert unknown.returncode == 3
        assert "agent_not_found" in unknown.stderr
