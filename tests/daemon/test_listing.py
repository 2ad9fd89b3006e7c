"""Lean lists: summaries, filters, cursor paging under concurrent spawns, masked env values,
typed refusals of bad query values, and the event log's ?type= and ?run= filters."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import httpx
import pytest

from corral.daemon import _listing
from tests.support.front_door import FrontDoor

SECRET = "sk-very-secret-value"


def error_of(response: httpx.Response, field: str) -> str:
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_query"
    (problem,) = error["details"]["problems"]
    assert problem["field"] == field
    return str(problem["message"])


async def page_all(client: httpx.AsyncClient, limit: int, **query: str) -> list[str]:
    seen: list[str] = []
    cursor = None
    while True:
        params = {"limit": str(limit), **query, **({"cursor": cursor} if cursor else {})}
        page = (await client.get("/agents", params=params)).json()
        seen += [a["id"] for a in page["agents"]]
        cursor = page["nextCursor"]
        if cursor is None:
            return seen


async def test_a_list_shows_summaries_without_output_prompt_or_env_values(
    front: FrontDoor,
) -> None:
    front.harness.script("w", "x" * 100_000)
    agent = await front.spawn(name="w", prompt="p" * 500, env={"API_KEY": SECRET})
    await front.settled(agent, "idle")
    async with front.client() as client:
        listed = (await client.get("/agents")).json()
        shown = (await client.get(f"/agents/{agent}")).json()
        events = (await client.get("/events", params={"format": "json"})).text
    (summary,) = listed["agents"]
    assert listed["nextCursor"] is None
    assert not {"lastOutput", "lastPrompt", "spec"} & set(summary)
    assert summary["promptPreview"] == "p" * 79 + "…"
    assert (summary["state"], summary["turns"], summary["harness"]) == ("idle", 1, "command")
    assert len(json.dumps(listed)) < 2000
    # The record in full still has its output, but names its env variables only.
    assert shown["lastOutput"] == "x" * 100_000
    assert shown["spec"]["env"] == {"API_KEY": _listing.MASK}
    assert SECRET not in events
    assert SECRET not in json.dumps(front.service.list_agents())
    again = {"name": "again", "harness": "command", "command": ["w"], "env": {"K": SECRET}}
    assert SECRET not in json.dumps((await front.service.spawn(again)).body)


async def test_filters_by_state_run_parent_and_name(front: FrontDoor) -> None:
    lead = await front.spawn(name="lead")
    kids = [await front.spawn(name=f"k{i}", parent=lead) for i in range(3)]
    other = await front.spawn(name="k0")
    await front.service.stop(kids[2])
    run = front.service.get(lead)["runId"]
    async with front.client() as client:

        async def ids(**query: str) -> list[str]:
            return [a["id"] for a in (await client.get("/agents", params=query)).json()["agents"]]

        assert await ids(parent=lead) == kids
        assert await ids(run=run) == [lead, *kids]
        assert await ids(name="k0") == [kids[0], other]
        assert await ids(state="stopped") == [kids[2]]
        assert await ids(state="idle", parent=lead) == kids[:2]
        assert await ids(name="nobody") == []


@pytest.mark.parametrize(
    ("query", "field", "words"),
    [
        ({"limit": "0"}, "limit", ["1 to 1000", "got 0"]),
        ({"limit": "1001"}, "limit", ["1 to 1000", "got 1001"]),
        ({"limit": "many"}, "limit", ["integer", "'many'"]),
        ({"cursor": "not-a-cursor"}, "cursor", ["nextCursor", "'not-a-cursor'"]),
        ({"cursor": "W10"}, "cursor", ["nextCursor", "'W10'"]),  # base64 of []
        ({"cursor": "x" * 600}, "cursor", ["512", "600 characters"]),
        ({"state": ""}, "state", ["1 to 200", "''"]),
        ({"name": "n" * 300}, "name", ["200", "300 characters"]),
    ],
)
async def test_bad_query_values_are_refused_naming_the_parameter_limit_and_value(
    front: FrontDoor, query: dict[str, str], field: str, words: list[str]
) -> None:
    async with front.client() as client:
        message = error_of(await client.get("/agents", params=query), field)
    for word in words:
        assert word in message


async def test_paging_neither_repeats_nor_skips_while_agents_are_spawned(
    front: FrontDoor,
) -> None:
    # A property over random interleavings: pages of random sizes, with spawns (and stops)
    # between them; every agent there at the start is seen exactly once, nothing twice.
    rng = random.Random(13)
    async with front.client() as client:
        for _ in range(8):
            before = [a["id"] for a in await front.api.list_agents()]
            before += [await front.spawn(name="b") for _ in range(rng.randint(0, 12))]
            seen: list[str] = []
            cursor = None
            while True:
                params: dict[str, Any] = {"limit": rng.randint(1, 5)}
                if cursor:
                    params["cursor"] = cursor
                page = (await client.get("/agents", params=params)).json()
                seen += [a["id"] for a in page["agents"]]
                for _ in range(rng.randint(0, 3)):
                    await front.spawn(name="during")
                cursor = page["nextCursor"]
                if cursor is None:
                    break
            assert len(seen) == len(set(seen))
            assert set(before) <= set(seen)


async def test_paging_under_truly_concurrent_spawns(front: FrontDoor) -> None:
    before = [await front.spawn(name="b") for _ in range(40)]
    async with front.client() as client:

        async def spawner() -> None:
            for _ in range(40):
                await front.spawn(name="c")
                await asyncio.sleep(0)

        seen, _ = await asyncio.gather(page_all(client, 3), spawner())
    assert len(seen) == len(set(seen))
    assert set(before) <= set(seen)
    assert seen[: len(before)] == before  # oldest first


async def test_an_agent_token_pages_its_own_subtree(scoped_front: FrontDoor) -> None:
    lead = await scoped_front.spawn(name="lead")
    kids = [await scoped_front.spawn(name=f"k{i}", parent=lead) for i in range(5)]
    await scoped_front.spawn(name="stranger")
    async with scoped_front.agent_client(lead) as client:
        assert await page_all(client, 2) == [lead, *kids]
    async with scoped_front.agent_client(kids[0]) as client:
        assert await page_all(client, 2) == [kids[0]]


async def test_the_local_api_and_the_http_client_follow_the_cursor(front: FrontDoor) -> None:
    made = [await front.spawn(name="a") for _ in range(5)]
    page = await front.api.list_page(2)
    assert [a["id"] for a in page["agents"]] == made[:2]
    assert [a["id"] for a in await front.api.list_agents()] == made
    assert [a["id"] for a in await front.api.list_agents(name="nobody")] == []


async def test_events_filter_by_type_and_run(front: FrontDoor) -> None:
    front.harness.script("w", "done")
    one = await front.spawn(name="w", prompt="go")
    await front.settled(one, "idle")
    two = await front.spawn(name="other")
    run = front.service.get(one)["runId"]
    async with front.client() as client:

        async def seen(**query: Any) -> list[tuple[str, str]]:
            answer = await client.get("/events", params={"format": "json", **query})
            assert answer.status_code == 200, answer.text
            return [(e["type"], e["agentId"]) for e in answer.json()["events"]]

        assert await seen(type="agent.created") == [("agent.created", one), ("agent.created", two)]
        created_or_started = await seen(type=["agent.created", "agent.turn_started"])
        assert created_or_started == await seen(type="agent.created,agent.turn_started")
        assert ("agent.turn_started", one) in created_or_started
        assert {a for _, a in await seen(run=run)} == {one}
        assert await seen(type="agent.created", run=run) == [("agent.created", one)]
        assert await seen(type="no.such.type") == []
        page = await client.get("/events", params={"format": "json", "type": "x", "limit": 1})
        assert page.json()["scannedTo"] == front.service.store.state.last_seq
        assert "type" in error_of(await client.get("/events", params={"type": ","}), "type")


async def test_mcp_agent_list_pages_summaries(front: FrontDoor) -> None:
    from corral.daemon._mcp._tools import TOOLS

    made = [await front.spawn(name="a", env={"K": SECRET}) for _ in range(3)]
    (tool,) = [t for t in TOOLS if t.name == "agent_list"]
    first = await tool.run(front.api, tool.args.model_validate({"limit": 2}))
    assert [a["id"] for a in first["agents"]] == made[:2]
    rest = await tool.run(
        front.api, tool.args.model_validate({"limit": 2, "cursor": first["nextCursor"]})
    )
    assert [a["id"] for a in rest["agents"]] == made[2:]
    assert rest["nextCursor"] is None
    assert SECRET not in json.dumps([first, rest])
