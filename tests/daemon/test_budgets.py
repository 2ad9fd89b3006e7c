"""Budgets that hold: an openai agent never starts a call it cannot pay for, a turn that
stops on its budget holds the agent whatever its policy, and a person can raise a budget."""

from __future__ import annotations

from typing import Any

import pytest
from mcp import Client

from corral.daemon import (
    AgentBudgetExhaustedError,
    AgentNotLiveError,
    AgentService,
    InvalidSpecError,
    OpenAIHarness,
    SQLiteStore,
    TurnFailedError,
    build_mcp_server,
)
from tests.daemon.conftest import MakeService
from tests.support.front_door import FrontDoor
from tests.support.harness import ScriptedHarness
from tests.support.openai_server import OpenAIServer, completion
from tests.support.polling import settle

PRICE = {"inputPerMtokUsd": 1.0, "outputPerMtokUsd": 2.0}


def openai_spec(server: OpenAIServer, **fields: Any) -> dict[str, Any]:
    options = fields.pop("openai", {})
    return {
        "name": "o",
        "harness": "openai",
        "openai": {"baseUrl": server.base_url, "model": "test-model", **options},
        **fields,
    }


@pytest.fixture
async def service(make_service: MakeService, sqlite_store: SQLiteStore) -> AgentService:
    return await make_service(sqlite_store, harnesses={"openai": OpenAIHarness()})


async def until_settled(service: AgentService, agent_id: str) -> dict[str, Any]:
    await settle(lambda: service.get(agent_id)["state"] != "running", within_s=10)
    return service.get(agent_id)


@pytest.mark.parametrize(
    "policy", [{}, {"onFailure": "ask"}, {"onFailure": "retry", "maxRetries": 2}]
)
async def test_a_dollar_budget_without_a_price_holds_the_agent_before_any_call(
    service: AgentService, openai_server: OpenAIServer, policy: dict[str, Any]
) -> None:
    spec = openai_spec(openai_server, prompt="go", budget={"maxCostUsd": 0.0025}, **policy)
    agent_id = (await service.spawn(spec)).body["id"]
    rec = await until_settled(service, agent_id)
    assert (rec["state"], rec["reason"], rec["dimension"]) == (
        "blocked",
        "budget-exhausted",
        "cost_usd",
    )
    assert "its cost is unknown" in rec["error"]
    assert openai_server.requests == []
    assert rec["turns"] == 1  # no retry: a bigger budget is what it needs


@pytest.mark.parametrize("policy", [{}, {"onFailure": "ask"}])
async def test_money_running_out_mid_turn_holds_the_agent_and_never_overspends(
    service: AgentService, openai_server: OpenAIServer, policy: dict[str, Any]
) -> None:
    # The first turn spends $0.0021; the second can afford a cap of about 150 tokens.
    openai_server.enqueue(completion("first", usage=(100, 1000)))
    spec = openai_spec(
        openai_server, openai={"price": PRICE}, prompt="go", budget={"maxCostUsd": 0.0025}, **policy
    )
    agent_id = (await service.spawn(spec)).body["id"]
    rec = await until_settled(service, agent_id)
    assert rec["state"] == "idle"
    openai_server.enqueue(completion("second", usage=(100, 5000)))  # a server past its cap
    await service.prompt(agent_id, "more")
    rec = await until_settled(service, agent_id)
    cap = openai_server.requests[1].json["max_tokens"]
    assert cap < 200
    assert (rec["state"], rec["reason"], rec["dimension"]) == (
        "blocked",
        "budget-exhausted",
        "cost_usd",
    )
    # The server ignored the cap: what it charged is counted, and no call starts again.
    with pytest.raises(AgentBudgetExhaustedError, match="PATCH /agents/"):
        await service.prompt(agent_id, "and more")
    assert len(openai_server.requests) == 2


async def test_a_held_agent_that_a_count_shows_room_for_still_takes_no_prompt(
    service: AgentService, openai_server: OpenAIServer
) -> None:
    spec = openai_spec(
        openai_server,
        openai={"price": PRICE, "modelOptions": {"max_tokens": 4000}},
        prompt="go",
        budget={"maxCostUsd": 0.001},
    )
    agent_id = (await service.spawn(spec)).body["id"]
    rec = await until_settled(service, agent_id)
    assert (rec["reason"], rec["usage"]["costUsd"]) == ("budget-exhausted", 0.0)
    assert "could spend up to" in rec["error"]
    with pytest.raises(AgentBudgetExhaustedError) as info:
        await service.prompt(agent_id)
    assert info.value.details["dimension"] == "cost_usd"
    assert service.get(agent_id)["turns"] == 1
    assert openai_server.requests == []


async def test_a_turn_cut_short_by_the_agents_deadline_holds_it_whatever_the_policy(
    make_service: MakeService, sqlite_store: SQLiteStore, harness: ScriptedHarness
) -> None:
    service = await make_service(sqlite_store)
    harness.script("w", TurnFailedError("turn timed out after 100 s", timeout_s=100.0))
    spec = {"name": "w", "harness": "command", "command": ["x"], "prompt": "go"}
    agent_id = (await service.spawn({**spec, "budget": {"deadlineS": 100}})).body["id"]
    rec = await until_settled(service, agent_id)
    assert (rec["state"], rec["reason"], rec["dimension"]) == (
        "blocked",
        "budget-exhausted",
        "deadline_s",
    )
    # A turn timeout of its own (shorter than what is left of the deadline) stays a failure.
    harness.script("v", TurnFailedError("turn timed out after 5 s", timeout_s=5.0))
    other = (
        await service.spawn({**spec, "name": "v", "turnTimeoutS": 5, "budget": {"deadlineS": 100}})
    ).body["id"]
    assert (await until_settled(service, other))["state"] == "failed"


# --- raising a budget: PATCH /agents/{id}, corral budget, agent_budget ----------------------


async def held_agent(door: FrontDoor, **spec: Any) -> str:
    """An agent held budget-exhausted on its turns: one turn of one allowed."""
    agent_id = await door.spawn(name="w", prompt="go", budget={"maxTurns": 1}, **spec)
    await door.settled(agent_id, "idle")
    with pytest.raises(AgentBudgetExhaustedError, match="PATCH /agents/"):
        await door.service.prompt(agent_id, "more")
    assert door.service.get(agent_id)["reason"] == "budget-exhausted"
    return agent_id


async def test_raising_a_budget_releases_the_held_agent_with_who_and_why(front: FrontDoor) -> None:
    agent_id = await held_agent(front)
    (decision,) = front.service.decisions()
    assert (decision["kind"], decision["answers"]) == ("budget_exhausted", ["budget", "stop"])
    result = await front.service.change_budget(
        agent_id, {"maxTurns": 3, "maxCostUsd": 5}, by="ana", why="worth it"
    )
    assert result.status == 200
    rec = result.body
    assert (rec["state"], rec["reason"]) == ("idle", "budget-raised")
    assert "dimension" not in rec
    assert rec["budget"] == {"maxTokens": None, "maxCostUsd": 5.0, "maxTurns": 3, "deadlineS": None}
    assert rec["spec"]["budget"]["maxTurns"] == 1  # the spec stays what was given
    assert front.service.decisions() == []
    (resolution,) = front.service.resolutions()
    assert (resolution["answer"], resolution["by"], resolution["why"]) == (
        "budget",
        "ana",
        "worth it",
    )
    (changed,) = [
        e
        for e in await front.service.events(0, agent_id=agent_id)
        if e.type == "agent.budget_changed"
    ]
    assert changed.data["previous"]["maxTurns"] == 1
    assert (changed.data["by"], changed.data["why"]) == ("ana", "worth it")
    await front.service.prompt(agent_id, "more")
    await front.settled(agent_id, "idle")
    assert front.harness.prompts(agent_id) == ["go", "more"]
    replayed = await front.store.replay()
    assert replayed.snapshot() == front.store.state.snapshot()
    assert replayed.agents[agent_id]["budget"]["maxTurns"] == 3


async def test_a_change_that_leaves_no_room_keeps_the_agent_held(front: FrontDoor) -> None:
    agent_id = await held_agent(front)
    rec = (await front.service.change_budget(agent_id, {"maxCostUsd": 9}, by="ana")).body
    assert (rec["state"], rec["reason"]) == ("blocked", "budget-exhausted")
    rec = (await front.service.change_budget(agent_id, {"maxTurns": None}, by="ana")).body
    assert rec["state"] == "idle"  # null: unlimited


async def test_a_budget_below_what_is_spent_holds_the_agent_at_its_next_prompt(
    front: FrontDoor,
) -> None:
    agent_id = await front.spawn(name="w", prompt="go")
    await front.settled(agent_id, "idle")
    rec = (await front.service.change_budget(agent_id, {"maxTurns": 0}, by="ana")).body
    assert rec["state"] == "idle"
    with pytest.raises(
        AgentBudgetExhaustedError, match="turns budget exhausted: used 1 of a limit of 0"
    ):
        await front.service.prompt(agent_id, "more")


async def test_bad_changes_are_refused_listing_every_problem(front: FrontDoor) -> None:
    agent_id = await front.spawn(name="w")
    with pytest.raises(InvalidSpecError, match="must change at least one of maxTokens"):
        await front.service.change_budget(agent_id, {}, by="ana")
    with pytest.raises(InvalidSpecError) as caught:
        await front.service.change_budget(agent_id, {"maxTurns": -1, "bogus": 1}, by="ana")
    assert [p["field"] for p in caught.value.problems] == ["budget.bogus", "budget.maxTurns"]
    await front.service.stop(agent_id)
    with pytest.raises(AgentNotLiveError):
        await front.service.change_budget(agent_id, {"maxTurns": 1}, by="ana")


async def test_patch_over_http_with_typed_errors_and_an_openapi_body(front: FrontDoor) -> None:
    agent_id = await held_agent(front)
    async with front.client() as client:
        body = {"budget": {"maxTurns": 2}, "by": "ana", "why": "go on", "idempotencyKey": "b1"}
        answer = await client.patch(f"/agents/{agent_id}", json=body)
        assert answer.status_code == 200, answer.text
        assert answer.json()["state"] == "idle"
        again = await client.patch(f"/agents/{agent_id}", json=body)
        assert again.headers["Idempotency-Replayed"] == "true"
        missing = await client.patch(f"/agents/{agent_id}", json={"budget": {"maxTurns": "x"}})
        assert missing.status_code == 400
        problems = {p["field"] for p in missing.json()["error"]["details"]["problems"]}
        assert {"why", "budget.maxTurns"} <= problems
        unknown = await client.patch("/agents/a_ffffffff", json=body | {"idempotencyKey": "b2"})
        assert unknown.json()["error"]["code"] == "agent_not_found"
        document = (await client.get("/openapi.json")).json()
    operation = document["paths"]["/agents/{agent_id}"]["patch"]
    schema = operation["requestBody"]["content"]["application/json"]["schema"]
    assert schema == {"$ref": "#/components/schemas/PatchBody"}
    assert {"400", "403", "404", "409"} <= set(operation["responses"])


async def test_an_agents_token_may_lower_budgets_in_its_reach_never_raise_one(
    scoped_front: FrontDoor,
) -> None:
    door = scoped_front
    parent = await door.spawn(name="boss", budget={"maxCostUsd": 1.0})
    child = await door.spawn(name="w", parent=parent, budget={"maxCostUsd": 1.0})
    async with door.agent_client(parent) as client:
        for target in (parent, child):
            raised = await client.patch(
                f"/agents/{target}", json={"budget": {"maxCostUsd": 2}, "by": parent, "why": "more"}
            )
            assert raised.status_code == 403
            assert raised.json()["error"]["code"] == "out_of_scope"
            assert "raising a budget" in raised.json()["error"]["message"]
        unlimited = await client.patch(
            f"/agents/{child}",
            json={"budget": {"maxTurns": None, "maxCostUsd": None}, "by": parent, "why": "x"},
        )
        assert unlimited.status_code == 403
        lowered = await client.patch(
            f"/agents/{child}", json={"budget": {"maxCostUsd": 0.5}, "by": parent, "why": "less"}
        )
        assert lowered.status_code == 200
        assert lowered.json()["budget"]["maxCostUsd"] == 0.5
        other = await client.patch(
            f"/agents/{child}", json={"budget": {"maxCostUsd": 0.4}, "by": "ana", "why": "less"}
        )
        assert other.status_code == 403
    async with door.agent_client(child) as client:
        up = await client.patch(
            f"/agents/{parent}", json={"budget": {"maxCostUsd": 0.1}, "by": child, "why": "x"}
        )
        assert up.status_code == 403  # an ancestor is out of its reach
    assert door.service.get(parent)["spec"]["budget"]["maxCostUsd"] == 1.0
    assert "budget" not in door.service.get(parent)


async def test_the_mcp_tool_changes_a_budget(front: FrontDoor) -> None:
    agent_id = await held_agent(front)
    rec = await front.api.budget(agent_id, {"maxTurns": 5}, by="ana", why="go on")
    assert rec["state"] == "idle"
    async with Client(build_mcp_server(front.api)) as client:
        result = await client.call_tool(
            "agent_budget",
            {"agentId": agent_id, "budget": {"maxTurns": 6}, "by": "ana", "why": "more"},
        )
    assert not result.is_error
    assert front.service.get(agent_id)["budget"]["maxTurns"] == 6
