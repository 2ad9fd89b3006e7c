"""``CommandHarness``: one turn is one run of the agent's command (prompt in, output out)."""

from __future__ import annotations

from pathlib import Path

from corral.daemon.harnesses._base import TurnFailedError, TurnRequest, TurnResult
from corral.daemon.harnesses._process import (
    PID_FILE,
    Limits,
    ProcessNotStartedError,
    agent_env,
    exit_message,
    reap_pid_file,
    run_process,
)
from corral.daemon.harnesses._timer import TurnTimer
from corral.kernel import InvalidArgumentError
from corral.kernel import _validate as v

__all__ = ["PID_FILE", "CommandHarness"]


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

    The timeout counts the turn's own time only: time the turn spends waiting on a person
    (``request.paused_s``, which grows while the command waits in ``corral check``) does not
    count, the approval's own timeout decides; see :class:`TurnTimer`.

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
        timer = TurnTimer(request.timeout_s, request.paused_s)
        try:
            finished = await run_process(
                argv,
                cwd=request.workdir,
                env=agent_env(request),
                stdin=request.prompt.encode(),
                limits=Limits(self.max_output_bytes, self.stderr_tail_bytes, self.drain_s),
                timer=timer,
                pid_file=request.state_dir / PID_FILE,
                record={"agentId": request.agent_id, "turn": request.turn},
            )
        except ProcessNotStartedError as exc:
            raise TurnFailedError(exc.message, **exc.details) from None
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
        return reap_pid_file(state_dir / PID_FILE)
