"""History retention: when the sessions of a run's agents are deleted.

An agent whose ``history`` is ``run`` keeps its session until its run ends: the run ends when
every agent of it has ended (``failed`` or ``stopped``; an ended agent takes no prompt, and
no agent can be spawned under an ended parent, so an ended run stays ended). The commit
that ends the run's last live agent carries a ``sessions.cleared`` event naming the run's
such agents with a session, so replaying the log deletes them again. It is an event of the
run, naming no agent: an agent's own events end with the change that ended it.
``permanent`` sessions stay as long as the agent's record; ``none`` agents never have one.
"""

from __future__ import annotations

from collections.abc import Sequence

from corral.daemon import _events as ev
from corral.daemon import _sessions
from corral.daemon._events import NewEvent
from corral.daemon._state import ENDED_STATES, State, preview

RUN_ENDED = "run ended"


def on_commit(state: State, events: Sequence[NewEvent], ts: str) -> list[NewEvent]:
    """The ``sessions.cleared`` events to commit with ``events`` (at ``ts``): one for each
    run that ``events`` end, naming its ``run``-history agents with a session."""
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
        kept = sorted(
            rec["id"]
            for rec in members
            if _sessions.history_of(rec) == "run" and after.session(rec["id"])
        )
        if kept:
            cleared.append(ev.sessions_cleared(run_id, kept, RUN_ENDED))
    return cleared
