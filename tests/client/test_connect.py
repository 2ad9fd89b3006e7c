"""``corral.client``: an agent in its own process connected to the daemon -- registering,
turns, asking before acting -- against the daemon's HTTP app in process."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import corral
from corral.client import (
    AgentHandle,
    ClientSettingError,
    Connection,
    DaemonRefusedError,
    Turn,
    TurnRefusedError,
    connect,
)
from corral.guard import GuardrailResult, Severity
from corral.kernel import ExecutionBudget, InvalidArgumentError, RunMeta, ToolRefused
from corral.runtime import Cancellation, FakeClock, MiddlewareContext, MiddlewarePipeline, ToolGuard
from tests.support.front_door import DAEMON_TOKEN, LOCAL_URL, FrontDoor, front_door
from tests.support.polling import settle

ASK_DEPLOY: dict[str, Any] = {
    "match": "deploy",
    "verdict": "ask",
    "reason": "deploys need a person",
    "timeoutS": 600,
}
RULES: list[dict[str, Any]] = [
    ASK_DEPLOY,
    {"match": "drop table", "verdict": "block", "reason": "no schema changes"},
    {"match": "migrate", "verdict": "warn", "reason": "watch the lock time"},
]


@pytest.fixture
async def door(tmp_path: Path) -> AsyncIterator[FrontDoor]:
    async with front_door(tmp_path, token=DAEMON_TOKEN) as opened:
        yield opened


def transport(door: FrontDoor) -> httpx.ASGITransport:
    return httpx.ASGITransport(app=door.app())


@pytest.fixture
async def conn(door: FrontDoor) -> AsyncIterator[Connection]:
    async with connect(LOCAL_URL, DAEMON_TOKEN, transport=transport(door), retry_s=0) as opened:
        yield opened


@pytest.fixture
async def person(door: FrontDoor) -> AsyncIterator[httpx.AsyncClient]:
    """Someone with the operator's token, answering from the decisions inbox."""
    async with door.client(door.app(), authorization=f"Bearer {DAEMON_TOKEN}") as client:
        yield client


# --- connecting -------------------------------------------------------------------------------


def test_connect_takes_its_settings_from_the_environment_or_refuses_typed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CORRAL_URL", raising=False)
    monkeypatch.delenv("CORRAL_TOKEN", raising=False)
    with pytest.raises(ClientSettingError) as missing:
        connect()
    assert missing.value.code == "client_setting_missing"
    assert "CORRAL_URL" in missing.value.message
    with pytest.raises(ClientSettingError, match="CORRAL_TOKEN"):
        connect("http://127.0.0.1:4600")
    with pytest.raises(InvalidArgumentError, match="http:// or https://"):
        connect("127.0.0.1:4600", "t")
    with pytest.raises(InvalidArgumentError, match="timeout_s"):
        connect("http://127.0.0.1:4600", "t", timeout_s=0)
    monkeypatch.setenv("CORRAL_URL", "http://127.0.0.1:4711/")
    monkeypatch.setenv("CORRAL_TOKEN", "from-env")
    made = connect()
    assert made.url == "http://127.0.0.1:4711"
    monkeypatch.delenv("CORRAL_AGENT_ID", raising=False)
    with pytest.raises(ClientSettingError, match="CORRAL_AGENT_ID"):
        made.agent()
    monkeypatch.setenv("CORRAL_AGENT_ID", "a_0123")
    assert made.agent().id == "a_0123"


def test_corral_connect_is_the_clients_and_import_corral_loads_no_httpx() -> None:
    assert corral.connect is connect
    probe = "import sys, corral; print('httpx' in sys.modules, 'corral.client' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=30
    )
    assert out.stdout.split() == ["False", "False"]
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        _ = corral.nothing


# --- registering ------------------------------------------------------------------------------


async def test_register_creates_an_external_agent_and_finds_it_again(
    conn: Connection, door: FrontDoor
) -> None:
    agent = await conn.register(
        "researcher",
        budget=ExecutionBudget(max_tokens=5000, max_cost_usd=2),
        on_failure="retry",
        max_retries=2,
        guardrails=RULES,
        turn_timeout_s=120,
    )
    assert isinstance(agent, AgentHandle)
    assert agent.name == "researcher"
    record = await agent.get()
    assert record["spec"]["harness"] == "external"
    assert record["spec"]["budget"]["maxTokens"] == 5000
    assert record["spec"]["onFailure"] == "retry"
    assert record["spec"]["turnTimeoutS"] == 120
    again = await conn.register("researcher", budget={"maxTokens": 1})
    assert again.id == agent.id  # a live one is taken up, its spec kept
    other = await conn.register("researcher", reuse=False)
    assert other.id != agent.id
    newest = await conn.register("researcher")
    assert newest.id == other.id
    await door.service.stop(other.id)
    assert (await conn.register("researcher")).id == agent.id  # the live one


async def test_register_children_under_a_parent_and_refusals_are_typed(conn: Connection) -> None:
    lead = await conn.register("lead")
    helper = await conn.register("helper", parent="lead", notify_on=["failed"])
    assert (await helper.get())["parent"] == lead.id
    root_helper = await conn.register("helper")
    assert root_helper.id != helper.id  # another parent: another agent
    with pytest.raises(DaemonRefusedError) as refused:
        await conn.register("bad", spec={"prompt": "go"})
    assert refused.value.code == "invalid_spec"
    assert refused.value.status == 400
    assert "prompt" in refused.value.message
    with pytest.raises(InvalidArgumentError):
        await conn.register("")
    with pytest.raises(InvalidArgumentError, match="no 'name' or 'harness' field"):
        await conn.register("x", spec={"harness": "command"})


# --- turns ------------------------------------------------------------------------------------


async def test_a_turn_block_reports_its_output_and_usage(conn: Connection) -> None:
    agent = await conn.register("worker", budget={"maxTokens": 1000, "maxCostUsd": 1.0})
    async with agent.turn("summarise") as turn:
        assert (turn.number, turn.prompt, turn.text, turn.retry) == (
            1,
            "summarise",
            "summarise",
            False,
        )
        assert turn.remaining == ExecutionBudget(max_tokens=1000, max_cost_usd=1.0)
        assert turn.timeout_s == 600.0
        assert (await agent.get())["state"] == "running"
        turn.record(tokens=100, cost_usd=0.01)
        turn.record(tokens=20, cost_usd=0.002)
        turn.output = "three points"
    report = turn.report
    assert report is not None
    assert (report.turn, report.outcome, report.tokens, report.agent_state) == (
        1,
        "succeeded",
        120,
        "idle",
    )
    assert report.cost_usd == pytest.approx(0.012)
    record = await agent.get()
    assert (record["lastOutput"], record["usage"]["tokens"]) == ("three points", 120)
    assert await turn.end("ignored") is report  # ended once


async def test_an_exception_fails_the_turn_with_its_code_and_propagates(conn: Connection) -> None:
    agent = await conn.register("worker", on_failure="ask")

    class ToolCrashed(Exception):
        pass

    turns: list[Turn] = []

    async def crash() -> None:
        async with agent.turn("search") as turn:
            turns.append(turn)
            turn.record(tokens=7)
            raise ToolCrashed("the search tool crashed")

    with pytest.raises(ToolCrashed, match="the search tool crashed"):
        await crash()
    report = turns[0].report
    assert report is not None
    assert report.outcome == "failed"
    assert report.error == "ToolCrashed: the search tool crashed"
    assert report.tokens == 7
    assert (report.agent_state, report.agent_reason, report.held) == ("blocked", "ask", True)
    with pytest.raises(TurnRefusedError) as held:
        await agent.begin("again")
    assert held.value.code == "agent_held"
    assert held.value.details["decision"] == report.decision


async def test_a_cancelled_turn_is_ended_failed_and_the_cancellation_propagates(
    conn: Connection,
) -> None:
    agent = await conn.register("worker", on_failure="retry", max_retries=3)
    inside = asyncio.Event()
    seen: list[Any] = []

    async def run() -> None:
        async with agent.turn("long work") as turn:
            seen.append(turn)
            inside.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(run())
    await inside.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    report = seen[0].report
    assert report is not None
    assert (report.outcome, report.error) == (
        "failed",
        "cancelled: the turn was cancelled in the agent's process",
    )
    assert (report.agent_state, report.agent_reason) == ("idle", "retry")
    retry = await agent.begin("long work")
    assert retry.retry is True
    await retry.fail(RuntimeError("no"), code="gave_up")
    assert retry.report is not None
    assert retry.report.error == "gave_up: no"


async def test_begin_refusals_are_typed_with_the_daemons_code(
    conn: Connection, door: FrontDoor
) -> None:
    agent = await conn.register("worker", budget={"maxTokens": 10})
    turn = await agent.begin("one")
    with pytest.raises(TurnRefusedError) as busy:
        await agent.begin("two")
    assert (busy.value.code, busy.value.retryable, busy.value.status) == ("agent_busy", True, 409)
    turn.record(tokens=11)
    await turn.end("spent")
    with pytest.raises(TurnRefusedError) as spent:
        await agent.begin("three")
    assert spent.value.code == "budget_exhausted"
    assert spent.value.details["dimension"] == "tokens"
    command = await door.spawn(name="cmd")
    with pytest.raises(TurnRefusedError) as daemons:
        await conn.agent(command).begin("x")
    assert daemons.value.code == "not_external"


async def test_usage_is_checked_before_it_is_sent(conn: Connection) -> None:
    agent = await conn.register("worker")
    turn = await agent.begin("x")
    for bad in ({"tokens": -1}, {"tokens": 1.5}, {"cost_usd": -0.1}, {"cost_usd": float("nan")}):
        with pytest.raises(InvalidArgumentError):
            turn.record(**bad)
    turn.record(tokens=3, cost_usd=None)
    assert (turn.tokens, turn.cost_usd) == (3, None)
    turn.record(cost_usd=0.5)
    assert turn.cost_usd is None  # unknown once unknown
    report = await turn.end()
    assert (report.tokens, report.cost_usd) == (3, None)
    with pytest.raises(InvalidArgumentError, match="has not ended"):
        turn.record(tokens=1)


# --- asking before acting -------------------------------------------------------------------


async def test_check_action_answers_like_a_supervisor(conn: Connection) -> None:
    agent = await conn.register("worker", guardrails=RULES)
    allowed = await agent.check_action(agent.id, "read the docs")
    assert allowed == GuardrailResult.allow()
    blocked = await agent.check_action(agent.id, "DROP TABLE users", {"db": "prod"})
    assert (blocked.allowed, blocked.reason, blocked.severity) == (
        False,
        "no schema changes",
        Severity.BLOCK,
    )
    warned = await agent.check_action(agent.id, "migrate users")
    assert (warned.allowed, warned.severity) == (True, Severity.WARNING)
    assert [w.reason for w in warned.warnings] == ["watch the lock time"]
    for args in (("", "x"), (agent.id, 3), (agent.id, "x", ["not", "a", "mapping"])):
        with pytest.raises(InvalidArgumentError):
            await agent.check_action(*args)


async def test_a_person_approves_or_denies_while_the_check_waits(
    conn: Connection, person: httpx.AsyncClient, door: FrontDoor
) -> None:
    agent = await conn.register("deployer", guardrails=[ASK_DEPLOY])
    async with agent.turn("ship it") as turn:
        check = asyncio.create_task(
            agent.check_action("local-name", "deploy web", {"version": 3, "when": object()})
        )
        await settle(lambda: door.service.get(agent.id)["state"] == "waiting")
        (asked,) = door.service.decisions()
        assert asked["action"] == "deploy web"
        assert asked["context"]["caller"] == "local-name"
        assert asked["context"]["version"] == 3
        assert asked["context"]["when"].startswith("<object object")
        assert not check.done()
        answer = await person.post(
            f"/decisions/{asked['id']}", json={"answer": "approve", "why": "checked"}
        )
        assert answer.status_code == 200, answer.text
        assert await check == GuardrailResult.allow()

        denied = asyncio.create_task(agent.check_action(agent.id, "deploy db"))
        await settle(lambda: len(door.service.decisions()) == 1)
        (second,) = door.service.decisions()
        answer = await person.post(
            f"/decisions/{second['id']}", json={"answer": "deny", "why": "not on Friday"}
        )
        assert answer.status_code == 200, answer.text
        refused = await denied
        assert refused.allowed is False
        assert refused.reason == "denied by operator: not on Friday"
        turn.output = "deployed web only"
    assert turn.report is not None
    assert turn.report.outcome == "succeeded"


async def test_the_handle_plugs_into_a_tool_guard(conn: Connection) -> None:
    agent = await conn.register("worker", guardrails=RULES)
    clock = FakeClock()
    meta = RunMeta(cancellation=Cancellation(clock=clock), clock=clock)
    ran: list[str] = []

    async def tool(ctx: MiddlewareContext) -> None:
        ran.append(str(ctx.tool_name))
        ctx.result = "ok"

    guard = MiddlewarePipeline([ToolGuard(agent.check_action)])
    read = MiddlewareContext.tool("local", meta, "read", {"path": "a"}, tool_call_id="c1")
    assert await guard.run(read, tool) == "ok"
    drop = MiddlewareContext.tool("local", meta, "sql", {"q": "drop table x"}, tool_call_id="c2")
    with pytest.raises(ToolRefused, match="no schema changes"):
        await guard.run(drop, tool)
    assert ran == ["read"]


async def test_a_refused_or_unreachable_check_fails_closed(door: FrontDoor) -> None:
    async with connect(LOCAL_URL, DAEMON_TOKEN, transport=transport(door), retry_s=0) as conn:
        nobody = await conn.agent("a_nobody").check_action("a_nobody", "deploy")
        assert nobody.allowed is False
        assert "the daemon refused the check (agent_not_found)" in str(nobody.reason)
    async with connect(LOCAL_URL, "wrong-token", transport=transport(door), retry_s=0) as conn:
        wrong = await conn.agent("a_x").check_action("a_x", "deploy")
        assert "(unauthorized)" in str(wrong.reason)

    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    async with connect(LOCAL_URL, "t", transport=httpx.MockTransport(down), retry_s=0) as conn:
        unreachable = await conn.agent("a_x").check_action("a_x", "deploy")
        assert unreachable.allowed is False
        assert unreachable.reason is not None
        assert unreachable.reason.startswith("no daemon to check with, so refused: ConnectError")


async def test_a_daemon_away_for_a_moment_is_asked_again_within_retry_s(door: FrontDoor) -> None:
    inner = transport(door)
    failures = [2]

    class Flaky(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            if failures[0] > 0:
                failures[0] -= 1
                raise httpx.ConnectError("restarting", request=request)
            return await inner.handle_async_request(request)

    clock = FakeClock(auto_advance=True)
    async with connect(LOCAL_URL, DAEMON_TOKEN, transport=Flaky(), clock=clock, retry_s=5) as conn:
        agent = conn.agent(
            (await door.service.spawn({"name": "x", "harness": "external"})).body["id"]
        )
        assert (await agent.check_action(agent.id, "read")).allowed is True
    assert clock.sleeps == [0.25, 0.5]
    failures[0] = 100
    async with connect(LOCAL_URL, DAEMON_TOKEN, transport=Flaky(), clock=clock, retry_s=5) as conn:
        given_up = await conn.agent(agent.id).check_action(agent.id, "read")
    assert given_up.allowed is False
    assert sum(clock.sleeps[2:]) == pytest.approx(5.0)


async def test_a_huge_context_is_sent_cut_short(conn: Connection, door: FrontDoor) -> None:
    agent = await conn.register("worker", guardrails=[ASK_DEPLOY])
    check = asyncio.create_task(agent.check_action(agent.id, "deploy", {"blob": "x" * 50_000}))
    await settle(lambda: len(door.service.decisions()) == 1)
    (asked,) = door.service.decisions()
    assert asked["context"]["truncated"] is True
    assert len(asked["context"]["json"]) <= 8000
    check.cancel()
    with pytest.raises(asyncio.CancelledError):
        await check


# --- the gateway (through a real corral serve: tests/integrations/test_daemon_oversight.py) ------


async def test_query_is_this_agents_own_and_refuses_bad_requests_before_sending(
    conn: Connection,
) -> None:
    agent = await conn.register("reader")
    with pytest.raises(InvalidArgumentError, match="this agent"):
        await agent.query("someone-else", {"sql": "SELECT 1"})
    with pytest.raises(InvalidArgumentError, match="a mapping"):
        await agent.query(agent.id, "SELECT 1")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="no 'agent' or 'target' field"):
        await agent.query(agent.id, {"sql": "SELECT 1", "agent": "a_other"})
    # this daemon fronts no database: the refusal is the daemon's, typed
    with pytest.raises(DaemonRefusedError) as refused:
        await agent.query("reader", {"sql": "SELECT 1"})
    assert (refused.value.code, refused.value.status) == ("unknown_target", 404)
