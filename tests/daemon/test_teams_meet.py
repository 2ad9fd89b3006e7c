"""Where issue 12's features meet, one rule each, in process on a fake clock: paused agents
and stops, restarts, concurrent-turn slots, stalls and wakes; run stops; wakes held by an
ancestor's budget. (test_teams_stateful.py fuzzes them all together.)"""

from __future__ import annotations

import asyncio
from typing import Any

from corral.daemon import AgentService, SQLiteStore
from corral.daemon import _events as ev
from corral.runtime import FakeClock
from tests.daemon.conftest import MakeService, OpenSQLite
from tests.daemon.test_teams_stateful import GatedHarness
from tests.support.polling import idle, settle


class Team:
    """A service over a gated harness (each turn waits for :meth:`end`) and a fake clock."""

    def __init__(self, make_service: MakeService, store: SQLiteStore, **options: Any) -> None:
        self.make_service = make_service
        self.store = store
        self.options = options
        self.clock = FakeClock()
        self.harness = GatedHarness()
        self.service: AgentService | None = None
        self.root = ""

    async def start(self, store: SQLiteStore | None = None) -> AgentService:
        self.service = await self.make_service(
            store or self.store,
            harness=self.harness,
            clock=self.clock,
            **self.options,
        )
        self.harness.service = self.service
        return self.service

    @property
    def svc(self) -> AgentService:
        assert self.service is not None
        return self.service

    async def spawn(self, name: str, **spec: Any) -> str:
        spec = {"name": name, "harness": "command", "command": ["worker"], **spec}
        if self.root and "parent" not in spec:
            spec["parent"] = self.root
        agent_id = str((await self.svc.spawn(spec)).body["id"])
        if not self.root:
            self.root = agent_id
        await idle()
        return agent_id

    def state(self, agent_id: str) -> str:
        return str(self.svc.get(agent_id)["state"])

    async def in_harness(self, agent_id: str) -> None:
        await settle(lambda: agent_id in self.harness.turns)

    async def end(self, agent_id: str, *, ok: bool = True, tokens: int = 0) -> None:
        await self.in_harness(agent_id)
        self.harness.finish(agent_id, ok, tokens)
        await settle(lambda: not self.svc._turns.get(agent_id) or agent_id in self.harness.turns)
        await self.quiet()

    async def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        await self.quiet()

    async def quiet(self) -> None:
        await idle()
        while self.svc._background:
            await asyncio.wait(set(self.svc._background))
        await idle()

    async def events(self, agent_id: str, *types: str) -> list[dict[str, Any]]:
        found = await self.svc.events(agent_id=agent_id)
        return [{"type": e.type, **e.data} for e in found if not types or e.type in types]


async def test_stopping_a_paused_agent_answers_the_hold_it_resumes_to(
    make_service: MakeService, sqlite_store: SQLiteStore
) -> None:
    team = Team(make_service, sqlite_store)
    await team.start()
    await team.spawn("root", spawnBudget={"maxAgents": 2, "allowPreempt": True})
    worker = await team.spawn("w", priority="low", prompt="go", onFailure="ask")
    await team.in_harness(worker)
    await team.spawn("boss", priority="high")
    assert team.state(worker) == "paused"
    await team.end(worker, ok=False)  # its finishing turn fails: it resumes to a hold
    rec = team.svc.get(worker)
    assert rec["resumeTo"] == "blocked"
    decision = rec["decision"]
    assert team.svc.decision(decision)["state"] == "pending"
    await team.svc.stop_run(rec["runId"], by="ops", why="done")
    found = team.svc.decision(decision)
    assert (found["state"], found["answer"], found["by"]) == ("resolved", "stop", "ops")
    assert team.svc.decisions() == []


async def test_a_restart_settles_each_turn_as_earlier_settlements_left_its_agent(
    make_service: MakeService, open_sqlite: OpenSQLite
) -> None:
    team = Team(make_service, await open_sqlite())
    service = await team.start()
    await team.spawn("root", spawnBudget={"maxAgents": 3, "allowPreempt": True})
    first = await team.spawn("first", priority="low", prompt="go")
    paused = await team.spawn("paused", priority="low", prompt="go")
    await team.spawn("boss", priority="high")
    assert team.state(paused) == "paused"
    await service.close()
    # The restart fails first's turn (it ends: headcount frees), which resumes paused, whose
    # own turn from the last daemon is then settled as a running agent's, not a paused one's.
    service = await team.start(await open_sqlite())
    assert team.state(first) == "failed"
    assert team.state(paused) == "failed"
    changes = await team.events(paused, ev.STATE_CHANGED)
    assert [(c["from"], c["to"]) for c in changes] == [
        ("running", "paused"),
        ("paused", "running"),
        ("running", "failed"),
    ]


async def test_a_turn_queued_for_a_slot_does_not_start_while_its_agent_is_paused(
    make_service: MakeService, sqlite_store: SQLiteStore
) -> None:
    team = Team(make_service, sqlite_store, max_concurrent_turns=1)
    await team.start()
    await team.spawn("root", spawnBudget={"maxAgents": 2, "allowPreempt": True}, prompt="go")
    await team.in_harness(team.root)
    queued = await team.spawn("queued", priority="low", prompt="go")  # onPreempt finish
    assert team.svc.get(queued)["queued"] is True
    boss = await team.spawn("boss", priority="high")
    assert team.state(queued) == "paused"
    assert team.svc.get(queued)["resumeTo"] == "turn"  # never started: it runs on resume
    await team.end(team.root)  # the slot frees: nobody paused may take it
    assert team.harness.started_paused == []
    assert queued not in team.harness.turns
    await team.svc.stop(boss)  # headcount frees: it resumes and its turn runs
    await team.in_harness(queued)
    assert team.state(queued) == "running"
    assert team.harness.started_paused == []


async def test_a_turn_waiting_for_a_slot_is_not_stalled(
    make_service: MakeService, sqlite_store: SQLiteStore
) -> None:
    team = Team(make_service, sqlite_store, max_concurrent_turns=1)
    await team.start()
    await team.spawn("root", prompt="go")
    waiting = await team.spawn("waiting", prompt="go", heartbeatS=1.0)
    await team.advance(30.0)  # the root's turn holds the only slot all along
    assert await team.events(waiting, ev.TURN_STALLED) == []
    await team.end(team.root)
    await team.in_harness(waiting)
    await team.advance(1.0)  # its silence starts with its turn
    stalls = await team.events(waiting, ev.TURN_STALLED)
    assert [s["turn"] for s in stalls] == [1]


async def test_a_paused_agent_s_stalled_turn_is_recovered_and_restarts_on_resume(
    make_service: MakeService, sqlite_store: SQLiteStore
) -> None:
    team = Team(make_service, sqlite_store)
    await team.start()
    await team.spawn("root", spawnBudget={"maxAgents": 2, "allowPreempt": True})
    worker = await team.spawn("w", priority="low", prompt="go", heartbeatS=1.0)
    await team.in_harness(worker)
    boss = await team.spawn("boss", priority="high")
    assert team.state(worker) == "paused"  # onPreempt finish: its turn goes on, silent
    await team.advance(1.0)
    rec = team.svc.get(worker)
    assert (rec["state"], rec["resumeTo"], rec["turnInFlight"]) == ("paused", "turn", None)
    assert worker not in team.harness.turns  # the stalled turn was cancelled
    recovery = await team.events(worker, "agent.stall_recovery")
    assert [r["action"] for r in recovery] == ["restart"]
    await team.svc.stop(boss)
    await team.in_harness(worker)  # the restart runs once it resumes
    assert (team.state(worker), team.svc.get(worker)["turnInFlight"]) == ("running", 2)
    assert team.harness.started_paused == []


async def test_a_paused_agent_is_not_woken_but_is_on_resume_with_pending_notices(
    make_service: MakeService, sqlite_store: SQLiteStore
) -> None:
    team = Team(make_service, sqlite_store)
    await team.start()
    await team.spawn("root", spawnBudget={"maxAgents": 3, "allowPreempt": True})
    lead = await team.spawn("lead", priority="low", wake=True)
    child = await team.spawn("child", parent=lead, prompt="go", notifyOn=["done"])
    await team.in_harness(child)
    boss = await team.spawn("boss", priority="high")
    assert team.state(lead) == "paused"
    await team.end(child)  # a notice reaches the paused lead: no wake
    assert team.state(lead) == "paused"
    assert lead not in team.harness.turns
    await team.svc.stop(boss)  # it resumes idle, a notice pending: woken
    await team.in_harness(lead)
    assert team.state(lead) == "running"
    assert [c["reason"] for c in await team.events(lead, ev.STATE_CHANGED)][-1] == "woken"


async def test_stopping_a_run_resumes_none_of_its_paused_agents(
    make_service: MakeService, sqlite_store: SQLiteStore
) -> None:
    team = Team(make_service, sqlite_store)
    await team.start()
    await team.spawn("root", spawnBudget={"maxAgents": 2, "allowPreempt": True})
    low = await team.spawn("low", priority="low", prompt="go", onPreempt="cancel")
    await team.in_harness(low)
    await team.spawn("boss", priority="high", prompt="go")
    assert team.state(low) == "paused"
    result = await team.svc.stop_run(team.svc.get(low)["runId"])
    await team.quiet()
    assert team.state(low) == "stopped"
    assert [c["to"] for c in await team.events(low, ev.STATE_CHANGED)] == ["paused", "stopped"]
    assert team.harness.turns == {}
    assert team.svc.store.state.sessions == {}  # history run: the run's end deleted them
    assert len(result.body["stopped"]) == 3


async def test_a_wake_held_by_an_ancestor_s_budget_runs_once_the_ancestor_has_room(
    make_service: MakeService, sqlite_store: SQLiteStore
) -> None:
    team = Team(make_service, sqlite_store)
    await team.start()
    await team.spawn("root", budget={"maxTokens": 1000})
    lead = await team.spawn("lead", wake=True)  # its own budget: the root's 1000
    child = await team.spawn("child", parent=lead, prompt="go", notifyOn=["done"])
    await team.svc.change_budget(team.root, {"maxTokens": 100}, by="ops")
    await team.end(child, tokens=100)  # the tree spends the root's budget; lead is told
    rec = team.svc.get(lead)
    assert (rec["state"], rec["reason"]) == ("blocked", "budget-exhausted")
    assert team.svc.decision(rec["decision"])["ancestor"] == team.root
    assert lead not in team.harness.turns
    await team.svc.change_budget(team.root, {"maxTokens": 500}, by="ops")
    await team.quiet()
    await team.in_harness(lead)  # released, its notice still pending: woken
    assert team.state(lead) == "running"


async def test_a_paused_agent_s_turn_waiting_on_a_person_is_not_stalled(
    make_service: MakeService, sqlite_store: SQLiteStore
) -> None:
    team = Team(make_service, sqlite_store)
    await team.start()
    await team.spawn("root", spawnBudget={"maxAgents": 2, "allowPreempt": True})
    asks = [{"match": "deploy", "verdict": "ask", "timeoutS": 3600}]
    worker = await team.spawn("w", priority="low", prompt="go", heartbeatS=1.0, guardrails=asks)
    await team.in_harness(worker)
    boss = await team.spawn("boss", priority="high")
    assert team.state(worker) == "paused"  # onPreempt finish: its turn goes on...
    verdict = await team.svc.check_action(worker, "deploy")  # ...and asks a person
    assert verdict.decision is not None
    await team.advance(30.0)
    assert await team.events(worker, ev.TURN_STALLED) == []
    assert worker in team.harness.turns
    await team.svc.stop(boss)  # resumed: still waiting on the person
    assert team.state(worker) == "waiting"
    await team.svc.answer(verdict.decision, "approve", by="ops")
    assert team.state(worker) == "running"
    await team.advance(0.5)
    assert await team.events(worker, ev.TURN_STALLED) == []  # the answer is a sign of life
    await team.advance(0.5)
    assert [s["turn"] for s in await team.events(worker, ev.TURN_STALLED)] == [1]


async def test_a_turn_still_waiting_for_a_slot_when_the_daemon_died_runs_after_the_restart(
    make_service: MakeService, open_sqlite: OpenSQLite
) -> None:
    team = Team(make_service, await open_sqlite(), max_concurrent_turns=1)
    service = await team.start()
    busy = await team.spawn("busy", prompt="go", onFailure="fail")
    await team.in_harness(busy)
    waiting = await team.spawn("waiting", parent=busy, prompt="count", onFailure="fail")
    await settle(lambda: team.svc.get(waiting).get("queuedTurn") == 1)
    assert [e["turn"] for e in await team.events(waiting, ev.TURN_QUEUED)] == [1]
    await service.close()

    await team.start(await open_sqlite())
    # The turn that ran was cut short; the one that only waited never started: it runs now
    # (neither counted as failed nor ended by its onFailure "fail").
    assert team.state(busy) == "failed"
    await team.in_harness(waiting)
    assert team.state(waiting) == "running"
    assert await team.events(waiting, ev.TURN_INTERRUPTED, ev.TURN_FAILED) == []
    await team.end(waiting)
    rec = team.svc.get(waiting)
    assert (rec["state"], rec["turns"], rec["consecutiveFailures"]) == ("idle", 1, 0)
    assert "queuedTurn" not in rec


async def test_a_turn_granted_a_slot_after_waiting_says_so(
    make_service: MakeService, sqlite_store: SQLiteStore
) -> None:
    team = Team(make_service, sqlite_store, max_concurrent_turns=1)
    await team.start()
    first = await team.spawn("first", prompt="go")
    await team.in_harness(first)
    second = await team.spawn("second", parent=first, prompt="go")
    await settle(lambda: team.svc.get(second).get("queuedTurn") == 1)
    await team.end(first)
    await team.in_harness(second)
    kinds = [e["type"] for e in await team.events(second, ev.TURN_QUEUED, ev.TURN_GRANTED)]
    assert kinds == [ev.TURN_QUEUED, ev.TURN_GRANTED]
    assert "queuedTurn" not in team.svc.get(second)
    # The first turn had a slot at once: it says nothing of slots.
    assert await team.events(first, ev.TURN_QUEUED, ev.TURN_GRANTED) == []
