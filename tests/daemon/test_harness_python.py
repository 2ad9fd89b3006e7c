"""PythonHarness: functions named ``module:function``, sync and async, in worker processes
kept per agent between its turns."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
import types
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from corral.daemon import (
    Harness,
    HttpApi,
    PythonHarness,
    ServeConfig,
    TurnFailedError,
    TurnRequest,
    parse_spec,
    serve,
)
from corral.kernel import InvalidArgumentError
from tests.support.front_door import token_of
from tests.support.polling import settle

MODULE = "tests.daemon.workers.py_funcs"

_made: list[PythonHarness] = []


def make(**options: Any) -> PythonHarness:
    """A PythonHarness whose workers are ended after the test (and checked gone)."""
    harness = PythonHarness(**options)
    _made.append(harness)
    return harness


@pytest.fixture(autouse=True)
async def _workers_end() -> AsyncIterator[None]:
    yield
    made = list(_made)
    _made.clear()
    pids = [pid for harness in made for pid in harness.workers.values() if pid is not None]
    for harness in made:
        await harness.aclose()
        assert harness.workers == {}
    assert [pid for pid in pids if _alive(pid)] == []


def request(
    tmp_path: Path,
    function: str,
    *,
    agent_id: str = "a_00c0ffee",
    prompt: str = "hello",
    timeout_s: float = 10.0,
    env: dict[str, str] | None = None,
    spec_env: dict[str, str] | None = None,
) -> TurnRequest:
    target = function if ":" in function else f"{MODULE}:{function}"
    spec = parse_spec({"name": "p", "harness": "python", "function": target, "env": spec_env or {}})
    return TurnRequest(
        agent_id=agent_id,
        turn=7,
        prompt=prompt,
        spec=spec,
        workdir=tmp_path / "work",
        state_dir=tmp_path / "state",
        env=env or {},
        timeout_s=timeout_s,
    )


async def test_the_function_runs_in_a_worker_process_with_its_context(tmp_path: Path) -> None:
    harness = make()
    assert isinstance(harness, Harness)
    req = request(tmp_path, "report", spec_env={"A": "spec", "B": "spec"}, env={"B": "req"})
    seen = json.loads((await harness.run_turn(req)).output)
    assert seen["pid"] != os.getpid()
    assert seen == {
        "pid": seen["pid"],
        "agentId": "a_00c0ffee",
        "turn": 7,
        "workdir": str(req.workdir),
        "env": {"A": "spec", "B": "req"},
        "isContext": True,
        "prompt": "hello",
    }
    again = json.loads((await harness.run_turn(req)).output)
    assert again["pid"] == seen["pid"]  # the agent's worker is kept for its next turn
    assert harness.workers == {"a_00c0ffee": seen["pid"]}


async def test_async_function_is_run_to_its_end_in_the_worker(tmp_path: Path) -> None:
    result = await make().run_turn(request(tmp_path, "areport"))
    assert result.output.startswith("async a_00c0ffee#7: hello in ")
    assert result.output != f"async a_00c0ffee#7: hello in {os.getpid()}"


async def test_object_with_async_call_is_awaited(tmp_path: Path) -> None:
    result = await make().run_turn(request(tmp_path, "acallable"))
    assert result.output == "callable hello"


async def test_an_awaitable_returned_by_a_sync_function_is_awaited(tmp_path: Path) -> None:
    result = await make().run_turn(request(tmp_path, "returns_awaitable"))
    assert result.output == "awaited hello"


async def test_dict_result_carries_usage(tmp_path: Path) -> None:
    result = await make().run_turn(request(tmp_path, "with_usage"))
    assert (result.output, result.tokens, result.cost_usd) == ("HELLO", 42, 0.25)
    result = await make().run_turn(request(tmp_path, "unknown_cost"))
    assert result.cost_usd is None
    result = await make().run_turn(request(tmp_path, "output_only"))
    assert (result.output, result.tokens, result.cost_usd) == ("only", 0, 0.0)


async def test_other_results_fail_saying_what_was_returned(tmp_path: Path) -> None:
    with pytest.raises(TurnFailedError, match=r"returned int 42; expected a str or a dict"):
        await make().run_turn(request(tmp_path, "returns_int"))
    with pytest.raises(TurnFailedError) as caught:
        await make().run_turn(request(tmp_path, "bad_dict"))
    message = caught.value.message
    assert "unknown keys ['cost_usd']" in message
    assert "'output' must be a str, got int 7" in message
    assert "'tokens' must be an int >= 0, got int -1" in message


async def test_exception_becomes_a_failed_turn_with_type_and_message(tmp_path: Path) -> None:
    with pytest.raises(TurnFailedError) as caught:
        await make().run_turn(request(tmp_path, "raises", prompt="disk full"))
    assert caught.value.message == f"function '{MODULE}:raises' raised ValueError: boom: disk full"
    assert caught.value.details["exception"] == "ValueError"
    with pytest.raises(TurnFailedError, match="raised KeyError: 'missing thing'"):
        await make().run_turn(request(tmp_path, "araises"))


async def test_sys_exit_and_keyboard_interrupt_in_the_function_fail_the_turn(
    tmp_path: Path,
) -> None:
    with pytest.raises(TurnFailedError, match="raised SystemExit: 3"):
        await make().run_turn(request(tmp_path, "exits"))
    with pytest.raises(TurnFailedError, match="raised KeyboardInterrupt"):
        await make().run_turn(request(tmp_path, "interrupts"))


async def test_the_functions_own_turn_failed_error_passes_through(tmp_path: Path) -> None:
    with pytest.raises(TurnFailedError) as caught:
        await make().run_turn(request(tmp_path, "fails_with_usage"))
    assert caught.value.message == "quota hit"
    assert caught.value.usage == {"tokens": 9, "costUsd": 0.5}


async def test_the_functions_own_timeout_error_is_not_a_turn_timeout(tmp_path: Path) -> None:
    with pytest.raises(TurnFailedError, match="raised TimeoutError: upstream took too long"):
        await make().run_turn(request(tmp_path, "raises_timeout"))


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
        await make().run_turn(request(tmp_path, function))
    assert caught.value.details["function"] == function


async def test_a_module_the_worker_cannot_import_fails_the_turn(tmp_path: Path) -> None:
    # In the daemon's modules only: the worker process imports the module by its name.
    module = types.ModuleType("corral_test_in_memory_only")
    module.f = lambda prompt, context: "never"  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    try:
        with pytest.raises(TurnFailedError, match="in the worker process: ModuleNotFoundError"):
            await make().run_turn(request(tmp_path, f"{module.__name__}:f"))
    finally:
        del sys.modules[module.__name__]


async def test_os_exit_is_a_failed_turn_naming_the_exit_code(tmp_path: Path) -> None:
    with pytest.raises(TurnFailedError) as caught:
        await make().run_turn(request(tmp_path, "hard_exit"))
    assert caught.value.message == (
        f"the worker process of function '{MODULE}:hard_exit' exited with code 3 before the "
        "turn ended"
    )
    assert caught.value.details["exit_code"] == 3


async def test_a_segfault_is_a_failed_turn_naming_the_signal(tmp_path: Path) -> None:
    with pytest.raises(TurnFailedError, match="was killed by signal SIGSEGV before the turn"):
        await make().run_turn(request(tmp_path, "segfault"))


async def test_memory_over_the_limit_is_a_failed_turn(tmp_path: Path) -> None:
    harness = make(max_memory_bytes=512 * 1024 * 1024)
    with pytest.raises(TurnFailedError, match="over its memory limit of 536870912 bytes"):
        await harness.run_turn(request(tmp_path, "hog"))


async def test_a_timeout_kills_the_worker_process(tmp_path: Path) -> None:
    req = request(tmp_path, "sleeps", timeout_s=0.5)
    req.workdir.mkdir()
    with pytest.raises(TurnFailedError, match=r"turn timed out after 0.5 s .*killed at the turn"):
        await make().run_turn(req)
    pid = _pid(req.workdir)
    assert pid is not None
    assert not _alive(pid)


async def test_cancellation_kills_the_worker_process_and_propagates(tmp_path: Path) -> None:
    req = request(tmp_path, "sleeps")
    req.workdir.mkdir()
    task = asyncio.ensure_future(make().run_turn(req))
    await settle(lambda: _pid(req.workdir) is not None, within_s=10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    pid = _pid(req.workdir)
    assert pid is not None
    # A cancellation while the process was still starting kills it once the start returns.
    await settle(lambda: not _alive(pid))


def _pid(workdir: Path) -> int | None:
    """The pid the function wrote, once it is written whole."""
    try:
        return int((workdir / "pid").read_text())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_reap_has_nothing_to_end(tmp_path: Path) -> None:
    assert await make().reap("a_1", tmp_path) is False
    with pytest.raises(InvalidArgumentError, match="agent_id"):
        await make().reap("", tmp_path)
    with pytest.raises(InvalidArgumentError, match="state_dir"):
        await make().reap("a_1", "dir")  # type: ignore[arg-type]


async def test_run_turn_refuses_what_is_not_a_python_turn(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="request must be a TurnRequest"):
        await make().run_turn(None)  # type: ignore[arg-type]
    spec = parse_spec({"name": "c", "harness": "command", "command": ["true"]})
    other = TurnRequest(
        agent_id="a_1", turn=1, prompt="x", spec=spec, workdir=tmp_path, state_dir=tmp_path
    )
    with pytest.raises(InvalidArgumentError, match="a spec of harness 'python'"):
        await make().run_turn(other)


# --- the daemon stays up --------------------------------------------------------------------


async def test_a_crashing_python_agent_fails_alone_and_the_daemon_serves_on(
    tmp_path: Path,
) -> None:
    """``os._exit``, a segfault and a memory hog, next to an agent that works: the daemon
    (this process, serving HTTP on loopback) answers throughout, and only the bad agents'
    turns fail."""
    config = ServeConfig(port=0, store=f"sqlite:///{tmp_path / 'corral.db'}", home=tmp_path)
    harness = make(max_memory_bytes=512 * 1024 * 1024)
    bound: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    server = asyncio.create_task(
        serve(config, harnesses={"python": harness}, ready=bound.set_result)
    )
    try:
        url = await asyncio.wait_for(asyncio.shield(bound), 30)
        token = config.token or token_of(tmp_path)  # the one it made, unless given one
        async with HttpApi(url, token=token) as api:
            spec = {"harness": "python", "prompt": "go"}
            bad = {
                name: (await api.spawn({**spec, "name": name, "function": f"{MODULE}:{name}"}))[
                    "id"
                ]
                for name in ("hard_exit", "segfault", "hog")
            }
            good = (await api.spawn({**spec, "name": "good", "function": f"{MODULE}:areport"}))[
                "id"
            ]
            ended: dict[str, Any] = {}

            async def all_ended() -> bool:
                for agent_id in [*bad.values(), good]:
                    ended[agent_id] = await api.get(agent_id)
                return all(a["state"] in ("failed", "idle") for a in ended.values())

            await _until(all_ended)
            assert ended[good]["state"] == "idle"
            assert ended[good]["lastOutput"].startswith("async ")
            errors = {name: ended[agent_id]["lastError"] for name, agent_id in bad.items()}
            assert "exited with code 3" in errors["hard_exit"]
            assert "killed by signal SIGSEGV" in errors["segfault"]
            assert "over its memory limit" in errors["hog"]
            assert all(ended[a]["state"] == "failed" for a in bad.values())
            await api.prompt(good, "again")

            async def second_turn_done() -> bool:
                rec = await api.get(good)
                return bool(rec["turns"] == 2 and rec["state"] == "idle")

            await _until(second_turn_done)
        assert not server.done()
    finally:
        server.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await server


async def _until(check: Callable[[], Awaitable[bool]], within_s: float = 30.0) -> None:
    """Poll ``check`` over HTTP until it holds (worker processes answer in real time)."""
    for _ in range(int(within_s / 0.05)):
        if await check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not within {within_s} s")


def _waiting_since(offset_s: float) -> Callable[[], float]:
    """``paused_s`` of a turn that waits on a person from ``offset_s`` seconds after now."""
    since = time.monotonic() + offset_s
    return lambda: max(0.0, time.monotonic() - since)


async def test_time_waiting_on_a_person_does_not_count_against_the_timeout(
    tmp_path: Path,
) -> None:
    # The function runs 1.2 s on a 0.5 s timeout, but from 0.1 s on it waits on a person.
    req = replace(
        request(tmp_path, "naps", prompt="1.2", timeout_s=0.5), paused_s=_waiting_since(0.1)
    )
    result = await make().run_turn(req)
    assert result.output == "napped 1.2"


async def test_with_pauses_given_the_timeout_still_kills_the_worker(tmp_path: Path) -> None:
    req = replace(request(tmp_path, "sleeps", timeout_s=0.5), paused_s=lambda: 0.0)
    req.workdir.mkdir()
    with pytest.raises(TurnFailedError) as caught:
        await make().run_turn(req)
    assert caught.value.message == (
        "turn timed out after 0.5 s; its worker process was killed at the turn timeout"
    )
    pid = _pid(req.workdir)
    assert pid is not None
    await settle(lambda: not _alive(pid))
