import dataclasses

import pytest

from corral.guard import Guardrail, GuardrailResult, GuardrailWarning, HumanApproval, Severity
from corral.kernel import ActionVerdict, InvalidArgumentError


def test_allow_is_allowed_info_without_reason_and_shared() -> None:
    result = GuardrailResult.allow()
    assert (result.allowed, result.reason, result.severity, result.warnings) == (
        True,
        None,
        Severity.INFO,
        (),
    )
    assert GuardrailResult.allow() is result
    assert not result.is_warning


def test_warning_is_allowed_with_severity_warning() -> None:
    result = GuardrailResult.warning("spend is high")
    assert result.allowed is True
    assert result.reason == "spend is high"
    assert result.severity is Severity.WARNING
    assert result.is_warning


def test_blocked_is_refused_with_severity_block() -> None:
    result = GuardrailResult.blocked("over the cap")
    assert result.allowed is False
    assert result.reason == "over the cap"
    assert result.severity is Severity.BLOCK


def test_severity_defaults_from_allowed() -> None:
    assert GuardrailResult(True).severity is Severity.INFO
    assert GuardrailResult(False, "no").severity is Severity.BLOCK


def test_results_are_frozen_values() -> None:
    result = GuardrailResult.blocked("no")
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.allowed = True  # type: ignore[misc]
    assert result == GuardrailResult(False, "no", Severity.BLOCK)
    warned = GuardrailResult(True, None, Severity.INFO, (GuardrailWarning("g", "w"),))
    assert warned.warnings == (GuardrailWarning("g", "w"),)


def test_a_result_is_an_action_verdict() -> None:
    verdict: ActionVerdict = GuardrailResult.blocked("no")
    assert verdict.allowed is False
    assert verdict.reason == "no"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"allowed": 1}, "allowed must be a bool, got 1"),
        ({"allowed": True, "reason": 5}, "reason must be a str or NoneType, got 5"),
        ({"allowed": True, "severity": "info"}, "severity must be a Severity, got 'info'"),
        (
            {"allowed": True, "severity": Severity.BLOCK},
            "severity must be INFO or WARNING when allowed",
        ),
        (
            {"allowed": False, "reason": "x", "severity": Severity.INFO},
            "severity must be BLOCK when not allowed",
        ),
        (
            {"allowed": False, "reason": "x", "severity": Severity.WARNING},
            "severity must be BLOCK when not allowed",
        ),
        ({"allowed": False}, "reason must be a non-empty string for severity BLOCK, got None"),
        (
            {"allowed": True, "reason": "  ", "severity": Severity.WARNING},
            "reason must be a non-empty string for severity WARNING",
        ),
        ({"allowed": True, "warnings": ["w"]}, "warnings must be a tuple"),
        ({"allowed": True, "warnings": ("w",)}, r"warnings\[\] must be a GuardrailWarning"),
    ],
)
def test_bad_results_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message) as caught:
        GuardrailResult(**kwargs)  # type: ignore[arg-type]
    assert caught.value.code == "invalid_argument"


@pytest.mark.parametrize("reason", ["", "   "])
def test_factories_need_a_reason(reason: str) -> None:
    with pytest.raises(InvalidArgumentError):
        GuardrailResult.blocked(reason)
    with pytest.raises(InvalidArgumentError):
        GuardrailResult.warning(reason)


def test_guardrail_protocol_is_checkable() -> None:
    class Rule:
        name = "rule"

        def check(self, agent_id: str, action: str, context: object) -> GuardrailResult:
            return GuardrailResult.allow()

    assert isinstance(Rule(), Guardrail)
    assert isinstance(HumanApproval({"deploy"}, lambda r: None), Guardrail)
    assert not isinstance(object(), Guardrail)
