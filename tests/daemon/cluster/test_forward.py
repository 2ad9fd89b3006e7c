"""Commands sent on to their agent's owner (``_cluster._forward.Forwarding``): two nodes'
apps served on loopback, each forwarding to the other's real URL; ``GET /nodes``; and a
daemon alone, which has no nodes and no ``?node=``."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from corral.daemon import create_app
from corral.daemon._auth import agent_token
from corral.daemon._cluster import FORWARDED_HEADER
from tests.daemon.cluster.members import TOKEN, Cluster, Member, cluster
from tests.support.front_door import FrontDoor, serving

pytestmark = pytest.mark.postgres

OPERATOR = {"authorization": f"Bearer {TOKEN}"}


@dataclass
class Pair:
    """Nodes a and b, each served on loopback at the URL the other forwards to."""

    nodes: Cluster
    a: Member
    b: Member
    urls: dict[str, str]

    def client(self, name: str, **headers: str) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.urls[name], headers={**OPERATOR, **headers}, timeout=10
        )


@pytest.fixture
async def pair(postgres_dsn: str, tmp_path: Path) -> AsyncIterator[Pair]:
    async with cluster(postgres_dsn, tmp_path) as nodes, contextlib.AsyncExitStack() as stack:
        members = [await nodes.member("a"), await nodes.member("b")]
        urls = {}
        for m in members:
            url = await stack.enter_async_context(
                serving(create_app(m.service, token=TOKEN, node=m.node))
            )
            # The port is known once served: that is where the other node forwards to.
            m.node.url = urls[m.name] = url
            await nodes.sql("UPDATE nodes SET url = %s WHERE name = %s", url, m.name)
        yield Pair(nodes, members[0], members[1], urls)
        for m in members:
            await m.service.close()  # ends what the servers still serve


async def test_a_prompt_sent_to_another_node_is_run_by_the_owner(pair: Pair) -> None:
    w = await pair.a.spawn(name="w")
    await pair.b.store.refresh()
    body = {"text": "hello", "idempotencyKey": "k1"}
    async with pair.client("b") as via_b, pair.client("a") as via_a:
        forwarded = await via_b.post(f"/agents/{w}/prompt", json=body)
        assert forwarded.status_code == 202, forwarded.text
        await pair.a.service.settled(w)
        # The same key through the owner itself: the same answer, replayed.
        direct = await via_a.post(f"/agents/{w}/prompt", json=body)
    assert direct.status_code == 202
    assert direct.headers.get("idempotency-replayed") == "true"
    assert direct.json() == forwarded.json()
    assert pair.a.harness.prompts(w) == ["hello"]
    assert pair.b.harness.requests == []
    # b read what a wrote before answering.
    assert pair.b.store.state.agents[w]["lastPrompt"] == "hello"


async def test_a_spawn_with_node_lands_on_that_node(pair: Pair) -> None:
    async with pair.client("a") as via_a:
        created = await via_a.post("/agents?node=b", json={**_spec("s"), "prompt": "go"})
        assert created.status_code == 201, created.text
        agent = created.json()["id"]
        await pair.b.service.settled(agent)
        child = await via_a.post("/agents", json={**_spec("c"), "parent": agent})
        assert child.status_code == 201, child.text
    leases = await pair.nodes.leases()
    assert leases[agent] == ("b", 1)
    assert leases[child.json()["id"]] == ("b", 1)  # a child goes to its parent's node
    assert pair.b.harness.prompts(agent) == ["go"]
    assert pair.a.harness.requests == []


async def test_a_spawn_on_an_unknown_node_is_refused(pair: Pair) -> None:
    async with pair.client("a") as via_a:
        refused = await via_a.post("/agents?node=zed", json=_spec("s"))
    assert refused.status_code == 422
    assert refused.json()["error"]["code"] == "node_not_found"
    assert await pair.nodes.leases() == {}


async def test_a_forwarded_request_is_never_forwarded_again(pair: Pair) -> None:
    w = await pair.a.spawn(name="w")
    await pair.b.store.refresh()
    async with pair.client("b", **{FORWARDED_HEADER: "a"}) as via_b:
        answer = await via_b.post(f"/agents/{w}/prompt", json={"text": "loop?"})
    assert answer.status_code == 503
    assert answer.json()["error"]["code"] == "not_owner"
    assert pair.a.harness.requests == []
    assert pair.b.harness.requests == []


async def test_a_command_for_a_dead_owner_is_503_with_retry_after(pair: Pair) -> None:
    w = await pair.a.spawn(name="w")
    await pair.b.store.refresh()
    await pair.nodes.expire("a")
    async with pair.client("b") as via_b:
        answer = await via_b.post(f"/agents/{w}/prompt", json={"text": "anyone?"})
    assert answer.status_code == 503
    error = answer.json()["error"]
    assert (error["code"], error["retryable"]) == ("owner_unreachable", True)
    assert int(answer.headers["retry-after"]) >= 1
    assert pair.a.harness.requests == []
    # Once b has adopted the agent, the same command is b's own.
    assert await pair.b.node.tick() == [w]
    async with pair.client("b") as via_b:
        again = await via_b.post(f"/agents/{w}/prompt", json={"text": "anyone?"})
    assert again.status_code == 202
    await pair.b.service.settled(w)
    assert pair.b.harness.prompts(w) == ["anyone?"]


async def test_nodes_lists_the_nodes_and_their_agents_to_operators(pair: Pair) -> None:
    w = await pair.a.spawn(name="w")
    async with pair.client("b") as via_b:
        listed = await via_b.get("/nodes")
        as_agent = await via_b.get(
            "/nodes", headers={"authorization": f"Bearer {agent_token(TOKEN, w)}"}
        )
    assert listed.status_code == 200
    body = listed.json()
    assert (body["node"], body["leaseS"]) == ("b", pair.b.node.lease_s)
    rows = {n["name"]: n for n in body["nodes"]}
    assert sorted(rows) == ["a", "b"]
    assert (rows["a"]["agents"], rows["a"]["agentCount"], rows["a"]["live"]) == ([w], 1, True)
    assert (rows["b"]["agents"], rows["b"]["url"]) == ([], pair.urls["b"])
    assert as_agent.status_code == 403


async def test_a_daemon_alone_has_no_nodes_and_no_node_to_ask_for(front: FrontDoor) -> None:
    async with front.client() as client:
        listed = await client.get("/nodes")
        refused = await client.post("/agents?node=a", json=_spec("s"))
    assert listed.json() == {"node": None, "leaseS": None, "nodes": []}
    assert refused.status_code == 422
    assert refused.json()["error"]["code"] == "node_not_found"
    assert front.service.list_agents() == []


def _spec(name: str) -> dict[str, object]:
    return {"name": name, "harness": "command", "command": ["worker"]}


async def test_the_command_line_lists_the_nodes_and_spawns_on_one(
    pair: Pair, tmp_path: Path
) -> None:
    import asyncio
    import functools
    import json

    from typer.testing import CliRunner

    from corral import cli

    app = cli.build_app()
    env = {"CORRAL_URL": pair.urls["a"], "CORRAL_TOKEN": TOKEN, "COLUMNS": "200"}

    async def corral(*args: str) -> str:
        invoke = functools.partial(CliRunner().invoke, app, list(args), env=env)
        result = await asyncio.to_thread(invoke)
        assert result.exit_code == 0, result.output
        return result.stdout

    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(_spec("s")))
    made = json.loads(await corral("spawn", str(spec), "--node", "b", "--json"))
    await pair.b.store.refresh()
    assert made["id"] in pair.b.node.held
    table = await corral("nodes")
    lines = {line.split()[1]: line for line in table.splitlines() if line.startswith("│ ")}
    assert "nodes (lease" in table
    assert "(this one)" in lines["a"]
    assert "live" in lines["b"]
    listed = json.loads(await corral("nodes", "--json"))
    assert listed["node"] == "a"
    assert {n["name"]: n["agents"] for n in listed["nodes"]}["b"] == [made["id"]]


async def test_the_console_of_one_daemon_shows_and_acts_on_anothers_agent(pair: Pair) -> None:
    import re

    from corral.console import Console
    from corral.daemon._cluster._relay import NodeRelay

    w = await pair.b.spawn(name="w")
    await pair.a.store.refresh()
    relay = NodeRelay(pair.a.node, TOKEN)  # as corral serve --node sets it
    pair.a.service.use_relay(relay)
    console = Console(create_app(pair.a.service, token=TOKEN, node=pair.a.node))
    transport = httpx.ASGITransport(app=console)
    async with httpx.AsyncClient(
        transport=transport,
        base_url="http://127.0.0.1:4600",
        headers={"origin": "http://127.0.0.1:4600"},
    ) as browser:
        login = await browser.post("/console/login", data={"token": TOKEN, "next": "/"})
        assert login.status_code == 303, login.text
        page = await browser.get(f"/console/agents/{w}")
        assert page.status_code == 200, page.text
        assert re.search(r'data-testid="agent-node">b<', page.text)
        csrf = re.search(r'name="corral-csrf" content="([^"]+)"', page.text)
        assert csrf is not None
        # A person's prompt on a's console is run by b, the agent's owner.
        done = await browser.post(
            f"/console/agents/{w}/prompt",
            data={"text": "from the console", "why": "", "corral-csrf": csrf.group(1)},
            headers={"x-corral-csrf": csrf.group(1)},
        )
        assert done.status_code == 303, done.text
    await relay.aclose()
    await pair.b.service.settled(w)
    assert pair.b.harness.prompts(w) == ["from the console"]
    assert pair.a.harness.requests == []
