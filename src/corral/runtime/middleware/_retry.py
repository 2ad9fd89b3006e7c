"""``Retry``: re-run the inner chain on transient errors, with composable stop and wait rules."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from corral.kernel import (
    SYSTEM_CLOCK,
    BudgetExhaustedError,
    CancellationError,
    Clock,
    CorralError,
    CostUnknownError,
    InvalidArgumentError,
    MiddlewareStage,
    MiddlewareTermination,
)
from corral.kernel import _validate as v
from corral.runtime._cancellation import race
from corral.runtime.middleware._pipeline import CallNext, MiddlewareContext, maybe_await, stage_set

ATTEMPTS_KEY = "retry_attempts"
WAITS_KEY = "retry_waits_s"

# Never retried, whatever retry_if says: the run is over or a policy said no on purpose.
_FINAL = (BudgetExhaustedError, CancellationError, CostUnknownError, MiddlewareTermination)


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryState:
    """What a stop or wait rule sees after a failed attempt.

    ``attempt`` counts the attempts made so far (1 after the first failure); ``elapsed_s`` is
    the time since the first attempt started; ``upcoming_wait_s`` is the wait before the next
    attempt (0.0 while the wait rule itself is asked).
    """

    attempt: int
    elapsed_s: float
    error: BaseException
    upcoming_wait_s: float = 0.0


def is_transient(exc: BaseException) -> bool:
    """True for a ``CorralError`` whose ``retryable`` is True (rate limits, 5xx, timeouts)."""
    return isinstance(exc, CorralError) and exc.retryable is True


# --- stop rules ---------------------------------------------------------------------------


class StopStrategy:
    """A rule that says when to give up. Combine with ``|`` (any) and ``&`` (all)."""

    __slots__ = ()

    def __call__(self, state: RetryState) -> bool:
        raise NotImplementedError

    def __or__(self, other: StopStrategy) -> StopStrategy:
        v.instance_of("StopStrategy.__or__", "other", other, StopStrategy)
        return _StopAny((self, other))

    def __and__(self, other: StopStrategy) -> StopStrategy:
        v.instance_of("StopStrategy.__and__", "other", other, StopStrategy)
        return _StopAll((self, other))


class StopAfterAttempt(StopStrategy):
    """Stop once ``attempts`` attempts have been made (``StopAfterAttempt(1)``: no retry)."""

    __slots__ = ("attempts",)

    def __init__(self, attempts: int) -> None:
        v.positive_int("StopAfterAttempt", "attempts", attempts)
        self.attempts = attempts

    def __call__(self, state: RetryState) -> bool:
        return state.attempt >= self.attempts

    def __repr__(self) -> str:
        return f"StopAfterAttempt({self.attempts})"


class StopAfterDelay(StopStrategy):
    """Stop when the time since the first attempt, plus the next wait, would pass ``delay_s``."""

    __slots__ = ("delay_s",)

    def __init__(self, delay_s: float) -> None:
        v.non_negative_number("StopAfterDelay", "delay_s", delay_s)
        self.delay_s = delay_s

    def __call__(self, state: RetryState) -> bool:
        return state.elapsed_s + state.upcoming_wait_s > self.delay_s

    def __repr__(self) -> str:
        return f"StopAfterDelay({self.delay_s})"


class _StopAny(StopStrategy):
    __slots__ = ("rules",)

    def __init__(self, rules: tuple[StopStrategy, ...]) -> None:
        self.rules = rules

    def __call__(self, state: RetryState) -> bool:
        return any(rule(state) for rule in self.rules)

    def __repr__(self) -> str:
        return " | ".join(map(repr, self.rules))


class _StopAll(StopStrategy):
    __slots__ = ("rules",)

    def __init__(self, rules: tuple[StopStrategy, ...]) -> None:
        self.rules = rules

    def __call__(self, state: RetryState) -> bool:
        return all(rule(state) for rule in self.rules)

    def __repr__(self) -> str:
        return " & ".join(map(repr, self.rules))


# --- wait rules ---------------------------------------------------------------------------


class WaitStrategy:
    """A rule that gives the seconds to wait before the next attempt. Add two with ``+``."""

    __slots__ = ()

    def __call__(self, state: RetryState) -> float:
        raise NotImplementedError

    def __add__(self, other: WaitStrategy) -> WaitStrategy:
        v.instance_of("WaitStrategy.__add__", "other", other, WaitStrategy)
        return _WaitSum((self, other))


class WaitFixed(WaitStrategy):
    """Wait ``seconds`` before every retry."""

    __slots__ = ("seconds",)

    def __init__(self, seconds: float) -> None:
        v.non_negative_number("WaitFixed", "seconds", seconds)
        self.seconds = seconds

    def __call__(self, state: RetryState) -> float:
        return float(self.seconds)

    def __repr__(self) -> str:
        return f"WaitFixed({self.seconds})"


class WaitExponential(WaitStrategy):
    """Wait ``initial_s * multiplier ** (attempt - 1)``, at most ``max_s``.

    With ``jitter`` (a fraction in [0, 1]) each wait is shortened by a random share of up to
    that fraction, so clients that failed together do not retry together. ``rng`` is the
    random source (a ``random.Random``; a private one by default).
    """

    __slots__ = ("initial_s", "jitter", "max_s", "multiplier", "rng")

    def __init__(
        self,
        initial_s: float = 0.5,
        max_s: float = 30.0,
        multiplier: float = 2.0,
        jitter: float = 0.0,
        *,
        rng: random.Random | None = None,
    ) -> None:
        where = "WaitExponential"
        v.non_negative_number(where, "initial_s", initial_s)
        v.non_negative_number(where, "max_s", max_s)
        if max_s < initial_s:
            raise InvalidArgumentError(
                where, "max_s", f"a number >= initial_s ({initial_s})", max_s
            )
        v.non_negative_number(where, "multiplier", multiplier)
        if multiplier < 1:
            raise InvalidArgumentError(where, "multiplier", "a number >= 1", multiplier)
        v.non_negative_number(where, "jitter", jitter)
        if jitter > 1:
            raise InvalidArgumentError(where, "jitter", "a fraction between 0 and 1", jitter)
        if rng is not None:
            v.instance_of(where, "rng", rng, random.Random)
        self.initial_s = initial_s
        self.max_s = max_s
        self.multiplier = multiplier
        self.jitter = jitter
        self.rng = rng or random.Random()

    def __call__(self, state: RetryState) -> float:
        try:
            base = self.initial_s * self.multiplier ** max(0, state.attempt - 1)
        except OverflowError:
            base = math.inf
        wait = float(min(base, self.max_s))
        if self.jitter:
            wait *= 1.0 - self.jitter * self.rng.random()
        return wait

    def __repr__(self) -> str:
        return (
            f"WaitExponential(initial_s={self.initial_s}, max_s={self.max_s}, "
            f"multiplier={self.multiplier}, jitter={self.jitter})"
        )


class _WaitSum(WaitStrategy):
    __slots__ = ("rules",)

    def __init__(self, rules: tuple[WaitStrategy, ...]) -> None:
        self.rules = rules

    def __call__(self, state: RetryState) -> float:
        return sum(rule(state) for rule in self.rules)

    def __repr__(self) -> str:
        return " + ".join(map(repr, self.rules))


# --- the middleware -----------------------------------------------------------------------


class Retry:
    """Re-runs the inner chain when it fails with a transient error.

    After a failed attempt: an error that ``retry_if`` (plain or async; default
    :func:`is_transient`) rejects propagates at once, and so, whatever ``retry_if`` says,
    does a budget, cost-unknown, cancellation or middleware-termination error. Otherwise the
    wait is ``wait(state)``, raised to the error's ``retry_after_s`` when it carries one
    (``ModelHTTPError``, ``RateLimitedError``). The last error is re-raised, without waiting,
    when ``stop(state)`` says so or when the wait would end at or past ``ctx.meta.deadline``.
    ``ctx.meta.check()`` runs before the wait and again before the next attempt, and a cancel
    ends the wait at once, so a cancelled or overdue run stops with ``CancellationError``
    without sitting out its backoff.

    ``ctx.metadata["retry_attempts"]`` holds the attempts made and
    ``ctx.metadata["retry_waits_s"]`` the waits. Defaults: three attempts, exponential waits
    from 0.5 s with 20 % jitter, CHAT only (``stages`` picks others).
    """

    __slots__ = ("clock", "retry_if", "stages", "stop", "wait")

    def __init__(
        self,
        *,
        stop: StopStrategy | Callable[[RetryState], bool] | None = None,
        wait: WaitStrategy | Callable[[RetryState], float] | None = None,
        retry_if: Callable[[BaseException], Any] = is_transient,
        stages: Iterable[MiddlewareStage] = frozenset({MiddlewareStage.CHAT}),
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        where = "Retry"
        self.stop = StopAfterAttempt(3) if stop is None else stop
        self.wait = WaitExponential(jitter=0.2) if wait is None else wait
        v.callable_(where, "stop", self.stop)
        v.callable_(where, "wait", self.wait)
        # both are callables of a RetryState: a swapped pair would pass a plain callable check
        if isinstance(self.stop, WaitStrategy):
            raise InvalidArgumentError(where, "stop", "a stop rule, not a wait rule", self.stop)
        if isinstance(self.wait, StopStrategy):
            raise InvalidArgumentError(where, "wait", "a wait rule, not a stop rule", self.wait)
        v.callable_(where, "retry_if", retry_if)
        self.retry_if = retry_if
        self.stages = stage_set(where, "stages", stages)
        v.instance_of(where, "clock", clock, Clock)
        self.clock = clock

    async def process(self, ctx: MiddlewareContext, call_next: CallNext) -> None:
        clock = self.clock
        started = clock.monotonic()
        waits: list[float] = []
        attempt = 0
        while True:
            attempt += 1
            ctx.metadata[ATTEMPTS_KEY] = attempt
            try:
                await call_next()
                return
            except _FINAL:
                raise
            except Exception as exc:
                if not await maybe_await(self.retry_if(exc)):
                    raise
                state = RetryState(
                    attempt=attempt, elapsed_s=clock.monotonic() - started, error=exc
                )
                delay = _seconds(self.wait(state))
                retry_after = getattr(exc, "retry_after_s", None)
                if isinstance(retry_after, int | float) and math.isfinite(retry_after):
                    delay = max(delay, float(retry_after))
                state = RetryState(
                    attempt=attempt,
                    elapsed_s=state.elapsed_s,
                    error=exc,
                    upcoming_wait_s=delay,
                )
                if self.stop(state):
                    raise
                remaining = ctx.meta.remaining_s()
                if remaining is not None and delay >= remaining:
                    raise
                ctx.meta.check()
            waits.append(delay)
            ctx.metadata[WAITS_KEY] = list(waits)
            # A cancel ends the wait at once (race raises), not after it.
            await race(clock.sleep(delay), ctx.meta.cancellation)
            ctx.meta.check()

    def __repr__(self) -> str:
        return f"Retry(stop={self.stop!r}, wait={self.wait!r}, stages={sorted(self.stages)})"


def _seconds(value: Any) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
    ):
        raise InvalidArgumentError("Retry", "wait(state)", "a finite number of seconds >= 0", value)
    return float(value)
