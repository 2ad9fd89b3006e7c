"""Process isolation for sandboxed runs: the worker's side and the parent's tools.

The worker caps its own memory and runs agents one at a time, answering each with one message
through a pipe; the parent (``SandboxWorker``) waits on the event loop, kills the worker's
process group and always reaps it, with the helpers here.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import multiprocessing
import os
import pickle
import signal
import threading
import traceback
from collections.abc import Callable
from inspect import isawaitable
from multiprocessing.connection import Connection, wait
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import Any

from corral.kernel import Clock
from corral.resilience._sandbox_types import (
    SandboxAgentError,
    SandboxError,
    SandboxInterruptedError,
    SandboxMemoryError,
    SandboxStartError,
    SandboxTask,
)

try:
    import resource

    HAVE_RLIMIT = True
except ImportError:  # not POSIX: no memory limits
    HAVE_RLIMIT = False

EXIT_GRACE_S = 2.0
"""How long a child that has sent its result may take to exit before it is killed."""

_POLL_S = 0.01
"""Polling period where the event loop cannot watch the child's pipe."""


def agent_callable(agent: Any) -> Callable[[str], Any] | None:
    """The call that runs ``agent``: its ``chat`` method, or the agent itself when callable."""
    chat = getattr(agent, "chat", None)
    if callable(chat):
        return chat  # type: ignore[no-any-return]
    if callable(agent):
        return agent  # type: ignore[no-any-return]
    return None


# --- the child ----------------------------------------------------------------------------


def _limit_memory(max_memory_bytes: int) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = max_memory_bytes if hard == resource.RLIM_INFINITY else min(max_memory_bytes, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


async def _await(value: Any) -> Any:
    return await value


def _error_message(exc: BaseException) -> tuple[str, Any, str, str, str]:
    carried: BaseException | None = exc
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        carried = None
    text = "".join(traceback.format_exception(exc))
    return ("error", carried, type(exc).__qualname__, str(exc), text)


def _end_with_parent(lifeline: Connection) -> None:
    """End this child (its whole process group) once the parent's end of ``lifeline`` closes.

    The parent never writes to the lifeline, so it becomes readable only at end of file: when
    the parent has closed it (the worker is being ended) or by dying. A parent that crashes
    (``kill -9``) so leaves no child running on (the fork server it came from stays up while
    its children do, so the child cannot count on the server's end)."""

    def watch() -> None:
        with contextlib.suppress(Exception):
            lifeline.poll(None)
        if os.getpgrp() == os.getpid():  # never the group it came from: only its own
            with contextlib.suppress(Exception):
                os.killpg(0, signal.SIGKILL)
        os._exit(1)

    threading.Thread(target=watch, name="corral-sandbox-parent", daemon=True).start()


def worker_main(conn: Connection, lifeline: Connection, max_memory_bytes: int) -> None:
    """Entry point of a worker process: runs ``(agent, task)`` messages from ``conn`` one at
    a time, answering each with exactly one message, until ``conn`` closes or it dies.

    A coroutine (or other awaitable) an agent returns is run on the worker's own event loop,
    which lasts as long as the worker; so does every module an agent imports. After a
    ``MemoryError`` the worker stops (the parent ends it)."""
    if hasattr(os, "setpgid"):
        # Its own process group, so the parent can kill whatever the agent started as well.
        with contextlib.suppress(OSError):
            os.setpgid(0, 0)
    _end_with_parent(lifeline)
    try:
        if max_memory_bytes:
            _limit_memory(max_memory_bytes)
    except Exception as exc:
        conn.send(("setup", f"could not set the memory limit: {type(exc).__name__}: {exc}"))
        return
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    while True:
        try:
            agent, task = conn.recv()
        except (EOFError, OSError):
            return  # the parent closed the pipe: the worker is ended
        except BaseException as exc:  # sent whole, but this process cannot unpickle it
            conn.send(_error_message(exc))
            continue
        message = _run_one(loop, agent, task)
        try:
            conn.send(message)
        except Exception as exc:
            conn.send(_error_message(exc) if message[0] != "ok" else _unpicklable_result(exc))
        del agent, task
        if message[0] == "memory":
            return


def _run_one(loop: asyncio.AbstractEventLoop, agent: Any, task: SandboxTask) -> tuple[Any, ...]:
    try:
        call = agent_callable(agent)
        if call is None:
            raise TypeError(f"{agent!r} has no chat(task) method and is not callable")
        result = call(task)
        if isawaitable(result):
            result = loop.run_until_complete(_await(result))
        return ("ok", result)
    except MemoryError as exc:
        return ("memory", f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
    except BaseException as exc:
        return _error_message(exc)


def _unpicklable_result(exc: Exception) -> tuple[str, Any, str, str, str]:
    return (
        "error",
        None,
        type(exc).__qualname__,
        f"the agent's result could not be sent back from the child process: {exc}",
        "",
    )


# --- the parent ---------------------------------------------------------------------------


def context() -> BaseContext:
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


# --- fork servers with modules preloaded ----------------------------------------------------
#
# A child forked from a server that has already imported the agent's heavy modules starts in
# milliseconds instead of importing them again on every run. multiprocessing has one global
# fork server, whose preload list only counts before it starts (and it may have been started
# by anyone): each preload list gets a server of its own here. Its parent side is
# multiprocessing's ForkServer and forkserver Popen, pointed at that server; the child side
# is unchanged (a forked child reads its descriptors from the module-level server, which the
# server process sets for each child it forks).

_servers: dict[tuple[str, ...], Any] = {}
_servers_lock = threading.Lock()


def _server(preload: tuple[str, ...]) -> Any:
    """The fork server (parent side) of the preload list, made on first use."""
    from multiprocessing import forkserver

    with _servers_lock:
        server = _servers.get(preload)
        if server is None:
            server = forkserver.ForkServer()
            server.set_forkserver_preload(list(preload))
            _servers[preload] = server
        return server


def preloaded_process(preload: tuple[str, ...]) -> type[BaseProcess] | None:
    """A Process class whose children fork from a server that imported ``preload``; None
    where there is no fork server (then children are spawned and import what they need)."""
    if _PreloadedProcess is None:
        return None
    _server(preload)
    return _PreloadedProcess


_PreloadedProcess: type[BaseProcess] | None = None
if "forkserver" in multiprocessing.get_all_start_methods():
    from multiprocessing import context as _mp_context
    from multiprocessing import forkserver as _mp_forkserver
    from multiprocessing import popen_forkserver as _mp_popen
    from multiprocessing import reduction as _mp_reduction
    from multiprocessing import spawn as _mp_spawn
    from multiprocessing import util as _mp_util

    class _Popen(_mp_popen.Popen):
        def _launch(self, process_obj: Any) -> None:
            # popen_forkserver.Popen._launch, asking the process's server rather than the
            # global one.
            server = _server(process_obj.preload)
            fds: list[int] = self._fds  # type: ignore[attr-defined]
            prep_data = _mp_spawn.get_preparation_data(process_obj._name)
            buf = io.BytesIO()
            _mp_context.set_spawning_popen(self)
            try:
                _mp_reduction.dump(prep_data, buf)
                _mp_reduction.dump(process_obj, buf)
            finally:
                _mp_context.set_spawning_popen(None)
            self.sentinel, w = server.connect_to_new_process(fds)
            parent_w = os.dup(w)
            close = _mp_util.close_fds  # type: ignore[attr-defined]
            self.finalizer = _mp_util.Finalize(self, close, (parent_w, self.sentinel))
            with open(w, "wb", closefd=True) as f:
                f.write(buf.getbuffer())
            self.pid = _mp_forkserver.read_signed(self.sentinel)

    class _ForkedProcess(_mp_context.ForkServerProcess):
        """A child forked from the server of its ``preload`` list."""

        preload: tuple[str, ...] = ()

        @staticmethod
        def _Popen(process_obj: Any) -> Any:
            return _Popen(process_obj)

    _PreloadedProcess = _ForkedProcess


def kill(process: BaseProcess) -> None:
    pid = process.pid
    if pid is not None and hasattr(os, "killpg"):
        # The group exists once the child has called setpgid; before that this finds nothing.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        process.kill()


async def readable(fd: int, clock: Clock, timeout_s: float | None) -> bool:
    """Wait until ``fd`` is readable (True) or ``timeout_s`` passes on ``clock`` (False)."""
    loop = asyncio.get_running_loop()
    outcome: asyncio.Future[bool] = loop.create_future()

    def settle(value: bool) -> None:
        if not outcome.done():
            outcome.set_result(value)

    try:
        loop.add_reader(fd, settle, True)
    except NotImplementedError:
        return await _poll_readable(fd, clock, timeout_s)
    timer = None if timeout_s is None else clock.call_later(timeout_s, lambda: settle(False))
    try:
        return await outcome
    finally:
        loop.remove_reader(fd)
        if timer is not None:
            timer.cancel()


async def _poll_readable(fd: int, clock: Clock, timeout_s: float | None) -> bool:
    # For event loops that cannot watch a descriptor (the Windows proactor): poll it.
    deadline = None if timeout_s is None else clock.monotonic() + timeout_s
    while not wait([fd], timeout=0):
        if deadline is not None and clock.monotonic() >= deadline:
            return False
        await asyncio.sleep(_POLL_S)
    return True


async def reap(process: BaseProcess, clock: Clock, grace_s: float) -> None:
    """Wait up to ``grace_s`` for the child to exit, kill it if it has not, and reap it."""
    if process.exitcode is None and not await readable(process.sentinel, clock, grace_s):
        kill(process)
    if process.exitcode is None:
        await readable(process.sentinel, clock, None)
    process.join()


async def start(process: BaseProcess) -> None:
    # Starting may wait for a fresh forkserver to boot: do it off the event loop. The start
    # cannot be abandoned half-way, so on cancellation it is finished, then the child killed.
    starting = asyncio.ensure_future(asyncio.to_thread(process.start))
    try:
        await asyncio.shield(starting)
    except asyncio.CancelledError:

        def stop(done: asyncio.Future[None]) -> None:
            if not done.cancelled() and done.exception() is None:
                kill(process)
                process.join()

        starting.add_done_callback(stop)
        raise


def receive(reader: Connection) -> Any:
    """The child's message; None when it ended without one."""
    try:
        return reader.recv()
    except (EOFError, OSError):
        return None
    except Exception as exc:  # sent whole, but this process cannot unpickle it
        return (
            "error",
            None,
            type(exc).__qualname__,
            f"the child's answer could not be read in this process: {exc}",
            "",
        )


def outcome(
    message: Any, process: BaseProcess, max_memory_bytes: int
) -> tuple[bool, Any, SandboxError | None]:
    pid = process.pid
    if message is None:
        code = process.exitcode
        if code is not None and code < 0:
            try:
                how = f"signal {signal.Signals(-code).name}"
            except ValueError:
                how = f"signal {-code}"
        else:
            how = f"exit code {code}"
        limit = f" (memory limit {max_memory_bytes} bytes)" if max_memory_bytes else ""
        why = f"child process {pid} ended by {how} before it sent a result{limit}"
        return False, None, SandboxInterruptedError(why, pid=pid, exitcode=code)
    kind = message[0]
    if kind == "ok":
        return True, message[1], None
    if kind == "memory":
        if max_memory_bytes:
            return False, None, SandboxMemoryError(max_memory_bytes, message[1], pid)
        return False, None, SandboxAgentError("MemoryError", message[1])
    if kind == "setup":
        return False, None, SandboxStartError(message[1])
    _, carried, error_type, error_message, text = message
    error = SandboxAgentError(error_type, error_message, text)
    error.__cause__ = carried
    return False, None, error
