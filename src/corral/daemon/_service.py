"""``AgentService``: agents under supervision, on top of a Store and the harnesses.

It coordinates: commands and turns decide, ``_events`` builds what they decided, the store
commits it (the reducer in ``_state`` computes the new state), and only then does anything act
on it or hear of it. See "Seed 001" in docs/architecture.md.
"""

# Past 500 lines on purpose: every command and a turn's outcome are decided under the
# service's locks (_run_locks: commands exclusive, a turn's steps per run), and each is a short
# method here over the pure modules that decide.

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import math
import secrets
import shutil
from collections.abc import (
    AsyncGenerator,
    Callable,
    Collection,
    Coroutine,
    Iterable,
    Mapping,
    Sequence,
)
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from corral.daemon import (
    _admission,
    _approvals,
    _budget,
    _commands,
    _decisions,
    _external,
    _headcount,
    _lifecycle,
    _listing,
    _names,
    _notices,
    _patch,
    _queries,
    _retention,
    _runs,
    _sessions,
    _slots,
    _stall,
    _tokens,
    _tracing,
    _tree_budget,
    _turn_records,
    _turns,
    _wake,
)
from corral.daemon import _events as ev
from corral.daemon._approvals import Verdict
from corral.daemon._commands import CommandResult
from corral.daemon._errors import (
    AgentBudgetExhaustedError,
    AgentBusyError,
    AgentNotFoundError,
    AgentNotLiveError,
    AnswerNotAcceptedError,
    DecisionAnsweredError,
    DecisionNotFoundError,
    ExternalAgentError,
    InvalidRequestError,
    NotExternalError,
    NothingToSendError,
    NotOwnerError,
    OutOfScopeError,
    ServiceClosedError,
    StoreUnavailableError,
    TooManyApprovalsError,
)
from corral.daemon._events import Event, NewEvent
from corral.daemon._feed import EventFeed, Observer
from corral.daemon._ownership import Ownership, Relay
from corral.daemon._policy import BUDGET_EXHAUSTED as BUDGET_HELD
from corral.daemon._records import AgentRecord, DecisionRecord, TurnUsage
from corral.daemon._run_locks import RunLocks
from corral.daemon._spec import AgentSpec, parse_spec
from corral.daemon._state import BUSY_STATES, ENDED_STATES, preview
from corral.daemon._text import escape_json
from corral.daemon.guardrails import (
    AskRequest,
    EffectiveRule,
    MatchRule,
    Rule,
    check_custom,
    effective_rules,
    evaluate,
    may_ask,
    rule_to_json,
)
from corral.daemon.harnesses import (
    AdoptingHarness,
    ExternalHarness,
    ExtraTool,
    Harness,
    TerminatingHarness,
    TurnResult,
    WarmHarness,
)
from corral.daemon.stores import Store
from corral.guard import ApprovalRequest
from corral.kernel import SYSTEM_CLOCK, Clock, InvalidArgumentError, TimerHandle, new_id
from corral.kernel import _validate as v

__all__ = ["AgentService", "CommandResult"]

logger = logging.getLogger("corral.daemon")

Json = dict[str, Any]  # a record as the HTTP API returns it

RESTARTED = "daemon restarted during turn"
_RESULT_RETRY_FIRST_S = 0.25  # then doubling, up to _RESULT_RETRY_MAX_S between tries
_RESULT_RETRY_MAX_S = 8.0
DAEMON = "corral"  # who answers an approval nobody answered before its deadline

AgentTools = Callable[[str, AgentSpec], Sequence[ExtraTool]]
"""``tools(agent_id, spec)``: the tools the daemon hands a turn of the agent on top of its
spec's own (see :meth:`AgentService.use_agent_tools`)."""


@dataclass(frozen=True, slots=True)
class Answering:
    """A command given as the answer to a pending decision: it is applied only while the
    decision is pending (``DecisionAnsweredError`` otherwise) and recorded as ``answer``."""

    decision: str
    answer: str
    note: str | None = None

    def body(self, agent_id: str) -> Json:
        return {"decision": self.decision, "answer": self.answer, "agentId": agent_id}


class _Pauses:
    """How long an agent's current turn has waited on people (``paused_s`` of its harness)."""

    __slots__ = ("clock", "since", "total")

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.total = 0.0
        self.since: float | None = None

    def paused_s(self) -> float:
        ongoing = 0.0 if self.since is None else self.clock.monotonic() - self.since
        return self.total + ongoing

    def waiting(self, now_waiting: bool) -> None:
        if now_waiting and self.since is None:
            self.since = self.clock.monotonic()
        elif not now_waiting and self.since is not None:
            self.total += self.clock.monotonic() - self.since
            self.since = None


class AgentService:
    """The agent service: spawn, prompt and stop agents; read their state and events.

    ``home`` holds each agent's working directory (``agents/<id>/work``, kept as long as the
    agent) and the harnesses' bookkeeping (``agents/<id>/state``). ``harnesses`` maps harness
    names (``command``, ``python``, ``openai``) to :class:`Harness` objects. Call
    :meth:`start` once after the store is open: it settles turns that a previous process left
    in flight -- adopts those that were waiting on a person, interrupts the others (see
    :meth:`start`).

    ``result_retry_s``: how long the outcome of a turn is tried again when the store is
    unavailable (``store_unavailable``, retryable) before the agent is left running until a
    restart settles it.

    ``token`` is the daemon's bearer token, when it has one: each agent's environment then
    carries ``CORRAL_TOKEN``, a token scoped to the agent and its descendants (see
    :meth:`in_scope`), next to ``CORRAL_URL``.

    ``guardrails`` are the daemon-wide rules every agent's actions are checked with before
    its own (:meth:`check_action`).

    ``max_concurrent_turns`` bounds the turns that run at once (None: no bound); waiting
    turns are granted slots by their agents' priorities (see ``_slots``).
    """

    def __init__(
        self,
        store: Store,
        *,
        home: str | Path,
        harnesses: Mapping[str, Harness],
        url: str = "http://127.0.0.1:4600",
        clock: Clock = SYSTEM_CLOCK,
        subscriber_buffer: int = 10_000,
        token: str | None = None,
        result_retry_s: float = 60.0,
        guardrails: Sequence[Rule] = (),
        max_concurrent_turns: int | None = None,
        turn_log_bytes: int = _turn_records.DEFAULT_TURN_LOG_BYTES,
        ownership: Ownership | None = None,
    ) -> None:
        where = "AgentService"
        v.instance_of(where, "store", store, Store)
        v.instance_of(where, "home", home, (str, Path))
        v.instance_of(where, "harnesses", harnesses, Mapping)
        for name, harness in harnesses.items():
            if not isinstance(name, str) or not isinstance(harness, Harness):
                raise InvalidArgumentError(
                    where, "harnesses", "a mapping of harness names to Harness objects", harness
                )
        v.non_empty_str(where, "url", url)
        v.instance_of(where, "clock", clock, Clock)
        v.positive_int(where, "subscriber_buffer", subscriber_buffer)
        v.non_empty_str(where, "token", token, optional=True)
        v.non_negative_number(where, "result_retry_s", result_retry_s)
        v.positive_int(where, "turn_log_bytes", turn_log_bytes)
        # Each turn's record, output and capped log (see _turn_records).
        self.turn_book = _turn_records.TurnBook(store, cap=turn_log_bytes)
        self._result_retry_s = result_retry_s
        self._daemon_rules = tuple(guardrails)
        # People's answers reach the checks waiting on them through these (by decision id).
        self._waiters: dict[str, set[ApprovalRequest]] = {}
        self._deadlines: dict[str, TimerHandle] = {}
        self._by_check: dict[tuple[str, int], str] = {}
        self._pauses: dict[str, _Pauses] = {}
        self._background: set[asyncio.Task[None]] = set()
        self._token = token
        self.store = store
        self.home = Path(home)
        self.harnesses = dict(harnesses)
        # Agents in their own process (see _external): always available, nothing to run.
        self.harnesses.setdefault(_external.EXTERNAL, ExternalHarness(clock=clock))
        self.url = url
        self.clock = clock
        self._locks = RunLocks()
        self._turns: dict[str, asyncio.Task[None]] = {}
        # Each agent's parsed spec: filled at spawn, and on first use for agents loaded from
        # the store, so a turn does not parse the record's JSON again; made again when a
        # PATCH replaced the record's spec (see _spec).
        self._specs: dict[str, AgentSpec] = {}
        self._spec_raw: dict[str, object] = {}  # the record's spec each was made from
        self._feed = EventFeed(store, subscriber_buffer)
        # Every event the store merges, this daemon's or another's, reaches the streams in
        # order from here (see _merged).
        store.watch(self._merged)
        # Which agents this daemon acts for: all of them, unless several daemons share the
        # store (docs/daemon.md, "Several daemons").
        self._ownership = ownership
        self.relay: Relay | None = None
        self._closed = False
        # Releases of ended agents' harness workers, run off the mutex (see _release_soon).
        self._releases: set[asyncio.Task[None]] = set()
        # Each run's headcount cap, and the daemon's concurrent turns (docs/daemon.md,
        # "Headcount and priority").
        self._headcount = _headcount.Headcount(clock)
        self._slots = _slots.TurnSlots(max_concurrent_turns)
        # The turns of agents with heartbeatS, watched for stalls (see _stall).
        self._stalls = _stall.StallWatch(clock, self._on_stall)
        # Coordinators: the wake agents a wake task is queued for, and their recent wakes.
        self._waking: set[str] = set()
        self._wakes = _wake.WakeCounter(clock)
        self._agent_tools: AgentTools | None = None
        # What a cancelled turn had spent, as its harness told (agent -> (turn, usage)): the
        # turn's agent.turn_interrupted carries it (see _with_spent).
        self._spent: dict[str, tuple[int, dict[str, Any]]] = {}
        # The turns of stopped agents still in their grace (see _lifecycle).
        self._endings = _lifecycle.Endings(clock)

    # --- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Settle turns left in flight by a previous process, then accept commands.

        A turn that was waiting on a person (its agent ``waiting``) and whose harness can
        adopt it (:class:`AdoptingHarness`) is taken up: its process may be waiting still (a
        command agent in ``corral check`` retries until a daemon answers), and its outcome
        counts as if the daemon had never died; when nothing of it is left, it is settled
        as interrupted after all. Every other turn in flight is interrupted: its leftover
        process is ended, ``agent.turn_interrupted`` is emitted and the turn counts as
        failed ("daemon restarted during turn"). Then each idle ``wake`` agent with pending
        notices is woken (see ``_wake``).

        With an ``ownership`` (several daemons), only the agents this daemon owns are
        settled here; the others are settled by :meth:`adopt` when their leases come here.
        """
        async with self._locks.exclusive():
            await self._take_up([a for a in self.store.state.agents if self._owns(a)])

    async def adopt(self, agent_ids: Collection[str]) -> None:
        """Take up agents whose leases this daemon has just taken (another daemon died or
        left): their turns in flight are settled as :meth:`start` settles a previous
        process's, exactly once (the lease's fencing lets no other daemon write them).
        Reads the log first, so what the last owner committed is seen. Idempotent for an
        agent with nothing in flight."""
        await self.store.refresh()
        async with self._locks.exclusive():
            if self._closed:
                return
            await self._take_up([a for a in agent_ids if a in self.store.state.agents])

    async def disown(self, agent_ids: Collection[str]) -> None:
        """Stop acting for agents this daemon no longer owns (its lease was lost: a long
        pause, a database unreachable past the lease): their turns are cancelled and their
        processes ended, nothing is written (the new owner settles the turns), their
        approvals' deadlines and stall watches are dropped. Never raises for an agent."""
        gone = set(agent_ids)
        async with self._locks.exclusive():
            for agent_id in gone:
                await self._cancel_turn(agent_id)
                self._stalls.forget(agent_id)
                self._waking.discard(agent_id)
            for decision_id, found in list(self.store.state.decisions.items()):
                if found.get("agentId") in gone and decision_id in self._deadlines:
                    self._deadlines.pop(decision_id).cancel()
            for agent_id in gone:
                await self._reap(agent_id, "its process (no longer owned)")

    async def _take_up(self, agent_ids: Sequence[str]) -> None:
        """Settle what a previous owner left of ``agent_ids`` (see :meth:`start`). Call with
        the mutex held."""
        mine = set(agent_ids)
        # The runs' headcount as the last daemon left it: paused agents stay paused.
        freed = [
            a for a in await self._headcount.rebuild(self.store.state, self._spec) if self._owns(a)
        ]
        # Which turns to adopt is decided first, from the state the last daemon left:
        # applying a passed deadline below moves a waiting agent back to running.
        agents = self.store.state.agents
        adopt = {
            rec["id"]
            for rec in (agents[a] for a in mine if a in agents)
            if rec["turnInFlight"] is not None
            # An external agent's process goes on with its turn whatever the daemon does:
            # its report is waited for again, whatever the agent's state.
            and (rec["state"] == "waiting" or _external.is_external(self._spec(rec["id"])))
            and isinstance(self.harnesses.get(self._spec(rec["id"]).harness), AdoptingHarness)
        }
        # Approvals still pending: a deadline that passed while no daemon ran is applied
        # now (recorded as timed out, before an interrupted turn could withdraw it), the
        # others are timed again.
        for found in list(self.store.state.decisions.values()):
            if found["kind"] != "approval" or found.get("agentId") not in mine:
                continue
            if "checkId" in found and "ruleIndex" in found:
                self._by_check[(found["checkId"], found["ruleIndex"])] = found["id"]
            if found["state"] == "pending" and found["id"] not in self._deadlines:
                await self._time_approval(found, locked=True)
        for agent_id in agent_ids:
            # As the settlements before it left it: one that ended an agent may have
            # resumed a paused one (headcount freed).
            rec = self.store.state.agents.get(agent_id)
            if rec is None:
                continue
            turn = rec["turnInFlight"]
            if turn is None or agent_id in self._turns:
                continue
            harness = self.harnesses.get(self._spec(rec["id"]).harness)
            if rec["id"] in adopt and isinstance(harness, AdoptingHarness):
                if rec["state"] == "waiting":
                    # Waiting from now on: the pause clock starts with the adoption.
                    self.pauses(rec["id"]).waiting(True)
                self._start_turn(rec["id"], self._adopt_turn(rec["id"], turn, harness))
                continue
            if rec.get("queuedTurn") == turn and rec["state"] == "running":
                # It waited for a slot when the last daemon died: it never started, so
                # it is run now, not counted as cut short.
                logger.info("agent %s: turn %d never started; running it", agent_id, turn)
                self._launch(agent_id, turn, _notices.resend_text(self.store.state, rec))
                continue
            await self._reap(agent_id, "a leftover turn process")
            await self._interrupted(rec, turn)
        await self._resume(freed)
        await self._reap_stopped(mine)
        # A notice written just before the last daemon died still wakes its parent.
        agents = self.store.state.agents
        self._wake_soon(a for a in agent_ids if a in agents and agents[a]["state"] == "idle")

    async def _reap_stopped(self, agent_ids: Collection[str]) -> None:
        """End what a stop left running when the last daemon died in its grace (the stop is
        committed: nothing is written). Call with the mutex held."""
        agents = self.store.state.agents
        for agent_id in [a for a in agent_ids if a in agents and agents[a]["state"] == "stopped"]:
            await self._reap(agent_id, "what its stop left running")

    async def _reap(self, agent_id: str, what: str) -> None:
        """End what the agent's harness left running of it on this machine (``what`` names
        it in the log); never raises."""
        rec = self.store.state.agents.get(agent_id)
        harness = None if rec is None else self.harnesses.get(rec["spec"].get("harness", ""))
        if harness is None:
            return
        try:
            if await harness.reap(agent_id, self._state_dir(agent_id)):
                logger.info("agent %s: ended %s", agent_id, what)
        except Exception:
            logger.exception("agent %s: could not end a leftover process", agent_id)

    def use_relay(self, relay: Relay) -> None:
        """Several daemons: commands that callers in this process (the console, MCP tools)
        give about agents another daemon owns are sent there (``_cluster._relay``)."""
        self.relay = relay

    def use_agent_tools(self, tools: AgentTools) -> None:
        """Hand each turn ``tools(agent_id, spec)`` (``TurnRequest.extra_tools``): the daemon
        gives ``openai`` agents corral's own tools this way (``openai.corralTools``)."""
        v.callable_("use_agent_tools", "tools", tools)
        self._agent_tools = tools

    async def close(self) -> None:
        """Stop running turns (their processes are ended; nothing is written for them, so the
        next start settles them as interrupted) and end event streams."""
        self._closed = True
        for handle in self._deadlines.values():
            handle.cancel()
        self._deadlines.clear()
        self._stalls.close()
        self.turn_book.close()
        await self._endings.close()  # stops in their grace: killed now, committed already
        tasks = list(self._turns.values()) + list(self._background)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*self._releases, return_exceptions=True)
        for harness in self.harnesses.values():
            if isinstance(harness, WarmHarness):
                try:
                    await harness.aclose()
                except Exception:
                    logger.exception("could not close harness %r", harness)
        self._feed.close()

    async def settled(self, agent_id: str | None = None) -> None:
        """Return once no turn of ``agent_id`` (of any agent, when None) is in flight here.

        A turn is in flight from its start until its outcome is committed, including the
        retries of a store that blips; a retry the outcome starts is waited for too. It does
        not wait for prompts not yet given, and a turn that never ends (a harness that hangs)
        never settles: bound the wait with a timeout.
        """
        while True:
            running = [
                task
                for owner, task in self._turns.items()
                if not task.done() and (agent_id is None or owner == agent_id)
            ]
            if not running:
                return
            await asyncio.wait(running)

    @property
    def subscriptions(self) -> int:
        """How many event streams (:meth:`subscribe`) are open."""
        return len(self._feed.subscribers)

    def observe_commits(self, observer: Observer) -> None:
        """Call ``observer`` with each commit's events once durable (``_feed.Observer``)."""
        self._feed.observe(observer)

    # --- queries ----------------------------------------------------------------------------

    def get(self, agent_id: str) -> Json:
        return self._shown(self._record(agent_id))

    async def known(self, agent_id: str) -> None:
        """Raise ``AgentNotFoundError`` unless the log knows ``agent_id``: a live or ended
        agent, or a deleted one (whose events stay)."""
        known = agent_id in self.store.state.agents
        if not known and not await self.store.read(0, agent_id=agent_id, limit=1):
            raise AgentNotFoundError(agent_id)

    def list_agents(self) -> list[Json]:
        return [self._shown(r) for r in self.store.state.agents.values()]

    def list_page(self, *, within: str | None = None, **query: Any) -> Json:
        """``GET /agents``: ``{"agents": [summary...], "nextCursor"}``, one page of the
        agents matching ``query`` (see :func:`._listing.page`); ``within``: only that agent
        and its descendants."""
        records: Iterable[AgentRecord] = self.store.state.agents.values()
        if within is not None:
            records = [r for r in records if self.in_scope(within, r["id"])]
        found, after = _listing.page(records, **query)
        shown = [_listing.summary(r, queued=self._queued(r["id"])) for r in found]
        return {"agents": shown, "nextCursor": after}

    def _queued(self, agent_id: str) -> bool:
        # A turn waiting for one of the daemon's concurrent-turn slots.
        return self._slots.limit is not None and bool(self._slots.waiting(agent_id))

    def _shown(self, rec: AgentRecord) -> Json:
        # A turn waiting for one of the daemon's concurrent-turn slots: ``queued``. The
        # spec's env values are secrets: only their names are shown (see _listing).
        shown = _listing.redact(rec)
        if self._queued(rec["id"]):
            shown["queued"] = True
        return shown

    def session(self, agent_id: str) -> Json:
        """The agent's session: ``{"agentId", "history", "messages"}``, oldest first (see
        ``_sessions``)."""
        rec = self._record(agent_id)
        messages = self.store.state.sessions.get(agent_id, [])
        return {
            "agentId": agent_id,
            "history": _sessions.history_of(rec),
            "messages": [dict(m) for m in messages],
        }

    def in_scope(self, principal: str, agent_id: str) -> bool:
        """Whether ``agent_id`` is ``principal`` or one of its descendants (an unknown id is
        in no one's scope)."""
        return _queries.in_scope(self.store.state, principal, agent_id)

    def inbox(self, agent_id: str) -> list[Json]:
        self._record(agent_id)
        return [dict(n) for n in self.store.state.notices.values() if n["to"] == agent_id]

    def decisions(self, *, resolved: bool = False) -> list[Json]:
        """The decisions waiting on a person (approvals, held agents), oldest first; with
        ``resolved``, the answered ones instead, newest first."""
        return _queries.decisions(self.store.state, resolved=resolved)

    def decision(self, decision_id: str) -> Json:
        """One decision (``DecisionNotFoundError`` when there is none)."""
        found = self.store.state.decisions.get(decision_id)
        if found is None:
            raise DecisionNotFoundError(decision_id)
        return dict(found)

    def resolutions(self) -> list[Json]:
        """The answered decisions, newest first."""
        return self.decisions(resolved=True)

    async def events(
        self, after: int = 0, *, agent_id: str | None = None, limit: int = 1000
    ) -> list[Event]:
        return await self.store.read(after, agent_id=agent_id, limit=limit)

    def subscribe(
        self, after: int | None = None, *, agent_id: str | None = None
    ) -> AsyncGenerator[Event, None]:
        """Events with ``seq > after`` from the log, then live ones as they are committed.

        No event is missed or repeated between the two. With ``after=None`` only live events
        come. The stream ends when the service closes or the subscriber falls more than
        ``subscriber_buffer`` events behind (resume with the last seq seen).
        """
        return self._feed.subscribe(after, agent_id=agent_id)

    # --- commands ---------------------------------------------------------------------------

    async def spawn(self, data: Any, *, idempotency_key: str | None = None) -> CommandResult:
        """Create an agent from a spec (a dict or :class:`AgentSpec`); 201 with its record."""
        spec = data if isinstance(data, AgentSpec) else parse_spec(data)
        # A custom rule is Python run here: made now, so a spec naming one that cannot be
        # made is refused (the caller's reach was checked before: see ScopedService.spawn).
        check_custom(spec.guardrails)
        command = {"command": "spawn", "spec": spec.to_json()}
        async with self._locks.exclusive():
            replayed = _commands.replayed(self.store.state, idempotency_key, command)
            if replayed is not None:
                return replayed
            self._refuse_if_closed("spawn")
            state = self.store.state
            parent = _admission.parent_of(state, spec, self.harnesses)
            run_id = parent["runId"] if parent else new_id()
            _names.check_spawn(state.agents, run_id, spec.name)
            agent_id = self._new_agent_id()
            # A slot of the run's headcount, or the agent paused for it (refused otherwise).
            paused = await self._headcount.admit(state, run_id, agent_id, spec, self._spec)
            now = self.clock.now()
            # A child gets no more than its ancestors have left (see _tree_budget).
            granted, capped = _tree_budget.at_spawn(spec.budget, parent, state.agents.get, now)
            # A first turn that the budget leaves no room for (maxTurns 0, deadlineS 0, ...)
            # does not start: the agent is created held, as a prompt would leave it.
            workdir = str(self._workdir(agent_id))
            rec = _admission.new_record(
                agent_id, spec, parent, run_id, workdir, now.isoformat(), starts=False
            )
            if capped:
                rec["budget"] = granted.model_dump(by_alias=True)
                rec["budgetCapped"] = [dict(c) for c in capped]
            exhausted = (
                _tree_budget.exhausted(rec, granted.to_budget(), state.agents.get, now)
                if spec.prompt
                else None
            )
            starts = bool(spec.prompt) and exhausted is None
            if starts:
                rec["state"] = "running"
            pausing, cancel = self._pausing(paused, agent_id)
            events = [*pausing, ev.agent_created(rec)]
            if starts and spec.prompt:
                events.append(ev.turn_started(agent_id, 1, spec.prompt, retry=False, notices=[]))
            elif exhausted is not None:
                events += _decisions.budget_hold(state, rec, exhausted)
            created = preview(state, events, now.isoformat()).get_agent(agent_id)
            assert created is not None
            self._workdir(agent_id).mkdir(parents=True, exist_ok=True)
            self._state_dir(agent_id).mkdir(parents=True, exist_ok=True)
            result = CommandResult(201, _listing.redact(created))  # no env values served
            # The preempted turn is cancelled first, as stop does, so that what it had spent
            # is known when its agent.turn_interrupted is written.
            await self._preempted(paused, cancel)
            await self._commit(events, idempotency_key, command, result)
            self._specs[agent_id] = spec
            if starts and spec.prompt:
                self._launch(agent_id, 1, spec.prompt)
            return result

    async def prompt(
        self,
        agent_id: str,
        text: str | None = None,
        *,
        by: str | None = None,
        why: str | None = None,
        idempotency_key: str | None = None,
        note: str | None = None,
        answering: Answering | None = None,
    ) -> CommandResult:
        """Start a turn of an idle or blocked agent; 202.

        Without ``text`` the last prompt is re-sent. Prompting a blocked agent resolves its
        decision (answer ``retry``, recorded with ``by``, ``why`` and ``note``). Pending
        notices to the agent go in front of the prompt, merged into one. ``answering``: see
        :class:`Answering` (the answer is then 200 with the decision's id and answer).
        """
        if text is not None and not isinstance(text, str):
            raise InvalidArgumentError("prompt", "text", "a string or None", text)
        command = {"command": "prompt", "agent": agent_id, "text": text}
        if answering is not None:
            command = {"command": "answer", "decision": answering.decision, "text": text}
        async with self._locks.run(self._run_of(agent_id), key=idempotency_key):
            replayed = _commands.replayed(self.store.state, idempotency_key, command)
            if replayed is not None:
                return replayed
            self._refuse_if_closed("prompt")
            self._still_pending(answering)
            rec = self._live(agent_id)
            _headcount.refuse_if_paused(rec)
            if _external.is_external(self._spec(agent_id)):
                # The daemon runs none of its turns: a person's retry frees it, no more.
                if answering is None or rec["state"] != "blocked":
                    raise ExternalAgentError(agent_id)
                freed = _external.freed(self.store.state, rec, by, why, note)
                result = CommandResult(200, answering.body(agent_id))
                await self._commit(freed, idempotency_key, command, result)
                return result
            if rec["state"] in BUSY_STATES:
                raise AgentBusyError(agent_id)
            prompt = text if text else rec["lastPrompt"]
            if not prompt:
                raise NothingToSendError(agent_id)
            exhausted = _decisions.exhausted(
                rec, self._spec(agent_id), self.clock.now(), self.store.state.agents.get
            )
            if exhausted is None and rec["state"] == "blocked" and rec["reason"] == BUDGET_HELD:
                # Held on its budget (the harness found no room for its next model call,
                # which this count may not show): only a bigger budget lets it go on.
                exhausted = _decisions.held_on_budget(rec, self._spec(agent_id), self.clock.now())
            if exhausted is not None:
                # The turn would pass the budget: it does not start. An idle agent is held.
                if rec["state"] == "idle":
                    await self._commit(_decisions.budget_hold(self.store.state, rec, exhausted))
                raise AgentBudgetExhaustedError(agent_id, exhausted)
            events: list[NewEvent] = []
            if rec["state"] == "blocked":
                events += _decisions.resolve_hold(self.store.state, rec, "retry", by, why, note)
            pending = _notices.pending(self.store.state, agent_id)
            turn = rec["turns"] + 1
            events.append(ev.prompted(agent_id, rec["state"]))
            text = _notices.with_notices(prompt, pending)
            events.append(
                ev.turn_started(
                    agent_id,
                    turn,
                    prompt,
                    retry=False,
                    notices=[n["id"] for n in pending],
                    text=text,
                )
            )
            result = CommandResult(202, {"id": agent_id, "accepted": "prompt", "turn": turn})
            if answering is not None:
                result = CommandResult(200, answering.body(agent_id))
            await self._commit(events, idempotency_key, command, result)
            self._launch(agent_id, turn, text)
            return result

    async def begin_turn(
        self, agent_id: str, prompt: str, *, idempotency_key: str | None = None
    ) -> CommandResult:
        """The process of ``external`` agent ``agent_id`` begins a turn with ``prompt``; 201
        ``{"id", "accepted": "turn", "turn", "retry", "text", "timeoutS", "remaining"}`` (see
        :func:`._external.begin`). The turn runs as any turn does until its process ends it
        (:meth:`end_turn`) or its time runs out. Refused like a prompt: ``NotExternalError``,
        ``AgentNotLiveError``, ``AgentPausedError``, ``AgentBusyError`` (retryable),
        ``AgentHeldError`` (blocked, waiting on a person), ``AgentBudgetExhaustedError``
        (an idle agent is then held, as a prompt would leave it)."""
        v.non_empty_str("begin_turn", "prompt", prompt)
        command = {"command": "begin_turn", "agent": agent_id, "prompt": prompt}
        async with self._locks.exclusive():
            replayed = _commands.replayed(self.store.state, idempotency_key, command)
            if replayed is not None:
                return replayed
            self._refuse_if_closed("begin_turn")
            rec = self._live(agent_id)
            spec = self._spec(agent_id)
            _external.check_begin(rec, spec)
            now, lookup = self.clock.now(), self.store.state.agents.get
            exhausted = _decisions.exhausted(rec, spec, now, lookup)
            if exhausted is None and rec["state"] == "blocked":
                exhausted = _decisions.held_on_budget(rec, spec, now)  # still held on it
            if exhausted is not None:
                if rec["state"] == "idle":
                    await self._commit(_decisions.budget_hold(self.store.state, rec, exhausted))
                raise AgentBudgetExhaustedError(agent_id, exhausted)
            plan = _external.begin(self.store.state, rec, spec, prompt, now, lookup)
            result = CommandResult(201, plan.body)
            await self._commit(plan.events, idempotency_key, command, result)
            self._launch(agent_id, plan.turn, plan.text)
            return result

    async def end_turn(self, agent_id: str, turn: int, report: _external.Report) -> Json:
        """The process of ``external`` agent ``agent_id`` reports how turn ``turn`` ended;
        the turn is settled as any harness's result is (usage, ``onFailure``, the breaker,
        notices; see ``_external``) and the answer is its record with the agent as the
        outcome left it (:func:`._external.ended`). Idempotent: a turn settled already (by an
        earlier report, a stop, its time running out) answers how it was settled, whatever
        this report says. Raises ``NotExternalError``, ``TurnNotFoundError`` (no such turn),
        ``TurnNotOpenError`` (retryable: being settled)."""
        rec = self._record(agent_id)
        spec = self._spec(agent_id)
        harness = self.harnesses.get(spec.harness)
        if not isinstance(harness, ExternalHarness):
            raise NotExternalError(agent_id, spec.harness)
        if report.ok:
            # Kept as much as another harness's output is (see _turn_records).
            report = dataclasses.replace(
                report, output=_turn_records.clip_output(report.output, self.turn_book.cap)
            )
        task = self._turns.get(agent_id)
        if task is not None and rec["turnInFlight"] == turn:
            harness.expect(agent_id, turn)  # its task may not have run yet: kept for it
            harness.report(agent_id, turn, report.outcome())
            # Settled (or dropped, when a stop came first) once its task is done.
            await asyncio.wait({task})
        found = await self.turn_book.get(agent_id, turn)
        return _external.ended(agent_id, turn, found, self.store.state.agents.get(agent_id))

    async def stop(
        self,
        agent_id: str,
        *,
        by: str | None = None,
        why: str | None = None,
        idempotency_key: str | None = None,
        note: str | None = None,
        answering: Answering | None = None,
        now: bool = False,
        keep_children: bool = False,
    ) -> CommandResult:
        """End an agent and, unless ``keep_children``, its live descendants (children
        first, in the same commit; theirs name it as ``stoppedWith``); 202 ``{"id",
        "accepted", "stopped"}`` (the ids stopped, in order). A turn in flight is asked to
        end (SIGTERM) and killed after the spec's ``stopGraceS``, off the lock; ``now``
        kills it at once (see ``_lifecycle``). A blocked agent's decision is resolved
        (answer ``stop``); approvals it waits on are withdrawn."""
        command: dict[str, Any] = {"command": "stop", "agent": agent_id}
        if now or keep_children:
            command.update(now=now, keepChildren=keep_children)
        if answering is not None:
            command = {"command": "answer", "decision": answering.decision, "answer": "stop"}
        async with self._locks.exclusive():
            replayed = _commands.replayed(self.store.state, idempotency_key, command)
            if replayed is not None:
                return replayed
            self._refuse_if_closed("stop")
            self._still_pending(answering)
            rec = self._live(agent_id)
            order = _lifecycle.cascade(self.store.state, rec, keep_children=keep_children)
            events: list[NewEvent] = []
            for one in order:
                child = one is not rec
                events += await self._stopping(
                    one,
                    by,
                    why,
                    None if child else note,
                    with_=agent_id if child else None,
                    now=now,
                )
            stopped = [one["id"] for one in order]
            result = CommandResult(202, {"id": agent_id, "accepted": "stop", "stopped": stopped})
            if answering is not None:
                result = CommandResult(200, answering.body(agent_id))
            await self._commit(events, idempotency_key, command, result)
        for one_id in stopped:
            await self._stopped(one_id)
        return result

    async def _stopping(
        self,
        rec: AgentRecord,
        by: str | None,
        why: str | None,
        note: str | None,
        *,
        run: str | None = None,
        with_: str | None = None,
        now: bool = False,
    ) -> list[NewEvent]:
        """End the live agent's turn in flight -- gracefully, off the lock, when its harness
        can be asked to (see ``_lifecycle``); at once with ``now`` -- and answer the events
        that stop it (``run``: as part of stopping that run; ``with_``: as a descendant of
        that agent). Call with the mutex held, then commit them, then :meth:`_stopped`."""
        agent_id = rec["id"]
        spec = self._spec(agent_id)
        harness: object = self.harnesses.get(spec.harness)
        task = self._turns.get(agent_id)
        grace_s = 0.0 if now else spec.stop_grace_s
        if task is not None and grace_s > 0 and isinstance(harness, TerminatingHarness):
            del self._turns[agent_id]  # its outcome, whatever it is, is dropped
            terminate = functools.partial(harness.terminate, agent_id, self._state_dir(agent_id))
            release = functools.partial(self._release, agent_id)
            self._endings.begin(agent_id, task, terminate, grace_s, release)
        else:
            await self._cancel_turn(agent_id)
        self._stalls.forget(agent_id)
        events: list[NewEvent] = []
        if rec["turnInFlight"] is not None:
            events.append(ev.turn_interrupted(agent_id, rec["turnInFlight"], "agent stopped"))
        # A paused agent may hold a decision too: the hold it resumes to (``resumeTo``).
        if rec["state"] == "blocked" or rec.get("resumeTo") == "blocked":
            events += _decisions.resolve_hold(self.store.state, rec, "stop", by, why, note)
        events += self._withdraw(agent_id, "the agent was stopped")
        events.append(ev.stopped(agent_id, rec["state"], by, why, run=run, with_=with_))
        events += _decisions.drop_pending(self.store.state, agent_id)
        return events

    async def _stopped(self, agent_id: str) -> None:
        """After a stop is committed: end what the harness keeps for the agent (once its
        turn has ended, when it is ending gracefully). Its working directory stays, for a
        restart, until the agent is deleted."""
        if agent_id not in self._endings:
            await self._release(agent_id)

    async def restart(
        self,
        agent_id: str,
        *,
        by: str | None = None,
        why: str | None = None,
        idempotency_key: str | None = None,
    ) -> CommandResult:
        """Run a stopped or failed agent again (see ``_lifecycle.restart``), recorded with
        ``by`` and ``why``; 202 ``{"id", "accepted": "restart", "turn"}`` (the turn it
        runs, None when it has no prompt or is held on its budget). A turn of its stop still
        in its grace is killed first. Raises ``AgentLiveError`` (409) for a live agent,
        ``SpawnRefusedError`` when its run's headcount has no room."""
        command = {"command": "restart", "agent": agent_id}
        if _commands.replayed(self.store.state, idempotency_key, command) is None:
            await self._endings.finish(agent_id)
        async with self._locks.exclusive():
            replayed = _commands.replayed(self.store.state, idempotency_key, command)
            if replayed is not None:
                return replayed
            self._refuse_if_closed("restart")
            state, rec = self.store.state, self._record(agent_id)
            if agent_id in self._endings:
                raise AgentBusyError(agent_id)  # stopped again meanwhile: still ending
            spec = self._spec(agent_id)
            plan = _lifecycle.restart(state, rec, spec, by, why, self.clock.now())
            # A live agent of its run may have taken its name meanwhile: names stay unique.
            _names.check_free(state.agents, rec["runId"], spec.name, besides=agent_id)
            paused = await self._headcount.admit(state, rec["runId"], agent_id, spec, self._spec)
            pausing, cancel = self._pausing(paused, agent_id)
            body = {"id": agent_id, "accepted": "restart", "turn": plan.turn}
            result = CommandResult(202, body)
            await self._preempted(paused, cancel)
            await self._commit([*pausing, *plan.events], idempotency_key, command, result)
            if plan.turn is not None:
                self._launch(agent_id, plan.turn, plan.text)
            return result

    async def delete(
        self,
        agent_id: str,
        *,
        by: str | None = None,
        why: str | None = None,
        idempotency_key: str | None = None,
    ) -> CommandResult:
        """Delete an ended agent and its descendants (all ended), deepest first, in one
        commit (``agent.deleted``, with ``by`` and ``why``): their records, sessions,
        notices and stored data go, then their directories (working directory and
        harness state); their events stay. 200 ``{"id", "deleted"}`` (the ids, in order).
        Raises ``AgentLiveError`` (409) when one of them is live."""
        command = {"command": "delete", "agent": agent_id}
        if _commands.replayed(self.store.state, idempotency_key, command) is None:
            rec = self._record(agent_id)
            for one in _lifecycle.deletion_order(self.store.state, rec):
                await self._endings.finish(one["id"])  # a stop's grace: killed now
        async with self._locks.exclusive():
            replayed = _commands.replayed(self.store.state, idempotency_key, command)
            if replayed is not None:
                return replayed
            self._refuse_if_closed("delete")
            order = _lifecycle.deletion_order(self.store.state, self._record(agent_id))
            if any(one["id"] in self._endings for one in order):
                raise AgentBusyError(agent_id)  # stopped again meanwhile: still ending
            ids = [one["id"] for one in order]
            harnesses = {i: self.harnesses.get(self._spec(i).harness) for i in ids}
            result = CommandResult(200, {"id": agent_id, "deleted": ids})
            await self._commit(_lifecycle.deleted(order, by, why), idempotency_key, command, result)
            for one_id in ids:
                self._specs.pop(one_id, None)
                self._pauses.pop(one_id, None)
                self._spent.pop(one_id, None)
        for one_id in ids:
            harness: object = harnesses[one_id]
            if isinstance(harness, WarmHarness):
                try:
                    await harness.release(one_id)
                except Exception:
                    logger.exception("agent %s: could not release its harness worker", one_id)
            shutil.rmtree(self._workdir(one_id).parent, ignore_errors=True)
            # The stores with tables deleted its turn rows in the commit (delete_agent_data);
            # this ends the followers of its log and clears a store without tables.
            await self.turn_book.delete(one_id)
        return result

    def run(self, run_id: str, *, top: str | None = None) -> Json:
        """``GET /runs/{id}``: the run's tree (from agent ``top`` down, when given), usage
        against limits at each node, and its headcount (see :mod:`._runs`).
        ``RunNotFoundError`` for a run no agent is in."""
        state = self.store.state
        return _runs.view(state, run_id, None if top is None else self._record(top))

    async def stop_run(
        self,
        run_id: str,
        *,
        by: str | None = None,
        why: str | None = None,
        idempotency_key: str | None = None,
        note: str | None = None,
    ) -> CommandResult:
        """Stop every live agent of the run, children before their parents (deepest first),
        in one commit: each ``agent.state_changed`` to ``stopped`` carries the same ``by``
        and ``why`` and ``runStop`` (the run's id); 202 ``{"runId", "accepted", "stopped"}``
        (the ids stopped, in order). ``RunNotFoundError`` for a run no agent is in."""
        command = {"command": "stop_run", "run": run_id}
        async with self._locks.exclusive():
            replayed = _commands.replayed(self.store.state, idempotency_key, command)
            if replayed is not None:
                return replayed
            self._refuse_if_closed("stop_run")
            root = _runs.root_of(self.store.state, run_id)
            order = _runs.stop_order(self.store.state, root)
            events: list[NewEvent] = []
            for rec in order:
                events += await self._stopping(rec, by, why, note, run=run_id)
            stopped = [rec["id"] for rec in order]
            result = CommandResult(202, {"runId": run_id, "accepted": "stop", "stopped": stopped})
            await self._commit(events, idempotency_key, command, result)
        for agent_id in stopped:
            await self._stopped(agent_id)
        return result

    async def change_budget(
        self,
        agent_id: str,
        changes: Mapping[str, Any],
        *,
        by: str | None = None,
        why: str | None = None,
        idempotency_key: str | None = None,
        lower_only: str | None = None,
        note: str | None = None,
        answering: Answering | None = None,
    ) -> CommandResult:
        """Change a live agent's budget; 200 with its record.

        ``lower_only`` names the agent whose own token asks: it may lower budgets in its
        reach, never raise one (``OutOfScopeError``): more room is a person's decision.

        ``changes`` holds the dimensions to change, camelCase (``maxTokens``, ``maxCostUsd``,
        ``maxTurns``, ``deadlineS``; None makes one unlimited); the others stay. The change is
        recorded (``agent.budget_changed``, with ``by`` and ``why``). An agent held
        ``budget-exhausted`` that the change gives room again goes idle, its decision
        resolved; a budget below what is spent is allowed (the agent is held at its next
        prompt). A turn in flight keeps the budget it started with.
        """
        command = {"command": "budget", "agent": agent_id, "budget": dict(changes)}
        if answering is not None:
            command = {"command": "answer", "decision": answering.decision, "budget": command}
        async with self._locks.exclusive():
            replayed = _commands.replayed(self.store.state, idempotency_key, command)
            if replayed is not None:
                return replayed
            self._refuse_if_closed("budget")
            self._still_pending(answering)
            rec = self._live(agent_id)
            if answering is not None:
                _headcount.refuse_if_paused(rec)  # its hold is answered once it resumes
            spec = self._spec(agent_id)
            now = self.clock.now()
            events = self._budget_events(rec, spec, changes, by, why, note, lower_only, now)
            after = preview(self.store.state, events, now.isoformat()).get_agent(agent_id)
            assert after is not None
            if answering is not None and after["state"] == "blocked":
                # The new budget still leaves no room: the decision stays open.
                raise AgentBudgetExhaustedError(
                    agent_id, _decisions.held_on_budget(after, spec, now)
                )
            result = CommandResult(200, _listing.redact(after))  # no env values served
            if answering is not None:
                result = CommandResult(200, answering.body(agent_id))
            await self._commit(events, idempotency_key, command, result)
            return result

    def _budget_events(
        self,
        rec: AgentRecord,
        spec: AgentSpec,
        changes: Mapping[str, Any],
        by: str | None,
        why: str | None,
        note: str | None,
        lower_only: str | None,
        now: datetime,
    ) -> list[NewEvent]:
        """The events of a budget change (see :meth:`change_budget`)."""
        current = _budget.in_force(rec, spec)
        new = _budget.changed(current, changes)
        if lower_only is not None and _budget.raises(new, current):
            raise OutOfScopeError(lower_only, "raising a budget (a person decides)")
        # No more than its ancestors have left (see _tree_budget), and it says so.
        new, capped = _tree_budget.on_change(rec, current, new, self.store.state.agents.get, now)
        return _decisions.budget_changed(
            self.store.state, rec, spec, new, by, why, now, note, capped=capped
        )

    async def patch(
        self,
        agent_id: str,
        changes: Mapping[str, Any],
        *,
        by: str | None = None,
        why: str | None = None,
        idempotency_key: str | None = None,
        lower_only: str | None = None,
        note: str | None = None,
    ) -> CommandResult:
        """Change what may change of a live agent (``PATCH /agents/{id}``): its ``budget``
        (as :meth:`change_budget`), ``notifyOn`` and ``guardrails`` (see :mod:`._patch`),
        in one transaction; 200 with its record. ``lower_only``: the agent whose own token
        asks, which may only tighten."""
        budget = changes.get("budget")
        fields = {k: v for k, v in changes.items() if k != "budget"}
        if not fields and budget is not None:
            return await self.change_budget(
                agent_id,
                budget,
                by=by,
                why=why,
                idempotency_key=idempotency_key,
                lower_only=lower_only,
                note=note,
            )
        command = {"command": "patch", "agent": agent_id, "changes": dict(changes)}
        async with self._locks.exclusive():
            replayed = _commands.replayed(self.store.state, idempotency_key, command)
            if replayed is not None:
                return replayed
            self._refuse_if_closed("patch")
            rec = self._live(agent_id)
            spec = self._spec(agent_id)
            now = self.clock.now()
            events: list[NewEvent] = []
            if budget is not None:
                events += self._budget_events(rec, spec, budget, by, why, note, lower_only, now)
            # The new spec is made again from the record when next used (see _spec).
            _, diff = _patch.changed_spec(spec, fields, agent_token=lower_only)
            if diff:
                old = spec.to_json()
                events.append(_patch.spec_changed(agent_id, old, diff, by=by, why=why, note=note))
            after = preview(self.store.state, events, now.isoformat()).get_agent(agent_id)
            assert after is not None
            result = CommandResult(200, _listing.redact(after))  # no env values served
            await self._commit(events, idempotency_key, command, result)
            return result

    async def record_gateway_freeze(self, target: str, freeze: Json) -> None:
        """Log that the gateway froze an agent in database ``target`` (``freeze`` as JSON:
        ``agentId``, ``reason``, evidence...). When the agent is one of this daemon's and has
        a parent, the parent's inbox gets a ``gateway_frozen`` notice. The freeze itself is
        the gateway's (its journal); this only tells watchers."""
        # The freeze's evidence holds the agent's SQL: escaped like any text an agent sends.
        freeze = escape_json(freeze)
        async with self._locks.exclusive():
            events = [ev.gateway_frozen(target, freeze)]
            rec = self.store.state.agents.get(freeze["agentId"])
            if rec is not None and rec["parent"] is not None:
                reason = freeze.get("reason")
                notice = _notices.to_parent(
                    self.store.state, rec, "gateway_frozen", target=target, reason=reason
                )
                events.append(notice)
            await self._commit(events)

    async def logged_gateway_freezes(self, agent_id: str) -> set[str]:
        """The ids of ``agent_id``'s gateway freezes the event log holds."""
        found: set[str] = set()
        after = 0
        while True:
            page = await self.store.read(after, agent_id=agent_id, limit=1000)
            if not page:
                return found
            found.update(str(e.data.get("id")) for e in page if e.type == ev.GATEWAY_FROZEN)
            after = page[-1].seq

    async def record_gateway_resolution(
        self,
        target: str,
        agent_id: str,
        freeze: Json | None,
        reinstatement: Json,
        note: str | None = None,
    ) -> None:
        """Log a person's reinstatement of ``agent_id`` in database ``target`` as a resolved
        decision (kind ``gateway_frozen``, answer ``reinstate``, with ``by``, ``why`` and
        ``note``)."""
        freeze_id = reinstatement.get("freezeId")
        decision = {
            "id": ev.gateway_decision_id(freeze_id, target, agent_id),
            "kind": "gateway_frozen",
            "agentId": agent_id,
            "reason": None if freeze is None else freeze.get("reason"),
            "target": target,
            "freezeId": freeze_id,
        }
        async with self._locks.exclusive():
            resolved = ev.resolved(
                decision, "reinstate", reinstatement["by"], reinstatement["reason"], note=note
            )
            await self._commit([resolved])

    # --- actions and approvals --------------------------------------------------------------

    def rules_of(self, agent_id: str) -> tuple[EffectiveRule, ...]:
        """The rules ``agent_id``'s actions are checked with: the daemon's, then each
        ancestor's from the root down, then its own."""
        chain: list[str] = []
        current: str | None = agent_id
        while current is not None and current not in chain:
            chain.append(current)
            current = self._record(current)["parent"]
        return effective_rules(
            self._daemon_rules, [(a, self._spec(a).guardrails) for a in reversed(chain)]
        )

    async def check_action(
        self,
        agent_id: str,
        action: str,
        context: Mapping[str, Any] | None = None,
        *,
        wait_s: float = 0.0,
        check_id: str | None = None,
    ) -> Verdict:
        """May live agent ``agent_id`` do ``action``? Its rules (:meth:`rules_of`) decide.

        Answers at once when no rule asks a person. A rule that asks opens an ``approval``
        decision (``decision.requested``; an agent whose turn is running is ``waiting``
        until it is answered) and the check waits up to ``wait_s`` seconds (``math.inf``:
        until the answer) for it: answered, the check goes on with the later rules; not
        yet, the verdict is ``pending`` with the decision's id (ask again with
        :meth:`action_verdict`). ``check_id`` re-runs an earlier check: its rules that asked
        already find their decisions instead of opening new ones. Raises
        ``InvalidRequestError`` for bad input, ``AgentNotFoundError``/``AgentNotLiveError``.
        """
        context = _approvals.check_input(action, context, wait_s)
        self._live(agent_id)
        rules = self.rules_of(agent_id)
        if not may_ask(rules, action):
            # No person can be asked: no decision, no task, no waiting.
            return _approvals.verdict_of(
                await evaluate(rules, agent_id, action, context, _never_asks), None
            )
        check = check_id or _approvals.new_check_id()
        asked: list[str] = []
        mine: list[tuple[str, ApprovalRequest]] = []
        person_asked = asyncio.Event()

        refused: list[TooManyApprovalsError] = []

        async def on_ask(ask: AskRequest) -> None:
            try:
                decision_id = await self._approval_for(agent_id, check, ask, action, context)
            except TooManyApprovalsError as exc:
                refused.append(exc)  # told to the caller as it is, not as a blocked rule
                raise
            asked.append(decision_id)
            found = self.store.state.decisions[decision_id]
            if found["state"] == "resolved":
                ask.request.resolve(_approvals.allowed(found))
                return
            self._waiters.setdefault(decision_id, set()).add(ask.request)
            mine.append((decision_id, ask.request))
            person_asked.set()

        task = asyncio.ensure_future(evaluate(rules, agent_id, action, context, on_ask))
        asking = asyncio.ensure_future(person_asked.wait())
        try:
            await asyncio.wait({task, asking}, return_when=asyncio.FIRST_COMPLETED)
            if not task.done():
                await asyncio.wait({task}, timeout=None if math.isinf(wait_s) else wait_s)
            if not task.done():
                return _approvals.pending(self.store.state.decisions[asked[-1]])
            result = task.result()
        finally:
            asking.cancel()
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            for decision_id, request in mine:
                self._waiters.get(decision_id, set()).discard(request)
        if refused:
            raise refused[0]
        verdict = _approvals.verdict_of(result, asked[-1] if asked else None)
        last = self.store.state.decisions.get(asked[-1]) if asked else None
        if not verdict.allowed and last is not None and not _approvals.allowed(last):
            # Blocked because the person said no (or nobody answered): say so.
            return Verdict("blocked", _approvals.denial_reason(last), verdict.warnings, last["id"])
        return verdict

    async def action_verdict(self, decision_id: str, *, wait_s: float = 0.0) -> Verdict:
        """The verdict of the check that opened approval ``decision_id``, waiting up to
        ``wait_s`` seconds for the people it waits on (the check is run again: the rules
        before the approval, the approval's answer, the rules after it, which may ask
        again and answer ``pending`` with a new decision). ``DecisionNotFoundError`` for an
        id that is no approval."""
        found = self.store.state.decisions.get(decision_id)
        if found is None or found["kind"] != "approval" or "checkId" not in found:
            raise DecisionNotFoundError(decision_id)
        agent_id = found["agentId"]
        if self._record(agent_id)["state"] in ENDED_STATES:
            if found["state"] == "pending":
                return _approvals.pending(found)
            reason = _approvals.denial_reason(found)
            if _approvals.allowed(found):
                reason = f"approved, but agent {agent_id} has ended"
            return Verdict("blocked", reason, (), decision_id)
        return await self.check_action(
            agent_id,
            found.get("action", ""),
            found.get("context"),
            wait_s=wait_s,
            check_id=found["checkId"],
        )

    async def answer(
        self,
        decision_id: str,
        answer: str,
        *,
        by: str | None = None,
        why: str | None = None,
        note: str | None = None,
        text: str | None = None,
        budget: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        lower_only: str | None = None,
    ) -> CommandResult:
        """Answer a pending decision; 200 ``{"decision", "answer", "agentId"}``.

        ``approval``: ``approve`` or ``deny``. ``blocked``: ``retry`` (re-sends the last
        prompt, or ``text``) or ``stop``. ``budget_exhausted``: ``budget`` (the new
        ``budget``, camelCase dimensions) or ``stop``. Every answer is recorded
        (``decision.resolved``) with ``by``, ``why`` and ``note``. Raises
        ``DecisionNotFoundError``, ``DecisionAnsweredError`` (409: who answered, when),
        ``AnswerNotAcceptedError`` (400: the answers it takes). Gateway freezes are answered
        through the daemon's databases, not here.
        """
        found = self.store.state.decisions.get(decision_id)
        if found is None:
            raise DecisionNotFoundError(decision_id)
        command = {"command": "answer", "decision": decision_id, "answer": answer}
        # retry and budget are recorded under their own arguments by prompt and
        # change_budget, which replay them (before refusing an answered decision).
        if answer not in ("retry", "budget"):
            replayed = _commands.replayed(self.store.state, idempotency_key, command)
            if replayed is not None:
                return replayed
        accepted = _queries.answers_of(found)
        if found["state"] == "pending" and answer not in accepted:
            raise AnswerNotAcceptedError(decision_id, found["kind"], answer, accepted)
        answering = Answering(decision_id, answer, note)
        agent_id = found["agentId"]
        key = idempotency_key
        if answer == "retry":
            return await self.prompt(
                agent_id, text, by=by, why=why, idempotency_key=key, note=note, answering=answering
            )
        if answer == "stop":
            return await self.stop(
                agent_id, by=by, why=why, idempotency_key=key, note=note, answering=answering
            )
        if answer == "budget":
            if not isinstance(budget, Mapping):
                raise InvalidArgumentError("answer", "budget", "the new budget (an object)", budget)
            return await self.change_budget(
                agent_id,
                budget,
                by=by,
                why=why,
                idempotency_key=key,
                lower_only=lower_only,
                note=note,
                answering=answering,
            )
        async with self._locks.exclusive():
            replayed = _commands.replayed(self.store.state, idempotency_key, command)
            if replayed is not None:
                return replayed
            self._refuse_if_closed("answer")
            self._still_pending(answering)
            found = self.store.state.decisions[decision_id]
            result = CommandResult(200, answering.body(agent_id))
            events = self._approval_answered(found, answer, by, why, note=note)
            await self._commit(events, idempotency_key, command, result)
        return result

    def _still_pending(self, answering: Answering | None) -> None:
        """Refuse a command given as the answer to a decision answered already."""
        if answering is None:
            return
        found = self.store.state.decisions.get(answering.decision)
        if found is None:
            raise DecisionNotFoundError(answering.decision)
        if found["state"] != "pending":
            raise DecisionAnsweredError(
                found["id"], found.get("answer"), found.get("by"), found.get("at")
            )

    async def _approval_for(
        self,
        agent_id: str,
        check_id: str,
        ask: AskRequest,
        action: str,
        context: Mapping[str, Any],
    ) -> str:
        """The approval decision of ``ask`` in check ``check_id``: the one opened already,
        or a new one (committed, its deadline timed). A running agent goes ``waiting``."""
        async with self._locks.exclusive():
            self._refuse_if_closed("check")
            rec = self._live(agent_id)
            rule_json = rule_to_json(ask.rule)
            existing = self._by_check.get((check_id, ask.index))
            opened = None if existing is None else self.store.state.decisions.get(existing)
            if opened is not None and opened.get("rule") != rule_json:
                # The agent's rules were changed (PATCH) since: the rule now at that place
                # was never put to a person, whatever was answered for the one before it.
                existing = None
            if existing is None:
                # The same question asked again while it waits (a worker's retry loop) is
                # the same decision: a person is never asked twice at once.
                existing = _approvals.same_pending(
                    self.store.state.decisions.values(),
                    agent_id,
                    ask.index,
                    rule_json,
                    action,
                    context,
                )
            events: list[NewEvent] = []
            if existing is not None:
                found = self.store.state.decisions[existing]
                if found["state"] == "pending" and rec["state"] == "running":
                    events.append(ev.waiting(agent_id, existing))
                    await self._commit(events)
                return existing
            _approvals.check_room(self.store.state.decisions.values(), agent_id, rec["runId"])
            decision_id = _decisions.new_decision_id()
            rule = ask.rule.rule
            reason = rule.reason if isinstance(rule, MatchRule) else None
            timeout_s = float(ask.timeout_s)
            data: dict[str, Any] = {
                "id": decision_id,
                "action": action,
                "context": dict(context),
                "rule": rule_json,
                "checkId": check_id,
                "ruleIndex": ask.index,
                "reason": reason or f"{ask.rule.label} asks a person first",
                "deadline": _approvals.deadline(self.clock.now(), timeout_s),
                "timeoutS": timeout_s,
                "onTimeout": ask.on_timeout,
                "turn": rec["turnInFlight"],
            }
            events.append(ev.approval_requested(rec, data))
            if rec["state"] == "running":
                events.append(ev.waiting(agent_id, decision_id))
            await self._commit(events)
            self._by_check[(check_id, ask.index)] = decision_id
            await self._time_approval(self.store.state.decisions[decision_id], locked=True)
            return decision_id

    def _approval_answered(
        self,
        found: DecisionRecord,
        answer: str,
        by: str | None,
        why: str | None,
        *,
        note: str | None = None,
        timed_out: bool = False,
    ) -> list[NewEvent]:
        """The approval is answered; its agent's turn goes on once nothing else holds it."""
        events = [ev.resolved(found, answer, by, why, note=note, timed_out=timed_out)]
        handle = self._deadlines.pop(found["id"], None)
        if handle is not None:
            handle.cancel()
        rec = self.store.state.agents.get(found["agentId"])
        if rec is not None and rec["state"] == "waiting" and rec.get("decision") == found["id"]:
            others = [
                d["id"]
                for d in self.store.state.decisions.values()
                if d["kind"] == "approval"
                and d["state"] == "pending"
                and d["agentId"] == rec["id"]
                and d["id"] != found["id"]
                and d.get("turn") == rec["turnInFlight"]
            ]
            if others:
                events.append(ev.waiting(rec["id"], others[0], was="waiting"))
            else:
                events.append(ev.resumed(rec["id"]))
        return events

    def _withdraw(self, agent_id: str, why: str, *, turn: int | None = None) -> list[NewEvent]:
        """Withdraw the agent's pending approvals (it ended), or those its turn ``turn``
        waited on (the turn ended)."""
        events = []
        for found in list(self.store.state.decisions.values()):
            if (
                found["kind"] == "approval"
                and found["state"] == "pending"
                and found["agentId"] == agent_id
                and (turn is None or found.get("turn") == turn)
            ):
                events.append(ev.resolved(found, "withdrawn", None, why))
                handle = self._deadlines.pop(found["id"], None)
                if handle is not None:
                    handle.cancel()
        return events

    def _settle_waiters(self, decision_id: str) -> None:
        """Hand an answered decision's answer to the checks waiting on it."""
        found = self.store.state.decisions.get(decision_id)
        if found is None or found["state"] != "resolved":
            return
        for request in self._waiters.pop(decision_id, set()):
            request.resolve(_approvals.allowed(found))

    async def _time_approval(self, found: DecisionRecord, *, locked: bool = False) -> None:
        """Answer the approval at its deadline (now, when it has passed: the daemon was
        down); ``locked``: the caller holds the mutex."""
        deadline = found.get("deadline")
        if deadline is None:
            return
        delay = _approvals.seconds_until(self.clock.now(), deadline)
        if delay <= 0:
            await self._expire(found["id"], locked=locked)
            return
        handle = self.clock.call_later(
            max(0.0, delay), lambda: self._soon(self._expire(found["id"]))
        )
        self._deadlines[found["id"]] = handle

    async def _expire(self, decision_id: str, *, locked: bool = False) -> None:
        """Answer the approval as its ``onTimeout`` says, recorded as timed out."""
        if not locked:
            async with self._locks.exclusive():
                await self._expire(decision_id, locked=True)
            return
        found = self.store.state.decisions.get(decision_id)
        self._deadlines.pop(decision_id, None)
        if found is None or found["state"] != "pending" or self._closed:
            return
        answer = _approvals.timeout_answer(found)
        timeout_s, on_timeout = found.get("timeoutS", 0), found.get("onTimeout", "deny")
        why = f"nobody answered within {timeout_s:g} s (onTimeout {on_timeout})"
        await self._commit(self._approval_answered(found, answer, DAEMON, why, timed_out=True))

    def _soon(self, work: Any) -> None:
        """Run ``work`` (a coroutine) on its own task; shutting down waits for it."""
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background_done)

    def _background_done(self, task: asyncio.Task[None]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("background work failed", exc_info=task.exception())

    def pauses(self, agent_id: str) -> _Pauses:
        """How long ``agent_id``'s current turn has waited on people."""
        found = self._pauses.get(agent_id)
        if found is None:
            found = self._pauses[agent_id] = _Pauses(self.clock)
        return found

    async def _harness_check(
        self, agent_id: str, action: str, context: dict[str, object]
    ) -> Verdict:
        """The check a harness asks before each tool call: it waits for people as long as
        their approvals allow."""
        try:
            return await self.check_action(agent_id, action, dict(context), wait_s=math.inf)
        except (InvalidRequestError, AgentNotLiveError) as exc:
            return Verdict("blocked", exc.message)

    # --- named operator tokens (see _tokens) ------------------------------------------------

    def tokens(self) -> list[Json]:
        """The live named operator tokens, oldest first: name, createdAt, by (no secret, no
        digest)."""
        return [_tokens.shown(t) for t in _tokens.live(self.store.state)]

    async def create_token(self, name: str, *, by: str | None = None) -> Json:
        """Make the operator token ``name`` (made by ``by``): ``{name, token, createdAt,
        by}``, the only time its secret is shown; only its SHA-256 is written. Raises
        ``InvalidRequestError`` for a bad name, ``TokenExistsError`` for a live one."""
        async with self._locks.exclusive():
            self._refuse_if_closed("create_token")
            secret, created = _tokens.creation(self.store.state, name, by)
            await self._commit([created])
            record = self.store.state.tokens[created.data["name"]]
        return {**_tokens.shown(record), "token": secret}

    async def revoke_token(self, name: str, *, by: str | None = None) -> Json:
        """Revoke the live operator token ``name`` (from the next request on, it opens
        nothing); its record. Raises ``TokenNotFoundError`` when no live token has it."""
        async with self._locks.exclusive():
            self._refuse_if_closed("revoke_token")
            await self._commit([_tokens.revocation(self.store.state, name, by)])
            return _tokens.shown(self.store.state.tokens[name])

    # --- turns ------------------------------------------------------------------------------

    def _launch(self, agent_id: str, turn: int, prompt: str) -> None:
        spec = self._spec(agent_id)
        if _external.is_external(spec):
            # Its process runs the turn, not the daemon: it takes none of the daemon's slots.
            self._start_turn(agent_id, self._run_turn(agent_id, turn, prompt))
            return
        # The turn starts once one of the daemon's concurrent-turn slots is its.
        priority = _headcount.priority_of(spec)
        work = functools.partial(self._run_turn, agent_id, turn, prompt)
        on_wait = functools.partial(self._slot_wait, agent_id, turn)
        self._start_turn(agent_id, self._slots.run(agent_id, priority, work, on_wait))

    async def _slot_wait(self, agent_id: str, turn: int, waiting: bool) -> None:
        """Write that the turn waits for a slot (``agent.turn_queued``), or has one after
        waiting (``agent.turn_granted``): a daemon that starts then runs a turn that never
        started, rather than count it as cut short. Not written, it is only counted so."""
        try:
            async with self._locks.run(self._run_of(agent_id)):
                rec = self.store.state.agents.get(agent_id)
                if (
                    self._closed
                    or self._turns.get(agent_id) is not asyncio.current_task()
                    or rec is None
                    or rec["turnInFlight"] != turn
                ):
                    return
                new = ev.turn_queued if waiting else ev.turn_granted
                await self._commit([new(agent_id, turn)])
        except StoreUnavailableError as exc:
            logger.warning("agent %s: turn %d's slot wait not written: %s", agent_id, turn, exc)

    def _start_turn(self, agent_id: str, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` (a turn of the agent, to its outcome) as the agent's turn task."""
        if self._closed:
            work.close()
            return  # shutting down: the turn stays in flight and the next start settles it
        task = asyncio.create_task(work, name=f"turn-{agent_id}")
        self._turns[agent_id] = task
        task.add_done_callback(lambda t: self._forget(agent_id, t))

    def _forget(self, agent_id: str, task: asyncio.Task[None]) -> None:
        if self._turns.get(agent_id) is task:
            del self._turns[agent_id]
        if not task.cancelled() and task.exception() is not None:
            logger.error("agent %s: turn task failed", agent_id, exc_info=task.exception())

    async def _run_turn(self, agent_id: str, turn: int, prompt: str) -> None:
        if not self._workdir(agent_id).is_dir():
            await self._recreate_workdir(agent_id, turn)
        rec = self.store.state.agents[agent_id]
        spec = self._spec(agent_id)
        env = _turns.agent_env(rec, self.url, self._token)
        now = self.clock.now()
        pauses = self._pauses[agent_id] = _Pauses(self.clock)
        beat = None
        if spec.heartbeat_s is not None:
            beat = self._stalls.watch(agent_id, turn, spec.heartbeat_s)
        turn_request = _turns.request(
            rec,
            spec,
            turn,
            prompt,
            now,
            home=self.home,
            env=env,
            check_action=self._harness_check,
            paused_s=pauses.paused_s,
            lookup=self.store.state.agents.get,
            heartbeat=beat,
            extra_tools=() if self._agent_tools is None else self._agent_tools(agent_id, spec),
            session=_sessions.before(self.store.state.sessions.get(agent_id), turn),
            spent=self._spent_by(agent_id, turn),
            log=self.turn_book.sink(agent_id, turn),
        )
        try:
            running = _turns.run(self.harnesses[spec.harness], turn_request)
            outcome = await _tracing.turn(rec, spec.harness, turn, running)
        finally:
            self._stalls.end(agent_id, turn)
        await self._settle_turn(agent_id, turn, outcome)

    async def _adopt_turn(self, agent_id: str, turn: int, harness: AdoptingHarness) -> None:
        """Take up turn ``turn``, which a previous process left waiting on a person."""
        rec = self.store.state.agents[agent_id]
        spec = self._spec(agent_id)
        turn_request = _turns.request(
            rec,
            spec,
            turn,
            rec["lastPrompt"] or "",
            self.clock.now(),
            home=self.home,
            env=_turns.agent_env(rec, self.url, self._token),
            check_action=self._harness_check,
            paused_s=self.pauses(agent_id).paused_s,
            lookup=self.store.state.agents.get,
            session=_sessions.before(self.store.state.sessions.get(agent_id), turn),
            log=self.turn_book.sink(agent_id, turn),
        )
        logger.info("agent %s: adopting turn %d, left waiting on a person", agent_id, turn)
        outcome = await _tracing.turn(rec, spec.harness, turn, _turns.adopt(harness, turn_request))
        await self._settle_turn(agent_id, turn, outcome)

    async def _settle_turn(self, agent_id: str, turn: int, outcome: _turns.Outcome) -> None:
        """Write the turn's outcome (unless the agent was stopped or the service is closing
        meanwhile: then it is dropped)."""
        # The turn's outcome is written when the store takes it: a store that blips (a
        # dropped connection, a database restarting) is tried again, for up to
        # ``result_retry_s``, rather than leaving the agent running until a restart.
        delay_s, waited_s = _RESULT_RETRY_FIRST_S, 0.0
        while True:
            try:
                async with self._locks.run(self._run_of(agent_id)):
                    if self._turns.get(agent_id) is not asyncio.current_task() or self._closed:
                        return  # stopped or shutting down while the turn ran: dropped
                    rec = self.store.state.agents[agent_id]
                    if rec["turnInFlight"] != turn:
                        return  # an earlier try committed, though its answer was lost
                    if outcome.interrupted:
                        await self._interrupted(rec, turn)
                        return
                    if outcome.result is not None:
                        await self._after_turn_success(rec, turn, outcome.result)
                        return
                    assert outcome.error is not None
                    await self._after_turn_failure(
                        rec,
                        turn,
                        outcome.error,
                        outcome.usage,
                        [],
                        dimension=outcome.dimension,
                        messages=_sessions.turn_messages(outcome.messages),
                    )
                    return
            except NotOwnerError:
                # Another daemon took the agent over while the turn ran (this one's lease
                # ran out): it settles the turn, as interrupted.
                logger.warning(
                    "agent %s: turn %d's outcome dropped: not owned here", agent_id, turn
                )
                return
            except StoreUnavailableError as exc:
                if not exc.retryable or waited_s >= self._result_retry_s:
                    raise
                logger.warning(
                    "agent %s: turn %d's outcome not written (%s); trying again in %g s",
                    agent_id,
                    turn,
                    exc.message,
                    delay_s,
                )
            await self.clock.sleep(delay_s)
            waited_s += delay_s
            delay_s = min(delay_s * 2, _RESULT_RETRY_MAX_S)
            with contextlib.suppress(StoreUnavailableError):
                await self.store.refresh()

    async def _interrupted(self, rec: AgentRecord, turn: int) -> None:
        """Settle the turn as cut short by a restart (``agent.turn_interrupted``, a failed
        turn). Call with the mutex held."""
        interrupted = [ev.turn_interrupted(rec["id"], turn, RESTARTED)]
        await self._after_turn_failure(rec, turn, RESTARTED, None, interrupted)

    def _on_stall(self, agent_id: str, turn: int, silence_s: float, first: bool) -> None:
        if not self._closed:
            self._soon(self._stalled(agent_id, turn, silence_s, first))

    async def _stalled(self, agent_id: str, turn: int, silence_s: float, first: bool) -> None:
        """Recover the agent's stalled turn as its policy says (see ``_stall``): the turn is
        cancelled (its process killed) before the events say so, as :meth:`stop` does."""
        async with self._locks.exclusive():
            rec = self.store.state.agents.get(agent_id)
            task = self._turns.get(agent_id)
            if (
                self._closed
                or rec is None
                or task is None
                or rec["turnInFlight"] != turn
                or rec["state"] not in ("running", "paused")
                or not self._stalls.stalled(agent_id, turn)
            ):
                return  # it ended, waits on a person, or came back to life meanwhile
            spec = self._spec(agent_id)
            wait_s = self._stalls.cooldown_left(agent_id, _stall.policy_of(spec).cooldown_s)
            if wait_s > 0:
                await self._commit(
                    _stall.deferred(rec, spec, turn, silence_s, first=first, wait_s=wait_s)
                )
                self._stalls.look_again(agent_id, turn, wait_s)
                return
            await self._cancel_turn(agent_id)
            self._stalls.recovered(agent_id)
            withdrawn = self._withdraw(agent_id, f"turn {turn} stalled", turn=turn)
            step = _stall.recover(
                self.store.state,
                rec,
                spec,
                turn,
                silence_s,
                self.clock.now(),
                first=first,
                before=withdrawn,
            )
            # A paused agent (its turn finishing) starts nothing: what the recovery leads to
            # waits for its resume (see _headcount.while_paused).
            events, restart = _headcount.while_paused(rec, step.events, step.restart)
            await self._commit(events)
            if restart is not None:
                after = self.store.state.agents[agent_id]
                self._launch(agent_id, restart, _notices.resend_text(self.store.state, after))
            self._release_if_ended(agent_id)

    async def _recreate_workdir(self, agent_id: str, turn: int) -> None:
        """The agent's working directory is gone (deleted by hand, a cleanup job): make it
        again, empty, and say so in the log and the events before the turn runs in it."""
        workdir = self._workdir(agent_id)
        try:
            workdir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            # The harness fails the turn, saying the directory is missing.
            logger.error("agent %s: could not recreate its working directory: %s", agent_id, exc)
            return
        logger.warning(
            "agent %s: its working directory %s was missing; recreated it, empty", agent_id, workdir
        )
        try:
            async with self._locks.run(self._run_of(agent_id)):
                if self._turns.get(agent_id) is asyncio.current_task() and not self._closed:
                    await self._commit([ev.workdir_recreated(agent_id, turn, str(workdir))])
        except StoreUnavailableError as exc:
            logger.warning("agent %s: workdir_recreated not written: %s", agent_id, exc.message)

    async def _after_turn_success(self, rec: AgentRecord, turn: int, result: TurnResult) -> None:
        usage: TurnUsage = {"tokens": result.tokens, "costUsd": result.cost_usd}
        spec = self._spec(rec["id"])
        state = self.store.state
        events = self._withdraw(rec["id"], f"turn {turn} ended", turn=turn)
        messages = _sessions.turn_messages(result.messages)
        events += _decisions.turn_succeeded(
            state, rec, spec, turn, result.output, usage, messages=messages
        )
        events, _ = _headcount.while_paused(rec, events, None)
        await self._commit(events)
        self._release_if_ended(rec["id"])

    async def _after_turn_failure(
        self,
        rec: AgentRecord,
        turn: int,
        error: str,
        usage: Mapping[str, Any] | None,
        before: list[NewEvent],
        *,
        dimension: str | None = None,
        messages: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        """Write the failed turn (after ``before``; with ``messages``, what the agent said
        in it) and what the policy makes of it (a turn that stopped on budget ``dimension``
        holds the agent); start a retry if it says so. Call with the mutex held."""
        spec = self._spec(rec["id"])
        before = [*self._withdraw(rec["id"], f"turn {turn} ended", turn=turn), *before]
        events, retry = _decisions.turn_failed(
            self.store.state,
            rec,
            spec,
            turn,
            error,
            usage,
            self.clock.now(),
            before=before,
            dimension=dimension,
            messages=messages,
        )
        if _external.is_external(spec):
            events, retry = _external.instead_of_retry(rec, events, retry)
        events, retry = _headcount.while_paused(rec, events, retry)
        await self._commit(events)
        if retry is not None:
            self._launch(rec["id"], retry, _notices.resend_text(self.store.state, rec))
        self._release_if_ended(rec["id"])

    def _spent_by(self, agent_id: str, turn: int) -> Callable[[Mapping[str, Any]], None]:
        """Where turn ``turn``'s harness tells what it had spent when it is cancelled."""

        def spent(usage: Mapping[str, Any]) -> None:
            tokens, cost = usage.get("tokens", 0), usage.get("costUsd")
            if _turns.usage_problem(tokens, cost) is None:
                self._spent[agent_id] = (turn, {"tokens": tokens, "costUsd": cost})

        return spent

    def _with_spent(self, event: NewEvent) -> NewEvent:
        """``agent.turn_interrupted`` with what its cancelled turn had spent, when its
        harness told: stopping, preempting or restarting a turn must not hide its spending
        from the budgets above it."""
        if event.type != ev.TURN_INTERRUPTED or event.agent_id is None or "usage" in event.data:
            return event
        found = self._spent.get(event.agent_id)
        if found is None or found[0] != event.data.get("turn"):
            return event
        return NewEvent(event.type, event.agent_id, {**event.data, "usage": found[1]})

    async def _commit(
        self,
        events: Sequence[NewEvent],
        key: str | None = None,
        command: dict[str, Any] | None = None,
        result: CommandResult | None = None,
    ) -> list[Event]:
        events = [self._with_spent(event) for event in events]
        # An agent that ends leaves no approval waiting on people (see _approvals).
        events = _approvals.withdrawn_at_end(self.store.state.decisions.values(), events)
        # Sessions a run's end deletes are deleted in the same commit (see _retention).
        events += _retention.on_commit(self.store.state, events, self.clock.now().isoformat())
        if key is not None and command is not None and result is not None:
            events.append(_commands.recorded(key, command, result))
        # Turn records commit in the events' transaction (see _turn_records).
        draft = await self.turn_book.draft(events)
        turns = draft.rows if draft is not None and self.turn_book.in_store else None
        written = await self.store.append(events, turns=turns)
        await self.turn_book.committed(draft, written)
        for event in written:
            if event.type == ev.TURN_INTERRUPTED and event.agent_id is not None:
                self._spent.pop(event.agent_id, None)
            if event.type == ev.STATE_CHANGED:
                d = event.data
                if event.agent_id is not None and "waiting" in (d.get("from"), d.get("to")):
                    self.pauses(event.agent_id).waiting(d["to"] == "waiting")
                    self._stalls.waiting(event.agent_id, d["to"] == "waiting")
                logger.info(
                    "agent %s: %s -> %s (%s)%s",
                    event.agent_id,
                    d.get("from"),
                    d["to"],
                    d.get("reason"),
                    f": {d['error']}" if d.get("error") else "",
                )
            elif event.type == ev.DECISION_RESOLVED:
                # Whoever answered (a person, a deadline, a withdrawal), the checks waiting
                # on the decision hear it once it is durable.
                self._settle_waiters(str(event.data.get("decisionId")))
            if event.type in (ev.DECISION_REQUESTED, ev.DECISION_RESOLVED) and event.agent_id:
                # A paused agent's finishing turn that waits on a person stays paused: the
                # wait counts as for a waiting agent (its timeout, its silence).
                rec = self.store.state.agents.get(event.agent_id)
                if rec is not None and rec["state"] == "paused":
                    asked = bool(_headcount.asked(self.store.state, rec))
                    self.pauses(event.agent_id).waiting(asked)
                    self._stalls.waiting(event.agent_id, asked)
        ended = [
            e.agent_id
            for e in written
            if e.type == ev.STATE_CHANGED and e.agent_id and e.data["to"] in ENDED_STATES
        ]
        if ended:
            # Headcount freed: the best paused agents of those runs resume at once.
            await self._resume(await self._headcount.freed(self.store.state, ended, self._spec))
        self._wake_soon(_wake.observe(written, self._wakes))
        return written

    # --- headcount (see _headcount) -------------------------------------------------------

    def _pausing(self, agent_id: str | None, by: str) -> tuple[list[NewEvent], bool]:
        """The events that pause ``agent_id`` (None: nobody) for new agent ``by``, and
        whether its turn is to be cancelled (:meth:`_preempted`). A turn still queued for a
        concurrent-turn slot has not started: it is cancelled whatever ``onPreempt`` says
        (it runs on resume), and at once, so that no slot granted meanwhile starts it."""
        if agent_id is None:
            return [], False
        rec = self.store.state.agents[agent_id]
        queued = self._slots.waiting(agent_id) > 0
        events, cancel = _headcount.pause_events(rec, self._spec(agent_id), by, queued=queued)
        task = self._turns.get(agent_id)
        if queued and task is not None:
            task.cancel()
        return events, cancel

    async def _preempted(self, agent_id: str | None, cancel: bool) -> None:
        """Cancel the turn of agent ``agent_id``, which is being paused, when ``cancel``
        (:meth:`_pausing` says; its interruption is written next, with what the turn had
        spent). Call with the mutex held."""
        if agent_id is not None and cancel:
            await self._cancel_turn(agent_id)

    async def _cancel_turn(self, agent_id: str) -> None:
        """Cancel the agent's turn task, if it has one, and wait until it has ended (its
        process killed, what it spent told: see :meth:`_spent_by`); its outcome is never
        written by it (see :meth:`_settle_turn`). Call with the mutex held."""
        task = self._turns.pop(agent_id, None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _resume(self, agent_ids: Sequence[str]) -> None:
        """Resume the paused agents that took freed slots, in that order (their turn, if
        they have one to run, starts). Call with the mutex held."""
        for agent_id in agent_ids:
            rec = self.store.state.agents[agent_id]
            if rec["state"] != "paused":
                continue
            spec = self._spec(agent_id)
            events, turn = _headcount.resume_events(self.store.state, rec, spec, self.clock.now())
            await self._commit(events)
            if turn is not None:
                self._launch(agent_id, *turn)

    def _wake_soon(self, agent_ids: Iterable[str]) -> None:
        """Queue a wake check of each ``wake`` agent in ``agent_ids`` (see ``_wake``): run on
        a task of its own, as the caller holds the mutex."""
        for agent_id in agent_ids:
            if self._closed or agent_id in self._waking or not self._owns(agent_id):
                continue
            if agent_id in self.store.state.agents and self._spec(agent_id).wake:
                self._waking.add(agent_id)
                self._soon(self._wake(agent_id))

    async def _wake(self, agent_id: str) -> None:
        """Wake ``agent_id`` if it is (still) an idle ``wake`` agent with pending notices."""
        async with self._locks.exclusive():
            # From here on a new notice queues another check: this one may miss it.
            self._waking.discard(agent_id)
            if self._closed:
                return
            state, now = self.store.state, self.clock.now()
            woken = _wake.plan(state, agent_id, self._spec, now, self._wakes)
            if woken is None:
                return
            try:
                await self._commit(woken.events)
            except StoreUnavailableError as exc:
                # The notices stay pending: the next commit about the agent, or the next
                # start, checks it again.
                logger.warning("agent %s: not woken: %s", agent_id, exc.message)
                return
            if woken.turn is not None:
                self._launch(agent_id, woken.turn, woken.prompt)

    # --- harness workers --------------------------------------------------------------------

    async def _release(self, agent_id: str) -> None:
        """Tell the agent's harness the agent has ended, so it ends what it keeps for it.
        Runs off the lock: an agent restarted meanwhile keeps its worker, and one deleted
        meanwhile had it released by the delete."""
        rec = self.store.state.agents.get(agent_id)
        if rec is None or rec["state"] not in ENDED_STATES:
            return
        harness: object = self.harnesses.get(self._spec(agent_id).harness)
        if isinstance(harness, WarmHarness):
            try:
                await harness.release(agent_id)
            except Exception:
                logger.exception("agent %s: could not release its harness worker", agent_id)

    def _release_if_ended(self, agent_id: str) -> None:
        # Called with the mutex held: the release (a process to end) runs on its own task.
        if self.store.state.agents[agent_id]["state"] not in ENDED_STATES:
            return
        task = asyncio.create_task(self._release(agent_id), name=f"release-{agent_id}")
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    # --- helpers ----------------------------------------------------------------------------

    async def node_of(self, agent_id: str) -> str | None:
        """Several daemons: the name of the daemon that owns ``agent_id`` (None when it is
        alone on its store, or none owns the agent yet)."""
        if self._ownership is None:
            return None
        return await self._ownership.node_of(agent_id)

    def _run_of(self, agent_id: str) -> str:
        """The run whose lock a step about ``agent_id`` holds (see ``_run_locks``): its
        record's ``runId``, which never changes; an unknown agent's own id (the step then
        finds it missing and refuses)."""
        rec = self.store.state.agents.get(agent_id)
        return rec["runId"] if rec is not None else f"agent:{agent_id}"

    def _owns(self, agent_id: str) -> bool:
        return self._ownership is None or self._ownership.owns(agent_id)

    def _merged(self, events: Sequence[Event], own: bool) -> None:
        """The store merged ``events`` (in ``seq`` order): stream them. Another daemon's
        (``own`` False) may concern agents owned here: a notice wakes a coordinator, an
        answer reaches the check waiting on it."""
        self._feed.publish(events, own=own)
        if own:
            return
        for event in events:
            if event.type == ev.DECISION_RESOLVED:
                self._settle_waiters(str(event.data.get("decisionId")))
        self._wake_soon(_wake.observe(events, self._wakes))

    def _refuse_if_closed(self, command: str) -> None:
        # A command that waited for the lock while close() ran must not start work that
        # nothing would run: the caller retries against the next daemon.
        if self._closed:
            raise ServiceClosedError(command)

    def _record(self, agent_id: str) -> AgentRecord:
        rec = self.store.state.agents.get(agent_id)
        if rec is None:
            raise AgentNotFoundError(agent_id)
        return rec

    def _live(self, agent_id: str) -> AgentRecord:
        rec = self._record(agent_id)
        if rec["state"] in ENDED_STATES:
            raise AgentNotLiveError(agent_id, rec["state"])
        return rec

    def _spec(self, agent_id: str) -> AgentSpec:
        raw = self.store.state.agents[agent_id]["spec"]
        spec = self._specs.get(agent_id)
        # A PATCH replaces the record's spec (agent.spec_changed), here or in a daemon
        # sharing the store: a spec made from another record's is made again.
        if spec is None or self._spec_raw.get(agent_id) is not raw:
            spec = AgentSpec.model_validate(raw)
            self._specs[agent_id] = spec
            self._spec_raw[agent_id] = raw
        return spec

    def _new_agent_id(self) -> str:
        while True:
            candidate = "a_" + secrets.token_hex(4)
            if candidate not in self.store.state.agents:
                return candidate

    def _workdir(self, agent_id: str) -> Path:
        return _turns.workdir(self.home, agent_id)

    def _state_dir(self, agent_id: str) -> Path:
        return _turns.state_dir(self.home, agent_id)


def _never_asks(ask: AskRequest) -> None:
    """The ``on_ask`` of rules without an ``ask``: never called."""
    raise AssertionError("a rule asked a person, but none of the rules asks")
