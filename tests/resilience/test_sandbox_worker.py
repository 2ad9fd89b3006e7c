"""SandboxWorker: a child process kept between runs, ended when a run kills it or on close."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from corral.kernel import InvalidArgumentError
from corral.resilience import SandboxTask, SandboxWorker
from tests.resilience import sandbox_agents as agents
from tests.resilience.test_sandbox_process import LIMIT, gone, read_pid


@pytest.fixture
async def worker() -> AsyncIterator[SandboxWorker]:
    made = SandboxWorker(max_memory_bytes=LIMIT)
    yield made
    await made.close()
    if made.pid is not None:
        assert gone(made.pid)


async def test_runs_share_one_process_its_modules_and_its_event_loop(
    worker: SandboxWorker,
) -> None:
    assert worker.pid is None
    first = await worker.run(agents.count, "x", timeout_s=20)
    second = await worker.run(agents.count, "x", timeout_s=20)
    assert first.result == (worker.pid, 1)
    assert second.result == (worker.pid, 2)
    loops = [(await worker.run(agents.loop_id, "x", timeout_s=20)).result for _ in range(2)]
    assert loops[0] == loops[1]
    marked = await worker.run(agents.describe, SandboxTask("t", read_only=True), timeout_s=20)
    assert marked.result is not None
    assert marked.result["read_only"] is True


async def test_an_agent_error_leaves_the_worker_up(worker: SandboxWorker) -> None:
    failed = await worker.run(agents.fail, "x", timeout_s=20)
    assert failed.error is not None
    assert failed.error.code == "sandbox_agent_failed"
    assert not worker.ended
    assert (await worker.run(agents.count, "x", timeout_s=20)).completed


@pytest.mark.parametrize("how", ["timeout", "exit", "memory"])
async def test_a_run_that_kills_the_worker_ends_it(
    worker: SandboxWorker, tmp_path: Path, how: str
) -> None:
    if how == "timeout":
        ran = await worker.run(agents.sleep_forever, str(tmp_path), timeout_s=0.5)
        assert await read_pid(tmp_path / "child.pid") == worker.pid
        code = "sandbox_timeout"
    elif how == "exit":
        await worker.run(agents.count, "x", timeout_s=20)
        ran = await worker.run(agents.exit_now, "3", timeout_s=20)
        code = "sandbox_interrupted"
    else:
        ran = await worker.run(agents.allocate, str(LIMIT * 2), timeout_s=20)
        code = "sandbox_memory_limit"
    assert ran.error is not None
    assert ran.error.code == code
    assert worker.ended
    assert worker.pid is not None
    assert gone(worker.pid)
    after = await worker.run(agents.count, "x", timeout_s=20)
    assert after.error is not None
    assert after.error.code == "sandbox_start_failed"
    assert "has ended" in after.error.message


async def test_close_ends_the_worker_and_kill_makes_the_run_fail(worker: SandboxWorker) -> None:
    await worker.run(agents.count, "x", timeout_s=20)
    pid = worker.pid
    assert pid is not None
    worker.kill()
    ran = await worker.run(agents.count, "x", timeout_s=20)
    assert ran.error is not None
    assert ran.error.code == "sandbox_interrupted"
    await worker.close()
    await worker.close()
    assert gone(pid)


async def test_bad_arguments_are_refused() -> None:
    worker = SandboxWorker()
    with pytest.raises(InvalidArgumentError, match="agent"):
        await worker.run(42, "x", timeout_s=1)
    with pytest.raises(InvalidArgumentError, match="timeout_s"):
        await worker.run(agents.count, "x", timeout_s=0)
    with pytest.raises(InvalidArgumentError, match="preload"):
        SandboxWorker(preload="corral")
    await worker.close()
    assert worker.ended
