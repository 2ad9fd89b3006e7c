"""The agent service's MCP tools, each one call on an ``AgentApi``, over streamable HTTP
(``mcp_asgi_app``, mounted at ``/mcp`` by the daemon) or stdio (``run_stdio``). How to mount
the endpoint in an app of your own: docs/daemon.md, "MCP"."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, NamedTuple

import mcp_types as types
import pydantic
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel
from starlette.types import ASGIApp

from corral.daemon._api import AgentApi
from corral.daemon._auth import AGENT_SCOPE_KEY
from corral.daemon._errors import InvalidSpecError, OutOfScopeError
from corral.daemon._spec import AgentSpec, problems_of
from corral.kernel import CorralError
from corral.kernel import _validate as v

logger = logging.getLogger("corral.daemon.mcp")

SERVER_NAME = "corral"
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


# --- tool arguments ---------------------------------------------------------------------------


class _Args(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


_KEY = Field(
    default=None,
    min_length=1,
    description="Idempotency key: a retry with the same key gets the first answer and "
    "is not applied twice.",
)
_AGENT = Field(min_length=1, description="The agent's id, like a_1f2e3d4c.")
_BY = Field(default=None, description="Who decides (recorded when it resolves a decision).")
_WHY = Field(default=None, description="Why (recorded when it resolves a decision).")


class SpawnArgs(_Args):
    spec: dict[str, Any] = Field(description="The agent spec (camelCase JSON).")
    idempotency_key: str | None = _KEY


class PromptArgs(_Args):
    agent_id: str = _AGENT
    text: str | None = Field(
        default=None, description="The prompt; without it the last prompt is sent again."
    )
    by: str | None = _BY
    why: str | None = _WHY
    idempotency_key: str | None = _KEY


class StopArgs(_Args):
    agent_id: str = _AGENT
    by: str | None = _BY
    why: str | None = _WHY
    idempotency_key: str | None = _KEY


class AgentArgs(_Args):
    agent_id: str = _AGENT


class NoArgs(_Args):
    pass


_TARGET = Field(
    default=None,
    min_length=1,
    description="The database's name (see db_targets); may be left out when there is one.",
)


class DbQueryArgs(_Args):
    agent_id: str = Field(min_length=1, description="The agent making the request.")
    request: dict[str, Any] = Field(
        description='The request: {"sql": "SELECT ... WHERE id = $1", "params": [7]}, or a '
        'structured operation {"op": "find"|"count"|"insert"|"update"|"delete", "table": ..., '
        '"where": {"field": value or {"eq"|"ne"|"lt"|"lte"|"gt"|"gte"|"in"|"like"|"is_null": '
        '...}}, "set": {...}, "values": {...}, "columns": [...], "order_by": [...], '
        '"limit": n}. Writes need "idempotency_key" (a retry with the same key is replayed, '
        'never run twice) and may carry "plan_hash".'
    )
    target: str | None = _TARGET


class DbTargetArgs(_Args):
    target: str | None = _TARGET


class DbAgentArgs(_Args):
    agent_id: str = _AGENT
    target: str | None = _TARGET


class DbReinstateArgs(_Args):
    agent_id: str = _AGENT
    by: str = Field(min_length=1, description="The person who decides (recorded).")
    reason: str = Field(min_length=1, description="Why the agent may use the database again.")
    target: str | None = _TARGET


Handler = Callable[[AgentApi, Any], Awaitable[dict[str, Any]]]


@dataclass(frozen=True, slots=True)
class _Tool:
    name: str
    title: str
    description: str
    args: type[_Args]
    run: Handler
    read_only: bool
    idempotent: bool

    def definition(self) -> types.Tool:
        return types.Tool(
            name=self.name,
            title=self.title,
            description=self.description,
            input_schema=_schema(self.args),
            annotations=types.ToolAnnotations(
                title=self.title,
                read_only_hint=self.read_only,
                destructive_hint=self.name == "agent_stop",
                idempotent_hint=self.idempotent,
                open_world_hint=False,
            ),
        )


def _schema(args: type[_Args]) -> dict[str, Any]:
    schema = args.model_json_schema(by_alias=True)
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    if args is SpawnArgs:
        # The spec's own schema, so a client sees every field, type and default.
        spec = AgentSpec.model_json_schema(by_alias=True)
        schema.setdefault("$defs", {}).update(spec.pop("$defs", {}))
        spec["description"] = schema["properties"]["spec"]["description"]
        schema["properties"]["spec"] = spec
    return schema


async def _spawn(api: AgentApi, a: SpawnArgs) -> dict[str, Any]:
    return await api.spawn(a.spec, idempotency_key=a.idempotency_key)


async def _prompt(api: AgentApi, a: PromptArgs) -> dict[str, Any]:
    return await api.prompt(
        a.agent_id, a.text, by=a.by, why=a.why, idempotency_key=a.idempotency_key
    )


async def _stop(api: AgentApi, a: StopArgs) -> dict[str, Any]:
    return await api.stop(a.agent_id, by=a.by, why=a.why, idempotency_key=a.idempotency_key)


async def _status(api: AgentApi, a: AgentArgs) -> dict[str, Any]:
    return await api.get(a.agent_id)


async def _list(api: AgentApi, a: NoArgs) -> dict[str, Any]:
    return {"agents": await api.list_agents()}


async def _inbox(api: AgentApi, a: AgentArgs) -> dict[str, Any]:
    return {"notices": await api.inbox(a.agent_id)}


async def _decisions(api: AgentApi, a: NoArgs) -> dict[str, Any]:
    return {"decisions": await api.decisions()}


async def _db_targets(api: AgentApi, a: NoArgs) -> dict[str, Any]:
    return {"targets": await api.db_targets()}


async def _db_schema(api: AgentApi, a: DbTargetArgs) -> dict[str, Any]:
    return await api.db_schema(a.target)


async def _db_query(api: AgentApi, a: DbQueryArgs) -> dict[str, Any]:
    return await api.db_query(a.agent_id, a.request, a.target)


async def _db_status(api: AgentApi, a: DbAgentArgs) -> dict[str, Any]:
    return await api.db_status(a.agent_id, a.target)


async def _db_reinstate(api: AgentApi, a: DbReinstateArgs) -> dict[str, Any]:
    return await api.db_reinstate(a.agent_id, a.by, a.reason, a.target)


TOOLS: tuple[_Tool, ...] = (
    _Tool(
        "agent_spawn",
        "Spawn an agent",
        "Create an agent from a spec: name, harness (command, python or openai) and its "
        "options, prompt, onFailure (fail, ask, retry), maxRetries, maxConsecutiveFailures, "
        "parent, notifyOn, budget. With a prompt the first turn starts at once. Returns the "
        "agent's record (id like a_1f2e3d4c, state). An invalid spec lists every problem.",
        SpawnArgs,
        _spawn,
        read_only=False,
        idempotent=False,
    ),
    _Tool(
        "agent_prompt",
        "Prompt an agent",
        "Start a turn of an idle or blocked agent (a blocked agent's decision is resolved, "
        "recorded with by and why). Without text the last prompt is sent again. Returns "
        '{"id", "accepted": "prompt"}; the turn runs in the background (see agent_status).',
        PromptArgs,
        _prompt,
        read_only=False,
        idempotent=False,
    ),
    _Tool(
        "agent_stop",
        "Stop an agent",
        "End an agent: a turn in flight is cancelled and its working directory removed. "
        'Returns {"id", "accepted": "stop"}. A stopped agent takes no more commands.',
        StopArgs,
        _stop,
        read_only=False,
        idempotent=False,
    ),
    _Tool(
        "agent_status",
        "Agent status",
        "One agent's record: state (running, idle, blocked, failed, stopped), reason, last "
        "error and output, turns, consecutive failures, usage, parent and children.",
        AgentArgs,
        _status,
        read_only=True,
        idempotent=True,
    ),
    _Tool(
        "agent_list",
        "List agents",
        'Every agent\'s record, as {"agents": [...]}.',
        NoArgs,
        _list,
        read_only=True,
        idempotent=True,
    ),
    _Tool(
        "inbox_read",
        "Read an inbox",
        "The notices sent to an agent by its children (supervision needed, done, failed, "
        'blocked), pending or delivered, as {"notices": [...]}.',
        AgentArgs,
        _inbox,
        read_only=True,
        idempotent=True,
    ),
    _Tool(
        "decisions_list",
        "List decisions",
        "Everything waiting on a person, oldest first: blocked agents with their reason and "
        "error (resolve one with agent_prompt or agent_stop) and agents frozen in a database "
        '(resolve with db_reinstate), as {"decisions": [...]}.',
        NoArgs,
        _decisions,
        read_only=True,
        idempotent=True,
    ),
    _Tool(
        "db_targets",
        "List databases",
        "The databases agents reach through the gateway: name, dialect (postgresql or "
        'sqlite), number of tables, agents frozen there, as {"targets": [...]}.',
        NoArgs,
        _db_targets,
        read_only=True,
        idempotent=True,
    ),
    _Tool(
        "db_schema",
        "Database schema",
        "The tables and columns of a database that agents may use (name, type, nullable, "
        "primary key).",
        DbTargetArgs,
        _db_schema,
        read_only=True,
        idempotent=True,
    ),
    _Tool(
        "db_query",
        "Query a database",
        "Run one SQL statement or structured operation through the gateway. Reads run "
        "read-only; an empty filtered read says genuinely_empty (the tables hold nothing) or "
        "suspiciously_empty (rows exist that the filter missed: check it before concluding). "
        "Writes need an idempotency_key; a retry with the same key answers status replayed "
        "and is not applied twice. Refusals name what is wrong (unknown_column with close "
        "matches, forbidden_statement, ...); repeated errors freeze the agent (agent_frozen) "
        "until a person reinstates it.",
        DbQueryArgs,
        _db_query,
        read_only=False,
        idempotent=False,
    ),
    _Tool(
        "db_status",
        "Gateway status of an agent",
        "An agent's breakers in a database: frozen or not (with the freeze and its "
        "evidence), counts of errors, refusals and suspicious empties in the window, and "
        "the thresholds.",
        DbAgentArgs,
        _db_status,
        read_only=True,
        idempotent=True,
    ),
    _Tool(
        "db_reinstate",
        "Reinstate a frozen agent",
        "Lift an agent's freeze in a database (a decision of decisions_list), recorded with "
        "by and reason.",
        DbReinstateArgs,
        _db_reinstate,
        read_only=False,
        idempotent=False,
    ),
)


# --- the server -------------------------------------------------------------------------------


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


ScopedApi = Callable[[str], AgentApi]
"""``scoped(agent_id)``: the :class:`AgentApi` with the reach of that agent's own token
(:meth:`LocalApi.as_agent`)."""


def build_mcp_server(
    api: AgentApi, *, name: str = SERVER_NAME, scoped: ScopedApi | None = None
) -> Server[Any]:
    """A low-level MCP ``Server`` whose tools call ``api``.

    Any transport of the SDK can run it (``Client(server)`` connects to it in process).
    Refusals of ``api`` come back as tool errors; a tool name that does not exist is a
    JSON-RPC ``INVALID_PARAMS`` error, as the protocol asks. Over HTTP, a request the daemon's
    gate marked as an agent's (its own token) is served by ``scoped(agent_id)`` instead, so an
    agent reaches through MCP exactly what its token reaches over HTTP; without ``scoped``
    such a request is refused (``out_of_scope``).
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
        try:
            args = tool.args.model_validate(params.arguments or {})
        except pydantic.ValidationError as exc:
            return _error(InvalidSpecError(problems_of(exc), what=f"{tool.name} arguments"))
        try:
            principal = _principal(ctx)
            if principal is None:
                return _result(await tool.run(api, args))
            if scoped is None:
                raise OutOfScopeError(principal, "the MCP endpoint (run `corral mcp` instead)")
            return _result(await tool.run(scoped(principal), args))
        except CorralError as exc:
            return _error(exc)
        except Exception:
            # A bug, not a refusal: the caller gets a tool error, the log gets the traceback.
            logger.exception("MCP tool %s failed", tool.name)
            return _error(
                CorralError(f"{tool.name} failed inside the daemon; see its log", tool=tool.name)
            )

    return Server(
        name,
        title="corral agent service",
        instructions="Spawn, prompt, stop and watch supervised agents; list the decisions "
        "waiting on a person.",
        get_tool_input_schema=lambda tool_name: (
            _schema(tools[tool_name].args) if tool_name in tools else None
        ),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


def _principal(ctx: ServerRequestContext[Any]) -> str | None:
    """The agent whose own token the HTTP request carries (the daemon's gate put it in the
    request's scope), else None."""
    scope = getattr(ctx.request, "scope", None)
    if not isinstance(scope, dict):
        return None
    principal = scope.get(AGENT_SCOPE_KEY)
    return principal if isinstance(principal, str) else None


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
    passes :meth:`LocalApi.as_agent`).
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
