"""``kill -9`` of a real daemon process in the middle of a turn, then a restart on the same store.

After the restart: the interrupted turn's leftover process is ended, ``agent.turn_interrupted``
is emitted, the turn counts as failed ("daemon restarted during turn") and the policy applies;
blocked, idle and stopped agents come back as they were, with their pending notices; the event
log continues without a gap; an SSE client resumes with Last-Event-ID; and replaying the log
rebuilds the projections exactly. On SQLite and on PostgreSQL.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.front_door import bearer, serve_env
from tests.support.replay import assert_projections_equal_replay

# First attempt: hang (the daemon is killed meanwhile); second attempt: succeed.
HANG_ONCE = (
    "import pathlib, sys, time\n"
    "sys.stdin.read()\n"
    "marker = pathlib.Path('attempted')\n"
    "if not marker.exists():\n"
    "    marker.write_text('1')\n"
    "    time.sleep(120)\n"
    "print('recovered after the restart')\n"
)
FAIL = "import sys; sys.stdin.read(); sys.exit('refusing without a person')"
BOUND_S = 20.0


class Daemon:
    def __init__(self, store: str, home: Path) -> None:
        self.store = store
        self.home = home
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "corral.cli",
                "serve",
                "--port",
                "0",
                "--store",
                self.store,
                "--home",
                str(self.home),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=serve_env(),
        )
        assert self.proc.stdout is not None
        deadline = time.monotonic() + BOUND_S
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            match = re.search(r"listening on (http://\S+)", line)
            if match:
                self.url = match.group(1)
                return
            if not line and self.proc.poll() is not None:
                break
        raise AssertionError(f"the daemon did not start (exit {self.proc.poll()})")

    def client(self) -> httpx.Client:
        """A client of the daemon with the token it made in its home (the same across
        restarts: the file is kept)."""
        return httpx.Client(base_url=self.url, headers=bearer(self.home), timeout=BOUND_S)

    def kill_9(self) -> str:
        """Kill the daemon; what it printed after it said where it listens."""
        assert self.proc is not None
        assert self.proc.stdout is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(BOUND_S)
        return self.proc.stdout.read()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(BOUND_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(BOUND_S)
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()


@contextmanager
def daemon(store: str, home: Path) -> Iterator[Daemon]:
    d = Daemon(store, home)
    d.start()
    try:
        yield d
    finally:
        d.stop()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state != "Z"


def wait_for(condition: Any, what: str) -> None:
    deadline = time.monotonic() + BOUND_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def spawn(client: httpx.Client, **spec: Any) -> str:
    answer = client.post("/agents", json={"harness": "command", **spec})
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


def events(client: httpx.Client, after: int = 0, agent: str | None = None) -> list[dict[str, Any]]:
    params: dict[str, Any] = {"format": "json", "after": after, "limit": 1000}
    if agent:
        params["agent"] = agent
    found: list[dict[str, Any]] = client.get("/events", params=params).json()["events"]
    return found


def sse_after(url: str, home: Path, last_event_id: int, count: int) -> list[dict[str, Any]]:
    """The first ``count`` events an SSE client gets when it resumes after ``last_event_id``."""
    got: list[dict[str, Any]] = []
    headers = {"Last-Event-ID": str(last_event_id), **bearer(home)}
    with (
        httpx.Client(timeout=BOUND_S) as client,
        client.stream("GET", url + "/events", headers=headers) as response,
    ):
        for line in response.iter_lines():
            if line.startswith("data:"):
                got.append(json.loads(line[5:]))
                if len(got) == count:
                    break
    return got


def run_scenario(store: str, tmp_path: Path) -> None:
    home = tmp_path / "home"
    py = sys.executable
    with daemon(store, home) as first, first.client() as api:
        lead = spawn(api, name="lead", command=[py, "-c", "print('lead')"])
        hang = spawn(
            api,
            name="hang",
            command=[py, "-c", HANG_ONCE],
            prompt="work",
            onFailure="retry",
            maxRetries=1,
        )
        blocked = spawn(
            api, name="blocked", command=[py, "-c", FAIL], prompt="go", onFailure="ask", parent=lead
        )
        idle = spawn(api, name="idle", command=[py, "-c", "print(1)"])
        stopped = spawn(api, name="stopped", command=[py, "-c", "print(1)"])
        assert api.post(f"/agents/{stopped}/stop", json={}).status_code == 202
        wait_for(lambda: api.get(f"/agents/{blocked}").json()["state"] == "blocked", "a hold")
        pid_file = home / "agents" / hang / "state" / "turn.pid"
        wait_for(pid_file.exists, "the hanging turn's pid file")
        pid = json.loads(pid_file.read_text())["pid"]
        before = {a["id"]: a for a in api.get("/agents").json()["agents"]}
        last_seq = events(api)[-1]["seq"]
        log = first.kill_9()

    assert f"agent {blocked}: running -> blocked (ask): command exited with code 1" in log

    assert alive(pid), "the turn's process outlives the daemon (it has its own session)"

    with daemon(store, home) as second, second.client() as api:
        wait_for(lambda: not alive(pid), "the leftover turn process to be ended")
        wait_for(lambda: api.get(f"/agents/{hang}").json()["state"] == "idle", "the retry")
        after = events(api, after=last_seq, agent=hang)
        kinds = [e["type"] for e in after]
        assert kinds[:3] == ["agent.turn_interrupted", "agent.turn_failed", "agent.turn_started"]
        assert after[1]["data"]["error"] == "daemon restarted during turn"
        assert after[1]["data"]["consecutiveFailures"] == 1
        assert after[2]["data"]["retry"] is True
        assert (
            api.get(f"/agents/{hang}").json()["lastOutput"].strip() == "recovered after the restart"
        )

        now = {a["id"]: a for a in api.get("/agents").json()["agents"]}
        for agent_id in (blocked, idle, stopped, lead):
            assert now[agent_id] == before[agent_id], f"{agent_id} changed across the restart"
        notices = api.get(f"/agents/{lead}/inbox").json()["notices"]
        assert [(n["kind"], n["state"]) for n in notices] == [("supervision", "pending")]
        assert [d["agentId"] for d in api.get("/decisions").json()["decisions"]] == [blocked]

        seqs = [e["seq"] for e in events(api)]
        assert seqs == list(range(1, len(seqs) + 1)), "the log has a gap"
        resumed = sse_after(second.url, home, last_seq, 3)
        assert [e["seq"] for e in resumed] == [last_seq + 1, last_seq + 2, last_seq + 3]
        assert resumed[0]["type"] == "agent.turn_interrupted"

    assert_projections_equal_replay(store)


def test_kill_9_mid_turn_on_sqlite(tmp_path: Path) -> None:
    run_scenario(f"sqlite:///{tmp_path / 'corral.db'}", tmp_path)


@pytest.mark.postgres
def test_kill_9_mid_turn_on_postgresql(tmp_path: Path, postgres_dsn: str) -> None:
    from psycopg.conninfo import conninfo_to_dict

    parts = conninfo_to_dict(postgres_dsn)
    url = f"postgresql://{parts['user']}@{parts['host']}:{parts['port']}/{parts['dbname']}"
    run_scenario(url, tmp_path)
    assert not list(tmp_path.glob("*dbname*")), "the daemon wrote SQLite, not PostgreSQL"
    import psycopg

    with psycopg.connect(postgres_dsn) as conn:
        (agents,) = conn.execute("SELECT count(*) FROM agents").fetchone() or (0,)
    assert agents == 5
