"""A python agent's turn log: its prints and log records (and its agent loop's calls) reach
the turn's capped log from its worker process, while the turn runs, escaped, capped in the
worker, and never as the daemon's own ``corral`` lines."""

from __future__ import annotations

import asyncio
import contextvars
import io
import logging
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from corral.daemon import TurnRequest
from corral.daemon._turn_log import TurnLog, lines_of
from corral.daemon.harnesses import _python_log
from corral.daemon.harnesses._log_tail import LogTail
from tests.daemon.test_harness_python import (  # the autouse fixture ends every made harness
    _workers_end,  # noqa: F401
    make,
    request,
)
from tests.support.polling import settle

MODULE = "tests.daemon.workers.py_logs"


def logged(
    tmp_path: Path, function: str, *, prompt: str = "hello", cap: int = 1 << 20
) -> tuple[TurnRequest, TurnLog]:
    req = request(tmp_path, f"{MODULE}:{function}", prompt=prompt)
    req.workdir.mkdir(exist_ok=True)
    log = TurnLog(req.agent_id, req.turn, cap=cap)
    return replace(req, log=log), log


def lines(log: TurnLog) -> list[tuple[str, str]]:
    log.close()
    return [(line["stream"], line["text"]) for line in lines_of(log.snapshot())]


async def test_prints_and_log_records_reach_the_turns_log(tmp_path: Path) -> None:
    req, log = logged(tmp_path, "chatty")
    assert (await make().run_turn(req)).output == "chatted"
    assert lines(log) == [
        ("stdout", "out: hello"),
        ("stderr", "err: oops"),
        ("log", "INFO chatty: info record 7"),
        ("log", "WARNING chatty: warned"),
        ("stdout", "[corral: the turn's log was capped at 1 bytes: dropped 9 more bytes]"),
        # Stored as text (a NUL replaced); ``corral logs`` prints control characters escaped.
        ("stdout", "bell\x07 nul\ufffd \x1b[31mred\x1b[0m"),
        ("stdout", "no newline at the end"),
    ]
    # The agent's file is kept for its next turn, emptied once read.
    path = _python_log.log_path(req.state_dir)
    assert path.is_file()
    assert path.stat().st_size == 0


async def test_an_async_function_its_threads_and_tracebacks_are_captured(
    tmp_path: Path,
) -> None:
    req, log = logged(tmp_path, "achatty")
    harness = make()
    assert (await harness.run_turn(req)).output == "async chatted"
    found = lines(log)
    assert found[:3] == [
        ("stdout", "async out"),
        ("stdout", "from a thread"),
        ("log", "ERROR chatty: caught it"),
    ]
    assert ("log", "ValueError: bad value") in found
    # The next turn of the same worker starts a log of its own.
    req2, log2 = logged(tmp_path, "quiet")
    assert (await harness.run_turn(replace(req2, turn=8))).output == "quiet"
    assert lines(log2) == []


async def test_the_worker_caps_the_log_and_says_how_much_it_dropped(tmp_path: Path) -> None:
    cap = 10_000
    harness = make(log_bytes=cap)
    req, log = logged(tmp_path, "flood", prompt="5000", cap=cap)  # 500,000 bytes printed
    assert (await harness.run_turn(req)).output == "flooded"
    log.close()
    assert log.kept == cap
    assert log.dropped == 500_000 - cap
    assert log.snapshot()[-1] == {
        "stream": "corral",
        "text": f"[corral: the turn's log was capped at {cap} bytes: dropped {500_000 - cap} "
        "more bytes]\n",
    }


async def test_lines_arrive_while_the_turn_runs(tmp_path: Path) -> None:
    req, log = logged(tmp_path, "waits")
    running = asyncio.ensure_future(make().run_turn(req))
    await settle(lambda: log.snapshot() != [] or running.done(), within_s=30)
    assert not running.done()
    assert log.snapshot() == [{"stream": "stdout", "text": "first line\n"}]
    (req.workdir / "go").touch()
    assert (await running).output == "went"
    assert lines(log) == [("stdout", "first line"), ("stdout", "after go")]


async def test_an_agent_loops_model_and_tool_calls_with_call_log(tmp_path: Path) -> None:
    req, log = logged(tmp_path, "calls")
    assert (await make().run_turn(req)).output == "five"
    found = lines(log)
    assert [stream for stream, _ in found] == ["model", "tool", "tool", "model"]
    assert found[1] == ("tool", 'add {"a": 2, "b": 3}')
    assert found[2] == ("tool", "add -> 5")
    assert found[3][1].startswith("scripted: 2 tokens")
    assert found[3][1].endswith(": five")


async def test_no_log_asked_no_file_and_output_goes_on(tmp_path: Path) -> None:
    req = request(tmp_path, f"{MODULE}:chatty")
    req.workdir.mkdir()
    assert (await make().run_turn(req)).output == "chatted"
    assert not _python_log.log_path(req.state_dir).exists()


# --- the pieces, in this process --------------------------------------------------------


@pytest.fixture
def restored() -> Iterator[None]:
    """Put back what capturing installs in this process (sys.stdout/stderr, the handler)."""
    out, err, level = sys.stdout, sys.stderr, logging.getLogger().level
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err
        logging.getLogger().removeHandler(_python_log._handler)
        logging.getLogger().setLevel(level)


def read(path: Path, cap: int = 1 << 20, *, max_bytes: int | None = None) -> TurnLog:
    log = TurnLog("a_1", 1, cap=cap)
    LogTail(path, log, streams=_python_log.STREAMS, counts=True, max_bytes=max_bytes).poll(
        until_end=True
    )
    log.close()
    return log


def test_only_agent_streams_are_read_never_corral(tmp_path: Path) -> None:
    path = tmp_path / "f.log"
    # A frame for an unknown stream (c for corral, say) ends the reading: nothing after it.
    path.write_bytes(b"o3\nhi\nc6\nforge\nl3\nno\n")
    assert lines_of(read(path).snapshot()) == [{"stream": "stdout", "text": "hi"}]
    # The dropped count frame counts, and the marker is the daemon's.
    path.write_bytes(b"m4\nabc\nd10\n")
    log = read(path)
    assert (log.dropped, [e["stream"] for e in log.snapshot()]) == (10, ["model", "corral"])


def test_no_more_than_max_bytes_of_the_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / "f.log"
    path.write_bytes(b"o5\nabcd\n" * 1000)  # 8,000 bytes
    log = read(path, max_bytes=80)
    assert log.kept == 50  # ten frames
    assert log.dropped == 8000 - 80


def test_capture_routes_by_context_and_falls_back_to_the_running_turn(
    tmp_path: Path, restored: None
) -> None:
    first, second = tmp_path / "1.log", tmp_path / "2.log"
    for path in (first, second):
        path.touch()
    original = io.StringIO()
    sys.stdout = original
    with _python_log.capturing(first, 1000):
        other = contextvars.Context()
        # Another context with a turn of its own: its prints go to it, not to the running one.
        other.run(lambda: _in_own_turn(second))
        print("to the running turn")
    print("after the turn")
    assert lines_of(read(first).snapshot()) == [{"stream": "stdout", "text": "to the running turn"}]
    assert lines_of(read(second).snapshot()) == [{"stream": "stdout", "text": "own turn"}]
    assert original.getvalue() == "after the turn\n"


def _in_own_turn(path: Path) -> None:
    capture = _python_log.TurnCapture(path, 1000)
    _python_log._current.set(capture)
    print("own turn")
    capture.close()
