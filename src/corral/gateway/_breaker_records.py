"""What the breakers count and what they record: the policy, which outcome counts toward which
signal (:data:`OUTCOME_SIGNALS`), freezes and reinstatements."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Any, ClassVar, Literal

from corral.gateway._errors import GatewayError
from corral.kernel import InvalidArgumentError
from corral.kernel import _validate as v

__all__ = [
    "OUTCOME_SIGNALS",
    "SIGNALS",
    "BreakerPolicy",
    "BreakerStatus",
    "Freeze",
    "Reinstatement",
    "RequestOutcome",
    "Signal",
    "record_from_dict",
]

Signal = Literal["errors", "refusals", "suspicious_empties"]
SIGNALS: tuple[Signal, ...] = ("errors", "refusals", "suspicious_empties")

_ERRORS = (
    "database_error",
    "invalid_data",
    "constraint_violation",
    "transaction_conflict",
    "statement_timeout",
    "result_too_large",
    "read_only_violation",
)
_REFUSALS = (
    "parse_error",
    "statement_too_complex",
    "multiple_statements",
    "forbidden_statement",
    "forbidden_function",
    "unknown_table",
    "unknown_column",
    "invalid_operation",
    "idempotency_key_required",
    "idempotency_conflict",
)
_NEUTRAL = (
    "ok",
    "genuinely_empty",
    "replayed",
    "idempotency_in_progress",
    "outcome_unknown",
    "pool_exhausted",
    "analysis_busy",
    # the gateway's own failure, not the agent's: counted nowhere
    "analysis_error",
    "database_unavailable",
    "agent_frozen",
)

OUTCOME_SIGNALS: Mapping[str, Signal | None] = MappingProxyType(
    {
        **dict.fromkeys(_ERRORS, "errors"),
        **dict.fromkeys(_REFUSALS, "refusals"),
        "suspiciously_empty": "suspicious_empties",
        **dict.fromkeys(_NEUTRAL, None),
    }
)
"""Outcome code -> the signal it counts toward (None: counted nowhere)."""

_LABELS: dict[str, str] = {
    "errors": "errors",
    "refusals": "refusals",
    "suspicious_empties": "suspicious empties",
}


def signal_label(signal: str) -> str:
    """``suspicious_empties`` -> ``suspicious empties`` (for messages)."""
    return _LABELS.get(signal, signal)


@dataclass(frozen=True, slots=True, kw_only=True)
class BreakerPolicy:
    """Per-agent thresholds over one rolling window of ``window_s`` seconds.

    An agent is frozen when, within the last ``window_s`` seconds, the count of one signal
    reaches its threshold (the ``max_errors``-th error freezes, not the one after). None
    disables a signal: it is then neither counted nor shown in evidence. ``window_s`` must be a
    finite number > 0; thresholds positive integers or None.
    """

    window_s: float = 60.0
    max_errors: int | None = 5
    max_refusals: int | None = 10
    max_suspicious_empties: int | None = 5

    def __post_init__(self) -> None:
        where = "BreakerPolicy"
        v.positive_number(where, "window_s", self.window_s)
        v.positive_int(where, "max_errors", self.max_errors, optional=True)
        v.positive_int(where, "max_refusals", self.max_refusals, optional=True)
        v.positive_int(where, "max_suspicious_empties", self.max_suspicious_empties, optional=True)

    def threshold(self, signal: Signal) -> int | None:
        """The threshold of ``signal`` (None: disabled)."""
        if signal == "errors":
            return self.max_errors
        if signal == "refusals":
            return self.max_refusals
        return self.max_suspicious_empties

    @property
    def thresholds(self) -> dict[str, int | None]:
        return {signal: self.threshold(signal) for signal in SIGNALS}


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestOutcome:
    """One request as the breakers see it.

    ``request`` is the statement text or a summary of the structured operation; ``code`` is
    ``ok``, ``genuinely_empty``, ``replayed``, ``suspiciously_empty`` or a
    :data:`~corral.gateway._errors.CODES` code (see :data:`OUTCOME_SIGNALS`); ``at`` is when
    it finished (filled in from the breakers' clock when None); ``message`` the error message,
    if any. Raises ``InvalidArgumentError`` for an unknown code or a wrong type.
    """

    request: str
    code: str
    at: datetime | None = None
    message: str | None = None

    def __post_init__(self) -> None:
        where = "RequestOutcome"
        v.instance_of(where, "request", self.request, str)
        v.instance_of(where, "code", self.code, str)
        if self.code not in OUTCOME_SIGNALS:
            raise InvalidArgumentError(
                where, "code", "ok, suspiciously_empty or a gateway error code", self.code
            )
        v.aware_datetime(where, "at", self.at, optional=True)
        if self.message is not None:
            v.instance_of(where, "message", self.message, str)

    @classmethod
    def from_error(
        cls, request: str, error: GatewayError, *, at: datetime | None = None
    ) -> RequestOutcome:
        """The outcome of a request that ended in ``error``."""
        v.instance_of("RequestOutcome.from_error", "error", error, GatewayError)
        return cls(request=request, code=error.code, at=at, message=error.message)

    @property
    def signal(self) -> Signal | None:
        """The signal this outcome counts toward, or None."""
        return OUTCOME_SIGNALS[self.code]

    def to_dict(self) -> dict[str, Any]:
        return {
            "request": self.request,
            "code": self.code,
            "at": None if self.at is None else self.at.isoformat(),
            "message": self.message,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RequestOutcome:
        at = data.get("at")
        return cls(
            request=data["request"],
            code=data["code"],
            at=None if at is None else datetime.fromisoformat(at),
            message=data.get("message"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Freeze:
    """An agent frozen: by a breaker (``signal`` set) or by a person (``signal`` None).

    For a breaker freeze, ``count`` events of ``signal`` within ``window_s`` seconds reached
    ``threshold``; ``evidence`` holds every counted request of the window that tripped it
    (all signals, oldest first). A manual freeze carries the counted requests of the window at
    that moment as evidence, and ``by`` when given.
    """

    kind: ClassVar[str] = "freeze"

    id: str
    agent_id: str
    at: datetime
    reason: str
    by: str | None = None
    signal: Signal | None = None
    count: int | None = None
    threshold: int | None = None
    window_s: float | None = None
    evidence: tuple[RequestOutcome, ...] = field(default=())

    @property
    def automatic(self) -> bool:
        return self.signal is not None

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "id": self.id,
            "agent_id": self.agent_id,
            "at": self.at.isoformat(),
            "reason": self.reason,
            "by": self.by,
            "signal": self.signal,
            "count": self.count,
            "threshold": self.threshold,
            "window_s": self.window_s,
            "evidence": [item.to_dict() for item in self.evidence],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Freeze:
        return cls(
            id=data["id"],
            agent_id=data["agent_id"],
            at=datetime.fromisoformat(data["at"]),
            reason=data["reason"],
            by=data.get("by"),
            signal=data.get("signal"),
            count=data.get("count"),
            threshold=data.get("threshold"),
            window_s=data.get("window_s"),
            evidence=tuple(RequestOutcome.from_dict(item) for item in data.get("evidence", ())),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Reinstatement:
    """A person lifted the freeze ``freeze_id`` of ``agent_id``, giving ``reason``."""

    kind: ClassVar[str] = "reinstatement"

    id: str
    agent_id: str
    at: datetime
    by: str
    reason: str
    freeze_id: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "id": self.id,
            "agent_id": self.agent_id,
            "at": self.at.isoformat(),
            "by": self.by,
            "reason": self.reason,
            "freeze_id": self.freeze_id,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Reinstatement:
        return cls(
            id=data["id"],
            agent_id=data["agent_id"],
            at=datetime.fromisoformat(data["at"]),
            by=data["by"],
            reason=data["reason"],
            freeze_id=data["freeze_id"],
        )


def record_from_dict(data: Mapping[str, Any]) -> Freeze | Reinstatement:
    """The record ``to_dict`` produced (``kind`` tells which)."""
    if data.get("kind") == Reinstatement.kind:
        return Reinstatement.from_dict(data)
    if data.get("kind") == Freeze.kind:
        return Freeze.from_dict(data)
    raise ValueError(f"not a breaker record: kind {data.get('kind')!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class BreakerStatus:
    """One agent now: frozen or not (and by which freeze), counts per signal within the
    window, the thresholds (None: disabled) and the window length in seconds."""

    agent_id: str
    frozen: bool
    freeze: Freeze | None
    counts: Mapping[str, int]
    thresholds: Mapping[str, int | None]
    window_s: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "agent_id": self.agent_id,
            "frozen": self.frozen,
            "freeze": None if self.freeze is None else self.freeze.to_dict(),
            "counts": dict(self.counts),
            "thresholds": dict(self.thresholds),
            "window_s": self.window_s,
        }
