"""Coordinators through a real ``corral serve``: a parent woken by its child's notice, and a
model-driven coordinator (the ``openai`` harness with corral's tools, its "model" a scripted
server on loopback) that hires a worker, is woken when the worker is held, reads why, and
re-prompts it with a correction, so the worker succeeds.

One daemon serves both tests; every wait polls with a bound.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.daemon._wake import WAKE_TEXT
from tests.support.openai_server import OpenAIServer, completion, tool_call
from tests.support.serve_process import ServeProcess, wait_for

pytestmark = pytest.mark.timeout(60)  # a real daemon: seconds to import and listen

# A worker that counts rows of the table its prompt names: it waits for the file $GO (so
# the test scripts the model before the worker fails), then fails until it is told the
# table is called orders.
COUNTER = (
    'while [ ! -e "$GO" ]; do sleep 0.02; done; p=$(cat); '
    'case "$p" in *"called orders"*) echo "42 refunded orders";; '
    '*) echo "no such table: refunds" >&2; exit 1;; esac'
)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    with ServeProcess(tmp_path_factory.mktemp("serve")) as served:
        yield served


@pytest.fixture
def api(daemon: ServeProcess) -> Iterator[httpx.Client]:
    with daemon.client() as client:
        yield client


def spawn(api: httpx.Client, **spec: Any) -> str:
    answer = api.post("/agents", json=spec)
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


def until(api: httpx.Client, agent_id: str, state: str, turns: int) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        rec: dict[str, Any] = api.get(f"/agents/{agent_id}").json()
        return rec if (rec["state"], rec["turns"]) == (state, turns) else None

    found: dict[str, Any] = wait_for(reached, f"{agent_id} {state} after {turns} turns")
    return found


def turns_started(api: httpx.Client, agent_id: str) -> list[dict[str, Any]]:
    params = {"agent": agent_id, "format": "json"}
    page = api.get("/events", params=params).json()["events"]
    return [e["data"] for e in page if e["type"] == "agent.turn_started"]


def test_an_idle_command_parent_is_woken_by_its_childs_notice(api: httpx.Client) -> None:
    parent = spawn(api, name="lead", harness="command", command=["sh", "-c", "cat"], wake=True)
    spawn(
        api,
        name="indexer",
        harness="command",
        command=["sh", "-c", "echo indexed"],
        prompt="go",
        parent=parent,
        notifyOn=["done"],
    )
    rec = until(api, parent, "idle", 1)
    # The parent's command echoed its prompt: the notices, then why it was woken.
    assert "- indexer (" in rec["lastOutput"]
    assert "finished a turn: indexed" in rec["lastOutput"]
    assert rec["lastOutput"].strip().endswith(WAKE_TEXT)
    assert [t.get("woken") for t in turns_started(api, parent)] == [True]


def test_a_model_driven_coordinator_resolves_its_held_worker(
    api: httpx.Client, openai_server: OpenAIServer, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    worker_spec = {
        "name": "counter",
        "harness": "command",
        "command": ["sh", "-c", COUNTER],
        "env": {"GO": str(go)},
        "prompt": "count the refunded orders in table refunds",
        "onFailure": "ask",
        "notifyOn": ["done"],
        "turnTimeoutS": 30,
    }
    # Turn 1 (its prompt): hire the worker.
    openai_server.enqueue(
        completion(tool_calls=[tool_call("agent_spawn", {"spec": worker_spec})]),
        completion("hired a counter"),
    )
    lead = spawn(
        api,
        name="lead",
        harness="openai",
        openai={"baseUrl": openai_server.base_url, "model": "test-model", "corralTools": True},
        wake=True,
        mayAnswer=["blocked"],
        guardrails=[{"match": "agent_stop", "verdict": "block", "reason": "re-prompt instead"}],
        prompt="count the refunded orders: hire a worker",
    )
    until(api, lead, "idle", 1)
    (worker,) = api.get(f"/agents/{lead}").json()["children"]
    # Turn 2 (woken: the worker is held): read the inbox, try to stop it (the guardrails
    # refuse), re-prompt it with the correction. Turn 3 (woken: the worker is done).
    correction = {"agentId": worker, "text": "the table is called orders"}
    openai_server.enqueue(
        completion(tool_calls=[tool_call("inbox_read", {})]),
        completion(tool_calls=[tool_call("agent_stop", {"agentId": worker})]),
        completion(tool_calls=[tool_call("agent_prompt", correction)]),
        completion("re-prompted the counter"),
        completion("the counter is done"),
    )
    go.write_text("")
    done = until(api, worker, "idle", 2)
    assert done["lastOutput"] == "42 refunded orders\n"
    assert done["parent"] == lead
    coordinator = until(api, lead, "idle", 3)
    assert coordinator["lastOutput"] == "the counter is done"
    assert [t.get("woken", False) for t in turns_started(api, lead)] == [False, True, True]

    requests = [r.json for r in openai_server.requests]
    assert {"agent_spawn", "inbox_read", "decision_answer"} <= {
        t["function"]["name"] for t in requests[0]["tools"]
    }
    woken_prompt = requests[2]["messages"][-1]["content"]
    assert "counter (" in woken_prompt
    assert "is blocked (ask) and needs a decision: command exited with code 1" in woken_prompt
    assert "no such table: refunds" in woken_prompt
    tool_results = [m["content"] for m in requests[5]["messages"] if m["role"] == "tool"]
    # The session brings the first turn's agent_spawn result along; this turn's come last.
    assert len(tool_results) == 4
    assert worker in tool_results[0]
    inbox, stop, prompted = tool_results[1:]
    assert '"kind": "supervision"' in inbox
    assert stop == "tool 'agent_stop' refused: re-prompt instead"
    assert '"accepted": "prompt"' in prompted
    (resolved,) = [
        d
        for d in api.get("/decisions", params={"resolved": "true"}).json()["decisions"]
        if d["agentId"] == worker
    ]
    assert (resolved["answer"], resolved["by"]) == ("retry", lead)
