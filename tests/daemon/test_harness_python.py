"""PythonHarness: functions named ``module:function``, sync and async."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.daemon import (
    Harness,
    PythonHarness,
    TurnContext,
    TurnFailedError,
    TurnRequest,
    parse_spec,
)
from corral.kernel import InvalidArgumentError
from tests.daemon.workers import py_funcs
from tests.support.polling import settle

MODULE = "tests.daemon.workers.py_funcs"


def request(
    tmp_path: Path,
    function: str,
    *,
    prompt: str = "hello",
    timeout_s: float = 10.0,
    env: dict[str, str] | None = None,
    spec_env: dict[str, str] | None = None,
) -> TurnRequest:
    target = function if ":" in function else f"{MODULE}:{function}"
    spec = parse_spec({"name": "p", "harness": "python", "function": target, "env": spec_env or {}})
    return TurnRequest(
        agent_id="a_00c0ffee",
        turn=7,
        prompt=prompt,
        spec=spec,
        workdir=tmp_path / "work",
        state_dir=tmp_path / "state",
        env=env or {},
        timeout_s=timeout_s,
    )


@pytest.fixture(autouse=True)
def fresh_worker_state() -> Iterator[None]:
    py_funcs.seen.clear()
    py_funcs.release.clear()
    yield
    py_funcs.release.set()  # lets a blocked worker thread end


async def test_sync_function_runs_in_a_thread_with_its_context(tmp_path: Path) -> None:
    harness = PythonHarness()
    assert isinstance(harness, Harness)
    req = request(tmp_path, "report", spec_env={"A": "spec", "B": "spec"}, env={"B": "req"})
    result = await harness.run_turn(req)
    assert result.output == "a_00c0ffee#7: hello"
    assert (result.tokens, result.cost_usd) == (0, 0.0)
    assert py_funcs.seen["thread"] is not threading.main_thread()
    assert py_funcs.seen["context"] == TurnContext(
        agent_id="a_00c0ffee", turn=7, workdir=req.workdir, env={"A": "spec", "B": "req"}
    )


async def test_async_function_is_awaited_on_the_loop(tmp_path: Path) -> None:
    result = await PythonHarness().run_turn(request(tmp_path, "areport"))
    assert result.output == "async a_00c0ffee#7: hello"
    assert py_funcs.seen["thread"] is threading.current_thread()


async def test_object_with_async_call_is_awaited_on_the_loop(tmp_path: Path) -> None:
    result = await PythonHarness().run_turn(request(tmp_path, "acallable"))
    assert result.output == "callable hello"
    assert py_funcs.seen["thread"] is threading.current_thread()


async def test_an_awaitable_returned_by_a_sync_function_is_awaited(tmp_path: Path) -> None:
    result = await PythonHarness().run_turn(request(tmp_path, "returns_awaitable"))
    assert result.output == "awaited hello"


async def test_dict_result_carries_usage(tmp_path: Path) -> None:
    result = await PythonHarness().run_turn(request(tmp_path, "with_usage"))
    assert (result.output, result.tokens, result.cost_usd) == ("HELLO", 42, 0.25)
    result = await PythonHarness().run_turn(request(tmp_path, "unknown_cost"))
    assert result.cost_usd is None
    result = await PythonHarness().run_turn(request(tmp_path, "output_only"))
    assert (result.output, result.tokens, result.cost_usd) == ("only", 0, 0.0)


async def test_other_results_fail_saying_what_was_returned(tmp_path: Path) -> None:
    with pytest.raises(TurnFailedError, match=r"returned int 42; expected a str or a dict"):
        await PythonHarness().run_turn(request(tmp_path, "returns_int"))
    with pytest.raises(TurnFailedError) as caught:
        await PythonHarness().run_turn(request(tmp_path, "bad_dict"))
    message = caught.value.message
    assert "unknown keys ['cost_usd']" in message
    assert "'output' must be a str, got int 7" in message
    assert "'tokens' must be an int >= 0, got int -1" in message


async def test_exception_becomes_a_failed_turn_with_type_and_message(tmp_path: Path) -> None:
    with pytest.raises(TurnFailedError) as caught:
        await PythonHarness().run_turn(request(tmp_path, "raises", prompt="disk full"))
    assert caught.value.message == f"function '{MODULE}:raises' raised ValueError: boom: disk full"
    assert caught.value.details["exception"] == "ValueError"
    with pytest.raises(TurnFailedError, match="raised KeyError: 'missing thing'"):
        await PythonHarness().run_turn(request(tmp_path, "araises"))


async def test_sys_exit_and_keyboard_interrupt_in_the_function_fail_the_turn(
    tmp_path: Path,
) -> None:
    with pytest.raises(TurnFailedError, match="raised SystemExit: 3"):
        await PythonHarness().run_turn(request(tmp_path, "exits"))
    with pytest.raises(TurnFailedError, match="raised RuntimeError: KeyboardInterrupt"):
        await PythonHarness().run_turn(request(tmp_path, "interrupts"))


async def test_the_functions_own_turn_failed_error_passes_through(tmp_path: Path) -> None:
    with pytest.raises(TurnFailedError) as caught:
        await PythonHarness().run_turn(request(tmp_path, "fails_with_usage"))
    assert caught.value.message == "quota hit"
    assert caught.value.usage == {"tokens": 9, "costUsd": 0.5}


async def test_the_functions_own_timeout_error_is_not_a_turn_timeout(tmp_path: Path) -> None:
    with pytest.raises(TurnFailedError, match="raised TimeoutError: upstream took too long"):
        await PythonHarness().run_turn(request(tmp_path, "raises_timeout"))


@pytest.mark.parametrize(
    ("function", "expected"),
    [
        (
            "tests.daemon.workers.no_such_module:f",
            r"could not import module 'tests.daemon.workers.no_such_module' of function "
            r".*ModuleNotFoundError",
        ),
        (
            "tests.daemon.workers.broken_import:f",
            r"could not import module .*RuntimeError: broken on purpose",
        ),
        (f"{MODULE}:nothing_here", rf"module '{MODULE}' has no attribute 'nothing_here'"),
        (f"{MODULE}:NOT_CALLABLE", r"is a int, not a function"),
    ],
)
async def test_unresolvable_functions_fail_the_turn(
    tmp_path: Path, function: str, expected: str
) -> None:
    with pytest.raises(TurnFailedError, match=expected) as caught:
        await PythonHarness().run_turn(request(tmp_path, function))
    assert caught.value.details["function"] == function


async def test_sync_timeout_fails_the_turn_and_leaves_the_thread_to_finish(tmp_path: Path) -> None:
    with pytest.raises(TurnFailedError, match=r"turn timed out after 0.2 s") as caught:
        await PythonHarness().run_turn(request(tmp_path, "blocks", timeout_s=0.2))
    assert caught.value.details["timeout_s"] == 0.2
    assert py_funcs.seen["blocks_started"] is True
    assert "blocks_finished" not in py_funcs.seen  # the thread cannot be stopped...
    py_funcs.release.set()
    await settle(lambda: py_funcs.seen.get("blocks_finished") is True)  # ...it ends by itself


async def test_async_timeout_cancels_the_coroutine(tmp_path: Path) -> None:
    with pytest.raises(TurnFailedError, match=r"turn timed out after 0.1 s"):
        await PythonHarness().run_turn(request(tmp_path, "ablocks", timeout_s=0.1))
    assert py_funcs.seen["ablocks_cancelled"] is True


async def test_cancellation_propagates_and_cancels_an_async_function(tmp_path: Path) -> None:
    task = asyncio.ensure_future(PythonHarness().run_turn(request(tmp_path, "ablocks")))
    await settle(lambda: "ablocks_started" in py_funcs.seen)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert py_funcs.seen["ablocks_cancelled"] is True


async def test_cancellation_propagates_for_a_sync_function(tmp_path: Path) -> None:
    task = asyncio.ensure_future(PythonHarness().run_turn(request(tmp_path, "blocks")))
    await settle(lambda: "blocks_started" in py_funcs.seen)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    py_funcs.release.set()
    await settle(lambda: py_funcs.seen.get("blocks_finished") is True)


async def test_reap_has_nothing_to_end(tmp_path: Path) -> None:
    assert await PythonHarness().reap("a_1", tmp_path) is False
    with pytest.raises(InvalidArgumentError, match="agent_id"):
        await PythonHarness().reap("", tmp_path)
    with pytest.raises(InvalidArgumentError, match="state_dir"):
        await PythonHarness().reap("a_1", "dir")  # type: ignore[arg-type]


async def test_run_turn_refuses_what_is_not_a_python_turn(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="request must be a TurnRequest"):
        await PythonHarness().run_turn(None)  # type: ignore[arg-type]
    spec = parse_spec({"name": "c", "harness": "command", "command": ["true"]})
    other = TurnRequest(
        agent_id="a_1", turn=1, prompt="x", spec=spec, workdir=tmp_path, state_dir=tmp_path
    )
    with pytest.raises(InvalidArgumentError, match="a spec of harness 'python'"):
        await PythonHarness().run_turn(other)
