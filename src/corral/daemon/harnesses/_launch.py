"""The launcher of a command turn: runs the command, keeps its output and records how it ended.

The command harness does not run a turn's command itself: it starts an interpreter that runs
:func:`main` of this module (``_launched.launcher_command``, arguments from
:func:`launcher_args`; ``python -I -S _launch.py ARGS`` does the same), in a session of its
own, and this process runs the command. It outlives the daemon, so a command still running when the
daemon dies (waiting in ``corral check`` for a person, say) keeps its output and its exit
status: they are in files the next daemon reads (see ``_launched``).

It starts on every turn, so it imports only modules built into the interpreter (``os``,
``sys``, ``select``, ``time``, ``_signal``): about as fast as an empty interpreter. That is
why it writes its JSON itself (:func:`dumps`) rather than import ``json``, and spawns with
``os.posix_spawnp`` rather than ``subprocess`` (together they would double its start). The
daemon imports its pid-file primitives from here (one implementation).

What it does, in order:

1. starts the command (``posix_spawnp``: ``PATH`` of the agent's environment) in a session
   of its own, so the command owns a process group, with the ``stdin`` file as its stdin
   and its stdout and stderr on pipes this process reads; a command that cannot be started
   is recorded in the status file as ``notStarted`` (the reason for people), and that is all;
2. writes the pid file (the command's pid, start time and boot id, its own pid and start
   time under ``launcher``, ``agentId`` and ``turn``), fsynced; when it cannot, the command
   is killed and that is recorded as ``notStarted``;
3. prints ``{"pid": N}`` on its stdout (the daemon reads it to know whom to kill), then
   points its stdout and stderr at ``/dev/null``: from then on nothing ties it to the daemon;
4. reads the pipes as data comes (the command never blocks on a full pipe): the first
   ``max_out`` bytes of stdout go to the ``out`` file as they come, the rest is counted and
   dropped; the last ``tail`` bytes of stderr are kept in memory. The disk holds at most
   ``max_out`` bytes of a turn's output whatever the command writes (RLIMIT_FSIZE could
   not do this: it would also cap the files the agent makes in its working directory);
5. once the command has exited (seen without reaping it, so its pid cannot be reused
   meanwhile), kills what it left in its process group, reaps it, reads the pipes up to
   ``drain_s`` more seconds (a process that left the group may hold them open), writes the
   ``err`` file (the stderr tail), then the ``status`` file
   (``{"returncode", "outBytes", "agentId", "turn"}``; a negative return code is the signal
   that killed the command) by an atomic rename: a status file means the turn is over and
   every other file is complete.

Killing the command's process group does not kill this process (it is in a session of its
own): the daemon kills both, the group first.
"""

from __future__ import annotations

import contextlib
import os
import select
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from signal import SIGKILL, SIGPIPE, SIGXFSZ
else:
    # The C module: ``signal`` builds enums when imported, a few ms of every turn's start.
    from _signal import SIGKILL, SIGPIPE, SIGXFSZ

_CHUNK = 65536
_POLL_MS = 50  # how often the command's exit is checked where pidfds do not exist
_FIELDS = (
    "stdin", "out", "err", "status", "pid_file", "agent_id", "turn", "max_out", "tail", "log",
    "log_max",
)  # fmt: skip


def launcher_args(
    *,
    argv: Sequence[str],
    stdin: str,
    out: str,
    err: str,
    status: str,
    pid_file: str,
    agent_id: str,
    turn: int,
    max_out: int,
    tail: int,
    drain_s: float,
    log: str = "",
    log_max: int = 0,
) -> list[str]:
    """The arguments of this script for one turn (see the module docstring)."""
    fields = [stdin, out, err, status, pid_file, agent_id, str(turn), str(max_out), str(tail)]
    fields += [log, str(log_max)]
    return [*fields, repr(float(drain_s)), "--", *argv]


# --- pid files and JSON (also used by the daemon) -------------------------------------------


def start_time(pid: int) -> int | None:
    """Field 22 of ``/proc/<pid>/stat`` (clock ticks since boot), None when unreadable."""
    stat = _stat(pid)
    try:
        return int(stat[19]) if stat else None
    except (IndexError, ValueError):
        return None


def alive(pid: int, started: int | None) -> bool:
    """Whether ``pid`` is a live process (not a zombie) that started at ``started``."""
    stat = _stat(pid)
    if not stat or stat[0] == b"Z":
        return False
    try:
        return started is None or int(stat[19]) == started
    except (IndexError, ValueError):
        return False


def _stat(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/<pid>/stat`` from field 3 (the state) on."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: count after the last ')'.
    return stat[stat.rfind(b")") + 2 :].split()


def boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip() or None
    except OSError:
        return None


def write_pid_file(path: str, pid: int, record: Mapping[str, object]) -> None:
    """Write ``record`` plus the pid, start time and boot id of ``pid`` to ``path``,
    atomically and fsynced (the directory too). Nothing is written when the process cannot
    be looked at (already gone, or no ``/proc``). Raises OSError."""
    start = start_time(pid)
    if start is None:
        return
    data = {**record, "pid": pid, "startTime": start, "bootId": boot_id()}
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        _write_all(fd, dumps(data).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def kill_group(pgid: int) -> bool:
    """SIGKILL process group ``pgid``; False when there is none (or it is not ours)."""
    try:
        os.killpg(pgid, SIGKILL)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def dumps(value: object) -> str:
    """``value`` (None, bools, ints, finite floats, strings, lists, tuples and dicts of them)
    as JSON text that ``json.loads`` reads back equal: ASCII only, every other character
    escaped (lone surrogates too). Raises TypeError for anything else."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float) and value - value == 0:  # finite
        return repr(value)
    if isinstance(value, str):
        return _quote(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{_quote(str(k))}:{dumps(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(dumps(v) for v in value) + "]"
    raise TypeError(f"not JSON: {type(value).__name__}")


def _quote(text: str) -> str:
    parts = ['"']
    for ch in text:
        code = ord(ch)
        if ch in '"\\':
            parts.append("\\" + ch)
        elif 0x20 <= code < 0x7F:
            parts.append(ch)
        elif code > 0xFFFF:
            code -= 0x10000
            parts.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}")
        else:
            parts.append(f"\\u{code:04x}")
    parts.append('"')
    return "".join(parts)


def _write_atomically(path: str, data: bytes) -> None:
    """``path`` holds ``data`` or what it held before, never a part (no fsync: this guards
    against a process dying, not a machine)."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        _write_all(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


# --- the launcher ---------------------------------------------------------------------------


def main(args: list[str]) -> int:
    if len(args) < len(_FIELDS) + 3 or args[len(_FIELDS) + 1] != "--":
        print("usage: _launch.py " + " ".join(_FIELDS) + " drain_s -- argv...", file=sys.stderr)
        return 2
    stdin_path, out_path, err_path, status_path, pid_file, agent_id = args[:6]
    turn, max_out, tail = (int(a) for a in args[6:9])
    log_path, log_max = args[9], int(args[10])
    drain_s = float(args[11])
    argv = args[13:]
    record: dict[str, object] = {"agentId": agent_id, "turn": turn}

    def not_started(message: str, **details: object) -> int:
        body = {"returncode": None, "notStarted": message, "details": details, **record}
        _write_atomically(status_path, dumps(body).encode())
        return 0

    out_fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    log = _Log(log_path, log_max)
    try:
        pid, out_pipe, err_pipe = _spawn(argv, stdin_path)
    except (OSError, ValueError) as exc:
        os.close(out_fd)
        log.close()
        return not_started(
            f"could not start command {argv[0]!r}: {type(exc).__name__}: {exc}", command=argv
        )
    me = {"pid": os.getpid(), "startTime": start_time(os.getpid())}
    try:
        write_pid_file(pid_file, pid, {**record, "launcher": me})
    except OSError as exc:
        kill_group(pid)
        os.waitpid(pid, 0)
        os.close(out_fd)
        log.close()
        return not_started(
            f"could not write the pid file {pid_file!r}: {exc}; the command was killed",
            pid_file=pid_file,
        )
    _announce(pid)
    returncode, out_bytes, err = _collect(
        pid, out_pipe, err_pipe, out_fd, max_out, tail, drain_s, log
    )
    os.close(out_fd)
    log.close()
    _write_atomically(err_path, err)
    body = {"returncode": returncode, "outBytes": out_bytes, "logDropped": log.dropped, **record}
    _write_atomically(status_path, dumps(body).encode())
    return 0


def _spawn(argv: list[str], stdin_path: str) -> tuple[int, int, int]:
    """Start ``argv`` in a session of its own; its pid and the read ends of its stdout and
    stderr pipes. Raises OSError (ValueError for a NUL in an argument)."""
    stdin = os.open(stdin_path, os.O_RDONLY | os.O_CLOEXEC)
    out_r, out_w = os.pipe()  # close-on-exec; dup2 clears it on the child's 1 and 2
    err_r, err_w = os.pipe()
    try:
        pid = os.posix_spawnp(
            argv[0],
            argv,
            os.environ,
            file_actions=[
                (os.POSIX_SPAWN_DUP2, stdin, 0),
                (os.POSIX_SPAWN_DUP2, out_w, 1),
                (os.POSIX_SPAWN_DUP2, err_w, 2),
            ],
            setsid=True,
            # Python ignores these; a command expects the defaults (dying of a closed pipe).
            setsigdef=(SIGPIPE, SIGXFSZ),
        )
    except BaseException:
        for fd in (out_r, err_r):
            os.close(fd)
        raise
    finally:
        for fd in (stdin, out_w, err_w):
            os.close(fd)
    return pid, out_r, err_r


def _announce(pid: int) -> None:
    """Tell the daemon the command's pid, then let go of the daemon's pipes."""
    try:
        _write_all(1, dumps({"pid": pid}).encode() + b"\n")
    except OSError:  # the daemon is gone already (no contextlib here: see the docstring)
        pid = 0
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 1)
    os.dup2(null, 2)
    os.close(null)


class _Log:
    """The turn's log file: what the command writes to stdout and stderr, in the order it
    came, as frames ``o<n>\\n`` or ``e<n>\\n`` followed by ``n`` bytes, up to ``limit``
    bytes of output (the rest is counted in ``dropped``). No path: nothing is written."""

    def __init__(self, path: str, limit: int) -> None:
        self.limit = limit
        self.kept = 0
        self.dropped = 0
        self.fd: int | None = None
        if path and limit > 0:
            # Made anew, never opened as found (a FIFO there would block, a link's target
            # would be emptied); one that cannot be made is no log.
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_NOFOLLOW
            try:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                self.fd = os.open(path, flags | os.O_CLOEXEC, 0o600)
            except OSError:
                self.fd = None

    def write(self, kind: bytes, data: bytes) -> None:
        if self.fd is None:
            return
        room = self.limit - self.kept
        if room < len(data):
            self.dropped += len(data) - max(room, 0)
            data = data[: max(room, 0)]
        if not data:
            return
        try:
            _write_all(self.fd, kind + str(len(data)).encode() + b"\n" + data)
            self.kept += len(data)
        except OSError:  # a full disk: count the rest as dropped
            self.dropped += len(data)
            self.limit = self.kept

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _collect(
    pid: int,
    out_pipe: int,
    err_pipe: int,
    out_fd: int,
    max_out: int,
    tail: int,
    drain_s: float,
    log: _Log,
) -> tuple[int, int, bytes]:
    """Read the command's pipes until it has exited and they are closed (or ``drain_s``
    after its exit); its return code, the bytes of stdout seen, the stderr tail."""
    poller = select.poll()
    pipes = {out_pipe, err_pipe}
    for fd in pipes:
        os.set_blocking(fd, False)
        poller.register(fd, select.POLLIN)
    pidfd = _pidfd(pid)
    if pidfd is not None:
        poller.register(pidfd, select.POLLIN)
    kept = seen = 0
    err = bytearray()
    returncode: int | None = None
    drain_until = 0.0
    while True:
        if returncode is None and _exited(pid):
            kill_group(pid)  # what it left in its group; its zombie holds the group id
            returncode = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            drain_until = time.monotonic() + drain_s
            if pidfd is not None:
                poller.unregister(pidfd)
                os.close(pidfd)
                pidfd = None
        timeout_ms: int | None
        if returncode is not None:
            left = drain_until - time.monotonic()
            if not pipes or left <= 0:
                break
            timeout_ms = max(1, int(left * 1000))
        else:
            timeout_ms = None if pidfd is not None else _POLL_MS
        for fd, _ in poller.poll(timeout_ms):
            if fd not in pipes:
                continue  # the pidfd: the exit is checked above
            try:
                data = os.read(fd, _CHUNK)
            except BlockingIOError:
                continue
            if not data:
                poller.unregister(fd)
                pipes.discard(fd)
                os.close(fd)
            elif fd == err_pipe:
                err += data
                del err[:-tail]
                log.write(b"e", data)
                _touch(out_fd)
            else:
                log.write(b"o", data)
                seen += len(data)
                room = max_out - kept
                if room > 0:
                    try:
                        _write_all(out_fd, data[:room])
                        kept += min(room, len(data))
                    except OSError:
                        max_out = kept  # a full disk: keep what fit, count the rest as dropped
                else:
                    _touch(out_fd)
    for fd in pipes:
        os.close(fd)  # held open by a process outside the group: abandoned
    return returncode, seen, bytes(err)


def _touch(fd: int) -> None:
    """Mark output the out file does not show (stderr, stdout past its cap) in its
    modification time: the out file's mtime is when the command last wrote anything, which
    the daemon's stall watch reads (``_liveness``)."""
    try:  # noqa: SIM105 - no contextlib here (see the module docstring)
        os.utime(fd)
    except OSError:
        pass


def _pidfd(pid: int) -> int | None:
    """A pidfd of ``pid`` (readable once it exits), None where the kernel has none."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _exited(pid: int) -> bool:
    """Whether the child has exited, without reaping it."""
    try:
        found = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return found is not None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
