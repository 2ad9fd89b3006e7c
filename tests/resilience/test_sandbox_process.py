"""``run_sandboxed`` with ``isolation="process"``: real child processes, real kills and limits."""

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from corral.kernel import InvalidArgumentError
from corral.resilience import (
    SandboxAgentError,
    SandboxConfig,
    SandboxInterruptedError,
    SandboxMemoryError,
    SandboxStartError,
    SandboxTimeoutError,
    run_sandboxed,
)
from corral.runtime import FakeClock
from tests.resilience import sandbox_agents as agents

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX process control")

PROCESS = SandboxConfig(isolation="process", timeout_s=20)
LIMIT = 256 * 1024 * 1024


def gone(pid: int) -> bool:
    """True when no process ``pid`` exists, or only its zombie waits for a parent to reap it."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, IndexError):
        return not stat.parent.exists() and sys.platform.startswith("linux")


def pid_in(path: Path) -> int | None:
    return int(path.read_text()) if path.exists() else None


async def read_pid(path: Path) -> int:
    """The pid a child wrote to ``path``, polled with a bound."""
    for _ in range(1000):
        pid = pid_in(path)
        if pid is not None:
            return pid
        await asyncio.sleep(0.01)
    raise AssertionError(f"the child never wrote {path}")


async def test_the_agent_runs_in_a_child_process_and_sees_the_marks() -> None:
    config = SandboxConfig(
        isolation="process", timeout_s=20, read_only=True, allowed_actions=frozenset({"select"})
    )
    result = await run_sandboxed(agents.describe, "report", config)
    assert result.completed, result.error
    seen = result.result
    assert isinstance(seen, dict)
    assert seen["pid"] != os.getpid()
    assert seen["text"] == "[READ-ONLY MODE] report"
    assert (seen["original"], seen["read_only"], seen["allowed_actions"]) == (
        "report",
        True,
        ["select"],
    )
    assert result.duration_s > 0
    assert gone(seen["pid"])


async def test_async_and_chat_agents_run_in_the_child() -> None:
    assert (await run_sandboxed(agents.shout, "hey", PROCESS)).result == "HEY"
    assert (await run_sandboxed(agents.ChatAgent("bob"), "hi", PROCESS)).result == "bob: hi"


async def test_an_exception_in_the_child_comes_back_with_its_traceback() -> None:
    result = await run_sandboxed(agents.fail, "the thing", PROCESS)
    assert result.completed is False
    error = result.error
    assert isinstance(error, SandboxAgentError)
    assert (error.error_type, error.error_message) == ("ValueError", "cannot do 'the thing'")
    assert isinstance(error.__cause__, ValueError)
    assert "in fail" in error.traceback


async def test_a_result_that_cannot_be_sent_back_is_an_agent_error() -> None:
    result = await run_sandboxed(agents.unpicklable_result, "x", PROCESS)
    assert result.completed is False
    assert isinstance(result.error, SandboxAgentError)
    assert "result could not be sent back from the child process" in result.error.message


async def test_an_agent_that_cannot_be_pickled_is_refused_with_a_reason() -> None:
    def local_agent(task: str) -> str:
        return task

    result = await run_sandboxed(local_agent, "x", PROCESS)
    assert result.completed is False
    assert isinstance(result.error, SandboxStartError)
    assert result.error.code == "sandbox_start_failed"
    assert "isolation='process' needs an agent that can be pickled" in result.error.message
    assert "local_agent" in result.error.message


async def test_the_child_is_held_to_its_memory_limit() -> None:
    config = SandboxConfig(isolation="process", timeout_s=20, max_memory_bytes=LIMIT)
    within = await run_sandboxed(agents.allocate, str(16 * 1024 * 1024), config)
    assert within.completed, within.error
    assert within.result == 16 * 1024 * 1024

    over = await run_sandboxed(agents.allocate, str(4 * LIMIT), config)
    assert over.completed is False
    assert over.result is None
    error = over.error
    assert isinstance(error, SandboxMemoryError)
    assert error.code == "sandbox_memory_limit"
    assert error.max_memory_bytes == LIMIT
    assert f"exceeded its memory limit of {LIMIT} bytes" in error.message
    assert "MemoryError" in error.message


async def test_without_a_limit_a_memory_error_is_the_agents_own() -> None:
    result = await run_sandboxed(agents.allocate, str(1 << 62), PROCESS)
    assert result.completed is False
    assert isinstance(result.error, SandboxAgentError)
    assert result.error.error_type == "MemoryError"


async def test_a_child_past_its_timeout_is_killed(tmp_path: Path) -> None:
    config = SandboxConfig(isolation="process", timeout_s=1.0)
    result = await run_sandboxed(agents.sleep_forever, str(tmp_path), config)
    assert result.completed is False
    assert result.result is None
    error = result.error
    assert isinstance(error, SandboxTimeoutError), error
    assert error.code == "sandbox_timeout"
    assert error.timeout_s == 1.0
    assert error.pid == int((tmp_path / "child.pid").read_text())
    assert f"child process {error.pid} was killed" in error.message
    assert gone(error.pid)
    assert 1.0 <= result.duration_s < 10


async def until_timer_armed(clock: FakeClock, path: Path) -> None:
    """Wait (bounded) until the child has written ``path`` and the parent armed its timeout."""
    await read_pid(path)
    for _ in range(1000):
        if clock.pending_timers == 1:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the parent never armed its timeout")


async def test_the_timeout_kills_what_the_child_started_too(tmp_path: Path) -> None:
    if not sys.platform.startswith("linux"):
        pytest.skip("reads /proc")
    clock = FakeClock()
    config = SandboxConfig(isolation="process", timeout_s=1.5)
    run = asyncio.create_task(
        run_sandboxed(agents.spawn_and_sleep, str(tmp_path), config, clock=clock)
    )
    await until_timer_armed(clock, tmp_path / "child.pid")
    clock.advance(1.5)
    result = await run
    assert isinstance(result.error, SandboxTimeoutError)
    assert result.duration_s == pytest.approx(1.5)
    grandchild = int((tmp_path / "grandchild.pid").read_text())
    for _ in range(500):  # SIGKILL is delivered at once; allow the kernel a moment
        if gone(grandchild):
            break
        await asyncio.sleep(0.01)
    assert gone(grandchild)
    assert gone(int((tmp_path / "child.pid").read_text()))


async def test_outside_cancellation_kills_the_child(tmp_path: Path) -> None:
    run = asyncio.create_task(run_sandboxed(agents.sleep_forever, str(tmp_path), PROCESS))
    pid = await read_pid(tmp_path / "child.pid")
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert gone(pid)


async def test_a_child_ended_by_a_signal_is_an_interruption(tmp_path: Path) -> None:
    run = asyncio.create_task(run_sandboxed(agents.sleep_forever, str(tmp_path), PROCESS))
    pid = await read_pid(tmp_path / "child.pid")
    os.kill(pid, signal.SIGTERM)
    result = await run
    assert result.completed is False
    error = result.error
    assert isinstance(error, SandboxInterruptedError)
    assert error.code == "sandbox_interrupted"
    assert f"child process {pid} ended by signal SIGTERM before it sent a result" in error.message


async def test_event_loops_that_cannot_watch_descriptors_poll_instead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_readers(*args: object) -> None:
        raise NotImplementedError

    monkeypatch.setattr(asyncio.get_running_loop(), "add_reader", no_readers)
    assert (await run_sandboxed(agents.shout, "polled", PROCESS)).result == "POLLED"
    clock = FakeClock()
    config = SandboxConfig(isolation="process", timeout_s=1.0)
    run = asyncio.create_task(
        run_sandboxed(agents.sleep_forever, str(tmp_path), config, clock=clock)
    )
    pid = await read_pid(tmp_path / "child.pid")
    for _ in range(20):  # polling: nothing ends it before the clock says so
        await asyncio.sleep(0.01)
    assert not run.done()
    clock.advance(1.0)
    result = await run
    assert isinstance(result.error, SandboxTimeoutError)
    assert result.error.pid == pid
    assert result.error.pid is not None
    assert gone(result.error.pid)


async def test_an_answer_the_parent_cannot_unpickle_is_an_agent_error() -> None:
    result = await run_sandboxed(agents.unknown_here, "x", PROCESS)
    assert result.completed is False
    assert isinstance(result.error, SandboxAgentError)
    assert "answer could not be read in this process" in result.error.message
    assert "OnlyInTheChild" in result.error.message


async def test_a_preloaded_child_starts_with_the_modules_already_imported() -> None:
    # ``decimal`` is imported by neither the sandbox nor the agent's module: only the fork
    # server of the preload list can have imported it.
    config = SandboxConfig(isolation="process", timeout_s=20, preload=("decimal",))
    result = await run_sandboxed(agents.loaded, "decimal", config)
    assert result.completed, result.error
    assert result.result == ["decimal"]
    plain = await run_sandboxed(agents.loaded, "decimal", SandboxConfig(isolation="process"))
    assert plain.result == []


@pytest.mark.parametrize("preload", [("",), "decimal", (1,)])
def test_preload_needs_module_names_and_process_isolation(preload: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="preload"):
        SandboxConfig(isolation="process", preload=preload)
    with pytest.raises(InvalidArgumentError, match="preload"):
        SandboxConfig(preload=("decimal",))


_ROOT = Path(__file__).resolve().parents[2]
_ORPHAN_SCRIPT = """
import asyncio, os, sys
from corral.resilience import SandboxConfig, run_sandboxed
from tests.resilience import sandbox_agents as agents

async def main():
    config = SandboxConfig(isolation="process", timeout_s=60, preload=("decimal",))
    run = asyncio.ensure_future(run_sandboxed(agents.sleep_forever, sys.argv[1], config))
    while not os.path.exists(os.path.join(sys.argv[1], "child.pid")):
        await asyncio.sleep(0.01)
    os._exit(9)  # a crash: nothing is cleaned up

if __name__ == "__main__":
    asyncio.run(main())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
async def test_a_child_does_not_outlive_a_parent_that_crashes(tmp_path: Path) -> None:
    script = tmp_path / "crash.py"
    script.write_text(_ORPHAN_SCRIPT)
    root = _ROOT
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(script),
        str(tmp_path),
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    assert await asyncio.wait_for(process.wait(), 30) == 9
    child = await read_pid(tmp_path / "child.pid")
    for _ in range(500):
        if gone(child):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"child {child} outlived the parent that crashed")
