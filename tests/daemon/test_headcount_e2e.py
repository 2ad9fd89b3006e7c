"""Headcount and priority through a real ``corral serve --max-concurrent-turns 1``: preemption
to ``paused`` and resume that never pass the run's cap (checked at every event of the log),
and a critical agent's turn run before the low ones waiting for the daemon's one turn slot.

One daemon serves both tests (a daemon takes seconds to start); every wait polls with a bound.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.serve_process import ServeProcess, wait_for

pytestmark = pytest.mark.timeout(60)  # the first test waits for the daemon to start


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    with ServeProcess(tmp_path_factory.mktemp("serve"), "--max-concurrent-turns", "1") as served:
        yield served


@pytest.fixture
def api(daemon: ServeProcess) -> Iterator[httpx.Client]:
    with daemon.client() as client:
        yield client


def spawn(api: httpx.Client, name: str, **spec: Any) -> httpx.Response:
    body = {"name": name, "harness": "command", "command": ["true"], **spec}
    return api.post("/agents", json=body)


def spawned(api: httpx.Client, name: str, **spec: Any) -> str:
    answer = spawn(api, name, **spec)
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


def state(api: httpx.Client, agent_id: str) -> str:
    answer = api.get(f"/agents/{agent_id}")
    assert answer.status_code == 200, answer.text
    return str(answer.json()["state"])


def is_idle(api: httpx.Client, agent_id: str) -> bool:
    return state(api, agent_id) == "idle"


def active_in(api: httpx.Client, run_id: str) -> int:
    agents = api.get("/agents").json()["agents"]
    live = ("running", "waiting", "idle", "blocked")
    return sum(1 for a in agents if a["runId"] == run_id and a["state"] in live)


def test_preemption_and_resume_never_pass_the_cap(api: httpx.Client) -> None:
    root = spawned(
        api, "root", priority="critical", spawnBudget={"maxAgents": 3, "allowPreempt": True}
    )
    run_id = api.get(f"/agents/{root}").json()["runId"]
    low1 = spawned(api, "low1", parent=root, priority="low")
    low2 = spawned(api, "low2", parent=root, priority="low")
    high = spawned(api, "high", parent=root, priority="high")
    assert state(api, low2) == "paused"  # the most recent of the lowest
    boss = spawned(api, "boss", parent=root, priority="critical")
    assert [state(api, low1), state(api, low2)] == ["paused", "paused"]
    assert active_in(api, run_id) == 3

    refused = spawn(api, "more", parent=root, priority="high")
    assert refused.status_code == 409, refused.text
    error = refused.json()["error"]
    assert error["code"] == "spawn_budget_exceeded"
    assert "3 live agents of a cap of 3" in error["message"]

    prompted = api.post(f"/agents/{low1}/prompt", json={"text": "work"})
    assert prompted.status_code == 409, prompted.text
    assert prompted.json()["error"]["code"] == "agent_paused"

    # Headcount frees: the first paused of the equals resumes, then the other.
    assert api.post(f"/agents/{high}/stop").status_code == 202
    assert [state(api, low1), state(api, low2)] == ["paused", "idle"]
    assert api.post(f"/agents/{boss}/stop").status_code == 202
    assert state(api, low1) == "idle"
    assert active_in(api, run_id) == 3

    # At no event of the log did the run have more active agents than its cap.
    events = api.get("/events", params={"format": "json"}).json()
    states: dict[str, str] = {}
    for event in events["events"]:
        if event["type"] == "agent.created" and event["data"]["agent"]["runId"] == run_id:
            states[event["agentId"]] = event["data"]["agent"]["state"]
        elif event["type"] == "agent.state_changed" and event["agentId"] in states:
            states[event["agentId"]] = event["data"]["to"]
        active = [a for a, s in states.items() if s not in ("paused", "stopped", "failed")]
        assert len(active) <= 3, (event, states)
    paused = [
        e["data"]
        for e in events["events"]
        if e["type"] == "agent.state_changed" and e["data"]["to"] == "paused"
    ]
    assert [(p["by"], p["reason"]) for p in paused] == [(high, "preempted"), (boss, "preempted")]


def test_a_critical_turn_runs_before_the_low_ones_waiting_for_a_slot(
    api: httpx.Client, tmp_path: Path
) -> None:
    log, go = tmp_path / "order.log", tmp_path / "go"
    # Each turn appends its agent's name; the first holds the one slot until "go" exists.
    script = (
        "import os, pathlib, sys, time\n"
        "name = os.environ['CORRAL_AGENT_NAME']\n"
        "go = pathlib.Path(os.environ['GO'])\n"
        "while name == 'holder' and not go.exists():\n"
        "    time.sleep(0.02)\n"
        "with open(os.environ['LOG'], 'a') as f:\n"
        "    f.write(name + '\\n')\n"
        "print(name)\n"
    )
    env = {"LOG": str(log), "GO": str(go)}
    worker = {"command": [sys.executable, "-c", script], "env": env, "prompt": "go"}
    holder = spawned(api, "holder", **worker)
    wait_for(lambda: state(api, holder) == "running", "the holder to run")
    lows = [spawned(api, f"low{i}", priority="low", **worker) for i in range(3)]
    boss = spawned(api, "boss", priority="critical", **worker)

    def queued(agent_id: str) -> bool:
        return bool(api.get(f"/agents/{agent_id}").json().get("queued"))

    for agent_id in (*lows, boss):
        wait_for(partial(queued, agent_id), f"agent {agent_id} to wait for a turn slot")
    go.write_text("go")
    for agent_id in (holder, *lows, boss):
        wait_for(partial(is_idle, api, agent_id), f"agent {agent_id} to be idle")
    order = log.read_text().split()
    assert order == ["holder", "boss", "low0", "low1", "low2"], json.dumps(order)
