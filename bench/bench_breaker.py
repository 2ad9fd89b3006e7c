"""``FailureIsolator.execute`` against pybreaker, aiobreaker and purgatory, closed and succeeding.

Every breaker wraps the same coroutine function, each in its own idiomatic asyncio way:

- corral: ``await isolator.execute(agent_id, work)``;
- pybreaker (its async support needs Tornado): ``with breaker.calling(): await work()``;
- aiobreaker: the ``@breaker`` decorator on ``work``;
- purgatory: the ``@factory("circuit")`` decorator on ``work``.

Each figure is the time per call minus the time of ``await work()`` directly: what the breaker
adds. The goal: corral's overhead at most half of the fastest peer's.

Run it with ``.venv/bin/python -m bench bench_breaker``.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from datetime import timedelta

import aiobreaker  # type: ignore[import-untyped]
import purgatory
import pybreaker

from bench._harness import fmt_ns, row, time_async
from corral.resilience import FailureIsolator

NUMBER = 20_000
REPEATS = 7


async def work() -> int:
    return 1


def _contenders() -> dict[str, Callable[[], Awaitable[object]]]:
    isolator = FailureIsolator(failure_threshold=5, recovery_timeout_s=60.0)

    py_breaker = pybreaker.CircuitBreaker(fail_max=5, reset_timeout=60)

    async def pybreaker_work() -> int:
        with py_breaker.calling():
            return await work()

    aio_breaker = aiobreaker.CircuitBreaker(fail_max=5, timeout_duration=timedelta(seconds=60))
    purgatory_factory = purgatory.AsyncCircuitBreakerFactory(default_threshold=5, default_ttl=60)

    return {
        "corral FailureIsolator": functools.partial(isolator.execute, "agent-1", work),
        "pybreaker": pybreaker_work,
        "aiobreaker": aio_breaker(work),
        "purgatory": purgatory_factory("agent-1")(work),
    }


def _check(contenders: dict[str, Callable[[], Awaitable[object]]]) -> None:
    # A breaker that silently skipped the work would look fast: each must return its result.
    async def results() -> dict[str, object]:
        return {name: await fn() for name, fn in contenders.items()}

    wrong = {name: got for name, got in asyncio.run(results()).items() if got != 1}
    if wrong:
        raise RuntimeError(f"breakers did not return the work's result: {wrong}")


def measure() -> tuple[float, dict[str, float]]:
    """Seconds per direct call, and the overhead per call of each breaker over it."""
    contenders = _contenders()
    _check(contenders)
    direct = time_async(work, number=NUMBER, repeats=REPEATS)
    overheads = {
        name: time_async(fn, number=NUMBER, repeats=REPEATS) - direct
        for name, fn in contenders.items()
    }
    return direct, overheads


def main() -> None:
    direct, overheads = measure()
    ours = overheads["corral FailureIsolator"]
    print(f"Closed circuit, successful call; direct `await work()`: {fmt_ns(direct)} per call.\n")
    print(row("breaker", "overhead per call", "x corral's overhead"))
    print(row("---", "---:", "---:"))
    for name, overhead in overheads.items():
        print(row(name, fmt_ns(overhead), f"{overhead / ours:.1f}x"))
    fastest_peer = min(v for k, v in overheads.items() if k != "corral FailureIsolator")
    verdict = "met" if ours <= fastest_peer / 2 else "NOT met"
    print(
        f"\nGoal (corral at most half the fastest peer's overhead): {verdict}; corral "
        f"{fmt_ns(ours)}, fastest peer {fmt_ns(fastest_peer)} ({fastest_peer / ours:.1f}x)."
    )


if __name__ == "__main__":
    main()
