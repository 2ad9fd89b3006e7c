"""Lean lists: agent summaries, filters and cursor paging, and the secrets a record never shows.

``GET /agents`` (and MCP ``agent_list``, ``corral agents``) answer with *summaries*: what a
table of agents needs, without an agent's output, its prompt (a short preview only) or its
spec. A page is ordered by creation, ``(createdAt, id)``; the cursor is that position key of
the page's last agent, encoded (opaque to callers). A cursor names a position, not an
offset, so agents spawned or deleted while a caller pages neither repeat nor hide an agent
that existed when paging began (an agent spawned meanwhile shows up on a later page, or not
at all if its key sorts before the cursor, which a clock step back could cause).

Secrets: a spec's ``env`` values are replaced by :data:`MASK` wherever an agent record is
served (``GET /agents/{id}``, the event log, MCP, the CLI); the names stay, so a reader sees
which variables an agent gets, never their values.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from corral.daemon._errors import InvalidQueryError
from corral.daemon._records import AgentRecord

Json = dict[str, Any]

MASK = "***"
"""What an ``env`` value is served as (the variable's name stays)."""

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
PREVIEW_CHARS = 80
"""How much of the last prompt and of the error a summary carries."""

_MAX_CURSOR = 512  # characters; a real cursor is well under 200
_MAX_FILTER = 200


def redact(rec: Mapping[str, Any]) -> Json:
    """``rec`` with its spec's ``env`` values masked (a new dict; ``rec`` is left as is)."""
    shown = dict(rec)
    spec = shown.get("spec")
    if isinstance(spec, Mapping) and isinstance(spec.get("env"), Mapping) and spec["env"]:
        shown["spec"] = {**spec, "env": dict.fromkeys(spec["env"], MASK)}
    return shown


def redact_event(event: Json) -> Json:
    """An event as served: an ``agent.created``'s agent record with its env masked."""
    data = event.get("data")
    if isinstance(data, Mapping) and isinstance(data.get("agent"), Mapping):
        return {**event, "data": {**data, "agent": redact(data["agent"])}}
    return event


def _clip(text: Any) -> str | None:
    if not isinstance(text, str):
        return None
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"


def summary(rec: Mapping[str, Any], *, queued: bool = False) -> Json:
    """What a list shows of an agent: small and bounded whatever the agent printed."""
    spec = rec.get("spec") or {}
    shown: Json = {
        "id": rec["id"],
        "name": rec["name"],
        "harness": spec.get("harness"),
        "state": rec["state"],
        "reason": rec.get("reason"),
        "error": _clip(rec.get("error")),
        "parent": rec.get("parent"),
        "runId": rec.get("runId"),
        "rootId": rec.get("rootId"),
        "childCount": len(rec.get("children") or ()),
        "turns": rec.get("turns", 0),
        "turnInFlight": rec.get("turnInFlight"),
        "promptPreview": _clip(rec.get("lastPrompt")),
        "usage": rec.get("usage"),
        "createdAt": rec.get("createdAt"),
        "updatedAt": rec.get("updatedAt"),
    }
    for optional in ("decision", "dimension", "endedAt"):
        if optional in rec:
            shown[optional] = rec[optional]
    if queued:
        shown["queued"] = True
    return shown


# --- paging -----------------------------------------------------------------------------------


def _bad(field: str, message: str) -> InvalidQueryError:
    return InvalidQueryError([{"field": field, "in": "query", "message": message}], "query")


def _shown(value: str) -> str:
    return repr(value if len(value) <= 40 else f"{value[:40]}... ({len(value)} characters)")


def _instant(ts: str) -> datetime:
    # Timestamps are isoformat() of the daemon's clock; a naive one is taken as UTC so that
    # every key compares with every other.
    when = datetime.fromisoformat(ts)
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def position(rec: Mapping[str, Any]) -> tuple[datetime, str]:
    """An agent's place in a list: when it was created, then its id (ids are unique)."""
    return (_instant(str(rec["createdAt"])), str(rec["id"]))


def encode_cursor(rec: Mapping[str, Any]) -> str:
    """The opaque cursor after ``rec``: its position key, base64url of JSON."""
    raw = json.dumps([rec["createdAt"], rec["id"]], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """The position a cursor names; ``InvalidQueryError`` (field ``cursor``) for one this
    daemon did not make."""
    if len(cursor) > _MAX_CURSOR:
        raise _bad("cursor", f"must be at most {_MAX_CURSOR} characters, got {_shown(cursor)}")
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        ts, agent_id = json.loads(raw)
        if not (isinstance(ts, str) and isinstance(agent_id, str)):
            raise ValueError(cursor)
        return (_instant(ts), agent_id)
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
        raise _bad(
            "cursor", f"must be a nextCursor this daemon gave, got {_shown(cursor)}"
        ) from None


def check_limit(limit: Any) -> int:
    """``limit`` (an int, or its decimal text from a query) as an int in 1..MAX_LIMIT
    (``InvalidQueryError`` naming the bound and the value seen otherwise)."""
    if isinstance(limit, str) and limit.isascii() and limit.isdigit() and len(limit) <= 6:
        limit = int(limit)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        if isinstance(limit, str):
            raise _bad("limit", f"must be an integer from 1 to {MAX_LIMIT}, got {_shown(limit)}")
        raise _bad("limit", f"must be an integer from 1 to {MAX_LIMIT}, got {limit!r}")
    return limit


def check_filter(field: str, value: str | None) -> str | None:
    """A filter value as given (None: no filter); ``InvalidQueryError`` for an empty or
    oversized one."""
    if value is None:
        return None
    if not isinstance(value, str) or not 1 <= len(value) <= _MAX_FILTER:
        shown = _shown(value) if isinstance(value, str) else repr(value)
        raise _bad(field, f"must be 1 to {_MAX_FILTER} characters, got {shown}")
    return value


def page(
    records: Iterable[AgentRecord],
    *,
    limit: int = DEFAULT_LIMIT,
    cursor: str | None = None,
    state: str | None = None,
    run: str | None = None,
    parent: str | None = None,
    name: str | None = None,
) -> tuple[list[AgentRecord], str | None]:
    """The records after ``cursor`` that match every filter given, oldest first, at most
    ``limit``; and the cursor of the next page (None: this was the last)."""
    limit = check_limit(limit)
    after = None if cursor is None else decode_cursor(cursor)
    wanted = [
        r
        for r in records
        if (state is None or r["state"] == state)
        and (run is None or r["runId"] == run)
        and (parent is None or r["parent"] == parent)
        and (name is None or r["name"] == name)
    ]
    keyed = sorted(((position(r), r) for r in wanted), key=lambda kr: kr[0])
    if after is not None:
        keyed = [kr for kr in keyed if kr[0] > after]
    found = [r for _, r in keyed[: limit + 1]]
    if len(found) <= limit:
        return found, None
    return found[:limit], encode_cursor(found[limit - 1])


# --- the event log's filters ------------------------------------------------------------------

_MAX_TYPES = 50


def event_types(raw: Iterable[str] | None) -> frozenset[str] | None:
    """``?type=`` values, each one type or a comma list, as a set (None: every type);
    ``InvalidQueryError`` for an empty or oversized one."""
    if not raw:
        return None
    types = {t.strip() for value in raw for t in value.split(",")}
    if "" in types or len(types) > _MAX_TYPES or any(len(t) > _MAX_FILTER for t in types):
        shown = _shown(",".join(raw))
        raise _bad(
            "type",
            f"must be at most {_MAX_TYPES} non-empty event types of at most {_MAX_FILTER} "
            f"characters, got {shown}",
        )
    return frozenset(types)


def event_matches(
    agents: Mapping[str, Mapping[str, Any]],
    event_type: str,
    agent_id: str | None,
    types: frozenset[str] | None,
    run: str | None,
) -> bool:
    """Whether an event passes ``?type=`` and ``?run=`` (an event of no agent is in no run)."""
    if types is not None and event_type not in types:
        return False
    if run is None:
        return True
    rec = agents.get(agent_id) if agent_id is not None else None
    return rec is not None and rec.get("runId") == run
