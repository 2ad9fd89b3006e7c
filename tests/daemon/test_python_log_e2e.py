"""A python agent's prints and log records through a real ``corral serve``: they are in its
turn's record (``GET /agents/{id}/turns/{n}``), from the worker process it ran in."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.serve_process import ServeProcess, until_state

CHATTY = "tests.daemon.workers.py_logs:chatty"


@pytest.mark.timeout(90)
def test_a_python_agents_prints_and_log_records_are_in_its_turn(tmp_path: Path) -> None:
    with ServeProcess(tmp_path) as daemon, daemon.client() as api:
        spec = {"name": "chatty", "harness": "python", "function": CHATTY, "prompt": "hi"}
        created = api.post("/agents", json=spec)
        assert created.status_code == 201, created.text
        agent = created.json()["id"]
        until_state(api, agent, "idle")

        one = api.get(f"/agents/{agent}/turns/1")
        assert one.status_code == 200, one.text
        record = one.json()
        assert (record["outcome"], record["output"]) == ("succeeded", "chatted")
        assert record["logs"] == [
            {"stream": "stdout", "text": "out: hi\n"},
            {"stream": "stderr", "text": "err: oops\n"},
            {"stream": "log", "text": "INFO chatty: info record 1\nWARNING chatty: warned\n"},
            {
                "stream": "stdout",
                "text": "[corral: the turn's log was capped at 1 bytes: dropped 9 more bytes]\n"
                "bell\x07 nul\ufffd \x1b[31mred\x1b[0m\nno newline at the end",
            },
        ]
        # Nothing of it is the daemon's own: no corral line, nothing dropped.
        assert record["droppedBytes"] == 0
        text = api.get(f"/agents/{agent}/logs", params={"format": "text"})
        assert "WARNING chatty: warned" in text.text.splitlines()
