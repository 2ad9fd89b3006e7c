"""``FailureIsolator``: one circuit breaker per agent id, with a degradation strategy."""

from __future__ import annotations

import logging
import threading
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from enum import StrEnum
from inspect import isawaitable
from types import CoroutineType
from typing import Any, TypeVar, overload

from corral.kernel import SYSTEM_CLOCK, Clock, InvalidArgumentError, RefusalError
from corral.kernel import _validate as v

logger = logging.getLogger("corral.resilience.isolator")

T = TypeVar("T")


class CircuitState(StrEnum):
    """Where an agent's circuit stands."""

    CLOSED = "closed"  # calls run; failures are counted
    OPEN = "open"  # calls do not run; they get the degraded value
    HALF_OPEN = "half_open"  # the recovery timeout has passed; one probe call may run


class Degradation(StrEnum):
    """What a call gets instead of running while the circuit is not closed."""

    FALLBACK = "fallback"  # the fallback's value, or None without a fallback
    SKIP = "skip"  # None
    CACHED = "cached"  # the agent's last successful result, or None
    FAIL_FAST = "fail_fast"  # CircuitOpenError is raised


class CircuitOpenError(RefusalError):
    """The agent's circuit is open (or half-open with its probe running): the call did not run.

    Retryable: ``retry_after_s`` says how many seconds remain until the circuit may be probed
    (0 when it may be probed now or a probe is already running); ``probe_at`` is that instant
    as an aware datetime. ``failure_count`` is the agent's count of consecutive failures and
    ``failure_threshold`` the count that opens the circuit.
    """

    code = "circuit_open"
    default_retryable = True

    def __init__(
        self,
        agent_id: str,
        state: CircuitState,
        failure_count: int,
        retry_after_s: float,
        probe_at: datetime,
        *,
        failure_threshold: int,
    ) -> None:
        counted = f"after {failure_count} consecutive failures (threshold {failure_threshold})"
        if state is CircuitState.HALF_OPEN:
            message = (
                f"circuit for agent {agent_id!r} is half-open {counted} and its one probe call "
                "is running; try again once the probe ends"
            )
        else:
            message = (
                f"circuit for agent {agent_id!r} is open {counted}; it may be probed again in "
                f"{retry_after_s:.3f} s, at {probe_at.isoformat()}"
            )
        super().__init__(
            message,
            agent_id=agent_id,
            state=state.value,
            failure_count=failure_count,
            failure_threshold=failure_threshold,
            retry_after_s=retry_after_s,
            probe_at=probe_at.isoformat(),
        )
        self.agent_id = agent_id
        self.state = state
        self.failure_count = failure_count
        self.failure_threshold = failure_threshold
        self.retry_after_s = retry_after_s
        self.probe_at = probe_at


_CLOSED = CircuitState.CLOSED
_OPEN = CircuitState.OPEN
_HALF_OPEN = CircuitState.HALF_OPEN
_COROUTINE = CoroutineType


class _Circuit:
    # ``epoch`` changes on every state change, so an outcome can tell whether the circuit is
    # still the one that admitted its call. Outcomes of calls admitted under an earlier state
    # (a slow call that was let in before the circuit opened, or before a reset) are stale:
    # they never move the circuit, so only the probe decides a half-open circuit.
    __slots__ = ("epoch", "failures", "last", "opened_at", "probing", "state")

    def __init__(self) -> None:
        self.state = _CLOSED
        self.failures = 0
        self.epoch = 0
        self.opened_at = 0.0
        self.probing = False
        self.last: Any = None


class FailureIsolator:
    """A circuit breaker per agent id, so one failing agent cannot drag the others down.

    :meth:`execute` runs ``action`` for an agent under that agent's circuit:

    - a success resets the agent's failure count and closes the circuit;
    - a failure below ``failure_threshold`` consecutive failures is re-raised;
    - the failure that reaches the threshold opens the circuit and returns the degraded value
      instead of raising;
    - while the circuit is OPEN the action does not run; the call gets the degraded value;
    - ``recovery_timeout_s`` seconds after opening the circuit is HALF_OPEN and exactly one
      call (the probe) runs the action, however many arrive at once; the others get the
      degraded value. The probe's success closes the circuit, its failure opens it again for
      another ``recovery_timeout_s``.

    A failure is any ``Exception`` from the action. ``asyncio.CancelledError`` (and other
    ``BaseException``) is not an outcome: it passes through and leaves the count alone (a
    cancelled probe frees the probe slot). An outcome of a call let in under an earlier state
    of the circuit (before it opened, or before :meth:`reset`) does not move the circuit: a
    late failure gets the degraded value while the circuit is not closed and is re-raised
    otherwise; a late success is returned.

    The degraded value depends on ``degradation``: FALLBACK returns ``fallback()`` (or None
    without one; an exception from the fallback propagates), SKIP returns None, CACHED the
    agent's last successful result (or None), FAIL_FAST raises :class:`CircuitOpenError`
    (chained to the failure that opened the circuit, when there is one).

    Actions and fallbacks may be plain functions or coroutine functions. No lock is held while
    an action or fallback runs, so calls for the same agent run concurrently. Safe to share
    between threads and event loops. Time is read on ``clock``.
    """

    __slots__ = (
        "_caching",
        "_circuits",
        "_clock",
        "_degradation",
        "_lock",
        "_threshold",
        "_timeout",
    )

    def __init__(
        self,
        failure_threshold: int = 3,
        recovery_timeout_s: float = 30.0,
        degradation: Degradation = Degradation.FALLBACK,
        *,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        where = "FailureIsolator"
        v.positive_int(where, "failure_threshold", failure_threshold)
        v.positive_number(where, "recovery_timeout_s", recovery_timeout_s)
        v.instance_of(where, "degradation", degradation, Degradation)
        v.instance_of(where, "clock", clock, Clock)
        self._threshold = failure_threshold
        self._timeout = float(recovery_timeout_s)
        self._degradation = degradation
        self._caching = degradation is Degradation.CACHED
        self._clock = clock
        self._circuits: dict[str, _Circuit] = {}
        self._lock = threading.Lock()

    @property
    def failure_threshold(self) -> int:
        return self._threshold

    @property
    def recovery_timeout_s(self) -> float:
        return self._timeout

    @property
    def degradation(self) -> Degradation:
        return self._degradation

    @overload
    async def execute(
        self,
        agent_id: str,
        action: Callable[[], Awaitable[T]],
        fallback: Callable[[], Awaitable[T] | T] | None = None,
    ) -> T | None: ...

    @overload
    async def execute(
        self,
        agent_id: str,
        action: Callable[[], T],
        fallback: Callable[[], Awaitable[T] | T] | None = None,
    ) -> T | None: ...

    async def execute(
        self,
        agent_id: str,
        action: Callable[[], Any],
        fallback: Callable[[], Any] | None = None,
    ) -> Any:
        """Run ``action()`` (awaiting it when it returns an awaitable) under the agent's circuit.

        Returns the action's result, or the degraded value (see the class). Re-raises a
        failure below the threshold; raises :class:`CircuitOpenError` with FAIL_FAST while the
        circuit is not closed; raises :class:`InvalidArgumentError` for an empty or non-string
        ``agent_id``, a non-callable ``action`` or a ``fallback`` that is neither callable nor
        None.
        """
        # The closed, successful path is the hot one: one dict look-up, one state test,
        # and no lock unless a failure count has to be reset.
        try:
            circuit = self._circuits[agent_id]
        except (KeyError, TypeError):
            circuit = self._circuit_for(agent_id)
        if not callable(action):
            raise InvalidArgumentError("FailureIsolator.execute", "action", "callable", action)
        if fallback is not None and not callable(fallback):
            raise InvalidArgumentError(
                "FailureIsolator.execute", "fallback", "callable or None", fallback
            )
        # The epoch is read before the state: a state change bumps the epoch after setting
        # the state, so an epoch read first is never newer than the CLOSED state seen next,
        # and a circuit that opens in between makes this call's outcome stale.
        epoch = circuit.epoch
        if circuit.state is not _CLOSED:
            return await self._execute_not_closed(circuit, agent_id, action, fallback)
        try:
            result = action()
            if type(result) is _COROUTINE or isawaitable(result):
                result = await result
        except Exception as exc:
            if self._failed_while_closed(circuit, agent_id, epoch):
                return await self._degraded(circuit, agent_id, fallback, exc)
            raise
        if circuit.failures:
            with self._lock:
                if circuit.epoch == epoch and circuit.state is _CLOSED:
                    circuit.failures = 0
        if self._caching:
            circuit.last = result
        return result

    def state(self, agent_id: str) -> CircuitState:
        """The agent's circuit state; CLOSED for an agent never seen.

        An OPEN circuit whose recovery timeout has passed reports (and becomes) HALF_OPEN.
        """
        v.non_empty_str("FailureIsolator.state", "agent_id", agent_id)
        circuit = self._circuits.get(agent_id)
        if circuit is None:
            return _CLOSED
        with self._lock:
            self._maybe_half_open(circuit)
            return circuit.state

    def failure_count(self, agent_id: str) -> int:
        """The agent's count of consecutive failures; 0 for an agent never seen."""
        v.non_empty_str("FailureIsolator.failure_count", "agent_id", agent_id)
        circuit = self._circuits.get(agent_id)
        return 0 if circuit is None else circuit.failures

    def reset(self, agent_id: str) -> None:
        """Close the agent's circuit and zero its count. Idempotent; unknown agents are a no-op.

        The CACHED value is kept. Calls still running from before the reset do not move the
        reset circuit when they end.
        """
        v.non_empty_str("FailureIsolator.reset", "agent_id", agent_id)
        circuit = self._circuits.get(agent_id)
        if circuit is None:
            return
        with self._lock:
            circuit.state = _CLOSED
            circuit.failures = 0
            circuit.probing = False
            circuit.epoch += 1

    # --- internals ------------------------------------------------------------------------

    def _circuit_for(self, agent_id: Any) -> _Circuit:
        v.non_empty_str("FailureIsolator.execute", "agent_id", agent_id)
        with self._lock:
            return self._circuits.setdefault(agent_id, _Circuit())

    def _maybe_half_open(self, circuit: _Circuit) -> None:
        # Called with the lock held.
        if circuit.state is _OPEN and self._clock.monotonic() - circuit.opened_at >= self._timeout:
            circuit.state = _HALF_OPEN
            circuit.probing = False
            circuit.epoch += 1

    def _failed_while_closed(self, circuit: _Circuit, agent_id: str, epoch: int) -> bool:
        """Count a failure of a call admitted while closed; True when it gets degraded."""
        with self._lock:
            if circuit.epoch != epoch or circuit.state is not _CLOSED:
                return circuit.state is not _CLOSED
            circuit.failures += 1
            failures = circuit.failures
            if failures < self._threshold:
                return False
            circuit.state = _OPEN
            circuit.opened_at = self._clock.monotonic()
            circuit.epoch += 1
        logger.warning(
            "circuit for agent %r opened after %d consecutive failures (threshold %d)",
            agent_id,
            failures,
            self._threshold,
        )
        return True

    async def _execute_not_closed(
        self,
        circuit: _Circuit,
        agent_id: str,
        action: Callable[[], Any],
        fallback: Callable[[], Any] | None,
    ) -> Any:
        with self._lock:
            self._maybe_half_open(circuit)
            state = circuit.state
            probe = state is _HALF_OPEN and not circuit.probing
            if probe:
                circuit.probing = True
            epoch = circuit.epoch
        if state is _CLOSED:  # closed by another caller since the first look
            return await self.execute(agent_id, action, fallback)
        if not probe:
            return await self._degraded(circuit, agent_id, fallback, None)
        try:
            result = action()
            if isawaitable(result):
                result = await result
        except Exception as exc:
            with self._lock:
                current = circuit.epoch == epoch
                if current:
                    circuit.state = _OPEN
                    circuit.opened_at = self._clock.monotonic()
                    circuit.failures += 1
                    circuit.probing = False
                    circuit.epoch += 1
                degrade = current or circuit.state is not _CLOSED
            if current:
                logger.warning("probe for agent %r failed; circuit opened again", agent_id)
            if degrade:
                return await self._degraded(circuit, agent_id, fallback, exc)
            raise
        except BaseException:
            # Cancellation is no verdict on the agent: free the slot for the next caller.
            with self._lock:
                if circuit.epoch == epoch:
                    circuit.probing = False
            raise
        with self._lock:
            current = circuit.epoch == epoch
            if current:
                circuit.state = _CLOSED
                circuit.failures = 0
                circuit.probing = False
                circuit.epoch += 1
        if current:
            logger.info("probe for agent %r succeeded; circuit closed", agent_id)
        if self._caching:
            circuit.last = result
        return result

    async def _degraded(
        self,
        circuit: _Circuit,
        agent_id: str,
        fallback: Callable[[], Any] | None,
        cause: BaseException | None,
    ) -> Any:
        strategy = self._degradation
        if strategy is Degradation.FALLBACK:
            if fallback is None:
                return None
            value = fallback()
            if isawaitable(value):
                value = await value
            return value
        if strategy is Degradation.CACHED:
            return circuit.last
        if strategy is Degradation.SKIP:
            return None
        raise self._open_error(circuit, agent_id) from cause

    def _open_error(self, circuit: _Circuit, agent_id: str) -> CircuitOpenError:
        with self._lock:
            state, failures, opened_at = circuit.state, circuit.failures, circuit.opened_at
        if state is _OPEN:
            retry_after_s = max(0.0, opened_at + self._timeout - self._clock.monotonic())
        else:
            retry_after_s = 0.0
        probe_at = self._clock.now() + timedelta(seconds=retry_after_s)
        return CircuitOpenError(
            agent_id, state, failures, retry_after_s, probe_at, failure_threshold=self._threshold
        )

    def __repr__(self) -> str:
        return (
            f"FailureIsolator(failure_threshold={self._threshold}, "
            f"recovery_timeout_s={self._timeout:g}, degradation={self._degradation.value}, "
            f"agents={len(self._circuits)})"
        )
