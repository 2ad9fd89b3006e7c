"""An agent attacking its own turn log: it runs as the daemon's user and can write into its
state directory, so what the daemon finds at a turn's log path is hostile -- a FIFO (opening
it would block the event loop), a symlink out (the daemon must not truncate or read the
target), a forged frame claiming gigabytes (the daemon must not hold it in memory)."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from corral.daemon import CommandHarness, TurnRequest, parse_spec
from corral.daemon._turn_log import TurnLog
from corral.daemon.harnesses import _python_log
from corral.daemon.harnesses._log_tail import LogTail
from tests.daemon.test_harness_python import (  # the autouse fixture ends every made harness
    _workers_end,  # noqa: F401
    make,
    request,
)

_BOUND_S = 5.0  # a call that has not returned by then is blocked (on the FIFO)


def returns(call: Callable[[], object], unblock: Callable[[], None]) -> bool:
    """Whether ``call`` returns on its own; when it blocks, ``unblock`` frees it (so the test
    process does not hang) and the answer is False."""
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(_BOUND_S)
    if not thread.is_alive():
        return True
    unblock()
    thread.join(_BOUND_S)
    return False


def command_request(tmp_path: Path, *args: str) -> TurnRequest:
    spec = parse_spec({"name": "w", "harness": "command", "command": [sys.executable, *args]})
    workdir = (tmp_path / "work").resolve()
    workdir.mkdir(exist_ok=True)
    (tmp_path / "state").mkdir(exist_ok=True)
    return TurnRequest(
        agent_id="a_0000beef",
        turn=3,
        prompt="",
        spec=spec,
        workdir=workdir,
        state_dir=(tmp_path / "state").resolve(),
        env={},
        timeout_s=30.0,
    )


def _open_other_end(path: Path, flags: int) -> Callable[[], None]:
    def unblock() -> None:
        with contextlib.suppress(OSError):
            os.close(os.open(path, flags | os.O_NONBLOCK))

    return unblock


def test_a_fifo_at_the_log_path_does_not_block_the_tail(tmp_path: Path) -> None:
    path = tmp_path / "turn-1.log"
    os.mkfifo(path)
    log = TurnLog("a_1", 1)
    tail = LogTail(path, log)
    assert returns(lambda: tail.poll(until_end=True), _open_other_end(path, os.O_WRONLY))
    assert log.snapshot() == []


def test_a_symlink_at_the_log_path_is_not_followed_by_the_tail(tmp_path: Path) -> None:
    outside = tmp_path / "secret"
    outside.write_bytes(b"o6\nsecret")
    path = tmp_path / "turn-1.log"
    path.symlink_to(outside)
    log = TurnLog("a_1", 1)
    LogTail(path, log).poll(until_end=True)
    log.close()
    assert log.snapshot() == []


async def test_a_command_forging_a_huge_frame_in_its_log_is_read_with_a_bound(
    tmp_path: Path,
) -> None:
    # The command appends to its own turn's log file (it can: same user) a frame claiming
    # 10 GB and 4 MB behind it. The daemon reads at most a bound of the file and counts the
    # rest as dropped, rather than buffering it all waiting for the frame's end.
    cap = 4096
    state = (tmp_path / "state").resolve()
    log_file = state / "turn-3.log"
    script = (
        f"import sys; f = open({str(log_file)!r}, 'ab'); f.write(b'o10000000000\\n'); "
        "f.write(b'x' * (4 << 20)); f.close(); print('done')"
    )
    req = command_request(tmp_path, "-c", script)
    log = TurnLog(req.agent_id, req.turn, cap=cap)
    result = await CommandHarness(log_bytes=cap).run_turn(replace(req, log=log))
    assert result.output.strip() == "done"
    log.close()
    assert log.dropped >= (4 << 20) - (5 * cap + (1 << 16))


def test_python_turns_log_file_replaces_a_fifo_without_blocking(tmp_path: Path) -> None:
    req = request(tmp_path, "tests.daemon.workers.py_logs:chatty")
    req.state_dir.mkdir(parents=True, exist_ok=True)
    path = _python_log.log_path(req.state_dir)
    os.mkfifo(path)
    req = replace(req, log=TurnLog(req.agent_id, req.turn))
    harness = make()
    found: list[object] = []
    assert returns(lambda: found.append(harness._log_for(req)), _open_other_end(path, os.O_RDONLY))
    assert path.is_file()
    assert not path.is_symlink()


def test_python_turns_log_file_never_truncates_a_symlinks_target(tmp_path: Path) -> None:
    req = request(tmp_path, "tests.daemon.workers.py_logs:chatty")
    req.state_dir.mkdir(parents=True, exist_ok=True)
    outside = tmp_path / "precious"
    outside.write_text("keep me")
    path = _python_log.log_path(req.state_dir)
    path.symlink_to(outside)
    req = replace(req, log=TurnLog(req.agent_id, req.turn))
    made_path, tail = make()._log_for(req)
    assert outside.read_text() == "keep me"
    assert made_path == path
    assert path.is_file()
    assert not path.is_symlink()
    assert tail is not None


def test_python_turns_log_file_never_empties_a_file_it_is_a_hard_link_of(tmp_path: Path) -> None:
    req = request(tmp_path, "tests.daemon.workers.py_logs:chatty")
    req.state_dir.mkdir(parents=True, exist_ok=True)
    outside = tmp_path / "precious"
    outside.write_text("keep me")
    path = _python_log.log_path(req.state_dir)
    os.link(outside, path)
    req = replace(req, log=TurnLog(req.agent_id, req.turn))
    made_path, tail = make()._log_for(req)
    assert outside.read_text() == "keep me"
    assert made_path == path
    assert path.stat().st_nlink == 1
    assert path.stat().st_size == 0
    assert tail is not None


async def test_what_the_agent_left_in_its_log_file_is_not_read_as_its_next_turns(
    tmp_path: Path,
) -> None:
    req = request(tmp_path, "tests.daemon.workers.py_logs:quiet")
    req.workdir.mkdir(exist_ok=True)
    req.state_dir.mkdir(parents=True, exist_ok=True)
    path = _python_log.log_path(req.state_dir)
    path.write_bytes(b"o7\nforged\n")  # frames written between turns
    log = TurnLog(req.agent_id, req.turn)
    assert (await make().run_turn(replace(req, log=log))).output == "quiet"
    log.close()
    assert log.snapshot() == []
    assert path.stat().st_size == 0
