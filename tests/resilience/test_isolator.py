import asyncio
import logging
import math
import threading
from datetime import timedelta
from typing import Any

import pytest

from corral.kernel import CorralError, InvalidArgumentError, RefusalError
from corral.resilience import CircuitOpenError, CircuitState, Degradation, FailureIsolator
from corral.runtime import FakeClock


class Boom(Exception):
    pass


class Action:
    """A sync action that fails while ``failing`` is set and counts its runs."""

    def __init__(self, value: str = "ok") -> None:
        self.value = value
        self.failing = False
        self.runs = 0

    def __call__(self) -> str:
        self.runs += 1
        if self.failing:
            raise Boom(f"run {self.runs} failed")
        return self.value


def _raise_boom() -> str:
    raise Boom("boom")


async def trip(iso: FailureIsolator, agent_id: str, action: Action) -> Any:
    """Fail ``action`` until the circuit opens; returns what the opening call returned."""
    action.failing = True
    for _ in range(iso.failure_threshold - 1):
        with pytest.raises(Boom):
            await iso.execute(agent_id, action)
    return await iso.execute(agent_id, action, lambda: "degraded")


# --- the closed path ----------------------------------------------------------------------


def test_defaults() -> None:
    iso = FailureIsolator()
    assert iso.failure_threshold == 3
    assert iso.recovery_timeout_s == 30.0
    assert iso.degradation is Degradation.FALLBACK
    assert "failure_threshold=3" in repr(iso)


async def test_success_returns_the_value_of_sync_and_async_actions() -> None:
    iso = FailureIsolator()

    async def async_action() -> int:
        await asyncio.sleep(0)
        return 42

    assert await iso.execute("a", lambda: "sync") == "sync"
    assert await iso.execute("a", async_action) == 42
    assert iso.state("a") is CircuitState.CLOSED
    assert iso.failure_count("a") == 0


async def test_failure_below_the_threshold_is_reraised_and_counted() -> None:
    iso = FailureIsolator(failure_threshold=3, clock=FakeClock())
    action = Action()
    action.failing = True
    for expected in (1, 2):
        with pytest.raises(Boom, match=f"run {expected} failed"):
            await iso.execute("a", action, lambda: "degraded")
        assert iso.failure_count("a") == expected
        assert iso.state("a") is CircuitState.CLOSED


async def test_async_failures_count_too() -> None:
    iso = FailureIsolator(failure_threshold=2, clock=FakeClock())

    async def failing() -> str:
        raise Boom("async")

    with pytest.raises(Boom):
        await iso.execute("a", failing)
    assert await iso.execute("a", failing, lambda: "fb") == "fb"
    assert iso.state("a") is CircuitState.OPEN


async def test_success_resets_the_count() -> None:
    iso = FailureIsolator(failure_threshold=3, clock=FakeClock())
    action = Action()
    action.failing = True
    for _ in range(2):
        with pytest.raises(Boom):
            await iso.execute("a", action)
    action.failing = False
    assert await iso.execute("a", action) == "ok"
    assert iso.failure_count("a") == 0
    action.failing = True
    with pytest.raises(Boom):  # counting starts again from zero: no opening yet
        await iso.execute("a", action)
    assert iso.failure_count("a") == 1


async def test_the_failure_reaching_the_threshold_opens_and_returns_the_fallback() -> None:
    iso = FailureIsolator(failure_threshold=3, clock=FakeClock())
    action = Action()
    assert await trip(iso, "a", action) == "degraded"
    assert iso.state("a") is CircuitState.OPEN
    assert iso.failure_count("a") == 3


async def test_opening_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    iso = FailureIsolator(failure_threshold=1, clock=FakeClock())
    with caplog.at_level(logging.WARNING, logger="corral.resilience.isolator"):
        await trip(iso, "agent-7", Action())
    assert "circuit for agent 'agent-7' opened after 1 consecutive failures" in caplog.text


async def test_threshold_of_one_opens_on_the_first_failure() -> None:
    iso = FailureIsolator(failure_threshold=1, clock=FakeClock())
    action = Action()
    action.failing = True
    assert await iso.execute("a", action) is None
    assert iso.state("a") is CircuitState.OPEN


# --- open, half-open, probe ---------------------------------------------------------------


async def test_while_open_the_action_does_not_run() -> None:
    clock = FakeClock()
    iso = FailureIsolator(failure_threshold=2, recovery_timeout_s=30, clock=clock)
    action = Action()
    await trip(iso, "a", action)
    runs = action.runs
    action.failing = False
    clock.advance(29.999)
    for _ in range(5):
        assert await iso.execute("a", action, lambda: "degraded") == "degraded"
    assert action.runs == runs
    assert iso.state("a") is CircuitState.OPEN


async def test_after_the_timeout_a_successful_probe_closes() -> None:
    clock = FakeClock()
    iso = FailureIsolator(failure_threshold=2, recovery_timeout_s=30, clock=clock)
    action = Action()
    await trip(iso, "a", action)
    clock.advance(30)
    assert iso.state("a") is CircuitState.HALF_OPEN
    action.failing = False
    assert await iso.execute("a", action, lambda: "degraded") == "ok"
    assert iso.state("a") is CircuitState.CLOSED
    assert iso.failure_count("a") == 0
    action.failing = True
    with pytest.raises(Boom):  # closed again: a single failure re-raises
        await iso.execute("a", action)


async def test_a_failed_probe_opens_again_for_a_whole_timeout() -> None:
    clock = FakeClock()
    iso = FailureIsolator(failure_threshold=2, recovery_timeout_s=30, clock=clock)
    action = Action()
    await trip(iso, "a", action)
    clock.advance(30)
    runs = action.runs
    assert await iso.execute("a", action, lambda: "degraded") == "degraded"
    assert action.runs == runs + 1  # the probe ran
    assert iso.state("a") is CircuitState.OPEN
    assert iso.failure_count("a") == 3
    clock.advance(29.5)
    assert iso.state("a") is CircuitState.OPEN
    clock.advance(0.5)
    assert iso.state("a") is CircuitState.HALF_OPEN


async def test_exactly_one_probe_however_many_callers_arrive_at_once() -> None:
    clock = FakeClock()
    iso = FailureIsolator(failure_threshold=1, recovery_timeout_s=5, clock=clock)
    await trip(iso, "a", Action())
    clock.advance(5)
    release = asyncio.Event()
    runs = 0

    async def probe() -> str:
        nonlocal runs
        runs += 1
        await release.wait()
        return "probe"

    tasks = [asyncio.create_task(iso.execute("a", probe, lambda: "degraded")) for _ in range(50)]
    degraded = [await t for t in tasks[1:]]  # the 49 latecomers do not wait for the probe
    assert degraded == ["degraded"] * 49
    assert not tasks[0].done()
    assert iso.state("a") is CircuitState.HALF_OPEN
    release.set()
    assert await tasks[0] == "probe"
    assert runs == 1
    assert iso.state("a") is CircuitState.CLOSED


async def test_concurrent_callers_during_a_probe_fail_fast_with_half_open_error() -> None:
    clock = FakeClock()
    iso = FailureIsolator(1, 5, Degradation.FAIL_FAST, clock=clock)
    with pytest.raises(CircuitOpenError):
        await iso.execute("a", _raise_boom)
    clock.advance(5)
    release = asyncio.Event()

    async def probe() -> str:
        await release.wait()
        return "probe"

    tasks = [asyncio.create_task(iso.execute("a", probe)) for _ in range(50)]
    results = await asyncio.gather(*tasks[1:], return_exceptions=True)
    assert all(isinstance(r, CircuitOpenError) for r in results)
    error = results[0]
    assert isinstance(error, CircuitOpenError)
    assert error.state is CircuitState.HALF_OPEN
    assert "half-open" in error.message
    assert "probe" in error.message
    release.set()
    assert await tasks[0] == "probe"


async def test_a_cancelled_probe_frees_the_slot_and_is_not_a_failure() -> None:
    clock = FakeClock()
    iso = FailureIsolator(failure_threshold=1, recovery_timeout_s=5, clock=clock)
    await trip(iso, "a", Action())
    clock.advance(5)
    started = asyncio.Event()

    async def hang() -> str:
        started.set()
        await asyncio.Event().wait()
        return "never"

    probe = asyncio.create_task(iso.execute("a", hang))
    await started.wait()
    probe.cancel()
    with pytest.raises(asyncio.CancelledError):
        await probe
    assert iso.state("a") is CircuitState.HALF_OPEN
    assert iso.failure_count("a") == 1
    assert await iso.execute("a", lambda: "second probe") == "second probe"
    assert iso.state("a") is CircuitState.CLOSED


async def test_cancellation_passes_through_and_is_not_counted() -> None:
    iso = FailureIsolator(failure_threshold=1, clock=FakeClock())
    started = asyncio.Event()

    async def hang() -> None:
        started.set()
        await asyncio.Event().wait()

    task = asyncio.create_task(iso.execute("a", hang))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert iso.failure_count("a") == 0
    assert iso.state("a") is CircuitState.CLOSED


async def test_base_exceptions_that_are_not_exceptions_pass_through_uncounted() -> None:
    class Stop(BaseException):
        pass

    def stop() -> None:
        raise Stop

    iso = FailureIsolator(failure_threshold=1, clock=FakeClock())
    with pytest.raises(Stop):
        await iso.execute("a", stop)
    assert iso.failure_count("a") == 0


# --- no lock around the action ------------------------------------------------------------


async def test_fifty_slow_calls_for_one_agent_run_concurrently() -> None:
    iso = FailureIsolator()
    barrier = asyncio.Barrier(50)
    inside = 0

    async def slow(i: int) -> int:
        nonlocal inside
        inside += 1
        await barrier.wait()  # passes only once all 50 are inside the action together
        return i

    async with asyncio.timeout(10):
        results = await asyncio.gather(
            *(iso.execute("a", lambda i=i: slow(i)) for i in range(50))  # type: ignore[misc]
        )
    assert results == list(range(50))
    assert inside == 50


async def test_a_circuit_opened_between_the_callers_two_looks_is_not_counted_again() -> None:
    # Another thread may open the circuit after this call has read the epoch but before it
    # reads the state. The call must then see the open circuit (and degrade), never run as a
    # closed call of the new epoch whose failure would be counted past the threshold.
    iso = FailureIsolator(failure_threshold=2, clock=FakeClock())
    assert await iso.execute("a", lambda: "warm") == "warm"
    # Reaches into the circuit to replay one thread interleaving exactly.
    circuit = iso._circuits["a"]
    other = Action()

    class OpensOnFirstLook(type(circuit)):  # type: ignore[misc]
        __slots__ = ("looked",)

        def __getattribute__(self, name: str) -> Any:
            if name == "epoch" and not object.__getattribute__(self, "looked"):
                object.__setattr__(self, "looked", True)
                # What a concurrent caller does under the lock when its failure opens it.
                object.__setattr__(self, "failures", 2)
                object.__setattr__(self, "state", CircuitState.OPEN)
                object.__setattr__(self, "epoch", object.__getattribute__(self, "epoch") + 1)
            return object.__getattribute__(self, name)

    racing = OpensOnFirstLook()
    racing.looked = False
    iso._circuits["a"] = racing
    other.failing = True
    assert await iso.execute("a", other, lambda: "degraded") == "degraded"
    assert other.runs == 0  # the call saw the open circuit: the action never ran
    assert iso.failure_count("a") == 2
    assert iso.state("a") is CircuitState.OPEN


def test_exactly_one_probe_when_callers_in_several_threads_arrive_at_once() -> None:
    clock = FakeClock()
    iso = FailureIsolator(failure_threshold=1, recovery_timeout_s=5, clock=clock)
    asyncio.run(trip(iso, "a", Action()))
    clock.advance(5)
    start = threading.Barrier(8)
    others_done = threading.Event()
    runs: list[int] = []
    answers: list[object] = []
    lock = threading.Lock()

    def probe() -> str:
        with lock:
            runs.append(1)
        # Holds the probe open until the other seven have been answered without it.
        others_done.wait(timeout=10)
        return "probe"

    def worker() -> None:
        start.wait(timeout=10)
        answer = asyncio.run(iso.execute("a", probe, lambda: "degraded"))
        with lock:
            answers.append(answer)
            if answers.count("degraded") == 7:
                others_done.set()

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert runs == [1]
    assert sorted(map(str, answers)) == ["degraded"] * 7 + ["probe"]
    assert iso.state("a") is CircuitState.CLOSED


def test_failures_from_many_threads_open_once_and_never_count_past_the_threshold() -> None:
    iso = FailureIsolator(failure_threshold=5, recovery_timeout_s=60, clock=FakeClock())
    start = threading.Barrier(8)
    raised: list[int] = []
    lock = threading.Lock()

    def fail() -> None:
        raise Boom("x")

    def worker() -> None:
        async def run() -> None:
            for _ in range(200):
                try:
                    await iso.execute("a", fail, lambda: "degraded")
                except Boom:
                    with lock:
                        raised.append(1)

        start.wait(timeout=10)
        asyncio.run(run())

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Four failures below the threshold are re-raised; the fifth opens it; every other call,
    # racing or late, gets the degraded value and is not counted.
    assert len(raised) == 4
    assert iso.failure_count("a") == 5
    assert iso.state("a") is CircuitState.OPEN


def test_calls_from_many_threads_run_concurrently_and_count_exactly() -> None:
    iso = FailureIsolator(failure_threshold=10_000)
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def meet() -> int:
        return barrier.wait(timeout=10)  # would time out if a lock serialised the calls

    def fail() -> None:
        raise Boom("x")

    def worker() -> None:
        async def run() -> None:
            await iso.execute("meet", meet)  # another agent: its success resets nothing here
            for _ in range(100):
                with pytest.raises(Boom):
                    await iso.execute("a", fail)

        try:
            asyncio.run(run())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert iso.failure_count("a") == 800


# --- degradation strategies ---------------------------------------------------------------


async def test_fallback_without_a_fallback_gives_none() -> None:
    iso = FailureIsolator(failure_threshold=1, clock=FakeClock())
    action = Action()
    action.failing = True
    assert await iso.execute("a", action) is None
    assert await iso.execute("a", action) is None


async def test_fallback_may_be_async_and_its_error_propagates() -> None:
    iso = FailureIsolator(failure_threshold=1, clock=FakeClock())
    action = Action()
    action.failing = True

    async def async_fallback() -> str:
        return "async fallback"

    assert await iso.execute("a", action, async_fallback) == "async fallback"

    def broken_fallback() -> str:
        raise ValueError("fallback broke")

    with pytest.raises(ValueError, match="fallback broke"):
        await iso.execute("a", action, broken_fallback)


async def test_skip_gives_none_and_never_calls_the_fallback() -> None:
    iso = FailureIsolator(1, 30, Degradation.SKIP, clock=FakeClock())
    called = []
    action = Action()
    action.failing = True
    assert await iso.execute("a", action, lambda: called.append(1)) is None
    assert await iso.execute("a", action, lambda: called.append(1)) is None
    assert called == []


async def test_cached_gives_the_agents_last_success_or_none() -> None:
    iso = FailureIsolator(1, 30, Degradation.CACHED, clock=FakeClock())
    first, second = Action("first"), Action("second")
    assert await iso.execute("a", first) == "first"
    assert await iso.execute("a", second) == "second"
    second.failing = True
    assert await iso.execute("a", second) == "second"  # the opening failure
    assert await iso.execute("a", first) == "second"  # open: the action does not run
    assert first.runs == 1
    never = Action()
    never.failing = True
    assert await iso.execute("b", never) is None  # no success for b: None, not a's value


async def test_fail_fast_raises_circuit_open_error_naming_agent_count_and_probe_time() -> None:
    clock = FakeClock()
    iso = FailureIsolator(2, 30, Degradation.FAIL_FAST, clock=clock)
    action = Action()
    action.failing = True
    with pytest.raises(Boom):
        await iso.execute("agent-9", action)
    with pytest.raises(CircuitOpenError) as opening:
        await iso.execute("agent-9", action)
    assert isinstance(opening.value.__cause__, Boom)  # chained to the failure that opened it
    clock.advance(10)
    with pytest.raises(CircuitOpenError) as info:
        await iso.execute("agent-9", action)
    err = info.value
    assert isinstance(err, RefusalError)
    assert isinstance(err, CorralError)
    assert err.code == "circuit_open"
    assert err.retryable is True
    assert (err.agent_id, err.failure_count, err.state) == ("agent-9", 2, CircuitState.OPEN)
    assert err.retry_after_s == pytest.approx(20.0)
    assert err.probe_at == clock.now() + timedelta(seconds=20)
    assert "agent 'agent-9'" in err.message
    assert "after 2 consecutive failures (threshold 2)" in err.message
    assert err.failure_threshold == 2
    assert "in 20.000 s" in err.message
    assert err.probe_at.isoformat() in err.message
    assert err.to_dict()["details"]["probe_at"] == err.probe_at.isoformat()
    assert action.runs == 2


# --- per agent, reset, inspection ---------------------------------------------------------


async def test_circuits_are_per_agent() -> None:
    iso = FailureIsolator(failure_threshold=1, clock=FakeClock())
    await trip(iso, "bad", Action())
    assert iso.state("bad") is CircuitState.OPEN
    assert await iso.execute("good", lambda: "fine") == "fine"
    assert iso.state("good") is CircuitState.CLOSED


def test_unknown_agents_are_closed_with_no_failures_and_reset_is_a_no_op() -> None:
    iso = FailureIsolator()
    assert iso.state("never-seen") is CircuitState.CLOSED
    assert iso.failure_count("never-seen") == 0
    iso.reset("never-seen")
    assert "agents=0" in repr(iso)


async def test_reset_closes_zeroes_and_keeps_the_cache() -> None:
    iso = FailureIsolator(1, 30, Degradation.CACHED, clock=FakeClock())
    action = Action("v1")
    assert await iso.execute("a", action) == "v1"
    action.failing = True
    await iso.execute("a", action)
    assert iso.state("a") is CircuitState.OPEN
    iso.reset("a")
    iso.reset("a")  # idempotent
    assert iso.state("a") is CircuitState.CLOSED
    assert iso.failure_count("a") == 0
    action.failing = False
    action.value = "v2"
    assert await iso.execute("a", action) == "v2"


async def test_a_late_success_from_before_the_opening_does_not_close_the_circuit() -> None:
    iso = FailureIsolator(failure_threshold=1, clock=FakeClock())
    entered, release = asyncio.Event(), asyncio.Event()

    async def slow() -> str:
        entered.set()
        await release.wait()
        return "late"

    slow_call = asyncio.create_task(iso.execute("a", slow))
    await entered.wait()
    await trip(iso, "a", Action())
    release.set()
    assert await slow_call == "late"
    assert iso.state("a") is CircuitState.OPEN  # only a probe may close it


async def test_a_late_failure_is_degraded_while_open_and_reraised_after_a_reset() -> None:
    iso = FailureIsolator(failure_threshold=1, clock=FakeClock())
    entered, release = asyncio.Event(), asyncio.Event()

    async def slow_failure() -> str:
        entered.set()
        await release.wait()
        raise Boom("late")

    slow_call = asyncio.create_task(iso.execute("a", slow_failure, lambda: "degraded"))
    await entered.wait()
    await trip(iso, "a", Action())
    release.set()
    assert await slow_call == "degraded"
    assert iso.failure_count("a") == 1  # not counted twice

    iso.reset("a")
    entered.clear()
    release.clear()
    slow_call = asyncio.create_task(iso.execute("a", slow_failure))
    await entered.wait()
    iso.reset("a")
    release.set()
    with pytest.raises(Boom):
        await slow_call
    assert iso.failure_count("a") == 0  # the reset circuit is not moved by it


# --- bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "3", None])
def test_failure_threshold_must_be_a_positive_int(value: object) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        FailureIsolator(failure_threshold=value)  # type: ignore[arg-type]
    assert info.value.argument == "failure_threshold"
    assert "FailureIsolator: failure_threshold must be a positive integer" in info.value.message


@pytest.mark.parametrize("value", [0, -1.0, math.nan, math.inf, "30", None])
def test_recovery_timeout_must_be_a_positive_finite_number(value: object) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        FailureIsolator(recovery_timeout_s=value)  # type: ignore[arg-type]
    assert info.value.argument == "recovery_timeout_s"
    assert repr(value) in info.value.message


def test_degradation_and_clock_are_checked() -> None:
    with pytest.raises(InvalidArgumentError, match="degradation must be a Degradation"):
        FailureIsolator(degradation="fallback")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="clock must be a Clock"):
        FailureIsolator(clock=object())  # type: ignore[arg-type]


@pytest.mark.parametrize("agent_id", ["", "  ", 5, None, ["a"]])
async def test_agent_ids_must_be_non_empty_strings(agent_id: Any) -> None:
    iso = FailureIsolator()
    with pytest.raises(InvalidArgumentError, match="agent_id must be a non-empty string"):
        await iso.execute(agent_id, lambda: 1)
    for method in (iso.state, iso.failure_count, iso.reset):
        with pytest.raises(InvalidArgumentError, match="agent_id"):
            method(agent_id)


async def test_action_and_fallback_must_be_callable() -> None:
    iso = FailureIsolator(failure_threshold=1, clock=FakeClock())
    with pytest.raises(InvalidArgumentError, match="action must be callable"):
        await iso.execute("a", "not callable")  # type: ignore[call-overload]
    with pytest.raises(InvalidArgumentError, match="fallback must be callable or None"):
        await iso.execute("a", lambda: 1, 42)  # type: ignore[call-overload]
    assert iso.failure_count("a") == 0  # bad input is not an agent failure
    await trip(iso, "a", Action())
    with pytest.raises(InvalidArgumentError, match="action must be callable"):
        await iso.execute("a", None)  # type: ignore[call-overload]
