"""Budgets across the tree and run stop through a real ``corral serve``: a child that tries to
overspend gets what its root has left and the tree stops at the root's limit; ``corral stop
--run`` ends every agent of a run, children first, with one reason.

One daemon serves both tests (a daemon takes seconds to start); every wait polls with a
bound.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.serve_process import CLI, WAIT_BOUND_S, ServeProcess, wait_for

# Each turn of this python agent reports 42 tokens and $0.25.
SPENDER = "tests.daemon.workers.py_funcs:with_usage"

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    with ServeProcess(tmp_path_factory.mktemp("serve")) as served:
        yield served


@pytest.fixture
def api(daemon: ServeProcess) -> Iterator[httpx.Client]:
    with daemon.client() as client:
        yield client


def spawn(api: httpx.Client, **spec: Any) -> dict[str, Any]:
    answer = api.post("/agents", json=spec)
    assert answer.status_code == 201, answer.text
    found: dict[str, Any] = answer.json()
    return found


def settled(api: httpx.Client, agent_id: str) -> dict[str, Any]:
    """The agent's record once no turn of it runs."""

    def done() -> dict[str, Any] | None:
        rec: dict[str, Any] = api.get(f"/agents/{agent_id}").json()
        return rec if rec["state"] not in ("running", "waiting") else None

    found: dict[str, Any] = wait_for(done, f"agent {agent_id} to finish its turn")
    return found


def turn(api: httpx.Client, agent_id: str) -> dict[str, Any]:
    answer = api.post(f"/agents/{agent_id}/prompt", json={"text": "more"})
    assert answer.status_code == 202, answer.text
    return settled(api, agent_id)


def cli(daemon: ServeProcess, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CORRAL_TOKEN", "CORRAL_HOME")}
    env |= {"CORRAL_URL": daemon.url, "CORRAL_TOKEN": daemon.token, "COLUMNS": "200"}
    return subprocess.run(
        [*CLI, *args], env=env, capture_output=True, text=True, timeout=WAIT_BOUND_S
    )


def test_a_child_that_tries_to_overspend_gets_what_is_left_and_the_tree_stops_at_the_root(
    daemon: ServeProcess, api: httpx.Client
) -> None:
    root = spawn(api, name="root", harness="command", command=["true"], budget={"maxTokens": 100})
    spender = {"harness": "python", "function": SPENDER, "parent": root["id"], "prompt": "go"}
    first = spawn(api, name="first", budget={"maxTokens": 1000}, **spender)
    assert first["budget"]["maxTokens"] == 100
    assert first["budgetCapped"] == [{"dimension": "maxTokens", "asked": 1000, "granted": 100}]
    assert settled(api, first["id"])["usage"]["tokens"] == 42
    assert turn(api, first["id"])["usage"]["tokens"] == 84
    # What is left of the root is 16: a second child asking 1000 gets 16.
    second = spawn(api, name="second", budget={"maxTokens": 1000}, **spender)
    assert second["budgetCapped"] == [{"dimension": "maxTokens", "asked": 1000, "granted": 16}]
    assert settled(api, second["id"])["usage"]["tokens"] == 42
    # The root's subtree has spent 126 of 100: no turn of the tree starts any more, though
    # the first child's own count (84 of 100) would leave it room.
    refused = api.post(f"/agents/{first['id']}/prompt", json={"text": "more"})
    assert refused.status_code == 409, refused.text
    error = refused.json()["error"]
    assert error["code"] == "budget_exhausted"
    assert (error["details"]["ancestor"], error["details"]["used"]) == (root["id"], 126)
    held = api.get(f"/agents/{first['id']}").json()
    assert (held["state"], held["reason"]) == ("blocked", "budget-exhausted")
    refused = api.post(f"/agents/{root['id']}/prompt", json={"text": "go"})
    assert refused.json()["error"]["code"] == "budget_exhausted"
    view = api.get(f"/runs/{root['runId']}").json()
    top = view["agents"][0]
    assert (top["id"], top["treeUsage"]["tokens"], top["budget"]["maxTokens"]) == (
        root["id"],
        126,
        100,
    )
    assert view["headcount"]["active"] == 3
    shown = cli(daemon, "run", root["runId"])
    assert shown.returncode == 0, shown.stderr
    assert "tokens 126/100" in shown.stdout
    assert "tokens 42/16" in shown.stdout


def test_corral_stop_run_stops_every_agent_children_first_with_one_reason(
    daemon: ServeProcess, api: httpx.Client
) -> None:
    root = spawn(api, name="root", harness="command", command=["true"])
    child = spawn(
        api,
        name="sleeper",
        harness="command",
        command=["sleep", "30"],
        parent=root["id"],
        prompt="go",
    )
    grandchild = spawn(api, name="leaf", harness="command", command=["true"], parent=child["id"])
    after = api.get("/events", params={"format": "json", "limit": 1}).json()["lastSeq"]
    stopped = cli(daemon, "stop", "--run", root["runId"], "--by", "alice", "--why", "enough")
    assert stopped.returncode == 0, stopped.stderr
    assert "3 agent(s) stopped" in stopped.stdout
    events = api.get("/events", params={"format": "json", "after": after}).json()["events"]
    ends = [
        e for e in events if e["type"] == "agent.state_changed" and e["data"]["to"] == "stopped"
    ]
    assert [e["agentId"] for e in ends] == [grandchild["id"], child["id"], root["id"]]
    # One reason on each; the daemon's own token records itself as who stopped them.
    assert {(e["data"]["by"], e["data"]["why"], e["data"]["runStop"]) for e in ends} == {
        ("operator", "enough", root["runId"])
    }
    interrupted = [e for e in events if e["type"] == "agent.turn_interrupted"]
    assert [e["agentId"] for e in interrupted] == [child["id"]]
    view = api.get(f"/runs/{root['runId']}").json()
    assert {n["state"] for n in view["agents"]} == {"stopped"}
    assert view["headcount"]["active"] == 0
