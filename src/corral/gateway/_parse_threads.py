"""Where SQL analysis runs: a statement of up to :data:`INLINE_CHARS` on the caller's thread, a
longer one on a few threads whose stack holds the deepest parse of the longest statement the
gateway accepts (:data:`MAX_STATEMENT_CHARS`), so no parser can overflow a stack, and the event
loop is not held by a long analysis (docs/architecture.md, "Parse safety")."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Final, TypeVar

__all__ = ["INLINE_CHARS", "MAX_STATEMENT_CHARS", "STACK_BYTES", "off_loop", "on_deep_stack"]

T = TypeVar("T")

# Measured: libpg_query takes at most ~130 bytes of C stack per level of a left-nested
# operator chain ("1+1+1...", 2 characters a level), ~65 bytes per character of SQL; nothing
# measured took more per character. 8,192 characters need under 0.6 MB, well inside any
# thread's stack (glibc's default is 8 MB, 2 MB at the least).
INLINE_CHARS: Final = 8_192
# The longest statement any gateway accepts (its max_statement_chars is at most this): 1e6
# characters need ~65 MB of stack at the measured worst; the threads get twice that.
MAX_STATEMENT_CHARS: Final = 1_000_000
STACK_BYTES: Final = 128 * 1024 * 1024
_THREADS = 2  # the machine's cores rarely pay for more: the GIL holds the Python part

_Job = tuple[Callable[..., Any], tuple[Any, ...], "Future[Any]"]


class _DeepThreads:
    """A few daemon threads with :data:`STACK_BYTES` of stack, started on first use."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._started = False
        self._local = threading.local()

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        if not self._started:
            self._start()
        future: Future[T] = Future()
        self._jobs.put((fn, args, future))
        return future

    def here(self) -> bool:
        """Whether the calling thread is one of these."""
        return bool(getattr(self._local, "deep", False))

    def _start(self) -> None:
        with self._lock:
            if self._started:
                return
            # stack_size applies to threads started after it, process-wide: set, start, restore.
            previous = threading.stack_size(STACK_BYTES)
            try:
                for n in range(_THREADS):
                    name = f"corral-parse-{n}"
                    threading.Thread(target=self._work, name=name, daemon=True).start()
            finally:
                threading.stack_size(previous)
            self._started = True

    def _work(self) -> None:
        self._local.deep = True
        while True:
            fn, args, future = self._jobs.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args)
            except BaseException as exc:  # handed to the waiting caller, raised there
                future.set_exception(exc)
            else:
                future.set_result(result)


_DEEP = _DeepThreads()


def on_deep_stack(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on a deep-stack thread (right here when the caller is one), waiting for
    it; what ``fn`` raises is raised."""
    if _DEEP.here():
        return fn(*args)
    return _DEEP.submit(fn, *args).result()


async def off_loop(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on a deep-stack thread, awaited without holding the event loop. A
    cancelled caller leaves it running to its end (its result is dropped)."""
    return await asyncio.wrap_future(_DEEP.submit(fn, *args))
