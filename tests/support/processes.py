"""Looking at the processes a test's agent started."""

from __future__ import annotations

import json
from pathlib import Path


def gone(pid: int) -> bool:
    """No such process, or only its zombie is left (nobody may reap it in a container)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return True
    return stat[stat.rfind(b")") + 2 :].split()[0] == b"Z"


def read_pids(workdir: Path) -> dict[str, int]:
    """The ``pids.json`` a test worker wrote in ``workdir``."""
    data: dict[str, int] = json.loads((workdir / "pids.json").read_text())
    return data


def start_time(pid: int) -> int:
    """Field 22 of ``/proc/<pid>/stat``: what a pid file records to tell a process apart."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return int(stat[stat.rfind(b")") + 2 :].split()[19])


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole: a process polling for ``path`` to appear never
    reads it empty or half written."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    partial.replace(path)
