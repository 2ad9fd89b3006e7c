"""Agents addressed by name: where an agent id is taken (an HTTP path, ``?agent=``,
``?parent=``, an MCP tool's ``agentId``, the CLI through HTTP), an agent's name is taken too.

The rules (docs/daemon.md, "Names"):

- An id always wins: a reference that is an agent's id is that agent, whatever others are
  named. A new agent may not be named like an id (``a_`` and 8 hex digits), so a name never
  shadows an agent made later either. Nor may it be what a URL's path cannot carry (``/``,
  ``.``, ``..``) or blank.
- Names are unique among the live agents of a run: a spawn with the name of a live agent of
  its run is refused (``name_taken``, naming the holder).
- A name resolves to the one agent holding it; when several hold it (in several runs, or
  ended ones), the single live holder wins; otherwise the reference is ambiguous
  (``ambiguous_name``, listing the candidates) and the caller gives the id.
- Only agents in the caller's reach are candidates: to an agent's token, a name held only
  outside its subtree is as unknown as a name no one holds.

A reference that is neither an id nor a name in reach is passed on unchanged, so the caller
answers it as it answers any unknown id (``agent_not_found``, or ``out_of_scope`` to an
agent's token).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from corral.daemon._errors import AmbiguousNameError, InvalidSpecError, NameTakenError
from corral.daemon._records import AgentRecord
from corral.daemon._state import ENDED_STATES

ID_SHAPE = re.compile(r"a_[0-9a-f]{8}")
"""What the daemon's agent ids look like (see ``AgentService._new_agent_id``)."""

MAX_CANDIDATES = 10
"""Candidates an ``ambiguous_name`` answer lists (it says how many there are in all)."""

InScope = Callable[[str], bool]


def looks_like_id(name: str) -> bool:
    """Whether ``name`` has the shape of an agent id."""
    return ID_SHAPE.fullmatch(name) is not None


def unaddressable(name: str) -> str | None:
    """Why ``name`` could not address its agent, or None: it looks like an id, or could not
    stand in a URL's path (``/`` splits it, ``.`` and ``..`` are taken away by every client's
    path normalisation: ``POST /agents/./stop`` reaches ``/agents/stop``), or is blank."""
    if looks_like_id(name):
        return f"must not look like an agent id (a_ and 8 hex digits), got {name!r}"
    if "/" in name or name in (".", ".."):
        return f"must not contain '/' nor be '.' or '..' (it goes in URL paths), got {name!r}"
    if not name.strip():
        return "must not be only blanks"
    return None


def check_spawn(agents: Mapping[str, AgentRecord], run_id: str, name: str) -> None:
    """Refuse a new agent of run ``run_id`` named ``name``: ``InvalidSpecError`` when the
    name could not address it (:func:`unaddressable`), ``NameTakenError`` when a live agent
    of the run holds it."""
    problem = unaddressable(name)
    if problem is not None:
        message = f"{problem}: agents are addressed by id or name alike"
        raise InvalidSpecError([{"field": "name", "message": message}])
    check_free(agents, run_id, name)


def check_free(
    agents: Mapping[str, AgentRecord], run_id: str, name: str, *, besides: str | None = None
) -> None:
    """Refuse (``NameTakenError``) a name held by a live agent of run ``run_id`` other than
    ``besides`` (an ended agent that would live again, say)."""
    for rec in agents.values():
        if (
            rec["name"] == name
            and rec["runId"] == run_id
            and rec["state"] not in ENDED_STATES
            and rec["id"] != besides
        ):
            raise NameTakenError(name, run_id, rec["id"])


def hidden(error: NameTakenError, in_scope: InScope) -> NameTakenError:
    """``error`` as an agent's token may see it: without the holder's id when the holder is
    beyond its reach."""
    if error.holder is None or in_scope(error.holder):
        return error
    return NameTakenError(error.name, error.run_id, None)


def resolve(agents: Mapping[str, AgentRecord], ref: str, in_scope: InScope | None = None) -> str:
    """The id ``ref`` stands for: ``ref`` itself when it is an agent's id (or names no agent
    in reach), else the id of the one agent in reach named ``ref`` (see the module's rules).
    ``in_scope`` None reaches every agent. Raises ``AmbiguousNameError``."""
    if ref in agents:
        return ref
    found = [
        rec
        for rec in agents.values()
        if rec["name"] == ref and (in_scope is None or in_scope(rec["id"]))
    ]
    if len(found) == 1:
        return found[0]["id"]
    if not found:
        return ref
    live = [rec for rec in found if rec["state"] not in ENDED_STATES]
    if len(live) == 1:
        return live[0]["id"]
    raise AmbiguousNameError(ref, candidates(live or found), len(live or found))


def candidates(recs: list[AgentRecord]) -> list[dict[str, Any]]:
    """The first :data:`MAX_CANDIDATES` of ``recs``, newest first, as an ``ambiguous_name``
    answer lists them."""
    newest = sorted(recs, key=lambda r: str(r.get("createdAt", "")), reverse=True)
    return [
        {
            "id": r["id"],
            "runId": r["runId"],
            "state": r["state"],
            "parent": r["parent"],
            "createdAt": r.get("createdAt"),
        }
        for r in newest[:MAX_CANDIDATES]
    ]
