"""Timing helpers shared by the benchmarks.

Each figure is the median over ``repeats`` runs of the mean time per call within a run of
``number`` calls, so one slow run (a GC pause, another process) does not move it.
"""

from __future__ import annotations

import asyncio
import gc
import os
import statistics
import time
from collections.abc import Awaitable, Callable


def time_sync(fn: Callable[[], object], *, number: int, repeats: int = 7) -> float:
    """Median seconds per call of ``fn()``."""
    runs: list[float] = []
    for _ in range(repeats):
        gc.collect()
        start = time.perf_counter()
        for _ in range(number):
            fn()
        runs.append((time.perf_counter() - start) / number)
    return statistics.median(runs)


def time_async(fn: Callable[[], Awaitable[object]], *, number: int, repeats: int = 7) -> float:
    """Median seconds per call of ``await fn()``, measured inside one event loop."""

    async def one_run() -> float:
        start = time.perf_counter()
        for _ in range(number):
            await fn()
        return (time.perf_counter() - start) / number

    async def all_runs() -> list[float]:
        await one_run()  # warm-up
        runs = []
        for _ in range(repeats):
            gc.collect()
            runs.append(await one_run())
        return runs

    return statistics.median(asyncio.run(all_runs()))


def fmt_ns(seconds: float) -> str:
    return f"{seconds * 1e9:,.0f} ns"


def row(*cells: object) -> str:
    """One Markdown table row."""
    return "| " + " | ".join(str(c) for c in cells) + " |"


def machine_busy_s() -> float:
    """CPU seconds the whole machine has spent busy (every core, every process: the daemon,
    its workers, the database) since boot, from ``/proc/stat``; 0.0 where there is none."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(x) for x in stat.readline().split()[1:]]
    except OSError:
        return 0.0
    idle = fields[3] + fields[4]  # idle and iowait
    return (sum(fields) - idle) / os.sysconf("SC_CLK_TCK")
