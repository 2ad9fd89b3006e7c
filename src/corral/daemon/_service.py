"""``AgentService``: agents under supervision, on top of a Store and the harnesses.

Every decision is made under one lock and written to the store (events and projections in one
transaction) before anything acts on it or anyone hears of it; harness turns run outside the
lock. The lock is never held while a turn runs, only while a decision is written.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import logging
import secrets
import shutil
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from corral.daemon import _events as ev
from corral.daemon._auth import agent_token
from corral.daemon._errors import (
    AgentBudgetExhaustedError,
    AgentBusyError,
    AgentNotFoundError,
    AgentNotLiveError,
    IdempotencyConflictError,
    InvalidSpecError,
    NothingToSendError,
    ServiceClosedError,
    SpawnRefusedError,
    StoreUnavailableError,
)
from corral.daemon._events import Event, NewEvent
from corral.daemon._policy import BUDGET_EXHAUSTED, after_failure
from corral.daemon._spec import AgentSpec, parse_spec
from corral.daemon._state import ENDED_STATES, LIVE_STATES, Record, add_usage
from corral.daemon.harnesses import Harness, TurnFailedError, TurnRequest, TurnResult
from corral.daemon.stores import Store
from corral.kernel import (
    SYSTEM_CLOCK,
    BudgetExhaustedError,
    Clock,
    ExecutionBudget,
    InvalidArgumentError,
    new_id,
)
from corral.kernel import _validate as v
from corral.runtime import ExecutionTracker

logger = logging.getLogger("corral.daemon")

RESTARTED = "daemon restarted during turn"
_RESULT_RETRY_FIRST_S = 0.25  # then doubling, up to _RESULT_RETRY_MAX_S between tries
_RESULT_RETRY_MAX_S = 8.0
_OUTPUT_IN_NOTICE = 500  # characters of a child's output quoted in its parent's notice


@dataclass(frozen=True, slots=True)
class CommandResult:
    """What a command answered; ``replayed`` when an idempotency key returned a stored answer."""

    status: int
    body: dict[str, Any]
    replayed: bool = False


class _Subscriber:
    __slots__ = ("agent_id", "overflowed", "queue")

    def __init__(self, agent_id: str | None, size: int) -> None:
        self.agent_id = agent_id
        self.queue: asyncio.Queue[Event] = asyncio.Queue(maxsize=size)
        self.overflowed = False


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
        self._subscribers: set[_Subscriber] = set()
        self._subscriber_buffer = subscriber_buffer
        self._closed = False

    # --- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Settle turns left in flight by a previous process, then accept commands."""
        async with self._mutex:
            for rec in list(self.store.state.agents.values()):
                if rec["turnInFlight"] is None:
                    continue
                harness = self.harnesses.get(rec["spec"]["harness"])
                if harness is not None:
                    try:
                        if await harness.reap(rec["id"], self._state_dir(rec["id"])):
                            logger.info("agent %s: ended a leftover turn process", rec["id"])
                    except Exception:
                        logger.exception("agent %s: could not end a leftover process", rec["id"])
                turn = rec["turnInFlight"]
                events = [
                    NewEvent(ev.TURN_INTERRUPTED, rec["id"], {"turn": turn, "reason": RESTARTED})
                ]
                await self._after_turn_failure(rec, turn, RESTARTED, None, events)

    async def close(self) -> None:
        """Stop running turns (their processes are ended; nothing is written for them, so the
        next start settles them as interrupted) and end event streams."""
        self._closed = True
        tasks = list(self._turns.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for sub in list(self._subscribers):
            sub.overflowed = True
            self._wake(sub)

    # --- queries ----------------------------------------------------------------------------

    def get(self, agent_id: str) -> Record:
        rec = self.store.state.agents.get(agent_id)
        if rec is None:
            raise AgentNotFoundError(agent_id)
        return _public(rec)

    def list_agents(self) -> list[Record]:
        return [_public(r) for r in self.store.state.agents.values()]

    def in_scope(self, principal: str, agent_id: str) -> bool:
        """Whether ``agent_id`` is ``principal`` or one of its descendants (an unknown id is
        in no one's scope)."""
        agents = self.store.state.agents
        current: str | None = agent_id
        seen: set[str] = set()
        while current is not None and current not in seen:
            rec = agents.get(current)
            if rec is None:
                return False
            if current == principal:
                return True
            seen.add(current)
            current = rec["parent"]
        return False

    def inbox(self, agent_id: str) -> list[Record]:
        self.get(agent_id)
        return [n for n in self.store.state.notices.values() if n["to"] == agent_id]

    def decisions(self) -> list[Record]:
        """Everything waiting on a person: blocked agents, oldest first."""
        waiting = []
        for rec in self.store.state.agents.values():
            if rec["state"] == "blocked":
                waiting.append(
                    {
                        "kind": "agent_blocked",
                        "agentId": rec["id"],
                        "name": rec["name"],
                        "reason": rec["reason"],
                        "error": rec["error"],
                        "since": rec["updatedAt"],
                        "resolve": {
                            "prompt": f"POST /agents/{rec['id']}/prompt",
                            "stop": f"POST /agents/{rec['id']}/stop",
                        },
                    }
                )
        return sorted(waiting, key=lambda d: d["since"])

    def resolutions(self) -> list[Record]:
        return list(self.store.state.resolutions.values())

    async def events(
        self, after: int = 0, *, agent_id: str | None = None, limit: int = 1000
    ) -> list[Event]:
        return await self.store.read(after, agent_id=agent_id, limit=limit)

    async def subscribe(
        self, after: int | None = None, *, agent_id: str | None = None
    ) -> AsyncGenerator[Event, None]:
        """Events with ``seq > after`` from the log, then live ones as they are committed.

        No event is missed or repeated between the two. With ``after=None`` only live events
        come. The stream ends when the service closes or the subscriber falls more than
        ``subscriber_buffer`` events behind (resume with the last seq seen).
        """
        sub = _Subscriber(agent_id, self._subscriber_buffer)
        self._subscribers.add(sub)
        try:
            last = self.store.state.last_seq if after is None else after
            while True:  # catch up from the log, in pages
                page = await self.store.read(last, agent_id=agent_id, limit=1000)
                for event in page:
                    last = event.seq
                    yield event
                if len(page) < 1000:
                    break
            if self._closed:
                return  # close() has woken the subscribers it knew of; nothing more comes
            while True:
                event = await sub.queue.get()
                if sub.overflowed:  # set by _publish or close() while we waited
                    break
                if event.seq > last:
                    last = event.seq
                    yield event
        finally:
            self._subscribers.discard(sub)

    # --- commands ---------------------------------------------------------------------------

    async def spawn(self, data: Any, *, idempotency_key: str | None = None) -> CommandResult:
        """Create an agent from a spec (a dict or :class:`AgentSpec`); 201 with its record."""
        spec = data if isinstance(data, AgentSpec) else parse_spec(data)
        command = {"command": "spawn", "spec": spec.to_json()}
        async with self._mutex:
            replayed = self._replay_command(idempotency_key, command)
            if replayed is not None:
                return replayed
            self._refuse_if_closed("spawn")
            state = self.store.state
            parent = state.agents.get(spec.parent) if spec.parent else None
            if spec.parent is not None:
                if parent is None:
                    raise InvalidSpecError(
                        [{"field": "parent", "message": f"no agent with id {spec.parent!r}"}]
                    )
                if parent["state"] in ENDED_STATES:
                    raise InvalidSpecError(
                        [
                            {
                                "field": "parent",
                                "message": f"agent {spec.parent!r} has ended ({parent['state']})",
                            }
                        ]
                    )
            if spec.harness not in self.harnesses:
                raise InvalidSpecError(
                    [{"field": "harness", "message": f"harness {spec.harness!r} is not available"}]
                )
            run_id = parent["runId"] if parent else new_id()
            root_id = parent["rootId"] if parent else None
            max_agents = self._max_agents(run_id, spec)
            live = sum(
                1
                for a in state.agents.values()
                if a["runId"] == run_id and a["state"] in LIVE_STATES
            )
            if live >= max_agents:
                raise SpawnRefusedError(run_id, max_agents, live)
            agent_id = self._new_agent_id()
            now = self.clock.now().isoformat()
            rec: Record = {
                "id": agent_id,
                "name": spec.name,
                "spec": spec.to_json(),
                "state": "running" if spec.prompt else "idle",
                "reason": "spawned",
                "error": None,
                "parent": spec.parent,
                "runId": run_id,
                "rootId": root_id or agent_id,
                "children": [],
                "turns": 0,
                "turnInFlight": None,
                "consecutiveFailures": 0,
                "retriesUsed": 0,
                "lastPrompt": None,
                "lastNotices": [],
                "lastOutput": None,
                "lastError": None,
                "usage": {"tokens": 0, "costUsd": 0.0, "turns": 0, "unpricedTurns": 0},
                "workdir": str(self._workdir(agent_id)),
                "createdAt": now,
                "updatedAt": now,
            }
            # A first turn that the budget leaves no room for (maxTurns 0, deadlineS 0, ...)
            # does not start: the agent is created held, as a prompt would leave it.
            exhausted = self._budget_exhausted(rec) if spec.prompt else None
            starts = bool(spec.prompt) and exhausted is None
            if not starts:
                rec["state"] = "idle"
            events = [NewEvent(ev.AGENT_CREATED, agent_id, {"agent": rec})]
            created = rec
            if starts:
                assert spec.prompt is not None
                events.append(self._turn_started(agent_id, 1, spec.prompt, retry=False, notices=[]))
                created = {**rec, "turns": 1, "turnInFlight": 1, "lastPrompt": spec.prompt}
            elif exhausted is not None:
                events += self._budget_hold(rec, exhausted)
                held = {"state": "blocked", "reason": BUDGET_EXHAUSTED, "error": exhausted.message}
                created = {**rec, **held}
            self._workdir(agent_id).mkdir(parents=True, exist_ok=True)
            self._state_dir(agent_id).mkdir(parents=True, exist_ok=True)
            result = CommandResult(201, _public(created))
            await self._commit(events, idempotency_key, command, result)
            if starts:
                assert spec.prompt is not None
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
            replayed = self._replay_command(idempotency_key, command)
            if replayed is not None:
                return replayed
            self._refuse_if_closed("prompt")
            rec = self._live(agent_id)
            if rec["state"] == "running":
                raise AgentBusyError(agent_id)
            prompt = text if text else rec["lastPrompt"]
            if not prompt:
                raise NothingToSendError(agent_id)
            exhausted = self._budget_exhausted(rec)
            if exhausted is not None:
                # The turn would pass the budget: it does not start. An idle agent is held.
                if rec["state"] == "idle":
                    await self._commit(self._budget_hold(rec, exhausted))
                raise AgentBudgetExhaustedError(agent_id, exhausted)
            events: list[NewEvent] = []
            if rec["state"] == "blocked":
                events.append(self._resolution(rec, "prompt", by, why))
            pending = self._pending_notices(agent_id)
            turn = rec["turns"] + 1
            events.append(
                NewEvent(
                    ev.STATE_CHANGED,
                    agent_id,
                    {"from": rec["state"], "to": "running", "reason": "prompted"},
                )
            )
            events.append(
                self._turn_started(
                    agent_id, turn, prompt, retry=False, notices=[n["id"] for n in pending]
                )
            )
            result = CommandResult(202, {"id": agent_id, "accepted": "prompt"})
            await self._commit(events, idempotency_key, command, result)
            self._launch(agent_id, turn, _with_notices(prompt, pending))
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
            replayed = self._replay_command(idempotency_key, command)
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
                events.append(
                    NewEvent(
                        ev.TURN_INTERRUPTED,
                        agent_id,
                        {"turn": rec["turnInFlight"], "reason": "agent stopped"},
                    )
                )
            if rec["state"] == "blocked":
                events.append(self._resolution(rec, "stop", by, why))
            events.append(
                NewEvent(
                    ev.STATE_CHANGED,
                    agent_id,
                    {"from": rec["state"], "to": "stopped", "reason": "stopped", "by": by},
                )
            )
            pending = [n["id"] for n in self._pending_notices(agent_id)]
            if pending:
                events.append(NewEvent(ev.NOTICES_DROPPED, agent_id, {"ids": pending}))
            result = CommandResult(202, {"id": agent_id, "accepted": "stop"})
            await self._commit(events, idempotency_key, command, result)
        shutil.rmtree(self.home / "agents" / agent_id / "work", ignore_errors=True)
        return result

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
        rec = self.store.state.agents[agent_id]
        spec = AgentSpec.model_validate(rec["spec"])
        remaining = self._remaining(rec, spec)
        timeout_s = spec.turn_timeout_s
        if remaining.deadline_s is not None:
            # A turn may not outlive the agent's deadline: it is cut short (a failed turn).
            timeout_s = max(0.001, min(timeout_s, remaining.deadline_s))
        request = TurnRequest(
            agent_id=agent_id,
            turn=turn,
            prompt=prompt,
            spec=spec,
            workdir=self._workdir(agent_id),
            state_dir=self._state_dir(agent_id),
            env=self._agent_env(rec),
            timeout_s=timeout_s,
            remaining=remaining,
        )
        error: str | None = None
        usage: dict[str, Any] | None = None
        result: TurnResult | None = None
        try:
            result = await self.harnesses[spec.harness].run_turn(request)
        except TurnFailedError as exc:
            error, usage = exc.message, exc.usage
        except Exception as exc:  # a harness bug is a failed turn too, and is logged
            logger.exception("agent %s: harness %s raised", agent_id, spec.harness)
            error = f"harness error: {type(exc).__name__}: {exc}"
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
                    if result is not None:
                        await self._after_turn_success(rec, turn, result)
                        return
                    assert error is not None
                    await self._after_turn_failure(rec, turn, error, usage, [])
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

    async def _after_turn_success(self, rec: Record, turn: int, result: TurnResult) -> None:
        agent_id = rec["id"]
        usage = {"tokens": result.tokens, "costUsd": result.cost_usd}
        events = [
            NewEvent(
                ev.TURN_COMPLETED, agent_id, {"turn": turn, "output": result.output, "usage": usage}
            ),
            NewEvent(
                ev.STATE_CHANGED, agent_id, {"from": "running", "to": "idle", "reason": "turn-done"}
            ),
        ]
        events += self._notify(rec, "done", output=result.output)
        await self._commit(events)

    async def _after_turn_failure(
        self,
        rec: Record,
        turn: int,
        error: str,
        usage: Mapping[str, Any] | None,
        events: list[NewEvent],
    ) -> int | None:
        """Write the failed turn and what the policy makes of it; start a retry if it says so.

        Returns the retry's turn number, or None. Call with the mutex held.
        """
        agent_id = rec["id"]
        spec = AgentSpec.model_validate(rec["spec"])
        failures = rec["consecutiveFailures"] + 1
        events = [
            *events,
            NewEvent(
                ev.TURN_FAILED,
                agent_id,
                {
                    "turn": turn,
                    "error": error,
                    "consecutiveFailures": failures,
                    "usage": dict(usage) if usage else None,
                },
            ),
        ]
        after = {**rec, "consecutiveFailures": failures}
        after["usage"] = _usage_after(rec["usage"], usage)
        decision = after_failure(after, spec, failures)
        if decision.action == "retry":
            exhausted = self._budget_exhausted(after)
            if exhausted is not None:
                await self._commit(events + self._budget_hold(after, exhausted))
                return None
            next_turn = turn + 1
            events.append(
                self._turn_started(agent_id, next_turn, rec["lastPrompt"], retry=True, notices=[])
            )
            await self._commit(events)
            self._launch(agent_id, next_turn, self._resend_text(rec))
            return next_turn
        if decision.action == "hold":
            assert decision.reason is not None
            events += self._hold(after, decision.reason, error)
        else:
            events.append(
                NewEvent(
                    ev.STATE_CHANGED,
                    agent_id,
                    {"from": "running", "to": "failed", "reason": "turn-failed", "error": error},
                )
            )
            events += self._notify(after, "failed", error=error)
            # An ended agent reads no more notices: the ones waiting for it are dropped.
            pending = [n["id"] for n in self._pending_notices(agent_id)]
            if pending:
                events.append(NewEvent(ev.NOTICES_DROPPED, agent_id, {"ids": pending}))
        await self._commit(events)
        return None

    # --- event building ---------------------------------------------------------------------

    def _turn_started(
        self, agent_id: str, turn: int, prompt: str, *, retry: bool, notices: list[int]
    ) -> NewEvent:
        return NewEvent(
            ev.TURN_STARTED,
            agent_id,
            {"turn": turn, "prompt": prompt, "retry": retry, "notices": notices},
        )

    def _hold(self, rec: Record, reason: str, error: str | None, **extra: Any) -> list[NewEvent]:
        """Hold the agent in blocked: state change, supervision needed, notice to the parent."""
        agent_id = rec["id"]
        events = [
            NewEvent(
                ev.STATE_CHANGED,
                agent_id,
                {"from": rec["state"], "to": "blocked", "reason": reason, "error": error, **extra},
            ),
            NewEvent(ev.SUPERVISION_NEEDED, agent_id, {"reason": reason, "error": error, **extra}),
        ]
        if rec["parent"] is not None:
            events.append(self._notice(rec, "supervision", reason=reason, error=error))
        return events

    def _budget_hold(self, rec: Record, exhausted: BudgetExhaustedError) -> list[NewEvent]:
        """Events holding the agent because its budget leaves no room for a turn."""
        return self._hold(rec, BUDGET_EXHAUSTED, exhausted.message, dimension=exhausted.dimension)

    def _budget_exhausted(self, rec: Record) -> BudgetExhaustedError | None:
        """Why the agent's budget leaves no room for another turn, or None if it does."""
        budget = AgentSpec.model_validate(rec["spec"]).budget.to_budget()
        if budget.unlimited:
            return None
        used = rec["usage"]
        # Age is measured from the agent's creation, across restarts, which a fresh tracker's
        # monotonic start cannot know: the tracker gets the budget without its deadline.
        tracker = ExecutionTracker(dataclasses.replace(budget, deadline_s=None), clock=self.clock)
        try:
            tracker.record(
                tokens=used["tokens"], cost_usd=float(used["costUsd"]), turns=used["turns"]
            )
            tracker.check()
        except BudgetExhaustedError as exc:
            return exc
        unpriced = used.get("unpricedTurns", 0)
        if budget.max_cost_usd is not None and unpriced:
            # Unknown spending cannot be held to a dollar limit: stop rather than guess.
            unknown = BudgetExhaustedError("cost_usd", budget.max_cost_usd, used["costUsd"])
            unknown.message = (
                f"cost_usd budget of {budget.max_cost_usd:g} cannot be enforced: the cost of "
                f"{unpriced} turn(s) is unknown (give the model's price)"
            )
            unknown.args = (unknown.message,)
            return unknown
        if budget.deadline_s is not None:
            elapsed = self._age_s(rec)
            if elapsed >= budget.deadline_s:
                return BudgetExhaustedError("deadline_s", budget.deadline_s, round(elapsed, 3))
        return None

    def _remaining(self, rec: Record, spec: AgentSpec) -> ExecutionBudget:
        budget = spec.budget.to_budget()
        used = rec["usage"]
        return ExecutionBudget(
            max_tokens=None
            if budget.max_tokens is None
            else max(0, budget.max_tokens - used["tokens"]),
            max_cost_usd=None
            if budget.max_cost_usd is None
            else max(0.0, budget.max_cost_usd - used["costUsd"]),
            max_turns=None,
            deadline_s=None
            if budget.deadline_s is None
            else max(0.0, budget.deadline_s - self._age_s(rec)),
        )

    def _age_s(self, rec: Record) -> float:
        return (self.clock.now() - datetime.fromisoformat(rec["createdAt"])).total_seconds()

    def _notify(
        self, rec: Record, kind: str, *, output: str | None = None, error: str | None = None
    ) -> list[NewEvent]:
        if rec["parent"] is None or kind not in rec["spec"].get("notifyOn", []):
            return []
        extra: dict[str, Any] = {}
        if output is not None:
            extra["output"] = output[:_OUTPUT_IN_NOTICE]
        return [self._notice(rec, kind, error=error, **extra)]

    def _notice(self, rec: Record, kind: str, **fields: Any) -> NewEvent:
        parent = self.store.state.agents[rec["parent"]]
        state = "dropped" if parent["state"] in ENDED_STATES else "pending"
        return NewEvent(
            ev.NOTICE,
            rec["parent"],
            {
                "to": rec["parent"],
                "from": rec["id"],
                "fromName": rec["name"],
                "kind": kind,
                "state": state,
                **fields,
            },
        )

    def _resend_text(self, rec: Record) -> str:
        """What a retry sends: the failed turn's prompt with the notices it carried."""
        notices = self.store.state.notices
        carried = [notices[i] for i in rec.get("lastNotices", []) if i in notices]
        return _with_notices(rec["lastPrompt"], carried)

    def _pending_notices(self, agent_id: str) -> list[Record]:
        return sorted(
            (
                n
                for n in self.store.state.notices.values()
                if n["to"] == agent_id and n["state"] == "pending"
            ),
            key=lambda n: n["id"],
        )

    async def record_gateway_freeze(self, target: str, freeze: Record) -> None:
        """Log that the gateway froze an agent in database ``target`` (``freeze`` as JSON:
        ``agentId``, ``reason``, evidence...). When the agent is one of this daemon's and has
        a parent, the parent's inbox gets a ``gateway_frozen`` notice. The freeze itself is
        the gateway's (its journal); this only tells watchers."""
        async with self._mutex:
            agent_id = freeze["agentId"]
            data = {"target": target, **freeze}
            events = [NewEvent(ev.GATEWAY_FROZEN, agent_id, data)]
            rec = self.store.state.agents.get(agent_id)
            if rec is not None and rec["parent"] is not None:
                events.append(
                    self._notice(rec, "gateway_frozen", target=target, reason=freeze.get("reason"))
                )
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
        self, target: str, agent_id: str, freeze: Record | None, reinstatement: Record
    ) -> None:
        """Log a person's reinstatement of ``agent_id`` in database ``target`` as a resolved
        decision (kind ``gateway_frozen``, action ``reinstate``, with ``by`` and ``why``)."""
        async with self._mutex:
            data = {
                "kind": "gateway_frozen",
                "agentId": agent_id,
                "target": target,
                "reason": None if freeze is None else freeze.get("reason"),
                "freezeId": reinstatement.get("freezeId"),
                "action": "reinstate",
                "by": reinstatement["by"],
                "why": reinstatement["reason"],
            }
            await self._commit([NewEvent(ev.DECISION_RESOLVED, agent_id, data)])

    def _resolution(self, rec: Record, action: str, by: str | None, why: str | None) -> NewEvent:
        return NewEvent(
            ev.DECISION_RESOLVED,
            rec["id"],
            {
                "kind": "agent_blocked",
                "agentId": rec["id"],
                "reason": rec["reason"],
                "error": rec["error"],
                "action": action,
                "by": by,
                "why": why,
            },
        )

    # --- idempotency and writing ------------------------------------------------------------

    def _replay_command(self, key: str | None, command: dict[str, Any]) -> CommandResult | None:
        if key is None:
            return None
        v.non_empty_str("command", "idempotencyKey", key)
        stored = self.store.state.commands.get(key)
        if stored is None:
            return None
        if stored["fingerprint"] != _fingerprint(command):
            raise IdempotencyConflictError(key, _describe(stored["command"]), _describe(command))
        return CommandResult(stored["status"], stored["response"], replayed=True)

    async def _commit(
        self,
        events: Sequence[NewEvent],
        key: str | None = None,
        command: dict[str, Any] | None = None,
        result: CommandResult | None = None,
    ) -> list[Event]:
        events = list(events)
        if key is not None and command is not None and result is not None:
            events.append(
                NewEvent(
                    ev.COMMAND_RECORDED,
                    None,
                    {
                        "key": key,
                        "fingerprint": _fingerprint(command),
                        "command": command,
                        "status": result.status,
                        "response": result.body,
                    },
                )
            )
        written = await self.store.append(events)
        self._publish(written)
        return written

    def _publish(self, events: list[Event]) -> None:
        for event in events:
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
            for sub in list(self._subscribers):
                if sub.agent_id is not None and sub.agent_id != event.agent_id:
                    continue
                try:
                    sub.queue.put_nowait(event)
                except asyncio.QueueFull:
                    sub.overflowed = True

    def _wake(self, sub: _Subscriber) -> None:
        # Unblocks a subscriber waiting on an empty queue so it sees ``overflowed``.
        if sub.queue.empty():
            sub.queue.put_nowait(Event(0, "", "", None, {}))

    # --- helpers ----------------------------------------------------------------------------

    def _refuse_if_closed(self, command: str) -> None:
        # A command that waited for the lock while close() ran must not start work that
        # nothing would run: the caller retries against the next daemon.
        if self._closed:
            raise ServiceClosedError(command)

    def _live(self, agent_id: str) -> Record:
        rec = self.store.state.agents.get(agent_id)
        if rec is None:
            raise AgentNotFoundError(agent_id)
        if rec["state"] in ENDED_STATES:
            raise AgentNotLiveError(agent_id, rec["state"])
        return rec

    def _max_agents(self, run_id: str, spec: AgentSpec) -> int:
        if spec.parent is None:
            return spec.spawn_budget.max_agents if spec.spawn_budget else 50
        for rec in self.store.state.agents.values():
            if rec["runId"] == run_id and rec["parent"] is None:
                budget = rec["spec"].get("spawnBudget") or {}
                return int(budget.get("maxAgents", 50))
        return 50

    def _new_agent_id(self) -> str:
        while True:
            candidate = "a_" + secrets.token_hex(4)
            if candidate not in self.store.state.agents:
                return candidate

    def _workdir(self, agent_id: str) -> Path:
        return self.home / "agents" / agent_id / "work"

    def _state_dir(self, agent_id: str) -> Path:
        return self.home / "agents" / agent_id / "state"

    def _agent_env(self, rec: Record) -> dict[str, str]:
        env = {
            "CORRAL_AGENT_ID": rec["id"],
            "CORRAL_AGENT_NAME": rec["name"],
            "CORRAL_RUN_ID": rec["runId"],
            "CORRAL_URL": self.url,
        }
        if rec["parent"] is not None:
            env["CORRAL_PARENT_ID"] = rec["parent"]
        if self._token is not None:
            env["CORRAL_TOKEN"] = agent_token(self._token, rec["id"])
        return env


def _usage_after(old: Record, usage: Mapping[str, Any] | None) -> Record:
    """The agent's usage once a turn that spent ``usage`` is counted (as the reducer does)."""
    rec: Record = {"usage": old}
    add_usage(rec, dict(usage) if usage else {"tokens": 0})
    result: Record = rec["usage"]
    return result


def _with_notices(prompt: str, notices: list[Record]) -> str:
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


def _public(rec: Record) -> Record:
    return dict(rec)


def _fingerprint(command: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(command, sort_keys=True).encode()).hexdigest()


def _describe(command: dict[str, Any]) -> str:
    name = command.get("command", "?")
    agent = command.get("agent")
    return f"{name} of agent {agent!r}" if agent else f"{name}"
