import pytest

from corral.kernel import (
    BudgetExhaustedError,
    CancellationError,
    CorralError,
    DeadlineExceededError,
    InvalidArgumentError,
    RateLimitedError,
    RunError,
    SpawnBudgetExceeded,
    ToolRefused,
)


def test_every_error_has_code_message_retryable_and_details() -> None:
    err = BudgetExhaustedError("tokens", 100, 130)
    assert isinstance(err, RunError)
    assert isinstance(err, CorralError)
    assert err.to_dict() == {
        "code": "budget_exhausted",
        "message": "tokens budget exhausted: used 130 of a limit of 100",
        "retryable": False,
        "details": {"dimension": "tokens", "limit": 100, "used": 130},
    }
    assert str(err) == err.message


def test_retryable_defaults_per_family_and_can_be_overridden() -> None:
    assert SpawnBudgetExceeded(3, 3, "x", "no one to pause").retryable
    assert RateLimitedError("t", 1.0, 2, 0.5).retryable
    assert not CancellationError("stop").retryable
    assert CorralError("boom", retryable=True).retryable


def test_deadline_error_is_a_cancellation_that_names_both_instants() -> None:
    err = DeadlineExceededError("2026-01-01T00:00:00+00:00", "2026-01-01T00:00:05+00:00")
    assert isinstance(err, CancellationError)
    assert err.code == "deadline_exceeded"
    assert err.reason == "deadline exceeded"
    assert "2026-01-01T00:00:00+00:00" in err.message
    assert "2026-01-01T00:00:05+00:00" in str(err)


def test_invalid_argument_is_also_value_and_type_error() -> None:
    err = InvalidArgumentError("Thing", "size", "a positive integer", -2)
    assert err.message == "Thing: size must be a positive integer, got -2"
    with pytest.raises(ValueError, match="size"):
        raise err
    with pytest.raises(TypeError, match="size"):
        raise err


def test_long_values_are_shortened_in_messages() -> None:
    err = InvalidArgumentError("Thing", "name", "short", "x" * 500)
    assert len(err.message) < 150


def test_tool_refused_names_tool_and_reason() -> None:
    err = ToolRefused("rm", "deletes files")
    assert err.code == "tool_refused"
    assert err.message == "tool 'rm' refused: deletes files"
    assert err.details["tool"] == "rm"
