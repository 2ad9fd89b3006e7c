"""Signs of life the harnesses report (``TurnRequest.heartbeat``): a command touching its
heartbeat file or writing output, a python function calling ``context.heartbeat()``, an
``openai`` agent's model and tool calls. Real processes, real time (a few tenths of a second)."""

from __future__ import annotations

import os
import stat
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from corral.daemon import CommandHarness, OpenAIHarness, PythonHarness, TurnRequest, parse_spec
from corral.daemon.harnesses._liveness import HEARTBEAT_ENV, heartbeat_path, poll_s
from tests.support.openai_server import OpenAIServer, completion, tool_call

TOOL_WORKER = str(Path(__file__).with_name("workers") / "tool_worker.py")


class Beats:
    """A ``heartbeat`` that counts its calls."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


def _request(tmp_path: Path, spec: dict[str, Any], beats: Beats, prompt: str = "go") -> TurnRequest:
    workdir = (tmp_path / "work").resolve()
    workdir.mkdir(exist_ok=True)
    return TurnRequest(
        agent_id="a_0000beef",
        turn=1,
        prompt=prompt,
        spec=parse_spec({"name": "w", "heartbeatS": 0.2, **spec}),
        workdir=workdir,
        state_dir=tmp_path / "state",
        timeout_s=20.0,
        heartbeat=beats,
    )


def _left(state_dir: Path) -> list[str]:
    return sorted(p.name for p in state_dir.iterdir())


def _shell(tmp_path: Path, script: str, beats: Beats) -> TurnRequest:
    return _request(tmp_path, {"harness": "command", "command": ["sh", "-c", script]}, beats)


def test_files_are_looked_at_a_few_times_per_heartbeat() -> None:
    assert poll_s(0.2) == pytest.approx(0.05)
    assert poll_s(3600) == 1.0
    assert poll_s(0.001) == 0.02


def test_the_heartbeat_file_is_named_by_an_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "agents" / "a_1" / "state"
    for _ in range(2):  # the second time from the paths kept for recent agents
        assert heartbeat_path(state) == state / "heartbeat"
    assert heartbeat_path(tmp_path / "x" / ".." / "state") == tmp_path / "state" / "heartbeat"
    # A relative state directory (a daemon started with a relative home) is the daemon's.
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    for where in ("one", "two"):
        monkeypatch.chdir(tmp_path / where)
        assert heartbeat_path(Path("state")) == Path.cwd() / "state" / "heartbeat"
        assert Path.cwd().name == where


async def test_a_command_touching_its_heartbeat_file_beats(tmp_path: Path) -> None:
    beats = Beats()
    touch = f'touch "${HEARTBEAT_ENV}"'
    script = f'echo "${HEARTBEAT_ENV}"; for i in 1 2 3 4 5 6; do sleep 0.1; {touch}; done'
    result = await CommandHarness().run_turn(_shell(tmp_path, script, beats))
    named = Path(result.output.strip())
    assert named == (tmp_path / "state" / "heartbeat").resolve()
    assert beats.count >= 3
    # Kept for the next turn (the files a command turn keeps are gone).
    assert _left(tmp_path / "state") == ["heartbeat"]


@pytest.mark.parametrize("stream", ["", ">&2"])
async def test_a_command_writing_output_beats(tmp_path: Path, stream: str) -> None:
    beats = Beats()
    script = f"for i in 1 2 3 4 5 6; do sleep 0.1; echo tick {stream}; done"
    await CommandHarness().run_turn(_shell(tmp_path, script, beats))
    assert beats.count >= 3


async def test_a_silent_command_does_not_beat(tmp_path: Path) -> None:
    beats = Beats()
    await CommandHarness().run_turn(_shell(tmp_path, "sleep 0.6", beats))
    assert beats.count <= 1  # the output file appearing as the command starts, at most


async def test_without_heartbeat_nothing_is_watched_but_the_file_is_named(tmp_path: Path) -> None:
    beats = Beats()
    request = replace(_shell(tmp_path, f'touch "${HEARTBEAT_ENV}"; echo ok', beats), heartbeat=None)
    assert (await CommandHarness().run_turn(request)).output == "ok\n"
    assert beats.count == 0


async def test_a_python_function_calling_heartbeat_beats(tmp_path: Path) -> None:
    beats = Beats()
    spec = {"harness": "python", "function": "tests.daemon.workers.py_funcs:beating"}
    harness = PythonHarness()
    try:
        result = await harness.run_turn(_request(tmp_path, spec, beats, prompt="6"))
    finally:
        await harness.aclose()
    assert Path(result.output) == (tmp_path / "state" / "heartbeat").resolve()
    assert beats.count >= 3


async def test_the_heartbeat_file_is_kept_between_turns_and_made_empty(tmp_path: Path) -> None:
    heartbeat = tmp_path / "state" / "heartbeat"
    request = _shell(tmp_path, f'echo beat > "${HEARTBEAT_ENV}"; echo ok', Beats())
    harness = CommandHarness()
    assert (await harness.run_turn(request)).output == "ok\n"
    kept = heartbeat.stat()
    assert kept.st_size == 5  # left as the turn left it
    script = f'wc -c < "${HEARTBEAT_ENV}"'
    result = await harness.run_turn(replace(_shell(tmp_path, script, Beats()), turn=2))
    assert result.output.strip() == "0"  # made empty at the turn's start
    assert heartbeat.stat().st_ino == kept.st_ino  # the same file


@pytest.mark.parametrize("kind", ["fifo", "symlink", "hard link"])
async def test_whatever_the_agent_put_in_the_heartbeat_files_place_is_replaced(
    tmp_path: Path, kind: str
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    heartbeat = state / "heartbeat"
    outside = tmp_path / "precious"
    outside.write_text("keep me")
    if kind == "fifo":
        os.mkfifo(heartbeat)  # opening it for writing would block the daemon
    elif kind == "symlink":
        heartbeat.symlink_to(outside)
    else:
        os.link(outside, heartbeat)
    request = _shell(tmp_path, f'wc -c < "${HEARTBEAT_ENV}"', Beats())
    assert (await CommandHarness().run_turn(request)).output.strip() == "0"
    found = os.lstat(heartbeat)
    assert stat.S_ISREG(found.st_mode)
    assert found.st_nlink == 1
    assert outside.read_text() == "keep me"


async def test_an_openai_agent_beats_at_each_model_and_tool_call(
    openai_server: OpenAIServer, tmp_path: Path
) -> None:
    openai_server.enqueue(
        completion(tool_calls=[tool_call("deploy", {"path": "deployed"})]),
        completion("deployed"),
    )
    openai = {
        "baseUrl": openai_server.base_url,
        "model": "test-model",
        "tools": [{"name": "deploy", "command": [sys.executable, TOOL_WORKER, "touch"]}],
    }
    beats = Beats()
    result = await OpenAIHarness().run_turn(
        _request(tmp_path, {"harness": "openai", "openai": openai}, beats)
    )
    assert result.output == "deployed"
    assert beats.count == 6  # two model calls and a tool call, as each starts and ends
