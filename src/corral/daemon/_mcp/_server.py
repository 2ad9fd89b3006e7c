"""The MCP server over the tools of ``_tools``: refusals as tool errors, every caller served
as its token says (an agent with its own reach, an operator in its own name), over
streamable HTTP (``mcp_asgi_app``) or stdio (``run_stdio``)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, NamedTuple

import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from starlette.types import ASGIApp

from corral.daemon._api import AgentApi
from corral.daemon._auth import CALLER_SCOPE_KEY, Caller
from corral.daemon._errors import OutOfScopeError
from corral.daemon._mcp._tools import TOOLS, input_schema, parse_args, run_tool
from corral.kernel import CorralError
from corral.kernel import _validate as v

logger = logging.getLogger("corral.daemon.mcp")

SERVER_NAME = "corral"
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _result(value: dict[str, Any]) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(text=json.dumps(value, indent=2, default=str))],
        structured_content=value,
    )


def _error(error: CorralError) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(text=f"{error.code}: {error.message}")],
        structured_content={"error": json.loads(json.dumps(error.to_dict(), default=str))},
        is_error=True,
    )


ScopedApi = Callable[[Caller], AgentApi]
"""``scoped(caller)``: the :class:`AgentApi` as that caller's token reaches it, acting in its
name (:meth:`LocalApi.as_caller`)."""


def build_mcp_server(
    api: AgentApi, *, name: str = SERVER_NAME, scoped: ScopedApi | None = None
) -> Server[Any]:
    """A low-level MCP ``Server`` whose tools call ``api``.

    Any transport of the SDK can run it (``Client(server)`` connects to it in process).
    Refusals of ``api`` come back as tool errors; a tool name that does not exist is a
    JSON-RPC ``INVALID_PARAMS`` error, as the protocol asks. Over HTTP, a request the daemon's
    gate identified (a :class:`~corral.daemon._auth.Caller` in its scope) is served by
    ``scoped(caller)`` instead, so an agent reaches through MCP exactly what its token
    reaches over HTTP and an operator acts in its token's name; without ``scoped`` an
    agent's request is refused (``out_of_scope``) and an operator's is served by ``api``.
    """
    v.instance_of("build_mcp_server", "api", api, AgentApi)
    v.non_empty_str("build_mcp_server", "name", name)
    if scoped is not None:
        v.callable_("build_mcp_server", "scoped", scoped)
    tools = {tool.name: tool for tool in TOOLS}
    listed = [tool.definition() for tool in TOOLS]

    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=listed)

    async def call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        tool = tools.get(params.name)
        if tool is None:
            raise MCPError(
                types.INVALID_PARAMS, f"unknown tool {params.name!r}; the tools are {list(tools)}"
            )
        # Argument errors are invalid_request, as over HTTP; a spec inside them invalid_spec.
        # The same text rules as HTTP bodies (see parse_args).
        try:
            args = parse_args(tool, params.arguments)
        except CorralError as exc:
            return _error(exc)
        try:
            caller = _caller(ctx)
            if caller is not None and scoped is not None:
                return _result(await run_tool(tool, scoped(caller), args))
            if caller is not None and caller.agent is not None:
                raise OutOfScopeError(caller.agent, "the MCP endpoint (run `corral mcp` instead)")
            # A bug, not a refusal, is a tool error too (the log gets the traceback).
            return _result(await run_tool(tool, api, args))
        except CorralError as exc:
            return _error(exc)

    return Server(
        name,
        title="corral agent service",
        instructions="Spawn, prompt, stop and watch supervised agents; list the decisions "
        "waiting on a person.",
        get_tool_input_schema=lambda tool_name: (
            input_schema(tools[tool_name].args) if tool_name in tools else None
        ),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


def _caller(ctx: ServerRequestContext[Any]) -> Caller | None:
    """Who the HTTP request is from (the daemon's gate put it in the request's scope), else
    None (stdio, in process, or an app without a token)."""
    scope = getattr(ctx.request, "scope", None)
    if not isinstance(scope, dict):
        return None
    caller = scope.get(CALLER_SCOPE_KEY)
    return caller if isinstance(caller, Caller) else None


class McpApp(NamedTuple):
    """The streamable HTTP endpoint: ``app`` to route at ``/mcp``, ``lifespan`` to run.

    ``lifespan()`` returns the session manager's context; the app answers only while it is
    entered, and it may be entered once.
    """

    app: ASGIApp
    lifespan: Callable[[], AbstractAsyncContextManager[None]]


def mcp_asgi_app(
    api: AgentApi,
    *,
    host: str = "127.0.0.1",
    allowed_hosts: Sequence[str] | None = None,
    stateless: bool = True,
    scoped: ScopedApi | None = None,
) -> McpApp:
    """The MCP tools over streamable HTTP as an ASGI app (docs/daemon.md shows how to mount
    it: a ``Route`` at ``/mcp``, with ``lifespan()`` entered around the server).

    ``host`` is where the daemon listens: on loopback, requests whose ``Host`` or
    ``Origin`` is not loopback are refused (DNS-rebinding protection); elsewhere the
    daemon's bearer token guards the endpoint and ``allowed_hosts`` (``"name:port"``,
    ``"name:*"``) may narrow it further. ``stateless`` serves each request on its own, with
    no MCP session to keep or expire. ``scoped``: see :func:`build_mcp_server` (the daemon
    passes :meth:`LocalApi.as_caller`).
    """
    v.instance_of("mcp_asgi_app", "api", api, AgentApi)
    v.non_empty_str("mcp_asgi_app", "host", host)
    v.instance_of("mcp_asgi_app", "allowed_hosts", allowed_hosts, (list, tuple, type(None)))
    v.instance_of("mcp_asgi_app", "stateless", stateless, bool)
    if allowed_hosts is not None:
        security = TransportSecuritySettings(
            enable_dns_rebinding_protection=True, allowed_hosts=list(allowed_hosts)
        )
    elif host in _LOOPBACK:
        security = TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
            allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
        )
    else:
        security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
    manager = StreamableHTTPSessionManager(
        app=build_mcp_server(api, scoped=scoped),
        stateless=stateless,
        security_settings=security,
    )
    return McpApp(app=StreamableHTTPASGIApp(manager), lifespan=manager.run)


async def run_stdio(api: AgentApi) -> None:
    """Serve the MCP tools on this process's stdin and stdout until stdin closes."""
    v.instance_of("run_stdio", "api", api, AgentApi)
    server = build_mcp_server(api)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())
