"""A turn's log: what its agent printed and logged, capped per turn, and a live fan-out of it.

A harness hands the daemon what a turn produces as it comes (:class:`TurnLog`'s
:meth:`~TurnLog.write`: a stream name and bytes or text). The log cuts it into lines per
stream (a line longer than :data:`MAX_LINE_BYTES` is cut there too), keeps lines until the
turn's cap (``turn_log_bytes``, the daemon's ``--turn-log-bytes``; default 1 MiB) and counts
the rest as dropped; a finished log ends with a marker line naming how many bytes were
dropped. Each kept line also goes to :class:`LogFanout`, where ``GET
/agents/{id}/logs?follow=true`` readers wait for it.

Streams: ``stdout`` and ``stderr`` (a ``command`` agent), ``log`` (a ``python`` agent's log
records), ``model`` and ``tool`` (an ``openai`` agent's calls), ``corral`` (the daemon's own
markers).

Stored, a log is a list of entries ``{"stream", "text"}``: consecutive lines of one stream are
one entry (``text`` holds them with their newlines), so the stored size follows the bytes
kept, not the number of lines. At most ``cap // 64`` entries are kept (a command switching
between stdout and stderr at every byte must not make a million rows of overhead); past
that, lines are dropped and counted as well.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncGenerator, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from corral.daemon._text import escape

DEFAULT_TURN_LOG_BYTES = 1024 * 1024
"""A turn's log is kept up to this many bytes unless the daemon is told otherwise."""

MAX_LINE_BYTES = 16 * 1024
"""A line longer than this is cut (the rest goes on as the next line)."""

STREAMS = frozenset({"stdout", "stderr", "log", "model", "tool", "corral"})

SUBSCRIBER_LINES = 1000
"""A follower that falls this many lines behind loses the next ones (it is told how many)."""

SUBSCRIBER_CHARS = 1024 * 1024
"""... or this many characters of text behind (a line may be :data:`MAX_LINE_BYTES` long:
lines alone would let each stalled reader hold 16 MB)."""

_ENTRY_BYTES = 64  # the cap allows one entry per this many bytes


def dropped_marker(dropped: int, cap: int) -> str:
    return f"[corral: the turn's log was capped at {cap} bytes: dropped {dropped} more bytes]\n"


@dataclass(slots=True)
class TurnLog:
    """The capped log of one turn (see the module docstring). Not thread-safe: written and
    read on the event loop."""

    agent_id: str
    turn: int
    cap: int = DEFAULT_TURN_LOG_BYTES
    fanout: LogFanout | None = None
    entries: list[list[str]] = field(default_factory=list)
    kept: int = 0
    dropped: int = 0
    lines: int = 0
    _partial: dict[str, bytearray] = field(default_factory=dict)
    _capped_said: bool = False
    closed: bool = False

    def write(self, stream: str, data: bytes | str) -> None:
        """Take what ``stream`` produced: complete lines are kept (or counted as dropped);
        an unfinished line waits for its end (or :meth:`close`)."""
        if self.closed:
            return
        raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
        if not raw:
            return
        if stream not in STREAMS:
            stream = "log"
        if self._full():
            self._drop(len(raw))
            return
        buf = self._partial.setdefault(stream, bytearray())
        buf += raw
        while True:
            cut = buf.find(b"\n")
            if cut < 0 and len(buf) < MAX_LINE_BYTES:
                break
            end = cut + 1 if 0 <= cut < MAX_LINE_BYTES else MAX_LINE_BYTES
            line = bytes(buf[:end])
            del buf[:end]
            self._line(stream, line)
            if self._full():
                self._drop(len(buf))
                buf.clear()
                break

    def add_dropped(self, count: int) -> None:
        """Count ``count`` bytes the harness dropped before they reached the log (a command
        turn's launcher caps its file at the same size)."""
        if count > 0:
            self.dropped += count

    def close(self) -> None:
        """The turn is over: unfinished lines are kept as lines, then the marker."""
        if self.closed:
            return
        for stream, buf in list(self._partial.items()):
            if buf:
                if self._full():
                    self._drop(len(buf))
                else:
                    self._line(stream, bytes(buf))
        self._partial.clear()
        self.closed = True
        if self.dropped:
            self._append("corral", dropped_marker(self.dropped, self.cap), counted=False)

    def snapshot(self) -> list[dict[str, str]]:
        return [{"stream": s, "text": t} for s, t in self.entries]

    def _full(self) -> bool:
        return self.kept >= self.cap or len(self.entries) >= max(8, self.cap // _ENTRY_BYTES)

    def _drop(self, count: int) -> None:
        self.dropped += count
        if not self._capped_said and self.fanout is not None:
            self._capped_said = True
            text = f"[corral: the turn's log reached its cap of {self.cap} bytes]\n"
            self.fanout.publish(
                self.agent_id, {"turn": self.turn, "stream": "corral", "text": text}
            )

    def _line(self, stream: str, line: bytes) -> None:
        room = self.cap - self.kept
        if len(line) > room:
            self._drop(len(line) - room)
            line = line[:room]
        if not line:
            return
        text = escape(line.decode("utf-8", errors="replace"))
        self._append(stream, text, counted=True, size=len(line))

    def _append(self, stream: str, text: str, *, counted: bool, size: int = 0) -> None:
        if counted:
            self.kept += size
        self.lines += 1
        if self.entries and self.entries[-1][0] == stream and self.entries[-1][1].endswith("\n"):
            self.entries[-1][1] += text
        else:
            self.entries.append([stream, text])
        if self.fanout is not None:
            self.fanout.publish(self.agent_id, {"turn": self.turn, "stream": stream, "text": text})


def lines_of(entries: Iterable[Mapping[str, Any]], turn: int | None = None) -> list[dict[str, Any]]:
    """The stored entries as lines ``{"stream", "text"}`` (``text`` without its newline),
    each with ``turn`` when given."""
    found: list[dict[str, Any]] = []
    for entry in entries:
        stream, text = str(entry.get("stream", "log")), str(entry.get("text", ""))
        for line in text.splitlines():
            item: dict[str, Any] = {"stream": stream, "text": line}
            if turn is not None:
                item = {"turn": turn, **item}
            found.append(item)
    return found


# --- the live fan-out ------------------------------------------------------------------------


class _Follower:
    """One reader of an agent's live lines: a bounded queue that never blocks the writer."""

    __slots__ = ("agent_id", "dropped", "ended", "items", "size", "wake")

    def __init__(self, agent_id: str) -> None:
        self.agent_id = agent_id
        self.items: deque[dict[str, Any]] = deque()
        self.size = 0  # characters of text held in items
        self.dropped = 0
        self.ended = False
        self.wake = asyncio.Event()

    def put(self, item: dict[str, Any]) -> None:
        size = len(str(item.get("text", "")))
        if len(self.items) >= SUBSCRIBER_LINES or self.size + size > SUBSCRIBER_CHARS:
            self.dropped += 1
            return
        if self.dropped:
            self.items.append(_lagged(self.dropped))
            self.dropped = 0
        self.items.append(item)
        self.size += size
        self.wake.set()

    def take(self) -> dict[str, Any]:
        item = self.items.popleft()
        self.size -= len(str(item.get("text", "")))
        return item

    def end(self) -> None:
        self.ended = True
        self.wake.set()


def _lagged(count: int) -> dict[str, Any]:
    text = f"[corral: this reader fell behind: {count} lines were not sent to it]"
    return {"stream": "corral", "text": text + "\n", "lagged": count}


class LogFanout:
    """Each agent's live lines to whoever follows them.

    :meth:`publish` never waits and never grows memory without bound: each follower holds at
    most :data:`SUBSCRIBER_LINES` lines and :data:`SUBSCRIBER_CHARS` characters; past that it
    misses lines and is told how many when it catches up. :meth:`end` ends an agent's
    followers (the agent ended); :meth:`close` ends all of them.
    """

    def __init__(self) -> None:
        self._followers: dict[str, set[_Follower]] = {}

    @property
    def followers(self) -> int:
        return sum(len(f) for f in self._followers.values())

    def publish(self, agent_id: str, item: dict[str, Any]) -> None:
        for follower in self._followers.get(agent_id, ()):
            follower.put(item)

    def end(self, agent_id: str) -> None:
        for follower in self._followers.pop(agent_id, set()):
            follower.end()

    def close(self) -> None:
        for agent_id in list(self._followers):
            self.end(agent_id)

    def follow(self, agent_id: str) -> _Follower:
        """Register a follower now (synchronously: nothing published after this call is
        missed); read it with :meth:`lines`, which unregisters it when done."""
        follower = _Follower(agent_id)
        self._followers.setdefault(agent_id, set()).add(follower)
        return follower

    def unfollow(self, follower: _Follower) -> None:
        """Unregister ``follower`` (idempotent)."""
        found = self._followers.get(follower.agent_id)
        if found is not None:
            found.discard(follower)
            if not found:
                del self._followers[follower.agent_id]

    async def lines(self, follower: _Follower) -> AsyncGenerator[dict[str, Any], None]:
        """The follower's lines as they come, until its agent's followers are ended."""
        try:
            while True:
                while follower.items:
                    yield follower.take()
                if follower.dropped:
                    yield _lagged(follower.dropped)
                    follower.dropped = 0
                    continue
                if follower.ended:
                    return
                follower.wake.clear()
                await follower.wake.wait()
        finally:
            self.unfollow(follower)
