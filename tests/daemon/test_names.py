"""Agents addressed by name: resolution (ids win, a single live holder wins, otherwise the
id is asked for), names unique among a run's live agents, and an agent's token learning
nothing beyond its reach through a name."""

from __future__ import annotations

from typing import Any, cast

import pytest
from mcp import Client

from corral.daemon import InvalidSpecError, build_mcp_server
from corral.daemon._errors import AmbiguousNameError, NameTakenError
from corral.daemon._names import MAX_CANDIDATES, check_spawn, resolve
from corral.daemon._records import AgentRecord
from tests.support.front_door import FrontDoor


def rec(agent_id: str, name: str, run: str = "r1", state: str = "idle", **more: Any) -> AgentRecord:
    found = {"id": agent_id, "name": name, "runId": run, "state": state, "parent": None}
    return cast(AgentRecord, found | more)


def agents(*recs: AgentRecord) -> dict[str, AgentRecord]:
    return {r["id"]: r for r in recs}


# --- the rules, on records ------------------------------------------------------------------


def test_a_unique_name_resolves_and_an_unknown_reference_passes_through() -> None:
    found = agents(rec("a_00000001", "ask"), rec("a_00000002", "other"))
    assert resolve(found, "ask") == "a_00000001"
    assert resolve(found, "a_00000002") == "a_00000002"
    assert resolve(found, "nobody") == "nobody"  # answered as any unknown id is


def test_an_id_wins_over_a_name_that_looks_like_it() -> None:
    # An agent of an older log may be named like another's id: the id still wins.
    found = agents(rec("a_00000001", "a_00000002"), rec("a_00000002", "b"))
    assert resolve(found, "a_00000002") == "a_00000002"


def test_the_single_live_holder_wins_over_ended_ones() -> None:
    found = agents(
        rec("a_00000001", "ask", state="stopped"),
        rec("a_00000002", "ask", run="r2", state="failed"),
        rec("a_00000003", "ask", run="r3", state="running"),
    )
    assert resolve(found, "ask") == "a_00000003"
    # Only one holder, ended: it is the one.
    assert resolve(agents(rec("a_00000001", "ask", state="stopped")), "ask") == "a_00000001"


def test_several_live_holders_across_runs_ask_for_the_id_listing_them() -> None:
    found = agents(
        rec("a_00000001", "ask", createdAt="2025-01-01T00:00:00"),
        rec("a_00000002", "ask", run="r2", state="blocked", createdAt="2025-01-02T00:00:00"),
        rec("a_00000003", "ask", run="r3", state="stopped"),
    )
    with pytest.raises(AmbiguousNameError) as caught:
        resolve(found, "ask")
    error = caught.value
    assert error.code == "ambiguous_name"
    # The live ones are the candidates, newest first.
    assert [c["id"] for c in error.details["candidates"]] == ["a_00000002", "a_00000001"]
    assert error.details["candidates"][0]["runId"] == "r2"
    assert error.details["total"] == 2
    assert "a_00000002 (blocked, run r2)" in error.message


def test_several_ended_holders_ask_for_the_id_and_the_list_is_bounded() -> None:
    many = [rec(f"a_{i:08x}", "ask", run=f"r{i}", state="stopped") for i in range(25)]
    with pytest.raises(AmbiguousNameError) as caught:
        resolve(agents(*many), "ask")
    assert len(caught.value.details["candidates"]) == MAX_CANDIDATES
    assert caught.value.details["total"] == 25
    assert "and 15 more" in caught.value.message


def test_only_agents_in_reach_are_candidates() -> None:
    found = agents(rec("a_00000001", "ask"), rec("a_00000002", "ask", run="r2"))
    mine = {"a_00000002"}
    assert resolve(found, "ask", lambda a: a in mine) == "a_00000002"
    # Held only beyond its reach: as unknown as a name nobody holds.
    assert resolve(found, "ask", lambda a: False) == "ask"


def test_a_spawn_name_clashing_in_its_run_or_shaped_like_an_id_is_refused() -> None:
    found = agents(rec("a_00000001", "ask"), rec("a_00000002", "gone", state="stopped"))
    with pytest.raises(NameTakenError) as caught:
        check_spawn(found, "r1", "ask")
    assert caught.value.details == {"name": "ask", "run_id": "r1", "holder": "a_00000001"}
    assert "a_00000001" in caught.value.message
    check_spawn(found, "r2", "ask")  # another run
    check_spawn(found, "r1", "gone")  # its holder has ended
    with pytest.raises(InvalidSpecError) as shaped:
        check_spawn({}, "r1", "a_1f2e3d4c")
    assert shaped.value.problems[0]["field"] == "name"
    check_spawn({}, "r1", "a_1f2e3d4")  # not the shape of an id


# --- through the service and the HTTP API ------------------------------------------------------


async def test_a_clash_in_a_run_is_refused_with_the_holders_id(front: FrontDoor) -> None:
    root = await front.spawn(name="lead")
    child = await front.spawn(name="ask", parent=root)
    with pytest.raises(NameTakenError, match=child):
        await front.spawn(name="ask", parent=root)
    async with front.client() as client:
        answer = await client.post(
            "/agents", json={"name": "ask", "harness": "command", "command": ["w"], "parent": root}
        )
        assert answer.status_code == 409
        assert answer.json()["error"]["code"] == "name_taken"
        assert answer.json()["error"]["details"]["holder"] == child
        shaped = await client.post(
            "/agents", json={"name": "a_0123abcd", "harness": "command", "command": ["w"]}
        )
        assert shaped.status_code == 400
        assert shaped.json()["error"]["code"] == "invalid_spec"
    await front.service.stop(child)
    again = await front.spawn(name="ask", parent=root)  # the name is free again
    assert again != child


async def test_every_agent_route_takes_a_name(front: FrontDoor) -> None:
    root = await front.spawn(name="lead")
    child = await front.spawn(name="helper", parent=root)
    async with front.client() as client:
        shown = await client.get("/agents/helper")
        assert shown.status_code == 200, shown.text
        assert shown.json()["id"] == child
        assert (await client.get("/agents/helper/inbox")).json()["agentId"] == child
        assert (await client.get("/agents/helper/session")).json()["agentId"] == child
        listed = await client.get("/agents", params={"parent": "lead"})
        assert [a["id"] for a in listed.json()["agents"]] == [child]
        events = await client.get("/events", params={"agent": "helper", "format": "json"})
        assert {e["agentId"] for e in events.json()["events"]} == {child}
        prompted = await client.post("/agents/helper/prompt", json={"text": "go"})
        assert prompted.status_code == 202, prompted.text
        assert prompted.json()["id"] == child
        await front.settled(child, "idle")
        stopped = await client.post("/agents/helper/stop", json={"why": "done"})
        assert stopped.json()["id"] == child
        # A stopped holder and no live one: still the one agent of that name.
        assert (await client.get("/agents/helper")).json()["state"] == "stopped"
        unknown = await client.get("/agents/nobody")
        assert unknown.status_code == 404
        assert unknown.json()["error"]["code"] == "agent_not_found"


async def test_a_spawns_parent_may_be_a_name(front: FrontDoor, scoped_front: FrontDoor) -> None:
    root = await front.spawn(name="lead")
    spec = {"name": "w", "harness": "command", "command": ["w"], "parent": "lead"}
    async with front.client() as client:
        made = await client.post("/agents", json=spec | {"idempotencyKey": "s1"})
        again = await client.post("/agents", json=spec | {"parent": root, "idempotencyKey": "s1"})
    assert made.status_code == 201, made.text
    assert made.json()["parent"] == made.json()["spec"]["parent"] == root
    assert again.headers["Idempotency-Replayed"] == "true"  # the same command, by id
    door = scoped_front
    lead = await door.spawn(name="lead")
    mine = await door.spawn(name="mine", parent=lead)
    async with door.agent_client(mine) as client:
        beyond = await client.post("/agents", json=spec | {"name": "x"})  # parent "lead"
        assert beyond.status_code == 403
        under = await client.post("/agents", json=spec | {"parent": "mine"})
        assert under.status_code == 201, under.text
        assert under.json()["parent"] == mine


async def test_a_name_in_several_runs_asks_for_the_id(front: FrontDoor) -> None:
    first = await front.spawn(name="ask")
    second = await front.spawn(name="ask")  # a root: a run of its own
    async with front.client() as client:
        answer = await client.get("/agents/ask")
    assert answer.status_code == 409
    error = answer.json()["error"]
    assert error["code"] == "ambiguous_name"
    assert {c["id"] for c in error["details"]["candidates"]} == {first, second}
    await front.service.stop(first)
    async with front.client() as client:
        assert (await client.get("/agents/ask")).json()["id"] == second


async def test_an_agents_token_learns_nothing_beyond_its_reach_by_name(
    scoped_front: FrontDoor,
) -> None:
    door = scoped_front
    root = await door.spawn(name="lead")
    mine = await door.spawn(name="mine", parent=root)
    await door.spawn(name="sibling", parent=root)
    async with door.agent_client(mine) as client:
        assert (await client.get("/agents/mine")).json()["id"] == mine
        hidden = await client.get("/agents/sibling")
        unknown = await client.get("/agents/nobody")
        assert hidden.status_code == unknown.status_code == 403
        assert hidden.json()["error"]["code"] == unknown.json()["error"]["code"]
        assert hidden.json()["error"]["message"] == unknown.json()["error"]["message"].replace(
            "nobody", "sibling"
        )
        # A clash with an agent beyond its reach is refused without naming the holder.
        clash = await client.post(
            "/agents",
            json={"name": "sibling", "harness": "command", "command": ["w"], "parent": mine},
        )
        assert clash.status_code == 409
        assert clash.json()["error"]["details"]["holder"] is None


async def test_mcp_and_corral_tools_take_a_name(front: FrontDoor) -> None:
    root = await front.spawn(name="lead")
    child = await front.spawn(name="helper", parent=root)
    async with Client(build_mcp_server(front.api)) as client:
        result = await client.call_tool("agent_status", {"agentId": "helper"})
        assert not result.is_error
        assert result.structured_content is not None
        assert result.structured_content["id"] == child
        listed = await client.call_tool("agent_list", {"parent": "lead"})
        assert listed.structured_content is not None
        assert [a["id"] for a in listed.structured_content["agents"]] == [child]
    assert (await front.api.as_agent(root).get(child))["name"] == "helper"
    assert front.api.as_agent(child).resolve("lead") == "lead"  # beyond its reach
