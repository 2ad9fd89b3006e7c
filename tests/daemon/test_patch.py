"""PATCH /agents/{id}: a live agent's budget, notifyOn and guardrails change, strictly
validated, recorded with who and why; an agent's token only tightens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.daemon import SQLiteStore, Store
from corral.daemon._patch import loosens
from corral.daemon.stores import PostgresStore
from tests.daemon.conftest import MakeService
from tests.support.front_door import DAEMON_TOKEN, FrontDoor
from tests.support.polling import settle

BLOCK_DEPLOY = {"match": "deploy", "verdict": "block", "reason": "no deploys today"}


def operator(door: FrontDoor) -> httpx.AsyncClient:
    return door.client(door.app(), authorization=f"Bearer {DAEMON_TOKEN}")


async def events_of(door: FrontDoor, agent_id: str, kind: str) -> list[dict[str, Any]]:
    found = await door.service.events(0, agent_id=agent_id, limit=1000)
    return [e.data for e in found if e.type == kind]


async def test_one_patch_changes_budget_notify_on_and_guardrails_recorded_with_who_and_why(
    scoped_front: FrontDoor,
) -> None:
    door = scoped_front
    lead = await door.spawn(name="lead")
    child = await door.spawn(name="w", parent=lead)
    body = {
        "budget": {"maxTurns": 4},
        "notifyOn": ["done", "failed"],
        "guardrails": [BLOCK_DEPLOY],
        "why": "tighter for the release",
        "by": "ana",
    }
    async with operator(door) as client:
        answer = await client.patch("/agents/w", json=body)  # by name
    assert answer.status_code == 200, answer.text
    rec = answer.json()
    assert rec["id"] == child
    assert rec["budget"]["maxTurns"] == 4
    assert rec["spec"]["notifyOn"] == ["done", "failed"]
    assert rec["spec"]["guardrails"][0]["match"] == "deploy"
    [changed] = await events_of(door, child, "agent.spec_changed")
    # The token's name is who; the "by" it sent is kept as a note.
    assert (changed["by"], changed["why"], changed["note"]) == (
        "operator",
        "tighter for the release",
        "ana",
    )
    assert changed["previous"] == {"notifyOn": [], "guardrails": []}
    assert changed["loosens"] is False
    [budget] = await events_of(door, child, "agent.budget_changed")
    assert budget["by"] == "operator"
    # The new rules apply to its next check; the log rebuilds the same record.
    verdict = await door.service.check_action(child, "deploy web")
    assert verdict.verdict == "blocked"
    assert (await door.store.replay()).snapshot() == door.store.state.snapshot()


async def test_a_changed_notify_on_tells_the_parent(front: FrontDoor) -> None:
    lead = await front.spawn(name="lead")
    child = await front.spawn(name="w", parent=lead)
    await front.api.patch(child, {"notifyOn": ["done"]}, why="tell me")
    await front.service.prompt(child, "go")
    await front.settled(child, "idle")
    await settle(lambda: any(n["kind"] == "done" for n in front.service.inbox(lead)))


async def test_bodies_are_validated_strictly(front: FrontDoor) -> None:
    root = await front.spawn(name="root")
    child = await front.spawn(name="w", parent=root)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"why": "x", "name": "other"}, "name"),
        ({"why": "x", "notifyOn": ["often"]}, "notifyOn[0]"),
        ({"why": "x", "guardrails": [{"match": "x", "verdict": "maybe"}]}, "guardrails[0].verdict"),
        ({"why": "x", "budget": {}}, "budget"),
        ({"why": "x"}, "(body)"),
        ({"notifyOn": ["done"]}, "why"),
    ]
    async with front.client() as client:
        for body, field in cases:
            answer = await client.patch(f"/agents/{child}", json=body)
            assert answer.status_code == 400, (body, answer.text)
            error = answer.json()["error"]
            assert error["code"] == "invalid_request", body
            assert field in {p["field"] for p in error["details"]["problems"]}, (body, error)
        orphan = await client.patch(f"/agents/{root}", json={"why": "x", "notifyOn": ["done"]})
        assert orphan.status_code == 400
        assert "needs a parent" in orphan.text
        await front.service.stop(child)
        ended = await client.patch(f"/agents/{child}", json={"why": "x", "notifyOn": ["done"]})
        assert ended.status_code == 409
        assert ended.json()["error"]["code"] == "agent_not_live"
    assert front.service.get(child)["spec"]["notifyOn"] == []


async def test_a_key_replays_a_patch_and_refuses_another(front: FrontDoor) -> None:
    lead = await front.spawn(name="lead")
    child = await front.spawn(name="w", parent=lead)
    body = {"notifyOn": ["done"], "why": "x", "idempotencyKey": "k1"}
    async with front.client() as client:
        first = await client.patch(f"/agents/{child}", json=body)
        again = await client.patch("/agents/w", json=body)  # the name: the same command
        other = await client.patch(f"/agents/{child}", json=body | {"notifyOn": ["failed"]})
    assert first.status_code == again.status_code == 200
    assert again.headers["Idempotency-Replayed"] == "true"
    assert other.status_code == 422
    assert len(await events_of(front, child, "agent.spec_changed")) == 1


async def test_an_agents_token_only_tightens(scoped_front: FrontDoor) -> None:
    door = scoped_front
    lead = await door.spawn(name="lead")
    child = await door.spawn(name="w", parent=lead, notifyOn=["failed"], guardrails=[BLOCK_DEPLOY])
    rules = door.service.get(child)["spec"]["guardrails"]
    warn = {"match": "rm -rf", "verdict": "warn"}
    async with door.agent_client(lead) as client:
        tighter = await client.patch(
            "/agents/w",
            json={"notifyOn": ["failed", "done"], "guardrails": [*rules, warn], "why": "care"},
        )
        assert tighter.status_code == 200, tighter.text
        rules = tighter.json()["spec"]["guardrails"]
        for loose in (
            {"notifyOn": ["done"]},
            {"guardrails": rules[1:]},
            {"guardrails": [*rules, {"match": "deploy", "verdict": "allow"}]},
            {"guardrails": [*rules, {"guardrail": "corral.guard:Anything"}]},
        ):
            answer = await client.patch("/agents/w", json=loose | {"why": "x"})
            assert answer.status_code == 403, (loose, answer.text)
            assert answer.json()["error"]["code"] == "out_of_scope"
    [changed] = await events_of(door, child, "agent.spec_changed")
    assert changed["by"] == lead  # an agent acts in its own name
    assert door.service.get(child)["spec"]["guardrails"] == rules


def test_what_loosens() -> None:
    old = {"notifyOn": ["done"], "guardrails": [BLOCK_DEPLOY]}
    assert loosens(old, {"notifyOn": ["done", "failed"]}) is None
    assert loosens(old, {"notifyOn": []}) == "removing notifyOn kinds ['done']"
    assert loosens(old, {"guardrails": [BLOCK_DEPLOY, {"verdict": "ask"}]}) is None
    assert "reordering" in str(loosens(old, {"guardrails": []}))
    assert "'allow'" in str(loosens(old, {"guardrails": [BLOCK_DEPLOY, {"verdict": "allow"}]}))
    assert "custom" in str(loosens(old, {"guardrails": [BLOCK_DEPLOY, {"guardrail": "m:C"}]}))


@pytest.mark.parametrize(
    "kind", [pytest.param("sqlite"), pytest.param("postgres", marks=pytest.mark.postgres)]
)
async def test_a_patched_spec_is_kept_by_either_store_and_read_by_another_service(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, make_service: MakeService
) -> None:
    def open_one() -> Store:
        if kind == "sqlite":
            return SQLiteStore(tmp_path / "c.db")
        return PostgresStore(request.getfixturevalue("postgres_dsn"))

    store = open_one()
    await store.open()
    other = open_one()
    try:
        service = await make_service(store)
        lead = await service.spawn({"name": "lead", "harness": "command", "command": ["w"]})
        child = await service.spawn(
            {"name": "w", "harness": "command", "command": ["w"], "parent": lead.body["id"]}
        )
        agent_id = child.body["id"]
        assert (await service.check_action(agent_id, "deploy web")).verdict == "allowed"
        await service.patch(agent_id, {"guardrails": [BLOCK_DEPLOY]}, by="ana", why="freeze")
        assert (await service.check_action(agent_id, "deploy web")).verdict == "blocked"
        await other.open()
        assert other.state.snapshot() == store.state.snapshot()
        assert (await other.replay()).snapshot() == store.state.snapshot()
        assert other.state.agents[agent_id]["spec"]["guardrails"][0]["match"] == "deploy"
    finally:
        await other.close()
        await store.close()
