import asyncio
import math
import pickle
import threading
from dataclasses import FrozenInstanceError
from typing import Any

import pytest

from corral.kernel import InvalidArgumentError, RunError
from corral.resilience import (
    DEFAULT_SANDBOX,
    READ_ONLY_PREFIX,
    SandboxAgentError,
    SandboxConfig,
    SandboxError,
    SandboxInterruptedError,
    SandboxResult,
    SandboxTask,
    SandboxTimeoutError,
    run_sandboxed,
)
from corral.runtime import FakeClock


async def until(condition: Any, what: str, *, rounds: int = 1000) -> None:
    """Let the event loop run until ``condition()`` holds, a bounded number of rounds."""
    for _ in range(rounds):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"never happened: {what}")


# --- config and task ----------------------------------------------------------------------


def test_config_defaults_match_the_design() -> None:
    config = SandboxConfig()
    assert config == DEFAULT_SANDBOX
    assert config.timeout_s == 30.0
    assert config.max_memory_bytes == 0
    assert config.allowed_actions == frozenset()
    assert config.read_only is False
    assert config.isolation == "task"
    with pytest.raises(FrozenInstanceError):
        config.timeout_s = 1  # type: ignore[misc]


def test_config_takes_any_iterable_of_actions_as_a_frozenset() -> None:
    config = SandboxConfig(allowed_actions=["read", "list", "read"])  # type: ignore[arg-type]
    assert config.allowed_actions == frozenset({"read", "list"})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"timeout_s": 0}, "timeout_s must be a finite number > 0, got 0"),
        ({"timeout_s": -1.5}, "timeout_s must be a finite number > 0, got -1.5"),
        ({"timeout_s": math.nan}, "timeout_s must be a finite number > 0, got nan"),
        ({"timeout_s": "30"}, "timeout_s must be a finite number > 0, got '30'"),
        ({"max_memory_bytes": -1, "isolation": "process"}, "max_memory_bytes must be a non-neg"),
        ({"max_memory_bytes": 1.5, "isolation": "process"}, "max_memory_bytes must be a non-neg"),
        ({"max_memory_bytes": 1 << 20}, "max_memory_bytes must be 0 unless isolation='process'"),
        ({"allowed_actions": "read"}, "allowed_actions must be an iterable of action names"),
        ({"allowed_actions": 5}, "allowed_actions must be an iterable of action names"),
        ({"allowed_actions": ["read", ""]}, "allowed_actions must be an iterable of non-empty"),
        ({"allowed_actions": [1]}, "allowed_actions must be an iterable of non-empty strings"),
        ({"read_only": "yes"}, "read_only must be a bool"),
        ({"isolation": "thread"}, "isolation must be 'task' or 'process', got 'thread'"),
    ],
)
def test_config_refuses_bad_values(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        SandboxConfig(**kwargs)
    assert info.value.message.startswith("SandboxConfig: ")
    assert message in info.value.message


def test_a_read_only_task_is_marked_in_text_and_in_fields() -> None:
    task = SandboxTask("drop the table", True, {"select"})
    assert task == READ_ONLY_PREFIX + "drop the table"
    assert task.startswith("[READ-ONLY MODE]")
    assert (task.original, task.read_only, task.allowed_actions) == (
        "drop the table",
        True,
        frozenset({"select"}),
    )
    plain = SandboxTask("drop the table")
    assert plain == "drop the table"
    assert plain.read_only is False
    copy = pickle.loads(pickle.dumps(task))
    assert type(copy) is SandboxTask
    assert (copy, copy.original, copy.read_only, copy.allowed_actions) == (
        task,
        task.original,
        True,
        frozenset({"select"}),
    )


def test_task_fields_are_checked() -> None:
    with pytest.raises(InvalidArgumentError, match="original must be a str"):
        SandboxTask(5)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="read_only must be a bool"):
        SandboxTask("x", 1)  # type: ignore[arg-type]


def test_errors_are_run_errors_with_stable_codes() -> None:
    timeout = SandboxTimeoutError(2.0, 2.001)
    assert isinstance(timeout, SandboxError)
    assert isinstance(timeout, RunError)
    assert (timeout.code, timeout.retryable) == ("sandbox_timeout", True)
    assert (
        timeout.message == "the sandboxed run exceeded its timeout of 2 s (stopped after 2.001 s)"
    )
    agent = SandboxAgentError("ValueError", "bad")
    assert (agent.code, agent.retryable) == ("sandbox_agent_failed", False)
    assert SandboxInterruptedError("why").code == "sandbox_interrupted"


# --- runs in this process -----------------------------------------------------------------


async def test_a_plain_function_agent_completes() -> None:
    seen: list[str] = []

    def agent(task: str) -> str:
        seen.append(task)
        return f"did {task}"

    result = await run_sandboxed(agent, "the job")
    assert result == SandboxResult(
        result="did the job", completed=True, duration_s=result.duration_s, error=None
    )
    assert result.duration_s >= 0
    assert seen == ["the job"]
    assert isinstance(seen[0], SandboxTask)


async def test_agents_with_a_chat_method_sync_or_async() -> None:
    class SyncAgent:
        def chat(self, task: str) -> str:
            return "sync " + task

    class AsyncAgent:
        async def chat(self, task: str) -> str:
            await asyncio.sleep(0)
            return "async " + task

    assert (await run_sandboxed(SyncAgent(), "hi")).result == "sync hi"
    assert (await run_sandboxed(AsyncAgent(), "hi")).result == "async hi"


async def test_read_only_and_allowed_actions_reach_the_agent() -> None:
    seen: list[SandboxTask] = []

    async def agent(task: str) -> None:
        assert isinstance(task, SandboxTask)
        seen.append(task)

    config = SandboxConfig(read_only=True, allowed_actions=frozenset({"select"}))
    result = await run_sandboxed(agent, "count the rows", config)
    assert result.completed
    assert seen[0] == "[READ-ONLY MODE] count the rows"
    assert seen[0].read_only
    assert seen[0].allowed_actions == {"select"}
    assert seen[0].original == "count the rows"


async def test_a_plain_function_agent_does_not_block_the_event_loop() -> None:
    released = threading.Event()

    def agent(task: str) -> str:
        if not released.wait(timeout=10):
            return "the loop was blocked"
        return "released"

    run = asyncio.create_task(run_sandboxed(agent, "wait"))
    await asyncio.sleep(0)
    released.set()  # runs only because the agent is off the loop
    assert (await run).result == "released"


async def test_an_exception_comes_back_as_an_agent_error() -> None:
    def agent(task: str) -> str:
        raise ValueError(f"cannot do {task}")

    result = await run_sandboxed(agent, "x")
    assert result.completed is False
    assert result.result is None
    error = result.error
    assert isinstance(error, SandboxAgentError)
    assert error.code == "sandbox_agent_failed"
    assert (error.error_type, error.error_message) == ("ValueError", "cannot do x")
    assert error.message == "the sandboxed agent raised ValueError: cannot do x"
    assert isinstance(error.__cause__, ValueError)
    assert "in agent" in error.traceback


async def test_a_timeout_cancels_the_agent_and_comes_back_as_an_error() -> None:
    clock = FakeClock()
    cancelled = asyncio.Event()

    async def agent(task: str) -> str:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    run = asyncio.create_task(run_sandboxed(agent, "x", SandboxConfig(timeout_s=5), clock=clock))
    await until(lambda: clock.pending_timers == 1, "the timeout is armed")
    clock.advance(4.9)
    assert not run.done()
    clock.advance(0.1)
    result = await run
    assert result.completed is False
    assert isinstance(result.error, SandboxTimeoutError)
    assert result.error.timeout_s == 5
    assert "exceeded its timeout of 5 s" in result.error.message
    assert result.duration_s == pytest.approx(5.0)
    await asyncio.wait_for(cancelled.wait(), 5)


async def test_a_timed_out_thread_agent_is_answered_without_waiting_for_it() -> None:
    clock = FakeClock()
    entered, finish = threading.Event(), threading.Event()

    def agent(task: str) -> str:
        entered.set()
        finish.wait(timeout=10)
        return "late"

    run = asyncio.create_task(run_sandboxed(agent, "x", SandboxConfig(timeout_s=2), clock=clock))
    try:
        await until(lambda: entered.is_set() and clock.pending_timers == 1, "the agent runs")
        clock.advance(2)
        result = await run  # answered while the thread is still blocked in the agent
        assert not finish.is_set()
    finally:
        finish.set()
    assert result.completed is False
    assert result.result is None
    assert isinstance(result.error, SandboxTimeoutError)
    assert result.error.message.startswith("the sandboxed run exceeded its timeout of 2 s")
    assert result.duration_s == pytest.approx(2.0)


async def test_an_agent_cancelled_from_inside_is_an_interruption() -> None:
    async def agent(task: str) -> str:
        task_ = asyncio.current_task()
        assert task_ is not None
        task_.cancel()
        await asyncio.sleep(0)
        return "never"

    result = await run_sandboxed(agent, "x")
    assert result.completed is False
    assert isinstance(result.error, SandboxInterruptedError)
    assert result.error.code == "sandbox_interrupted"
    assert "cancelled from inside" in result.error.message


async def test_outside_cancellation_propagates_and_cancels_the_agent() -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def agent(task: str) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    run = asyncio.create_task(run_sandboxed(agent, "x"))
    await started.wait()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    await asyncio.wait_for(cancelled.wait(), 5)


@pytest.mark.parametrize("agent", [object(), None, "agent"])
async def test_something_that_is_not_an_agent_is_refused(agent: object) -> None:
    with pytest.raises(InvalidArgumentError, match="agent must be an object with a chat"):
        await run_sandboxed(agent, "x")


async def test_task_config_and_clock_are_checked() -> None:
    def agent(task: str) -> str:
        return task

    with pytest.raises(InvalidArgumentError, match="run_sandboxed: task must be a str, got 5"):
        await run_sandboxed(agent, 5)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="config must be a SandboxConfig"):
        await run_sandboxed(agent, "x", {"timeout_s": 1})  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="clock must be a Clock"):
        await run_sandboxed(agent, "x", clock=object())  # type: ignore[arg-type]
