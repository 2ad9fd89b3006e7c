"""What a guardrail answers (``GuardrailResult``, ``Severity``) and the ``Guardrail`` protocol."""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol, runtime_checkable

from corral.kernel import InvalidArgumentError
from corral.kernel import _validate as v


class Severity(StrEnum):
    """How serious a guardrail's answer is: INFO and WARNING allow, BLOCK refuses."""

    INFO = "info"
    WARNING = "warning"
    BLOCK = "block"


@dataclass(frozen=True, slots=True)
class GuardrailWarning:
    """One warning met while checking an action: which guardrail gave it, and why."""

    guardrail: str
    reason: str


@dataclass(frozen=True, slots=True, init=False)
class GuardrailResult:
    """A guardrail's verdict on one action.

    ``allowed`` says whether the action may go on and ``reason`` why not (or what to watch);
    ``severity`` defaults to INFO when allowed and BLOCK when not. BLOCK goes with
    ``allowed=False`` and only with it; a block or a warning needs a non-empty reason.
    ``warnings`` holds every warning met on the way to this verdict when
    ``Supervisor.check_action`` returns it (a single guardrail leaves it empty). Build results
    with :meth:`allow`, :meth:`warning` and :meth:`blocked`. Raises ``InvalidArgumentError``
    for any other combination.
    """

    allowed: bool
    reason: str | None
    severity: Severity
    warnings: tuple[GuardrailWarning, ...]

    def __init__(
        self,
        allowed: bool,
        reason: str | None = None,
        severity: Severity | None = None,
        warnings: tuple[GuardrailWarning, ...] = (),
    ) -> None:
        where = "GuardrailResult"
        v.instance_of(where, "allowed", allowed, bool)
        v.instance_of(where, "reason", reason, (str, type(None)))
        if severity is None:
            severity = Severity.INFO if allowed else Severity.BLOCK
        v.instance_of(where, "severity", severity, Severity)
        if allowed == (severity is Severity.BLOCK):
            expected = "INFO or WARNING when allowed" if allowed else "BLOCK when not allowed"
            raise InvalidArgumentError(where, "severity", expected, severity)
        if severity is not Severity.INFO and (reason is None or not reason.strip()):
            raise InvalidArgumentError(
                where, "reason", f"a non-empty string for severity {severity.name}", reason
            )
        v.instance_of(where, "warnings", warnings, tuple)
        for item in warnings:
            v.instance_of(where, "warnings[]", item, GuardrailWarning)
        object.__setattr__(self, "allowed", allowed)
        object.__setattr__(self, "reason", reason)
        object.__setattr__(self, "severity", severity)
        object.__setattr__(self, "warnings", warnings)

    @staticmethod
    def allow() -> GuardrailResult:
        """Allowed, severity INFO, no reason (one shared instance)."""
        return _ALLOW

    @staticmethod
    def warning(reason: str) -> GuardrailResult:
        """Allowed, severity WARNING: the action may go on, and ``reason`` is logged."""
        return GuardrailResult(True, reason, Severity.WARNING)

    @staticmethod
    def blocked(reason: str) -> GuardrailResult:
        """Not allowed, severity BLOCK."""
        return GuardrailResult(False, reason, Severity.BLOCK)

    @property
    def is_warning(self) -> bool:
        return self.severity is Severity.WARNING


_ALLOW = GuardrailResult(True, None, Severity.INFO)


@runtime_checkable
class Guardrail(Protocol):
    """A rule on what an agent may do.

    ``name`` identifies it in a supervisor (unique there, non-empty). ``check`` answers for
    ``agent_id`` doing ``action`` with ``context`` (read-only to the guardrail), plainly or as
    an awaitable. Raising counts as a block.
    """

    @property
    def name(self) -> str: ...

    def check(
        self, agent_id: str, action: str, context: Mapping[str, object]
    ) -> GuardrailResult | Awaitable[GuardrailResult]: ...
