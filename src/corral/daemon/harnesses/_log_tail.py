"""Following a command turn's log file (written by the launcher, ``_launch._Log``) while the
turn runs, and handing what it holds to the turn's :class:`~._base.TurnOutput`.

The launcher outlives the daemon, so it cannot write to the daemon; it writes frames
(``o<n>\\n`` or ``e<n>\\n`` then ``n`` bytes of stdout or stderr) to ``turn-<n>.log``, capped
at the turn's log size, and this reads the file every ``every_s`` seconds from where it left
off. A frame still being written is read at the next look.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

from corral.daemon.harnesses._base import TurnOutput

_STREAMS = {ord("o"): "stdout", ord("e"): "stderr"}
_READ = 1 << 20  # at most this much per look: a big backlog is read over a few looks
_HEADER = 24  # a frame header is a letter, at most 20 digits and a newline


class LogTail:
    """What is new in ``path`` goes to ``out`` (see the module docstring)."""

    def __init__(self, path: Path, out: TurnOutput) -> None:
        self.path = path
        self.out = out
        self.offset = 0
        self.pending = bytearray()
        self.broken = False

    def poll(self, *, until_end: bool = False) -> None:
        """Read what was added since the last look (all of it with ``until_end``)."""
        if self.broken:
            return
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                while True:
                    data = f.read(_READ)
                    self.offset += len(data)
                    self.pending += data
                    self._frames()
                    if not until_end or len(data) < _READ or self.broken:
                        return
        except OSError:
            return

    def _frames(self) -> None:
        buf = self.pending
        while buf:
            nl = buf.find(b"\n", 0, _HEADER)
            if nl < 0:
                if len(buf) >= _HEADER:
                    self.broken = True  # not our file: stop reading it
                return
            stream = _STREAMS.get(buf[0])
            size = buf[1:nl]
            if stream is None or not size.isdigit():
                self.broken = True
                return
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
