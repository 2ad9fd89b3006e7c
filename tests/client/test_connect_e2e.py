"""An agent in its own process connected to a real ``corral serve``: its turns show in the
agent list, the turn records and ``/metrics``; the breaker holds it and a person frees it;
budgets in tokens and dollars refuse its next turn; a person approves or denies what it asks
while it waits; a stop ends its turn and refuses the next. Plus an agent the daemon runs,
asking through the client with what its environment holds.

One daemon serves every test (it takes seconds to start); each test has agents of its own.
"""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from corral.client import AgentHandle, Connection, TurnRefusedError, connect
from corral.guard import GuardrailResult
from tests.support.serve_process import WAIT_BOUND_S, ServeProcess

ASK_DEPLOY = {
    "match": "deploy",
    "verdict": "ask",
    "reason": "deploys need a person",
    "timeoutS": 600,
}

pytestmark = pytest.mark.timeout(90)  # the first test waits for the daemon to start


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    with ServeProcess(tmp_path_factory.mktemp("serve")) as served:
        yield served


@pytest.fixture
async def conn(daemon: ServeProcess) -> AsyncIterator[Connection]:
    async with connect(daemon.url, daemon.token, retry_s=5) as opened:
        yield opened


@pytest.fixture
async def person(daemon: ServeProcess) -> AsyncIterator[httpx.AsyncClient]:
    """Someone with the operator's token, answering from the decisions inbox."""
    headers = {"authorization": f"Bearer {daemon.token}"}
    async with httpx.AsyncClient(base_url=daemon.url, headers=headers, timeout=WAIT_BOUND_S) as c:
        yield c


async def until(condition: Any, what: str) -> Any:
    """Poll the async ``condition`` until it answers something truthy (bounded)."""
    async with asyncio.timeout(WAIT_BOUND_S):
        while True:
            found = await condition()
            if found:
                return found
            await asyncio.sleep(0.02)
    raise AssertionError(what)  # pragma: no cover - the timeout raises first


async def pending_of(person: httpx.AsyncClient, agent: AgentHandle) -> dict[str, Any]:
    async def asked() -> dict[str, Any] | None:
        found = (await person.get("/decisions")).json()["decisions"]
        mine = [d for d in found if d["agentId"] == agent.id and d["kind"] == "approval"]
        return mine[0] if mine else None

    found: dict[str, Any] = await until(asked, "an approval to be asked")
    return found


async def test_an_external_agents_turns_show_in_the_list_the_turns_and_metrics(
    conn: Connection, person: httpx.AsyncClient
) -> None:
    agent = await conn.register("reporter", budget={"maxTokens": 10_000})
    async with agent.turn("read the inbox") as turn:
        listed = (await person.get("/agents", params={"name": "reporter"})).json()["agents"]
        assert [(a["id"], a["harness"], a["state"]) for a in listed] == [
            (agent.id, "external", "running")
        ]
        turn.record(tokens=300, cost_usd=0.003)
        turn.output = "4 new mails"
    async with agent.turn("answer them") as turn:
        turn.record(tokens=200, cost_usd=0.002)
        turn.output = "answered"
    turns = (await person.get(f"/agents/{agent.id}/turns")).json()["turns"]
    assert [(t["turn"], t["outcome"], t["prompt"]) for t in turns] == [
        (2, "succeeded", "answer them"),
        (1, "succeeded", "read the inbox"),
    ]
    record = await agent.get()
    assert (record["state"], record["lastOutput"]) == ("idle", "answered")
    assert record["usage"]["tokens"] == 500
    metrics = (await person.get("/metrics")).text
    assert 'corral_turns_total{harness="external",outcome="completed"}' in metrics
    events = await person.get("/events", params={"agent": agent.id, "format": "json"})
    kinds = [e["type"] for e in events.json()["events"]]
    assert kinds.count("agent.turn_completed") == 2


async def test_three_failed_turns_trip_the_breaker_and_a_persons_answer_frees_it(
    conn: Connection, person: httpx.AsyncClient
) -> None:
    agent = await conn.register("flaky", on_failure="retry", max_retries=10)
    for attempt in range(3):
        with pytest.raises(ConnectionError):
            async with agent.turn("fetch the page") as turn:
                raise ConnectionError(f"the site is down ({attempt})")
    report = turn.report
    assert report is not None
    assert (report.agent_state, report.agent_reason) == ("blocked", "circuit-tripped")
    with pytest.raises(TurnRefusedError) as held:
        await agent.begin("fetch the page")
    assert held.value.code == "agent_held"
    (decision,) = [
        d for d in (await person.get("/decisions")).json()["decisions"] if d["agentId"] == agent.id
    ]
    assert (decision["kind"], decision["reason"]) == ("blocked", "circuit-tripped")
    answer = await person.post(
        f"/decisions/{decision['id']}", json={"answer": "retry", "why": "the site is back"}
    )
    assert answer.status_code == 200, answer.text
    async with agent.turn("fetch the page") as turn:
        turn.output = "fetched"
    assert turn.report is not None
    assert turn.report.outcome == "succeeded"


@pytest.mark.parametrize(
    ("budget", "tokens", "cost", "dimension"),
    [({"maxTokens": 1000}, 1200, 0.0, "tokens"), ({"maxCostUsd": 0.05}, 10, 0.08, "cost_usd")],
)
async def test_a_spent_budget_refuses_the_next_turn(
    conn: Connection, budget: dict[str, Any], tokens: int, cost: float, dimension: str
) -> None:
    agent = await conn.register(f"spender-{dimension}", budget=budget, reuse=False)
    async with agent.turn("loop over the tools") as turn:
        turn.record(tokens=tokens, cost_usd=cost)
    with pytest.raises(TurnRefusedError) as refused:
        async with agent.turn("one more"):
            raise AssertionError("never begun")
    assert refused.value.code == "budget_exhausted"
    assert refused.value.details["dimension"] == dimension
    held = await agent.get()
    assert (held["state"], held["reason"]) == ("blocked", "budget-exhausted")


async def test_a_person_approves_one_action_and_denies_another_while_the_agent_waits(
    conn: Connection, person: httpx.AsyncClient
) -> None:
    agent = await conn.register("deployer", guardrails=[ASK_DEPLOY], reuse=False)
    async with agent.turn("ship the release") as turn:
        check = asyncio.create_task(agent.check_action(agent.id, "deploy web", {"version": 7}))
        asked = await pending_of(person, agent)
        assert (asked["action"], asked["context"]) == ("deploy web", {"version": 7})
        assert (await agent.get())["state"] == "waiting"
        answer = await person.post(f"/decisions/{asked['id']}", json={"answer": "approve"})
        assert answer.status_code == 200, answer.text
        assert await check == GuardrailResult.allow()

        check = asyncio.create_task(agent.check_action(agent.id, "deploy db"))
        asked = await pending_of(person, agent)
        answer = await person.post(
            f"/decisions/{asked['id']}", json={"answer": "deny", "why": "not the database"}
        )
        assert answer.status_code == 200, answer.text
        denied = await check
        assert (denied.allowed, denied.reason) == (False, "denied by operator: not the database")
        turn.output = "web deployed"
    assert turn.report is not None
    assert turn.report.outcome == "succeeded"


async def test_a_stop_ends_the_open_turn_and_refuses_the_next(
    conn: Connection, person: httpx.AsyncClient
) -> None:
    agent = await conn.register("stoppable", reuse=False)
    async with agent.turn("work") as turn:
        stopped = await person.post(f"/agents/{agent.id}/stop", json={"why": "enough"})
        assert stopped.status_code == 202, stopped.text
        turn.output = "done anyway"
    assert turn.report is not None
    assert (turn.report.outcome, turn.report.agent_state) == ("interrupted", "stopped")
    with pytest.raises(TurnRefusedError) as refused:
        await agent.begin("more work")
    assert refused.value.code == "agent_not_live"


async def test_an_agent_the_daemon_runs_asks_through_the_client_with_its_environment(
    person: httpx.AsyncClient,
) -> None:
    script = textwrap.dedent(
        """
        import asyncio, json, corral

        async def main():
            async with corral.connect() as conn:
                me = conn.agent()
                verdict = await me.check_action(me.id, "drop table users")
                print(json.dumps([verdict.allowed, verdict.reason]))

        asyncio.run(main())
        """
    )
    rule = {"match": "drop table", "verdict": "block", "reason": "no schema changes"}
    spec = {
        "name": "inside",
        "harness": "command",
        "command": [sys.executable, "-c", script],
        "guardrails": [rule],
        "prompt": "go",
    }
    created = await person.post("/agents", json=spec)
    assert created.status_code == 201, created.text
    agent_id = created.json()["id"]

    async def ended() -> dict[str, Any] | None:
        found: dict[str, Any] = (await person.get(f"/agents/{agent_id}")).json()
        return found if found["state"] in ("idle", "failed") else None

    done = await until(ended, "the agent's turn to end")
    assert done["state"] == "idle", done["lastError"]
    assert json.loads(done["lastOutput"]) == [False, "no schema changes"]
