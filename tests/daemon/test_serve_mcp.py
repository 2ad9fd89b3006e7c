"""``serve`` answers MCP at /mcp, on the same port and behind the same token as the API."""

from __future__ import annotations

from pathlib import Path

import httpx
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from corral.daemon._mcp import TOOLS
from tests.support.front_door import running_serve


async def test_serve_exposes_the_mcp_tools_at_slash_mcp(tmp_path: Path) -> None:
    async with running_serve(tmp_path, token="t0ken") as daemon:
        url = daemon.url
        async with httpx.AsyncClient() as raw:
            assert (await raw.post(url + "/mcp", json={})).status_code == 401
        headers = {"Authorization": "Bearer t0ken"}
        async with (
            httpx2.AsyncClient(headers=headers) as http,
            Client(streamable_http_client(url + "/mcp", http_client=http)) as client,
        ):
            names = [t.name for t in (await client.list_tools()).tools]
            assert sorted(names) == sorted(t.name for t in TOOLS)
            spawned = await client.call_tool(
                "agent_spawn", {"spec": {"name": "w", "harness": "command", "command": ["x"]}}
            )
            assert not spawned.is_error
            listed = await client.call_tool("agent_list", {})
            assert not listed.is_error
