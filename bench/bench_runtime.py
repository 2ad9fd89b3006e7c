"""Per-call costs of the runtime: the middleware pipeline, ``RunMeta.check`` and
``ExecutionTracker.record``.

Goal (issue: foundation): the pipeline with 5 no-op middlewares costs at most 3x a direct
await of the handler. Run with ``.venv/bin/python -m bench bench_runtime``.

Three handlers are measured, because the ratio depends on what the pipeline wraps:
- ``no-op``: a coroutine that returns at once (the cheapest possible await: the ratio is
  pure pipeline overhead over nothing);
- ``one yield``: a coroutine that yields to the event loop once, the least any real model or
  tool call does;
- and, for reference, 5 hand-nested no-op coroutines without any pipeline: the floor that
  any design built on ``async def process(ctx, call_next)`` pays.
"""

from __future__ import annotations

import asyncio
from typing import Any

from bench._harness import fmt_ns, row, time_async, time_sync
from corral.kernel import ExecutionBudget, MiddlewareStage, RunMeta
from corral.runtime import (
    Cancellation,
    ExecutionTracker,
    MiddlewareContext,
    MiddlewarePipeline,
)

NUMBER = 50_000
REPEATS = 9


class NoOp:
    async def process(self, ctx: MiddlewareContext, call_next: Any) -> None:
        await call_next()


async def noop_handler(ctx: MiddlewareContext) -> None:
    ctx.result = 1


async def yield_handler(ctx: MiddlewareContext) -> None:
    await asyncio.sleep(0)
    ctx.result = 1


async def _nested(depth: int, ctx: MiddlewareContext) -> None:
    if depth:
        await _nested(depth - 1, ctx)
    else:
        await noop_handler(ctx)


def main() -> None:
    meta = RunMeta(cancellation=Cancellation())
    ctx = MiddlewareContext(stage=MiddlewareStage.CHAT, agent_id="bench", meta=meta)
    pipeline = MiddlewarePipeline([NoOp() for _ in range(5)])

    direct = time_async(lambda: noop_handler(ctx), number=NUMBER, repeats=REPEATS)
    piped = time_async(lambda: pipeline.run(ctx, noop_handler), number=NUMBER, repeats=REPEATS)
    floor = time_async(lambda: _nested(5, ctx), number=NUMBER, repeats=REPEATS)
    direct_y = time_async(lambda: yield_handler(ctx), number=NUMBER // 5, repeats=REPEATS)
    piped_y = time_async(
        lambda: pipeline.run(ctx, yield_handler), number=NUMBER // 5, repeats=REPEATS
    )

    print(row("handler", "direct await", "5 no-op middlewares", "ratio", "overhead"))
    print(row("---", "---:", "---:", "---:", "---:"))
    print(
        row(
            "no-op",
            fmt_ns(direct),
            fmt_ns(piped),
            f"{piped / direct:.2f}x",
            fmt_ns(piped - direct),
        )
    )
    print(
        row(
            "one yield",
            fmt_ns(direct_y),
            fmt_ns(piped_y),
            f"{piped_y / direct_y:.2f}x",
            fmt_ns(piped_y - direct_y),
        )
    )
    print(
        row(
            "no-op, 5 hand-nested coroutines (floor)",
            fmt_ns(direct),
            fmt_ns(floor),
            f"{floor / direct:.2f}x",
            fmt_ns(floor - direct),
        )
    )

    plain = RunMeta(cancellation=Cancellation())
    with_deadline = RunMeta(cancellation=Cancellation()).with_deadline_after(3600)
    tracker = ExecutionTracker(ExecutionBudget(max_tokens=10**15, max_turns=10**15))
    unlimited = ExecutionTracker()
    print()
    print(row("call", "per call"))
    print(row("---", "---:"))
    print(row("RunMeta.check() (no deadline)", fmt_ns(time_sync(plain.check, number=NUMBER))))
    print(
        row(
            "RunMeta.check() (with deadline)",
            fmt_ns(time_sync(with_deadline.check, number=NUMBER)),
        )
    )
    print(
        row(
            "ExecutionTracker.record(tokens=, turns=) (limited)",
            fmt_ns(time_sync(lambda: tracker.record(tokens=10, turns=1), number=NUMBER)),
        )
    )
    print(
        row(
            "ExecutionTracker.record(tokens=, turns=) (unlimited)",
            fmt_ns(time_sync(lambda: unlimited.record(tokens=10, turns=1), number=NUMBER)),
        )
    )
    print(row("ExecutionTracker.check()", fmt_ns(time_sync(tracker.check, number=NUMBER))))


if __name__ == "__main__":
    main()
