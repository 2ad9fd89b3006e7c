"""Sessions: the conversation of an agent's turns, kept in the daemon's store.

Each agent's session is a projection the reducer (``_state``) builds from its turn events:
``agent.turn_started`` adds the prompt as the agent got it (a ``user`` message, the notices
that went in front of it included), ``agent.turn_completed`` the messages its harness
reported (an ``openai`` agent's replies, tool calls and tool results) or else its output (an
``assistant`` message), ``agent.turn_failed`` the error (an ``error`` message), and
``sessions.cleared`` deletes it. So a session survives restarts and replay gives it back.

The spec's ``history`` decides what is kept: ``none`` keeps nothing (a turn sees its own
prompt only), ``run`` (the default) keeps it until the agent's run ends -- every agent of
the run has ended (see ``_retention``) -- and ``permanent`` as long as the agent's record.

Bounds, so that no agent can grow the daemon without limit: a message's text is cut at
:data:`MAX_MESSAGE_CHARS` (a line says how much was dropped), a turn adds at most
:data:`MAX_TURN_MESSAGES` messages of its harness (the newest, at most
:data:`MAX_SESSION_CHARS` characters together; an assistant message at most
:data:`MAX_TURN_CALLS` tool calls), and a session keeps at most
:data:`MAX_MESSAGES` messages and :data:`MAX_SESSION_CHARS` characters, the oldest dropped
first (never leaving a tool result without the call it answers at the front).

Stores keep a session as one row per message (keyed by the agent and the message's ``n``), so
a turn writes its new messages only, whatever the size of the session.

This module depends on the records only: the reducer imports it.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.daemon._records import AgentRecord, SessionMessage, SessionToolCall
from corral.daemon._text import escape

HISTORY_POLICIES = ("none", "run", "permanent")
DEFAULT_HISTORY = "run"

MAX_MESSAGES = 200
MAX_SESSION_CHARS = 256 * 1024
MAX_MESSAGE_CHARS = 16 * 1024
MAX_TURN_MESSAGES = 64
MAX_TURN_CALLS = 64  # tool calls kept of one assistant message
_MAX_NAME_CHARS = 200  # a tool's name, a tool call's id
_OVERHEAD_CHARS = 64  # what a message's keys cost besides its text, counted in the cap

SESSION_FILE = "session.jsonl"  # in the agent's state dir, for the command harness


def history_of(rec: AgentRecord) -> str:
    """The agent's ``history`` policy (a record written before the field: ``run``)."""
    value = rec["spec"].get("history", DEFAULT_HISTORY)
    return value if value in HISTORY_POLICIES else DEFAULT_HISTORY


def clip(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``text`` cut to ``limit`` characters, with a line saying how many were dropped."""
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[corral] {len(text) - limit} characters dropped"


def _kept(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """Text a harness reported, as a session keeps it: storable (``_text.escape``), clipped."""
    return clip(escape(text), limit)


def size(message: Mapping[str, Any]) -> int:
    """What ``message`` counts against :data:`MAX_SESSION_CHARS`."""
    chars = _OVERHEAD_CHARS + len(message.get("content") or "")
    for call in message.get("toolCalls") or ():
        chars += len(call["id"]) + len(call["name"]) + len(call["arguments"])
    return chars + len(message.get("toolCallId") or "") + len(message.get("name") or "")


class _Sized(list[SessionMessage]):
    """A session as :func:`appended` gives it: a list that also knows what it counts against
    :data:`MAX_SESSION_CHARS` (``chars``, for its first ``length`` messages), so that the next
    append does not add up every message again. Sessions are never changed in place (a turn
    makes a new list); one whose length is not ``length`` any more is added up again all the
    same."""

    __slots__ = ("chars", "length")

    def __init__(self, messages: Iterable[SessionMessage], chars: int) -> None:
        super().__init__(messages)
        self.chars = chars
        self.length = len(self)


def _chars(session: list[SessionMessage]) -> int:
    """What ``session`` counts against :data:`MAX_SESSION_CHARS` (see :func:`size`)."""
    if isinstance(session, _Sized) and session.length == len(session):
        return session.chars
    return sum(size(m) for m in session)


def bounded(session: list[SessionMessage]) -> list[SessionMessage]:
    """``session`` within :data:`MAX_MESSAGES` and :data:`MAX_SESSION_CHARS`, the oldest
    messages dropped first; it never opens with a tool result whose call was dropped."""
    total = _chars(session)
    start = 0
    while start < len(session) and (
        len(session) - start > MAX_MESSAGES or total > MAX_SESSION_CHARS
    ):
        total -= size(session[start])
        start += 1
    while start < len(session) and session[start]["role"] == "tool":
        total -= size(session[start])
        start += 1
    return session if start == 0 else _Sized(session[start:], total)


def appended(session: list[SessionMessage], new: list[SessionMessage]) -> list[SessionMessage]:
    """``session`` with ``new`` after it, numbered on from its last message (``n``), then
    :func:`bounded`. A new list: ``session`` is not changed."""
    n = session[-1].get("n", len(session)) if session else 0
    numbered = _Sized(session, _chars(session))
    for message in new:
        n += 1
        added: SessionMessage = {**message, "n": n}
        numbered.append(added)
        numbered.chars += size(added)
    numbered.length = len(numbered)
    return bounded(numbered)


@dataclass(frozen=True, slots=True)
class RowChanges:
    """How a store's rows of one session (one row per message, keyed by agent and ``n``)
    go from one list to the next: delete them all (``clear``) or those numbered below
    ``drop_below``, then insert ``insert``."""

    clear: bool
    drop_below: int | None
    insert: list[SessionMessage]


def row_changes(old: list[SessionMessage], new: list[SessionMessage] | None) -> RowChanges:
    """What turns the rows of ``old`` into those of ``new`` (None: the session is gone).
    A session only grows at its end and loses messages at its front, so only the new
    messages are written, whatever the session's size."""
    if not new:
        return RowChanges(True, None, [])
    first = new[0].get("n", 0)
    if old and first < old[0].get("n", 0):
        return RowChanges(True, None, list(new))  # emptied and begun again
    last = old[-1].get("n", 0) if old else 0
    drop = first if old and old[0].get("n", 0) < first else None
    return RowChanges(False, drop, [m for m in new if m.get("n", 0) > last])


def message(role: str, turn: int, content: str, at: str) -> SessionMessage:
    """A ``user``, ``assistant`` or ``error`` message of turn ``turn``, its text clipped."""
    return {"role": role, "turn": turn, "content": clip(content), "at": at}


def stamped(raw: Iterable[Mapping[str, Any]], turn: int, at: str) -> list[SessionMessage]:
    """The messages a harness reported (already checked by :func:`turn_messages` before they
    were logged), as messages of turn ``turn``."""
    found: list[SessionMessage] = []
    for item in raw:
        msg: SessionMessage = {
            "role": str(item.get("role", "assistant")),
            "turn": turn,
            "content": str(item.get("content") or ""),
            "at": at,
        }
        for key in ("toolCalls", "toolCallId", "name"):
            if key in item:
                msg[key] = item[key]
        found.append(msg)
    return found


def turn_messages(raw: Any) -> list[dict[str, Any]]:
    """The messages a harness reported for a turn, as the log keeps them: only ``assistant``
    (``content``, ``toolCalls`` of ``{id, name, arguments}`` strings) and ``tool``
    (``content``, ``toolCallId``, ``name``) messages of the right types, each text clipped,
    at most :data:`MAX_TURN_MESSAGES` (the newest) of at most :data:`MAX_SESSION_CHARS`
    together (see :func:`size`), each with at most :data:`MAX_TURN_CALLS` tool calls
    (the first), every string made storable
    (``_text.escape``). Anything else is left out: what a model says must not be able to
    break a session."""
    if not isinstance(raw, Sequence) or isinstance(raw, str | bytes):
        return []
    kept: list[dict[str, Any]] = []
    for item in raw:
        if not isinstance(item, Mapping):
            continue
        role = item.get("role")
        content = item.get("content")
        content = _kept(content) if isinstance(content, str) else ""
        if role == "assistant":
            msg: dict[str, Any] = {"role": "assistant", "content": content}
            calls = _tool_calls(item.get("toolCalls"))
            if calls:
                msg["toolCalls"] = calls
            kept.append(msg)
        elif role == "tool" and isinstance(item.get("toolCallId"), str) and item["toolCallId"]:
            msg = {
                "role": "tool",
                "content": content,
                "toolCallId": _kept(item["toolCallId"], _MAX_NAME_CHARS),
            }
            if isinstance(item.get("name"), str) and item["name"]:
                msg["name"] = _kept(item["name"], _MAX_NAME_CHARS)
            kept.append(msg)
    kept = kept[-MAX_TURN_MESSAGES:]
    # What a session could keep of the turn at most: more would only grow the log.
    total = sum(size(m) for m in kept)
    while kept and (total > MAX_SESSION_CHARS or kept[0]["role"] == "tool"):
        total -= size(kept.pop(0))
    return kept


def _tool_calls(raw: Any) -> list[SessionToolCall]:
    if not isinstance(raw, Sequence) or isinstance(raw, str | bytes):
        return []
    calls: list[SessionToolCall] = []
    for call in raw[:MAX_TURN_CALLS]:
        if not isinstance(call, Mapping):
            continue
        call_id, name, arguments = call.get("id"), call.get("name"), call.get("arguments")
        if isinstance(call_id, str) and call_id and isinstance(name, str) and name:
            calls.append(
                {
                    "id": _kept(call_id, _MAX_NAME_CHARS),
                    "name": _kept(name, _MAX_NAME_CHARS),
                    "arguments": _kept(arguments) if isinstance(arguments, str) else "{}",
                }
            )
    return calls


def before(session: Sequence[SessionMessage] | None, turn: int) -> tuple[SessionMessage, ...]:
    """The messages of the turns before ``turn``: what the harness of turn ``turn`` gets."""
    return tuple(m for m in session or () if m["turn"] < turn)


def jsonl(messages: Iterable[Mapping[str, Any]]) -> bytes:
    """``messages`` as JSON lines (UTF-8, one object a line, each ending in a newline)."""
    return b"".join(
        json.dumps(m, ensure_ascii=False, separators=(",", ":")).encode() + b"\n" for m in messages
    )


def write_file(path: Path, messages: Iterable[Mapping[str, Any]]) -> None:
    """Write ``messages`` to ``path`` as JSON lines, readable by its owner only (0600),
    whole: written beside it, then renamed over it. Raises ``OSError``."""
    data = jsonl(messages)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    temp = path.with_name(path.name + ".tmp")
    # The agent can write in this directory: whatever it left where the temp file goes (a
    # FIFO, whose open would block the daemon's event loop; a link) is removed, and the file
    # is made anew (O_EXCL: nothing put back meanwhile is opened, never written through).
    with contextlib.suppress(FileNotFoundError):
        temp.unlink()
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
    os.replace(temp, path)
