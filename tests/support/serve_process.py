"""``corral serve`` in a process of its own, for tests that need the real thing: the command
line, the token file, agents' processes calling back with ``corral check``, ``kill -9``.

Its output goes to a file (``<tmp>/serve-N.log``), not a pipe: a daemon whose pipe nobody
reads would block on a full pipe, and the file is there to read when a test fails.

    with ServeProcess(tmp_path) as daemon, daemon.client() as api:
        api.post("/agents", json=spec)
"""

from __future__ import annotations

import itertools
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from corral.daemon._auth import agent_token
from tests.support.front_door import serve_env, token_of

START_BOUND_S = 60.0  # importing the daemon takes seconds on a loaded machine; a bound only
WAIT_BOUND_S = 20.0  # any other wait on the daemon or its agents; a bound only
CLI = [sys.executable, "-m", "corral.cli"]
_logs = itertools.count(1)


def wait_for(condition: Callable[[], Any], what: str, *, within_s: float = WAIT_BOUND_S) -> Any:
    """Poll ``condition`` until it answers something truthy, and answer that; AssertionError
    naming ``what`` after ``within_s`` seconds."""
    deadline = time.monotonic() + within_s
    while True:
        found = condition()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within_s} s waiting for {what}")
        time.sleep(0.02)


class ServeProcess:
    """``corral serve`` over ``<tmp>/corral.db`` with home ``<tmp>/home`` (both kept
    across :meth:`start` calls, so a restart finds the same store and token); ``args`` are
    added to its command line. The first start takes a port the OS chooses, a restart the
    same one: the agents it started call back to the URL they were given."""

    def __init__(self, tmp_path: Path, *args: str) -> None:
        self.tmp_path = tmp_path
        self.home = tmp_path / "home"
        self.store = f"sqlite:///{tmp_path / 'corral.db'}"
        self.args = args
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = tmp_path / "serve-0.log"
        self.url = ""
        self.port = 0

    @property
    def command(self) -> list[str]:
        return [
            *CLI,
            "serve",
            "--port",
            str(self.port),
            "--store",
            self.store,
            "--home",
            str(self.home),
            *self.args,
        ]

    def start(self) -> ServeProcess:
        """Start it and wait for its listening line; AssertionError (with its output) when it
        exits first."""
        self.log_path = self.tmp_path / f"serve-{next(_logs)}.log"
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                self.command, stdout=log, stderr=subprocess.STDOUT, env=serve_env()
            )
        proc = self.proc

        def listening() -> str | None:
            found = re.search(r"listening on (http://\S+)", self.log())
            if found is None and proc.poll() is not None:
                raise AssertionError(f"corral serve exited {proc.returncode}:\n{self.log()}")
            return found.group(1) if found else None

        self.url = wait_for(listening, "corral serve to listen", within_s=START_BOUND_S)
        self.port = int(self.url.rsplit(":", 1)[1])
        return self

    def log(self) -> str:
        """What this start of the daemon has printed so far."""
        return self.log_path.read_text(errors="replace")

    @property
    def token(self) -> str:
        """The daemon's token, from the file it made in its home."""
        return token_of(self.home)

    def agent_token(self, agent_id: str) -> str:
        """The token the daemon gives ``agent_id`` (``CORRAL_TOKEN`` in its environment)."""
        return agent_token(self.token, agent_id)

    def client(self, token: str | None = "", **headers: str) -> httpx.Client:
        """A client of the daemon with ``token`` (default: the daemon's; None: no token)."""
        if token == "":
            token = self.token
        if token is not None:
            headers["authorization"] = f"Bearer {token}"
        return httpx.Client(base_url=self.url, headers=headers, timeout=WAIT_BOUND_S)

    def kill_9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(WAIT_BOUND_S)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it has not ended within the bound. Idempotent."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(WAIT_BOUND_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(WAIT_BOUND_S)

    def __enter__(self) -> ServeProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def agent_record(api: httpx.Client, agent_id: str) -> dict[str, Any]:
    """``GET /agents/{id}`` of a daemon under test (asserting it answers 200)."""
    answer = api.get(f"/agents/{agent_id}")
    assert answer.status_code == 200, answer.text
    found: dict[str, Any] = answer.json()
    return found


def until_state(api: httpx.Client, agent_id: str, *states: str) -> dict[str, Any]:
    """The agent's record once it is in one of ``states`` (within :data:`WAIT_BOUND_S`)."""

    def reached() -> dict[str, Any] | None:
        rec = agent_record(api, agent_id)
        return rec if rec["state"] in states else None

    found: dict[str, Any] = wait_for(reached, f"agent {agent_id} to be {'/'.join(states)}")
    return found
