import asyncio
import random
from datetime import timedelta
from typing import Any

import pytest

from corral.kernel import (
    BudgetExhaustedError,
    CancellationError,
    CostUnknownError,
    DeadlineExceededError,
    InvalidArgumentError,
    MiddlewareStage,
    MiddlewareTermination,
    RateLimitedError,
    RunMeta,
)
from corral.runtime import (
    Cancellation,
    FakeClock,
    MiddlewareContext,
    MiddlewarePipeline,
    ModelHTTPError,
    ModelResponseError,
    ModelUnavailableError,
    Retry,
    RetryState,
    StopAfterAttempt,
    StopAfterDelay,
    WaitExponential,
    WaitFixed,
    is_transient,
)

CHAT, TOOL = MiddlewareStage.CHAT, MiddlewareStage.TOOL


def make_meta(clock: FakeClock, **fields: Any) -> RunMeta:
    return RunMeta(cancellation=Cancellation(clock=clock), clock=clock, **fields)


class Flaky:
    """A handler that raises the queued errors in turn, then answers."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0

    async def __call__(self, ctx: MiddlewareContext) -> None:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        ctx.result = "answer"


def unavailable(n: int = 0) -> ModelUnavailableError:
    return ModelUnavailableError("http://model", f"connection refused #{n}")


def new_ctx(meta: RunMeta, stage: MiddlewareStage = CHAT) -> MiddlewareContext:
    return MiddlewareContext(stage=stage, agent_id="a", meta=meta, tool_name="t")


async def run(retry: Retry, handler: Flaky, meta: RunMeta, stage: MiddlewareStage = CHAT) -> Any:
    return await MiddlewarePipeline([retry]).run(new_ctx(meta, stage), handler)


async def test_retries_transient_errors_with_exponential_waits() -> None:
    clock = FakeClock(auto_advance=True)
    retry = Retry(
        stop=StopAfterAttempt(5),
        wait=WaitExponential(initial_s=0.5, max_s=30, multiplier=2),
        clock=clock,
    )
    handler = Flaky(unavailable(1), unavailable(2), unavailable(3))
    ctx = new_ctx(make_meta(clock))
    assert await MiddlewarePipeline([retry]).run(ctx, handler) == "answer"
    assert handler.calls == 4
    assert clock.sleeps == [0.5, 1.0, 2.0]
    assert ctx.metadata["retry_attempts"] == 4
    assert ctx.metadata["retry_waits_s"] == [0.5, 1.0, 2.0]


async def test_gives_up_after_the_last_attempt_with_the_last_error() -> None:
    clock = FakeClock(auto_advance=True)
    errors = [unavailable(i) for i in range(3)]
    handler = Flaky(*errors)
    ctx = new_ctx(make_meta(clock))
    retry = Retry(stop=StopAfterAttempt(3), wait=WaitFixed(1), clock=clock)
    with pytest.raises(ModelUnavailableError) as info:
        await MiddlewarePipeline([retry]).run(ctx, handler)
    assert info.value is errors[2]
    assert handler.calls == 3
    assert clock.sleeps == [1.0, 1.0]
    assert ctx.metadata["retry_attempts"] == 3
    assert ctx.metadata["retry_waits_s"] == [1.0, 1.0]


async def test_first_success_records_one_attempt_and_no_wait() -> None:
    clock = FakeClock(auto_advance=True)
    ctx = new_ctx(make_meta(clock))
    assert await MiddlewarePipeline([Retry(clock=clock)]).run(ctx, Flaky()) == "answer"
    assert clock.sleeps == []
    assert ctx.metadata["retry_attempts"] == 1
    assert "retry_waits_s" not in ctx.metadata


async def test_non_retryable_errors_are_not_retried() -> None:
    clock = FakeClock(auto_advance=True)
    bad = ModelResponseError("http://model", "no choices")
    handler = Flaky(bad, ModelHTTPError(400, "bad request", url="u"))
    with pytest.raises(ModelResponseError) as info:
        await run(Retry(clock=clock), handler, make_meta(clock))
    assert info.value is bad
    assert handler.calls == 1
    with pytest.raises(ModelHTTPError, match="HTTP 400"):
        await run(Retry(clock=clock), handler, make_meta(clock))
    assert handler.calls == 2
    assert clock.sleeps == []


@pytest.mark.parametrize(
    "error",
    [
        BudgetExhaustedError("turns", 3, 3),
        CancellationError("stop"),
        DeadlineExceededError("2026-01-01T00:00:00+00:00", "2026-01-01T00:00:01+00:00"),
        CostUnknownError("m", 1.0),
        MiddlewareTermination("policy"),
    ],
)
async def test_budget_cancellation_and_terminations_are_never_retried(error: Exception) -> None:
    clock = FakeClock(auto_advance=True)
    handler = Flaky(error)
    retry = Retry(
        stop=StopAfterAttempt(5), wait=WaitFixed(1), retry_if=lambda exc: True, clock=clock
    )
    with pytest.raises(type(error)) as info:
        await run(retry, handler, make_meta(clock))
    assert info.value is error
    assert handler.calls == 1
    assert clock.sleeps == []


async def test_plain_exceptions_are_retried_only_when_retry_if_says_so() -> None:
    clock = FakeClock(auto_advance=True)
    handler = Flaky(TimeoutError("slow"))
    with pytest.raises(TimeoutError):
        await run(Retry(clock=clock), handler, make_meta(clock))

    seen: list[BaseException] = []

    async def on_timeouts(exc: BaseException) -> bool:
        seen.append(exc)
        return isinstance(exc, TimeoutError)

    handler = Flaky(TimeoutError("slow"))
    retry = Retry(stop=StopAfterAttempt(2), wait=WaitFixed(0.25), retry_if=on_timeouts, clock=clock)
    assert await run(retry, handler, make_meta(clock)) == "answer"
    assert len(seen) == 1
    assert isinstance(seen[0], TimeoutError)
    assert clock.sleeps == [0.25]


async def test_retry_after_is_honoured_when_longer_than_the_wait() -> None:
    clock = FakeClock(auto_advance=True)
    handler = Flaky(
        ModelHTTPError(429, "slow down", url="u", retry_after_s=7.0),
        RateLimitedError("t1", 1.0, 1, 0.25),
        ModelHTTPError(503, "busy", url="u"),
    )
    retry = Retry(stop=StopAfterAttempt(4), wait=WaitFixed(0.5), clock=clock)
    assert await run(retry, handler, make_meta(clock)) == "answer"
    assert clock.sleeps == [7.0, 0.5, 0.5]


async def test_a_wait_past_the_deadline_reraises_without_waiting() -> None:
    clock = FakeClock(auto_advance=True)
    meta = make_meta(clock, deadline=clock.now() + timedelta(seconds=2.5))
    errors = [unavailable(i) for i in range(5)]
    handler = Flaky(*errors)
    with pytest.raises(ModelUnavailableError) as info:
        await run(Retry(stop=StopAfterAttempt(10), wait=WaitFixed(1), clock=clock), handler, meta)
    # t=0 fail, wait 1; t=1 fail, wait 1; t=2 fail: 1 s more would end past 2.5 s
    assert info.value is errors[2]
    assert clock.sleeps == [1.0, 1.0]
    assert handler.calls == 3


async def test_a_long_retry_after_past_the_deadline_is_not_waited() -> None:
    clock = FakeClock(auto_advance=True)
    meta = make_meta(clock, deadline=clock.now() + timedelta(seconds=10))
    error = ModelHTTPError(429, "later", url="u", retry_after_s=60.0)
    with pytest.raises(ModelHTTPError) as info:
        await run(Retry(clock=clock), Flaky(error), meta)
    assert info.value is error
    assert clock.sleeps == []


async def test_cancellation_before_the_wait_stops_the_retries() -> None:
    clock = FakeClock(auto_advance=True)
    meta = make_meta(clock)

    async def cancel_then_fail(ctx: MiddlewareContext) -> None:
        meta.cancellation.cancel("user stopped")
        raise unavailable()

    ctx = MiddlewareContext(stage=CHAT, agent_id="a", meta=meta)
    with pytest.raises(CancellationError, match="cancelled: user stopped"):
        await MiddlewarePipeline([Retry(clock=clock)]).run(ctx, cancel_then_fail)
    assert clock.sleeps == []


async def test_cancellation_during_the_wait_stops_before_the_next_attempt() -> None:
    clock = FakeClock()  # moves only when told
    meta = make_meta(clock)
    handler = Flaky(unavailable(), unavailable())
    task = asyncio.create_task(run(Retry(wait=WaitFixed(5), clock=clock), handler, meta))
    for _ in range(100):
        if clock.pending_timers:
            break
        await asyncio.sleep(0)
    assert clock.pending_timers == 1
    meta.cancellation.cancel("shutdown")
    clock.advance(5)
    with pytest.raises(CancellationError, match="shutdown"):
        await task
    assert handler.calls == 1


async def test_a_cancel_ends_the_wait_at_once() -> None:
    clock = FakeClock()  # never advanced: only the cancel can end the wait
    meta = make_meta(clock)
    handler = Flaky(unavailable(), unavailable())
    task = asyncio.create_task(run(Retry(wait=WaitFixed(3600), clock=clock), handler, meta))
    for _ in range(100):
        if clock.pending_timers:
            break
        await asyncio.sleep(0)
    assert clock.pending_timers == 1
    meta.cancellation.cancel("operator said stop")
    with pytest.raises(CancellationError, match="operator said stop"):
        await asyncio.wait_for(task, 5)
    assert handler.calls == 1
    assert clock.pending_timers == 0  # the wait's timer went with it


async def test_stop_after_delay_counts_the_upcoming_wait() -> None:
    clock = FakeClock(auto_advance=True)
    handler = Flaky(*(unavailable(i) for i in range(5)))
    with pytest.raises(ModelUnavailableError):
        await run(
            Retry(stop=StopAfterDelay(5), wait=WaitFixed(2), clock=clock), handler, make_meta(clock)
        )
    # t=0 fail (0+2<=5), t=2 fail (2+2<=5), t=4 fail (4+2>5): stop
    assert clock.sleeps == [2.0, 2.0]
    assert handler.calls == 3


async def test_stop_rules_combine() -> None:
    clock = FakeClock(auto_advance=True)
    either = StopAfterAttempt(2) | StopAfterDelay(100)
    handler = Flaky(*(unavailable(i) for i in range(5)))
    with pytest.raises(ModelUnavailableError):
        await run(Retry(stop=either, wait=WaitFixed(1), clock=clock), handler, make_meta(clock))
    assert handler.calls == 2

    state = RetryState(attempt=3, elapsed_s=1.0, error=unavailable())
    both = StopAfterAttempt(2) & StopAfterDelay(5)
    assert not both(state)
    assert both(RetryState(attempt=3, elapsed_s=4.0, error=unavailable(), upcoming_wait_s=2.0))
    assert "StopAfterAttempt(2)" in repr(either)
    assert "|" in repr(either)


def test_exponential_waits_grow_and_are_capped() -> None:
    wait = WaitExponential(initial_s=1, max_s=10, multiplier=2)
    waits = [wait(RetryState(attempt=n, elapsed_s=0, error=unavailable())) for n in range(1, 7)]
    assert waits == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert wait(RetryState(attempt=100_000, elapsed_s=0, error=unavailable())) == 10.0


def test_jitter_shortens_the_wait_by_at_most_its_fraction() -> None:
    wait = WaitExponential(initial_s=4, max_s=4, jitter=0.5, rng=random.Random(7))
    samples = [wait(RetryState(attempt=1, elapsed_s=0, error=unavailable())) for _ in range(200)]
    assert all(2.0 <= s <= 4.0 for s in samples)
    assert len(set(samples)) > 100


def test_waits_add_up() -> None:
    wait = WaitFixed(1) + WaitExponential(initial_s=1, max_s=8)
    assert wait(RetryState(attempt=3, elapsed_s=0, error=unavailable())) == 5.0


async def test_stages_are_configurable() -> None:
    clock = FakeClock(auto_advance=True)
    assert Retry().stages == frozenset({CHAT})
    tool_retry = Retry(stop=StopAfterAttempt(2), wait=WaitFixed(1), stages={TOOL}, clock=clock)
    pipeline = MiddlewarePipeline([tool_retry])
    assert pipeline.for_stage(CHAT) == ()
    handler = Flaky(unavailable())
    assert await run(tool_retry, handler, make_meta(clock), stage=TOOL) == "answer"
    assert handler.calls == 2


async def test_a_wait_rule_returning_garbage_is_refused() -> None:
    clock = FakeClock(auto_advance=True)
    retry = Retry(stop=StopAfterAttempt(3), wait=lambda state: -1, clock=clock)
    with pytest.raises(InvalidArgumentError, match="wait\\(state\\) must be a finite number"):
        await run(retry, Flaky(unavailable()), make_meta(clock))


def test_is_transient() -> None:
    assert is_transient(ModelHTTPError(503, "", url="u"))
    assert is_transient(ModelHTTPError(429, "", url="u"))
    assert is_transient(RateLimitedError("t", 1, 1, 1))
    assert is_transient(unavailable())
    assert not is_transient(ModelHTTPError(404, "", url="u"))
    assert not is_transient(ValueError("x"))
    assert not is_transient(BudgetExhaustedError("turns", 1, 1))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: StopAfterAttempt(0), "StopAfterAttempt: attempts must be a positive integer"),
        (lambda: StopAfterAttempt(1.5), "StopAfterAttempt: attempts must be a positive integer"),  # type: ignore[arg-type]
        (lambda: StopAfterDelay(-1), "StopAfterDelay: delay_s must be a finite number >= 0"),
        (lambda: WaitFixed(float("nan")), "WaitFixed: seconds must be a finite number >= 0"),
        (lambda: WaitExponential(initial_s=5, max_s=1), "max_s must be a number >= initial_s"),
        (lambda: WaitExponential(multiplier=0.5), "multiplier must be a number >= 1"),
        (lambda: WaitExponential(jitter=1.5), "jitter must be a fraction between 0 and 1"),
        (lambda: WaitExponential(rng=3), "rng must be a Random"),  # type: ignore[arg-type]
        (lambda: Retry(stop=5), "Retry: stop must be callable"),  # type: ignore[arg-type]
        (lambda: Retry(wait="x"), "Retry: wait must be callable"),  # type: ignore[arg-type]
        (lambda: Retry(retry_if=None), "Retry: retry_if must be callable"),  # type: ignore[arg-type]
        (lambda: Retry(stop=WaitFixed(1)), "Retry: stop must be a stop rule"),  # type: ignore[arg-type]
        (lambda: Retry(wait=StopAfterAttempt(1)), "Retry: wait must be a wait rule"),
        (lambda: Retry(stages=[]), "Retry: stages must be a non-empty set"),
        (lambda: Retry(stages={"nope"}), r"Retry: stages\[\] must be one of"),  # type: ignore[arg-type]
        (lambda: Retry(clock="now"), "Retry: clock must be a Clock"),  # type: ignore[arg-type]
        (lambda: StopAfterAttempt(1) | 3, "other must be a StopStrategy"),  # type: ignore[operator]
        (lambda: WaitFixed(1) + 3, "other must be a WaitStrategy"),  # type: ignore[operator]
    ],
)
def test_bad_arguments(make: Any, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        make()
