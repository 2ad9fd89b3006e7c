"""Notices between agents: what a child tells its parent, and how they reach the parent's turn."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from corral.daemon import _events as ev
from corral.daemon._events import NewEvent
from corral.daemon._records import AgentRecord, Notice
from corral.daemon._spec import AgentSpec
from corral.daemon._state import ENDED_STATES, State

OUTPUT_IN_NOTICE = 500  # characters of a child's output quoted in its parent's notice


def to_parent(state: State, child: AgentRecord, kind: str, **fields: Any) -> NewEvent:
    """A notice of ``kind`` from ``child`` to its parent (which must exist): ``dropped`` at
    once when the parent has ended, as an ended agent reads no more notices."""
    parent_id = child["parent"]
    assert parent_id is not None
    parent = state.agents[parent_id]
    status = "dropped" if parent["state"] in ENDED_STATES else "pending"
    return ev.notice(parent_id, child, kind, status, **fields)


def on_turn(
    state: State,
    child: AgentRecord,
    spec: AgentSpec,
    kind: str,
    *,
    output: str | None = None,
    error: str | None = None,
) -> list[NewEvent]:
    """The notice a turn's end (``done``, ``failed``) sends the parent, if the child's
    ``notifyOn`` asks for it."""
    if child["parent"] is None or kind not in spec.notify_on:
        return []
    extra: dict[str, Any] = {}
    if output is not None:
        extra["output"] = output[:OUTPUT_IN_NOTICE]
    return [to_parent(state, child, kind, error=error, **extra)]


def pending(state: State, agent_id: str) -> list[Notice]:
    """The notices waiting for ``agent_id``'s next turn, oldest first."""
    return sorted(
        (n for n in state.notices.values() if n["to"] == agent_id and n["state"] == "pending"),
        key=lambda n: n["id"],
    )


def carried(state: State, rec: AgentRecord) -> list[Notice]:
    """The notices the agent's last turn carried in front of its prompt."""
    notices = state.notices
    return [notices[i] for i in rec.get("lastNotices", []) if i in notices]


def resend_text(state: State, rec: AgentRecord) -> str:
    """What a retry sends: the failed turn's prompt with the notices it carried."""
    assert rec["lastPrompt"] is not None
    return with_notices(rec["lastPrompt"], carried(state, rec))


def with_notices(prompt: str, notices: Sequence[Notice]) -> str:
    """``prompt`` with ``notices`` in front of it, one line each."""
    if not notices:
        return prompt
    lines = ["[corral] notices since your last turn:"]
    for n in notices:
        who = f"{n.get('fromName', '')} ({n['from']})".strip()
        if n["kind"] == "supervision":
            line = f"- {who} is blocked ({n.get('reason')}) and needs a decision"
        elif n["kind"] == "done":
            line = f"- {who} finished a turn"
        else:
            line = f"- {who} {n['kind']}"
        if n.get("error"):
            line += f": {n['error']}"
        elif n.get("output"):
            line += f": {n['output']}"
        lines.append(line)
    return "\n".join(lines) + "\n\n" + prompt
