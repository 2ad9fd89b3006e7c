"""Headcount and priority: each run's ``spawnBudget`` cap, held by the runtime's
:class:`~corral.runtime.SpawnTracker` (one per run), with preemption to ``paused``.

The rules (docs/daemon.md, "Headcount and priority"):

- The cap (the root's ``spawnBudget.maxAgents``; 50 without one) bounds the run's *active*
  agents: live and not paused (running, waiting, idle, blocked). Paused agents hold no slot.
  It holds for the whole run: a spawn at the cap either pauses someone for the newcomer in
  the same commit, or is refused ``spawn_budget_exceeded`` naming the cap and the count.
- At the cap, a ``high`` or ``critical`` spawn with ``allowPreempt`` pauses the lowest-priority
  active agent below it, the most recently created among equals, that is ``running`` (not
  waiting on a person) or ``idle``; a paused agent of equal or higher priority than the
  newcomer is resumed before any newcomer overtakes it (the spawn is refused instead).
- A paused agent starts nothing new. Its turn in flight, by its spec's ``onPreempt``:
  ``finish`` runs to its end, its outcome written as always (usage, output, notices), but the
  agent stays paused and remembers what the outcome leads to (``resumeTo``: ``idle``,
  ``blocked`` on the decision a hold opened, ``retry`` when its policy asked for one; a
  failure that ends it ends it); ``cancel`` cancels it at once, recorded as
  ``agent.turn_interrupted`` (not a failure), and it runs again on resume (``turn``).
- Prompts to a paused agent (and answers to its hold other than ``stop``) are refused
  ``agent_paused`` (409, retryable); notices to it queue as for any agent. It can be stopped.
- As soon as headcount frees (an active agent ends: stopped, failed), the best paused agent
  (highest priority, then paused first) resumes in the same step: to ``running`` when its
  finishing turn is still in flight, else to what it remembered (``retry`` and ``turn`` start
  the turn, unless its budget has no room left: then it is held ``budget-exhausted``).

Trackers are rebuilt from the state when the daemon starts, and whenever one is found to
disagree with the state (a commit that failed after the tracker had moved): the state is the
truth, the tracker its index.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypedDict

from corral.daemon import _decisions, _notices
from corral.daemon import _events as ev
from corral.daemon._errors import AgentPausedError, SpawnRefusedError
from corral.daemon._events import NewEvent
from corral.daemon._records import AgentRecord
from corral.daemon._spec import AgentSpec
from corral.daemon._state import ENDED_STATES, LIVE_STATES, PAUSED, State
from corral.kernel import SYSTEM_CLOCK, Clock, Priority, SpawnBudget, SpawnBudgetExceeded
from corral.runtime import SpawnTracker

__all__ = [
    "PRIORITIES",
    "Headcount",
    "asked",
    "HeadcountView",
    "headcount",
    "pause_events",
    "priority_of",
    "refuse_if_paused",
    "resume_events",
    "while_paused",
]

logger = logging.getLogger("corral.daemon")

PRIORITIES = {
    "low": Priority.LOW,
    "normal": Priority.NORMAL,
    "high": Priority.HIGH,
    "critical": Priority.CRITICAL,
}
"""The spec's ``priority`` as the kernel's :class:`Priority` (whose values, 1/2/4/8, are
also the weights of the daemon's concurrent-turn shares: see ``_slots``)."""

PAUSABLE_STATES = frozenset({"running", "idle"})  # not waiting or blocked: a person is involved

SpecOf = Callable[[str], AgentSpec]


class HeadcountView(TypedDict):
    """A run's headcount: ``active`` agents (live, not paused) against ``max``; ``paused``."""

    active: int
    paused: int
    max: int
    allowPreempt: bool


def headcount(state: State, run_id: str) -> HeadcountView:
    """Run ``run_id``'s headcount against its cap, from the state alone (for ``GET
    /runs/{id}``): ``{"active", "paused", "max", "allowPreempt"}``. A run nobody knows counts
    nothing against the default cap."""
    budget = SpawnBudget()
    active = paused = 0
    for rec in state.agents.values():
        if rec["runId"] != run_id:
            continue
        if rec["parent"] is None:
            budget = _budget_of(rec["spec"])
        if rec["state"] == PAUSED:
            paused += 1
        elif rec["state"] in LIVE_STATES:
            active += 1
    return {
        "active": active,
        "paused": paused,
        "max": budget.max_agents,
        "allowPreempt": budget.allow_preempt,
    }


def refuse_if_paused(rec: AgentRecord) -> None:
    """:class:`AgentPausedError` when the agent is paused."""
    if rec["state"] == PAUSED:
        raise AgentPausedError(rec["id"], rec.get("pausedBy"))


class Headcount:
    """The trackers of the runs this daemon holds agents of, kept in step with the state.

    Call every method with the service's lock held, the state as committed so far.
    """

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock
        self._runs: dict[str, SpawnTracker] = {}

    async def rebuild(self, state: State, spec_of: SpecOf) -> list[str]:
        """Rebuild every run's tracker from ``state`` (the daemon starts): paused agents stay
        paused. Answers the paused agents a free slot is waiting for (none, unless a resume
        was lost), best first: the caller resumes them."""
        self._runs.clear()
        runs = {rec["runId"] for rec in state.agents.values() if rec["state"] in LIVE_STATES}
        freed: list[str] = []
        for run_id in sorted(runs):
            freed += await _fill(self._rebuild_run(state, run_id, spec_of))
        return freed

    def tracker(self, run_id: str) -> SpawnTracker | None:
        """Run ``run_id``'s tracker, if it has live agents (for a status page)."""
        return self._runs.get(run_id)

    async def admit(
        self, state: State, run_id: str, agent_id: str, spec: AgentSpec, spec_of: SpecOf
    ) -> str | None:
        """Take a slot of run ``run_id`` for new agent ``agent_id``: the id of the agent
        paused for it (the caller commits :func:`pause_events` with the new agent), or None.
        Raises :class:`SpawnRefusedError` (cap, count and why) when there is no room."""
        tracker = self._runs.get(run_id)
        if tracker is None and spec.parent is None:
            tracker = self._runs[run_id] = SpawnTracker(self._budget(spec), clock=self._clock)
        elif tracker is None or not _agrees(tracker, state, run_id):
            tracker = self._rebuild_run(state, run_id, spec_of)

        def pausable(candidate: str) -> bool:
            rec = state.agents.get(candidate)
            return rec is not None and rec["state"] in PAUSABLE_STATES

        try:
            return await tracker.acquire(agent_id, priority_of(spec), pausable=pausable)
        except SpawnBudgetExceeded as exc:
            raise SpawnRefusedError(run_id, exc.max_agents, exc.active, exc.why) from None

    async def freed(self, state: State, ended: Iterable[str], spec_of: SpecOf) -> list[str]:
        """Agents ``ended`` (now stopped or failed in ``state``) give back their slots: the
        paused agents that take them, best first (the caller resumes them)."""
        by_run: dict[str, list[str]] = {}
        for agent_id in ended:
            rec = state.agents.get(agent_id)
            if rec is not None:
                by_run.setdefault(rec["runId"], []).append(agent_id)
        resumed: list[str] = []
        for run_id, gone in by_run.items():
            tracker = self._runs.get(run_id)
            if tracker is not None and _agrees(tracker, state, run_id, leaving=set(gone)):
                for agent_id in gone:
                    if agent_id in tracker:
                        taker = await tracker.release(agent_id)
                        if taker is not None:
                            resumed.append(taker)
            else:
                tracker = self._rebuild_run(state, run_id, spec_of)
            resumed += await _fill(tracker)
            if not tracker.active and not tracker.paused:
                del self._runs[run_id]  # the run has ended: nothing left to count
        return resumed

    def _rebuild_run(self, state: State, run_id: str, spec_of: SpecOf) -> SpawnTracker:
        members = [r for r in state.agents.values() if r["runId"] == run_id]
        root = next((r for r in members if r["parent"] is None), None)
        budget = SpawnBudget() if root is None else self._budget(spec_of(root["id"]))
        tracker = SpawnTracker(budget, clock=self._clock)
        live = [r for r in members if r["state"] in LIVE_STATES]
        # Admission order is creation order (the most recent is paused first among equals);
        # the paused queue keeps the order they were paused in.
        for rec in sorted(live, key=lambda r: r["createdAt"]):
            if rec["state"] != PAUSED:
                tracker.restore(rec["id"], priority_of(spec_of(rec["id"])))
        paused = [r for r in live if r["state"] == PAUSED]
        for rec in sorted(paused, key=lambda r: r.get("pausedAt", r["updatedAt"])):
            tracker.restore(rec["id"], priority_of(spec_of(rec["id"])), paused=True)
        self._runs[run_id] = tracker
        return tracker

    @staticmethod
    def _budget(root: AgentSpec) -> SpawnBudget:
        return SpawnBudget() if root.spawn_budget is None else root.spawn_budget.to_budget()


def priority_of(spec: AgentSpec) -> Priority:
    return PRIORITIES[spec.priority]


def _budget_of(spec_json: dict[str, Any]) -> SpawnBudget:
    given = spec_json.get("spawnBudget")
    if not isinstance(given, dict):
        return SpawnBudget()
    default = SpawnBudget()
    return SpawnBudget(
        max_agents=given.get("maxAgents", default.max_agents),
        allow_preempt=given.get("allowPreempt", default.allow_preempt),
    )


def _agrees(
    tracker: SpawnTracker, state: State, run_id: str, *, leaving: set[str] | None = None
) -> bool:
    """Whether ``tracker`` holds who ``state`` says (``leaving``: agents ended in the state
    that the tracker is about to release)."""
    leaving = leaving or set()
    active: set[str] = set()
    paused: set[str] = set()
    for rec in state.agents.values():
        if rec["runId"] == run_id and rec["state"] in LIVE_STATES:
            (paused if rec["state"] == PAUSED else active).add(rec["id"])
    return set(tracker.active) - leaving == active and set(tracker.paused) - leaving == paused


async def _fill(tracker: SpawnTracker) -> list[str]:
    """Resume paused agents into free slots (only after a rebuild can there be any)."""
    resumed: list[str] = []
    while tracker.free_slots > 0 and tracker.paused:
        best, priority = next(iter(tracker.paused.items()))
        # Out of the queue and into a slot, as a release would have done it.
        await tracker.release(best)
        await tracker.acquire(best, priority)
        resumed.append(best)
    return resumed


# --- events --------------------------------------------------------------------------------


def pause_events(
    rec: AgentRecord, spec: AgentSpec, by: str, *, queued: bool = False
) -> tuple[list[NewEvent], bool]:
    """Pause ``rec`` for agent ``by``: the events, and whether its turn in flight is to be
    cancelled (``onPreempt: cancel``, or ``queued``: the turn waits for one of the daemon's
    concurrent-turn slots, so it has not started and a paused agent starts nothing; the
    caller cancels the task)."""
    turn = rec["turnInFlight"]
    if turn is None:
        return [ev.paused(rec["id"], rec["state"], by, "idle")], False
    if spec.on_preempt == "cancel" or queued:
        why = f"preempted by {by} at the run's headcount cap"
        return [
            ev.turn_interrupted(rec["id"], turn, why),
            ev.paused(rec["id"], rec["state"], by, "turn"),
        ], True
    # finish: the turn goes on; what it leads to is known when it ends (see while_paused).
    return [ev.paused(rec["id"], rec["state"], by, "idle")], False


def while_paused(
    rec: AgentRecord, events: Sequence[NewEvent], retry: int | None
) -> tuple[list[NewEvent], int | None]:
    """The events of a turn that ended while its agent was paused (``onPreempt: finish``),
    and the retry to start (never one, then): what the outcome would make of the agent is
    kept as its ``resumeTo``, and it stays paused, unless the outcome ends it. For an agent
    that is not paused, ``events`` and ``retry`` as they are."""
    if rec["state"] != PAUSED:
        return list(events), retry
    agent_id = rec["id"]
    kept: list[NewEvent] = []
    resume_to, decision = "idle", None
    for event in events:
        if event.agent_id == agent_id and event.type == ev.STATE_CHANGED:
            to = event.data["to"]
            if to in ENDED_STATES:
                kept.append(ev.NewEvent(event.type, agent_id, {**event.data, "from": PAUSED}))
                resume_to = ""
            elif to == "blocked":
                resume_to, decision = "blocked", event.data.get("decision")
            continue
        if event.agent_id == agent_id and event.type == ev.TURN_STARTED:
            # A retry is new work: it waits for the resume; so does a stalled turn's
            # restart, which runs as the turn again (``turn``).
            resume_to = "turn" if event.data.get("restart") else "retry"
            continue
        kept.append(event)
    if resume_to:
        kept.append(ev.paused(agent_id, PAUSED, rec.get("pausedBy"), resume_to, decision=decision))
    return kept, None


def asked(state: State, rec: AgentRecord) -> list[str]:
    """The pending approvals the agent's turn in flight waits on (a paused agent's turn
    that asks a person stays ``paused``, not ``waiting``: this says it waits)."""
    turn = rec["turnInFlight"]
    return [
        d["id"]
        for d in state.decisions.values()
        if turn is not None
        and d["kind"] == "approval"
        and d["state"] == "pending"
        and d["agentId"] == rec["id"]
        and d.get("turn") == turn
    ]


def resume_events(
    state: State, rec: AgentRecord, spec: AgentSpec, now: Any
) -> tuple[list[NewEvent], tuple[int, str] | None]:
    """Resume paused agent ``rec`` (headcount freed): the events, and the turn to start
    (its number and prompt), if one starts."""
    agent_id = rec["id"]
    if rec["turnInFlight"] is not None:
        # Its finishing turn goes on: waiting, when it asked a person while paused.
        waits_on = asked(state, rec)
        if waits_on:
            return [ev.unpaused(agent_id, "waiting", reason="approval", decision=waits_on[0])], None
        return [ev.unpaused(agent_id, "running")], None
    resume_to = rec.get("resumeTo", "idle")
    if resume_to == "blocked":
        found = state.decisions.get(rec.get("decision") or "")
        if found is not None and found["state"] == "pending":
            extra: dict[str, Any] = {"error": found.get("error"), "decision": found["id"]}
            if found.get("dimension") is not None:
                extra["dimension"] = found["dimension"]
            return [ev.unpaused(agent_id, "blocked", reason=found.get("reason"), **extra)], None
        resume_to = "idle"
    # An agent in its own process (harness external) begins its turns itself: none here.
    if resume_to not in ("retry", "turn") or not rec["lastPrompt"] or spec.harness == "external":
        return [ev.unpaused(agent_id, "idle")], None
    why = _decisions.exhausted(rec, spec, now, state.agents.get)
    if why is not None:
        return _decisions.budget_hold(state, rec, why), None
    turn = rec["turns"] + 1
    if resume_to == "retry":
        prompt = _notices.resend_text(state, rec)
        started = ev.turn_started(
            agent_id, turn, rec["lastPrompt"], retry=True, notices=[], text=prompt
        )
    else:
        # The cancelled turn again, with the notices it carried and those queued since.
        notices = _notices.carried(state, rec) + _notices.pending(state, agent_id)
        ids = [n["id"] for n in notices]
        prompt = _notices.with_notices(rec["lastPrompt"], notices)
        started = ev.turn_started(
            agent_id, turn, rec["lastPrompt"], retry=False, notices=ids, text=prompt
        )
    return [ev.unpaused(agent_id, "running"), started], (turn, prompt)
