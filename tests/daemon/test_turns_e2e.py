"""Turns and their logs through a real ``corral serve``: a command printing 100 MB leaves the
list small and its turn's log capped with a marker; a successful turn's stdout and stderr are
kept (and survive a restart); ``corral logs --follow`` sees lines while the turn runs;
``corral prompt --wait`` exits with the turn's outcome."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.serve_process import CLI, ServeProcess, agent_record, until_state, wait_for

MIB = 1024 * 1024
# 100 MB on stdout in 1 MB writes (fast: a second or so), a line on stderr first.
LOUD = (
    "import sys; sys.stderr.write('starting\\n'); sys.stderr.flush(); "
    "b = b'y' * 1_000_000\nfor _ in range(100): sys.stdout.buffer.write(b)"
)


def _cli_env(daemon: ServeProcess) -> dict[str, str]:
    return {**os.environ, "CORRAL_URL": daemon.url, "CORRAL_TOKEN": daemon.token}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """One daemon for the tests that do not restart it: each works with an agent of its own
    (a daemon takes seconds to start)."""
    with ServeProcess(tmp_path_factory.mktemp("turns")) as served:
        yield served


@pytest.mark.timeout(90)
def test_a_100_mb_turn_leaves_the_list_small_and_its_log_capped(daemon: ServeProcess) -> None:
    with daemon.client() as api:
        spec = {
            "name": "loud",
            "harness": "command",
            "command": [sys.executable, "-c", LOUD],
            "prompt": "shout",
        }
        created = api.post("/agents", json=spec)
        assert created.status_code == 201, created.text
        loud = created.json()["id"]
        until_state(api, loud, "idle")

        # The daemon is shared: the list may hold the other tests' (small) agents too.
        listed = api.get("/agents")
        assert len(listed.content) < 4_000, len(listed.content)
        shown = api.get(f"/agents/{loud}")
        # The record's output is kept up to the per-turn cap (1 MiB), then a marker.
        assert len(shown.content) < 1.2 * MIB, len(shown.content)
        assert "dropped" in shown.json()["lastOutput"][-200:]

        turns = api.get(f"/agents/{loud}/turns")
        assert turns.status_code == 200
        assert len(turns.content) < 2_000
        (record,) = turns.json()["turns"]
        assert record["outcome"] == "succeeded"
        assert record["logBytes"] == MIB
        assert record["droppedBytes"] == 100_000_000 + len("starting\n") - MIB

        one = api.get(f"/agents/{loud}/turns/1")
        assert len(one.content) < 2.5 * MIB, len(one.content)
        logs = one.json()["logs"]
        assert logs[0] == {"stream": "stderr", "text": "starting\n"}
        assert logs[-1]["stream"] == "corral"
        assert f"dropped {record['droppedBytes']} more bytes" in logs[-1]["text"]


@pytest.mark.timeout(90)
def test_a_successful_turn_keeps_stdout_and_stderr_across_a_restart(tmp_path: Path) -> None:
    script = "import sys; print('to stdout'); print('to stderr', file=sys.stderr)"
    daemon = ServeProcess(tmp_path).start()
    try:
        with daemon.client() as api:
            spec = {
                "name": "talker",
                "harness": "command",
                "command": [sys.executable, "-c", script],
                "prompt": "hi",
            }
            agent = api.post("/agents", json=spec).json()["id"]
            until_state(api, agent, "idle")
        daemon.stop()
        daemon.start()
        with daemon.client() as api:
            one = api.get(f"/agents/{agent}/turns/1").json()
            assert one["outcome"] == "succeeded"
            assert one["prompt"] == "hi"
            assert one["output"] == "to stdout\n"
            streams = {(e["stream"], e["text"]) for e in one["logs"]}
            assert streams == {("stdout", "to stdout\n"), ("stderr", "to stderr\n")}
            text = api.get(f"/agents/{agent}/logs", params={"format": "text"})
            assert sorted(text.text.splitlines()) == ["to stderr", "to stdout"]
            missing = api.get(f"/agents/{agent}/turns/9")
            assert (missing.status_code, missing.json()["error"]["code"]) == (
                404,
                "turn_not_found",
            )
    finally:
        daemon.stop()


@pytest.mark.timeout(90)
def test_logs_follow_sees_lines_while_the_turn_runs(daemon: ServeProcess, tmp_path: Path) -> None:
    go = tmp_path / "go"
    # Prints a line, waits until the test has seen it, prints another.
    script = (
        "import os, sys, time\n"
        "print('first line', flush=True)\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.02)\n"
        "print('second \\x1b[31mline', flush=True)\n"
    )
    with daemon.client() as api:
        spec = {
            "name": "slow",
            "harness": "command",
            "command": [sys.executable, "-c", script],
            "prompt": "go",
        }
        agent = api.post("/agents", json=spec).json()["id"]
        follower = subprocess.Popen(
            [*CLI, "logs", agent, "--follow"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=_cli_env(daemon),
        )
        seen: list[str] = []

        def read() -> None:
            assert follower.stdout is not None
            for line in follower.stdout:
                seen.append(line.rstrip("\n"))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            wait_for(lambda: "first line" in seen, "the first line while the turn runs")
            assert agent_record(api, agent)["state"] == "running"  # still waiting for go
            go.touch()
            # Untrusted text is printed escaped: the escape sequence is shown, not run.
            wait_for(lambda: "second \\x1b[31mline" in seen, "the second line")
        finally:
            follower.terminate()
            follower.wait(timeout=10)
            reader.join(timeout=10)
            assert follower.stdout is not None
            follower.stdout.close()


@pytest.mark.timeout(120)
def test_prompt_wait_exits_with_the_turns_outcome(daemon: ServeProcess) -> None:
    # The prompt decides: "ok" succeeds, "fail" exits 3, "hang" waits to be stopped.
    script = (
        "import sys, time\n"
        "p = sys.stdin.read().strip()\n"
        "if p == 'fail': sys.exit(3)\n"
        "if p == 'hang': time.sleep(60)\n"
        "print('answer to', p)\n"
    )
    with daemon.client() as api:
        spec = {"name": "w", "harness": "command", "command": [sys.executable, "-c", script]}
        agent = api.post("/agents", json={**spec, "onFailure": "ask"}).json()["id"]
        env = _cli_env(daemon)

        def prompt(text: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [*CLI, "prompt", agent, text, "--wait"],
                capture_output=True,
                text=True,
                env=env,
                timeout=60,
            )

        ok = prompt("ok")
        assert (ok.returncode, ok.stdout) == (0, "answer to ok\n"), ok.stderr
        failed = prompt("fail")
        assert failed.returncode == 10, failed.stderr
        assert "exited with code 3" in failed.stderr

        hang = subprocess.Popen(
            [*CLI, "prompt", agent, "hang", "--wait"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        until_state(api, agent, "running")
        stopped = api.post(f"/agents/{agent}/stop", json={})
        assert stopped.status_code == 202, stopped.text
        _, err = hang.communicate(timeout=60)
        assert hang.returncode == 11, err
        listed: Any = api.get(f"/agents/{agent}/turns").json()["turns"]
        assert [t["outcome"] for t in listed] == ["interrupted", "failed", "succeeded"]
