"""The failure rules of DESIGN section 4 and the budget, one by one, on pure functions."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from corral.daemon import _budget, parse_spec
from corral.daemon._policy import Decision, after_failure
from corral.daemon._records import Usage
from corral.kernel import ExecutionBudget


def spec(**fields: Any) -> Any:
    return parse_spec({"name": "w", "harness": "command", "command": ["x"], **fields})


def record(last_prompt: str | None = "go", retries_used: int = 0) -> dict[str, Any]:
    return {"lastPrompt": last_prompt, "retriesUsed": retries_used}


def test_fail_is_the_default() -> None:
    assert after_failure(record(), spec(), 1) == Decision("fail")


def test_ask_holds_with_reason_ask() -> None:
    assert after_failure(record(), spec(onFailure="ask"), 1) == Decision("hold", "ask")


def test_retry_resends_until_max_retries_then_holds_retries_exhausted() -> None:
    policy = spec(onFailure="retry", maxRetries=2, maxConsecutiveFailures=10)
    assert after_failure(record(retries_used=0), policy, 1) == Decision("retry")
    assert after_failure(record(retries_used=1), policy, 2) == Decision("retry")
    assert after_failure(record(retries_used=2), policy, 3) == Decision("hold", "retries-exhausted")


def test_retry_with_zero_max_retries_holds_as_exhausted() -> None:
    policy = spec(onFailure="retry", maxRetries=0)
    assert after_failure(record(), policy, 1) == Decision("hold", "retries-exhausted")


def test_retry_without_max_retries_holds_at_once_with_reason_ask() -> None:
    assert after_failure(record(), spec(onFailure="retry"), 1) == Decision("hold", "ask")


@pytest.mark.parametrize("last_prompt", [None, ""])
def test_retry_with_nothing_to_resend_holds_at_once_with_reason_ask(
    last_prompt: str | None,
) -> None:
    policy = spec(onFailure="retry", maxRetries=5)
    assert after_failure(record(last_prompt), policy, 1) == Decision("hold", "ask")


@pytest.mark.parametrize(
    "policy",
    [
        {"onFailure": "fail"},
        {"onFailure": "ask"},
        {"onFailure": "retry", "maxRetries": 10},
        {"onFailure": "retry"},
    ],
)
def test_the_breaker_trips_whatever_the_policy(policy: dict[str, Any]) -> None:
    rules = spec(maxConsecutiveFailures=2, **policy)
    assert after_failure(record(), rules, 2) == Decision("hold", "circuit-tripped")
    assert after_failure(record(), rules, 7) == Decision("hold", "circuit-tripped")


def test_the_breaker_defaults_to_three_failures_in_a_row() -> None:
    rules = spec(onFailure="retry", maxRetries=10)
    assert after_failure(record(), rules, 2) == Decision("retry")
    assert after_failure(record(), rules, 3) == Decision("hold", "circuit-tripped")


def test_a_breaker_of_one_holds_even_a_fail_policy_on_the_first_failure() -> None:
    rules = spec(maxConsecutiveFailures=1)
    assert after_failure(record(), rules, 1) == Decision("hold", "circuit-tripped")


# --- the budget ------------------------------------------------------------------------------

CREATED = "2026-01-01T00:00:00+00:00"


def used(tokens: int = 0, cost: float = 0.0, turns: int = 0, unpriced: int = 0) -> Usage:
    return {"tokens": tokens, "costUsd": cost, "turns": turns, "unpricedTurns": unpriced}


def test_age_counts_from_the_agents_creation() -> None:
    now = datetime.fromisoformat(CREATED) + timedelta(seconds=90)
    assert _budget.age_s(CREATED, now) == 90.0


def test_an_unlimited_budget_is_never_exhausted() -> None:
    assert _budget.exhausted(ExecutionBudget(), used(10**9, 1e9, 10**6, 5), 1e9) is None


@pytest.mark.parametrize(
    ("budget", "spent", "dimension"),
    [
        (ExecutionBudget(max_tokens=100), used(tokens=100), "tokens"),
        (ExecutionBudget(max_cost_usd=1.0), used(cost=1.0), "cost_usd"),
        (ExecutionBudget(max_turns=2), used(turns=2), "turns"),
    ],
)
def test_a_dimension_used_up_leaves_no_room(
    budget: ExecutionBudget, spent: Usage, dimension: str
) -> None:
    exhausted = _budget.exhausted(budget, spent, 0.0)
    assert exhausted is not None
    assert exhausted.dimension == dimension


def test_room_left_in_every_dimension_is_not_exhausted() -> None:
    budget = ExecutionBudget(max_tokens=100, max_cost_usd=1.0, max_turns=2, deadline_s=60)
    assert _budget.exhausted(budget, used(99, 0.5, 1), 59.0) is None


def test_the_deadline_counts_the_agents_age() -> None:
    exhausted = _budget.exhausted(ExecutionBudget(deadline_s=60), used(), 60.0004)
    assert exhausted is not None
    assert (exhausted.dimension, exhausted.used) == ("deadline_s", 60.0)


def test_a_dollar_limit_cannot_vouch_for_turns_of_unknown_cost() -> None:
    exhausted = _budget.exhausted(ExecutionBudget(max_cost_usd=5.0), used(unpriced=2), 0.0)
    assert exhausted is not None
    assert exhausted.dimension == "cost_usd"
    assert "the cost of 2 turn(s) is unknown" in exhausted.message
    # without a dollar limit, unknown costs do not matter
    assert _budget.exhausted(ExecutionBudget(max_tokens=10), used(unpriced=2), 0.0) is None


def test_remaining_is_the_budget_less_what_was_spent_never_below_zero() -> None:
    budget = ExecutionBudget(max_tokens=100, max_cost_usd=1.0, max_turns=5, deadline_s=60)
    left = _budget.remaining(budget, used(40, 1.5, 3), 20.0)
    assert left == ExecutionBudget(max_tokens=60, max_cost_usd=0.0, deadline_s=40.0)
    assert _budget.remaining(ExecutionBudget(), used(40), 20.0) == ExecutionBudget()
