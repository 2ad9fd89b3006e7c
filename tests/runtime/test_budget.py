import threading

import pytest

from corral.kernel import BudgetExhaustedError, ExecutionBudget, InvalidArgumentError
from corral.runtime import ExecutionTracker, FakeClock


def test_unlimited_budget_never_raises() -> None:
    tracker = ExecutionTracker()
    tracker.record(tokens=10**9, cost_usd=10**6, turns=10**6)
    tracker.check()
    assert tracker.usage().tokens == 10**9


def test_record_raises_the_instant_a_limit_is_passed_and_still_counts() -> None:
    tracker = ExecutionTracker(ExecutionBudget(max_tokens=100))
    tracker.record(tokens=100)  # exactly at the limit: not passed
    with pytest.raises(BudgetExhaustedError) as info:
        tracker.record(tokens=1)
    err = info.value
    assert (err.dimension, err.limit, err.used) == ("tokens", 100, 101)
    assert err.message == "tokens budget exhausted: used 101 of a limit of 100"
    assert tracker.usage().tokens == 101


def test_check_refuses_when_no_room_is_left() -> None:
    tracker = ExecutionTracker(ExecutionBudget(max_turns=2))
    tracker.record(turns=1)
    tracker.check()
    tracker.record(turns=1)
    with pytest.raises(
        BudgetExhaustedError, match="turns budget exhausted: used 2 of a limit of 2"
    ):
        tracker.check()
    assert tracker.remaining_turns() == 0


def test_cost_dimension() -> None:
    tracker = ExecutionTracker(ExecutionBudget(max_cost_usd=0.5))
    tracker.record(cost_usd=0.3)
    with pytest.raises(BudgetExhaustedError) as info:
        tracker.record(cost_usd=0.3)
    assert info.value.dimension == "cost_usd"
    assert info.value.used == pytest.approx(0.6)
    assert "limit of 0.5" in info.value.message


def test_deadline_is_measured_on_the_clock_from_creation() -> None:
    clock = FakeClock()
    tracker = ExecutionTracker(ExecutionBudget(deadline_s=30), clock=clock)
    clock.advance(29.5)
    tracker.check()
    clock.advance(0.5)
    with pytest.raises(BudgetExhaustedError) as info:
        tracker.check()
    assert (info.value.dimension, info.value.limit, info.value.used) == ("deadline_s", 30, 30.0)
    assert tracker.usage().elapsed_s == 30


def test_zero_limit_leaves_no_room_at_all() -> None:
    with pytest.raises(BudgetExhaustedError):
        ExecutionTracker(ExecutionBudget(max_tokens=0)).check()


@pytest.mark.parametrize(
    "kwargs", [{"tokens": -1}, {"tokens": 1.5}, {"cost_usd": float("nan")}, {"turns": -2}]
)
def test_bad_records_are_refused_and_count_nothing(kwargs: dict[str, float]) -> None:
    tracker = ExecutionTracker()
    with pytest.raises(InvalidArgumentError):
        tracker.record(**kwargs)  # type: ignore[arg-type]
    assert tracker.usage().tokens == 0
    assert tracker.usage().turns == 0


def test_budget_must_be_an_execution_budget() -> None:
    with pytest.raises(InvalidArgumentError, match="budget must be an ExecutionBudget"):
        ExecutionTracker({"max_tokens": 3})  # type: ignore[arg-type]


def test_clock_must_be_a_clock() -> None:
    with pytest.raises(InvalidArgumentError, match="ExecutionTracker: clock must be a Clock"):
        ExecutionTracker(clock=12.0)  # type: ignore[arg-type]


def test_records_from_many_threads_are_all_counted() -> None:
    tracker = ExecutionTracker()

    def work() -> None:
        for _ in range(1000):
            tracker.record(tokens=1, turns=1)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert tracker.usage().tokens == 8000
    assert tracker.usage().turns == 8000
