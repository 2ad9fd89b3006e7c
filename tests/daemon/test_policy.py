"""The failure rules of DESIGN section 4, one by one, on the pure policy function."""

from __future__ import annotations

from typing import Any

import pytest

from corral.daemon import parse_spec
from corral.daemon._policy import Decision, after_failure


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
