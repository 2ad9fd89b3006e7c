"""Where issue 12's features meet, fuzzed: a hypothesis state machine over an in-process
:class:`AgentService` (SQLite store, fake clock, a harness whose turns the test ends).

Its rules spawn agents (a random live parent, priority, budget, a root's spawnBudget,
wake, history, heartbeatS, onPreempt), prompt, stop, stop runs, answer decisions, change
budgets, end turns (success or failure, with usage), move the clock (stalls) and restart
the service on the same store. After every step: nothing but typed ``CorralError`` reached a
caller and nothing failed in the daemon's own tasks; a run's active agents are within its
cap; a tree spends no more than its root's budget (the most it ever was) plus one turn per
agent; replaying the log gives the projections; each agent's state is consistent (a turn task
iff a turn in flight, no turn started while paused, no stall of a turn still queued for a
slot, ended agents with nothing pending, no idle ``wake`` agent left with pending notices);
sessions stay within their bounds and ``run`` sessions of ended runs are gone.

``make test`` runs ``CORRAL_FUZZ_EXAMPLES`` (default 30) examples of up to
``CORRAL_FUZZ_STEPS`` (default 25) steps; ``make fuzz-teams`` many more.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from corral.daemon import (
    AgentService,
    SQLiteStore,
    TurnFailedError,
    TurnRequest,
    TurnResult,
    _sessions,
    _state,
    _tree_budget,
)
from corral.daemon import _events as ev
from corral.daemon._metrics import Metrics
from corral.daemon._state import ENDED_STATES, LIVE_STATES
from corral.kernel import CorralError
from corral.runtime import FakeClock
from tests.support.polling import idle

EXAMPLES = int(os.environ.get("CORRAL_FUZZ_EXAMPLES", "30"))
STEPS = int(os.environ.get("CORRAL_FUZZ_STEPS", "25"))
MAX_TURN_TOKENS = 40  # what one turn of the fake harness spends at most
DEFAULT_CAP = 50  # a run's headcount cap without a spawnBudget


class GatedHarness:
    """Each turn waits in :attr:`turns` until the test ends it (:meth:`finish`) or it is
    cancelled; it notes every turn that reached it, and those that did while paused."""

    def __init__(self) -> None:
        self.turns: dict[str, tuple[int, asyncio.Future[TurnResult]]] = {}
        self.reached: set[tuple[str, int]] = set()
        self.started_paused: list[tuple[str, int]] = []
        self.service: AgentService | None = None

    async def run_turn(self, request: TurnRequest) -> TurnResult:
        agent_id = request.agent_id
        self.reached.add((agent_id, request.turn))
        if self.service is not None:
            rec = self.service.store.state.agents.get(agent_id)
            if rec is not None and rec["state"] == "paused":
                self.started_paused.append((agent_id, request.turn))
        future: asyncio.Future[TurnResult] = asyncio.get_running_loop().create_future()
        self.turns[agent_id] = (request.turn, future)
        try:
            return await future
        finally:
            if self.turns.get(agent_id, (0, None))[1] is future:
                del self.turns[agent_id]

    def finish(self, agent_id: str, ok: bool, tokens: int) -> None:
        _, future = self.turns.pop(agent_id)
        if ok:
            future.set_result(TurnResult(output=f"done {tokens}", tokens=tokens, cost_usd=0.0))
        else:
            usage = {"tokens": tokens, "costUsd": 0.0}
            future.set_exception(TurnFailedError("boom", usage=usage))

    async def reap(self, agent_id: str, state_dir: Path) -> bool:
        return False


class TermHarness(GatedHarness):
    """A :class:`GatedHarness` whose turns can be asked to end (a graceful stop)."""

    def __init__(self) -> None:
        super().__init__()
        # What a turn asked to end (SIGTERM) does: traps it (goes on), dies (fails) or
        # ends well at once (its success must be dropped: the agent is stopped).
        self.on_term = "trap"

    async def terminate(self, agent_id: str, state_dir: Path) -> bool:
        found = self.turns.get(agent_id)
        if found is None:
            return False
        if self.on_term != "trap":
            self.finish(agent_id, self.on_term == "succeed", 1)
        return True


class _Errors(logging.Handler):
    """Every ERROR the daemon logs: a task of its own failed."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append(self.format(record))


def pick(items: list[Any], index: int) -> Any:
    return items[index % len(items)]


class Teams(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.dir = Path(tempfile.mkdtemp(prefix="corral-teams-"))
        self.clock = FakeClock()
        self.harness = TermHarness()
        self.limit: int | None = None
        self.metrics: Metrics | None = None
        self.opened_at = 0  # the last seq before the service (and its metrics) started
        self.store: SQLiteStore | None = None
        self.service: AgentService | None = None
        self.names = 0
        self.made: list[str] = []  # agent ids, in the order they were made
        # The most each root's budget ever allowed (None: unlimited once), by dimension.
        self.most: dict[str, dict[str, float | None]] = {}
        self.errors = _Errors()
        logging.getLogger("corral").addHandler(self.errors)

    # --- plumbing ---------------------------------------------------------------------------

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def call(self, coro: Any) -> Any:
        """A command as a caller gives it: a typed refusal is an answer, anything else a
        bug (it propagates)."""
        try:
            return self.run(coro)
        except CorralError:
            return None

    @property
    def svc(self) -> AgentService:
        assert self.service is not None
        return self.service

    async def _open(self) -> None:
        self.store = SQLiteStore(self.dir / "corral.db")
        await self.store.open()
        self.service = AgentService(
            self.store,
            home=self.dir / "home",
            harnesses={"command": self.harness},
            clock=self.clock,
            max_concurrent_turns=self.limit,
        )
        self.harness.service = self.service
        self.metrics = Metrics.of(self.service)
        self.opened_at = self.store.state.last_seq
        await self.service.start()

    async def _close(self) -> None:
        if self.service is not None:
            await self.service.close()
        if self.store is not None:
            await self.store.close()

    async def _quiesce(self) -> None:
        """Let the daemon's work run until every turn is parked (in the harness, or queued
        for a slot) and no background work is left (bounded in real time)."""
        svc = self.svc
        deadline = time.monotonic() + 5.0
        while True:
            await idle()
            busy = [t for t in (*svc._background, *svc._releases) if not t.done()]
            # Stops in their grace whose turn has ended (or left the harness) finish now;
            # those whose turn traps SIGTERM wait for the clock.
            endings = svc._endings
            busy += [
                t
                for a, t in endings._tasks.items()
                if not t.done()
                and (
                    a not in endings._turns
                    or endings._turns[a].done()
                    or a not in self.harness.turns
                )
            ]
            moving = [
                a
                for a, t in svc._turns.items()
                if not t.done() and a not in self.harness.turns and not svc._slots.waiting(a)
            ]
            if not busy and not moving:
                await idle()
                if not any(not t.done() for t in svc._background):
                    return
            assert time.monotonic() < deadline, f"not settled: {busy} {moving}"
            if busy:
                await asyncio.wait(busy, timeout=0.05)
            else:
                await asyncio.sleep(0.001)

    def live(self) -> list[str]:
        """The live agents in the order they were made (ids are random: never sorted by)."""
        agents = self.svc.store.state.agents
        return [a for a in self.made if a in agents and agents[a]["state"] in LIVE_STATES]

    def ended(self) -> list[str]:
        """The ended agents (not deleted) in the order they were made."""
        agents = self.svc.store.state.agents
        return [a for a in self.made if a in agents and agents[a]["state"] in ENDED_STATES]

    def rank(self, agent_id: str) -> int:
        return self.made.index(agent_id) if agent_id in self.made else len(self.made)

    def teardown(self) -> None:
        try:
            self.run(self._close())
        finally:
            self.loop.close()
            logging.getLogger("corral").removeHandler(self.errors)
            shutil.rmtree(self.dir, ignore_errors=True)

    # --- rules ------------------------------------------------------------------------------

    @initialize(limit=st.sampled_from([None, 1, 2]))
    def start(self, limit: int | None) -> None:
        self.limit = limit
        self.run(self._open())

    @rule(
        parent=st.integers(-2, 50),
        priority=st.sampled_from(["low", "normal", "high", "critical"]),
        tokens=st.none() | st.integers(0, 150),
        turns=st.none() | st.integers(0, 6),
        cap=st.sampled_from([(2, True), (3, True), (1, True), (3, False), None]),
        wake=st.booleans(),
        history=st.sampled_from(["none", "run", "permanent"]),
        heartbeat=st.sampled_from([1.0, 5.0, None]),
        cooldown=st.sampled_from([0.0, 3.0]),
        recovery=st.sampled_from(["restart", "escalate", "eject"]),
        on_preempt=st.sampled_from(["finish", "cancel"]),
        on_failure=st.sampled_from(["fail", "retry", "ask"]),
        prompt=st.booleans(),
        grace=st.sampled_from([0.0, 4.0]),
        reuse=st.none() | st.integers(0, 50),
    )
    def spawn(
        self,
        parent: int,
        priority: str,
        tokens: int | None,
        turns: int | None,
        cap: tuple[int, bool] | None,
        wake: bool,
        history: str,
        heartbeat: float | None,
        cooldown: float,
        recovery: str,
        on_preempt: str,
        on_failure: str,
        prompt: bool,
        grace: float,
        reuse: int | None,
    ) -> None:
        self.names += 1
        name = f"a{self.names}"
        if reuse is not None and self.made:
            name = f"a{reuse % self.names or 1}"  # a name used before, maybe live or deleted
        spec: dict[str, Any] = {
            "name": name,
            "stopGraceS": grace,
            "harness": "command",
            "command": ["worker"],
            "priority": priority,
            "budget": {"maxTokens": tokens, "maxTurns": turns},
            "wake": wake,
            "history": history,
            "onPreempt": on_preempt,
            "onFailure": on_failure,
            "guardrails": [{"match": "deploy", "verdict": "ask", "timeoutS": 60}],
        }
        if prompt:
            spec["prompt"] = "go"
        if heartbeat is not None:
            spec["heartbeatS"] = heartbeat
            spec["recovery"] = {
                "action": recovery,
                "cooldownS": cooldown,
                "maxRetries": 2,
                "escalateAfter": 2,
            }
        live = self.live()
        if parent >= 0 and live:
            spec["parent"] = pick(live, parent)
            spec["notifyOn"] = ["done", "failed", "blocked"]
        elif cap is not None:
            spec["spawnBudget"] = {"maxAgents": cap[0], "allowPreempt": cap[1]}
        made = self.call(self.svc.spawn(spec))
        if made is not None:
            self.made.append(made.body["id"])

    @rule(who=st.integers(0, 50), text=st.none() | st.just("try again"))
    def prompt(self, who: int, text: str | None) -> None:
        if self.live():
            self.call(self.svc.prompt(pick(self.live(), who), text))

    @rule(
        who=st.integers(0, 50),
        dice=st.integers(0, 1),
        now=st.booleans(),
        keep=st.booleans(),
        term=st.sampled_from(["trap", "die", "succeed"]),
    )
    def stop(self, who: int, dice: int, now: bool, keep: bool, term: str) -> None:
        if dice and self.live():
            self.harness.on_term = term
            target = pick(self.live(), who)
            stop = self.svc.stop(target, by="fuzz", why="rule", now=now, keep_children=keep)
            self.call(stop)

    @rule(who=st.integers(0, 50))
    def ask(self, who: int) -> None:
        """The agent asks to act and a rule asks a person (answered by ``answer``)."""
        if self.live():
            self.call(self.svc.check_action(pick(self.live(), who), "deploy", {"n": who}))

    @rule(who=st.integers(0, 50), key=st.none() | st.sampled_from(["k1", "k2"]))
    def restart_agent(self, who: int, key: str | None) -> None:
        if self.ended():
            target = pick(self.ended(), who)
            self.call(self.svc.restart(target, by="fuzz", why="rule", idempotency_key=key))

    @rule(who=st.integers(0, 50), key=st.none() | st.sampled_from(["k3", "k4"]))
    def delete(self, who: int, key: str | None) -> None:
        if self.ended():
            target = pick(self.ended(), who)
            self.call(self.svc.delete(target, by="fuzz", why="rule", idempotency_key=key))

    @rule(
        who=st.integers(0, 50),
        notify=st.sampled_from([None, ["done"], ["done", "failed", "blocked"]]),
        tokens=st.none() | st.integers(0, 400),
        budget=st.booleans(),
    )
    def patch(self, who: int, notify: list[str] | None, tokens: int | None, budget: bool) -> None:
        if not self.live():
            return
        changes: dict[str, Any] = {"notifyOn": notify}
        if budget:
            changes["budget"] = {"maxTokens": tokens}
        self.call(self.svc.patch(pick(self.live(), who), changes, by="fuzz"))

    @rule(who=st.integers(0, 50), dice=st.integers(0, 1))
    def stop_run(self, who: int, dice: int) -> None:
        if not dice or not self.live():
            return
        run_id = self.svc.store.state.agents[pick(self.live(), who)]["runId"]
        self.call(self.svc.stop_run(run_id, by="fuzz", why="rule"))

    @rule(which=st.integers(0, 50), answer=st.integers(0, 3), tokens=st.integers(0, 400))
    def answer(self, which: int, answer: int, tokens: int) -> None:
        pending = sorted(self.svc.decisions(), key=lambda d: (self.rank(d["agentId"]), d["kind"]))
        if not pending:
            return
        found = pick(pending, which)
        answers = found.get("answers") or ["stop"]
        chosen = pick(answers, answer)
        budget = {"maxTokens": tokens, "maxTurns": None} if chosen == "budget" else None
        self.call(self.svc.answer(found["id"], chosen, by="fuzz", budget=budget))

    @rule(
        who=st.integers(0, 50),
        tokens=st.none() | st.integers(0, 400),
        turns=st.none() | st.integers(0, 8),
    )
    def change_budget(self, who: int, tokens: int | None, turns: int | None) -> None:
        changes = {"maxTokens": tokens, "maxTurns": turns}
        if not self.live():
            return
        self.call(self.svc.change_budget(pick(self.live(), who), changes, by="fuzz"))

    @rule(which=st.integers(0, 50), ok=st.booleans(), tokens=st.integers(0, MAX_TURN_TOKENS))
    def end_turn(self, which: int, ok: bool, tokens: int) -> None:
        if self.harness.turns:
            turns = sorted(self.harness.turns, key=self.rank)
            self.harness.finish(pick(turns, which), ok, tokens)

    @rule(seconds=st.sampled_from([2.0, 0.5, 6.0, 30.0]))
    def advance(self, seconds: float) -> None:
        async def advance() -> None:
            # On the loop: the timers it fires (stalls) start the service's tasks.
            self.clock.advance(seconds)

        self.run(advance())

    @rule(dice=st.integers(0, 3))
    def restart(self, dice: int) -> None:
        if dice < 3:
            return  # one draw in four: a restart ends every turn in flight
        self.run(self._close())
        self.run(self._open())

    # --- invariants ---------------------------------------------------------------------------

    @invariant()
    def consistent(self) -> None:
        if self.service is None:
            return
        self.run(self._quiesce())
        assert not self.errors.seen, self.errors.seen
        state = self.svc.store.state
        self._headcount(state)
        self._tree_spend(state)
        self._agents(state)
        self._sessions(state)
        self._lifecycle(state)
        self.run(self._replays(state))

    def _headcount(self, state: _state.State) -> None:
        runs: dict[str, list[Any]] = {}
        for rec in state.agents.values():
            runs.setdefault(rec["runId"], []).append(rec)
        for run_id, members in runs.items():
            root = next(r for r in members if r["parent"] is None)
            cap = (root["spec"].get("spawnBudget") or {}).get("maxAgents", DEFAULT_CAP)
            active = [r["id"] for r in members if r["state"] in LIVE_STATES - {"paused"}]
            assert len(active) <= cap, f"run {run_id}: {len(active)} active, cap {cap}"
        if self.limit is not None:
            assert self.svc._slots.running <= self.limit
            assert len(self.harness.turns) <= self.limit

    def _tree_spend(self, state: _state.State) -> None:
        for rec in state.agents.values():
            if rec["parent"] is not None:
                continue
            budget = _tree_budget.budget_of(rec)
            most = self.most.setdefault(rec["id"], {"tokens": 0, "turns": 0})
            for key, now in (("tokens", budget.max_tokens), ("turns", budget.max_turns)):
                seen = most[key]
                most[key] = None if seen is None or now is None else max(seen, now)
            tree = [a for a in state.agents.values() if a["runId"] == rec["runId"]]
            used = _tree_budget.tree_usage(rec)
            if most["tokens"] is not None:
                bound = most["tokens"] + len(tree) * MAX_TURN_TOKENS
                assert used["tokens"] <= bound, f"tree {rec['id']} spent {used}, bound {bound}"
            if most["turns"] is not None:
                assert used["turns"] <= most["turns"] + len(tree), f"tree {rec['id']}: {used}"

    def _agents(self, state: _state.State) -> None:
        svc = self.svc
        assert not self.harness.started_paused, self.harness.started_paused
        pending_notices = {n["to"] for n in state.notices.values() if n["state"] == "pending"}
        pending_decisions = {
            d["agentId"] for d in state.decisions.values() if d["state"] == "pending"
        }
        for agent_id, rec in state.agents.items():
            task = svc._turns.get(agent_id)
            has_task = task is not None and not task.done()
            assert has_task == (rec["turnInFlight"] is not None), (agent_id, rec["state"])
            if rec["state"] in ENDED_STATES:
                assert agent_id not in pending_notices, agent_id
                assert agent_id not in pending_decisions, agent_id
            if rec["state"] == "blocked":
                found = state.decisions.get(rec.get("decision") or "")
                assert found is not None, agent_id
                assert found["state"] == "pending", agent_id
            if rec["state"] == "idle" and rec["spec"].get("wake"):
                assert agent_id not in pending_notices, f"{agent_id} idle, not woken"
            if rec["state"] in ("idle", "blocked"):
                assert rec["turnInFlight"] is None, agent_id
            if rec["state"] == "waiting":
                found = state.decisions.get(rec.get("decision") or "")
                assert found is not None, agent_id
                assert found["state"] == "pending", (agent_id, "waits on nothing")

    def _lifecycle(self, state: _state.State) -> None:
        """No live agent under a deleted parent, children lists agree with parents, names
        unique among the live agents of a run, a stop in its grace only for a stopped
        agent."""
        live_names: dict[tuple[str, str], str] = {}
        for agent_id, rec in state.agents.items():
            parent = rec["parent"]
            if parent is not None:
                assert parent in state.agents, f"{agent_id}: its parent {parent} is gone"
                assert agent_id in state.agents[parent]["children"], agent_id
            for child in rec["children"]:
                assert child in state.agents, f"{agent_id}: child {child} is gone"
            if rec["state"] in LIVE_STATES:
                key = (rec["runId"], rec["name"])
                assert key not in live_names, f"name {key} held by {live_names.get(key)} too"
                live_names[key] = agent_id
        for agent_id in self.svc._endings._tasks:
            ending = state.agents.get(agent_id)
            assert ending is not None, agent_id
            assert ending["state"] == "stopped", (agent_id, ending)
        for agent_id in self.made:
            if agent_id not in state.agents:
                assert agent_id not in self.harness.turns, f"deleted {agent_id} still runs"

    def _sessions(self, state: _state.State) -> None:
        for agent_id, messages in state.sessions.items():
            rec = state.agents[agent_id]
            assert _sessions.history_of(rec) != "none", agent_id
            assert len(messages) <= _sessions.MAX_MESSAGES
            assert sum(_sessions.size(m) for m in messages) <= _sessions.MAX_SESSION_CHARS
        runs: dict[str, list[Any]] = {}
        for rec in state.agents.values():
            runs.setdefault(rec["runId"], []).append(rec)
        for members in runs.values():
            if all(r["state"] in ENDED_STATES for r in members):
                kept = [r["id"] for r in members if _sessions.history_of(r) == "run"]
                assert not [a for a in kept if a in state.sessions], kept

    async def _replays(self, state: _state.State) -> None:
        store = self.svc.store
        events = []
        after = 0
        while page := await store.read(after, limit=1000):
            events += page
            after = page[-1].seq
        assert _state.replay(events).snapshot() == state.snapshot()
        # Each state change starts from the state the agent was in. A turn queued for a slot
        # is not watched: only turns that reached the harness stall.
        states: dict[str, str] = {}
        for event in events:
            if event.type == ev.AGENT_CREATED:
                states[event.data["agent"]["id"]] = event.data["agent"]["state"]
            elif event.type == ev.STATE_CHANGED and event.agent_id is not None:
                was = states.get(event.agent_id)
                assert event.data.get("from", was) == was, (event.seq, event.data, was)
                states[event.agent_id] = event.data["to"]
            if event.type == ev.TURN_STALLED:
                turn = (event.agent_id, event.data["turn"])
                assert turn in self.harness.reached, f"stall of a turn never started: {turn}"
        await self._turns_once(state, events)

    async def _turns_once(self, state: _state.State, events: list[ev.Event]) -> None:
        """Every turn started once, with numbers going up, and ended once (a turn cut short
        by a daemon restart is interrupted, then counted failed, right after) or is in
        flight; each record agrees with the events (deleted agents have none); the metrics
        count each ending once."""
        last: dict[str, int] = {}
        ended: dict[tuple[str, int], str] = {}
        started: set[tuple[str, int]] = set()
        deleted: set[str] = set()
        previous: ev.Event | None = None
        counted = 0
        for event in events:
            agent_id = event.agent_id
            if agent_id is None:
                previous = event
                continue
            turn = event.data.get("turn")
            if not isinstance(turn, int):
                previous = event
                continue
            if event.type == ev.TURN_STARTED:
                assert turn > last.get(agent_id, 0), (event.seq, turn, last.get(agent_id))
                last[agent_id] = turn
                started.add((agent_id, turn))
            elif event.type in (ev.TURN_COMPLETED, ev.TURN_FAILED, ev.TURN_INTERRUPTED):
                key = (agent_id, turn)
                assert key in started, f"{event.seq}: {key} ended, never started"
                if key in ended:
                    again = (
                        event.type == ev.TURN_FAILED
                        and previous is not None
                        and previous.type == ev.TURN_INTERRUPTED
                        and previous.agent_id == agent_id
                        and previous.data.get("turn") == turn
                    )
                    assert again, f"{event.seq}: {key} ended twice ({ended[key]}, {event.type})"
                else:
                    ended[key] = event.type
                    if event.seq > self.opened_at:
                        counted += 1
            elif event.type == ev.AGENT_DELETED:
                deleted.add(agent_id)
            previous = event
        for key in started - set(ended):
            rec = state.agents.get(key[0])
            assert rec is not None, f"{key} never ended"
            assert rec["turnInFlight"] == key[1], f"{key} never ended"
        assert self.metrics is not None
        samples = [s for m in self.metrics.turns.collect() for s in m.samples]
        turns = sum(s.value for s in samples if s.name.endswith("_total"))
        assert turns == counted, f"metrics count {turns} turns ended, the log {counted}"
        table = self.svc.turn_book.table
        for agent_id in deleted:
            assert not await table.list_turns(agent_id), f"deleted {agent_id} keeps turns"
        outcome = {
            ev.TURN_COMPLETED: "succeeded",
            ev.TURN_FAILED: "failed",
            ev.TURN_INTERRUPTED: "interrupted",
        }
        for agent_id in state.agents:
            records = {r["turn"]: r for r in await table.list_turns(agent_id, limit=1000)}
            mine = sorted(t for a, t in started if a == agent_id)
            assert sorted(records) == mine, (agent_id, sorted(records), mine)
            for turn, record in records.items():
                want = outcome.get(ended.get((agent_id, turn), ""), "running")
                assert record["outcome"] == want, (agent_id, turn, record, want)


@pytest.mark.timeout(0)
def test_teams_hold_their_limits_whatever_happens() -> None:
    run_state_machine_as_test(
        Teams,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
