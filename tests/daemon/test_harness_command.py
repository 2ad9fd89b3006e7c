"""CommandHarness: real child processes, real process groups, a real kill -9."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.daemon import CommandHarness, Harness, TurnFailedError, TurnRequest, parse_spec
from corral.daemon.harnesses._command import PID_FILE
from corral.kernel import InvalidArgumentError
from tests.support.polling import settle
from tests.support.processes import gone, read_pids, start_time

WORKERS = Path(__file__).with_name("workers")
WORKER = str(WORKERS / "cmd_worker.py")


def request(
    tmp_path: Path,
    *args: str,
    prompt: str = "hello",
    timeout_s: float = 10.0,
    env: dict[str, str] | None = None,
    spec_env: dict[str, str] | None = None,
    paused_s: Callable[[], float] | None = None,
) -> TurnRequest:
    spec = parse_spec(
        {
            "name": "w",
            "harness": "command",
            "command": [sys.executable, WORKER, *args],
            "env": spec_env or {},
        }
    )
    workdir = (tmp_path / "work").resolve()
    state_dir = tmp_path / "state"
    workdir.mkdir(exist_ok=True)
    state_dir.mkdir(exist_ok=True)
    return TurnRequest(
        agent_id="a_0000beef",
        turn=3,
        prompt=prompt,
        spec=spec,
        workdir=workdir,
        state_dir=state_dir,
        env=env or {},
        timeout_s=timeout_s,
        paused_s=paused_s,
    )


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test starts; killed and reaped afterwards whatever happened."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def kill_quietly(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def popen(*argv: str, new_session: bool = False) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, start_new_session=new_session)


def sleeper(procs: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    """A process in a session of its own, as a turn's command is; killed after the test."""
    proc = popen(sys.executable, "-c", "import time; time.sleep(60)", new_session=True)
    procs.append(proc)
    return proc


# --- success ------------------------------------------------------------------------------


async def test_output_is_stdout_and_prompt_arrives_on_stdin(tmp_path: Path) -> None:
    harness = CommandHarness()
    assert isinstance(harness, Harness)
    result = await harness.run_turn(request(tmp_path, "report", prompt="migrate ünïcode"))
    report = json.loads(result.output)
    assert report["prompt"] == "migrate ünïcode"
    assert result.tokens == 0
    assert result.cost_usd == 0.0


async def test_workdir_is_the_cwd(tmp_path: Path) -> None:
    req = request(tmp_path, "report")
    result = await CommandHarness().run_turn(req)
    assert json.loads(result.output)["cwd"] == str(req.workdir)  # resolved by request()


def real(path: Path) -> str:
    return os.path.realpath(path)


async def test_relative_directories_are_the_daemons_not_the_commands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A daemon started with a relative home (``.corral``) gives relative directories.
    monkeypatch.chdir(tmp_path)
    req = request(Path("."), "report", prompt="relative")
    relative = TurnRequest(
        agent_id=req.agent_id,
        turn=req.turn,
        prompt=req.prompt,
        spec=req.spec,
        workdir=Path("work"),
        state_dir=Path("state"),
    )
    result = await CommandHarness().run_turn(relative)
    assert json.loads(result.output)["prompt"] == "relative"
    assert json.loads(result.output)["cwd"] == real(tmp_path / "work")
    # Nothing of the turn is left but the heartbeat file kept for the next one.
    assert [p.name for p in (tmp_path / "state").iterdir()] == ["heartbeat"]


async def test_env_layers_daemon_then_spec_then_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("T_DAEMON", "daemon")
    monkeypatch.setenv("T_OVER", "daemon")
    req = request(
        tmp_path,
        "report",
        "T_DAEMON",
        "T_OVER",
        "T_SPEC",
        "CORRAL_AGENT_ID",
        spec_env={"T_SPEC": "spec", "T_OVER": "spec", "CORRAL_AGENT_ID": "spec"},
        env={"CORRAL_AGENT_ID": "a_0000beef"},
    )
    result = await CommandHarness().run_turn(req)
    assert json.loads(result.output)["env"] == {
        "T_DAEMON": "daemon",
        "T_OVER": "spec",
        "T_SPEC": "spec",
        "CORRAL_AGENT_ID": "a_0000beef",
    }


async def test_child_that_does_not_read_a_big_prompt_is_not_an_error(tmp_path: Path) -> None:
    req = request(tmp_path, "ignore-stdin", prompt="p" * (2 * 1024 * 1024))
    result = await CommandHarness().run_turn(req)
    assert result.output == "ignored\n"


async def test_big_stdout_and_stderr_do_not_deadlock(tmp_path: Path) -> None:
    size = 3 * 1024 * 1024
    result = await CommandHarness().run_turn(request(tmp_path, "big", str(size), str(size), "0"))
    assert len(result.output) == size
    assert set(result.output) == {"o"}


async def test_stdout_past_the_cap_is_dropped_and_said(tmp_path: Path) -> None:
    harness = CommandHarness(max_output_bytes=100_000)
    result = await harness.run_turn(request(tmp_path, "big", "1000000", "0", "0"))
    kept, _, note = result.output.partition("\n[corral: output truncated")
    assert kept == "o" * 100_000
    assert "kept the first 100000 bytes, dropped 900000 more" in note


# --- failure ------------------------------------------------------------------------------


async def test_non_zero_exit_names_the_code_and_gives_the_stderr_tail(tmp_path: Path) -> None:
    with pytest.raises(TurnFailedError) as caught:
        await CommandHarness().run_turn(request(tmp_path, "fail", "3", "500"))
    error = caught.value
    assert error.code == "turn_failed"
    assert error.details["exit_code"] == 3
    assert "exited with code 3" in error.message
    assert "last 2048 bytes of stderr" in error.message
    assert error.message.endswith("stderr line 499")
    assert "stderr line 0\n" not in error.message  # only the tail is kept
    assert len(error.message.encode()) < 2048 + 200


async def test_stderr_tail_is_bounded_for_huge_stderr(tmp_path: Path) -> None:
    harness = CommandHarness(stderr_tail_bytes=64)
    with pytest.raises(TurnFailedError) as caught:
        await harness.run_turn(request(tmp_path, "big", "0", str(4 * 1024 * 1024), "9"))
    message = caught.value.message
    assert "exited with code 9; last 64 bytes of stderr" in message
    assert message.endswith("END-OF-STDERR")
    assert len(message) < 200


async def test_empty_stderr_is_said(tmp_path: Path) -> None:
    with pytest.raises(TurnFailedError, match=r"exited with code 4 \(stderr was empty\)"):
        await CommandHarness().run_turn(request(tmp_path, "fail", "4", "0"))


async def test_death_by_signal_is_a_failed_turn(tmp_path: Path) -> None:
    with pytest.raises(TurnFailedError, match="killed by signal 15") as caught:
        await CommandHarness().run_turn(request(tmp_path, "signal"))
    assert caught.value.details["exit_code"] == -15


async def test_a_command_that_cannot_start_is_a_failed_turn(tmp_path: Path) -> None:
    req = request(tmp_path, "report")
    spec = parse_spec(
        {"name": "w", "harness": "command", "command": [str(tmp_path / "no-such-binary")]}
    )
    bad = TurnRequest(
        agent_id=req.agent_id,
        turn=1,
        prompt="x",
        spec=spec,
        workdir=req.workdir,
        state_dir=req.state_dir,
    )
    with pytest.raises(TurnFailedError, match=r"could not start command .*no-such-binary"):
        await CommandHarness().run_turn(bad)
    assert not (req.state_dir / PID_FILE).exists()


async def test_a_missing_working_directory_is_named_not_blamed_on_the_command(
    tmp_path: Path,
) -> None:
    req = request(tmp_path, "echo")
    req.workdir.rmdir()
    with pytest.raises(TurnFailedError) as caught:
        await CommandHarness().run_turn(req)
    assert caught.value.message == (
        f"the agent's working directory {str(req.workdir)!r} does not exist (it was deleted); "
        "the command was not started"
    )


# --- timeout, cancellation, process groups --------------------------------------------------


async def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    req = request(tmp_path, "family", timeout_s=1.0)
    with pytest.raises(TurnFailedError, match=r"turn timed out after 1 s") as caught:
        await CommandHarness().run_turn(req)
    assert caught.value.details["timeout_s"] == 1.0
    pids = read_pids(req.workdir)  # written long before the timeout
    try:
        await settle(lambda: gone(pids["child"]) and gone(pids["grandchild"]))
    finally:
        for pid in pids.values():
            kill_quietly(pid)
    assert not (req.state_dir / PID_FILE).exists()


def waiting_since(offset_s: float) -> Callable[[], float]:
    """``paused_s`` of a turn that has waited on a person since ``offset_s`` seconds after
    now, and still does."""
    since = time.monotonic() + offset_s
    return lambda: max(0.0, time.monotonic() - since)


async def test_time_waiting_on_a_person_does_not_count_against_the_timeout(
    tmp_path: Path,
) -> None:
    # The command runs 1.5 s on a 0.5 s timeout, but from 0.1 s on it waits on a person.
    req = request(tmp_path, "sleep", "1.5", timeout_s=0.5, paused_s=waiting_since(0.1))
    result = await CommandHarness().run_turn(req)
    assert result.output == "slept\n"


async def test_a_pause_that_ended_moves_the_timeout_by_its_length(tmp_path: Path) -> None:
    # 0.4 s of waiting on a person, already over: the limit is 0.5 s of its own time.
    req = request(tmp_path, "family", timeout_s=0.5, paused_s=lambda: 0.4)
    started = time.monotonic()
    with pytest.raises(TurnFailedError) as caught:
        await CommandHarness().run_turn(req)
    assert time.monotonic() - started >= 0.9
    assert caught.value.message == (
        "turn timed out after 0.5 s of its own time (not counting 0.4 s waiting on a "
        "person); its process group was killed"
    )
    pids = read_pids(req.workdir)
    await settle(lambda: gone(pids["child"]) and gone(pids["grandchild"]))


async def test_without_a_pause_the_timeout_fires_though_paused_s_is_given(
    tmp_path: Path,
) -> None:
    req = request(tmp_path, "sleep", "30", timeout_s=0.3, paused_s=lambda: 0.0)
    with pytest.raises(TurnFailedError, match=r"^turn timed out after 0.3 s; its process"):
        await CommandHarness().run_turn(req)


async def test_cancellation_kills_the_group_and_propagates(tmp_path: Path) -> None:
    req = request(tmp_path, "family", timeout_s=30)
    task = asyncio.ensure_future(CommandHarness().run_turn(req))
    await settle(lambda: (req.workdir / "pids.json").exists())
    pids = read_pids(req.workdir)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    try:
        await settle(lambda: gone(pids["child"]) and gone(pids["grandchild"]))
    finally:
        for pid in pids.values():
            kill_quietly(pid)
    assert not (req.state_dir / PID_FILE).exists()


async def test_a_cancellation_while_the_launcher_starts_still_ends_its_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stop right after a prompt can cancel the turn while asyncio is still connecting to
    # the launcher, which may have started the command (in a session of its own) already.
    req = request(tmp_path, "family", timeout_s=30)
    loop = asyncio.get_running_loop()
    real = loop.subprocess_exec
    connecting, release = asyncio.Event(), asyncio.Event()

    async def slow_to_connect(*args: Any, **kwargs: Any) -> Any:
        started = await real(*args, **kwargs)
        connecting.set()
        await release.wait()  # the cancellation lands here, before the start returns
        return started

    monkeypatch.setattr(loop, "subprocess_exec", slow_to_connect)
    task = asyncio.ensure_future(CommandHarness().run_turn(req))
    await asyncio.wait_for(connecting.wait(), 20)
    await settle(lambda: (req.workdir / "pids.json").exists())
    pids = read_pids(req.workdir)
    task.cancel()
    await asyncio.sleep(0)  # delivered, while the start has not returned
    release.set()
    try:
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 60)
        await settle(lambda: gone(pids["child"]) and gone(pids["grandchild"]))
    finally:
        for pid in pids.values():
            kill_quietly(pid)
    assert not (req.state_dir / PID_FILE).exists()


async def test_leftovers_in_the_group_are_killed_when_the_command_exits(tmp_path: Path) -> None:
    req = request(tmp_path, "orphan")
    result = await CommandHarness().run_turn(req)
    assert result.output == "done\n"
    pids = read_pids(req.workdir)
    try:
        await settle(lambda: gone(pids["grandchild"]))
    finally:
        kill_quietly(pids["grandchild"])


async def test_a_session_escapee_holding_stdout_does_not_hang_the_turn(tmp_path: Path) -> None:
    # "escape" leaves a grandchild in a session of its own holding stdout open: the turn
    # still ends (after drain_s) with what was read.
    req = request(tmp_path, "escape")
    harness = CommandHarness(drain_s=0.2)
    try:
        result = await harness.run_turn(req)
        assert result.output == "bye\n"
    finally:
        pids = read_pids(req.workdir)
        kill_quietly(pids["grandchild"])
        await settle(lambda: gone(pids["grandchild"]))


async def test_pid_file_is_written_during_the_turn_and_removed_after(tmp_path: Path) -> None:
    req = request(tmp_path, "family", timeout_s=30)
    pid_file = req.state_dir / PID_FILE
    task = asyncio.ensure_future(CommandHarness().run_turn(req))
    try:
        await settle(lambda: (req.workdir / "pids.json").exists() and pid_file.exists())
        record: dict[str, Any] = json.loads(pid_file.read_text())
        child = read_pids(req.workdir)["child"]
        assert record["pid"] == child
        assert record["startTime"] == start_time(child)
        assert record["agentId"] == "a_0000beef"
        assert record["turn"] == 3
        assert os.getpgid(child) == child  # its own process group
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert not pid_file.exists()

    await CommandHarness().run_turn(request(tmp_path, "report"))
    assert not pid_file.exists()


# --- reap ---------------------------------------------------------------------------------


async def test_reap_kills_the_leftover_of_a_daemon_killed_mid_turn(tmp_path: Path) -> None:
    state_dir, workdir = tmp_path / "state", tmp_path / "work"
    state_dir.mkdir()
    workdir.mkdir()
    daemon = popen(sys.executable, str(WORKERS / "turn_then_die.py"), str(state_dir), str(workdir))
    try:
        # Three processes start in a row (stand-in daemon, launcher, command): a loaded
        # machine needs more than the default bound.
        await settle(
            lambda: (workdir / "pids.json").exists() and (state_dir / PID_FILE).exists(),
            within_s=20,
        )
    finally:
        daemon.kill()
        daemon.wait()
    pids = read_pids(workdir)
    try:
        assert not gone(pids["child"])
        assert not gone(pids["grandchild"])
        assert await CommandHarness().reap("a_doomed00", state_dir) is True
        await settle(lambda: gone(pids["child"]) and gone(pids["grandchild"]), within_s=20)
    finally:
        for pid in pids.values():
            kill_quietly(pid)
    assert not (state_dir / PID_FILE).exists()
    assert await CommandHarness().reap("a_doomed00", state_dir) is False


async def test_reap_without_a_pid_file_finds_nothing(tmp_path: Path) -> None:
    assert await CommandHarness().reap("a_1", tmp_path) is False
    assert await CommandHarness().reap("a_1", tmp_path / "missing-dir") is False


async def test_reap_ignores_a_stale_pid_file(tmp_path: Path) -> None:
    dead = popen(sys.executable, "-c", "pass")
    dead.wait()
    (tmp_path / PID_FILE).write_text(json.dumps({"pid": dead.pid, "startTime": 1}))
    assert await CommandHarness().reap("a_1", tmp_path) is False
    assert not (tmp_path / PID_FILE).exists()


async def test_reap_leaves_a_reused_pid_alone(
    tmp_path: Path, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    other = sleeper(sleepers)
    record = {"pid": other.pid, "startTime": start_time(other.pid) - 1}
    (tmp_path / PID_FILE).write_text(json.dumps(record))
    assert await CommandHarness().reap("a_1", tmp_path) is False
    assert other.poll() is None  # still running
    assert not (tmp_path / PID_FILE).exists()


async def test_reap_leaves_a_pid_from_another_boot_alone(
    tmp_path: Path, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    other = sleeper(sleepers)
    record = {"pid": other.pid, "startTime": start_time(other.pid), "bootId": "another-boot"}
    (tmp_path / PID_FILE).write_text(json.dumps(record))
    assert await CommandHarness().reap("a_1", tmp_path) is False
    assert other.poll() is None


async def test_reap_kills_a_matching_process(
    tmp_path: Path, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    target = sleeper(sleepers)
    record = {"pid": target.pid, "startTime": start_time(target.pid)}
    (tmp_path / PID_FILE).write_text(json.dumps(record))
    assert await CommandHarness().reap("a_1", tmp_path) is True
    assert target.wait(timeout=5) == -signal.SIGKILL


@pytest.mark.parametrize("content", ["", "not json", "[]", '{"pid": "1"}', '{"pid": 1}'])
async def test_reap_ignores_a_malformed_pid_file(tmp_path: Path, content: str) -> None:
    (tmp_path / PID_FILE).write_text(content)
    assert await CommandHarness().reap("a_1", tmp_path) is False
    assert not (tmp_path / PID_FILE).exists()


# --- bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"max_output_bytes": 0}, "max_output_bytes"),
        ({"max_output_bytes": "10"}, "max_output_bytes"),
        ({"stderr_tail_bytes": -1}, "stderr_tail_bytes"),
        ({"drain_s": 0}, "drain_s"),
        ({"drain_s": float("nan")}, "drain_s"),
    ],
)
def test_constructor_refuses_bad_values(kwargs: dict[str, Any], argument: str) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        CommandHarness(**kwargs)
    assert caught.value.argument == argument


async def test_run_turn_refuses_what_is_not_a_command_turn(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="request must be a TurnRequest"):
        await CommandHarness().run_turn("hello")  # type: ignore[arg-type]
    req = request(tmp_path, "report")
    spec = parse_spec({"name": "p", "harness": "python", "function": "m:f"})
    other = TurnRequest(
        agent_id="a_1", turn=1, prompt="x", spec=spec, workdir=req.workdir, state_dir=tmp_path
    )
    with pytest.raises(InvalidArgumentError, match="a spec of harness 'command'"):
        await CommandHarness().run_turn(other)


async def test_reap_refuses_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="agent_id"):
        await CommandHarness().reap("", tmp_path)
    with pytest.raises(InvalidArgumentError, match="state_dir"):
        await CommandHarness().reap("a_1", str(tmp_path))  # type: ignore[arg-type]
