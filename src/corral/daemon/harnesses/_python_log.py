"""A ``python`` turn's log: what the function prints and logs in its worker process, sent to
the daemon while the turn runs.

The worker's side (:func:`capturing`): for the turn's length, what the function writes to
``sys.stdout`` and ``sys.stderr`` and the ``logging`` records it emits (one line each,
``LEVEL logger: message``, a traceback after it when there is one) go to the agent's log file
``python-turn.log`` in its state directory (made empty by the daemon at each turn's start and
end, and kept between turns: see ``_state_files``), as frames like the command launcher's
(``o<n>\\n``, ``e<n>\\n``, ``l<n>\\n``, ``m<n>\\n``, ``t<n>\\n`` then ``n`` bytes: stdout,
stderr, log, model, tool), at most the turn's log size of text; the rest is counted and said
at the end of the turn in a frame ``d<count>\\n`` (no body). Model and tool calls go there too
when the function's agent loop carries :meth:`TurnContext.call_log`'s middleware.

The daemon's side reads the file as it grows (``_log_tail.LogTail``, every ``LOG_POLL_S``),
so ``corral logs --follow`` sees the lines while the turn runs, and into the turn's capped
:class:`~._base.TurnOutput`. The frames name only those five streams: nothing the function
writes, to the file or otherwise, reaches the ``corral`` stream or another agent's log (what
its own code writes to the file directly once its turn is over reaches at most one of its
agent's later turns), and the daemon reads at most a bounded amount of the file whatever is in
it.

Routing: ``sys.stdout`` and ``sys.stderr`` are replaced once per worker by proxies that send
what is written to the turn being captured -- the one in the writer's context (a contextvar,
so concurrent turns in one process would each get their own) or else the one the process is
running (a worker runs one turn at a time, and threads the function starts do not inherit
its context) -- and to the original stream when no turn is. Output written to file
descriptors 1 and 2 directly (a subprocess, C code) does not go through them and is not
captured.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

LOG_FILE = "python-turn.log"

LOG_POLL_S = 0.1
"""How often the daemon reads a running turn's log file for new lines."""

STREAMS = {
    ord("o"): "stdout",
    ord("e"): "stderr",
    ord("l"): "log",
    ord("m"): "model",
    ord("t"): "tool",
}
"""The frames a python turn's log file may hold (the ``corral`` stream is not among them)."""

_LETTERS = {name: chr(letter).encode() for letter, name in STREAMS.items()}
_FLUSH_BYTES = 64 * 1024  # buffered text is written out at a newline or past this size


def log_path(state_dir: Path) -> Path:
    """The agent's turn log file: one per agent, its turns one after the other."""
    return state_dir / LOG_FILE


class TurnCapture:
    """One turn's log file in the worker: frames, at most ``cap`` bytes of text (the rest
    counted in :attr:`dropped`). Thread-safe; never raises on write."""

    def __init__(self, path: Path, cap: int) -> None:
        self.cap = cap
        self.kept = 0
        self.dropped = 0
        self.closed = False
        self._pending: list[tuple[bytes, bytes]] = []
        self._pending_bytes = 0
        self._lock = threading.Lock()
        self._fd: int | None = None
        with contextlib.suppress(OSError):
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)

    def write(self, stream: str, data: bytes | str) -> None:
        """Take ``data`` of ``stream`` (``stdout``, ``stderr``, ``log``, ``model``, ``tool``;
        another name counts as ``log``)."""
        raw = data.encode("utf-8", "replace") if isinstance(data, str) else bytes(data)
        if not raw:
            return
        letter = _LETTERS.get(stream, b"l")
        with self._lock:
            if self.closed or self._fd is None:
                self.dropped += len(raw)
                return
            room = self.cap - self.kept - self._pending_bytes
            if room < len(raw):
                self.dropped += len(raw) - max(room, 0)
                raw = raw[: max(room, 0)]
            if raw:
                if self._pending and self._pending[-1][0] == letter:
                    self._pending[-1] = (letter, self._pending[-1][1] + raw)
                else:
                    self._pending.append((letter, raw))
                self._pending_bytes += len(raw)
            if b"\n" in raw or self._pending_bytes >= _FLUSH_BYTES or room <= len(raw):
                self._flush()

    def add_dropped(self, count: int) -> None:
        if count > 0:
            with self._lock:
                self.dropped += count

    def flush(self) -> None:
        with self._lock:
            self._flush()

    def close(self) -> None:
        """Write what is buffered and the dropped count; later writes are dropped (not
        counted: the turn is over)."""
        with self._lock:
            if self.closed:
                return
            self._flush()
            if self.dropped and self._fd is not None:
                self._write_frame(b"d" + str(self.dropped).encode() + b"\n")
            self.closed = True
            if self._fd is not None:
                with contextlib.suppress(OSError):
                    os.close(self._fd)
                self._fd = None

    def _flush(self) -> None:
        pending, self._pending, self._pending_bytes = self._pending, [], 0
        for letter, raw in pending:
            if self._write_frame(letter + str(len(raw)).encode() + b"\n" + raw):
                self.kept += len(raw)
            else:
                self.dropped += len(raw)

    def _write_frame(self, frame: bytes) -> bool:
        if self._fd is None:
            return False
        try:
            view = memoryview(frame)
            while view:
                view = view[os.write(self._fd, view) :]
        except OSError:  # a full disk: nothing more goes to the file
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
            return False
        return True


# --- routing -------------------------------------------------------------------------------

_current: contextvars.ContextVar[TurnCapture | None] = contextvars.ContextVar(
    "corral_python_turn_capture", default=None
)
_running: TurnCapture | None = None  # the turn this worker runs now (one at a time)


def current() -> TurnCapture | None:
    """The capture of the turn the caller belongs to, or None (see the module docstring)."""
    found = _current.get()
    if found is not None and not found.closed:
        return found
    running = _running
    if running is not None and not running.closed:
        return running
    return None


class _Proxy:
    """``sys.stdout`` or ``sys.stderr`` in a worker: to the turn's capture, else the original."""

    def __init__(self, stream: str, original: TextIO) -> None:
        self._corral_stream = stream
        self._corral_original = original

    def write(self, text: str) -> int:
        capture = current()
        if capture is None:
            return self._corral_original.write(text)
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        capture.write(self._corral_stream, text)
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        capture = current()
        if capture is None:
            self._corral_original.flush()
        else:
            capture.flush()

    def isatty(self) -> bool:
        return False if current() is not None else self._corral_original.isatty()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._corral_original, name)


class _Handler(logging.Handler):
    """Each log record to the turn's capture, one line ``LEVEL logger: message``."""

    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        capture = current()
        if capture is None:
            return
        try:
            text = self.format(record)
        except Exception:
            text = f"{record.levelname} {record.name}: {record.msg!r} (could not be formatted)"
        capture.write("log", text + "\n")


_handler = _Handler()
_install_lock = threading.Lock()


def _install() -> None:
    with _install_lock:
        if not isinstance(sys.stdout, _Proxy):
            sys.stdout = _Proxy("stdout", sys.stdout)
        if not isinstance(sys.stderr, _Proxy):
            sys.stderr = _Proxy("stderr", sys.stderr)
        root = logging.getLogger()
        if _handler not in root.handlers:
            root.addHandler(_handler)


@contextlib.contextmanager
def capturing(path: Path | None, cap: int) -> Iterator[TurnCapture | None]:
    """Capture the turn's prints and log records into ``path`` (see the module docstring)
    while the body runs; nothing when ``path`` is None.

    While a turn is captured, the root logger lets ``INFO`` records through when it is at
    its default (``WARNING``, no handler of the function's own), so ``logger.info`` is seen
    without configuring logging; the function's own configuration is left as it is."""
    global _running
    if path is None:
        yield None
        return
    _install()
    capture = TurnCapture(path, cap)
    token = _current.set(capture)
    previous, _running = _running, capture
    root = logging.getLogger()
    lowered = root.level == logging.WARNING and root.handlers == [_handler]
    if lowered:
        root.setLevel(logging.INFO)
    try:
        yield capture
    finally:
        if lowered and root.level == logging.INFO:
            root.setLevel(logging.WARNING)
        _running = previous
        with contextlib.suppress(ValueError):  # reset in another context (a generator's)
            _current.reset(token)
        capture.close()


class Routed:
    """A :class:`~._base.TurnOutput` writing to whichever turn is captured in this process
    (for :meth:`TurnContext.call_log`'s middleware); nothing when none is."""

    def write(self, stream: str, data: bytes | str) -> None:
        capture = current()
        if capture is not None:
            capture.write(stream, data)

    def add_dropped(self, count: int) -> None:
        capture = current()
        if capture is not None:
            capture.add_dropped(count)
