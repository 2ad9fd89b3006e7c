import dataclasses
import math

import pytest

from corral.kernel import InvalidArgumentError
from corral.recovery import RecoveryAction, RecoveryPolicy


def test_defaults_follow_the_seed() -> None:
    policy = RecoveryPolicy()
    assert policy.max_retries == 3
    assert policy.escalate_after == 3
    assert policy.cooldown_s == 5.0
    assert policy.default_action is RecoveryAction.RESTART


def test_policy_is_frozen_and_keyword_only() -> None:
    policy = RecoveryPolicy(max_retries=4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.max_retries = 5  # type: ignore[misc]
    with pytest.raises(TypeError):
        RecoveryPolicy(3)  # type: ignore[call-arg]


def test_with_the_defaults_an_agent_is_ejected_without_being_escalated() -> None:
    policy = RecoveryPolicy()
    actions = [policy.action_for(n) for n in range(5)]
    assert actions == [RecoveryAction.RESTART] * 3 + [RecoveryAction.EJECT] * 2


def test_escalate_after_below_max_retries_escalates_first() -> None:
    policy = RecoveryPolicy(max_retries=3, escalate_after=2, default_action=RecoveryAction.REPLACE)
    assert [policy.action_for(n) for n in range(4)] == [
        RecoveryAction.REPLACE,
        RecoveryAction.REPLACE,
        RecoveryAction.ESCALATE,
        RecoveryAction.EJECT,
    ]


def test_escalate_after_above_max_retries_never_escalates() -> None:
    policy = RecoveryPolicy(max_retries=2, escalate_after=5)
    assert [policy.action_for(n) for n in range(6)] == [RecoveryAction.RESTART] * 2 + [
        RecoveryAction.EJECT
    ] * 4


def test_eject_wins_over_escalate_once_both_are_reached() -> None:
    policy = RecoveryPolicy(max_retries=1, escalate_after=1)
    assert policy.action_for(1) is RecoveryAction.EJECT


def test_a_zero_cooldown_is_allowed() -> None:
    assert RecoveryPolicy(cooldown_s=0).cooldown_s == 0


@pytest.mark.parametrize("field", ["max_retries", "escalate_after"])
@pytest.mark.parametrize("value", [0, -1, 1.5, True, "3", None])
def test_counts_must_be_positive_integers(field: str, value: object) -> None:
    with pytest.raises(InvalidArgumentError, match=f"{field} must be a positive integer") as caught:
        RecoveryPolicy(**{field: value})  # type: ignore[arg-type]
    assert caught.value.where == "RecoveryPolicy"


@pytest.mark.parametrize("value", [-0.1, math.nan, math.inf, "5", None])
def test_cooldown_must_be_a_finite_non_negative_number(value: object) -> None:
    with pytest.raises(InvalidArgumentError, match="cooldown_s must be a finite number >= 0"):
        RecoveryPolicy(cooldown_s=value)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["restart", None, 1])
def test_default_action_must_be_a_recovery_action(value: object) -> None:
    with pytest.raises(InvalidArgumentError, match="default_action must be a RecoveryAction"):
        RecoveryPolicy(default_action=value)  # type: ignore[arg-type]


def test_actions_have_stable_values() -> None:
    assert [a.value for a in RecoveryAction] == [
        "eject",
        "replace",
        "restart",
        "restart_clean",
        "escalate",
    ]
