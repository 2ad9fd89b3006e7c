"""Agents in their own process (harness ``external``): their process begins and ends its
turns over HTTP, and the daemon settles them as any harness's (budgets, failure policy, the
breaker, stops, a restart). Through the HTTP app in process."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.daemon import AgentService, SQLiteStore, create_app
from corral.runtime import FakeClock
from tests.daemon.conftest import MakeService
from tests.support.front_door import DAEMON_TOKEN, LOCAL_URL, FrontDoor, front_door
from tests.support.polling import settle

OPERATOR = {"authorization": f"Bearer {DAEMON_TOKEN}"}


def error_of(answer: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert answer.status_code == status, answer.text
    error: dict[str, Any] = answer.json()["error"]
    assert error["code"] == code, error
    return error


@pytest.fixture
async def door(tmp_path: Path) -> AsyncIterator[FrontDoor]:
    async with front_door(tmp_path, token=DAEMON_TOKEN) as opened:
        yield opened


@pytest.fixture
async def api(door: FrontDoor) -> AsyncIterator[httpx.AsyncClient]:
    """A client with the daemon's own token (an operator's)."""
    async with door.client(door.app(), **OPERATOR) as client:
        yield client


async def external(api: httpx.AsyncClient, **spec: Any) -> str:
    spec.setdefault("name", "outside")
    answer = await api.post("/agents", json={"harness": "external", **spec})
    assert answer.status_code == 201, answer.text
    assert answer.json()["state"] == "idle"
    return str(answer.json()["id"])


async def begin(api: httpx.AsyncClient, agent_id: str, prompt: str = "go") -> dict[str, Any]:
    answer = await api.post(f"/agents/{agent_id}/turns", json={"prompt": prompt})
    assert answer.status_code == 201, answer.text
    body: dict[str, Any] = answer.json()
    assert answer.headers["location"] == f"/agents/{agent_id}/turns/{body['turn']}"
    return body


async def end(api: httpx.AsyncClient, agent_id: str, turn: int, **body: Any) -> dict[str, Any]:
    body.setdefault("outcome", "ok")
    answer = await api.post(f"/agents/{agent_id}/turns/{turn}/end", json=body)
    assert answer.status_code == 200, answer.text
    ended: dict[str, Any] = answer.json()
    return ended


async def agent(api: httpx.AsyncClient, agent_id: str) -> dict[str, Any]:
    answer = await api.get(f"/agents/{agent_id}")
    assert answer.status_code == 200, answer.text
    found: dict[str, Any] = answer.json()
    return found


async def fail_turn(api: httpx.AsyncClient, agent_id: str) -> dict[str, Any]:
    turn = (await begin(api, agent_id))["turn"]
    error = {"code": "tool_crashed", "message": "the search tool crashed"}
    return await end(api, agent_id, turn, outcome="failed", error=error)


# --- a turn, begun and ended by the agent's process -------------------------------------------


async def test_a_turn_runs_from_its_begin_to_its_end_and_shows_like_any_turn(
    api: httpx.AsyncClient,
) -> None:
    agent_id = await external(api, budget={"maxTokens": 1000})
    begun = await begin(api, agent_id, "summarise the report")
    assert begun == {
        "id": agent_id,
        "accepted": "turn",
        "turn": 1,
        "retry": False,
        "text": "summarise the report",
        "timeoutS": 600.0,
        "remaining": {"tokens": 1000, "costUsd": None, "deadlineS": None},
    }
    running = await agent(api, agent_id)
    assert (running["state"], running["reason"], running["turnInFlight"]) == ("running", "begun", 1)
    listed = (await api.get(f"/agents/{agent_id}/turns")).json()["turns"]
    assert [(t["turn"], t["outcome"], t["prompt"]) for t in listed] == [
        (1, "running", "summarise the report")
    ]

    ended = await end(
        api, agent_id, 1, output="three points", usage={"tokens": 120, "costUsd": 0.02}
    )
    assert ended["turn"] == 1
    assert ended["outcome"] == "succeeded"
    assert ended["usage"] == {"tokens": 120, "costUsd": 0.02}
    assert ended["agent"] == {
        "state": "idle",
        "reason": "turn-done",
        "error": None,
        "decision": None,
    }
    done = await agent(api, agent_id)
    assert done["lastOutput"] == "three points"
    assert done["usage"]["tokens"] == 120
    assert done["usage"]["turns"] == 1
    one = (await api.get(f"/agents/{agent_id}/turns/1")).json()
    assert (one["outcome"], one["output"]) == ("succeeded", "three points")
    listing = (await api.get("/agents", params={"name": "outside"})).json()["agents"]
    assert [(a["id"], a["harness"], a["turns"]) for a in listing] == [(agent_id, "external", 1)]


async def test_a_turn_ended_twice_answers_the_first_result(api: httpx.AsyncClient) -> None:
    agent_id = await external(api)
    await begin(api, agent_id)
    first = await end(api, agent_id, 1, output="first", usage={"tokens": 5})
    again = await end(
        api, agent_id, 1, outcome="failed", error={"message": "late"}, usage={"tokens": 99}
    )
    assert again == first
    assert (await agent(api, agent_id))["usage"]["tokens"] == 5  # counted once


async def test_a_failed_turn_is_settled_by_the_failure_policy(api: httpx.AsyncClient) -> None:
    agent_id = await external(api)  # onFailure defaults to fail
    ended = await fail_turn(api, agent_id)
    assert ended["outcome"] == "failed"
    assert ended["error"] == "tool_crashed: the search tool crashed"
    assert ended["agent"]["state"] == "failed"
    refused = await api.post(f"/agents/{agent_id}/turns", json={"prompt": "again"})
    error_of(refused, 409, "agent_not_live")


async def test_three_failures_trip_the_breaker_and_a_persons_retry_frees_it(
    api: httpx.AsyncClient,
) -> None:
    agent_id = await external(api, onFailure="retry", maxRetries=5, maxConsecutiveFailures=3)
    first = await fail_turn(api, agent_id)
    assert first["agent"]["state"] == "idle"
    assert first["agent"]["reason"] == "retry"  # its process may begin the retry
    second = await begin(api, agent_id)
    assert second["retry"] is True
    await end(api, agent_id, second["turn"], outcome="failed", error={"message": "again"})
    third = await fail_turn(api, agent_id)
    assert third["agent"]["state"] == "blocked"
    assert third["agent"]["reason"] == "circuit-tripped"
    decision = third["agent"]["decision"]

    held = await api.post(f"/agents/{agent_id}/turns", json={"prompt": "go"})
    error = error_of(held, 409, "agent_held")
    assert error["retryable"] is False
    assert error["details"]["decision"] == decision
    prompted = await api.post(f"/agents/{agent_id}/prompt", json={"text": "go"})
    error_of(prompted, 409, "agent_external")

    answer = await api.post(f"/decisions/{decision}", json={"answer": "retry", "why": "fixed"})
    assert answer.status_code == 200, answer.text
    freed = await agent(api, agent_id)
    assert (freed["state"], freed["reason"], freed["turnInFlight"]) == ("idle", "answered", None)
    resolved = (await api.get(f"/decisions/{decision}")).json()
    assert (resolved["state"], resolved["answer"], resolved["why"]) == (
        "resolved",
        "retry",
        "fixed",
    )
    fourth = await begin(api, agent_id)
    assert (fourth["turn"], fourth["retry"]) == (4, False)
    await end(api, agent_id, 4, output="ok now")
    assert (await agent(api, agent_id))["consecutiveFailures"] == 0


async def test_retries_are_begun_by_the_process_until_max_retries_then_it_is_held(
    api: httpx.AsyncClient,
) -> None:
    agent_id = await external(api, onFailure="retry", maxRetries=1, maxConsecutiveFailures=10)
    assert (await fail_turn(api, agent_id))["agent"]["reason"] == "retry"
    retry = await begin(api, agent_id)
    assert retry["retry"] is True
    ended = await end(api, agent_id, retry["turn"], outcome="failed", error={"message": "no"})
    assert (ended["agent"]["state"], ended["agent"]["reason"]) == ("blocked", "retries-exhausted")
    assert (await agent(api, agent_id))["retriesUsed"] == 1


@pytest.mark.parametrize(
    ("budget", "usage", "dimension"),
    [
        ({"maxTokens": 100}, {"tokens": 150, "costUsd": 0.0}, "tokens"),
        ({"maxCostUsd": 0.5}, {"tokens": 10, "costUsd": 0.75}, "cost_usd"),
    ],
)
async def test_a_spent_budget_refuses_the_next_turn_and_holds_the_agent(
    api: httpx.AsyncClient, budget: dict[str, Any], usage: dict[str, Any], dimension: str
) -> None:
    agent_id = await external(api, budget=budget)
    await begin(api, agent_id)
    await end(api, agent_id, 1, output="spent", usage=usage)
    refused = await api.post(f"/agents/{agent_id}/turns", json={"prompt": "more"})
    error = error_of(refused, 409, "budget_exhausted")
    assert error["details"]["dimension"] == dimension
    held = await agent(api, agent_id)
    assert (held["state"], held["reason"]) == ("blocked", "budget-exhausted")
    again = await api.post(f"/agents/{agent_id}/turns", json={"prompt": "more"})
    error_of(again, 409, "budget_exhausted")  # still held on its budget: told as the budget
    raised = {"answer": "budget", "budget": {"maxTokens": None, "maxCostUsd": None}}
    answer = await api.post(f"/decisions/{held['decision']}", json=raised)
    assert answer.status_code == 200, answer.text
    assert (await begin(api, agent_id))["turn"] == 2


async def test_an_unpriced_turn_counts_as_unpriced(api: httpx.AsyncClient) -> None:
    agent_id = await external(api)
    await begin(api, agent_id)
    ended = await end(api, agent_id, 1, output="x", usage={"tokens": 7, "costUsd": None})
    assert ended["usage"] == {"tokens": 7, "costUsd": None}
    assert (await agent(api, agent_id))["usage"]["unpricedTurns"] == 1


# --- what the daemon does with an external agent ------------------------------------------------


async def test_a_busy_agent_refuses_a_second_turn_retryably(api: httpx.AsyncClient) -> None:
    agent_id = await external(api)
    await begin(api, agent_id)
    error = error_of(
        await api.post(f"/agents/{agent_id}/turns", json={"prompt": "x"}), 409, "agent_busy"
    )
    assert error["retryable"] is True
    prompted = await api.post(f"/agents/{agent_id}/prompt", json={"text": "x"})
    error_of(prompted, 409, "agent_external")  # told why, not to retry


async def test_stop_interrupts_the_open_turn_and_refuses_later_ones(api: httpx.AsyncClient) -> None:
    agent_id = await external(api)
    await begin(api, agent_id)
    stopped = await api.post(f"/agents/{agent_id}/stop", json={"why": "enough"})
    assert stopped.status_code == 202, stopped.text
    ended = await end(api, agent_id, 1, output="finished anyway", usage={"tokens": 3})
    assert ended["outcome"] == "interrupted"
    assert ended["agent"]["state"] == "stopped"
    error_of(
        await api.post(f"/agents/{agent_id}/turns", json={"prompt": "x"}), 409, "agent_not_live"
    )

    restarted = await api.post(f"/agents/{agent_id}/restart", json={})
    assert restarted.status_code == 202, restarted.text
    assert restarted.json()["turn"] is None  # its process begins its turns
    assert (await agent(api, agent_id))["state"] == "idle"
    assert (await begin(api, agent_id))["turn"] == 2


async def test_the_notices_to_an_external_parent_come_in_front_of_its_next_turn(
    api: httpx.AsyncClient,
) -> None:
    parent = await external(api, name="lead")
    child = await external(api, name="helper", parent=parent, notifyOn=["failed"])
    await fail_turn(api, child)
    begun = await begin(api, parent, "what next?")
    assert begun["text"].startswith("[corral] notices since your last turn:")
    assert begun["text"].endswith("what next?")
    assert "helper" in begun["text"]


async def test_the_remaining_budget_is_the_tightest_of_the_agents_and_its_ancestors(
    api: httpx.AsyncClient,
) -> None:
    parent = await external(api, name="lead", budget={"maxCostUsd": 1.0, "maxTokens": 500})
    await begin(api, parent)
    await end(api, parent, 1, usage={"tokens": 200, "costUsd": 0.25})
    child = await external(api, name="helper", parent=parent, budget={"maxCostUsd": 2.0})
    begun = await begin(api, child)
    assert begun["remaining"] == {"tokens": 300, "costUsd": 0.75, "deadlineS": None}


# --- tokens -----------------------------------------------------------------------------------


async def test_an_agents_token_reports_its_own_turns_only(door: FrontDoor) -> None:
    async with door.client(door.app(), **OPERATOR) as api:
        lead = await external(api, name="lead")
        helper = await external(api, name="helper", parent=lead)
    async with door.agent_client(helper) as own:
        assert (await begin(own, helper))["turn"] == 1
        assert (await end(own, helper, 1, output="mine"))["outcome"] == "succeeded"
    async with door.agent_client(lead) as parents:
        refused = await parents.post(f"/agents/{helper}/turns", json={"prompt": "x"})
        assert "beginning the turns of agent" in error_of(refused, 403, "out_of_scope")["message"]
        ending = await parents.post(f"/agents/{helper}/turns/1/end", json={"outcome": "ok"})
        error_of(ending, 403, "out_of_scope")
    async with door.agent_client(helper) as child:
        beyond = await child.post(f"/agents/{lead}/turns", json={"prompt": "x"})
        error_of(beyond, 403, "out_of_scope")


# --- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"outcome": "maybe"}, "outcome"),
        ({}, "outcome"),
        ({"outcome": "ok", "usage": {"tokens": -1}}, "usage.tokens"),
        ({"outcome": "ok", "usage": {"tokens": 1.5}}, "usage.tokens"),
        ({"outcome": "ok", "usage": {"costUsd": -0.01}}, "usage.costUsd"),
        ({"outcome": "ok", "usage": {"tokens": True}}, "usage.tokens"),
        ({"outcome": "ok", "error": {"message": "x"}}, "error"),
        ({"outcome": "failed", "output": "x"}, "output"),
        ({"outcome": "failed", "error": {"code": "x"}}, "error.message"),
        ({"outcome": "ok", "extra": 1}, "extra"),
    ],
)
async def test_a_bad_end_is_refused_typed_and_the_turn_stays_open(
    api: httpx.AsyncClient, body: dict[str, Any], field: str
) -> None:
    agent_id = await external(api)
    await begin(api, agent_id)
    refused = await api.post(f"/agents/{agent_id}/turns/1/end", json=body)
    error = error_of(refused, 400, "invalid_request")
    assert field in {p["field"] for p in error["details"]["problems"]}, error
    assert (await agent(api, agent_id))["turnInFlight"] == 1
    assert (await end(api, agent_id, 1))["outcome"] == "succeeded"


async def test_turns_that_are_not_open_and_bad_begins_are_refused_typed(
    api: httpx.AsyncClient, door: FrontDoor
) -> None:
    agent_id = await external(api)
    error_of(
        await api.post(f"/agents/{agent_id}/turns/1/end", json={"outcome": "ok"}),
        404,
        "turn_not_found",
    )
    await begin(api, agent_id)
    error_of(
        await api.post(f"/agents/{agent_id}/turns/2/end", json={"outcome": "ok"}),
        404,
        "turn_not_found",
    )
    bad = await api.post(f"/agents/{agent_id}/turns/0/end", json={"outcome": "ok"})
    error_of(bad, 400, "invalid_request")
    error_of(
        await api.post(f"/agents/{agent_id}/turns", json={"prompt": ""}), 400, "invalid_request"
    )
    error_of(await api.post("/agents/a_nobody/turns", json={"prompt": "x"}), 404, "agent_not_found")

    command = await door.spawn(name="cmd")
    refused = await api.post(f"/agents/{command}/turns", json={"prompt": "x"})
    assert "runs harness 'command'" in error_of(refused, 409, "not_external")["message"]
    error_of(
        await api.post(f"/agents/{command}/turns/1/end", json={"outcome": "ok"}),
        409,
        "not_external",
    )


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"prompt": "go"}, "prompt"),
        ({"env": {"A": "1"}}, "env"),
        ({"wake": True}, "wake"),
        ({"heartbeatS": 5}, "heartbeatS"),
        ({"command": ["x"]}, "command"),
    ],
)
async def test_an_external_spec_refuses_what_the_daemon_would_start(
    api: httpx.AsyncClient, extra: dict[str, Any], field: str
) -> None:
    answer = await api.post("/agents", json={"name": "x", "harness": "external", **extra})
    error = error_of(answer, 400, "invalid_spec")
    assert field in {p["field"] for p in error["details"]["problems"]}, error


# --- time -------------------------------------------------------------------------------------


async def test_a_turn_not_reported_within_its_timeout_fails_as_timed_out(
    make_service: MakeService, sqlite_store: SQLiteStore
) -> None:
    clock = FakeClock(datetime(2026, 1, 1, tzinfo=UTC))
    service = await make_service(sqlite_store, clock=clock)
    spawned = await service.spawn({"name": "x", "harness": "external", "turnTimeoutS": 30})
    agent_id = spawned.body["id"]
    await service.begin_turn(agent_id, "go")

    def timed_out() -> bool:
        # Past the limit each time it is asked, until the turn's timer (armed once its task
        # runs) has seen it.
        clock.advance(31)
        return bool(service.get(agent_id)["state"] == "failed")

    await settle(timed_out)
    assert "turn timed out after 30 s" in service.get(agent_id)["lastError"]


async def test_a_restarted_daemon_takes_up_an_open_turn_and_waits_for_its_report(
    tmp_path: Path, make_service: MakeService, open_sqlite: Any
) -> None:
    store = await open_sqlite()
    first = await make_service(store)
    agent_id = (await first.spawn({"name": "x", "harness": "external"})).body["id"]
    await first.begin_turn(agent_id, "go")
    await first.close()
    await store.close()

    again = await open_sqlite()
    second: AgentService = await make_service(again)
    assert second.get(agent_id)["state"] == "running"  # not interrupted: taken up
    app = create_app(second)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=LOCAL_URL) as api:
        ended = await end(api, agent_id, 1, output="done across a restart")
    assert ended["outcome"] == "succeeded"
    assert second.get(agent_id)["lastOutput"] == "done across a restart"
