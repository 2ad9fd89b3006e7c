from datetime import timedelta

import pytest

from corral.kernel import CancellationError, DeadlineExceededError, MiddlewareStage, RunMeta
from corral.runtime import (
    Cancellation,
    CancellationCheck,
    FakeClock,
    MiddlewareContext,
    MiddlewarePipeline,
)


class Counter:
    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, ctx: MiddlewareContext) -> None:
        self.calls += 1
        ctx.result = "ran"


@pytest.mark.parametrize("stage", list(MiddlewareStage))
async def test_a_live_run_goes_inward_at_every_stage(stage: MiddlewareStage) -> None:
    clock = FakeClock()
    meta = RunMeta(cancellation=Cancellation(clock=clock), clock=clock)
    handler = Counter()
    pipeline = MiddlewarePipeline([CancellationCheck()])
    ctx = MiddlewareContext(stage=stage, agent_id="a", meta=meta)
    assert await pipeline.run(ctx, handler) == "ran"
    assert handler.calls == 1


@pytest.mark.parametrize("stage", list(MiddlewareStage))
async def test_a_cancelled_run_stops_before_the_call(stage: MiddlewareStage) -> None:
    clock = FakeClock()
    meta = RunMeta(cancellation=Cancellation(clock=clock), clock=clock)
    meta.cancellation.cancel("operator said stop")
    handler = Counter()
    ctx = MiddlewareContext(stage=stage, agent_id="a", meta=meta)
    with pytest.raises(CancellationError, match="cancelled: operator said stop"):
        await MiddlewarePipeline([CancellationCheck()]).run(ctx, handler)
    assert handler.calls == 0


async def test_a_run_past_its_deadline_stops_before_the_call() -> None:
    clock = FakeClock()
    meta = RunMeta(
        cancellation=Cancellation(clock=clock),
        clock=clock,
        deadline=clock.now() + timedelta(seconds=30),
    )
    handler = Counter()
    pipeline = MiddlewarePipeline([CancellationCheck()])
    ctx = MiddlewareContext(stage=MiddlewareStage.CHAT, agent_id="a", meta=meta)
    await pipeline.run(ctx, handler)
    clock.advance(30)
    with pytest.raises(DeadlineExceededError) as info:
        await pipeline.run(ctx, handler)
    assert info.value.code == "deadline_exceeded"
    assert info.value.deadline == meta.deadline.isoformat()  # type: ignore[union-attr]
    assert handler.calls == 1
    assert repr(CancellationCheck()) == "CancellationCheck()"
