"""Waiting for a condition in tests: poll with a bound, never sleep a guessed time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def settle(condition: Callable[[], bool], *, within_s: float = 5.0) -> None:
    """Let the loop (and worker threads) run until ``condition`` holds.

    Raises AssertionError after ``within_s`` seconds of real time: threads and other
    processes do not answer on a loop turn, so the bound is in time, not in turns.
    """
    deadline = time.monotonic() + within_s
    turns = 0
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {within_s} s")
        turns += 1
        await asyncio.sleep(0 if turns < 100 else 0.001)


async def idle(turns: int = 20) -> None:
    """Give every ready task ``turns`` loop turns."""
    for _ in range(turns):
        await asyncio.sleep(0)
