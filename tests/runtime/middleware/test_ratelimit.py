from typing import Any

import pytest

from corral.kernel import InvalidArgumentError, MiddlewareStage, RateLimitedError, RunMeta
from corral.runtime import (
    Cancellation,
    FakeClock,
    MiddlewareContext,
    MiddlewarePipeline,
    Retry,
    StopAfterAttempt,
    TenantRateLimit,
    WaitFixed,
)

CHAT, TOOL = MiddlewareStage.CHAT, MiddlewareStage.TOOL


def make_meta(clock: FakeClock, tenant: str | None = None) -> RunMeta:
    return RunMeta(cancellation=Cancellation(clock=clock), clock=clock, tenant_id=tenant)


class Counter:
    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, ctx: MiddlewareContext) -> None:
        self.calls += 1
        ctx.result = "ok"


async def call(
    pipeline: MiddlewarePipeline, clock: FakeClock, tenant: str | None = None, stage: Any = CHAT
) -> Any:
    ctx = MiddlewareContext(stage=stage, agent_id="a", meta=make_meta(clock, tenant), tool_name="t")
    return await pipeline.run(ctx, Counter())


async def test_burst_then_refused_then_refilled_on_the_clock() -> None:
    clock = FakeClock()
    limiter = TenantRateLimit(2, 3, clock=clock)
    pipeline = MiddlewarePipeline([limiter])
    for _ in range(3):
        assert await call(pipeline, clock, "acme") == "ok"
    with pytest.raises(RateLimitedError) as info:
        await call(pipeline, clock, "acme")
    err = info.value
    assert (err.tenant, err.retry_after_s, err.code, err.retryable) == (
        "acme",
        0.5,
        "rate_limited",
        True,
    )
    assert (
        err.message
        == "tenant 'acme' is over its rate limit of 2 calls/s (burst 3); retry after 0.500 s"
    )
    clock.advance(0.25)
    with pytest.raises(RateLimitedError) as info:
        await call(pipeline, clock, "acme")
    assert info.value.retry_after_s == pytest.approx(0.25)
    clock.advance(0.25)
    assert await call(pipeline, clock, "acme") == "ok"
    assert clock.sleeps == []  # never waits


async def test_refill_is_capped_at_the_burst() -> None:
    clock = FakeClock()
    limiter = TenantRateLimit(1, 2, clock=clock)
    pipeline = MiddlewarePipeline([limiter])
    clock.advance(1000)
    assert limiter.available("t") == 2
    await call(pipeline, clock, "t")
    await call(pipeline, clock, "t")
    with pytest.raises(RateLimitedError):
        await call(pipeline, clock, "t")
    clock.advance(3600)
    assert limiter.available("t") == 2


async def test_tenants_have_their_own_buckets_and_none_is_default() -> None:
    clock = FakeClock()
    limiter = TenantRateLimit(1, 1, clock=clock)
    pipeline = MiddlewarePipeline([limiter])
    await call(pipeline, clock, "acme")
    with pytest.raises(RateLimitedError, match="tenant 'acme'"):
        await call(pipeline, clock, "acme")
    assert await call(pipeline, clock, "globex") == "ok"
    assert await call(pipeline, clock, None) == "ok"
    with pytest.raises(RateLimitedError, match="tenant 'default'"):
        await call(pipeline, clock, None)
    assert limiter.available("default") == 0
    assert limiter.available("never-seen") == 1


async def test_only_the_configured_stages_are_limited() -> None:
    clock = FakeClock()
    chat_only = MiddlewarePipeline([TenantRateLimit(1, 1, clock=clock)])
    for _ in range(5):
        assert await call(chat_only, clock, "t", stage=TOOL) == "ok"
    tools = MiddlewarePipeline([TenantRateLimit(1, 1, stages={TOOL}, clock=clock)])
    await call(tools, clock, "t", stage=TOOL)
    with pytest.raises(RateLimitedError):
        await call(tools, clock, "t", stage=TOOL)
    assert await call(tools, clock, "t", stage=CHAT) == "ok"


async def test_a_retry_outside_waits_the_retry_after() -> None:
    clock = FakeClock(auto_advance=True)
    limiter = TenantRateLimit(0.5, 1, clock=clock)
    retry = Retry(stop=StopAfterAttempt(3), wait=WaitFixed(0), clock=clock)
    pipeline = MiddlewarePipeline([retry, limiter])
    await call(pipeline, clock, "t")
    assert await call(pipeline, clock, "t") == "ok"
    assert clock.sleeps == [2.0]


async def test_idle_tenants_do_not_grow_memory_without_bound() -> None:
    clock = FakeClock()
    limiter = TenantRateLimit(100, 1, clock=clock)
    for i in range(5000):
        limiter.acquire(f"tenant-{i}")
    clock.advance(1)  # every bucket is full again
    limiter.acquire("late")
    assert len(limiter._buckets) < 100
    assert limiter.available("tenant-0") == 1


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((0, 1), {}, "rate_per_s must be a finite number > 0"),
        ((float("inf"), 1), {}, "rate_per_s must be a finite number > 0"),
        ((1, 0), {}, "burst must be a positive integer"),
        ((1, 1.5), {}, "burst must be a positive integer"),
        ((1, 1), {"stages": set()}, "stages must be a non-empty set"),
        ((1, 1), {"stages": "chat"}, "stages must be a non-empty set"),
        ((1, 1), {"clock": "now"}, "clock must be a Clock"),
    ],
)
def test_bad_arguments(args: tuple[Any, ...], kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=f"TenantRateLimit: {message}"):
        TenantRateLimit(*args, **kwargs)


@pytest.mark.parametrize("tenant", ["", 5])
def test_a_bad_tenant_is_refused_and_takes_no_token(tenant: Any) -> None:
    limiter = TenantRateLimit(1, 1)
    with pytest.raises(InvalidArgumentError, match=r"TenantRateLimit\.acquire: tenant must be"):
        limiter.acquire(tenant)
    with pytest.raises(InvalidArgumentError, match=r"TenantRateLimit\.available: tenant must be"):
        limiter.available(tenant)
    assert limiter._buckets == {}
