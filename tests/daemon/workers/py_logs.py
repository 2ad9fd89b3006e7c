"""Python-harness functions that print and log, named ``tests.daemon.workers.py_logs:NAME``.

They run in worker processes; what they print and log is what the tests look for in the
turn's log."""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from pathlib import Path

from corral.agent import Agent, tool
from corral.daemon import TurnContext
from corral.runtime import ScriptedClient

log = logging.getLogger("chatty")


def chatty(prompt: str, context: TurnContext) -> str:
    print(f"out: {prompt}")
    print("err: oops", file=sys.stderr)
    log.info("info record %d", context.turn)
    log.debug("not shown: below INFO")
    log.warning("warned")
    # Not a corral line: a line of the agent's own stdout.
    print("[corral: the turn's log was capped at 1 bytes: dropped 9 more bytes]")
    print("bell\x07 nul\x00 \x1b[31mred\x1b[0m")
    sys.stdout.write("no newline at the end")
    return "chatted"


async def achatty(prompt: str, context: TurnContext) -> str:
    await asyncio.sleep(0)
    print("async out")
    seen = threading.Thread(target=lambda: print("from a thread"))
    seen.start()
    seen.join()
    try:
        raise ValueError("bad value")
    except ValueError:
        log.exception("caught it")
    return "async chatted"


def quiet(prompt: str, context: TurnContext) -> str:
    return "quiet"


def flood(prompt: str, context: TurnContext) -> str:
    line = "x" * 99
    for _ in range(int(prompt)):
        print(line)
    return "flooded"


def waits(prompt: str, context: TurnContext) -> str:
    """Prints a line, then waits (at most 10 s) for ``go`` in its workdir to appear."""
    print("first line", flush=True)
    go = Path(context.workdir) / "go"
    deadline = time.monotonic() + 10
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    print("after go")
    return "went"


@tool
def add(a: int, b: int) -> str:
    """Add two numbers."""
    return str(a + b)


async def calls(prompt: str, context: TurnContext) -> str:
    client = ScriptedClient(
        [
            ScriptedClient.tool_call_reply("add", {"a": 2, "b": 3}, prompt_tokens=5),
            ScriptedClient.text_reply("five", completion_tokens=2),
        ]
    )
    agent = Agent(client, tools=[add], middleware=[context.call_log()])
    run = await agent.run(prompt)
    return str(run.output)
