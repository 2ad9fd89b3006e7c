"""Several daemons: commands given inside one daemon (the console, MCP tools: the scoped API in
process) about an agent another daemon owns are carried out by the owner, in the caller's
name; and the daemon token may name the operator a request acts for, nothing more."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx
import psycopg
import pytest

from corral.daemon import AgentService, LocalApi
from corral.daemon._auth import ACTING_AS_HEADER, Caller
from corral.daemon._cluster._node import Node
from corral.daemon._cluster._relay import NodeRelay
from corral.daemon._errors import OwnerUnreachableError
from corral.daemon._http import create_app
from corral.daemon.stores import PostgresStore
from tests.support.front_door import serving
from tests.support.harness import ScriptedHarness, fail
from tests.support.polling import settle

pytestmark = pytest.mark.postgres

TOKEN = "relay-test-token"


@dataclass
class Daemon:
    name: str
    store: PostgresStore
    node: Node
    service: AgentService
    harness: ScriptedHarness
    url: str


@pytest.fixture
async def two(tmp_path: Path, postgres_dsn: str) -> AsyncIterator[tuple[Daemon, Daemon]]:
    async with AsyncExitStack() as stack:
        made = []
        for name in ("a", "b"):
            store = PostgresStore(postgres_dsn)
            await store.open()
            stack.push_async_callback(store.close)
            node = Node(store, name=name, url="http://unset", token=TOKEN, home=tmp_path / name)
            harness = ScriptedHarness()
            service = AgentService(
                store,
                home=tmp_path / name,
                harnesses={"command": harness},
                token=TOKEN,
                ownership=node,
            )
            service.use_relay(NodeRelay(node, TOKEN))
            url = await stack.enter_async_context(
                serving(create_app(service, token=TOKEN, node=node, heartbeat_s=60))
            )
            node.url = url  # known once served; written by join
            await node.join()
            stack.push_async_callback(node.leave)
            await service.start()
            await node.start(service, loop=False)
            stack.push_async_callback(service.close)
            stack.push_async_callback(service.relay.aclose)  # type: ignore[union-attr]
            made.append(Daemon(name, store, node, service, harness, url))
        yield made[0], made[1]


async def test_a_persons_answer_given_on_another_daemon_is_recorded_in_their_name(
    two: tuple[Daemon, Daemon],
) -> None:
    a, b = two
    b.harness.script("w", fail("no access"))
    spawned = await LocalApi(b.service).spawn(
        {"harness": "command", "command": ["w"], "name": "w", "prompt": "go", "onFailure": "ask"}
    )
    agent = spawned["id"]
    await settle(lambda: b.service.store.state.agents[agent]["state"] == "blocked")
    await a.node.tick()  # a follows the log: it knows the decision
    decision = next(d for d in a.service.decisions() if d["agentId"] == agent)

    alice = LocalApi(a.service).as_caller(Caller("alice"))
    answer = await alice.answer(decision["id"], "stop", why="not worth it")

    assert answer["agentId"] == agent
    resolved = b.service.decision(decision["id"])
    assert (resolved["state"], resolved["by"], resolved["why"]) == (
        "resolved",
        "alice",
        "not worth it",
    )
    assert b.service.store.state.agents[agent]["state"] == "stopped"
    assert agent in b.node.held
    assert agent not in a.node.held


async def test_a_prompt_given_on_another_daemon_runs_the_turn_on_the_owner(
    two: tuple[Daemon, Daemon],
) -> None:
    a, b = two
    b.harness.script("w", "first", "second")
    agent = (
        await LocalApi(b.service).spawn(
            {"harness": "command", "command": ["w"], "name": "w", "prompt": "go"}
        )
    )["id"]
    await settle(lambda: b.service.store.state.agents[agent]["state"] == "idle")
    await a.node.tick()

    answer = await LocalApi(a.service).prompt(agent, "again")

    assert answer == {"id": agent, "accepted": "prompt", "turn": 2}
    await settle(lambda: b.service.store.state.agents[agent]["state"] == "idle")
    assert b.harness.prompts(agent)[-1] == "again"
    assert a.harness.prompts(agent) == []


async def test_a_command_for_a_dead_daemons_agent_is_retryable(
    two: tuple[Daemon, Daemon], postgres_dsn: str
) -> None:
    a, b = two
    b.harness.script("w", "done")
    agent = (
        await LocalApi(b.service).spawn(
            {"harness": "command", "command": ["w"], "name": "w", "prompt": "go"}
        )
    )["id"]
    await settle(lambda: b.service.store.state.agents[agent]["state"] == "idle")
    await a.store.refresh()
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        # b stops renewing: its lease runs out, a has not adopted yet.
        conn.execute(
            "UPDATE nodes SET expires = clock_timestamp() - interval '1 second' WHERE name = 'b'"
        )

    with pytest.raises(OwnerUnreachableError) as raised:
        await LocalApi(a.service).prompt(agent, "again")

    assert raised.value.code == "owner_unreachable"
    assert raised.value.retryable
    assert raised.value.details["node"] == "b"


async def test_only_the_daemon_token_may_name_who_a_request_acts_for(
    two: tuple[Daemon, Daemon],
) -> None:
    a, _ = two
    async with httpx.AsyncClient(base_url=a.url) as client:
        made = await client.post(
            "/tokens", json={"name": "bob"}, headers={"authorization": f"Bearer {TOKEN}"}
        )
        bob = made.json()["token"]
        # A person's own token cannot pass for someone else.
        posing = await client.post(
            "/tokens",
            json={"name": "carol"},
            headers={"authorization": f"Bearer {bob}", ACTING_AS_HEADER: "mallory"},
        )
        listed = await client.get("/tokens", headers={"authorization": f"Bearer {TOKEN}"})
        by = {t["name"]: t["by"] for t in listed.json()["tokens"]}
        assert posing.status_code == 201
        assert by["carol"] == "bob"
        # The daemon's token may, with a name a token could have.
        relayed = await client.post(
            "/tokens",
            json={"name": "dave"},
            headers={"authorization": f"Bearer {TOKEN}", ACTING_AS_HEADER: "alice"},
        )
        bad = await client.post(
            "/tokens",
            json={"name": "erin"},
            headers={"authorization": f"Bearer {TOKEN}", ACTING_AS_HEADER: "not a name!"},
        )
        listed = await client.get("/tokens", headers={"authorization": f"Bearer {TOKEN}"})
    by = {t["name"]: t["by"] for t in listed.json()["tokens"]}
    assert relayed.status_code == 201
    assert by["dave"] == "alice"
    assert bad.status_code == 400
    assert bad.json()["error"]["code"] == "invalid_request"
    assert "erin" not in by
