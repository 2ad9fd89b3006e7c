"""History retention: when the sessions of a run's agents are deleted.

An agent whose ``history`` is ``run`` keeps its session until its run ends: the run ends when
every agent of it has ended (``failed`` or ``stopped``; an ended agent takes no prompt, and
no agent can be spawned under an ended parent, so an ended run stays ended). The commit
that ends the run's last live agent carries a ``session.cleared`` event for each such
agent with a session, so replaying the log deletes them again. ``permanent`` sessions stay
as long as the agent's record; ``none`` agents never have one.
"""

from __future__ import annotations

from collections.abc import Sequence

from corral.daemon import _events as ev
from corral.daemon import _sessions
from corral.daemon._events import NewEvent
from corral.daemon._state import ENDED_STATES, State, preview

RUN_ENDED = "run ended"


def on_commit(state: State, events: Sequence[NewEvent], ts: str) -> list[NewEvent]:
    """The ``session.cleared`` events to commit with ``events`` (at ``ts``): one for each
    ``run``-history agent with a session in a run that ``events`` end."""
    ending = [
        e.agent_id
        for e in events
        if e.type == ev.STATE_CHANGED and e.data.get("to") in ENDED_STATES and e.agent_id
    ]
    if not ending:
        return []  # the common case: no preview
    after = preview(state, events, ts)
    runs = set()
    for agent_id in ending:
        rec = after.get_agent(agent_id)
        if rec is not None:
            runs.add(rec["runId"])
    cleared: list[NewEvent] = []
    for run_id in sorted(runs):
        members = [
            rec
            for agent_id in {*state.agents, *after.agents}
            if (rec := after.get_agent(agent_id)) is not None and rec["runId"] == run_id
        ]
        if any(rec["state"] not in ENDED_STATES for rec in members):
            continue
        for rec in sorted(members, key=lambda r: r["id"]):
            if _sessions.history_of(rec) == "run" and after.session(rec["id"]):
                cleared.append(ev.session_cleared(rec["id"], RUN_ENDED))
    return cleared
