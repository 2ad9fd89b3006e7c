"""Budgets across the tree, in process: a child gets no more than its ancestors have left (and
says so), every turn counts against the agent and each ancestor, an ancestor with no room
holds its descendants; a run's view and stopping a whole run."""

from __future__ import annotations

from typing import Any

import pytest

from corral.daemon import (
    AgentBudgetExhaustedError,
    AgentService,
    LocalApi,
    OutOfScopeError,
    SQLiteStore,
    TurnResult,
)
from corral.daemon._errors import RunNotFoundError
from corral.runtime import FakeClock
from tests.daemon.conftest import MakeService
from tests.support.front_door import FrontDoor
from tests.support.harness import ScriptedHarness
from tests.support.polling import settle


async def spawn(service: AgentService, name: str, **spec: Any) -> dict[str, Any]:
    spec = {"name": name, "harness": "command", "command": ["w"], **spec}
    return (await service.spawn(spec)).body


async def turn(service: AgentService, agent_id: str, text: str = "go") -> dict[str, Any]:
    """Prompt the agent and wait for the turn's outcome."""
    await service.prompt(agent_id, text)
    await service.settled(agent_id)
    return service.get(agent_id)


def spent(tokens: int, cost: float = 0.0) -> TurnResult:
    return TurnResult(output="ok", tokens=tokens, cost_usd=cost)


# --- capping at spawn ----------------------------------------------------------------------


async def test_a_child_asking_more_than_is_left_is_created_with_what_is_left_and_says_so(
    service: AgentService,
) -> None:
    root = await spawn(
        service, "root", budget={"maxTokens": 100, "maxTurns": 10, "maxCostUsd": 1.0}
    )
    child = await spawn(
        service, "child", parent=root["id"], budget={"maxTokens": 1000, "maxCostUsd": 0.5}
    )
    assert child["budget"] == {
        "maxTokens": 100,
        "maxCostUsd": 0.5,
        "maxTurns": 10,
        "deadlineS": None,
    }
    assert child["budgetCapped"] == [
        {"dimension": "maxTokens", "asked": 1000, "granted": 100},
        {"dimension": "maxTurns", "asked": None, "granted": 10},
    ]
    assert child["spec"]["budget"]["maxTokens"] == 1000  # the spec keeps what was asked
    (created,) = [
        e for e in await service.events(agent_id=child["id"]) if e.type == "agent.created"
    ]
    assert created.data["agent"]["budgetCapped"] == child["budgetCapped"]
    assert created.data["agent"]["budget"] == child["budget"]


async def test_a_child_within_what_is_left_and_a_root_get_what_they_ask(
    service: AgentService,
) -> None:
    root = await spawn(service, "root", budget={"maxTokens": 100})
    assert "budgetCapped" not in root
    assert "budget" not in root
    child = await spawn(service, "child", parent=root["id"], budget={"maxTokens": 60})
    assert "budgetCapped" not in child
    assert service.get(child["id"]).get("budget") is None  # the spec's is in force


async def test_a_childs_deadline_is_no_later_than_its_parents(
    make_service: MakeService, sqlite_store: SQLiteStore
) -> None:
    clock = FakeClock()
    service = await make_service(sqlite_store, clock=clock)
    root = await spawn(service, "root", budget={"deadlineS": 100})
    clock.advance(30)
    late = await spawn(service, "late", parent=root["id"], budget={"deadlineS": 1000})
    assert late["budget"]["deadlineS"] == 70
    assert late["budgetCapped"] == [{"dimension": "deadlineS", "asked": 1000, "granted": 70}]
    early = await spawn(service, "early", parent=root["id"], budget={"deadlineS": 10})
    assert "budgetCapped" not in early


async def test_a_child_of_a_spent_parent_is_created_held(
    service: AgentService, harness: ScriptedHarness
) -> None:
    root = await spawn(service, "root", budget={"maxTokens": 50})
    harness.script("root", spent(50))
    await turn(service, root["id"])
    child = await spawn(service, "child", parent=root["id"], prompt="go")
    assert child["budget"]["maxTokens"] == 0
    assert (child["state"], child["reason"], child["dimension"]) == (
        "blocked",
        "budget-exhausted",
        "tokens",
    )
    assert not [r for r in harness.requests if r.agent_id == child["id"]]


# --- usage counts up the tree ----------------------------------------------------------------


async def test_every_turn_counts_against_the_agent_and_each_ancestor(
    service: AgentService, harness: ScriptedHarness
) -> None:
    root = await spawn(service, "root")
    child = await spawn(service, "child", parent=root["id"])
    grandchild = await spawn(service, "grandchild", parent=child["id"])
    harness.script("grandchild", spent(40, 0.25))
    harness.script("child", spent(7))
    await turn(service, grandchild["id"])
    await turn(service, child["id"])
    r, c, g = (service.get(a["id"]) for a in (root, child, grandchild))
    assert (
        g["usage"]
        == g["treeUsage"]
        == {
            "tokens": 40,
            "costUsd": 0.25,
            "turns": 1,
            "unpricedTurns": 0,
        }
    )
    assert c["usage"]["tokens"] == 7
    assert (c["treeUsage"]["tokens"], c["treeUsage"]["turns"]) == (47, 2)
    assert r["usage"]["tokens"] == 0
    assert (r["treeUsage"]["tokens"], r["treeUsage"]["costUsd"]) == (47, 0.25)


async def test_tree_usage_is_rebuilt_from_the_log(
    make_service: MakeService, open_sqlite: Any, harness: ScriptedHarness, tmp_path: Any
) -> None:
    store = await open_sqlite(tmp_path / "a.db")
    service = await make_service(store)
    root = await spawn(service, "root")
    child = await spawn(service, "child", parent=root["id"])
    harness.script("child", spent(12))
    await turn(service, child["id"])
    from corral.daemon._state import replay

    rebuilt = replay(await service.events(limit=1000))
    assert rebuilt.agents[root["id"]]["treeUsage"] == service.get(root["id"])["treeUsage"]
    assert rebuilt.agents[root["id"]]["treeUsage"]["tokens"] == 12


async def test_the_harness_is_given_the_tightest_remaining_of_the_chain(
    service: AgentService, harness: ScriptedHarness
) -> None:
    root = await spawn(service, "root", budget={"maxTokens": 100, "maxCostUsd": 2.0})
    child = await spawn(service, "child", parent=root["id"], budget={"maxTokens": 90})
    sibling = await spawn(service, "sibling", parent=root["id"])
    harness.script("sibling", spent(30, 1.5))
    await turn(service, sibling["id"])
    await turn(service, child["id"])
    request = [r for r in harness.requests if r.agent_id == child["id"]][-1]
    assert request.remaining.max_tokens == 70  # the root's 100 less the sibling's 30
    assert request.remaining.max_cost_usd == pytest.approx(0.5)


# --- an ancestor with no room holds its descendants ---------------------------------------------


async def test_a_turn_an_ancestors_budget_leaves_no_room_for_holds_the_child_naming_it(
    service: AgentService, harness: ScriptedHarness
) -> None:
    root = await spawn(service, "root", budget={"maxTokens": 100})
    a = await spawn(service, "a", parent=root["id"])
    b = await spawn(service, "b", parent=root["id"])
    assert a["budget"]["maxTokens"] == b["budget"]["maxTokens"] == 100
    harness.script("a", spent(60))
    harness.script("b", spent(60))
    await turn(service, a["id"])
    await turn(service, b["id"])
    assert service.get(root["id"])["treeUsage"]["tokens"] == 120
    with pytest.raises(AgentBudgetExhaustedError) as info:
        await service.prompt(a["id"], "more")  # its own 60 of 100 has room; the root's not
    details = info.value.details
    assert (details["ancestor"], details["dimension"], details["limit"], details["used"]) == (
        root["id"],
        "tokens",
        100,
        120,
    )
    assert f"PATCH /agents/{root['id']}" in info.value.message
    held = service.get(a["id"])
    assert (held["state"], held["reason"], held["dimension"]) == (
        "blocked",
        "budget-exhausted",
        "tokens",
    )
    assert root["id"] in held["error"]
    decision = service.decision(held["decision"])
    assert (decision["kind"], decision["ancestor"]) == ("budget_exhausted", root["id"])
    # Raising the child's own budget does not help; raising the root's releases it.
    await service.change_budget(a["id"], {"maxTokens": 100}, by="alice", why="no")
    assert service.get(a["id"])["state"] == "blocked"
    await service.change_budget(root["id"], {"maxTokens": 1000}, by="alice", why="worth it")
    released = service.get(a["id"])
    assert (released["state"], released["reason"]) == ("idle", "budget-raised")
    assert service.decision(held["decision"])["answer"] == "budget"


async def test_a_retry_an_ancestors_budget_leaves_no_room_for_does_not_start(
    service: AgentService, harness: ScriptedHarness
) -> None:
    from tests.support.harness import fail

    root = await spawn(service, "root", budget={"maxTokens": 50})
    child = await spawn(
        service, "child", parent=root["id"], onFailure="retry", maxRetries=5, prompt="go"
    )
    harness.script("child", fail("boom", tokens=30), fail("boom", tokens=30), "never")
    await settle(lambda: service.get(child["id"])["state"] not in ("running",), within_s=10)
    await service.settled(child["id"])
    rec = service.get(child["id"])
    assert (rec["state"], rec["reason"]) == ("blocked", "budget-exhausted")
    assert rec["turns"] == 2


# --- a change of budget is capped too ------------------------------------------------------------


async def test_raising_a_childs_budget_past_its_parents_remaining_is_capped(
    service: AgentService, harness: ScriptedHarness
) -> None:
    root = await spawn(service, "root", budget={"maxTokens": 100})
    harness.script("root", spent(20))
    await turn(service, root["id"])
    child = await spawn(service, "child", parent=root["id"], budget={"maxTokens": 40})
    harness.script("child", spent(30))
    await turn(service, child["id"])
    # Root: 100 - (20 + 30) = 50 left; the child may reach its 30 spent plus those 50.
    after = (
        await service.change_budget(child["id"], {"maxTokens": 5000}, by="alice", why="more")
    ).body
    assert after["budget"]["maxTokens"] == 80
    assert after["budgetCapped"] == [{"dimension": "maxTokens", "asked": 5000, "granted": 80}]
    (changed,) = [
        e for e in await service.events(agent_id=child["id"]) if e.type == "agent.budget_changed"
    ]
    assert changed.data["capped"] == after["budgetCapped"]
    lowered = (
        await service.change_budget(child["id"], {"maxTokens": 60}, by="alice", why="less")
    ).body
    assert lowered["budget"]["maxTokens"] == 60
    assert "budgetCapped" not in lowered


# --- runs --------------------------------------------------------------------------------------


async def test_a_runs_view_shows_the_tree_usage_against_limits_and_the_headcount(
    service: AgentService, harness: ScriptedHarness
) -> None:
    root = await spawn(service, "root", budget={"maxTokens": 100}, spawnBudget={"maxAgents": 5})
    a = await spawn(service, "a", parent=root["id"])
    b = await spawn(service, "b", parent=root["id"])
    a1 = await spawn(service, "a1", parent=a["id"])
    harness.script("a1", spent(10))
    await turn(service, a1["id"])
    await service.stop(b["id"])
    view = service.run(root["runId"])
    assert (view["runId"], view["rootId"], view["top"]) == (root["runId"], root["id"], root["id"])
    assert view["headcount"] == {"active": 3, "paused": 0, "max": 5, "allowPreempt": True}
    shown = [(n["id"], n["depth"], n["state"]) for n in view["agents"]]
    assert shown == [
        (root["id"], 0, "idle"),
        (a["id"], 1, "idle"),
        (a1["id"], 2, "idle"),
        (b["id"], 1, "stopped"),
    ]
    top = view["agents"][0]
    assert (top["usage"]["tokens"], top["treeUsage"]["tokens"]) == (0, 10)
    assert top["budget"]["maxTokens"] == 100
    with pytest.raises(RunNotFoundError):
        service.run("nope")


async def test_an_agents_token_sees_its_own_subtree_of_its_own_run_only(
    service: AgentService,
) -> None:
    root = await spawn(service, "root")
    a = await spawn(service, "a", parent=root["id"])
    a1 = await spawn(service, "a1", parent=a["id"])
    await spawn(service, "b", parent=root["id"])
    other = await spawn(service, "other")
    api = LocalApi(service)
    view = await api.as_agent(a["id"]).run(root["runId"])
    assert view["top"] == a["id"]
    assert [n["id"] for n in view["agents"]] == [a["id"], a1["id"]]
    with pytest.raises(OutOfScopeError):
        await api.as_agent(a["id"]).run(other["runId"])
    assert len((await api.run(root["runId"]))["agents"]) == 4


async def test_stopping_a_run_stops_every_live_agent_children_first_with_one_reason(
    service: AgentService, harness: ScriptedHarness
) -> None:
    root = await spawn(service, "root")
    a = await spawn(service, "a", parent=root["id"])
    harness.script("a1", "hang")
    a1 = await spawn(service, "a1", parent=a["id"], prompt="go")
    b = await spawn(service, "b", parent=root["id"])
    await settle(lambda: a1["id"] in harness.running)
    other = await spawn(service, "other")
    result = await service.stop_run(
        root["runId"], by="alice", why="over budget", idempotency_key="k"
    )
    assert result.status == 202
    stopped = result.body["stopped"]
    assert stopped[0] == a1["id"]
    assert stopped[-1] == root["id"]
    assert set(stopped[1:3]) == {a["id"], b["id"]}
    for agent_id in stopped:
        assert service.get(agent_id)["state"] == "stopped"
    assert service.get(other["id"])["state"] == "idle"
    assert a1["id"] in harness.cancelled
    changes = [
        e
        for e in await service.events(limit=1000)
        if e.type == "agent.state_changed" and e.data["to"] == "stopped"
    ]
    assert [e.agent_id for e in changes] == stopped
    assert {(e.data["by"], e.data["why"], e.data["runStop"]) for e in changes} == {
        ("alice", "over budget", root["runId"])
    }
    again = await service.stop_run(
        root["runId"], by="alice", why="over budget", idempotency_key="k"
    )
    assert again.replayed
    assert again.body == result.body
    nothing = await service.stop_run(root["runId"], by="alice", why="again")
    assert nothing.body["stopped"] == []


async def test_an_agents_token_stops_only_a_run_it_is_the_root_of(
    service: AgentService,
) -> None:
    root = await spawn(service, "root")
    a = await spawn(service, "a", parent=root["id"])
    api = LocalApi(service)
    with pytest.raises(OutOfScopeError):
        await api.as_agent(a["id"]).stop_run(root["runId"])
    assert service.get(a["id"])["state"] == "idle"
    answer = await api.as_agent(root["id"]).stop_run(root["runId"], why="done")
    assert answer["stopped"] == [a["id"], root["id"]]
    with pytest.raises(RunNotFoundError):
        await api.stop_run("nope")


# --- over HTTP -----------------------------------------------------------------------------------


async def test_runs_over_http_view_stop_and_refusals(scoped_front: FrontDoor) -> None:
    door = scoped_front
    root = await door.spawn(name="root", budget={"maxTokens": 100})
    child = await door.spawn(name="child", parent=root, budget={"maxTokens": 1000})
    run_id = door.service.get(root)["runId"]
    async with door.client(door.app(), authorization=f"Bearer {door.token}") as api:
        answer = await api.get(f"/runs/{run_id}")
        assert answer.status_code == 200, answer.text
        assert [n["id"] for n in answer.json()["agents"]] == [root, child]
        missing = await api.get("/runs/nope")
        assert (missing.status_code, missing.json()["error"]["code"]) == (404, "run_not_found")
        paths = (await api.get("/openapi.json")).json()["paths"]
        assert {"/runs/{run_id}", "/runs/{run_id}/stop"} <= set(paths)
    async with door.agent_client(child) as as_child:
        refused = await as_child.post(f"/runs/{run_id}/stop", json={"why": "mine now"})
        assert (refused.status_code, refused.json()["error"]["code"]) == (403, "out_of_scope")
        seen = await as_child.get(f"/runs/{run_id}")
        assert [n["id"] for n in seen.json()["agents"]] == [child]
    async with door.agent_client(root) as as_root:
        stopped = await as_root.post(f"/runs/{run_id}/stop", json={"why": "done"})
        assert stopped.status_code == 202, stopped.text
        assert stopped.json()["stopped"] == [child, root]
    assert door.service.get(child)["state"] == "stopped"
