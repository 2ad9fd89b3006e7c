"""``SpawnTracker``: the headcount cap of a run, with cooperative preemption; ``PauseGate``."""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from corral.kernel import (
    SYSTEM_CLOCK,
    Clock,
    Priority,
    SpawnBudget,
    SpawnBudgetExceeded,
    UnknownAgentError,
    UsageError,
)
from corral.kernel import _validate as v

logger = logging.getLogger("corral.runtime.spawn")

AgentCallback = Callable[[str], object]
"""``on_pause``/``on_resume``: called with the agent id; may return an awaitable."""

_PREEMPTING = frozenset({Priority.HIGH, Priority.CRITICAL})


class AgentAlreadyTrackedError(UsageError):
    """``acquire`` was called for an id that already holds a slot or is paused."""

    code = "agent_already_tracked"

    def __init__(self, agent_id: str, state: str) -> None:
        super().__init__(
            f"SpawnTracker.acquire: agent {agent_id!r} is already {state}; "
            "release it before acquiring it again",
            agent_id=agent_id,
            state=state,
        )
        self.agent_id = agent_id
        self.state = state


@dataclass(frozen=True, slots=True, kw_only=True)
class TrackedAgent:
    """One agent as the tracker sees it.

    ``changed_at`` is when it entered its current state (took its slot, or was paused);
    ``pauses`` is how many times it has been paused so far.
    """

    agent_id: str
    priority: Priority
    changed_at: datetime
    pauses: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "agent_id": self.agent_id,
            "priority": self.priority.name,
            "changed_at": self.changed_at.isoformat(),
            "pauses": self.pauses,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class SpawnSnapshot:
    """A consistent view of a tracker for a status page.

    ``active`` is in admission order, ``paused`` in resume order; ``preemptions`` and
    ``refusals`` count since the tracker was created.
    """

    max_agents: int
    allow_preempt: bool
    active: tuple[TrackedAgent, ...]
    paused: tuple[TrackedAgent, ...]
    free_slots: int
    preemptions: int
    refusals: int

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (priorities by name, instants in ISO-8601)."""
        return {
            "max_agents": self.max_agents,
            "allow_preempt": self.allow_preempt,
            "active": [a.to_dict() for a in self.active],
            "paused": [a.to_dict() for a in self.paused],
            "free_slots": self.free_slots,
            "preemptions": self.preemptions,
            "refusals": self.refusals,
        }


@dataclass(slots=True, eq=False)
class _Agent:
    agent_id: str
    priority: Priority
    on_pause: AgentCallback | None
    on_resume: AgentCallback | None
    admitted: int
    changed_at: datetime
    queued: int = 0
    pauses: int = 0
    # Notifications waiting to be delivered, in the order of the state changes they report.
    outbox: deque[tuple[str, AgentCallback]] = field(default_factory=deque)
    delivering: bool = False

    def view(self) -> TrackedAgent:
        return TrackedAgent(
            agent_id=self.agent_id,
            priority=self.priority,
            changed_at=self.changed_at,
            pauses=self.pauses,
        )


class SpawnTracker:
    """Counts the agents of one run against its :class:`SpawnBudget`; one per run.

    The cap (``spawn_budget.max_agents``) counts the agents that hold a slot, the root
    included. Paused agents hold no slot.

    - :meth:`acquire` below the cap grants a slot. At the cap, a HIGH or CRITICAL request
      (when ``allow_preempt`` is on) pauses the lowest-priority active agent whose priority is
      strictly below its own -- among equals the most recently admitted (first ``acquire``),
      so the least work is set aside -- calls that agent's ``on_pause`` and takes its slot.
      Otherwise it raises :class:`SpawnBudgetExceeded` (retryable) naming the cap and the
      count. A newcomer never overtakes a paused agent of equal or higher priority: while one
      waits, the request is refused rather than preempting.
    - :meth:`release` frees a slot; the best paused agent (highest priority, then first
      paused) takes it at once and its ``on_resume`` is called, so a free slot never coexists
      with a waiting paused agent.
    - :meth:`reprioritize` changes the ranking for later decisions only; it never pauses or
      resumes anyone by itself.

    Callbacks get the agent id, may be plain or async, and run after the state change is
    complete (never under a lock: every state change is a single synchronous step). The
    callbacks of one agent are delivered in the order of its state changes; when an earlier
    one is still running, a later one is queued and delivered by that same task right after.
    A callback that raises is logged on ``corral.runtime.spawn``; the state change stands and
    the call that triggered it returns normally. If the calling task is cancelled while a
    callback runs, the state change stands too (release a granted slot yourself).

    Call it from one event loop.
    """

    __slots__ = (
        "_active",
        "_background",
        "_budget",
        "_clock",
        "_paused",
        "_preemptions",
        "_refusals",
        "_seq",
    )

    def __init__(self, spawn_budget: SpawnBudget, *, clock: Clock = SYSTEM_CLOCK) -> None:
        v.instance_of("SpawnTracker", "spawn_budget", spawn_budget, SpawnBudget)
        v.instance_of("SpawnTracker", "clock", clock, Clock)
        self._budget = spawn_budget
        self._clock = clock
        self._active: dict[str, _Agent] = {}
        self._paused: dict[str, _Agent] = {}
        self._seq = itertools.count()
        self._preemptions = 0
        self._refusals = 0
        self._background: set[asyncio.Task[None]] = set()

    # --- operations -----------------------------------------------------------------------

    async def acquire(
        self,
        agent_id: str,
        priority: Priority = Priority.NORMAL,
        *,
        on_pause: AgentCallback | None = None,
        on_resume: AgentCallback | None = None,
        pausable: Callable[[str], bool] | None = None,
    ) -> str | None:
        """Take a slot for ``agent_id``; return the id of the agent paused for it, or None.

        ``pausable`` (given an active agent's id) narrows who may be paused for it: an agent
        it answers False for keeps its slot (one that waits on a person, say); None: anyone.

        Raises :class:`SpawnBudgetExceeded` at the cap when nobody can be preempted,
        :class:`AgentAlreadyTrackedError` when the id holds a slot or is paused, and
        :class:`InvalidArgumentError` on bad arguments.
        """
        where = "SpawnTracker.acquire"
        v.non_empty_str(where, "agent_id", agent_id)
        v.instance_of(where, "priority", priority, Priority)
        if on_pause is not None:
            v.callable_(where, "on_pause", on_pause)
        if on_resume is not None:
            v.callable_(where, "on_resume", on_resume)
        if pausable is not None:
            v.callable_(where, "pausable", pausable)
        state = self.state_of(agent_id)
        if state is not None:
            raise AgentAlreadyTrackedError(agent_id, state)

        victim: _Agent | None = None
        if len(self._active) >= self._budget.max_agents:
            victim = self._pick_victim(agent_id, priority, pausable)
            del self._active[victim.agent_id]
            victim.queued = next(self._seq)
            victim.pauses += 1
            victim.changed_at = self._clock.now()
            self._paused[victim.agent_id] = victim
            self._preemptions += 1
        self._active[agent_id] = _Agent(
            agent_id=agent_id,
            priority=priority,
            on_pause=on_pause,
            on_resume=on_resume,
            admitted=next(self._seq),
            changed_at=self._clock.now(),
        )
        if victim is None:
            return None
        logger.info(
            "agent %r (%s) paused to make room for %r (%s)",
            victim.agent_id,
            victim.priority.name,
            agent_id,
            priority.name,
        )
        await self._notify(victim, "on_pause", victim.on_pause)
        return victim.agent_id

    def _pick_victim(
        self, agent_id: str, priority: Priority, pausable: Callable[[str], bool] | None
    ) -> _Agent:
        """The agent to pause for ``agent_id``; raises SpawnBudgetExceeded when there is none."""
        why: str | None = None
        if priority not in _PREEMPTING:
            why = f"priority {priority.name} may not preempt; only HIGH and CRITICAL may"
        elif not self._budget.allow_preempt:
            why = "preemption is off (allow_preempt=False)"
        else:
            ahead = [a for a in self._paused.values() if a.priority >= priority]
            if ahead:
                first = min(ahead, key=_resume_rank)
                why = (
                    f"paused agent {first.agent_id!r} ({first.priority.name}) waits for a "
                    "slot first"
                )
            else:
                lower = [a for a in self._active.values() if a.priority < priority]
                why = f"no active agent has a priority below {priority.name}"
                if lower and pausable is not None:
                    lower = [a for a in lower if pausable(a.agent_id)]
                    why = f"no active agent below {priority.name} may be paused now"
                if lower:
                    return min(lower, key=lambda a: (a.priority, -a.admitted))
        self._refusals += 1
        raise SpawnBudgetExceeded(self._budget.max_agents, len(self._active), agent_id, why)

    async def release(self, agent_id: str) -> str | None:
        """Free ``agent_id``'s slot, or take it out of the paused queue.

        Returns the id of the paused agent that took the freed slot (its ``on_resume`` is
        called), or None. Not idempotent: an id that is neither active nor paused (never
        acquired, or released already) raises :class:`UnknownAgentError`. A released id may
        be acquired again.
        """
        v.non_empty_str("SpawnTracker.release", "agent_id", agent_id)
        if self._paused.pop(agent_id, None) is not None:
            return None
        if self._active.pop(agent_id, None) is None:
            raise _unknown("SpawnTracker.release", agent_id)
        if not self._paused:
            return None
        best = min(self._paused.values(), key=_resume_rank)
        del self._paused[best.agent_id]
        best.changed_at = self._clock.now()
        self._active[best.agent_id] = best
        logger.info("agent %r (%s) resumed", best.agent_id, best.priority.name)
        await self._notify(best, "on_resume", best.on_resume)
        return best.agent_id

    def restore(self, agent_id: str, priority: Priority, *, paused: bool = False) -> None:
        """Track ``agent_id`` as a record of the run says it was: holding a slot, or
        ``paused`` (queued to resume, after those restored paused before it at its
        priority). For rebuilding a tracker after a restart: no callback is called, and the
        cap is not checked (what was recorded stands; a free slot beside a paused agent is
        the caller's to fill). Restore active agents in admission order: the most recent is
        the first paused among equals. Raises :class:`AgentAlreadyTrackedError` for an id
        already tracked."""
        where = "SpawnTracker.restore"
        v.non_empty_str(where, "agent_id", agent_id)
        v.instance_of(where, "priority", priority, Priority)
        state = self.state_of(agent_id)
        if state is not None:
            raise AgentAlreadyTrackedError(agent_id, state)
        agent = _Agent(
            agent_id=agent_id,
            priority=priority,
            on_pause=None,
            on_resume=None,
            admitted=next(self._seq),
            changed_at=self._clock.now(),
        )
        if paused:
            agent.queued = next(self._seq)
            agent.pauses = 1
            self._paused[agent_id] = agent
        else:
            self._active[agent_id] = agent

    async def reprioritize(self, agent_id: str, priority: Priority) -> None:
        """Set the priority of an active or paused agent for later decisions.

        Moves a paused agent within the resume order (its place among equals stays the
        moment it was paused). Never pauses or resumes anyone by itself: the new ranking
        counts at the next ``acquire`` or ``release``. Raises :class:`UnknownAgentError` for
        an id that is neither active nor paused.
        """
        where = "SpawnTracker.reprioritize"
        v.non_empty_str(where, "agent_id", agent_id)
        v.instance_of(where, "priority", priority, Priority)
        agent = self._active.get(agent_id) or self._paused.get(agent_id)
        if agent is None:
            raise _unknown(where, agent_id)
        agent.priority = priority

    # --- introspection --------------------------------------------------------------------

    @property
    def spawn_budget(self) -> SpawnBudget:
        return self._budget

    @property
    def max_agents(self) -> int:
        return self._budget.max_agents

    @property
    def active(self) -> dict[str, Priority]:
        """Agents holding a slot and their priorities, in admission order (a copy)."""
        return {a.agent_id: a.priority for a in self._active.values()}

    @property
    def paused(self) -> dict[str, Priority]:
        """Paused agents and their priorities, in resume order (a copy)."""
        return {a.agent_id: a.priority for a in self._paused_in_order()}

    @property
    def free_slots(self) -> int:
        return self._budget.max_agents - len(self._active)

    def state_of(self, agent_id: str) -> Literal["active", "paused"] | None:
        """``"active"``, ``"paused"``, or None for an id the tracker does not hold."""
        if agent_id in self._active:
            return "active"
        if agent_id in self._paused:
            return "paused"
        return None

    def snapshot(self) -> SpawnSnapshot:
        return SpawnSnapshot(
            max_agents=self._budget.max_agents,
            allow_preempt=self._budget.allow_preempt,
            active=tuple(a.view() for a in self._active.values()),
            paused=tuple(a.view() for a in self._paused_in_order()),
            free_slots=self.free_slots,
            preemptions=self._preemptions,
            refusals=self._refusals,
        )

    def _paused_in_order(self) -> list[_Agent]:
        return sorted(self._paused.values(), key=_resume_rank)

    def __contains__(self, agent_id: object) -> bool:
        return agent_id in self._active or agent_id in self._paused

    def __repr__(self) -> str:
        return (
            f"SpawnTracker(active={len(self._active)}/{self._budget.max_agents}, "
            f"paused={len(self._paused)}, allow_preempt={self._budget.allow_preempt})"
        )

    # --- callbacks ------------------------------------------------------------------------

    async def _notify(self, agent: _Agent, kind: str, callback: AgentCallback | None) -> None:
        if callback is None:
            return
        agent.outbox.append((kind, callback))
        if not agent.delivering:
            await self._deliver(agent)

    async def _deliver(self, agent: _Agent) -> None:
        agent.delivering = True
        try:
            while agent.outbox:
                kind, callback = agent.outbox.popleft()
                try:
                    result = callback(agent.agent_id)
                    if inspect.isawaitable(result):
                        await result
                except Exception:
                    logger.exception(
                        "%s callback of agent %r raised; the state change stands",
                        kind,
                        agent.agent_id,
                    )
        finally:
            agent.delivering = False
            if agent.outbox:
                # The delivering task was cancelled: hand the rest to a task of its own so
                # no later notification of this agent is lost.
                task = asyncio.get_running_loop().create_task(self._deliver(agent))
                self._background.add(task)
                task.add_done_callback(self._background.discard)


def _resume_rank(agent: _Agent) -> tuple[int, int]:
    return (-agent.priority, agent.queued)


class PauseGate:
    """The checkpoint an agent loop uses to honour cooperative pauses.

    Pass ``gate.pause`` and ``gate.resume`` as ``on_pause``/``on_resume`` to
    :meth:`SpawnTracker.acquire`, and ``await gate.wait_resumed()`` at each checkpoint of the
    loop (between turns, before a model call): it returns at once while the gate is open and
    blocks while it is paused. ``pause`` and ``resume`` are idempotent and take an optional
    agent id only so that they fit the callback shape. Starts open.
    """

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._event.set()

    @property
    def is_paused(self) -> bool:
        return not self._event.is_set()

    def pause(self, agent_id: str | None = None) -> None:
        """Close the gate: the next ``wait_resumed`` blocks until :meth:`resume`."""
        v.non_empty_str("PauseGate.pause", "agent_id", agent_id, optional=True)
        self._event.clear()

    def resume(self, agent_id: str | None = None) -> None:
        """Open the gate and wake every waiter."""
        v.non_empty_str("PauseGate.resume", "agent_id", agent_id, optional=True)
        self._event.set()

    async def wait_resumed(self) -> None:
        """Return once the gate is open (at once when it is not paused)."""
        # Loop: a pause that lands between the wake-up and this task running holds it again.
        while not self._event.is_set():
            await self._event.wait()

    def __repr__(self) -> str:
        return f"PauseGate({'paused' if self.is_paused else 'open'})"


def _unknown(where: str, agent_id: str) -> UnknownAgentError:
    return UnknownAgentError(
        agent_id,
        f"{where}: agent {agent_id!r} holds no slot and is not paused "
        "(never acquired, or already released)",
        where=where,
    )
