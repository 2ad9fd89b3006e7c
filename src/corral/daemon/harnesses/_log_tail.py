"""Following a command turn's log file (written by the launcher, ``_launch._Log``) while the
turn runs, and handing what it holds to the turn's :class:`~._base.TurnOutput`.

The launcher outlives the daemon, so it cannot write to the daemon; it writes frames
(``o<n>\\n`` or ``e<n>\\n`` then ``n`` bytes of stdout or stderr) to ``turn-<n>.log``, capped
at the turn's log size, and this reads the file every ``every_s`` seconds from where it left
off. A frame still being written is read at the next look.

A ``python`` turn's worker writes the same frames (see ``_python_log``), with more streams
and a closing ``d<count>\\n`` frame (no body) counting what it dropped; its tail is given
those streams, ``counts=True`` and ``max_bytes``: the agent's own code could write to that
file, so no more than ``max_bytes`` of it is read, the rest counted as dropped.

The agent's code runs as the daemon's user and can replace the file: the daemon opens it
without following a symbolic link and without blocking, and reads it only when it is a
regular file (a FIFO put there would block the event loop, a link would read another file).
A ``command`` turn's tail is bounded as well (:func:`read_bound`): its command can append to
the file, and a forged frame header claiming gigabytes must not be buffered while waiting for
its end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import stat
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

from corral.daemon.harnesses._base import TurnOutput

_STREAMS = {ord("o"): "stdout", ord("e"): "stderr"}
_DROPPED = ord("d")
_READ = 1 << 20  # at most this much per look: a big backlog is read over a few looks
_HEADER = 24  # a frame header is a letter, at most 20 digits and a newline
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC


def read_bound(log_bytes: int) -> int:
    """How much of a turn's log file is read when its writer keeps ``log_bytes`` of text:
    frames cost a few bytes each (at worst a header per byte of text), so a writer keeping
    to its cap never reaches this."""
    return 5 * log_bytes + (1 << 16)


class LogTail:
    """What is new in ``path`` goes to ``out`` (see the module docstring)."""

    def __init__(
        self,
        path: Path,
        out: TurnOutput,
        *,
        streams: Mapping[int, str] = _STREAMS,
        counts: bool = False,
        max_bytes: int | None = None,
    ) -> None:
        self.path = path
        self.out = out
        self.streams = streams
        self.counts = counts
        self.max_bytes = max_bytes
        self.offset = 0
        self.pending = bytearray()
        self.broken = False

    def poll(self, *, until_end: bool = False) -> None:
        """Read what was added since the last look (all of it with ``until_end``)."""
        if self.broken:
            return
        try:
            found = os.lstat(self.path)
        except OSError:
            return  # not there yet
        if stat.S_ISREG(found.st_mode) and found.st_size <= self.offset:
            return  # nothing new: one system call, not five (a turn is looked at often)
        try:
            fd = os.open(self.path, _OPEN_FLAGS)
        except OSError:
            return  # not there yet (or a link: ELOOP, read as nothing)
        try:
            with open(fd, "rb") as f:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    self.broken = True  # a FIFO, a device: not the file the writer makes
                    return
                f.seek(self.offset)
                while True:
                    want = _READ
                    if self.max_bytes is not None:
                        want = min(want, self.max_bytes - self.offset)
                        if want <= 0:
                            self._over()
                            return
                    data = f.read(want)
                    self.offset += len(data)
                    self.pending += data
                    self._frames()
                    if not until_end or len(data) < want or self.broken:
                        return
        except OSError:
            return

    def _over(self) -> None:
        """Past ``max_bytes``: what else the file holds is counted as dropped, once."""
        self.broken = True
        with contextlib.suppress(OSError):
            size = self.path.stat().st_size
            self.out.add_dropped(max(0, size - self.offset) + len(self.pending))
        self.pending.clear()

    def _frames(self) -> None:
        buf = self.pending
        while buf:
            nl = buf.find(b"\n", 0, _HEADER)
            if nl < 0:
                if len(buf) >= _HEADER:
                    self.broken = True  # not our file: stop reading it
                return
            stream = self.streams.get(buf[0])
            size = buf[1:nl]
            counted = self.counts and buf[0] == _DROPPED
            if not size.isdigit() or (stream is None and not counted):
                self.broken = True
                return
            if counted:  # what the writer dropped: a count, no body
                self.out.add_dropped(int(size))
                del buf[: nl + 1]
                continue
            assert stream is not None
            end = nl + 1 + int(size)
            if len(buf) < end:
                return
            self.out.write(stream, bytes(buf[nl + 1 : end]))
            del buf[:end]

    def finish(self, status: Path) -> None:
        """The turn is over: read the rest, and count what the launcher dropped (its status
        file's ``logDropped``)."""
        self.poll(until_end=True)
        try:
            with open(status, "rb") as f:
                found = json.loads(f.read(1 << 20))
        except (OSError, ValueError):
            return
        dropped = found.get("logDropped") if isinstance(found, dict) else None
        if isinstance(dropped, int) and not isinstance(dropped, bool):
            self.out.add_dropped(dropped)

    async def follow(self, every_s: float) -> None:
        """Look every ``every_s`` seconds until cancelled."""
        while True:
            self.poll()
            await asyncio.sleep(every_s)


@contextlib.asynccontextmanager
async def following(tail: LogTail | None, every_s: float) -> AsyncIterator[None]:
    """Follow ``tail`` (when there is one) while the body runs."""
    if tail is None:
        yield
        return
    task = asyncio.ensure_future(tail.follow(every_s))
    try:
        yield
    finally:
        task.cancel()  # not awaited: a cancellation of the caller must go through as is
