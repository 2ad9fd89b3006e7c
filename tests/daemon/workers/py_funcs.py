"""Functions for the python harness tests, named as ``tests.daemon.workers.py_funcs:NAME``.

They run in worker processes: what a test must see of them comes back in their output, or
in files under the turn's working directory.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import sys
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

from corral.daemon import TurnContext, TurnFailedError

NOT_CALLABLE = 5


def report(prompt: str, context: TurnContext) -> str:
    return json.dumps(
        {
            "pid": os.getpid(),
            "agentId": context.agent_id,
            "turn": context.turn,
            "workdir": str(context.workdir),
            "env": dict(context.env),
            "isContext": isinstance(context, TurnContext),
            "prompt": prompt,
        }
    )


async def areport(prompt: str, context: TurnContext) -> str:
    await asyncio.sleep(0)
    return f"async {context.agent_id}#{context.turn}: {prompt} in {os.getpid()}"


def hard_exit(prompt: str, context: TurnContext) -> str:
    os._exit(3)


def segfault(prompt: str, context: TurnContext) -> str:
    ctypes.string_at(0)  # reads address 0: SIGSEGV
    return "unreachable"


def hog(prompt: str, context: TurnContext) -> str:
    chunks = []
    while True:
        chunks.append(bytearray(64 * 1024 * 1024))


def sleeps(prompt: str, context: TurnContext) -> str:
    """Writes its pid to ``<workdir>/pid``, then sleeps far past any test's timeout."""
    Path(context.workdir, "pid").write_text(str(os.getpid()))
    time.sleep(60)
    return "late"


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


async def _later(prompt: str) -> str:
    await asyncio.sleep(0)
    return f"awaited {prompt}"


def returns_awaitable(prompt: str, context: TurnContext) -> Awaitable[str]:
    return _later(prompt)


class _AsyncCallable:
    async def __call__(self, prompt: str, context: TurnContext) -> str:
        return f"callable {prompt}"


acallable = _AsyncCallable()


_turns_seen = 0
"""Module state: how many turns :func:`moods` has run in this worker process."""


def moods(prompt: str, context: TurnContext) -> str:
    """Does what the prompt says: ``pid`` (``<pid> <turns this process has run>``), ``exit``
    (``os._exit(3)``), ``sleep`` (as :func:`sleeps`), ``hog`` (as :func:`hog`)."""
    global _turns_seen
    _turns_seen += 1
    if prompt == "exit":
        os._exit(3)
    if prompt == "sleep":
        return sleeps(prompt, context)
    if prompt == "hog":
        return hog(prompt, context)
    return f"{os.getpid()} {_turns_seen}"


def naps(prompt: str, context: TurnContext) -> str:
    """Sleeps as many seconds as the prompt says, then says so."""
    time.sleep(float(prompt))
    return f"napped {prompt}"


def beating(prompt: str, context: TurnContext) -> str:
    """Works for a while, telling the daemon it is alive (``context.heartbeat()``) as it goes."""
    for _ in range(int(prompt)):
        time.sleep(0.1)
        context.heartbeat()
    return str(context.heartbeat_file)
