"""The agent service's MCP tools, each one call on an ``AgentApi``, over streamable HTTP
(``mcp_asgi_app``, mounted at ``/mcp`` by the daemon) or stdio (``run_stdio``). How to mount
the endpoint in an app of your own: docs/daemon.md, "MCP"."""

from corral.daemon._mcp._server import (
    SERVER_NAME,
    McpApp,
    ScopedApi,
    build_mcp_server,
    mcp_asgi_app,
    run_stdio,
)
from corral.daemon._mcp._tools import TOOLS, Tool, input_schema, parse_args, run_tool

__all__ = [
    "SERVER_NAME",
    "TOOLS",
    "McpApp",
    "ScopedApi",
    "Tool",
    "build_mcp_server",
    "input_schema",
    "mcp_asgi_app",
    "parse_args",
    "run_stdio",
    "run_tool",
]
