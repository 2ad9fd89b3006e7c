"""Stalled turns, in process on a fake clock: the watch (signs of life, one report per
silence, waiting, stop), and each rule of the recovery policy (restart, cooldown, maxRetries,
escalateAfter, eject), recorded as events and surviving a restart of the service."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from corral.daemon import AgentService, InvalidSpecError, SQLiteStore, TurnRequest, TurnResult
from corral.daemon._spec import parse_spec
from corral.daemon._stall import StallWatch, policy_of
from corral.recovery import RecoveryAction
from corral.runtime import FakeClock
from tests.daemon.conftest import MakeService, OpenSQLite
from tests.support.harness import ScriptedHarness
from tests.support.polling import idle, settle

HANG = ("hang",) * 10


async def _service(
    make_service: MakeService, store: SQLiteStore, **options: Any
) -> tuple[AgentService, FakeClock]:
    clock = FakeClock()
    return await make_service(store, clock=clock, **options), clock


async def _agent(service: AgentService, **spec: Any) -> str:
    spec.setdefault("name", "w")
    spec.setdefault("harness", "command")
    spec.setdefault("command", ["worker"])
    spec.setdefault("prompt", "go")
    spec.setdefault("heartbeatS", 1.0)
    return str((await service.spawn(spec)).body["id"])


async def _events(service: AgentService, agent_id: str, *types: str) -> list[dict[str, Any]]:
    return [
        {"type": e.type, **e.data}
        for e in await service.events(agent_id=agent_id)
        if not types or e.type in types
    ]


STALL_EVENTS = ("agent.turn_stalled", "agent.stall_recovery")


async def _advance(clock: FakeClock, seconds: float, service: AgentService) -> None:
    """Move the clock, then wait for the work its timers started (a stall is handled on a
    task of the service's own, committing through the store's thread)."""
    clock.advance(seconds)
    await idle()
    while service._background:
        await asyncio.wait(set(service._background))
    await idle()


async def _running(service: AgentService, harness: ScriptedHarness, agent_id: str, n: int) -> None:
    """Wait until the agent's ``n``-th turn is in the harness."""
    await settle(
        lambda: len(harness.prompts(agent_id)) >= n and agent_id in harness.running,
    )


# --- the watch ------------------------------------------------------------------------------


def test_the_watch_reports_a_silence_once_and_a_beat_starts_a_new_one() -> None:
    clock = FakeClock()
    seen: list[tuple[str, int, float, bool]] = []
    watch = StallWatch(clock, lambda *args: seen.append(args))
    beat = watch.watch("a", 1, 2.0)
    clock.advance(1.5)
    beat()
    clock.advance(1.9)
    assert seen == []  # 1.9 s since the beat
    clock.advance(0.1)
    assert seen == [("a", 1, 2.0, True)]
    assert watch.stalled("a", 1)
    clock.advance(60)
    assert len(seen) == 1  # one report per silence, however long it lasts
    beat()
    assert not watch.stalled("a", 1)
    clock.advance(2)
    assert len(seen) == 2
    watch.end("a")
    assert clock.pending_timers == 0
    beat()  # a late beat of an ended turn changes nothing
    assert clock.pending_timers == 0


def test_the_watch_pauses_while_the_turn_waits_and_forgets_ended_turns() -> None:
    clock = FakeClock()
    seen: list[Any] = []
    watch = StallWatch(clock, lambda *args: seen.append(args))
    watch.watch("a", 1, 1.0)
    clock.advance(0.5)
    watch.waiting("a", True)
    clock.advance(100)
    assert seen == []
    assert not watch.stalled("a", 1)
    watch.waiting("a", False)  # the end of the wait counts as a sign of life
    clock.advance(0.9)
    assert seen == []
    clock.advance(0.1)
    assert len(seen) == 1
    beat_2 = watch.watch("a", 2, 1.0)  # a new turn replaces the old one
    watch.beat("a", 1)
    assert watch.watched("a") == 2
    beat_2()
    watch.recovered("a")
    assert watch.cooldown_left("a", 5.0) == 5.0
    watch.forget("a")
    assert watch.cooldown_left("a", 5.0) == 0.0
    assert clock.pending_timers == 0


# --- the spec -----------------------------------------------------------------------------------


def test_the_spec_maps_recovery_onto_recovery_policy() -> None:
    spec = parse_spec(
        {
            "name": "w",
            "harness": "command",
            "command": ["x"],
            "heartbeatS": 0.5,
            "recovery": {"action": "escalate", "maxRetries": 4, "escalateAfter": 2, "cooldownS": 0},
        }
    )
    policy = policy_of(spec)
    assert (policy.max_retries, policy.escalate_after, policy.cooldown_s) == (4, 2, 0)
    assert policy.default_action is RecoveryAction.ESCALATE
    plain = parse_spec({"name": "w", "harness": "command", "command": ["x"]})
    assert plain.heartbeat_s is None
    assert plain.recovery is None
    assert policy_of(plain).default_action is RecoveryAction.RESTART  # RecoveryPolicy's


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"heartbeatS": 0}, "heartbeatS"),
        ({"heartbeatS": "1"}, "heartbeatS"),
        ({"heartbeatS": True}, "heartbeatS"),
        ({"recovery": {}}, "recovery"),
        ({"heartbeatS": 1, "recovery": {"action": "replace"}}, "recovery.action"),
        ({"heartbeatS": 1, "recovery": {"maxRetries": 0}}, "recovery.maxRetries"),
        ({"heartbeatS": 1, "recovery": {"escalateAfter": 1.5}}, "recovery.escalateAfter"),
        ({"heartbeatS": 1, "recovery": {"cooldownS": -1}}, "recovery.cooldownS"),
        ({"heartbeatS": 1, "recovery": {"rules": []}}, "recovery.rules"),
    ],
)
def test_bad_stall_fields_are_refused(extra: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidSpecError) as refused:
        parse_spec({"name": "w", "harness": "command", "command": ["x"], **extra})
    assert field in [p["field"] for p in refused.value.problems]


# --- the rules, through the service ---------------------------------------------------------


async def test_a_silent_turn_is_stalled_and_restarted_with_the_same_prompt(
    make_service: MakeService, sqlite_store: SQLiteStore, harness: ScriptedHarness
) -> None:
    service, clock = await _service(make_service, sqlite_store)
    harness.script("w", *HANG)
    agent = await _agent(service, recovery={"cooldownS": 0})
    await _running(service, harness, agent, 1)
    await _advance(clock, 0.9, service)
    assert await _events(service, agent, *STALL_EVENTS) == []
    await _advance(clock, 0.1, service)
    await _running(service, harness, agent, 2)
    stalled, recovery = await _events(service, agent, *STALL_EVENTS)
    assert stalled == {
        "type": "agent.turn_stalled",
        "turn": 1,
        "silenceS": 1.0,
        "heartbeatS": 1.0,
    }
    assert (recovery["action"], recovery["attempt"], recovery["turn"]) == ("restart", 1, 1)
    assert (recovery["maxRetries"], recovery["escalateAfter"]) == (3, 3)
    (interrupted,) = await _events(service, agent, "agent.turn_interrupted")
    assert interrupted["reason"].startswith("stalled: no sign of life for 1 s")
    restarted = (await _events(service, agent, "agent.turn_started"))[-1]
    assert (restarted["turn"], restarted["prompt"], restarted["restart"]) == (2, "go", True)
    assert harness.cancelled == [agent]  # the stalled turn was ended
    assert harness.prompts(agent) == ["go", "go"]
    rec = service.get(agent)
    assert (rec["state"], rec["turnInFlight"], rec["stallRecoveries"]) == ("running", 2, 1)
    assert rec["retriesUsed"] == 0  # a restart is not a retry of the failure policy


async def test_signs_of_life_keep_a_turn_going(
    make_service: MakeService, sqlite_store: SQLiteStore, harness: ScriptedHarness
) -> None:
    service, clock = await _service(make_service, sqlite_store)
    harness.script("w", "hang")
    agent = await _agent(service)
    await _running(service, harness, agent, 1)
    beat = harness.requests[-1].heartbeat
    assert beat is not None
    for _ in range(10):
        await _advance(clock, 0.7, service)
        beat()
    assert await _events(service, agent, *STALL_EVENTS) == []
    harness.release("w")
    await service.settled(agent)
    assert service.get(agent)["state"] == "idle"
    assert clock.pending_timers == 0  # the turn's timer went with it


async def test_an_agent_without_heartbeat_is_not_watched(
    make_service: MakeService, sqlite_store: SQLiteStore, harness: ScriptedHarness
) -> None:
    service, clock = await _service(make_service, sqlite_store)
    harness.script("w", "hang")
    agent = await _agent(service, heartbeatS=None)
    await _running(service, harness, agent, 1)
    assert harness.requests[-1].heartbeat is None
    await _advance(clock, 500, service)
    assert await _events(service, agent, *STALL_EVENTS) == []


async def test_a_stall_inside_the_cooldown_waits_for_its_end(
    make_service: MakeService, sqlite_store: SQLiteStore, harness: ScriptedHarness
) -> None:
    service, clock = await _service(make_service, sqlite_store)
    harness.script("w", *HANG)
    agent = await _agent(service, recovery={"cooldownS": 5, "maxRetries": 5})
    await _running(service, harness, agent, 1)
    await _advance(clock, 1, service)  # t=1: restart, the cooldown runs to t=6
    await _running(service, harness, agent, 2)
    await _advance(clock, 1, service)  # t=2: turn 2 stalls inside the cooldown
    events = await _events(service, agent, *STALL_EVENTS)
    assert [e["type"] for e in events[2:]] == ["agent.turn_stalled", "agent.stall_recovery"]
    deferred = events[3]
    assert (deferred["action"], deferred["attempt"], deferred["waitS"]) == (None, 1, 4.0)
    assert "in cooldown" in deferred["detail"]
    assert service.get(agent)["turnInFlight"] == 2
    await _advance(clock, 3.9, service)
    assert len(await _events(service, agent, *STALL_EVENTS)) == 4
    await _advance(clock, 0.1, service)  # t=6: still silent, restarted now, reported once
    await _running(service, harness, agent, 3)
    events = await _events(service, agent, *STALL_EVENTS)
    assert [e["type"] for e in events[4:]] == ["agent.stall_recovery"]
    assert (events[4]["action"], events[4]["attempt"]) == ("restart", 2)


async def test_a_beat_inside_the_cooldown_ends_the_stall(
    make_service: MakeService, sqlite_store: SQLiteStore, harness: ScriptedHarness
) -> None:
    service, clock = await _service(make_service, sqlite_store)
    harness.script("w", *HANG)
    agent = await _agent(service, recovery={"cooldownS": 5})
    await _running(service, harness, agent, 1)
    await _advance(clock, 1, service)
    await _running(service, harness, agent, 2)
    await _advance(clock, 1, service)  # t=2: deferred to t=6
    beat = harness.requests[-1].heartbeat
    assert beat is not None
    await _advance(clock, 3.5, service)
    beat()  # t=5.5: alive after all
    await _advance(clock, 0.9, service)  # t=6.4: the cooldown is over, the turn is not silent
    assert len(await _events(service, agent, *STALL_EVENTS)) == 4
    assert service.get(agent)["turnInFlight"] == 2
    await _advance(clock, 0.1, service)  # t=6.5: silent for 1 s since the beat: a new stall
    events = await _events(service, agent, *STALL_EVENTS)
    assert [e["type"] for e in events[4:]] == STALL_EVENTS_LIST
    assert events[5]["action"] == "restart"


STALL_EVENTS_LIST = list(STALL_EVENTS)


async def test_max_retries_ejects_the_agent(
    make_service: MakeService, sqlite_store: SQLiteStore, harness: ScriptedHarness
) -> None:
    service, clock = await _service(make_service, sqlite_store)
    harness.script("w", *HANG)
    agent = await _agent(service, recovery={"maxRetries": 2, "escalateAfter": 5, "cooldownS": 0})
    for turn in (1, 2, 3):
        await _running(service, harness, agent, turn)
        await _advance(clock, 1, service)
    await service.settled(agent)
    rec = service.get(agent)
    assert (rec["state"], rec["reason"]) == ("failed", "stalled")
    assert rec["error"].startswith("stalled: no sign of life for 1 s (heartbeatS 1)")
    actions = [
        (e["action"], e["attempt"]) for e in await _events(service, agent, "agent.stall_recovery")
    ]
    assert actions == [("restart", 1), ("restart", 2), ("eject", 3)]
    assert service.decisions() == []
    assert clock.pending_timers == 0


async def test_escalate_after_holds_the_agent_for_a_person_and_the_count_goes_on(
    make_service: MakeService, sqlite_store: SQLiteStore, harness: ScriptedHarness
) -> None:
    service, clock = await _service(make_service, sqlite_store)
    harness.script("w", *HANG)
    agent = await _agent(service, recovery={"maxRetries": 3, "escalateAfter": 1, "cooldownS": 0})
    await _running(service, harness, agent, 1)
    await _advance(clock, 1, service)  # restart
    await _running(service, harness, agent, 2)
    await _advance(clock, 1, service)  # escalate
    await settle(lambda: service.get(agent)["state"] == "blocked")
    rec = service.get(agent)
    assert rec["reason"] == "stalled"
    assert rec["turnInFlight"] is None
    (held,) = service.decisions()
    assert (held["kind"], held["reason"], held["answers"]) == (
        "blocked",
        "stalled",
        ["retry", "stop"],
    )
    assert held["error"].startswith("stalled: no sign of life")
    assert clock.pending_timers == 0  # a held agent has no turn to watch
    await service.answer(held["id"], "retry", by="alice", why="try once more")
    await _running(service, harness, agent, 3)
    assert harness.prompts(agent)[-1] == "go"
    await _advance(clock, 1, service)  # count 2: escalated again
    await settle(lambda: service.get(agent)["state"] == "blocked")
    (again,) = service.decisions()
    await service.answer(again["id"], "retry", by="alice")
    await _running(service, harness, agent, 4)
    await _advance(clock, 1, service)  # count 3 reaches maxRetries: ejected
    await settle(lambda: service.get(agent)["state"] == "failed")
    actions = [e["action"] for e in await _events(service, agent, "agent.stall_recovery")]
    assert actions == ["restart", "escalate", "escalate", "eject"]


async def test_action_eject_fails_the_agent_at_the_first_stall_and_tells_its_parent(
    make_service: MakeService, sqlite_store: SQLiteStore, harness: ScriptedHarness
) -> None:
    service, clock = await _service(make_service, sqlite_store)
    harness.script("w", *HANG)
    parent = await _agent(service, name="boss", prompt=None, heartbeatS=None)
    agent = await _agent(service, parent=parent, notifyOn=["failed"], recovery={"action": "eject"})
    await _running(service, harness, agent, 1)
    await _advance(clock, 1, service)
    await settle(lambda: service.get(agent)["state"] == "failed")
    (notice,) = service.inbox(parent)
    assert (notice["kind"], notice["from"]) == ("failed", agent)
    assert str(notice["error"]).startswith("stalled")


async def test_a_completed_turn_clears_the_count(
    make_service: MakeService, sqlite_store: SQLiteStore, harness: ScriptedHarness
) -> None:
    service, clock = await _service(make_service, sqlite_store)
    harness.script("w", "hang", "hang")
    agent = await _agent(service, recovery={"cooldownS": 0})
    await _running(service, harness, agent, 1)
    await _advance(clock, 1, service)
    await _running(service, harness, agent, 2)
    assert service.get(agent)["stallRecoveries"] == 1
    harness.release("w")
    await service.settled(agent)
    rec = service.get(agent)
    assert rec["state"] == "idle"
    assert "stallRecoveries" not in rec


class _AskThenHang:
    """Each turn asks a person first (the agent is ``waiting``), then hangs until cancelled."""

    def __init__(self) -> None:
        self.requests: list[TurnRequest] = []

    async def run_turn(self, request: TurnRequest) -> TurnResult:
        self.requests.append(request)
        assert request.check_action is not None
        await request.check_action(request.agent_id, "deploy", {})  # type: ignore[misc]
        await asyncio.Event().wait()
        raise AssertionError("not reached")

    async def reap(self, agent_id: str, state_dir: Path) -> bool:
        return False


async def test_a_turn_waiting_on_a_person_is_not_stalled(
    make_service: MakeService, sqlite_store: SQLiteStore
) -> None:
    service, clock = await _service(make_service, sqlite_store, harness=_AskThenHang())
    rule = {"match": "deploy", "verdict": "ask", "timeoutS": 3600}
    agent = await _agent(service, guardrails=[rule], recovery={"cooldownS": 0})
    await settle(lambda: service.get(agent)["state"] == "waiting")
    await _advance(clock, 600, service)
    assert await _events(service, agent, *STALL_EVENTS) == []
    (asked,) = service.decisions()
    await service.answer(asked["id"], "approve", by="alice")
    await settle(lambda: service.get(agent)["state"] == "running")
    await _advance(clock, 0.9, service)  # the answer counts as a sign of life
    assert await _events(service, agent, *STALL_EVENTS) == []
    await _advance(clock, 0.1, service)
    await settle(lambda: service.get(agent)["turnInFlight"] == 2)
    assert [e["action"] for e in await _events(service, agent, "agent.stall_recovery")] == [
        "restart"
    ]


async def test_stop_clears_the_timer(
    make_service: MakeService, sqlite_store: SQLiteStore, harness: ScriptedHarness
) -> None:
    service, clock = await _service(make_service, sqlite_store)
    harness.script("w", "hang")
    agent = await _agent(service)
    await _running(service, harness, agent, 1)
    assert clock.pending_timers == 1
    await service.stop(agent, by="alice")
    assert clock.pending_timers == 0
    await _advance(clock, 10, service)
    assert await _events(service, agent, *STALL_EVENTS) == []


async def test_the_count_survives_a_restart_of_the_service(
    make_service: MakeService, open_sqlite: OpenSQLite, tmp_path: Path, harness: ScriptedHarness
) -> None:
    store = await open_sqlite()
    service, clock = await _service(make_service, store)
    harness.script("w", *HANG)
    recovery = {"maxRetries": 2, "escalateAfter": 5, "cooldownS": 0}
    agent = await _agent(service, onFailure="ask", recovery=recovery)
    await _running(service, harness, agent, 1)
    await _advance(clock, 1, service)
    await _running(service, harness, agent, 2)
    await service.close()
    await store.close()
    store = await open_sqlite(tmp_path / "corral.db")
    service, clock = await _service(make_service, store)
    rec = service.get(agent)
    # The turn in flight was interrupted as any is (a failed turn: onFailure ask holds the
    # agent); the count of stall recoveries is the record's, and goes on from there.
    assert (rec["state"], rec["stallRecoveries"]) == ("blocked", 1)
    (held,) = service.decisions()
    await service.answer(held["id"], "retry", by="alice")
    await _running(service, harness, agent, 3)
    await _advance(clock, 1, service)  # recovery 2: restart
    await _running(service, harness, agent, 4)
    await _advance(clock, 1, service)  # recovery 3 reaches maxRetries 2: ejected
    await settle(lambda: service.get(agent)["state"] == "failed")
    actions = [
        (e["action"], e["attempt"]) for e in await _events(service, agent, "agent.stall_recovery")
    ]
    assert actions == [("restart", 1), ("restart", 2), ("eject", 3)]
