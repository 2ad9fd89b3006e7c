"""Stop, restart and delete through a real ``corral serve``: a command that traps SIGTERM
ends by itself within its grace, one that ignores it is killed after stopGraceS; stopping a
parent stops its children first (unless keepChildren); a failed agent restarted after a
daemon restart runs again in its working directory with its session; a deleted agent's
data goes while its events stay."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.serve_process import ServeProcess, agent_record, until_state, wait_for

pytestmark = pytest.mark.timeout(90)  # the daemon takes seconds to start on a loaded machine

# Writes its pid, then loops; on SIGTERM it writes a file and exits 0 (the trap runs once
# the short sleep in front of it returns).
POLITE = "trap 'echo term > got_term; exit 0' TERM; echo $$ > pid; while :; do sleep 0.05; done"
# Ignores SIGTERM (so does its sleep, which inherits it): only SIGKILL ends it.
STUBBORN = "trap '' TERM; echo $$ > pid; while :; do sleep 0.05; done"
# Fails its first turn (leaving a mark in its working directory), succeeds after.
SECOND_TIME = 'if [ -f mark ]; then echo "fine now"; else touch mark; exit 3; fi'


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """One daemon for the tests that neither restart it nor need it empty: each spawns agents
    of its own and reads only what concerns them (starting a daemon takes seconds)."""
    with ServeProcess(tmp_path_factory.mktemp("lifecycle")) as daemon:
        yield daemon


@pytest.fixture
def served(tmp_path: Path) -> Iterator[ServeProcess]:
    with ServeProcess(tmp_path) as daemon:
        yield daemon


@pytest.fixture
def api(shared: ServeProcess) -> Iterator[httpx.Client]:
    with shared.client() as client:
        yield client


def _spawn(api: httpx.Client, **spec: Any) -> str:
    spec.setdefault("harness", "command")
    spec.setdefault("command", ["true"])
    answer = api.post("/agents", json=spec)
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except FileNotFoundError:
        return True


def _pid_in(workdir: Path) -> int:
    raw = wait_for(lambda: (workdir / "pid").is_file() and (workdir / "pid").read_text(), "pid")
    return int(raw.strip())


def test_stop_sends_sigterm_first_and_sigkill_after_the_grace(api: httpx.Client) -> None:
    polite = _spawn(api, name="polite", command=["sh", "-c", POLITE], prompt="go", stopGraceS=60)
    stubborn = _spawn(
        api, name="stubborn", command=["sh", "-c", STUBBORN], prompt="go", stopGraceS=1
    )
    polite_dir = Path(agent_record(api, polite)["workdir"])
    stubborn_dir = Path(agent_record(api, stubborn)["workdir"])
    polite_pid, stubborn_pid = _pid_in(polite_dir), _pid_in(stubborn_dir)

    for agent_id in (polite, stubborn):
        answer = api.post(f"/agents/{agent_id}/stop", json={"why": "end of day"})
        assert answer.status_code == 202, answer.text
        assert answer.json() == {"id": agent_id, "accepted": "stop", "stopped": [agent_id]}
        assert agent_record(api, agent_id)["state"] == "stopped"

    # The polite one ran its trap (its 60 s grace never ran out), and ended.
    wait_for(lambda: (polite_dir / "got_term").is_file(), "the SIGTERM trap's file")
    wait_for(lambda: _gone(polite_pid), "the polite command to exit")
    # The stubborn one outlived SIGTERM and was killed once its 1 s grace had passed.
    wait_for(lambda: _gone(stubborn_pid), "the stubborn command to be killed")
    assert not (stubborn_dir / "got_term").exists()


def test_stop_now_kills_at_once(api: httpx.Client) -> None:
    agent_id = _spawn(api, name="polite", command=["sh", "-c", POLITE], prompt="go", stopGraceS=300)
    workdir = Path(agent_record(api, agent_id)["workdir"])
    pid = _pid_in(workdir)
    answer = api.post(f"/agents/{agent_id}/stop", json={"now": True})
    assert answer.status_code == 202, answer.text
    wait_for(lambda: _gone(pid), "the command to be killed")
    assert not (workdir / "got_term").exists()  # SIGKILL: no trap ran


def test_stopping_a_parent_stops_its_children_first(api: httpx.Client) -> None:
    lead = _spawn(api, name="lead")
    first = _spawn(api, name="first", parent=lead)
    second = _spawn(api, name="second", parent=lead, command=["sh", "-c", POLITE], prompt="go")
    answer = api.post(f"/agents/{lead}/stop", json={"by": "ana", "why": "wrong plan"})
    assert answer.status_code == 202, answer.text
    assert answer.json()["stopped"] == [first, second, lead]
    for agent_id in (lead, first, second):
        assert agent_record(api, agent_id)["state"] == "stopped"
    params: dict[str, str | int] = {"format": "json", "type": "agent.state_changed", "limit": 1000}
    log = api.get("/events", params=params).json()
    ours = {lead, first, second}  # the daemon is shared: other tests' agents stop too
    stops = [e for e in log["events"] if e["data"]["to"] == "stopped" and e["agentId"] in ours]
    assert [(e["agentId"], e["data"].get("stoppedWith")) for e in stops] == [
        (first, lead),
        (second, lead),
        (lead, None),
    ]

    other = _spawn(api, name="other")
    kept = _spawn(api, name="kept", parent=other)
    answer = api.post(f"/agents/{other}/stop", json={"keepChildren": True})
    assert answer.json()["stopped"] == [other]
    assert agent_record(api, kept)["state"] == "idle"


def test_restart_after_a_daemon_restart_then_delete(served: ServeProcess) -> None:
    with served.client() as api:
        agent_id = _spawn(
            api,
            name="flaky",
            command=["sh", "-c", SECOND_TIME],
            prompt="do it",
            history="permanent",
        )
        failed = until_state(api, agent_id, "failed", "idle")
        assert failed["state"] == "failed", failed
        live = _spawn(api, name="live")
        refused = api.post(f"/agents/{live}/restart", json={})
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"]["code"] == "agent_live"
    served.stop()
    served.start()
    with served.client() as api:
        body = {"by": "ana", "why": "fixed", "idempotencyKey": "r-1"}
        answer = api.post(f"/agents/{agent_id}/restart", json=body)
        assert answer.status_code == 202, answer.text
        assert answer.json() == {"id": agent_id, "accepted": "restart", "turn": 2}
        again = api.post(f"/agents/{agent_id}/restart", json=body)
        assert again.headers.get("Idempotency-Replayed") == "true"
        done = until_state(api, agent_id, "idle", "failed")
        assert (done["state"], done["lastOutput"], done["restarts"]) == ("idle", "fine now\n", 1)
        session = api.get(f"/agents/{agent_id}/session").json()["messages"]
        assert [(m["turn"], m["role"]) for m in session] == [
            (1, "user"),
            (1, "error"),
            (2, "user"),
            (2, "assistant"),
        ]

        workdir = Path(done["workdir"])
        assert (workdir / "mark").is_file()
        refused = api.delete(f"/agents/{agent_id}")
        assert refused.status_code == 409, refused.text
        assert api.post(f"/agents/{agent_id}/stop", json={}).status_code == 202
        deleted = api.request("DELETE", f"/agents/{agent_id}", json={"why": "cleanup"})
        assert deleted.status_code == 200, deleted.text
        assert deleted.json() == {"id": agent_id, "deleted": [agent_id]}
        gone = api.get(f"/agents/{agent_id}")
        assert gone.status_code == 404
        assert gone.json()["error"]["code"] == "agent_not_found"
        assert not os.path.exists(workdir.parent)
        assert api.get(f"/agents/{agent_id}/session").status_code == 404
        log = api.get("/events", params={"agent": agent_id, "format": "json"}).json()["events"]
        assert log[0]["type"] == "agent.created"
        assert log[-1]["type"] == "agent.deleted"
        assert log[-1]["data"]["why"] == "cleanup"
