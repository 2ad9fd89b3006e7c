"""An agent's lifecycle past its turns: a graceful stop (and its cascade), restart, delete.

Stopping (see "Stopping, restarting, deleting" in docs/daemon.md):

- The stop is decided and committed at once, under the service's lock: the agent is
  ``stopped`` from that commit on (there is no ``stopping`` state: a stopped agent takes no
  command but ``restart`` and ``delete``), its turn in flight interrupted. Its descendants
  are stopped in the same commit, children first (:func:`cascade`), unless the caller keeps
  them.
- What ends its turn's processes runs afterwards, off the lock (:class:`Endings`): a harness
  that can be asked (:class:`~corral.daemon.harnesses.TerminatingHarness`: ``command``,
  ``python``) gets ``terminate`` -- SIGTERM to the turn's process group, or the worker's --
  and the turn has the spec's ``stopGraceS`` to end; then it is cancelled, which kills
  (SIGKILL). Other harnesses (``openai``: a model call is only waited on) and ``now`` are
  cancelled at once, under the lock as before, so that what the turn had spent is known
  when its interruption is written.
- Shutting down kills every turn still in its grace at once (its stop is committed); a
  daemon that starts kills what a stop left running when the last one died (``reap`` of the
  stopped agents' harnesses). ``restart`` and ``delete`` of an agent still in its grace kill
  its turn first.

Restart: a stopped or failed agent runs again (:func:`restart`): the same spec, its session
(what its ``history`` kept), its working directory, turn numbers going on from the last one;
its consecutive failures and retries start from nothing. Its usage is kept, and so its
budget (tokens, dollars, turns, the deadline from its creation) is not refilled: an agent
with no room left is held ``budget-exhausted``, for a person to raise it (``PATCH``).

Delete: an ended agent and its descendants, all ended (:func:`deletion_order`), go in one
commit of ``agent.deleted`` events (deepest first): the projections forget them, the stores
delete their rows (``delete_agent_data``), the service their directories. Their events stay
in the log, the last one of each saying it was deleted.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime

from corral.daemon import _decisions, _notices, _runs
from corral.daemon import _events as ev
from corral.daemon._errors import AgentLiveError, ParentEndedError
from corral.daemon._events import NewEvent
from corral.daemon._records import AgentRecord
from corral.daemon._spec import AgentSpec
from corral.daemon._state import ENDED_STATES, State, preview
from corral.kernel import Clock

logger = logging.getLogger("corral.daemon")

RESTARTED = "restarted"  # the reason of the state change that makes a restarted agent live


def cascade(state: State, rec: AgentRecord, *, keep_children: bool) -> list[AgentRecord]:
    """The live agents a stop of ``rec`` stops: its live descendants, deepest first, then
    ``rec`` itself (only ``rec`` with ``keep_children``)."""
    if keep_children:
        return [rec]
    return _runs.stop_order(state, rec)


def deletion_order(state: State, rec: AgentRecord) -> list[AgentRecord]:
    """``rec`` and its descendants, deepest first: what deleting ``rec`` deletes. Raises
    :class:`AgentLiveError` when one of them is live (stop it first)."""
    nodes = _runs.tree(state, rec)
    order = sorted(range(len(nodes)), key=lambda i: -nodes[i]["depth"])
    found = [state.agents[nodes[i]["id"]] for i in order]
    for one in sorted(found, key=lambda r: r["id"] != rec["id"]):  # itself named first
        if one["state"] not in ENDED_STATES:
            of = None if one["id"] == rec["id"] else rec["id"]
            raise AgentLiveError(one["id"], one["state"], "deleted", of=of)
    return found


def deleted(order: list[AgentRecord], by: str | None, why: str | None) -> list[NewEvent]:
    """The ``agent.deleted`` events of :func:`deletion_order` (the top one last)."""
    top = order[-1]["id"]
    return [ev.deleted(r["id"], by, why, with_=None if r["id"] == top else top) for r in order]


@dataclass(frozen=True, slots=True)
class Restart:
    """What a restart commits, and the turn it starts (None: none; it is idle or held)."""

    events: list[NewEvent]
    turn: int | None
    text: str


def restart(
    state: State,
    rec: AgentRecord,
    spec: AgentSpec,
    by: str | None,
    why: str | None,
    now: datetime,
) -> Restart:
    """Restart the ended agent ``rec``: ``agent.restarted``, then it runs its last prompt
    again (pending notices in front, as a prompt does), goes idle when it never had one,
    or is held ``budget-exhausted`` when its budget (or an ancestor's) leaves no room.
    Raises :class:`AgentLiveError` for a live agent, :class:`ParentEndedError` for one
    whose parent has ended."""
    agent_id, was = rec["id"], rec["state"]
    if was not in ENDED_STATES:
        raise AgentLiveError(agent_id, was, "restarted")
    parent = state.agents.get(rec["parent"]) if rec["parent"] is not None else None
    if parent is not None and parent["state"] in ENDED_STATES:
        raise ParentEndedError(agent_id, parent["id"], parent["state"])
    events = [ev.restarted(agent_id, was, by, why, rec.get("restarts", 0) + 1)]
    # An agent in its own process (harness external) begins its turns itself: it goes idle.
    prompt = None if spec.harness == "external" else rec["lastPrompt"]
    awake = preview(state, events, now.isoformat()).get_agent(agent_id)
    assert awake is not None
    exhausted = _decisions.exhausted(awake, spec, now, state.agents.get) if prompt else None
    if not prompt or exhausted is not None:
        events.append(_became(agent_id, was, "idle", by, why))
        if exhausted is not None:
            idle = preview(state, events, now.isoformat()).get_agent(agent_id)
            assert idle is not None
            events += _decisions.budget_hold(state, idle, exhausted)
        return Restart(events, None, "")
    assert prompt is not None
    pending = _notices.pending(state, agent_id)
    text = _notices.with_notices(prompt, pending)
    turn = rec["turns"] + 1
    events.append(_became(agent_id, was, "running", by, why))
    events.append(
        ev.turn_started(
            agent_id, turn, prompt, retry=False, notices=[n["id"] for n in pending], text=text
        )
    )
    return Restart(events, turn, text)


def _became(agent_id: str, was: str, to: str, by: str | None, why: str | None) -> NewEvent:
    data = {"from": was, "to": to, "reason": RESTARTED, "by": by, "why": why}
    return NewEvent(ev.STATE_CHANGED, agent_id, data)


# --- graceful ends ------------------------------------------------------------------------


Terminate = Callable[[], Awaitable[bool]]


class Endings:
    """The turns of stopped agents that are ending: asked to end (``terminate``), given
    their grace on ``clock``, then cancelled (killed). Each runs on a task of its own, off
    the service's lock; ``then`` runs once the turn has ended (the harness's release)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._turns: dict[str, asyncio.Task[None]] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def __contains__(self, agent_id: object) -> bool:
        return agent_id in self._tasks

    def begin(
        self,
        agent_id: str,
        turn: asyncio.Task[None],
        terminate: Terminate,
        grace_s: float,
        then: Callable[[], Awaitable[None]],
    ) -> None:
        """End ``turn`` of ``agent_id`` gracefully (see the class docstring)."""
        self._turns[agent_id] = turn
        task = asyncio.create_task(
            self._end(agent_id, turn, terminate, grace_s, then), name=f"stop-{agent_id}"
        )
        self._tasks[agent_id] = task

        def done(t: asyncio.Task[None]) -> None:
            if self._tasks.get(agent_id) is t:
                del self._tasks[agent_id]
                self._turns.pop(agent_id, None)

        task.add_done_callback(done)

    async def _end(
        self,
        agent_id: str,
        turn: asyncio.Task[None],
        terminate: Terminate,
        grace_s: float,
        then: Callable[[], Awaitable[None]],
    ) -> None:
        try:
            try:
                asked = await terminate()
            except Exception:
                logger.exception("agent %s: could not ask its turn to end", agent_id)
                asked = False
            if asked:
                logger.info("agent %s: asked its turn to end (%g s of grace)", agent_id, grace_s)
                await _within(turn, grace_s, self.clock)
            if not turn.done():
                if asked:
                    logger.info("agent %s: its turn outlived its grace: killed", agent_id)
                turn.cancel()
            await asyncio.gather(turn, return_exceptions=True)
        finally:
            try:
                await then()
            except Exception:
                logger.exception("agent %s: could not release its harness", agent_id)

    async def finish(self, agent_id: str) -> None:
        """Kill ``agent_id``'s ending turn now and wait until it is over (nothing to do
        when none is ending)."""
        turn = self._turns.get(agent_id)
        if turn is not None and not turn.done():
            turn.cancel()
        task = self._tasks.get(agent_id)
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)

    async def close(self) -> None:
        """Kill every ending turn now (shutting down) and wait for them."""
        for turn in list(self._turns.values()):
            turn.cancel()
        await asyncio.gather(*list(self._tasks.values()), return_exceptions=True)


async def _within(task: asyncio.Task[None], seconds: float, clock: Clock) -> None:
    """Wait until ``task`` is done or ``seconds`` of ``clock`` have passed."""
    timer = asyncio.ensure_future(clock.sleep(seconds))
    try:
        await asyncio.wait({task, timer}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        timer.cancel()
