"""The MCP tools, driven with the SDK's own client: in process, over streamable HTTP on a
loopback uvicorn server, and over stdio through ``corral mcp``."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import httpx2
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from starlette.applications import Starlette
from starlette.routing import Route

from corral.daemon import (
    LocalApi,
    build_mcp_server,
    create_app,
    mcp_asgi_app,
    run_stdio,
)
from corral.daemon._mcp import TOOLS
from corral.kernel import InvalidArgumentError
from tests.support.front_door import FrontDoor, serving
from tests.support.harness import ScriptedHarness, fail
from tests.support.polling import settle

SPEC: dict[str, Any] = {"name": "w", "harness": "command", "command": ["true"]}
TOOL_NAMES = [
    "agent_spawn",
    "agent_prompt",
    "agent_stop",
    "run_get",
    "run_stop",
    "agent_budget",
    "agent_status",
    "agent_list",
    "inbox_read",
    "session_get",
    "decisions_list",
    "decision_answer",
    "action_check",
    "action_verdict",
    "db_targets",
    "db_schema",
    "db_query",
    "db_status",
    "db_reinstate",
]


def structured(result: types.CallToolResult) -> dict[str, Any]:
    assert isinstance(result.structured_content, dict)
    return result.structured_content


def text(result: types.CallToolResult) -> str:
    (block,) = result.content
    assert isinstance(block, types.TextContent)
    return block.text


async def supervise(client: Client, state: Callable[[str], str], harness: ScriptedHarness) -> str:
    """Spawn a child that fails and is held, see it in every tool, resolve it, stop it."""
    harness.script("w", fail("no access"))
    parent = structured(await client.call_tool("agent_spawn", {"spec": {**SPEC, "name": "p"}}))
    spawned = await client.call_tool(
        "agent_spawn",
        {"spec": {**SPEC, "prompt": "go", "onFailure": "ask", "parent": parent["id"]}},
    )
    assert not spawned.is_error
    child = str(structured(spawned)["id"])
    await settle(lambda: state(child) == "blocked")

    status = structured(await client.call_tool("agent_status", {"agentId": child}))
    assert (status["state"], status["reason"], status["error"]) == ("blocked", "ask", "no access")
    listed = structured(await client.call_tool("agent_list", {}))
    assert sorted(a["id"] for a in listed["agents"]) == sorted([parent["id"], child])
    (decision,) = structured(await client.call_tool("decisions_list"))["decisions"]
    assert (decision["agentId"], decision["reason"]) == (child, "ask")
    (notice,) = structured(await client.call_tool("inbox_read", {"agentId": parent["id"]}))[
        "notices"
    ]
    assert (notice["kind"], notice["from"], notice["reason"]) == ("supervision", child, "ask")

    prompted = await client.call_tool(
        "agent_prompt", {"agentId": child, "text": "again", "by": "ana", "why": "granted"}
    )
    assert structured(prompted) == {"id": child, "accepted": "prompt", "turn": 2}
    await settle(lambda: state(child) == "idle")
    assert harness.prompts(child) == ["go", "again"]
    assert structured(await client.call_tool("decisions_list"))["decisions"] == []

    stopped = await client.call_tool("agent_stop", {"agentId": child, "idempotencyKey": "s1"})
    assert structured(stopped) == {"id": child, "accepted": "stop", "stopped": [child]}
    again = await client.call_tool("agent_stop", {"agentId": child, "idempotencyKey": "s1"})
    assert structured(again) == structured(stopped)  # replayed, not refused
    assert state(child) == "stopped"
    return child


async def test_tools_are_listed_with_their_schemas(front: FrontDoor) -> None:
    async with Client(build_mcp_server(front.api)) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    assert list(tools) == TOOL_NAMES
    assert all(t.description for t in tools.values())
    prompt = tools["agent_prompt"].input_schema
    assert prompt["required"] == ["agentId"]
    assert set(prompt["properties"]) == {"agentId", "text", "by", "why", "idempotencyKey"}
    assert prompt["additionalProperties"] is False
    spec = tools["agent_spawn"].input_schema["properties"]["spec"]
    assert spec["properties"]["harness"]["enum"] == ["command", "python", "openai", "external"]
    assert "onFailure" in spec["properties"]
    status = tools["agent_status"]
    assert status.annotations is not None
    assert status.annotations.read_only_hint is True
    assert tools["agent_stop"].annotations is not None
    assert tools["agent_stop"].annotations.destructive_hint is True


async def test_tools_in_process(front: FrontDoor) -> None:
    async with Client(build_mcp_server(front.api)) as client:
        await supervise(client, front.state, front.harness)


async def test_refusals_are_tool_errors_with_the_code(front: FrontDoor) -> None:
    async with Client(build_mcp_server(front.api)) as client:
        missing = await client.call_tool("agent_status", {"agentId": "a_00000000"})
        assert missing.is_error
        assert text(missing) == "agent_not_found: no agent with id 'a_00000000'"
        assert structured(missing)["error"] == {
            "code": "agent_not_found",
            "message": "no agent with id 'a_00000000'",
            "retryable": False,
            "details": {"agent_id": "a_00000000"},
        }
        invalid = await client.call_tool("agent_spawn", {"spec": {"name": "x", "harness": "no"}})
        assert invalid.is_error
        assert text(invalid).startswith("invalid_spec: invalid agent spec: 1 problem(s): harness")
        assert structured(await client.call_tool("agent_list"))["agents"] == []

        bad_args = await client.call_tool("agent_prompt", {"agentId": 7, "colour": "red"})
        assert bad_args.is_error
        problems = structured(bad_args)["error"]["details"]["problems"]
        assert {p["field"] for p in problems} == {"agentId", "colour"}
        assert text(bad_args).startswith(
            "invalid_request: invalid agent_prompt arguments: 2 problem"
        )

        with pytest.raises(MCPError) as unknown:
            await client.call_tool("agent_fly", {})
        assert unknown.value.code == types.INVALID_PARAMS
        assert "unknown tool 'agent_fly'" in unknown.value.message


class Broken(LocalApi):
    async def get(self, agent_id: str) -> dict[str, Any]:
        raise RuntimeError("disk on fire")


async def test_a_bug_in_the_api_is_a_tool_error_not_a_crash(
    front: FrontDoor, caplog: pytest.LogCaptureFixture
) -> None:
    async with Client(build_mcp_server(Broken(front.service))) as client:
        result = await client.call_tool("agent_status", {"agentId": "a_1"})
        assert result.is_error
        assert text(result) == "corral_error: agent_status failed inside the daemon; see its log"
        assert "disk on fire" not in text(result)
        # The server keeps serving after the failure.
        assert structured(await client.call_tool("agent_list"))["agents"] == []
    assert any("MCP tool agent_status failed" in r.message for r in caplog.records)


@asynccontextmanager
async def mcp_over_http(front: FrontDoor, **options: Any) -> AsyncIterator[str]:
    mcp = mcp_asgi_app(front.api, **options)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with mcp.lifespan():
            yield

    app = Starlette(routes=[Route("/mcp", endpoint=mcp.app)], lifespan=lifespan)
    async with serving(app) as url:
        yield url + "/mcp"


async def test_tools_over_streamable_http_on_loopback(front: FrontDoor) -> None:
    async with mcp_over_http(front) as url, Client(url) as client:
        assert [t.name for t in (await client.list_tools()).tools] == TOOL_NAMES
        await supervise(client, front.state, front.harness)
        missing = await client.call_tool("inbox_read", {"agentId": "a_00000000"})
        assert missing.is_error
        assert structured(missing)["error"]["code"] == "agent_not_found"


async def test_mounted_in_the_http_api_behind_its_token(front: FrontDoor) -> None:
    app = create_app(front.service, token="s3cret")
    mcp = mcp_asgi_app(front.api)
    app.router.routes.append(Route("/mcp", endpoint=mcp.app))
    async with mcp.lifespan(), serving(app) as url:
        async with httpx.AsyncClient() as raw:
            anonymous = await raw.post(url + "/mcp", json={})
        assert anonymous.status_code == 401
        assert anonymous.json()["error"]["code"] == "unauthorized"
        headers = {"Authorization": "Bearer s3cret"}
        async with (
            httpx2.AsyncClient(headers=headers) as http,
            Client(streamable_http_client(url + "/mcp", http_client=http)) as client,
        ):
            await supervise(client, front.state, front.harness)


async def test_an_agent_token_reaches_through_mcp_what_it_reaches_over_http(
    scoped_front: FrontDoor,
) -> None:
    service = scoped_front.service
    lead = (await service.spawn({**SPEC, "name": "lead"})).body["id"]
    child = (await service.spawn({**SPEC, "name": "child", "parent": lead})).body["id"]
    other = (await service.spawn({**SPEC, "name": "other"})).body["id"]
    app = scoped_front.app()
    mcp = mcp_asgi_app(scoped_front.api, scoped=scoped_front.api.as_caller)
    app.router.routes.append(Route("/mcp", endpoint=mcp.app))
    headers = {"Authorization": f"Bearer {scoped_front.agent_token(lead)}"}
    async with (
        mcp.lifespan(),
        serving(app) as url,
        httpx2.AsyncClient(headers=headers) as http,
        Client(streamable_http_client(url + "/mcp", http_client=http)) as client,
    ):
        listed = structured(await client.call_tool("agent_list"))["agents"]
        assert sorted(a["id"] for a in listed) == sorted([lead, child])
        status = structured(await client.call_tool("agent_status", {"agentId": child}))
        assert status["name"] == "child"
        refused = await client.call_tool("agent_stop", {"agentId": other})
        assert refused.is_error
        assert structured(refused)["error"]["code"] == "out_of_scope"
        spawned = await client.call_tool(
            "agent_spawn", {"spec": {**SPEC, "name": "helper", "parent": lead}}
        )
        assert structured(spawned)["parent"] == lead
        root = await client.call_tool("agent_spawn", {"spec": {**SPEC, "name": "root"}})
        assert structured(root)["error"]["code"] == "out_of_scope"
        # The run's tree, from the agent down; another run is out of its reach.
        run = structured(await client.call_tool("run_get", {"agentId": lead}))
        assert [a["name"] for a in run["agents"]] == ["lead", "child", "helper"]
        assert run["headcount"]["active"] == 3
        other_run = service.get(other)["runId"]
        refused = await client.call_tool("run_get", {"runId": other_run})
        assert structured(refused)["error"]["code"] == "out_of_scope"
        refused = await client.call_tool("run_stop", {"runId": other_run})
        assert structured(refused)["error"]["code"] == "out_of_scope"
        stopped = structured(await client.call_tool("run_stop", {"runId": run["runId"]}))
        assert stopped["stopped"] == [child, structured(spawned)["id"], lead]
    assert service.get(lead)["state"] == service.get(child)["state"] == "stopped"
    assert service.get(other)["state"] == "idle"


async def test_run_get_needs_a_run_or_an_agent(front: FrontDoor) -> None:
    async with Client(build_mcp_server(front.api)) as client:
        refused = await client.call_tool("run_get", {})
    assert refused.is_error
    assert "give runId, or agentId" in text(refused)


async def test_without_a_scoped_api_an_agent_token_is_refused(scoped_front: FrontDoor) -> None:
    app = scoped_front.app()
    mcp = mcp_asgi_app(scoped_front.api)
    app.router.routes.append(Route("/mcp", endpoint=mcp.app))
    agent = (await scoped_front.service.spawn({**SPEC, "name": "w"})).body["id"]
    headers = {"Authorization": f"Bearer {scoped_front.agent_token(agent)}"}
    async with (
        mcp.lifespan(),
        serving(app) as url,
        httpx2.AsyncClient(headers=headers) as http,
        Client(streamable_http_client(url + "/mcp", http_client=http)) as client,
    ):
        refused = await client.call_tool("agent_list")
    assert refused.is_error
    assert structured(refused)["error"]["code"] == "out_of_scope"


async def test_streamable_http_refuses_a_foreign_host_on_loopback(front: FrontDoor) -> None:
    async with mcp_over_http(front) as url, httpx.AsyncClient() as raw:
        request = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
        answer = await raw.post(
            url,
            json=request,
            headers={"Host": "evil.example", "Accept": "application/json, text/event-stream"},
        )
    assert answer.status_code in (403, 421)


async def test_corral_mcp_over_stdio_talks_to_the_daemon(daemon: FrontDoor) -> None:
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "corral.cli", "--url", daemon.url, "mcp"]
    )
    async with Client(params) as client:
        assert [t.name for t in (await client.list_tools()).tools] == TOOL_NAMES
        await supervise(client, daemon.state, daemon.harness)
        missing = await client.call_tool("agent_prompt", {"agentId": "a_00000000"})
        assert missing.is_error
        assert text(missing) == "agent_not_found: no agent with id 'a_00000000'"


async def test_bad_arguments(front: FrontDoor) -> None:
    with pytest.raises(InvalidArgumentError, match="build_mcp_server: api must be"):
        build_mcp_server("api")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="build_mcp_server: name must be"):
        build_mcp_server(front.api, name="")
    with pytest.raises(InvalidArgumentError, match="mcp_asgi_app: api must be"):
        mcp_asgi_app(object())  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="mcp_asgi_app: host must be"):
        mcp_asgi_app(front.api, host="")
    with pytest.raises(InvalidArgumentError, match="mcp_asgi_app: allowed_hosts must be"):
        mcp_asgi_app(front.api, allowed_hosts="localhost:*")
    with pytest.raises(InvalidArgumentError, match="run_stdio: api must be"):
        await run_stdio(None)  # type: ignore[arg-type]
    assert [t.name for t in TOOLS] == TOOL_NAMES
