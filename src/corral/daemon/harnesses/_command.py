"""``CommandHarness``: one turn is one run of the agent's command (prompt in, output out)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

from corral.daemon.harnesses._base import TurnFailedError, TurnRequest, TurnResult
from corral.kernel import InvalidArgumentError
from corral.kernel import _validate as v

PID_FILE = "turn.pid"
_REAP_S = 5.0  # bound on waiting for a SIGKILLed child to be reaped


class CommandHarness:
    """Runs ``spec.command`` (an argv, no shell) once per turn.

    The child runs in ``request.workdir`` with the daemon's environment, then ``spec.env``,
    then ``request.env`` on top; the prompt is written to its stdin, which is then closed. Its
    stdout, decoded as UTF-8 (undecodable bytes replaced), is the turn's output. The child
    starts in a session of its own, so the turn owns a whole process group.

    Failed turns (:class:`TurnFailedError`): the command cannot be started (or its working
    directory does not exist: the message says so rather than blame the command); it exits
    non-zero (the message names the exit code, or the signal, and gives the last
    ``stderr_tail_bytes`` of its stderr); it runs longer than ``request.timeout_s`` ("turn
    timed out after N s"); its pid file cannot be written (it is killed then: a turn that a
    crash could orphan for good does not run).

    Ending: a turn that times out or whose task is cancelled gets SIGKILL sent to its whole
    process group at once -- no SIGTERM grace, because a stop or a shutdown must not wait on
    the child, and the turn's result is discarded anyway; ``asyncio.CancelledError`` then
    propagates. When the command exits by itself, whatever it left running in its process
    group is killed too: nothing of a turn outlives it (a process that started a session of
    its own escapes this; its pipes are then abandoned after ``drain_s``).

    Output: at most ``max_output_bytes`` of stdout are kept; the rest is read and dropped (the
    child never blocks on a full pipe) and the output ends with a line saying how many bytes
    were dropped. Only the stderr tail is kept.

    Crash safety (Linux): while a turn runs, ``<state_dir>/turn.pid`` holds the child's pid,
    its start time (``/proc/<pid>/stat`` field 22) and the boot id, written and fsynced
    before the turn is waited on and removed when the turn ends. :meth:`reap` uses it after
    a daemon crash. A child that dies within the instant between its start and that write
    leaves no file; one still alive then is missed only if the daemon dies in that instant.
    """

    def __init__(
        self,
        *,
        max_output_bytes: int = 10 * 1024 * 1024,
        stderr_tail_bytes: int = 2048,
        drain_s: float = 2.0,
    ) -> None:
        where = "CommandHarness"
        v.positive_int(where, "max_output_bytes", max_output_bytes)
        v.positive_int(where, "stderr_tail_bytes", stderr_tail_bytes)
        v.positive_number(where, "drain_s", drain_s)
        self.max_output_bytes = max_output_bytes
        self.stderr_tail_bytes = stderr_tail_bytes
        self.drain_s = drain_s

    def __repr__(self) -> str:
        return (
            f"CommandHarness(max_output_bytes={self.max_output_bytes}, "
            f"stderr_tail_bytes={self.stderr_tail_bytes})"
        )

    async def run_turn(self, request: TurnRequest) -> TurnResult:
        """Run one turn; see the class docstring. Raises ``InvalidArgumentError`` when the
        request is not a TurnRequest for a ``command`` spec."""
        v.instance_of("CommandHarness.run_turn", "request", request, TurnRequest)
        argv = request.spec.command
        if request.spec.harness != "command" or not argv:
            raise InvalidArgumentError(
                "CommandHarness.run_turn",
                "request.spec",
                "a spec of harness 'command' with a command",
                request.spec.harness,
            )
        env = {**os.environ, **request.spec.env, **request.env}
        loop = asyncio.get_running_loop()
        try:
            transport, protocol = await loop.subprocess_exec(
                lambda: _Pipes(loop, self.max_output_bytes, self.stderr_tail_bytes),
                *argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=request.workdir,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            if not request.workdir.is_dir():
                raise TurnFailedError(
                    f"the agent's working directory {str(request.workdir)!r} does not exist "
                    "(it was deleted); the command was not started",
                    workdir=str(request.workdir),
                ) from None
            raise TurnFailedError(
                f"could not start command {argv[0]!r}: {type(exc).__name__}: {exc}",
                command=list(argv),
            ) from None
        return await _Turn(self, request, transport, protocol).run()

    async def reap(self, agent_id: str, state_dir: Path) -> bool:
        """End the leftover process group of an interrupted turn; True when one was signalled.

        The pid file's process is killed (with its group) only when it is the same process:
        same boot, same start time. When the leader is gone, members of its process group
        that outlived it are killed (a pid is not reused while it names a live group). A
        missing, stale or unreadable pid file gives False; the file is removed in every case.
        Returns once SIGKILL is sent. Idempotent.
        """
        v.non_empty_str("CommandHarness.reap", "agent_id", agent_id)
        v.instance_of("CommandHarness.reap", "state_dir", state_dir, Path)
        path = state_dir / PID_FILE
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


class _Turn:
    """One running child: its stdin, its pid file, its end."""

    def __init__(
        self,
        harness: CommandHarness,
        request: TurnRequest,
        transport: asyncio.SubprocessTransport,
        pipes: _Pipes,
    ) -> None:
        self.harness = harness
        self.request = request
        self.transport = transport
        self.pipes = pipes
        self.pid = transport.get_pid()
        self.pid_file = request.state_dir / PID_FILE

    async def run(self) -> TurnResult:
        request, pipes = self.request, self.pipes
        timed_out = False
        try:
            try:
                _write_pid_file(self.pid_file, self.pid, request)
            except OSError as exc:
                raise TurnFailedError(
                    f"could not write the pid file {str(self.pid_file)!r}: {exc}; "
                    "the command was killed",
                    pid_file=str(self.pid_file),
                ) from None
            self._feed(request.prompt.encode())
            # asyncio.wait never cancels what it waits on, so the futures outlive a timeout.
            done, _ = await asyncio.wait({pipes.exited}, timeout=request.timeout_s)
            timed_out = not done
            _kill_group(self.pid)  # what the command left behind, or all of it on timeout
            await asyncio.wait({pipes.exited}, timeout=_REAP_S)
            # Pipes still open now are held by a process outside the group: stop waiting.
            await asyncio.wait({pipes.closed}, timeout=self.harness.drain_s)
        finally:
            try:
                if not pipes.exited.done():
                    _kill_group(self.pid)
                    await _wait_through_cancellation(pipes.exited, _REAP_S)
            finally:
                self.transport.close()  # closes the pipes; kills the child if still there
                with contextlib.suppress(OSError):
                    self.pid_file.unlink()
        if timed_out:
            raise TurnFailedError(
                f"turn timed out after {request.timeout_s:g} s; its process group was killed",
                timeout_s=request.timeout_s,
            )
        code = self.transport.get_returncode()
        if code != 0:
            raise TurnFailedError(self._exit_message(code), exit_code=code)
        return TurnResult(output=self._output())

    def _feed(self, data: bytes) -> None:
        stdin = self.transport.get_pipe_transport(0)
        if not isinstance(stdin, asyncio.WriteTransport):
            return
        # The transport buffers what the pipe cannot take yet and closes after flushing; a
        # child that exits without reading its stdin only makes that a no-op.
        if data:
            stdin.write(data)
        stdin.close()

    def _output(self) -> str:
        out = self.pipes.out
        text = out.decode("utf-8", errors="replace")
        dropped = self.pipes.out_total - len(out)
        if dropped:
            text += (
                f"\n[corral: output truncated: kept the first {len(out)} bytes, "
                f"dropped {dropped} more]\n"
            )
        return text

    def _exit_message(self, code: int | None) -> str:
        if code is None:
            how = "ended without an exit status"
        elif code < 0:
            how = f"was killed by signal {-code}"
        else:
            how = f"exited with code {code}"
        tail = self.pipes.err.decode("utf-8", errors="replace").strip()
        if not tail:
            return f"command {how} (stderr was empty)"
        return f"command {how}; last {self.harness.stderr_tail_bytes} bytes of stderr:\n{tail}"


async def _wait_through_cancellation(future: asyncio.Future[None], within_s: float) -> None:
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


def _kill_group(pgid: int) -> bool:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return False
    return True


# --- the pid file -------------------------------------------------------------------------


def _write_pid_file(path: Path, pid: int, request: TurnRequest) -> None:
    start = _start_time(pid)
    if start is None:
        return  # already gone (or no /proc): nothing a crash could leave behind
    record = {
        "pid": pid,
        "startTime": start,
        "bootId": _boot_id(),
        "agentId": request.agent_id,
        "turn": request.turn,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, json.dumps(record).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _reap_recorded(raw: str) -> bool:
    try:
        record: Any = json.loads(raw)
        pid = record["pid"]
        start = record["startTime"]
        boot = record.get("bootId")
    except (ValueError, TypeError, KeyError):
        return False
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 1:
        return False
    if boot is not None and boot != _boot_id():
        return False  # another boot: every pid of the file is someone else's
    current = _start_time(pid)
    if current is None:
        # The leader is gone; a group of that id can only be its own leftovers.
        return _kill_group(pid)
    if current != start:
        return False  # the pid was reused
    killed = _kill_group(pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)  # in case it left its group
        killed = True
    return killed


def _start_time(pid: int) -> int | None:
    """Field 22 of ``/proc/<pid>/stat`` (clock ticks since boot), None when unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: count after the last ')'.
    fields = stat[stat.rfind(b")") + 2 :].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip() or None
    except OSError:
        return None
