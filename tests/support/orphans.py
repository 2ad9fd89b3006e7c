"""Turns whose daemon is gone: a command turn started as the command harness starts it, by a
process that exits at once, so nothing of this test process is the launcher's parent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from corral.daemon.harnesses._launch import launcher_args
from corral.daemon.harnesses._launched import TurnFiles, launcher_command

# Starts its arguments in a session of their own and exits without waiting for them.
_DETACH = "import subprocess, sys; subprocess.Popen(sys.argv[1:], start_new_session=True)"


def orphan_turn(
    argv: Sequence[str],
    *,
    state_dir: Path,
    workdir: Path,
    agent_id: str = "a_orphan00",
    turn: int = 1,
    prompt: str = "work",
    env: Mapping[str, str] | None = None,
) -> int | None:
    """Start turn ``turn`` of ``argv`` under the launcher (the command harness's default
    limits); the command's pid, once the launcher has named it (its pid file is written by
    then), or None when the command did not start."""
    state_dir.mkdir(parents=True, exist_ok=True)
    files = TurnFiles(state_dir, turn)
    files.path("in").write_bytes(prompt.encode())
    args = launcher_args(
        argv=argv,
        stdin=str(files.path("in")),
        out=str(files.path("out")),
        err=str(files.path("err")),
        status=str(files.path("status")),
        pid_file=str(state_dir / "turn.pid"),
        agent_id=agent_id,
        turn=turn,
        max_out=10 * 1024 * 1024,
        tail=2048,
        drain_s=2.0,
    )
    with subprocess.Popen(
        [sys.executable, "-c", _DETACH, *launcher_command(args)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        cwd=workdir,
        env=dict(os.environ if env is None else env),
    ) as detach:
        assert detach.stdout is not None
        # The launcher prints the command's pid once its pid file is written, or ends.
        line = detach.stdout.readline()
    if not line:
        return None
    pid: int = json.loads(line)["pid"]
    return pid


def launcher_pid(state_dir: Path) -> int:
    """The launcher's pid, from a turn's pid file."""
    record = json.loads((state_dir / "turn.pid").read_text())
    pid: int = record["launcher"]["pid"]
    return pid
