"""The command harness adopts a turn a dead daemon started: the turn's process outlives the
daemon under its launcher, with its output and exit status, and a new CommandHarness reads
them (a real ``kill -9`` of a process running ``CommandHarness.run_turn``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.daemon import (
    AdoptingHarness,
    CommandHarness,
    NothingToAdoptError,
    TurnFailedError,
    TurnRequest,
    parse_spec,
)
from corral.daemon.harnesses._command import PID_FILE
from corral.daemon.harnesses._launch import dumps
from corral.daemon.harnesses._launched import TurnFiles
from tests.support.orphans import launcher_pid, orphan_turn
from tests.support.polling import idle, settle
from tests.support.processes import gone, read_pids, write_atomically

WORKERS = Path(__file__).with_name("workers")
WORKER = str(WORKERS / "cmd_worker.py")
AGENT = "a_orphan00"


@pytest.fixture
def dirs(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """An agent's state directory and working directory; whatever the test's turns left
    running (named in a pid file or ``pids.json``) is killed afterwards."""
    state_dir, workdir = tmp_path / "state", (tmp_path / "work").resolve()
    state_dir.mkdir()
    workdir.mkdir()
    yield state_dir, workdir
    pids: list[int] = []
    with contextlib.suppress(OSError, ValueError, KeyError):
        record = json.loads((state_dir / PID_FILE).read_text())
        pids += [record["pid"], record["launcher"]["pid"]]
    with contextlib.suppress(OSError, ValueError):
        pids += read_pids(workdir).values()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def request(
    dirs: tuple[Path, Path],
    *args: str,
    turn: int = 1,
    timeout_s: float = 30.0,
    paused_s: Callable[[], float] | None = None,
) -> TurnRequest:
    state_dir, workdir = dirs
    spec = parse_spec({"name": "w", "harness": "command", "command": [sys.executable, WORKER]})
    return TurnRequest(
        agent_id=AGENT,
        turn=turn,
        prompt="unused: the turn has its prompt",
        spec=spec,
        workdir=workdir,
        state_dir=state_dir,
        timeout_s=timeout_s,
        paused_s=paused_s,
    )


def orphan(dirs: tuple[Path, Path], *args: str, turn: int = 1, prompt: str = "work") -> int:
    """Start ``cmd_worker.py ARGS`` as turn ``turn`` of a daemon that then died; its pid."""
    state_dir, workdir = dirs
    pid = orphan_turn(
        [sys.executable, WORKER, *args],
        state_dir=state_dir,
        workdir=workdir,
        agent_id=AGENT,
        turn=turn,
        prompt=prompt,
    )
    assert pid is not None
    return pid


def doomed_daemon(state_dir: Path, workdir: Path, *mode: str) -> subprocess.Popen[bytes]:
    """A process running one turn with CommandHarness.run_turn (see turn_then_die.py)."""
    script = str(WORKERS / "turn_then_die.py")
    return subprocess.Popen([sys.executable, script, str(state_dir), str(workdir), *mode])


def turn_files(state_dir: Path) -> list[str]:
    return sorted(p.name for p in state_dir.iterdir())


# --- the command harness adopts -------------------------------------------------------------


async def test_a_turn_whose_daemon_was_killed_is_adopted_with_its_output(
    dirs: tuple[Path, Path],
) -> None:
    # The "daemon" is a process running CommandHarness.run_turn, killed with SIGKILL while
    # its command waits; a new CommandHarness adopts the turn.
    state_dir, workdir = dirs
    daemon = doomed_daemon(state_dir, workdir, "await-file", "go")
    try:
        await settle(
            lambda: (workdir / "pids.json").exists() and (state_dir / PID_FILE).exists(),
            within_s=20,
        )
    finally:
        daemon.kill()
        daemon.wait()
    child = read_pids(workdir)["child"]
    launcher = launcher_pid(state_dir)
    assert not gone(child)
    assert not gone(launcher)

    harness = CommandHarness(adopt_poll_s=0.01)
    assert isinstance(harness, AdoptingHarness)
    adoption = asyncio.ensure_future(harness.adopt(request(dirs)))
    write_atomically(workdir / "go", "0")
    result = await asyncio.wait_for(adoption, 10)
    assert result.output == "work -> 0\n"
    await settle(lambda: gone(child) and gone(launcher))
    assert turn_files(state_dir) == []  # the pid file and the turn's files are removed


async def test_an_adopted_turn_that_fails_says_its_exit_code_and_stderr(
    dirs: tuple[Path, Path],
) -> None:
    state_dir, workdir = dirs
    orphan(dirs, "await-file", "go")
    adoption = asyncio.ensure_future(CommandHarness(adopt_poll_s=0.01).adopt(request(dirs)))
    write_atomically(workdir / "go", "3")
    with pytest.raises(TurnFailedError) as caught:
        await asyncio.wait_for(adoption, 10)
    assert caught.value.details["exit_code"] == 3
    assert caught.value.message == (
        "command exited with code 3; last 2048 bytes of stderr:\nstderr of 3"
    )
    assert turn_files(state_dir) == []


async def test_a_turn_that_ended_while_no_daemon_ran_is_read_from_its_files(
    dirs: tuple[Path, Path],
) -> None:
    state_dir, _ = dirs
    orphan(dirs, "report", prompt="deploy ünïcode")
    await settle(lambda: TurnFiles(state_dir, 1).path("status").exists())
    result = await CommandHarness().adopt(request(dirs))
    assert json.loads(result.output)["prompt"] == "deploy ünïcode"
    assert turn_files(state_dir) == []


async def test_a_turn_killed_by_a_signal_while_no_daemon_ran_says_so(
    dirs: tuple[Path, Path],
) -> None:
    state_dir, _ = dirs
    orphan(dirs, "signal")
    await settle(lambda: TurnFiles(state_dir, 1).path("status").exists())
    with pytest.raises(TurnFailedError, match="killed by signal 15") as caught:
        await CommandHarness().adopt(request(dirs))
    assert caught.value.details["exit_code"] == -15


async def test_nothing_to_adopt_without_a_turn(dirs: tuple[Path, Path]) -> None:
    with pytest.raises(NothingToAdoptError) as caught:
        await CommandHarness().adopt(request(dirs))
    assert caught.value.code == "nothing_to_adopt"
    assert "turn 1 left no outcome" in caught.value.message


async def test_nothing_to_adopt_when_the_launcher_died_and_its_leftovers_are_ended(
    dirs: tuple[Path, Path],
) -> None:
    state_dir, workdir = dirs
    orphan(dirs, "family")
    await settle(lambda: (workdir / "pids.json").exists())
    pids = read_pids(workdir)
    launcher = launcher_pid(state_dir)
    os.kill(launcher, signal.SIGKILL)
    await settle(lambda: gone(launcher))
    with pytest.raises(NothingToAdoptError):
        await CommandHarness().adopt(request(dirs))
    await settle(lambda: gone(pids["child"]) and gone(pids["grandchild"]))
    assert turn_files(state_dir) == []


async def test_another_turns_process_is_not_adopted_but_ended(dirs: tuple[Path, Path]) -> None:
    workdir = dirs[1]
    orphan(dirs, "family", turn=1)
    await settle(lambda: (workdir / "pids.json").exists())
    pids = read_pids(workdir)
    with pytest.raises(NothingToAdoptError):
        await CommandHarness().adopt(request(dirs, turn=2))
    await settle(lambda: gone(pids["child"]) and gone(pids["grandchild"]))


async def test_an_adopted_turn_times_out_and_its_group_is_killed(
    dirs: tuple[Path, Path],
) -> None:
    state_dir, workdir = dirs
    orphan(dirs, "family")
    await settle(lambda: (workdir / "pids.json").exists())
    pids = read_pids(workdir)
    launcher = launcher_pid(state_dir)
    started = time.monotonic()
    with pytest.raises(TurnFailedError, match=r"^turn timed out after 0.3 s; its process"):
        await CommandHarness(adopt_poll_s=0.01).adopt(request(dirs, timeout_s=0.3))
    assert time.monotonic() - started >= 0.3  # the clock starts at the adoption
    await settle(lambda: gone(pids["child"]) and gone(pids["grandchild"]) and gone(launcher))
    assert turn_files(state_dir) == []


async def test_waiting_on_a_person_does_not_count_against_an_adopted_turn(
    dirs: tuple[Path, Path],
) -> None:
    # 0.6 s of command on a 0.2 s timeout, waiting on a person from the adoption on.
    orphan(dirs, "sleep", "0.6")
    since = time.monotonic()
    req = request(dirs, timeout_s=0.2, paused_s=lambda: time.monotonic() - since)
    result = await CommandHarness(adopt_poll_s=0.01).adopt(req)
    assert result.output == "slept\n"


async def test_cancelling_an_adoption_kills_the_turn(dirs: tuple[Path, Path]) -> None:
    state_dir, workdir = dirs
    orphan(dirs, "family")
    await settle(lambda: (workdir / "pids.json").exists())
    pids = read_pids(workdir)
    launcher = launcher_pid(state_dir)
    adoption = asyncio.ensure_future(CommandHarness(adopt_poll_s=0.01).adopt(request(dirs)))
    await idle()  # it runs until it waits for the launcher
    adoption.cancel()
    with pytest.raises(asyncio.CancelledError):
        await adoption
    await settle(lambda: gone(pids["child"]) and gone(pids["grandchild"]) and gone(launcher))


async def test_reap_ends_the_launcher_too_and_removes_the_turn_files(
    dirs: tuple[Path, Path],
) -> None:
    state_dir, workdir = dirs
    orphan(dirs, "family")
    await settle(lambda: (workdir / "pids.json").exists())
    pids = read_pids(workdir)
    launcher = launcher_pid(state_dir)
    assert await CommandHarness().reap(AGENT, state_dir) is True
    await settle(lambda: gone(pids["child"]) and gone(pids["grandchild"]) and gone(launcher))
    assert turn_files(state_dir) == []


async def test_adopt_refuses_what_is_not_a_command_turn(dirs: tuple[Path, Path]) -> None:
    from corral.kernel import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="request must be a TurnRequest"):
        await CommandHarness().adopt("hello")  # type: ignore[arg-type]
    req = request(dirs)
    spec = parse_spec({"name": "p", "harness": "python", "function": "m:f"})
    other = TurnRequest(
        agent_id="a_1", turn=1, prompt="x", spec=spec, workdir=req.workdir, state_dir=dirs[0]
    )
    with pytest.raises(InvalidArgumentError, match="a spec of harness 'command'"):
        await CommandHarness().adopt(other)
    with pytest.raises(InvalidArgumentError, match="adopt_poll_s"):
        CommandHarness(adopt_poll_s=0)


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        0,
        -(2**70),
        1.5,
        "plain",
        'quote " and \\ backslash',
        "control \x00\x01\n\t\x7f chars",
        "ünïcode, 𝄞 astral, lone \udc80 and \ud800 surrogates",
        {"nested": [1, "two", {"three": None}], "tuple": (1, 2)},
    ],
)
def test_the_launchers_json_reads_back_equal(value: Any) -> None:
    text = dumps(value)
    assert text.isascii()
    expected = json.loads(json.dumps(value))
    assert json.loads(text) == expected


def test_the_launchers_json_refuses_what_is_not_json() -> None:
    for bad in (math.nan, math.inf, object(), b"bytes"):
        with pytest.raises(TypeError):
            dumps(bad)
