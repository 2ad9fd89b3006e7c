"""Agents for the process-isolation tests: module-level, so a child process can unpickle them.

Where a test needs to find the child, the task text is a directory to write pid files into.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from corral.resilience import SandboxTask


def describe(task: str) -> dict[str, Any]:
    """What the child saw: its pid and the task's marks."""
    assert isinstance(task, SandboxTask)
    return {
        "pid": os.getpid(),
        "text": str(task),
        "original": task.original,
        "read_only": task.read_only,
        "allowed_actions": sorted(task.allowed_actions),
    }


async def shout(task: str) -> str:
    await asyncio.sleep(0)
    return task.upper()


class ChatAgent:
    """An agent in the seed's shape: a ``chat(task)`` method."""

    def __init__(self, name: str) -> None:
        self.name = name

    def chat(self, task: str) -> str:
        return f"{self.name}: {task}"


def fail(task: str) -> str:
    raise ValueError(f"cannot do {task!r}")


def allocate(task: str) -> int:
    """Allocate the number of bytes in the task text and return how many were held."""
    block = bytearray(int(task))
    return len(block)


def _write_pid(directory: str, name: str, pid: int) -> None:
    path = Path(directory) / name
    path.with_suffix(".tmp").write_text(str(pid))
    path.with_suffix(".tmp").replace(path)  # appears whole or not at all


def sleep_forever(task: str) -> None:
    _write_pid(task, "child.pid", os.getpid())
    time.sleep(60)


def spawn_and_sleep(task: str) -> None:
    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    _write_pid(task, "grandchild.pid", grandchild.pid)
    _write_pid(task, "child.pid", os.getpid())
    time.sleep(60)


def unpicklable_result(task: str) -> Any:
    return lambda: task


def unknown_here(task: str) -> Any:
    """Returns an instance of a class that exists only in the child."""
    kind = type("OnlyInTheChild", (), {"__module__": __name__})
    globals()["OnlyInTheChild"] = kind  # picklable here, not importable in the parent
    return kind()


def loaded(task: str) -> list[str]:
    """Which of the modules named in ``task`` (comma-separated) the child has imported."""
    import sys

    return [name for name in task.split(",") if name in sys.modules]


_runs = 0
"""Module state of a worker: how many times :func:`count` ran in this process."""


def count(task: str) -> tuple[int, int]:
    """``(pid, runs of this function in this process so far)``."""
    global _runs
    _runs += 1
    return os.getpid(), _runs


async def loop_id(task: str) -> int:
    """The id of the event loop the coroutine runs on."""
    return id(asyncio.get_running_loop())


def exit_now(task: str) -> None:
    os._exit(int(task))
