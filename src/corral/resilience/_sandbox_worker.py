"""``SandboxWorker``: a child process kept between sandboxed runs, one run at a time.

``run_sandboxed(isolation="process")`` uses one for a single run; a caller that runs the same
agent again and again (the daemon's python harness) keeps one per agent, so a run is a message
over a pipe rather than a fork.
"""

from __future__ import annotations

import asyncio
import contextlib
import pickle
from collections.abc import Sequence
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from corral.kernel import SYSTEM_CLOCK, Clock, InvalidArgumentError
from corral.kernel import _validate as v
from corral.resilience import _sandbox_process as proc
from corral.resilience._sandbox_types import (
    SandboxError,
    SandboxResult,
    SandboxStartError,
    SandboxTask,
    SandboxTimeoutError,
)


class SandboxWorker:
    """A worker process that runs agent tasks one at a time and is kept between them.

    The process starts at the first :meth:`run` (forked from the fork server of ``preload``
    when there is one), in a process group of its own, under an address-space limit of
    ``max_memory_bytes`` (0: none) that holds for its whole life. Each run sends the agent and
    its task over a pipe; the worker calls the agent (a coroutine it returns is run on the
    worker's own event loop, which lasts as long as the worker: tasks an agent leaves on it
    run only during later runs) and answers. Modules an agent imports, and anything they
    keep, stay in the worker for its later runs.

    A run that completes, or whose agent raises, leaves the worker up. A timeout, a cancelled
    run, the memory limit, or a worker that dies (``os._exit``, a signal) ends the worker: its
    process group is killed and reaped, :attr:`ended` becomes True and later runs fail with
    ``sandbox_start_failed``; start another worker. :meth:`close` ends it on purpose. When
    this process dies, the worker ends by itself (it watches a pipe this process never
    writes to).
    """

    def __init__(
        self,
        *,
        max_memory_bytes: int = 0,
        preload: Sequence[str] = (),
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        where = "SandboxWorker"
        v.non_negative_int(where, "max_memory_bytes", max_memory_bytes)
        if isinstance(preload, str) or not all(isinstance(n, str) and n for n in preload):
            raise InvalidArgumentError(where, "preload", "a sequence of module names", preload)
        v.instance_of(where, "clock", clock, Clock)
        self.max_memory_bytes = max_memory_bytes
        self.preload = tuple(preload)
        self.clock = clock
        self._process: BaseProcess | None = None
        self._conn: Connection | None = None
        self._lifeline: Connection | None = None
        self._ended = False
        self._lock = asyncio.Lock()

    def __repr__(self) -> str:
        state = "ended" if self._ended else "not started" if self._process is None else "up"
        return f"SandboxWorker(pid={self.pid}, {state})"

    @property
    def pid(self) -> int | None:
        """The worker process's pid, once started."""
        return None if self._process is None else self._process.pid

    @property
    def ended(self) -> bool:
        """True once the worker has ended (killed, dead or closed): it runs nothing more."""
        return self._ended

    @property
    def busy(self) -> bool:
        """True while a run is in progress (or waiting for one to finish)."""
        return self._lock.locked()

    async def run(self, agent: Any, task: str, *, timeout_s: float) -> SandboxResult[Any]:
        """Run ``agent`` on ``task`` in the worker and say how it went; never raises for the run.

        ``agent`` is an object with a ``chat(task)`` method or a callable, and must pickle;
        ``task`` a ``str`` (a :class:`SandboxTask` keeps its marks). The results and errors
        are :func:`run_sandboxed`'s for ``isolation="process"``; ``timeout_s`` counts from the
        moment the task is handed to a started worker. Runs on one worker wait for each
        other. Only cancellation propagates (the worker is then killed)."""
        where = "SandboxWorker.run"
        if proc.agent_callable(agent) is None:
            raise InvalidArgumentError(
                where, "agent", "an object with a chat(task) method, or a callable", agent
            )
        v.instance_of(where, "task", task, str)
        v.positive_number(where, "timeout_s", timeout_s)
        marked = task if isinstance(task, SandboxTask) else SandboxTask(task)
        async with self._lock:
            started = self.clock.monotonic()
            completed, result, error = await self._run(agent, marked, timeout_s)
        return SandboxResult(
            result=result if completed else None,
            completed=completed,
            duration_s=self.clock.monotonic() - started,
            error=error,
        )

    def kill(self) -> None:
        """Kill the worker's process group now, without waiting; a run in progress fails
        (the worker died) and :meth:`close` reaps it."""
        if self._process is not None and not self._ended:
            proc.kill(self._process)

    async def close(self) -> None:
        """End the worker (waiting for a run in progress to finish) and reap it. Safe to call
        more than once, and on a worker never started."""
        async with self._lock:
            await self._end(kill=True)

    # --- inside ---------------------------------------------------------------------------

    async def _run(
        self, agent: Any, task: SandboxTask, timeout_s: float
    ) -> tuple[bool, Any, SandboxError | None]:
        if self.max_memory_bytes and not proc.HAVE_RLIMIT:
            return False, None, SandboxStartError("memory limits need a POSIX system")
        if self._ended:
            return False, None, SandboxStartError("the worker process has ended; start another")
        try:
            payload = pickle.dumps((agent, task))
        except Exception as exc:
            return (
                False,
                None,
                SandboxStartError(
                    "isolation='process' needs an agent that can be pickled (define its class "
                    f"or function at module level): {type(exc).__name__}: {exc}"
                ),
            )
        if self._process is None:
            failed = await self._start()
            if failed is not None:
                return False, None, failed
        process, conn = self._process, self._conn
        assert process is not None
        assert conn is not None
        try:
            try:
                conn.send_bytes(payload)
            except OSError:
                message = None  # it died between runs: say how
            else:
                started = self.clock.monotonic()
                if not await proc.readable(conn.fileno(), self.clock, timeout_s):
                    await self._end(kill=True)
                    elapsed = self.clock.monotonic() - started
                    return False, None, SandboxTimeoutError(timeout_s, elapsed, process.pid)
                message = proc.receive(conn)
        except asyncio.CancelledError:
            self._end_now()
            raise
        if message is None or message[0] in ("memory", "setup"):
            # Dead, over its limit (it stops after saying so) or never set up: end it.
            await self._end(kill=message is not None and message[0] == "memory")
        return proc.outcome(message, process, self.max_memory_bytes)

    async def _start(self) -> SandboxError | None:
        context = proc.context()
        # Tasks and answers go over ``conn``; the worker watches ``lifeline``, which this
        # process never writes, for this process's going away (see _end_with_parent).
        conn, child_conn = context.Pipe(duplex=True)
        lifeline_r, lifeline_w = context.Pipe(duplex=False)
        preloaded = proc.preloaded_process(self.preload) if self.preload else None
        process = (preloaded or context.Process)(  # type: ignore[attr-defined]
            target=proc.worker_main,
            args=(child_conn, lifeline_r, self.max_memory_bytes),
            name="corral-sandbox",
            daemon=True,
        )
        if preloaded is not None:
            process.preload = self.preload  # type: ignore[union-attr]
        self._process, self._conn, self._lifeline = process, conn, lifeline_w
        try:
            try:
                await proc.start(process)
            finally:
                child_conn.close()  # the worker holds its own copies
                lifeline_r.close()
        except asyncio.CancelledError:
            self._close_pipes()
            self._ended = True
            raise
        except Exception as exc:
            self._close_pipes()
            self._ended = True
            return SandboxStartError(f"the child process did not start: {exc}")
        return None

    def _close_pipes(self) -> None:
        for pipe in (self._conn, self._lifeline):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        self._conn = self._lifeline = None

    async def _end(self, *, kill: bool) -> None:
        """Close the pipes (the worker ends itself on that), kill it when asked, reap it."""
        if self._ended:
            return
        self._ended = True
        self._close_pipes()
        process = self._process
        if process is None:
            return
        if kill:
            proc.kill(process)
        await proc.reap(process, self.clock, proc.EXIT_GRACE_S)

    def _end_now(self) -> None:
        # Cancelled: no awaiting; kill and reap at once (a killed process exits promptly).
        if self._ended:
            return
        self._ended = True
        self._close_pipes()
        if self._process is not None:
            proc.kill(self._process)
            self._process.join()
