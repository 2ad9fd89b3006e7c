"""``CommandHarness``: one turn is one run of the agent's command (prompt in, output out)."""

from __future__ import annotations

from pathlib import Path

from corral.daemon import _sessions
from corral.daemon.harnesses import _liveness
from corral.daemon.harnesses._base import (
    NothingToAdoptError,
    TurnFailedError,
    TurnRequest,
    TurnResult,
)
from corral.daemon.harnesses._launched import (
    TurnFiles,
    adopt_launched,
    remove_all_turn_files,
    run_launched,
)
from corral.daemon.harnesses._process import (
    PID_FILE,
    Finished,
    Limits,
    ProcessNotStartedError,
    agent_env,
    exit_message,
    reap_pid_file,
    terminate_pid_file,
)
from corral.daemon.harnesses._timer import TurnTimer
from corral.kernel import InvalidArgumentError
from corral.kernel import _validate as v

__all__ = ["PID_FILE", "CommandHarness", "NothingToAdoptError"]


class CommandHarness:
    """Runs ``spec.command`` (an argv, no shell) once per turn.

    The child runs in ``request.workdir`` with the daemon's environment, then ``spec.env``,
    then ``request.env`` on top; the prompt is its stdin (a file, read to its end). Its
    stdout, decoded as UTF-8 (undecodable bytes replaced), is the turn's output. The child
    starts in a session of its own, so the turn owns a whole process group.

    The daemon does not run the command itself: a launcher does (``_launch``: an interpreter
    importing only built-in modules, in a session of its own), which reads the command's
    stdout and stderr, keeps what is kept of them in files of the turn in ``state_dir``
    (``turn-<n>.out``, ``turn-<n>.err``) and records its exit status (``turn-<n>.status``).
    So a turn outlives the daemon with its outcome: after a crash, the next daemon can
    :meth:`adopt` it. The files are removed once read.

    Failed turns (:class:`TurnFailedError`): the command cannot be started (or its working
    directory does not exist: the message says so rather than blame the command); it exits
    non-zero (the message names the exit code, or the signal, and gives the last
    ``stderr_tail_bytes`` of its stderr); it runs longer than ``request.timeout_s`` ("turn
    timed out after N s"); its pid file cannot be written (it is killed then: a turn that a
    crash could orphan for good does not run).

    The timeout counts the turn's own time only: time the turn spends waiting on a person
    (``request.paused_s``, which grows while the command waits in ``corral check``) does not
    count, the approval's own timeout decides; see :class:`TurnTimer`.

    Ending: a turn that times out or whose task is cancelled gets SIGKILL sent to its whole
    process group at once; ``asyncio.CancelledError`` then propagates. A graceful stop
    comes first through :meth:`terminate` (SIGTERM to the group; the daemon cancels the
    turn when the agent's ``stopGraceS`` has passed). When the command exits by itself,
    whatever it left running in its process group is killed too: nothing of a turn outlives
    it (a process that started a session of its own escapes this; its pipes are then
    abandoned after ``drain_s``).

    Log: with ``request.log``, the command's stdout and stderr, in the order they came, go
    there while the turn runs (the launcher writes them to ``turn-<n>.log``, at most
    ``log_bytes``, the rest counted as dropped; the daemon reads the file as it grows), for
    the turn's record and ``corral logs --follow``.

    Output: at most ``max_output_bytes`` of stdout are kept; the rest is read and dropped (the
    child never blocks on a full pipe) and the output ends with a line saying how many bytes
    were dropped. Only the stderr tail is kept. So the disk holds at most
    ``max_output_bytes`` plus ``stderr_tail_bytes`` of a turn's output, whatever the command
    writes. (A file-size limit on the command, RLIMIT_FSIZE, would cap every file the agent
    writes in its working directory too; reading a pipe caps only the output.)

    Crash safety (Linux): while a turn runs, ``<state_dir>/turn.pid`` holds the child's pid,
    its start time (``/proc/<pid>/stat`` field 22) and the boot id, and the launcher's pid
    and start time, written and fsynced by the launcher before the turn is waited on (the
    child cannot be reaped before: the launcher is its parent) and removed when the turn
    ends. :meth:`reap` and :meth:`adopt` use it after a daemon crash; a daemon that dies in
    the instant between the child's start and that write misses the child.

    Liveness: the command is told its heartbeat file (``CORRAL_HEARTBEAT_FILE``, made empty
    in ``state_dir`` at each turn's start and kept between turns; see ``_liveness``). When
    the daemon watches the turn (``request.heartbeat``, the spec's ``heartbeatS``), touching
    that file or writing anything to stdout or stderr is a sign of life.

    Session: before the command starts, ``request.session`` (the agent's conversation before
    this turn) is written to ``<state_dir>/session.jsonl`` as JSON lines, readable by the
    daemon's user only (0600), and its path is in ``CORRAL_SESSION_FILE``; the file is
    written every turn (empty when there is nothing) and removed when the turn ends (and by
    :meth:`reap`), so it never shows an older session. A file that cannot be written fails
    the turn.

    Cost: the launcher is one more interpreter start per turn (about 15 ms of CPU).
    """

    def __init__(
        self,
        *,
        max_output_bytes: int = 10 * 1024 * 1024,
        stderr_tail_bytes: int = 2048,
        drain_s: float = 2.0,
        adopt_poll_s: float = 0.1,
        log_bytes: int = 1024 * 1024,
    ) -> None:
        where = "CommandHarness"
        v.positive_int(where, "max_output_bytes", max_output_bytes)
        v.positive_int(where, "stderr_tail_bytes", stderr_tail_bytes)
        v.positive_number(where, "drain_s", drain_s)
        v.positive_number(where, "adopt_poll_s", adopt_poll_s)
        v.positive_int(where, "log_bytes", log_bytes)
        self.log_bytes = log_bytes
        self.max_output_bytes = max_output_bytes
        self.stderr_tail_bytes = stderr_tail_bytes
        self.drain_s = drain_s
        self.adopt_poll_s = adopt_poll_s

    def __repr__(self) -> str:
        return (
            f"CommandHarness(max_output_bytes={self.max_output_bytes}, "
            f"stderr_tail_bytes={self.stderr_tail_bytes})"
        )

    async def run_turn(self, request: TurnRequest) -> TurnResult:
        """Run one turn; see the class docstring. Raises ``InvalidArgumentError`` when the
        request is not a TurnRequest for a ``command`` spec."""
        argv = self._check("CommandHarness.run_turn", request)
        session_file = request.state_dir / _sessions.SESSION_FILE
        try:
            _sessions.write_file(session_file, request.session)
        except OSError as exc:
            raise TurnFailedError(
                f"could not write the session file {session_file}: {exc.strerror or exc}",
                session_file=str(session_file),
            ) from None
        timer = TurnTimer(request.timeout_s, request.paused_s)
        files = TurnFiles(request.state_dir, request.turn)
        try:
            # Signs of life: the heartbeat file touched, or output (the out file's mtime).
            async with _liveness.alive(request, [files.absolute().path("out")]) as heartbeat:
                finished = await run_launched(
                    argv,
                    cwd=request.workdir,
                    env={
                        **agent_env(request),
                        _liveness.HEARTBEAT_ENV: str(heartbeat),
                        "CORRAL_SESSION_FILE": str(session_file),
                    },
                    stdin=request.prompt.encode(),
                    limits=self._limits(),
                    timer=timer,
                    files=files,
                    pid_file=request.state_dir / PID_FILE,
                    agent_id=request.agent_id,
                    log=request.log,
                )
        except ProcessNotStartedError as exc:
            raise TurnFailedError(exc.message, **exc.details) from None
        finally:
            session_file.unlink(missing_ok=True)
        return self._judge(finished, timer, request)

    async def adopt(self, request: TurnRequest) -> TurnResult:
        """Take up a turn a previous daemon started, and judge it as :meth:`run_turn` does.

        Waits (checking every ``adopt_poll_s``) until the turn's launcher has recorded how
        the command ended, then reads its files: the same output, failure messages and
        timeout as if this daemon had started it. The time limit's clock starts now:
        ``request.timeout_s`` of the turn's own time from the adoption on, less
        ``request.paused_s()``. Raises :class:`NothingToAdoptError` when the turn left no
        outcome and nothing of it runs (what it left is killed first),
        :class:`TurnFailedError` for a failed turn, ``InvalidArgumentError`` as
        :meth:`run_turn`. A cancellation kills the command's group and the launcher.
        """
        self._check("CommandHarness.adopt", request)
        timer = TurnTimer(request.timeout_s, request.paused_s)
        _liveness.discard(request.state_dir)  # an adopted turn is not watched for stalls
        try:
            finished = await adopt_launched(
                files=TurnFiles(request.state_dir, request.turn),
                pid_file=request.state_dir / PID_FILE,
                limits=self._limits(),
                timer=timer,
                poll_s=self.adopt_poll_s,
                log=request.log,
            )
        except ProcessNotStartedError as exc:
            raise TurnFailedError(exc.message, **exc.details) from None
        finally:
            (request.state_dir / _sessions.SESSION_FILE).unlink(missing_ok=True)
        return self._judge(finished, timer, request)

    def _limits(self) -> Limits:
        return Limits(self.max_output_bytes, self.stderr_tail_bytes, self.drain_s, self.log_bytes)

    def _check(self, where: str, request: TurnRequest) -> tuple[str, ...]:
        v.instance_of(where, "request", request, TurnRequest)
        argv = request.spec.command
        if request.spec.harness != "command" or not argv:
            raise InvalidArgumentError(
                where,
                "request.spec",
                "a spec of harness 'command' with a command",
                request.spec.harness,
            )
        return tuple(argv)

    def _judge(self, finished: Finished, timer: TurnTimer, request: TurnRequest) -> TurnResult:
        if finished.timed_out:
            raise TurnFailedError(
                timer.timeout_message() + "; its process group was killed",
                timeout_s=request.timeout_s,
            )
        code = finished.returncode
        if code != 0:
            raise TurnFailedError(
                exit_message("command", finished, self.stderr_tail_bytes), exit_code=code
            )
        return TurnResult(output=finished.output)

    async def terminate(self, agent_id: str, state_dir: Path) -> bool:
        """Send SIGTERM to the process group of the agent's turn in flight (the pid file
        names it, so an adopted turn is reached too); True when one was signalled. The
        launcher, in a session of its own, is not signalled: it records how the command
        ended, as for any turn."""
        v.non_empty_str("CommandHarness.terminate", "agent_id", agent_id)
        v.instance_of("CommandHarness.terminate", "state_dir", state_dir, Path)
        return terminate_pid_file(state_dir / PID_FILE)

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
        found = reap_pid_file(state_dir / PID_FILE)
        remove_all_turn_files(state_dir)
        _liveness.discard(state_dir)
        (state_dir / _sessions.SESSION_FILE).unlink(missing_ok=True)
        return found
