"""Runs one command-harness turn (``cmd_worker.py family``, or the mode and arguments given)
in this process, which the test kills with SIGKILL mid-turn, as a daemon dying:
``turn_then_die.py STATE_DIR WORKDIR [MODE ARGS...]``; the prompt is ``work``."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from corral.daemon import CommandHarness, TurnRequest, parse_spec

WORKER = str(Path(__file__).with_name("cmd_worker.py"))


async def main(state_dir: str, workdir: str, *mode: str) -> None:
    command = [sys.executable, WORKER, *(mode or ["family"])]
    spec = parse_spec({"name": "doomed", "harness": "command", "command": command})
    request = TurnRequest(
        agent_id="a_doomed00",
        turn=1,
        prompt="work",
        spec=spec,
        workdir=Path(workdir),
        state_dir=Path(state_dir),
        timeout_s=60,
    )
    await CommandHarness().run_turn(request)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
