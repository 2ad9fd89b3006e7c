"""A stalled turn through a real ``corral serve``: a shell agent that goes silent is
restarted, then escalated as a decision; a person's retry runs it again, and this time it
touches its heartbeat file while it works and finishes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.serve_process import ServeProcess
from tests.support.serve_process import until_state as _in_state

# Each attempt counts itself in its working directory; the first two sleep without a sign of
# life, the third beats every 0.2 s for 1.2 s (longer than heartbeatS) and finishes.
SCRIPT = (
    'n=$(cat attempts 2>/dev/null || echo 0); n=$((n + 1)); echo "$n" > attempts; '
    'if [ "$n" -lt 3 ]; then exec sleep 30; fi; '
    'for i in 1 2 3 4 5 6; do sleep 0.2; touch "$CORRAL_HEARTBEAT_FILE"; done; '
    'echo "done on attempt $n"'
)

pytestmark = pytest.mark.timeout(60)  # the daemon takes seconds to start on a loaded machine


@pytest.fixture
def api(tmp_path: Any) -> Iterator[httpx.Client]:
    with ServeProcess(tmp_path) as served, served.client() as client:
        yield client


def _events(api: httpx.Client, agent_id: str, *types: str) -> list[dict[str, Any]]:
    answer = api.get("/events", params={"agent": agent_id, "format": "json"})
    assert answer.status_code == 200, answer.text
    return [{"type": e["type"], **e["data"]} for e in answer.json()["events"] if e["type"] in types]


def test_a_stalled_command_is_restarted_then_escalated_then_retried(api: httpx.Client) -> None:
    spec = {
        "name": "sleepy",
        "harness": "command",
        "command": ["sh", "-c", SCRIPT],
        "prompt": "work",
        "heartbeatS": 0.5,
        "recovery": {"maxRetries": 3, "escalateAfter": 1, "cooldownS": 0},
    }
    created = api.post("/agents", json=spec)
    assert created.status_code == 201, created.text
    agent_id = created.json()["id"]

    held = _in_state(api, agent_id, "blocked", "failed", "idle")
    assert (held["state"], held["reason"]) == ("blocked", "stalled"), held
    assert held["stallRecoveries"] == 2
    stalls = _events(api, agent_id, "agent.turn_stalled", "agent.stall_recovery")
    assert [(e["type"], e["turn"]) for e in stalls] == [
        ("agent.turn_stalled", 1),
        ("agent.stall_recovery", 1),
        ("agent.turn_stalled", 2),
        ("agent.stall_recovery", 2),
    ]
    assert [e["action"] for e in stalls[1::2]] == ["restart", "escalate"]
    assert all(e["silenceS"] >= 0.5 and e["heartbeatS"] == 0.5 for e in stalls[::2])

    (decision,) = [d for d in api.get("/decisions").json()["decisions"] if d["agentId"] == agent_id]
    assert (decision["kind"], decision["reason"]) == ("blocked", "stalled")
    answer = api.post(f"/decisions/{decision['id']}", json={"answer": "retry", "why": "go on"})
    assert answer.status_code == 200, answer.text

    done = _in_state(api, agent_id, "idle", "failed", "blocked")
    assert done["state"] == "idle", done
    assert done["lastOutput"] == "done on attempt 3\n"
    assert "stallRecoveries" not in done  # a completed turn leaves its stalls behind
    assert len(_events(api, agent_id, "agent.turn_stalled")) == 2
