"""``RunMeta``: the badge every call of a run carries (ids, stop button, deadline, tenant)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from corral.kernel import _validate as v
from corral.kernel._clock import SYSTEM_CLOCK, Clock
from corral.kernel._errors import DeadlineExceededError, InvalidArgumentError
from corral.kernel._protocols import CancellationToken
from corral.kernel._supervision import Supervision


def _trace_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True, slots=True, kw_only=True)
class RunMeta:
    """Immutable context threaded through one run.

    ``run_id`` is taken from ``supervision`` when that is given (giving both, different, is an
    error); with neither, a fresh id is minted. ``deadline`` is an absolute, timezone-aware
    instant read against ``clock``. Call :meth:`check` at every cooperative yield point.
    """

    cancellation: CancellationToken
    run_id: str | None = None
    supervision: Supervision | None = None
    deadline: datetime | None = None
    trace_id: str = field(default_factory=_trace_id)
    tenant_id: str | None = None
    clock: Clock = SYSTEM_CLOCK

    def __post_init__(self) -> None:
        where = "RunMeta"
        if not isinstance(self.cancellation, CancellationToken):
            raise InvalidArgumentError(
                where, "cancellation", "a CancellationToken", self.cancellation
            )
        if self.supervision is not None:
            v.instance_of(where, "supervision", self.supervision, Supervision)
            if self.run_id is not None and self.run_id != self.supervision.run_id:
                raise InvalidArgumentError(
                    where,
                    "run_id",
                    f"None or the supervision's {self.supervision.run_id!r}",
                    self.run_id,
                )
            object.__setattr__(self, "run_id", self.supervision.run_id)
        elif self.run_id is None:
            object.__setattr__(self, "run_id", uuid.uuid4().hex)
        v.non_empty_str(where, "run_id", self.run_id)
        v.aware_datetime(where, "deadline", self.deadline, optional=True)
        v.non_empty_str(where, "trace_id", self.trace_id)
        v.non_empty_str(where, "tenant_id", self.tenant_id, optional=True)
        v.instance_of(where, "clock", self.clock, Clock)

    @property
    def id(self) -> str:
        """The run id (never None after construction)."""
        assert self.run_id is not None
        return self.run_id

    def check(self) -> None:
        """Raise ``CancellationError`` if cancelled, ``DeadlineExceededError`` if past due."""
        self.cancellation.check()
        if self.deadline is not None:
            now = self.clock.now()
            if now >= self.deadline:
                raise DeadlineExceededError(self.deadline.isoformat(), now.isoformat())

    def remaining_s(self) -> float | None:
        """Seconds left before the deadline (may be negative), or None without a deadline."""
        if self.deadline is None:
            return None
        return (self.deadline - self.clock.now()).total_seconds()

    def with_deadline_after(self, seconds: float) -> RunMeta:
        """A copy whose deadline is ``seconds`` from now, or the current one if that is sooner."""
        v.non_negative_number("RunMeta.with_deadline_after", "seconds", seconds)
        candidate = self.clock.now() + timedelta(seconds=seconds)
        if self.deadline is not None and self.deadline <= candidate:
            return self
        return RunMeta(
            cancellation=self.cancellation,
            run_id=self.run_id,
            supervision=self.supervision,
            deadline=candidate,
            trace_id=self.trace_id,
            tenant_id=self.tenant_id,
            clock=self.clock,
        )
