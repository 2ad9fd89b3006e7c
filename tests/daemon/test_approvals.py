"""Agents ask before they act: guardrails in specs and the daemon's, approvals a person
answers (or a deadline does), one decisions inbox, and who may answer what."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any, cast

import pytest

from corral.daemon import AgentService, LocalApi, SQLiteStore, TurnRequest, TurnResult
from corral.daemon._errors import (
    AnswerNotAcceptedError,
    DecisionAnsweredError,
    DecisionNotFoundError,
    InvalidRequestError,
    OutOfScopeError,
    TooManyApprovalsError,
)
from corral.daemon.guardrails import may_ask, parse_rules
from corral.runtime import FakeClock
from tests.daemon.conftest import MakeService, OpenSQLite
from tests.support.harness import ScriptedHarness, fail
from tests.support.polling import settle

DEPLOY_ASKS = [
    {"match": "deploy", "verdict": "ask", "reason": "deploys need a person", "timeoutS": 600},
    {"match": "drop table", "verdict": "block", "reason": "no schema changes"},
    {"match": "migrate", "verdict": "warn", "reason": "watch the lock time"},
]


class AskingHarness:
    """Each turn asks the daemon whether it may do its prompt, then says what it was told."""

    def __init__(self) -> None:
        self.requests: list[TurnRequest] = []
        self.paused: list[float] = []

    async def run_turn(self, request: TurnRequest) -> TurnResult:
        self.requests.append(request)
        assert request.check_action is not None
        verdict: Any = await cast(
            Any, request.check_action(request.agent_id, request.prompt, {"n": 1})
        )
        if request.paused_s is not None:
            self.paused.append(request.paused_s())
        word = "allowed" if verdict.allowed else "blocked"
        return TurnResult(output=f"{word}: {verdict.reason}")

    async def reap(self, agent_id: str, state_dir: Path) -> bool:
        return False


async def _agent(service: AgentService, **spec: Any) -> str:
    spec.setdefault("name", "worker")
    spec.setdefault("harness", "command")
    spec.setdefault("command", ["worker"])
    return str((await service.spawn(spec)).body["id"])


# --- rules --------------------------------------------------------------------------------


async def test_a_block_rule_blocks_and_a_warning_is_kept(service: AgentService) -> None:
    agent = await _agent(service, guardrails=DEPLOY_ASKS)
    blocked = await service.check_action(agent, "DROP TABLE users")
    assert (blocked.verdict, blocked.reason, blocked.decision) == (
        "blocked",
        "no schema changes",
        None,
    )
    warned = await service.check_action(agent, "migrate the users table")
    assert warned.verdict == "allowed"
    assert [w["reason"] for w in warned.warnings] == ["watch the lock time"]
    assert service.decisions() == []  # nothing asked a person


async def test_no_rules_allow_everything(service: AgentService) -> None:
    agent = await _agent(service)
    assert (await service.check_action(agent, "deploy everything")).verdict == "allowed"


async def test_daemon_rules_come_first_and_children_inherit(
    make_service: MakeService, sqlite_store: SQLiteStore
) -> None:
    org = parse_rules([{"match": "prod", "verdict": "block", "reason": "org: no prod"}])
    service = await make_service(sqlite_store, guardrails=org)
    parent = await _agent(
        service, name="lead", guardrails=[{"match": "delete", "verdict": "block"}]
    )
    child = await _agent(
        service,
        name="child",
        parent=parent,
        # The child's own allow cannot reach past the daemon's and its parent's rules.
        guardrails=[{"match": "prod", "verdict": "allow"}, {"match": "rm", "verdict": "block"}],
    )
    assert (await service.check_action(child, "deploy prod")).reason == "org: no prod"
    assert (await service.check_action(child, "delete logs")).verdict == "blocked"
    assert (await service.check_action(child, "rm -rf /tmp/x")).verdict == "blocked"
    assert (await service.check_action(parent, "rm -rf /tmp/x")).verdict == "allowed"


async def test_bad_checks_are_refused_with_every_problem(service: AgentService) -> None:
    agent = await _agent(service)
    with pytest.raises(InvalidRequestError) as caught:
        await service.check_action(agent, "", cast(Any, ["not", "an", "object"]), wait_s=-1)
    fields = {p["field"] for p in caught.value.problems}
    assert fields == {"action", "context", "waitS"}
    with pytest.raises(InvalidRequestError, match="at most 16384 characters, got 16385"):
        await service.check_action(agent, "x" * 16_385)
    with pytest.raises(InvalidRequestError, match="context"):
        await service.check_action(agent, "ok", {"blob": "y" * 20_000})


# --- approvals ----------------------------------------------------------------------------


async def test_an_approval_waits_for_a_person_and_is_recorded_with_who(
    service: AgentService,
) -> None:
    agent = await _agent(service, guardrails=DEPLOY_ASKS)
    pending = await service.check_action(agent, "deploy web to prod", {"version": "2.4"})
    assert pending.verdict == "pending"
    (decision,) = service.decisions()
    assert decision["id"] == pending.decision
    assert decision["kind"] == "approval"
    assert decision["action"] == "deploy web to prod"
    assert decision["context"] == {"version": "2.4"}
    assert decision["reason"] == "deploys need a person"
    assert decision["answers"] == ["approve", "deny"]
    assert decision["deadline"] is not None
    assert decision["onTimeout"] == "deny"

    waiter = asyncio.ensure_future(service.action_verdict(decision["id"], wait_s=math.inf))
    await asyncio.sleep(0)
    assert not waiter.done()
    await service.answer(decision["id"], "approve", by="alice", why="release checked")
    verdict = await asyncio.wait_for(waiter, 5)
    assert (verdict.verdict, verdict.decision) == ("allowed", decision["id"])
    assert service.decisions() == []
    (answered,) = service.decisions(resolved=True)
    assert answered["answer"] == "approve"
    assert (answered["by"], answered["why"], answered["timedOut"]) == (
        "alice",
        "release checked",
        False,
    )
    # Asking the same check again answers from the record: nobody is asked twice.
    again = await service.action_verdict(decision["id"])
    assert again.verdict == "allowed"
    assert len(service.decisions(resolved=True)) == 1


async def test_an_approval_does_not_pass_the_rule_a_patch_put_in_its_place(
    service: AgentService,
) -> None:
    # A person approved "deploy" under the rule asking about staging; a PATCH then put a
    # stricter rule first. The approval was never given for that rule: it must ask again.
    staging = {"match": "deploy", "verdict": "ask", "reason": "staging?", "timeoutS": 60}
    agent = await _agent(service, guardrails=[staging])
    pending = await service.check_action(agent, "deploy web")
    assert pending.decision is not None
    await service.answer(pending.decision, "approve", by="alice", why="staging is fine")
    assert (await service.action_verdict(pending.decision)).verdict == "allowed"
    prod = {"match": "deploy", "verdict": "ask", "reason": "prod?", "timeoutS": 60}
    await service.patch(agent, {"guardrails": [prod, staging]}, by="lead", why="prod rule")
    again = await service.action_verdict(pending.decision)
    assert again.verdict == "pending"
    assert again.decision not in (None, pending.decision)
    assert service.decision(str(again.decision))["reason"] == "prod?"


async def test_a_denial_blocks_with_the_persons_reason(service: AgentService) -> None:
    agent = await _agent(service, guardrails=DEPLOY_ASKS)
    pending = await service.check_action(agent, "deploy web to prod")
    assert pending.decision is not None
    await service.answer(pending.decision, "deny", by="bob", why="freeze week")
    verdict = await service.action_verdict(pending.decision)
    assert verdict.verdict == "blocked"
    assert verdict.reason == "denied by bob: freeze week"


async def test_an_answered_decision_refuses_a_second_answer_naming_who(
    service: AgentService,
) -> None:
    agent = await _agent(service, guardrails=DEPLOY_ASKS)
    pending = await service.check_action(agent, "deploy")
    assert pending.decision is not None
    with pytest.raises(AnswerNotAcceptedError, match=r"\['approve', 'deny'\]"):
        await service.answer(pending.decision, "retry", by="alice")
    await service.answer(pending.decision, "approve", by="alice", why="ok")
    with pytest.raises(DecisionAnsweredError, match="by alice") as caught:
        await service.answer(pending.decision, "deny", by="bob", why="too late")
    assert caught.value.details["answer"] == "approve"
    with pytest.raises(DecisionNotFoundError):
        await service.answer("d_nope", "approve", by="alice")


async def test_a_deadline_answers_with_on_timeout(
    make_service: MakeService, sqlite_store: SQLiteStore
) -> None:
    clock = FakeClock()
    service = await make_service(sqlite_store, clock=clock)
    rules = [
        {"match": "deploy", "verdict": "ask", "timeoutS": 60},
        {"match": "restart", "verdict": "ask", "timeoutS": 60, "onTimeout": "allow"},
    ]
    agent = await _agent(service, guardrails=rules)
    denied = await service.check_action(agent, "deploy")
    allowed = await service.check_action(agent, "restart web")
    assert denied.decision is not None
    assert allowed.decision is not None
    clock.advance(59)
    await settle(lambda: True)
    assert len(service.decisions()) == 2
    clock.advance(2)
    await settle(lambda: not service.decisions())
    by_id = {d["id"]: d for d in service.decisions(resolved=True)}
    assert by_id[denied.decision]["timedOut"] is True
    assert by_id[denied.decision]["by"] == "corral"
    assert (await service.action_verdict(denied.decision)).verdict == "blocked"
    assert "before its deadline" in str((await service.action_verdict(denied.decision)).reason)
    assert (await service.action_verdict(allowed.decision)).verdict == "allowed"


async def test_a_turn_waits_on_a_person_and_goes_on_when_answered(
    make_service: MakeService, sqlite_store: SQLiteStore
) -> None:
    asking = AskingHarness()
    service = await make_service(sqlite_store, harness=asking)
    agent = await _agent(service, guardrails=DEPLOY_ASKS, prompt="deploy web to prod")
    await settle(lambda: service.get(agent)["state"] == "waiting")
    (decision,) = service.decisions()
    assert service.get(agent)["decision"] == decision["id"]
    await service.answer(decision["id"], "approve", by="alice", why="go")
    await service.settled(agent)
    rec = service.get(agent)
    assert (rec["state"], rec["lastOutput"]) == ("idle", "allowed: None")
    assert "decision" not in rec
    assert asking.paused
    assert asking.paused[0] >= 0.0
    types = [e.type for e in await service.events(agent_id=agent)]
    assert "decision.requested" in types
    assert "decision.resolved" in types


async def test_stopping_a_waiting_agent_withdraws_its_approval(
    make_service: MakeService, sqlite_store: SQLiteStore
) -> None:
    service = await make_service(sqlite_store, harness=AskingHarness())
    agent = await _agent(service, guardrails=DEPLOY_ASKS, prompt="deploy")
    await settle(lambda: service.get(agent)["state"] == "waiting")
    await service.stop(agent, by="alice", why="not today")
    (withdrawn,) = service.decisions(resolved=True)
    assert withdrawn["answer"] == "withdrawn"
    assert service.decisions() == []


async def test_a_pending_approval_survives_a_restart_and_a_passed_deadline_is_applied(
    make_service: MakeService, open_sqlite: OpenSQLite, tmp_path: Path
) -> None:
    clock = FakeClock()
    store = await open_sqlite()
    first = await make_service(store, clock=clock)
    agent = await _agent(first, guardrails=[{"match": "deploy", "verdict": "ask", "timeoutS": 60}])
    pending = await first.check_action(agent, "deploy")
    await first.close()
    await store.close()

    store = await open_sqlite()
    second = await make_service(store, clock=clock)
    (still,) = second.decisions()
    assert still["id"] == pending.decision
    assert still["state"] == "pending"
    await second.close()
    await store.close()

    clock.advance(120)  # the deadline passes while no daemon runs
    store = await open_sqlite()
    third = await make_service(store, clock=clock)
    assert third.decisions() == []
    (timed_out,) = third.decisions(resolved=True)
    assert (timed_out["answer"], timed_out["timedOut"]) == ("deny", True)
    assert (await store.replay()).snapshot() == store.state.snapshot()


# --- the other kinds of decision ----------------------------------------------------------


async def test_a_blocked_agent_is_a_decision_answered_by_retry_or_by_prompt(
    service: AgentService, harness: ScriptedHarness
) -> None:
    harness.script("worker", fail("no table users"), "done")
    agent = await _agent(service, onFailure="ask", prompt="migrate")
    await settle(lambda: service.get(agent)["state"] == "blocked")
    (decision,) = service.decisions()
    assert (decision["kind"], decision["answers"]) == ("blocked", ["retry", "stop"])
    assert decision["error"] == "no table users"
    assert service.get(agent)["decision"] == decision["id"]
    result = await service.answer(
        decision["id"], "retry", by="alice", why="table is users_v2", text="use users_v2"
    )
    assert result.body == {"decision": decision["id"], "answer": "retry", "agentId": agent}
    await service.settled(agent)
    assert harness.prompts(agent)[-1] == "use users_v2"
    (answered,) = service.decisions(resolved=True)
    assert (answered["answer"], answered["by"]) == ("retry", "alice")
    # The prompt route answers the same decision.
    harness.script("worker", fail("again"))
    await service.prompt(agent, "once more")
    await settle(lambda: service.get(agent)["state"] == "blocked")
    second = service.decisions()[0]["id"]
    await service.prompt(agent, "fixed", by="carol", why="done right")
    assert service.decision(second)["answer"] == "retry"
    assert service.decision(second)["by"] == "carol"


async def test_a_budget_hold_is_answered_with_a_budget(
    service: AgentService, harness: ScriptedHarness
) -> None:
    agent = await _agent(service, budget={"maxTurns": 1}, prompt="one")
    await service.settled(agent)
    with pytest.raises(Exception, match="budget"):
        await service.prompt(agent, "two")
    (decision,) = service.decisions()
    assert decision["kind"] == "budget_exhausted"
    assert decision["answers"] == ["budget", "stop"]
    await service.answer(
        decision["id"], "budget", by="alice", why="one more", budget={"maxTurns": 2}
    )
    assert service.get(agent)["state"] == "idle"
    assert service.decision(decision["id"])["answer"] == "budget"


# --- who may answer -----------------------------------------------------------------------


async def test_an_agent_never_answers_its_own_decision_and_a_parent_only_when_allowed(
    service: AgentService,
) -> None:
    api = LocalApi(service)
    lead = await _agent(service, name="lead", mayAnswer=["approval"])
    plain = await _agent(service, name="plain")
    worker = await _agent(service, name="w", parent=lead, guardrails=DEPLOY_ASKS)
    other = await _agent(service, name="o", parent=plain, guardrails=DEPLOY_ASKS)
    asked = await api.as_agent(worker).check_action(worker, "deploy")
    with pytest.raises(OutOfScopeError, match="its own decision"):
        await api.as_agent(worker).answer(asked["decision"], "approve")
    with pytest.raises(OutOfScopeError):
        await api.as_agent(worker).check_action(lead, "deploy")  # as another agent
    answered = await api.as_agent(lead).answer(asked["decision"], "approve", why="ok")
    assert answered["answer"] == "approve"
    assert service.decision(asked["decision"])["by"] == lead
    theirs = await api.as_agent(other).check_action(other, "deploy")
    with pytest.raises(OutOfScopeError, match="mayAnswer"):
        await api.as_agent(plain).answer(theirs["decision"], "approve")
    with pytest.raises(DecisionNotFoundError):  # beyond its reach: not even seen
        await api.as_agent(lead).answer(theirs["decision"], "approve")
    assert [d["id"] for d in await api.as_agent(plain).decisions()] == [theirs["decision"]]


def test_may_ask_tells_whether_a_person_could_be_asked() -> None:
    rules = parse_rules(
        [
            {"match": "drop table", "verdict": "block"},
            {"match": "Deploy", "verdict": "ask"},
            {"match": {"regex": "^restart (web|db)$"}, "verdict": "ask"},
        ]
    )
    assert may_ask(rules, "deploy web")  # substrings ignore case
    assert may_ask(rules, "restart db")
    assert not may_ask(rules, "restart cache")
    assert not may_ask(rules, "drop table users")  # blocks, but asks nobody


async def test_an_ask_rule_that_does_not_match_opens_nothing(service: AgentService) -> None:
    agent = await _agent(service, guardrails=DEPLOY_ASKS)
    verdict = await service.check_action(agent, "read the logs", wait_s=0)
    assert (verdict.verdict, verdict.decision) == ("allowed", None)
    assert service.decisions() == []
    assert service.decisions(resolved=True) == []


async def test_a_deadline_passed_while_down_is_timed_out_before_the_turn_is_interrupted(
    make_service: MakeService, open_sqlite: OpenSQLite
) -> None:
    # A harness that cannot adopt a turn: the waiting turn is interrupted at the next
    # start, but its approval's deadline passed first, and the record says so.
    clock = FakeClock()
    store = await open_sqlite()
    first = await make_service(store, harness=AskingHarness(), clock=clock)
    rules = [{"match": "deploy", "verdict": "ask", "timeoutS": 60}]
    agent = await _agent(first, guardrails=rules, prompt="deploy")
    await settle(lambda: first.get(agent)["state"] == "waiting")
    await first.close()
    await store.close()
    clock.advance(120)
    store = await open_sqlite()
    second = await make_service(store, harness=AskingHarness(), clock=clock)
    (answered,) = second.decisions(resolved=True)
    assert (answered["answer"], answered["timedOut"], answered["by"]) == ("deny", True, "corral")
    rec = second.get(agent)
    assert rec["lastError"] == "daemon restarted during turn"
    assert rec["state"] == "failed"  # its policy (fail) applies to the interrupted turn


async def test_an_agent_cannot_make_a_child_that_answers_more_than_it_may(
    service: AgentService,
) -> None:
    api = LocalApi(service)
    plain = await _agent(service, name="plain")
    lead = await _agent(service, name="lead", mayAnswer=["blocked"])
    with pytest.raises(OutOfScopeError, match=r"may answer \['approval'\]"):
        await api.as_agent(plain).spawn(
            {
                "name": "helper",
                "harness": "command",
                "command": ["w"],
                "parent": plain,
                "mayAnswer": ["approval"],
            }
        )
    made = await api.as_agent(lead).spawn(
        {
            "name": "helper",
            "harness": "command",
            "command": ["w"],
            "parent": lead,
            "mayAnswer": ["blocked"],
        }
    )
    assert made["spec"]["mayAnswer"] == ["blocked"]
    # The operator grants what it likes.
    assert (
        await api.spawn(
            {"name": "x", "harness": "command", "command": ["w"], "mayAnswer": ["approval"]}
        )
    )["spec"]["mayAnswer"] == ["approval"]


async def test_the_same_question_asked_again_is_the_same_decision(service: AgentService) -> None:
    agent = await _agent(service, guardrails=DEPLOY_ASKS)
    first = await service.check_action(agent, "deploy web", {"v": 1})
    again = await service.check_action(agent, "deploy web", {"v": 1})  # a retry loop
    other = await service.check_action(agent, "deploy web", {"v": 2})
    assert first.decision == again.decision
    assert other.decision != first.decision
    assert len(service.decisions()) == 2


async def test_an_agent_has_at_most_so_many_approvals_waiting(
    service: AgentService, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("corral.daemon._approvals.MAX_PENDING_APPROVALS", 3)
    agent = await _agent(service, guardrails=DEPLOY_ASKS)
    for n in range(3):
        assert (await service.check_action(agent, f"deploy {n}")).verdict == "pending"
    with pytest.raises(TooManyApprovalsError, match="has 3 approvals waiting") as caught:
        await service.check_action(agent, "deploy 3")
    assert caught.value.retryable is True
    assert len(service.decisions()) == 3
    await service.answer(service.decisions()[0]["id"], "deny", by="alice")
    assert (await service.check_action(agent, "deploy 3")).verdict == "pending"


async def test_an_ended_agents_token_opens_nothing(service: AgentService) -> None:
    api = LocalApi(service)
    lead = await _agent(service, name="lead")
    child = await _agent(service, name="child", parent=lead)
    await service.stop(lead, by="alice", why="done", keep_children=True)
    with pytest.raises(OutOfScopeError, match="the agent is stopped"):
        await api.as_agent(lead).list_agents()
    with pytest.raises(OutOfScopeError, match="the agent is stopped"):
        await api.as_agent(lead).prompt(child, "keep going")
    assert service.get(child)["state"] == "idle"


async def test_an_agent_may_answer_stop_for_a_descendant_but_not_for_itself(
    service: AgentService, harness: ScriptedHarness
) -> None:
    api = LocalApi(service)
    lead = await _agent(service, name="lead")
    harness.script("w", fail("stuck"))
    worker = await _agent(service, name="w", parent=lead, onFailure="ask", prompt="go")
    await settle(lambda: service.get(worker)["state"] == "blocked")
    (held,) = service.decisions()
    with pytest.raises(OutOfScopeError, match="its own decision"):
        await api.as_agent(worker).answer(held["id"], "stop")
    with pytest.raises(OutOfScopeError, match="mayAnswer"):
        await api.as_agent(lead).answer(held["id"], "retry")
    done = await api.as_agent(lead).answer(held["id"], "stop", why="not worth it")
    assert done["answer"] == "stop"
    assert service.decision(held["id"])["by"] == lead
    assert service.get(worker)["state"] == "stopped"


async def test_a_run_has_at_most_so_many_approvals_waiting_whoever_asks(
    service: AgentService, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("corral.daemon._approvals.MAX_PENDING_RUN_APPROVALS", 4)
    lead = await _agent(service, name="lead", guardrails=DEPLOY_ASKS)
    helpers = [await _agent(service, name=f"h{n}", parent=lead) for n in range(2)]
    for n, asker in enumerate([lead, lead, *helpers]):
        assert (await service.check_action(asker, f"deploy {n}")).verdict == "pending"
    with pytest.raises(TooManyApprovalsError, match=r"the run '.*' of agent .* has 4 approvals"):
        await service.check_action(helpers[0], "deploy again")
    other = await _agent(service, name="elsewhere", guardrails=DEPLOY_ASKS)
    assert (await service.check_action(other, "deploy")).verdict == "pending"
