"""Sessions through real ``corral serve`` processes: a correction continues a failed turn's
work (the command line's ``corral prompt``, the worker reading ``CORRAL_SESSION_FILE``), a
session outlives ``kill -9``, and the ``history`` policies ``none`` and ``run`` hold.

Every wait polls with a bound."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.serve_process import CLI, WAIT_BOUND_S, ServeProcess, wait_for
from tests.support.serve_process import until_state as until

WORKER = [sys.executable, str(Path(__file__).with_name("workers") / "session_worker.py")]

# A test starts a daemon and waits for it to import and listen: seconds.
pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """One ``corral serve`` for the tests that need no restart: each works with agents of
    its own."""
    with ServeProcess(tmp_path_factory.mktemp("serve")) as served:
        yield served


def spawn(api: httpx.Client, **spec: Any) -> str:
    answer = api.post("/agents", json={"harness": "command", "command": WORKER, **spec})
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


def session(api: httpx.Client, agent_id: str) -> list[dict[str, Any]]:
    answer = api.get(f"/agents/{agent_id}/session")
    assert answer.status_code == 200, answer.text
    messages: list[dict[str, Any]] = answer.json()["messages"]
    return messages


def corral(daemon: ServeProcess, *args: str) -> str:
    """The command line, as an operator runs it; its stdout."""
    env = {k: v for k, v in os.environ.items() if k not in ("CORRAL_TOKEN", "CORRAL_HOME")}
    env |= {"CORRAL_URL": daemon.url, "CORRAL_TOKEN": daemon.token}
    done = subprocess.run(
        [*CLI, *args], env=env, capture_output=True, text=True, timeout=WAIT_BOUND_S
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_correction_continues_the_work_of_a_failed_turn(daemon: ServeProcess) -> None:
    task = "count the rows of the users table"
    with daemon.client() as api:
        agent_id = spawn(
            api, name="counter", prompt=task, onFailure="ask", env={"NEEDS_TABLE": "1"}
        )
        held = until(api, agent_id, "blocked")
        assert 'relation "users" does not exist' in held["lastError"]
        corral(daemon, "prompt", agent_id, "the table is called users_v2, try again")
        done = until(api, agent_id, "idle")
        said = json.loads(done["lastOutput"])
        # The worker got the correction on stdin and its original task from its session.
        assert said == {
            "task": task,
            "prompt": "the table is called users_v2, try again",
            "seen": 2,
        }
        shown = json.loads(corral(daemon, "session", agent_id, "--json"))
        assert [m["role"] for m in shown["messages"]] == ["user", "error", "user", "assistant"]
        assert shown["messages"][0]["content"] == task


def test_a_session_outlives_a_kill_9(tmp_path: Path) -> None:
    daemon = ServeProcess(tmp_path)
    try:
        daemon.start()
        with daemon.client() as api:
            agent_id = spawn(api, name="memory", prompt="remember the number 7")
            until(api, agent_id, "idle")
            before = session(api, agent_id)
        daemon.kill_9()
        daemon.start()
        with daemon.client() as api:
            assert session(api, agent_id) == before
            assert (
                api.post(f"/agents/{agent_id}/prompt", json={"text": "which?"}).status_code == 202
            )
            wait_for(lambda: until(api, agent_id, "idle")["turns"] == 2, "the second turn")
            said = json.loads(api.get(f"/agents/{agent_id}").json()["lastOutput"])
        assert said == {"task": "remember the number 7", "prompt": "which?", "seen": 2}
    finally:
        daemon.stop()


def test_history_none_keeps_nothing_and_run_history_goes_with_the_run(
    daemon: ServeProcess,
) -> None:
    with daemon.client() as api:
        forgetful = spawn(api, name="forgetful", prompt="first", history="none")
        until(api, forgetful, "idle")
        assert api.post(f"/agents/{forgetful}/prompt", json={"text": "second"}).status_code == 202
        wait_for(lambda: until(api, forgetful, "idle")["turns"] == 2, "the second turn")
        said = json.loads(api.get(f"/agents/{forgetful}").json()["lastOutput"])
        assert (said["task"], said["seen"]) == ("second", 0)
        assert session(api, forgetful) == []

        lead = spawn(api, name="lead", prompt="plan")
        helper = spawn(api, name="helper", prompt="help", parent=lead)
        until(api, lead, "idle")
        until(api, helper, "idle")
        assert api.post(f"/agents/{helper}/stop", json={}).status_code == 202
        assert len(session(api, lead)) == 2  # the run goes on: kept
        assert len(session(api, helper)) == 2
        assert api.post(f"/agents/{lead}/stop", json={}).status_code == 202
        until(api, lead, "stopped")
        assert session(api, lead) == []
        assert session(api, helper) == []
