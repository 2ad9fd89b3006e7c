"""corral's own tools for an ``openai`` agent (``openai.corralTools``): a coordinator's hands.

The tools are the MCP tools of the same names (``_mcp._tools.TOOLS``: their argument models,
descriptions and handlers), called on :meth:`LocalApi.as_agent` of the agent: a call reaches
exactly what the agent's own token reaches over HTTP -- its subtree, answering descendants'
decisions only of the kinds its ``mayAnswer`` lists, spawning children under the run's
headcount cap, checking its own actions, querying a database as itself. The harness puts
each call through the agent's guardrails first (``ToolGuard``), as it does its own tools.

A refusal (bad arguments, out of scope, an agent busy, ...) goes back to the model as a tool
error naming the typed error's code and message; the turn goes on. A result is JSON, cut at
:data:`MAX_RESULT_CHARS` characters.

Conveniences for the model, which knows its own id only from the descriptions: the tools
whose ``agentId`` means "yourself" (``inbox_read``, ``agent_status``, ``action_check``,
``db_query``) default it to the agent, and ``agent_spawn`` makes a child of the agent when
the spec names no ``parent``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from corral.agent import ToolError
from corral.daemon._api import LocalApi
from corral.daemon._mcp import TOOLS, Tool, input_schema, parse_args, run_tool
from corral.daemon._spec import CORRAL_TOOLS, AgentSpec
from corral.daemon.harnesses import ExtraTool
from corral.kernel import CorralError

MAX_RESULT_CHARS = 64 * 1024
MAX_PROBLEMS_CHARS = 2000
_SELF_DEFAULT = frozenset(
    {"inbox_read", "agent_status", "action_check", "db_query", "run_get", "session_get"}
)
_BY_NAME: dict[str, Tool] = {tool.name: tool for tool in TOOLS}
assert set(CORRAL_TOOLS) <= set(_BY_NAME), "a corral tool with no MCP tool behind it"


class CorralToolError(ToolError):
    """A call of one of corral's tools was refused or failed: the message names the typed
    error's code and message (and an invalid request's problems), for the model to read."""

    code = "tool_failed"

    def __init__(self, tool: str, error: CorralError) -> None:
        message = f"{tool}: {error.code}: {error.message}"
        problems = error.details.get("problems")
        if problems:
            shown = json.dumps(problems, ensure_ascii=False, default=str)
            message += f" {shown[:MAX_PROBLEMS_CHARS]}"
        super().__init__(message, tool=tool, error_code=error.code)


class CorralTools:
    """Builds an agent's corral tools (:meth:`for_agent`, the daemon's
    ``AgentService.use_agent_tools``). ``api`` is the operator's :class:`LocalApi`; the
    daemon swaps in the one with its databases once they are open (a call reads it when it
    runs)."""

    def __init__(self, api: LocalApi) -> None:
        self.api = api

    def for_agent(self, agent_id: str, spec: AgentSpec) -> tuple[ExtraTool, ...]:
        """The corral tools ``spec.openai.corralTools`` names (none for another harness)."""
        if spec.openai is None:
            return ()
        return tuple(
            self._tool(_BY_NAME[name], agent_id) for name in spec.openai.corral_tool_names()
        )

    def _tool(self, tool: Tool, agent_id: str) -> ExtraTool:
        async def call(arguments: dict[str, Any]) -> str:
            try:
                args = parse_args(tool, _defaults(tool.name, agent_id, arguments))
                result = await run_tool(tool, self.api.as_agent(agent_id), args)
            except CorralError as exc:
                raise CorralToolError(tool.name, exc) from None
            return shown(result)

        description = f"{tool.description} (You are agent {agent_id}.)"
        return ExtraTool(
            name=tool.name,
            description=description,
            parameters=input_schema(tool.args),
            call=call,
        )


def _defaults(name: str, agent_id: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The model's arguments with the agent's own id where one is left out (see the module
    docstring); anything else is left to the tool's checks."""
    arguments = dict(arguments)
    if name in _SELF_DEFAULT and "agentId" not in arguments and "agent_id" not in arguments:
        arguments["agentId"] = agent_id
    spec = arguments.get("spec")
    if name == "agent_spawn" and isinstance(spec, dict) and spec.get("parent") is None:
        arguments["spec"] = {**spec, "parent": agent_id}
    return arguments


def shown(result: Mapping[str, Any]) -> str:
    """A tool's result as the model reads it: JSON, at most :data:`MAX_RESULT_CHARS`
    characters (then a line saying how many were left out)."""
    text = json.dumps(result, ensure_ascii=False, default=str)
    if len(text) <= MAX_RESULT_CHARS:
        return text
    dropped = len(text) - MAX_RESULT_CHARS
    return text[:MAX_RESULT_CHARS] + f"\n[corral: {dropped} more characters left out]"
