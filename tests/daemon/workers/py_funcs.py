"""Functions for the python harness tests, named as ``tests.daemon.workers.py_funcs:NAME``."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Awaitable
from typing import Any

from corral.daemon import TurnContext, TurnFailedError

NOT_CALLABLE = 5

# Set by the tests; read by the functions below.
release = threading.Event()
seen: dict[str, Any] = {}


def report(prompt: str, context: TurnContext) -> str:
    seen["thread"] = threading.current_thread()
    seen["context"] = context
    return f"{context.agent_id}#{context.turn}: {prompt}"


async def areport(prompt: str, context: TurnContext) -> str:
    seen["thread"] = threading.current_thread()
    await asyncio.sleep(0)
    return f"async {context.agent_id}#{context.turn}: {prompt}"


def with_usage(prompt: str, context: TurnContext) -> dict[str, Any]:
    return {"output": prompt.upper(), "tokens": 42, "costUsd": 0.25}


def unknown_cost(prompt: str, context: TurnContext) -> dict[str, Any]:
    return {"output": "x", "costUsd": None}


def output_only(prompt: str, context: TurnContext) -> dict[str, Any]:
    return {"output": "only"}


def returns_int(prompt: str, context: TurnContext) -> int:
    return 42


def bad_dict(prompt: str, context: TurnContext) -> dict[str, Any]:
    return {"output": 7, "tokens": -1, "cost_usd": 1.0}


def raises(prompt: str, context: TurnContext) -> str:
    raise ValueError(f"boom: {prompt}")


async def araises(prompt: str, context: TurnContext) -> str:
    raise KeyError("missing thing")


def fails_with_usage(prompt: str, context: TurnContext) -> str:
    raise TurnFailedError("quota hit", usage={"tokens": 9, "costUsd": 0.5})


def raises_timeout(prompt: str, context: TurnContext) -> str:
    raise TimeoutError("upstream took too long")


def exits(prompt: str, context: TurnContext) -> str:
    sys.exit(3)


def interrupts(prompt: str, context: TurnContext) -> str:
    raise KeyboardInterrupt


def blocks(prompt: str, context: TurnContext) -> str:
    """Waits (at most 10 s) until the test sets ``release``."""
    seen["blocks_started"] = True
    release.wait(10)
    seen["blocks_finished"] = True
    return "late"


async def ablocks(prompt: str, context: TurnContext) -> str:
    seen["ablocks_started"] = True
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        seen["ablocks_cancelled"] = True
        raise
    return "never"


async def _later(prompt: str) -> str:
    await asyncio.sleep(0)
    return f"awaited {prompt}"


def returns_awaitable(prompt: str, context: TurnContext) -> Awaitable[str]:
    return _later(prompt)


class _AsyncCallable:
    async def __call__(self, prompt: str, context: TurnContext) -> str:
        seen["thread"] = threading.current_thread()
        return f"callable {prompt}"


acallable = _AsyncCallable()
