"""``AgentService``: agents under supervision, on top of a Store and the harnesses.

It coordinates: commands and turns decide, ``_events`` builds what they decided, the store
commits it (the reducer in ``_state`` computes the new state), and only then does anything act
on it or hear of it. See "Seed 001" in docs/architecture.md.
"""

# Past 500 lines on purpose: every command and a turn's outcome are decided under one lock,
# and each is a short method here over the pure modules that decide; the lock is not split.

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import shutil
from collections.abc import AsyncGenerator, Mapping, Sequence
from pathlib import Path
from typing import Any

from corral.daemon import (
    _admission,
    _budget,
    _commands,
    _decisions,
    _notices,
    _queries,
    _tokens,
    _turns,
)
from corral.daemon import _events as ev
from corral.daemon._budget import NOTHING_SPENT
from corral.daemon._commands import CommandResult
from corral.daemon._errors import (
    AgentBudgetExhaustedError,
    AgentBusyError,
    AgentNotFoundError,
    AgentNotLiveError,
    NothingToSendError,
    OutOfScopeError,
    ServiceClosedError,
    StoreUnavailableError,
)
from corral.daemon._events import Event, NewEvent
from corral.daemon._feed import EventFeed
from corral.daemon._policy import BUDGET_EXHAUSTED as BUDGET_HELD
from corral.daemon._records import AgentRecord, TurnUsage
from corral.daemon._spec import AgentSpec, parse_spec
from corral.daemon._state import ENDED_STATES, preview
from corral.daemon._text import escape_json
from corral.daemon.harnesses import Harness, TurnResult, WarmHarness
from corral.daemon.stores import Store
from corral.kernel import SYSTEM_CLOCK, Clock, InvalidArgumentError, new_id
from corral.kernel import _validate as v

__all__ = ["AgentService", "CommandResult"]

logger = logging.getLogger("corral.daemon")

Json = dict[str, Any]  # a record as the HTTP API returns it

RESTARTED = "daemon restarted during turn"
_RESULT_RETRY_FIRST_S = 0.25  # then doubling, up to _RESULT_RETRY_MAX_S between tries
_RESULT_RETRY_MAX_S = 8.0


class AgentService:
    """The agent service: spawn, prompt and stop agents; read their state and events.

    ``home`` holds each agent's working directory (``agents/<id>/work``, kept as long as the
    agent) and the harnesses' bookkeeping (``agents/<id>/state``). ``harnesses`` maps harness
    names (``command``, ``python``, ``openai``) to :class:`Harness` objects. Call
    :meth:`start` once after the store is open: it settles turns that a previous process left
    in flight (their leftover process is ended, ``agent.turn_interrupted`` is emitted, and the
    turn counts as failed, "daemon restarted during turn").

    ``result_retry_s``: how long the outcome of a turn is tried again when the store is
    unavailable (``store_unavailable``, retryable) before the agent is left running until a
    restart settles it.

    ``token`` is the daemon's bearer token, when it has one: each agent's environment then
    carries ``CORRAL_TOKEN``, a token scoped to the agent and its descendants (see
    :meth:`in_scope`), next to ``CORRAL_URL``.
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
        self._result_retry_s = result_retry_s
        self._token = token
        self.store = store
        self.home = Path(home)
        self.harnesses = dict(harnesses)
        self.url = url
        self.clock = clock
        self._mutex = asyncio.Lock()
        self._turns: dict[str, asyncio.Task[None]] = {}
        # Each agent's parsed spec (a spec never changes): filled at spawn, and on first use
        # for agents loaded from the store, so a turn does not parse the record's JSON again.
        self._specs: dict[str, AgentSpec] = {}
        self._feed = EventFeed(store, subscriber_buffer)
        self._closed = False
        # Releases of ended agents' harness workers, run off the mutex (see _release_soon).
        self._releases: set[asyncio.Task[None]] = set()

    # --- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Settle turns left in flight by a previous process, then accept commands."""
        async with self._mutex:
            for rec in list(self.store.state.agents.values()):
                turn = rec["turnInFlight"]
                if turn is None:
                    continue
                harness = self.harnesses.get(self._spec(rec["id"]).harness)
                if harness is not None:
                    try:
                        if await harness.reap(rec["id"], self._state_dir(rec["id"])):
                            logger.info("agent %s: ended a leftover turn process", rec["id"])
                    except Exception:
                        logger.exception("agent %s: could not end a leftover process", rec["id"])
                interrupted = [ev.turn_interrupted(rec["id"], turn, RESTARTED)]
                await self._after_turn_failure(rec, turn, RESTARTED, None, interrupted)

    async def close(self) -> None:
        """Stop running turns (their processes are ended; nothing is written for them, so the
        next start settles them as interrupted) and end event streams."""
        self._closed = True
        tasks = list(self._turns.values())
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

    # --- queries ----------------------------------------------------------------------------

    def get(self, agent_id: str) -> Json:
        return dict(self._record(agent_id))

    def list_agents(self) -> list[Json]:
        return [dict(r) for r in self.store.state.agents.values()]

    def in_scope(self, principal: str, agent_id: str) -> bool:
        """Whether ``agent_id`` is ``principal`` or one of its descendants (an unknown id is
        in no one's scope)."""
        return _queries.in_scope(self.store.state, principal, agent_id)

    def inbox(self, agent_id: str) -> list[Json]:
        self._record(agent_id)
        return [dict(n) for n in self.store.state.notices.values() if n["to"] == agent_id]

    def decisions(self) -> list[Json]:
        """Everything waiting on a person: blocked agents, oldest first."""
        return _queries.blocked(self.store.state)

    def resolutions(self) -> list[Json]:
        return [dict(r) for r in self.store.state.resolutions.values()]

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
        command = {"command": "spawn", "spec": spec.to_json()}
        async with self._mutex:
            replayed = _commands.replayed(self.store.state, idempotency_key, command)
            if replayed is not None:
                return replayed
            self._refuse_if_closed("spawn")
            state = self.store.state
            parent = _admission.parent_of(state, spec, self.harnesses)
            run_id = parent["runId"] if parent else new_id()
            _admission.check_headcount(state, run_id, spec, self._spec)
            agent_id = self._new_agent_id()
            now = self.clock.now()
            # A first turn that the budget leaves no room for (maxTurns 0, deadlineS 0, ...)
            # does not start: the agent is created held, as a prompt would leave it.
            budget = spec.budget.to_budget()
            exhausted = _budget.exhausted(budget, NOTHING_SPENT, 0.0) if spec.prompt else None
            starts = bool(spec.prompt) and exhausted is None
            workdir = str(self._workdir(agent_id))
            rec = _admission.new_record(
                agent_id, spec, parent, run_id, workdir, now.isoformat(), starts=starts
            )
            events = [ev.agent_created(rec)]
            if starts and spec.prompt:
                events.append(ev.turn_started(agent_id, 1, spec.prompt, retry=False, notices=[]))
            elif exhausted is not None:
                events += _decisions.budget_hold(state, rec, exhausted)
            created = preview(state, events, now.isoformat()).get_agent(agent_id)
            assert created is not None
            self._workdir(agent_id).mkdir(parents=True, exist_ok=True)
            self._state_dir(agent_id).mkdir(parents=True, exist_ok=True)
            result = CommandResult(201, dict(created))
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
    ) -> CommandResult:
        """Start a turn of an idle or blocked agent; 202.

        Without ``text`` the last prompt is re-sent. Prompting a blocked agent resolves its
        decision (recorded with ``by`` and ``why``). Pending notices to the agent go in front of
        the prompt, merged into one.
        """
        if text is not None and not isinstance(text, str):
            raise InvalidArgumentError("prompt", "text", "a string or None", text)
        command = {"command": "prompt", "agent": agent_id, "text": text}
        async with self._mutex:
            replayed = _commands.replayed(self.store.state, idempotency_key, command)
            if replayed is not None:
                return replayed
            self._refuse_if_closed("prompt")
            rec = self._live(agent_id)
            if rec["state"] == "running":
                raise AgentBusyError(agent_id)
            prompt = text if text else rec["lastPrompt"]
            if not prompt:
                raise NothingToSendError(agent_id)
            exhausted = _decisions.exhausted(rec, self._spec(agent_id), self.clock.now())
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
                events.append(ev.agent_resolved(rec, "prompt", by, why))
            pending = _notices.pending(self.store.state, agent_id)
            turn = rec["turns"] + 1
            events.append(ev.prompted(agent_id, rec["state"]))
            events.append(
                ev.turn_started(
                    agent_id, turn, prompt, retry=False, notices=[n["id"] for n in pending]
                )
            )
            result = CommandResult(202, {"id": agent_id, "accepted": "prompt"})
            await self._commit(events, idempotency_key, command, result)
            self._launch(agent_id, turn, _notices.with_notices(prompt, pending))
            return result

    async def stop(
        self,
        agent_id: str,
        *,
        by: str | None = None,
        why: str | None = None,
        idempotency_key: str | None = None,
    ) -> CommandResult:
        """End an agent: a turn in flight is cancelled (its process killed); 202."""
        command = {"command": "stop", "agent": agent_id}
        async with self._mutex:
            replayed = _commands.replayed(self.store.state, idempotency_key, command)
            if replayed is not None:
                return replayed
            self._refuse_if_closed("stop")
            rec = self._live(agent_id)
            task = self._turns.pop(agent_id, None)
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            events: list[NewEvent] = []
            if rec["turnInFlight"] is not None:
                events.append(ev.turn_interrupted(agent_id, rec["turnInFlight"], "agent stopped"))
            if rec["state"] == "blocked":
                events.append(ev.agent_resolved(rec, "stop", by, why))
            events.append(ev.stopped(agent_id, rec["state"], by, why))
            events += _decisions.drop_pending(self.store.state, agent_id)
            result = CommandResult(202, {"id": agent_id, "accepted": "stop"})
            await self._commit(events, idempotency_key, command, result)
        await self._release(agent_id)
        shutil.rmtree(self._workdir(agent_id), ignore_errors=True)
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
        async with self._mutex:
            replayed = _commands.replayed(self.store.state, idempotency_key, command)
            if replayed is not None:
                return replayed
            self._refuse_if_closed("budget")
            rec = self._live(agent_id)
            spec = self._spec(agent_id)
            current = _budget.in_force(rec, spec)
            new = _budget.changed(current, changes)
            if lower_only is not None and _budget.raises(new, current):
                raise OutOfScopeError(lower_only, "raising a budget (a person decides)")
            now = self.clock.now()
            events = _decisions.budget_changed(self.store.state, rec, spec, new, by, why, now)
            after = preview(self.store.state, events, now.isoformat()).get_agent(agent_id)
            assert after is not None
            result = CommandResult(200, dict(after))
            await self._commit(events, idempotency_key, command, result)
            return result

    async def record_gateway_freeze(self, target: str, freeze: Json) -> None:
        """Log that the gateway froze an agent in database ``target`` (``freeze`` as JSON:
        ``agentId``, ``reason``, evidence...). When the agent is one of this daemon's and has
        a parent, the parent's inbox gets a ``gateway_frozen`` notice. The freeze itself is
        the gateway's (its journal); this only tells watchers."""
        # The freeze's evidence holds the agent's SQL: escaped like any text an agent sends.
        freeze = escape_json(freeze)
        async with self._mutex:
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
        self, target: str, agent_id: str, freeze: Json | None, reinstatement: Json
    ) -> None:
        """Log a person's reinstatement of ``agent_id`` in database ``target`` as a resolved
        decision (kind ``gateway_frozen``, action ``reinstate``, with ``by`` and ``why``)."""
        async with self._mutex:
            resolved = ev.gateway_resolved(
                target,
                agent_id,
                reason=None if freeze is None else freeze.get("reason"),
                freeze_id=reinstatement.get("freezeId"),
                by=reinstatement["by"],
                why=reinstatement["reason"],
            )
            await self._commit([resolved])

    # --- named operator tokens (see _tokens) ------------------------------------------------

    def tokens(self) -> list[Json]:
        """The live named operator tokens, oldest first: name, createdAt, by (no secret, no
        digest)."""
        return [_tokens.shown(t) for t in _tokens.live(self.store.state)]

    async def create_token(self, name: str, *, by: str | None = None) -> Json:
        """Make the operator token ``name`` (made by ``by``): ``{name, token, createdAt,
        by}``, the only time its secret is shown; only its SHA-256 is written. Raises
        ``InvalidRequestError`` for a bad name, ``TokenExistsError`` for a live one."""
        async with self._mutex:
            self._refuse_if_closed("create_token")
            secret, created = _tokens.creation(self.store.state, name, by)
            await self._commit([created])
            record = self.store.state.tokens[created.data["name"]]
        return {**_tokens.shown(record), "token": secret}

    async def revoke_token(self, name: str, *, by: str | None = None) -> Json:
        """Revoke the live operator token ``name`` (from the next request on, it opens
        nothing); its record. Raises ``TokenNotFoundError`` when no live token has it."""
        async with self._mutex:
            self._refuse_if_closed("revoke_token")
            await self._commit([_tokens.revocation(self.store.state, name, by)])
            return _tokens.shown(self.store.state.tokens[name])

    # --- turns ------------------------------------------------------------------------------

    def _launch(self, agent_id: str, turn: int, prompt: str) -> None:
        if self._closed:
            return  # shutting down: the turn stays in flight and the next start settles it
        task = asyncio.create_task(self._run_turn(agent_id, turn, prompt), name=f"turn-{agent_id}")
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
        turn_request = _turns.request(rec, spec, turn, prompt, now, home=self.home, env=env)
        outcome = await _turns.run(self.harnesses[spec.harness], turn_request)
        # The turn's outcome is written when the store takes it: a store that blips (a
        # dropped connection, a database restarting) is tried again, for up to
        # ``result_retry_s``, rather than leaving the agent running until a restart.
        delay_s, waited_s = _RESULT_RETRY_FIRST_S, 0.0
        while True:
            try:
                async with self._mutex:
                    if self._turns.get(agent_id) is not asyncio.current_task() or self._closed:
                        return  # stopped or shutting down while the turn ran: dropped
                    rec = self.store.state.agents[agent_id]
                    if rec["turnInFlight"] != turn:
                        return  # an earlier try committed, though its answer was lost
                    if outcome.result is not None:
                        await self._after_turn_success(rec, turn, outcome.result)
                        return
                    assert outcome.error is not None
                    await self._after_turn_failure(
                        rec, turn, outcome.error, outcome.usage, [], dimension=outcome.dimension
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
            async with self._mutex:
                if self._turns.get(agent_id) is asyncio.current_task() and not self._closed:
                    await self._commit([ev.workdir_recreated(agent_id, turn, str(workdir))])
        except StoreUnavailableError as exc:
            logger.warning("agent %s: workdir_recreated not written: %s", agent_id, exc.message)

    async def _after_turn_success(self, rec: AgentRecord, turn: int, result: TurnResult) -> None:
        usage: TurnUsage = {"tokens": result.tokens, "costUsd": result.cost_usd}
        spec = self._spec(rec["id"])
        state = self.store.state
        await self._commit(_decisions.turn_succeeded(state, rec, spec, turn, result.output, usage))
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
    ) -> None:
        """Write the failed turn (after ``before``) and what the policy makes of it (a turn
        that stopped on budget ``dimension`` holds the agent); start a retry if it says so.
        Call with the mutex held."""
        spec = self._spec(rec["id"])
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
        )
        await self._commit(events)
        if retry is not None:
            self._launch(rec["id"], retry, _notices.resend_text(self.store.state, rec))
        self._release_if_ended(rec["id"])

    async def _commit(
        self,
        events: Sequence[NewEvent],
        key: str | None = None,
        command: dict[str, Any] | None = None,
        result: CommandResult | None = None,
    ) -> list[Event]:
        events = list(events)
        if key is not None and command is not None and result is not None:
            events.append(_commands.recorded(key, command, result))
        written = await self.store.append(events)
        for event in written:
            if event.type == ev.STATE_CHANGED:
                d = event.data
                logger.info(
                    "agent %s: %s -> %s (%s)%s",
                    event.agent_id,
                    d.get("from"),
                    d["to"],
                    d.get("reason"),
                    f": {d['error']}" if d.get("error") else "",
                )
        self._feed.publish(written)
        return written

    # --- harness workers --------------------------------------------------------------------

    async def _release(self, agent_id: str) -> None:
        """Tell the agent's harness the agent has ended, so it ends what it keeps for it."""
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
        spec = self._specs.get(agent_id)
        if spec is None:
            spec = AgentSpec.model_validate(self.store.state.agents[agent_id]["spec"])
            self._specs[agent_id] = spec
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
