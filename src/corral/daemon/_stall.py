"""Stalled turns: the watch that notices a turn gone silent, and what recovery makes of it.

A spec with ``heartbeatS`` has each of its turns watched (:class:`StallWatch`, one timer per
turn in flight on the service's clock): every sign of life the harness sees
(``TurnRequest.heartbeat``) resets the turn's silence, and a turn silent for ``heartbeatS``
seconds is stalled. A turn waiting on a person (its agent ``waiting``) is not watched while it
waits; the wait's end counts as a sign of life.

What comes of a stall is seed 000's recovery (``corral.recovery``): the spec's ``recovery``
is a :class:`~corral.recovery.RecoveryPolicy`, whose ``action_for`` picks the action from the
agent's count of stall recoveries -- restart the turn, escalate (hold the agent ``blocked``,
reason ``stalled``, for a person to answer ``retry`` or ``stop``), or eject (the agent fails,
reason ``stalled``) -- and whose ``cooldown_s`` is the quiet time after a recovery during which
a stall waits (:func:`deferred`). :func:`recover` builds the events, pure over the state.

Why not :class:`~corral.recovery.RecoveryManager` itself: it polls health checks of the
members of a supervisor's in-memory group, keeps its counts in memory and acts outside any
lock. A daemon turn is watched by its own signs of life (a timer, not polling), its recovery
is decided under the service's lock as events, and its count must survive a daemon restart:
it is the record's ``stallRecoveries`` (set by ``agent.stall_recovery``, cleared when a turn
completes). The policy, its validation and its rule are the manager's; the cooldown check is
its ``_attempt``'s. Only the cooldown's start is kept in memory: after a restart a stall is
recovered at once, never later than it would have been.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from corral.daemon import _decisions, _notices
from corral.daemon import _events as ev
from corral.daemon._events import NewEvent, StallRecoveryData
from corral.daemon._records import AgentRecord
from corral.daemon._spec import AgentSpec, RecoverySpec
from corral.daemon._state import State, preview
from corral.kernel import Clock, TimerHandle
from corral.recovery import RecoveryAction, RecoveryPolicy

logger = logging.getLogger("corral.daemon")

STALLED = "stalled"  # the reason of a hold or a failure that a stall led to
_EPSILON_S = 1e-6  # a cooldown with less left than this is over (timers round)

StallHandler = Callable[[str, int, float, bool], None]
"""``on_stall(agent_id, turn, silence_s, first)``: ``first`` is False when the same silence
was reported already (a recovery deferred by the cooldown looks again)."""


def policy_of(spec: AgentSpec) -> RecoveryPolicy:
    """The agent's recovery policy: its spec's ``recovery``, or RecoveryPolicy's defaults."""
    return (spec.recovery or RecoverySpec()).to_policy()


@dataclass(slots=True)
class _Watched:
    turn: int
    limit_s: float
    last: float  # the clock's monotonic time of the last sign of life
    handle: TimerHandle | None = None
    paused: bool = False
    reported: bool = False  # the current silence was reported already


class StallWatch:
    """One timer per watched turn, on ``clock``; ``on_stall`` is called (from the timer, on
    the event loop) once a turn has been silent for its limit, once per silence.

    A sign of life only notes the time: the timer, when it fires early, is set again for
    what is left, so a harness may call ``beat`` as often as it likes. All methods must be
    called on the event loop; none raises for an agent or turn it does not watch.
    """

    def __init__(self, clock: Clock, on_stall: StallHandler) -> None:
        self._clock = clock
        self._on_stall = on_stall
        self._turns: dict[str, _Watched] = {}
        self._recovered_at: dict[str, float] = {}

    def watch(self, agent_id: str, turn: int, heartbeat_s: float) -> Callable[[], None]:
        """Watch turn ``turn`` of the agent from now on (its start counts as a sign of life),
        in place of any turn of it watched before; the ``heartbeat`` to give its harness."""
        self.end(agent_id)
        watched = _Watched(turn, heartbeat_s, self._clock.monotonic())
        self._turns[agent_id] = watched
        self._arm(agent_id, watched, heartbeat_s)
        return lambda: self.beat(agent_id, turn)

    def beat(self, agent_id: str, turn: int) -> None:
        """A sign of life of the agent's turn ``turn`` (ignored once that turn has ended)."""
        watched = self._turns.get(agent_id)
        if watched is None or watched.turn != turn:
            return
        watched.last = self._clock.monotonic()
        watched.reported = False
        if watched.handle is None and not watched.paused:
            self._arm(agent_id, watched, watched.limit_s)

    def waiting(self, agent_id: str, now_waiting: bool) -> None:
        """The agent's turn waits on a person (not watched meanwhile), or no longer does (the
        end of the wait counts as a sign of life)."""
        watched = self._turns.get(agent_id)
        if watched is None or watched.paused == now_waiting:
            return
        watched.paused = now_waiting
        if now_waiting:
            self._disarm(watched)
            return
        watched.last = self._clock.monotonic()
        watched.reported = False
        self._arm(agent_id, watched, watched.limit_s)

    def stalled(self, agent_id: str, turn: int) -> bool:
        """Whether turn ``turn`` is watched and silent for its limit now."""
        watched = self._turns.get(agent_id)
        if watched is None or watched.turn != turn or watched.paused:
            return False
        return self._clock.monotonic() - watched.last >= watched.limit_s

    def look_again(self, agent_id: str, turn: int, delay_s: float) -> None:
        """Look at turn ``turn`` again in ``delay_s`` seconds (a recovery the cooldown put
        off): still silent then, it is reported again (``first`` False)."""
        watched = self._turns.get(agent_id)
        if watched is None or watched.turn != turn or watched.paused:
            return
        self._disarm(watched)
        watched.handle = self._clock.call_later(delay_s, lambda: self._fire(agent_id, watched))

    def recovered(self, agent_id: str) -> None:
        """A recovery of the agent was made now: its cooldown starts."""
        self._recovered_at[agent_id] = self._clock.monotonic()

    def cooldown_left(self, agent_id: str, cooldown_s: float) -> float:
        """Seconds left of the cooldown of the agent's last recovery (0 when none is left)."""
        at = self._recovered_at.get(agent_id)
        if at is None:
            return 0.0
        left = at + cooldown_s - self._clock.monotonic()
        return left if left > _EPSILON_S else 0.0

    def watched(self, agent_id: str) -> int | None:
        """The agent's turn watched now, if any."""
        found = self._turns.get(agent_id)
        return None if found is None else found.turn

    def end(self, agent_id: str, turn: int | None = None) -> None:
        """Stop watching the agent's turn (only turn ``turn``, when given); its timer goes."""
        watched = self._turns.get(agent_id)
        if watched is None or (turn is not None and watched.turn != turn):
            return
        self._disarm(watched)
        del self._turns[agent_id]

    def forget(self, agent_id: str) -> None:
        """The agent has ended: its turn is no longer watched and its cooldown is dropped."""
        self.end(agent_id)
        self._recovered_at.pop(agent_id, None)

    def close(self) -> None:
        """Stop every timer (the service shuts down)."""
        for watched in self._turns.values():
            self._disarm(watched)
        self._turns.clear()
        self._recovered_at.clear()

    def _arm(self, agent_id: str, watched: _Watched, delay_s: float) -> None:
        watched.handle = self._clock.call_later(
            max(0.0, delay_s), lambda: self._fire(agent_id, watched)
        )

    @staticmethod
    def _disarm(watched: _Watched) -> None:
        if watched.handle is not None:
            watched.handle.cancel()
            watched.handle = None

    def _fire(self, agent_id: str, watched: _Watched) -> None:
        watched.handle = None
        if self._turns.get(agent_id) is not watched or watched.paused:
            return  # a turn no longer watched, or waiting on a person
        silence = self._clock.monotonic() - watched.last
        if silence < watched.limit_s:
            self._arm(agent_id, watched, watched.limit_s - silence)
            return
        first = not watched.reported
        watched.reported = True
        try:
            self._on_stall(agent_id, watched.turn, silence, first)
        except Exception:
            logger.exception(
                "agent %s: the stall of turn %d was not handled", agent_id, watched.turn
            )


# --- what a stall leads to (pure over the state) --------------------------------------------


@dataclass(frozen=True, slots=True)
class Recovery:
    """What :func:`recover` decided: the ``events`` to commit, the ``action`` taken, and the
    number of the turn to start (``restart``) when the turn is started again."""

    events: list[NewEvent] = field(default_factory=list)
    action: RecoveryAction = RecoveryAction.RESTART
    restart: int | None = None


def stall_error(silence_s: float, heartbeat_s: float) -> str:
    """The error a stall leaves on the agent."""
    return f"stalled: no sign of life for {silence_s:.3g} s (heartbeatS {heartbeat_s:g})"


def _report(rec: AgentRecord, spec: AgentSpec, turn: int, silence_s: float) -> NewEvent:
    return ev.turn_stalled(rec["id"], turn, silence_s, spec.heartbeat_s or 0.0)


def _data(
    turn: int, action: RecoveryAction | None, attempt: int, policy: RecoveryPolicy, detail: str
) -> StallRecoveryData:
    return {
        "turn": turn,
        "action": None if action is None else action.value,
        "attempt": attempt,
        "maxRetries": policy.max_retries,
        "escalateAfter": policy.escalate_after,
        "cooldownS": policy.cooldown_s,
        "detail": detail,
    }


def deferred(
    rec: AgentRecord,
    spec: AgentSpec,
    turn: int,
    silence_s: float,
    *,
    first: bool,
    wait_s: float,
) -> list[NewEvent]:
    """The stall came inside the cooldown of the agent's last recovery: it is reported
    (when ``first``) and nothing is done for ``wait_s`` seconds (``agent.stall_recovery``
    with action None)."""
    policy = policy_of(spec)
    count = rec.get("stallRecoveries", 0)
    detail = (
        f"in cooldown: the last recovery was {policy.cooldown_s - wait_s:.3g} s ago, cooldownS "
        f"is {policy.cooldown_s:g}; a turn still silent in {wait_s:.3g} s is recovered then"
    )
    data = _data(turn, None, count, policy, detail)
    data["waitS"] = round(wait_s, 3)
    events = [_report(rec, spec, turn, silence_s)] if first else []
    return [*events, ev.stall_recovery(rec["id"], data)]


def recover(
    state: State,
    rec: AgentRecord,
    spec: AgentSpec,
    turn: int,
    silence_s: float,
    now: datetime,
    *,
    first: bool,
    before: Sequence[NewEvent] = (),
) -> Recovery:
    """Recover stalled turn ``turn`` of running agent ``rec`` by its policy: the stall
    (when ``first``), the recovery with its count, ``before`` (approvals withdrawn), the
    turn interrupted, then the action's events.

    ``restart``: turn ``turn + 1`` starts with the same prompt (and notices), unless the
    budget leaves no room (the agent is held ``budget-exhausted`` instead). ``escalate``: the
    agent is held ``blocked`` (reason ``stalled``; a decision opens, its parent hears).
    ``eject``: the agent fails (reason ``stalled``), its parent hears if it asked to."""
    agent_id = rec["id"]
    policy = policy_of(spec)
    heartbeat_s = spec.heartbeat_s or 0.0
    count = rec.get("stallRecoveries", 0)
    action = policy.action_for(count)
    error = stall_error(silence_s, heartbeat_s)
    if action is RecoveryAction.EJECT:
        detail = f"ejected after {count} recoveries (maxRetries {policy.max_retries})"
        if count < policy.max_retries:
            detail = "ejected (the policy's action is eject)"
    elif action is RecoveryAction.ESCALATE:
        detail = f"escalated after {count} recoveries (escalateAfter {policy.escalate_after})"
        if count < policy.escalate_after:
            detail = "escalated (the policy's action is escalate)"
    else:
        detail = (
            f"turn {turn} restarted as turn {turn + 1}: recovery {count + 1}, "
            f"escalateAfter {policy.escalate_after}, maxRetries {policy.max_retries}"
        )
    events = [_report(rec, spec, turn, silence_s)] if first else []
    events.append(ev.stall_recovery(agent_id, _data(turn, action, count + 1, policy, detail)))
    events += before
    events.append(ev.turn_interrupted(agent_id, turn, error))
    tx = preview(state, events, now.isoformat())
    after = tx.get_agent(agent_id)
    assert after is not None
    if action is RecoveryAction.ESCALATE:
        return Recovery(events + _decisions.hold(state, after, STALLED, error), action)
    if action is RecoveryAction.EJECT:
        events.append(ev.failed(agent_id, error, reason=STALLED))
        events += _notices.on_turn(state, after, spec, "failed", error=error)
        events += _decisions.drop_pending(state, agent_id)
        return Recovery(events, action)
    why = _decisions.exhausted(after, spec, now, tx.get_agent)
    if why is not None:
        return Recovery(events + _decisions.budget_hold(state, after, why), action)
    assert rec["lastPrompt"] is not None  # a turn in flight has its prompt
    restart = turn + 1
    # The session keeps what the agent is sent again: the prompt with the notices it carried.
    text = _notices.resend_text(state, rec)
    events.append(
        ev.turn_started(
            agent_id, restart, rec["lastPrompt"], retry=False, notices=[], restart=True, text=text
        )
    )
    return Recovery(events, action, restart)
