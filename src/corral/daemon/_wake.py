"""Coordinators that act: an agent with ``wake: true`` is woken by its children's notices.

When a notice reaches a ``wake`` agent while it is ``idle`` (a child done, failed, held), or
such an agent goes idle with notices that arrived during its turn, the daemon starts a turn
of it whose prompt is those notices (:data:`WAKE_TEXT` behind the lines of
:func:`corral.daemon._notices.with_notices`); the turn delivers them as a prompt would. The
wake goes through what a prompt goes through: a budget with no room holds the agent
(``budget-exhausted``) instead, and a woken turn that fails counts for its failure policy
and breaker (``maxConsecutiveFailures``) like any other.

A parent whose turns succeed has no breaker to trip, so a flapping child could wake it
without end: :class:`WakeCounter` allows at most ``maxWakesPerMinute`` wakes within 60 s
since the agent was last prompted (by a person, its parent or a decision's ``retry``); the
next one holds it (``wake-limit``, a ``blocked`` decision: ``retry`` wakes it with the
notices, ``stop`` ends it). The count is kept in memory: a restarted daemon starts it again.

Only an ``idle`` agent is woken: a running one gets the notices when its turn ends, a held
one when a person answers, an ended one never (its notices are dropped). The service checks
and starts a wake under its lock, on a task of its own, never on the commit that wrote the
notice (see ``AgentService._wake``); at start it looks at every ``wake`` agent, so a notice
written just before a daemon died still wakes its parent.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime

from corral.daemon import _decisions, _notices
from corral.daemon import _events as ev
from corral.daemon._events import Event, NewEvent
from corral.daemon._policy import WAKE_LIMIT
from corral.daemon._spec import AgentSpec
from corral.daemon._state import State
from corral.kernel import Clock

WAKE_TEXT = (
    "[corral] you were woken because the notices above reached you while you were idle: "
    "act on them (read your inbox, prompt, stop or answer your children) or end your turn."
)
WINDOW_S = 60.0


class WakeCounter:
    """How often each agent was woken within the last :data:`WINDOW_S` seconds (the clock's
    monotonic time), since it was last prompted by anyone but the daemon."""

    __slots__ = ("_clock", "_times")

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._times: dict[str, deque[float]] = {}

    def recent(self, agent_id: str) -> int:
        """Wakes of ``agent_id`` in the window."""
        times = self._times.get(agent_id)
        if times is None:
            return 0
        horizon = self._clock.monotonic() - WINDOW_S
        while times and times[0] <= horizon:
            times.popleft()
        return len(times)

    def count(self, agent_id: str) -> None:
        """Count a wake of ``agent_id`` now."""
        self._times.setdefault(agent_id, deque()).append(self._clock.monotonic())

    def forget(self, agent_id: str) -> None:
        """``agent_id`` was prompted (or ended): its wakes start again from none."""
        self._times.pop(agent_id, None)


def observe(written: Iterable[Event], counter: WakeCounter) -> set[str]:
    """The agents that the committed events ``written`` may wake: those a pending notice
    reached, and those that went idle. An agent prompted by someone (``prompted``) or ended
    starts its wake count again."""
    found: set[str] = set()
    for event in written:
        if event.type == ev.NOTICE and event.data.get("state") == "pending":
            found.add(str(event.data["to"]))
        elif event.type == ev.STATE_CHANGED and event.agent_id is not None:
            to, reason = event.data.get("to"), event.data.get("reason")
            if to == "idle":
                found.add(event.agent_id)
            elif reason == "prompted" or to in ("stopped", "failed"):
                counter.forget(event.agent_id)
    return found


@dataclass(frozen=True, slots=True)
class Wake:
    """What waking an agent comes to: ``events`` to commit, then, when ``turn`` is set, the
    turn to launch with ``prompt`` (None: the agent was held instead)."""

    events: list[NewEvent]
    turn: int | None = None
    prompt: str = ""


def plan(
    state: State,
    agent_id: str,
    spec_of: Callable[[str], AgentSpec],
    now: datetime,
    counter: WakeCounter,
) -> Wake | None:
    """Whether ``agent_id`` is woken now, as the state stands: None when it is not (not a
    ``wake`` agent, not idle, no pending notice); else the turn, or the hold that stands in
    for it (budget without room, too many wakes in a minute)."""
    rec = state.agents.get(agent_id)
    if rec is None or rec["state"] != "idle" or rec["turnInFlight"] is not None:
        return None
    spec = spec_of(agent_id)
    if not spec.wake:
        return None
    pending = _notices.pending(state, agent_id)
    if not pending:
        return None
    exhausted = _decisions.exhausted(rec, spec, now, state.agents.get)
    if exhausted is not None:
        return Wake(_decisions.budget_hold(state, rec, exhausted))
    recent = counter.recent(agent_id)
    if recent >= spec.max_wakes_per_minute:
        counter.forget(agent_id)
        why = (
            f"woken {recent} times within {WINDOW_S:g} s by its children's notices "
            f"(maxWakesPerMinute {spec.max_wakes_per_minute}); a person decides whether it "
            "goes on"
        )
        return Wake(_decisions.hold(state, rec, WAKE_LIMIT, why))
    counter.count(agent_id)
    turn = rec["turns"] + 1
    ids = [n["id"] for n in pending]
    text = _notices.with_notices(WAKE_TEXT, pending)
    events = [
        ev.woken(agent_id),
        ev.turn_started(agent_id, turn, WAKE_TEXT, retry=False, notices=ids, woken=True, text=text),
    ]
    return Wake(events, turn, text)
