"""A command turn run under the launcher (``_launch``): started, waited on -- by the daemon
that started it, or after a restart by one that did not -- and read back from its files.

A turn's files live in the agent's state directory, named by the turn's number:
``turn-<n>.in`` (the prompt, the command's stdin), ``turn-<n>.out`` (the first bytes of its
stdout), ``turn-<n>.err`` (the tail of its stderr), ``turn-<n>.log`` (its stdout and stderr as they
came, up to the turn's log size; see ``_log_tail``) and ``turn-<n>.status`` (how it ended,
written last). The pid file names the command and the launcher. The daemon removes the
files once it has read them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.daemon.harnesses._base import NothingToAdoptError, TurnOutput
from corral.daemon.harnesses._launch import (
    alive,
    boot_id,
    kill_group,
    launcher_args,
    start_time,
)
from corral.daemon.harnesses._log_tail import LogTail, following, read_bound
from corral.daemon.harnesses._process import (
    Finished,
    Limits,
    ProcessNotStartedError,
    not_started,
    output_text,
    reap_pid_file,
    wait_through_cancellation,
)
from corral.daemon.harnesses._timer import TurnTimer

LAUNCHER = Path(__file__).with_name("_launch.py")
# Imported, not run as a script: a script is compiled at every start, a module's bytecode is
# cached. Appended to sys.path, so its directory shadows nothing of the standard library.
_BOOT = "import sys; sys.path.append({0!r}); from _launch import main; sys.exit(main(sys.argv[1:]))"
_REAP_S = 5.0  # bound on waiting for a SIGKILLed launcher, or for it to name its command
_KINDS = ("in", "out", "err", "log", "status")
_MAX_STATUS_BYTES = 1 << 20  # a status or pid file is small; anything bigger is not ours
_LAUNCHER_TAIL = 2048  # of the launcher's own stderr, said when it ends without a status
LOG_POLL_S = 0.1  # how often a running turn's log file is read for new lines


@dataclass(frozen=True, slots=True)
class TurnFiles:
    """The files of turn ``turn`` in ``state_dir`` (see the module docstring)."""

    state_dir: Path
    turn: int

    def path(self, kind: str) -> Path:
        return self.state_dir / f"turn-{self.turn}.{kind}"

    def absolute(self) -> TurnFiles:
        """The same files, named from the root (a relative ``state_dir`` is taken from the
        current working directory)."""
        return TurnFiles(_absolute(self.state_dir), self.turn)

    def remove(self) -> None:
        """Remove every file of the turn (and half-written ones); missing ones are fine."""
        for kind in _KINDS:
            _remove(self.path(kind))
            _remove(self.path(kind + ".tmp"))


def launcher_command(args: Sequence[str]) -> list[str]:
    """The launcher's command line: this interpreter, isolated from the environment's
    ``PYTHON*`` variables and without site packages (it needs neither), not writing bytecode
    when this process does not."""
    flags = ["-I", "-S", *(["-B"] if sys.dont_write_bytecode else [])]
    boot = _BOOT.format(str(LAUNCHER.parent))
    return [sys.executable or "python3", *flags, "-c", boot, *args]


def remove_all_turn_files(state_dir: Path) -> None:
    """Remove the files of every turn in ``state_dir`` (nothing of the agent runs)."""
    with contextlib.suppress(OSError):
        for found in state_dir.glob("turn-*.*"):
            if found.name.split(".", 1)[1] in (*_KINDS, *(k + ".tmp" for k in _KINDS)):
                _remove(found)


async def run_launched(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    stdin: bytes,
    limits: Limits,
    timer: TurnTimer,
    files: TurnFiles,
    pid_file: Path,
    agent_id: str,
    log: TurnOutput | None = None,
) -> Finished:
    """Run ``argv`` under the launcher in ``cwd`` with ``env``, ``stdin`` as its stdin.

    The launcher starts in a session of its own and the command in another (so the command
    owns a process group). When ``timer`` runs out, or the caller is cancelled, the
    command's group and the launcher get SIGKILL at once and, for a cancellation,
    ``asyncio.CancelledError`` propagates once the launcher is reaped. The pid file is
    removed when the turn ends, and the turn's files once read.

    With ``log``, the command's stdout and stderr go there as they come (see ``_log_tail``).

    Raises :class:`ProcessNotStartedError` when the command cannot be started (its working
    directory missing is named as such) or its pid file cannot be written (it is killed).
    """
    loop = asyncio.get_running_loop()
    # The launcher runs in ``cwd``: the paths it is given must not be relative to ours.
    files, pid_file = files.absolute(), _absolute(pid_file)
    files.remove()
    try:
        files.state_dir.mkdir(parents=True, exist_ok=True)
        _write_private(files.path("in"), stdin)
    except OSError as exc:
        raise ProcessNotStartedError(
            f"could not write the turn's stdin to {str(files.path('in'))!r}: {exc}",
            state_dir=str(files.state_dir),
        ) from None
    args = launcher_args(
        argv=argv,
        stdin=str(files.path("in")),
        out=str(files.path("out")),
        err=str(files.path("err")),
        status=str(files.path("status")),
        pid_file=str(pid_file),
        agent_id=agent_id,
        turn=files.turn,
        max_out=limits.max_output_bytes,
        tail=limits.stderr_tail_bytes,
        drain_s=limits.drain_s,
        log=str(files.path("log")) if log is not None else "",
        log_max=limits.log_bytes if log is not None else 0,
    )
    launcher = launcher_command(args)
    spawning = asyncio.ensure_future(
        loop.subprocess_exec(
            lambda: _Launcher(loop),
            *launcher,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env=dict(env),
            start_new_session=True,
        )
    )
    # Cancelled while the launcher starts (a stop right after a prompt), asyncio would kill
    # the launcher alone, and the command it may have started already, in a session of its
    # own, would run on with nobody to end it: let the start finish, then end both below.
    cancelled = False
    while not spawning.done():
        try:
            await asyncio.wait({spawning})
        except asyncio.CancelledError:
            cancelled = True
    try:
        transport, watch = spawning.result()
    except OSError as exc:
        files.remove()
        if cancelled:
            raise asyncio.CancelledError from None
        raise not_started(launcher[:1], cwd, exc) from None
    launcher_pid = transport.get_pid()
    timed_out = False
    tail = _log_tail(files, limits, log)
    try:
        if cancelled:
            raise asyncio.CancelledError
        async with following(tail, LOG_POLL_S):
            timed_out = not await timer.wait(watch.exited)
        if timed_out:
            await _end(watch, launcher_pid)
    finally:
        try:
            if not watch.exited.done():
                await _end(watch, launcher_pid)  # cancelled: raised once it is reaped
        finally:
            transport.close()
            _remove(pid_file)
            if not watch.exited.done():
                files.remove()  # a launcher that would not die: what it wrote is moot
    try:
        if tail is not None:
            tail.finish(files.path("status"))
        return read_finished(files, limits, timed_out=timed_out, launcher_tail=watch.tail())
    finally:
        files.remove()


async def adopt_launched(
    *,
    files: TurnFiles,
    pid_file: Path,
    limits: Limits,
    timer: TurnTimer,
    poll_s: float,
    log: TurnOutput | None = None,
) -> Finished:
    """Wait for a turn a previous daemon started (not this process's child) and read it.

    The launcher's exit is checked every ``poll_s`` seconds. When ``timer`` runs out, or the
    caller is cancelled, the command's group and the launcher get SIGKILL (their parent
    reaps them, not this process) and, for a cancellation, ``asyncio.CancelledError``
    propagates. The pid file and the turn's files are removed once read.

    Raises :class:`NothingToAdoptError` when the turn left no status and its launcher is
    gone (or none is recorded for this turn): what it left was killed first.
    Raises :class:`ProcessNotStartedError` when the turn's command never started.
    """
    record = _read_json(pid_file)
    if record is not None and record.get("turn") != files.turn:
        reap_pid_file(pid_file)  # another turn's leftover: not this one to adopt
        record = None
    launcher = _launcher_of(record)
    status = files.path("status")
    # A launcher gone may have written its status on its way out: look at the status last.
    if (launcher is None or not alive(*launcher)) and not status.exists():
        reap_pid_file(pid_file)
        files.remove()
        raise NothingToAdoptError(
            f"turn {files.turn} left no outcome in {str(files.state_dir)!r} and no process "
            "of it runs",
            turn=files.turn,
        )
    timed_out = False
    tail = _log_tail(files, limits, log)
    if launcher is not None:
        poller = asyncio.ensure_future(
            _until(lambda: status.exists() or not alive(*launcher), poll_s)
        )
        try:
            async with following(tail, LOG_POLL_S):
                timed_out = not await timer.wait(poller)
        except asyncio.CancelledError:
            reap_pid_file(pid_file)
            files.remove()
            raise
        finally:
            poller.cancel()
    if timed_out or not status.exists():
        # Timed out: end it. No status: its launcher was killed; end what it left.
        reap_pid_file(pid_file)
    try:
        if tail is not None:
            tail.finish(status)
        return read_finished(files, limits, timed_out=timed_out, launcher_tail="")
    finally:
        _remove(pid_file)
        files.remove()


def read_finished(
    files: TurnFiles, limits: Limits, *, timed_out: bool, launcher_tail: str
) -> Finished:
    """How the turn ended, from its files. A status saying the command never started raises
    :class:`ProcessNotStartedError`; no status (the launcher was killed) gives a
    :class:`Finished` without a return code, with ``launcher_tail`` as its stderr when the
    command's is empty."""
    status = _read_json(files.path("status"))
    if status is not None and isinstance(status.get("notStarted"), str):
        details = status.get("details")
        raise ProcessNotStartedError(
            status["notStarted"], **(details if isinstance(details, dict) else {})
        )
    kept = _read_head(files.path("out"), limits.max_output_bytes)
    err = _read_tail(files.path("err"), limits.stderr_tail_bytes)
    returncode = None if status is None else status.get("returncode")
    if not isinstance(returncode, int) or isinstance(returncode, bool):
        returncode = None
    total = len(kept) if status is None else status.get("outBytes")
    if not isinstance(total, int) or isinstance(total, bool) or total < len(kept):
        total = len(kept)
    stderr_tail = err.decode("utf-8", errors="replace").strip()
    if status is None and not stderr_tail:
        stderr_tail = launcher_tail
    return Finished(
        returncode=returncode,
        output=output_text(kept, total),
        stderr_tail=stderr_tail,
        timed_out=timed_out,
    )


class _Launcher(asyncio.SubprocessProtocol):
    """Watches the launcher: the command's pid it prints, its own stderr's tail, its exit."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.line = bytearray()
        self.err = bytearray()
        # (pid, start time) of the command; None when the launcher ended without naming it.
        self.command: asyncio.Future[tuple[int, int | None] | None] = loop.create_future()
        self.exited: asyncio.Future[None] = loop.create_future()

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        if fd == 2:
            self.err += data
            del self.err[:-_LAUNCHER_TAIL]
            return
        if self.command.done() or len(self.line) > 4096:
            return
        self.line += data
        if b"\n" in self.line:
            with contextlib.suppress(ValueError, TypeError, KeyError):
                pid = json.loads(self.line.split(b"\n", 1)[0])["pid"]
                if isinstance(pid, int) and not isinstance(pid, bool) and pid > 1:
                    self.command.set_result((pid, start_time(pid)))

    def process_exited(self) -> None:
        if not self.command.done():
            self.command.set_result(None)
        if not self.exited.done():
            self.exited.set_result(None)

    def tail(self) -> str:
        return self.err.decode("utf-8", errors="replace").strip()


async def _end(watch: _Launcher, launcher_pid: int) -> None:
    """SIGKILL the command's group, then the launcher; return once the launcher is reaped
    (or after a bound). A cancellation meanwhile does not cut this short and is raised
    afterwards."""
    cancelled = False
    # Until the launcher names its command (a moment after it starts) there is nothing to
    # kill but the launcher, which would leave the command running: wait for the name.
    try:
        await wait_through_cancellation(watch.command, _REAP_S)
    except asyncio.CancelledError:
        cancelled = True
    command = watch.command.result() if watch.command.done() else None
    if command is not None:
        pid, started = command
        # Until the launcher reaps the command (after killing its group itself) the pid
        # cannot name anyone else; after, the start time tells.
        if started is not None and start_time(pid) == started:
            kill_group(pid)
    if not watch.exited.done():
        kill_group(launcher_pid)  # the launcher is alone in its group
    try:
        await wait_through_cancellation(watch.exited, _REAP_S)
    except asyncio.CancelledError:
        cancelled = True
    if cancelled:
        raise asyncio.CancelledError


async def _until(condition: Callable[[], bool], every_s: float) -> None:
    """Return once ``condition()`` holds, looking every ``every_s`` seconds (what it watches
    -- another process, a file -- has no event to wait on here)."""
    while True:
        if condition():
            return
        await asyncio.sleep(every_s)


def _launcher_of(record: dict[str, Any] | None) -> tuple[int, int] | None:
    """The launcher a pid file names, when it is of this boot."""
    if record is None:
        return None
    boot = record.get("bootId")
    if boot is not None and boot != boot_id():
        return None  # another boot: nothing of it runs
    launcher = record.get("launcher")
    if not isinstance(launcher, dict):
        return None
    pid, started = launcher.get("pid"), launcher.get("startTime")
    if type(pid) is not int or type(started) is not int or pid <= 1:
        return None
    return pid, started


def _log_tail(files: TurnFiles, limits: Limits, log: TurnOutput | None) -> LogTail | None:
    """The tail of the turn's log file, reading no more than the launcher's cap allows for:
    the command can append to the file itself."""
    if log is None:
        return None
    return LogTail(files.path("log"), log, max_bytes=read_bound(limits.log_bytes))


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        with open(path, "rb") as f:
            raw = f.read(_MAX_STATUS_BYTES + 1)
    except OSError:
        return None
    if len(raw) > _MAX_STATUS_BYTES:
        return None
    try:
        found = json.loads(raw)
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def _read_head(path: Path, size: int) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(size)
    except OSError:
        return b""


def _read_tail(path: Path, size: int) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - size))
            return f.read(size)
    except OSError:
        return b""


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def _absolute(path: Path) -> Path:
    """``path`` from the root: a relative one is taken from the current working directory
    (no file system access but reading the current directory)."""
    return Path(os.path.abspath(path))


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
