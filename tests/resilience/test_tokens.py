import logging
import math
import threading

import pytest

from corral.kernel import InvalidArgumentError, UsageError
from corral.resilience import NoAllocationError, TokenBudget


def test_consume_counts_against_the_agent_and_the_global_budget() -> None:
    budget = TokenBudget(10_000)
    budget.allocate("a", 3_000)
    budget.allocate("b", 1_000)
    budget.consume("a", 1_200)
    budget.consume("b", 300)
    assert budget.used("a") == 1_200
    assert budget.remaining("a") == 1_800
    assert budget.usage_percent("a") == pytest.approx(40.0)
    assert budget.remaining("b") == 700
    assert budget.global_used() == 1_500
    assert budget.global_remaining() == 8_500
    assert budget.global_usage_percent() == pytest.approx(15.0)
    assert budget.global_budget == 10_000


def test_allocating_again_replaces_and_restarts_the_agents_count_only() -> None:
    budget = TokenBudget(10_000)
    budget.allocate("a", 1_000)
    budget.consume("a", 800)
    budget.allocate("a", 500)
    assert budget.allocations() == {"a": 500}
    assert budget.used("a") == 0
    assert budget.remaining("a") == 500
    assert budget.global_used() == 800  # what was spent stays spent


def test_consume_without_an_allocation_raises() -> None:
    budget = TokenBudget(100)
    with pytest.raises(NoAllocationError) as info:
        budget.consume("ghost", 1)
    err = info.value
    assert isinstance(err, UsageError)
    assert err.code == "no_allocation"
    assert err.agent_id == "ghost"
    assert err.retryable is False
    assert "agent 'ghost' has no token allocation" in err.message
    assert "allocate('ghost', tokens) before consume" in err.message
    assert budget.global_used() == 0  # nothing recorded


@pytest.mark.parametrize("method", ["used", "remaining", "usage_percent"])
def test_figures_of_an_unallocated_agent_raise(method: str) -> None:
    budget = TokenBudget(100)
    with pytest.raises(NoAllocationError, match=f"before {method}"):
        getattr(budget, method)("ghost")


def test_use_beyond_the_allocation_and_the_global_budget_is_recorded() -> None:
    budget = TokenBudget(1_000)
    budget.allocate("a", 100)
    budget.consume("a", 150)
    budget.consume("a", 1_000)
    assert budget.used("a") == 1_150
    assert budget.remaining("a") == 0
    assert budget.usage_percent("a") == pytest.approx(1_150.0)
    assert budget.global_remaining() == 0
    assert budget.global_usage_percent() == pytest.approx(115.0)


def test_a_warning_is_logged_from_ninety_percent(caplog: pytest.LogCaptureFixture) -> None:
    budget = TokenBudget(1_000_000)
    budget.allocate("a", 1_000)
    with caplog.at_level(logging.WARNING, logger="corral.resilience.tokens"):
        budget.consume("a", 899)
        assert caplog.records == []
        budget.consume("a", 1)
        assert len(caplog.records) == 1
        assert "agent 'a' has used 900 of its 1000-token allocation (90.0%)" in caplog.text
        budget.consume("a", 200)  # past the allocation: still warns, and is recorded
        assert len(caplog.records) == 2
        assert "1100 of its 1000-token allocation (110.0%)" in caplog.text


def test_the_global_budget_warns_from_ninety_percent(caplog: pytest.LogCaptureFixture) -> None:
    budget = TokenBudget(1_000)
    budget.allocate("a", 10_000)
    with caplog.at_level(logging.WARNING, logger="corral.resilience.tokens"):
        budget.consume("a", 899)
        assert caplog.records == []
        budget.consume("a", 1)
    assert "global token budget is 90.0% used: 900 of 1000 tokens" in caplog.text


def test_the_warning_ratio_can_be_set(caplog: pytest.LogCaptureFixture) -> None:
    budget = TokenBudget(1_000_000, warn_ratio=0.5)
    budget.allocate("a", 100)
    with caplog.at_level(logging.WARNING, logger="corral.resilience.tokens"):
        budget.consume("a", 49)
        assert caplog.records == []
        budget.consume("a", 1)
    assert "50 of its 100-token allocation" in caplog.text


def test_can_consume_needs_room_in_both_budgets() -> None:
    budget = TokenBudget(1_000)
    budget.allocate("a", 600)
    budget.allocate("b", 600)
    assert budget.can_consume("a", 600)  # an exact fit is room
    assert not budget.can_consume("a", 601)  # the allocation is short
    budget.consume("b", 500)
    assert budget.can_consume("a", 500)
    assert not budget.can_consume("a", 501)  # the global budget is short
    assert budget.can_consume("a", 0)
    assert not budget.can_consume("ghost", 1)  # no allocation: no room


def test_allocations_is_a_copy() -> None:
    budget = TokenBudget(100)
    budget.allocate("a", 10)
    copy = budget.allocations()
    copy["b"] = 99
    assert budget.allocations() == {"a": 10}
    assert "agents=1" in repr(budget)


def test_consume_is_thread_safe() -> None:
    budget = TokenBudget(10**9)
    for name in ("a", "b"):
        budget.allocate(name, 10**9)

    def worker(agent_id: str) -> None:
        for _ in range(2_000):
            budget.consume(agent_id, 1)
            budget.can_consume(agent_id, 1)

    threads = [threading.Thread(target=worker, args=("ab"[i % 2],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert budget.used("a") == budget.used("b") == 8_000
    assert budget.global_used() == 16_000


# --- bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, -5, 1.5, True, "100", None])
def test_global_budget_must_be_a_positive_int(value: object) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        TokenBudget(value)  # type: ignore[arg-type]
    assert info.value.argument == "global_budget"
    assert "TokenBudget: global_budget must be a positive integer" in info.value.message


@pytest.mark.parametrize("value", [0, -0.1, 1.01, math.nan, True, "0.9"])
def test_warn_ratio_must_be_in_zero_one(value: object) -> None:
    with pytest.raises(InvalidArgumentError, match=r"warn_ratio must be a number in \(0, 1\]"):
        TokenBudget(100, warn_ratio=value)  # type: ignore[arg-type]


@pytest.mark.parametrize("tokens", [0, -1, 2.5, None])
def test_allocation_must_be_a_positive_int(tokens: object) -> None:
    with pytest.raises(InvalidArgumentError, match="allocate: tokens must be a positive integer"):
        TokenBudget(100).allocate("a", tokens)  # type: ignore[arg-type]


@pytest.mark.parametrize("tokens", [-1, 2.5, None, False])
def test_consumed_tokens_must_be_a_non_negative_int(tokens: object) -> None:
    budget = TokenBudget(100)
    budget.allocate("a", 10)
    with pytest.raises(InvalidArgumentError, match="tokens must be a non-negative integer"):
        budget.consume("a", tokens)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="tokens must be a non-negative integer"):
        budget.can_consume("a", tokens)  # type: ignore[arg-type]
    assert budget.used("a") == 0


@pytest.mark.parametrize("agent_id", ["", " ", None, 7])
def test_agent_ids_must_be_non_empty_strings(agent_id: object) -> None:
    budget = TokenBudget(100)
    with pytest.raises(InvalidArgumentError, match="agent_id must be a non-empty string"):
        budget.allocate(agent_id, 10)  # type: ignore[arg-type]
    for method in (budget.consume, budget.can_consume):
        with pytest.raises(InvalidArgumentError, match="agent_id"):
            method(agent_id, 1)  # type: ignore[arg-type]
    for query in (budget.used, budget.remaining, budget.usage_percent):
        with pytest.raises(InvalidArgumentError, match="agent_id"):
            query(agent_id)  # type: ignore[arg-type]
