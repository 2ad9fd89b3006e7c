"""One child process of an agent: started in a process group of its own, fed, waited on, killed.

The ``command`` harness runs a turn's command with it and the ``openai`` harness its tools'
commands: one implementation of starting, capping output, killing a whole process group and
the pid file a crashed daemon reaps by.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.daemon.harnesses._base import TurnRequest
from corral.daemon.harnesses._launch import boot_id, kill_group, start_time, write_pid_file
from corral.daemon.harnesses._timer import TurnTimer

PID_FILE = "turn.pid"
_REAP_S = 5.0  # bound on waiting for a SIGKILLed child to be reaped


def agent_env(request: TurnRequest) -> dict[str, str]:
    """The environment of the agent's processes: the daemon's, then the spec's ``env``, then
    ``request.env`` (what the agent is told about itself) on top."""
    return {**os.environ, **request.spec.env, **request.env}


class ProcessNotStartedError(Exception):
    """The process did not run (or was killed at once); ``message`` says why for people,
    ``details`` as plain values."""

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


@dataclass(frozen=True, slots=True)
class Finished:
    """How a process ended: its exit status (negative: killed by that signal; None: no
    status), its stdout as text (capped, with a line saying what was dropped), the tail of
    its stderr, and whether ``timer`` ran out (it was killed then)."""

    returncode: int | None
    output: str
    stderr_tail: str
    timed_out: bool


@dataclass(frozen=True, slots=True)
class Limits:
    """``max_output_bytes`` of stdout are kept, the last ``stderr_tail_bytes`` of stderr;
    pipes still open ``drain_s`` after the group is gone are abandoned; a command turn's log
    file keeps ``log_bytes`` of stdout and stderr together."""

    max_output_bytes: int
    stderr_tail_bytes: int
    drain_s: float
    log_bytes: int = 0  # a command turn's log file (see _launch._Log): 0 is none


async def run_process(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    stdin: bytes,
    limits: Limits,
    timer: TurnTimer | None = None,
    pid_file: Path | None = None,
    record: Mapping[str, Any] | None = None,
) -> Finished:
    """Run ``argv`` (no shell) in ``cwd`` with ``env``, ``stdin`` written then closed.

    The child starts a session of its own, so it owns a whole process group. When it exits,
    whatever it left in its group is killed; when ``timer`` runs out first, or the caller is
    cancelled, the whole group gets SIGKILL at once (no grace: the result is discarded
    anyway) and, for a cancellation, ``asyncio.CancelledError`` propagates once the child
    is reaped. A process that started a session of its own escapes the group kill; its
    pipes are then abandoned after ``limits.drain_s``.

    With ``pid_file``, the child's pid, start time and boot id (plus ``record``) are written
    there and fsynced before it is waited on, and the file is removed when it ends: see
    :func:`reap_pid_file`.

    Raises :class:`ProcessNotStartedError` when the command cannot be started (its working
    directory missing is named as such) or its pid file cannot be written (it is killed).
    """
    loop = asyncio.get_running_loop()
    try:
        transport, pipes = await loop.subprocess_exec(
            lambda: _Pipes(loop, limits.max_output_bytes, limits.stderr_tail_bytes),
            *argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env=dict(env),
            start_new_session=True,
        )
    except OSError as exc:
        raise not_started(argv, cwd, exc) from None
    pid = transport.get_pid()
    timed_out = False
    try:
        if pid_file is not None:
            try:
                write_pid_file(str(pid_file), pid, record or {})
            except OSError as exc:
                raise ProcessNotStartedError(
                    f"could not write the pid file {str(pid_file)!r}: {exc}; "
                    "the command was killed",
                    pid_file=str(pid_file),
                ) from None
        _feed(transport, stdin)
        # Neither wait cancels what it waits on, so the futures outlive a timeout.
        if timer is None:
            await asyncio.wait({pipes.exited})
        else:
            timed_out = not await timer.wait(pipes.exited)
        kill_group(pid)  # what the command left behind, or all of it on timeout
        await asyncio.wait({pipes.exited}, timeout=_REAP_S)
        # Pipes still open now are held by a process outside the group: stop waiting.
        await asyncio.wait({pipes.closed}, timeout=limits.drain_s)
    finally:
        try:
            if not pipes.exited.done():
                kill_group(pid)
                await wait_through_cancellation(pipes.exited, _REAP_S)
        finally:
            transport.close()  # closes the pipes; kills the child if still there
            if pid_file is not None:
                _remove(pid_file)
    return Finished(
        returncode=transport.get_returncode(),
        output=pipes.output(),
        stderr_tail=pipes.err.decode("utf-8", errors="replace").strip(),
        timed_out=timed_out,
    )


def not_started(argv: Sequence[str], cwd: Path, exc: OSError) -> ProcessNotStartedError:
    if not cwd.is_dir():  # say so, rather than blame the command
        return ProcessNotStartedError(
            f"the agent's working directory {str(cwd)!r} does not exist "
            "(it was deleted); the command was not started",
            workdir=str(cwd),
        )
    return ProcessNotStartedError(
        f"could not start command {argv[0]!r}: {type(exc).__name__}: {exc}",
        command=list(argv),
    )


def exit_message(what: str, finished: Finished, tail_bytes: int) -> str:
    """``"<what> exited with code 3; last N bytes of stderr:\\n..."`` (or the signal)."""
    code = finished.returncode
    if code is None:
        how = "ended without an exit status"
    elif code < 0:
        how = f"was killed by signal {-code}"
    else:
        how = f"exited with code {code}"
    if not finished.stderr_tail:
        return f"{what} {how} (stderr was empty)"
    return f"{what} {how}; last {tail_bytes} bytes of stderr:\n{finished.stderr_tail}"


class _Pipes(asyncio.SubprocessProtocol):
    """Collects the child's stdout (up to a cap) and stderr tail; reports exit and close.

    Data is taken as it comes and never paused, so the child never blocks on a full pipe.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, max_out: int, tail: int) -> None:
        self.max_out = max_out
        self.tail = tail
        self.out = bytearray()
        self.out_total = 0
        self.err = bytearray()
        self.exited: asyncio.Future[None] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        chunk = data
        if fd == 1:
            self.out_total += len(chunk)
            room = self.max_out - len(self.out)
            if room > 0:
                self.out += chunk[:room]
        elif fd == 2:
            self.err += chunk
            if len(self.err) > self.tail:
                del self.err[: -self.tail]

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        # Called once the process has exited and every pipe is closed.
        if not self.closed.done():
            self.closed.set_result(None)

    def output(self) -> str:
        return output_text(bytes(self.out), self.out_total)


def output_text(kept: bytes, total: int) -> str:
    """The first bytes of a stdout as text (undecodable bytes replaced), with a line saying
    how many more of its ``total`` bytes were dropped, when some were."""
    text = kept.decode("utf-8", errors="replace")
    dropped = total - len(kept)
    if dropped > 0:
        text += (
            f"\n[corral: output truncated: kept the first {len(kept)} bytes, "
            f"dropped {dropped} more]\n"
        )
    return text


def _feed(transport: asyncio.SubprocessTransport, data: bytes) -> None:
    stdin = transport.get_pipe_transport(0)
    if not isinstance(stdin, asyncio.WriteTransport):
        return
    # The transport buffers what the pipe cannot take yet and closes after flushing; a
    # child that exits without reading its stdin only makes that a no-op.
    if data:
        stdin.write(data)
    stdin.close()


async def wait_through_cancellation(future: asyncio.Future[Any], within_s: float) -> None:
    """Wait up to ``within_s`` seconds for ``future``; a cancellation meanwhile does not cut
    the wait short and is raised afterwards."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    cancelled = False
    while not future.done() and (left := deadline - loop.time()) > 0:
        try:
            await asyncio.wait({future}, timeout=left)
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError


# --- the pid file -------------------------------------------------------------------------


def reap_pid_file(path: Path) -> bool:
    """End the leftover process group a pid file names; True when one was signalled.

    The file's process is killed (with its group) only when it is the same process: same
    boot, same start time. When the leader is gone, members of its process group that
    outlived it are killed (a pid is not reused while it names a live group). A missing,
    stale or unreadable file gives False; the file is removed in every case. Returns once
    SIGKILL is sent. Idempotent.
    """
    try:
        raw = path.read_text()
    except FileNotFoundError:
        return False
    except OSError:
        raw = ""
    try:
        found = _reap_recorded(raw)
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    return found


def terminate_pid_file(path: Path) -> bool:
    """Send SIGTERM to the process group a pid file names, when its leader is the same
    process (same boot, same start time): the polite first half of a graceful stop. True
    when a group was signalled. The file is left as it is (the turn removes it when it
    ends; :func:`reap_pid_file` kills what is left)."""
    try:
        record: Any = json.loads(path.read_text())
        pid, start = record["pid"], record["startTime"]
        boot = record.get("bootId")
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return False
    if not _is_pid(pid) or (boot is not None and boot != boot_id()):
        return False
    if start_time(pid) != start:
        return False  # ended already (its launcher ends what it left), or the pid reused
    try:
        os.killpg(pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _reap_recorded(raw: str) -> bool:
    try:
        record: Any = json.loads(raw)
        pid = record["pid"]
        start = record["startTime"]
        boot = record.get("bootId")
    except (ValueError, TypeError, KeyError, AttributeError):
        return False
    if not _is_pid(pid):
        return False
    if boot is not None and boot != boot_id():
        return False  # another boot: every pid of the file is someone else's
    killed = _kill_recorded(pid, start)
    # The command harness's launcher (see _launch), which waits on the command.
    launcher = record.get("launcher")
    lpid = launcher.get("pid") if isinstance(launcher, dict) else None
    if isinstance(launcher, dict) and isinstance(lpid, int) and _is_pid(lpid):
        lstart = launcher.get("startTime")
        if lstart is not None and start_time(lpid) == lstart:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(lpid, signal.SIGKILL)
                killed = True
    return killed


def _is_pid(pid: Any) -> bool:
    return isinstance(pid, int) and not isinstance(pid, bool) and pid > 1


def _kill_recorded(pid: int, start: Any) -> bool:
    current = start_time(pid)
    if current is None:
        # The leader is gone; a group of that id can only be its own leftovers.
        return kill_group(pid)
    if current != start:
        return False  # the pid was reused
    killed = kill_group(pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)  # in case it left its group
        killed = True
    return killed
