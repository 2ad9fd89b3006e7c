"""Budgets that hold: an openai agent never starts a call it cannot pay for, a turn that
stops on its budget holds the agent whatever its policy, and a person can raise a budget."""

from __future__ import annotations

from typing import Any

import pytest

from corral.daemon import (
    AgentBudgetExhaustedError,
    AgentService,
    OpenAIHarness,
    SQLiteStore,
    TurnFailedError,
)
from tests.daemon.conftest import MakeService
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
