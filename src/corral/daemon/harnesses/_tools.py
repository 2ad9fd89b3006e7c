"""The tools of an ``openai`` agent: commands of its spec, run as the agent's processes, and
the tools the daemon adds (``TurnRequest.extra_tools``)."""

from __future__ import annotations

import json
from typing import Any

from corral.agent import Tool, ToolError, ToolFailedError
from corral.daemon._spec import OpenAIToolSpec
from corral.daemon.harnesses._base import ExtraTool, TurnRequest
from corral.daemon.harnesses._process import (
    PID_FILE,
    Limits,
    ProcessNotStartedError,
    agent_env,
    exit_message,
    run_process,
)


class ToolCommandError(ToolFailedError):
    """A tool's command failed: it could not be started, or it exited non-zero (the message
    gives the exit code, or the signal, and the tail of its stderr). The model is told."""

    def __init__(self, tool: str, message: str, **details: Any) -> None:
        # ToolFailedError wraps an exception; this one is the failure itself.
        ToolError.__init__(self, f"tool {tool!r}: {message}", tool=tool, **details)


def command_tools(request: TurnRequest, limits: Limits) -> list[Tool]:
    """The tools of ``request.spec.openai`` as :class:`corral.agent.Tool` objects.

    A call runs the tool's ``command`` (no shell) in ``request.workdir`` with the agent's
    environment (the daemon's, the spec's ``env``, then ``request.env``), in a process group
    of its own, with the arguments as JSON on its stdin. Its stdout (UTF-8, undecodable bytes
    replaced; at most ``limits.max_output_bytes`` kept, then a line saying how much was
    dropped) is the result; a command that cannot start or exits non-zero raises
    :class:`ToolCommandError`. A cancelled call (the turn is cancelled or times out) kills
    the command's whole process group before the cancellation goes on. While it runs its pid
    is in ``<state_dir>/turn.pid``, so that a daemon that crashes meanwhile reaps it at its
    next start.
    """
    options = request.spec.openai
    if options is None:
        return []
    return [_command_tool(request, spec, limits) for spec in options.tools]


def _command_tool(request: TurnRequest, spec: OpenAIToolSpec, limits: Limits) -> Tool:
    name = spec.name
    argv = tuple(spec.command)

    async def run(arguments: dict[str, Any]) -> str:
        # ASCII JSON: a lone surrogate the model sent is escaped, never an encoding error.
        stdin = json.dumps(arguments, default=str).encode()
        try:
            finished = await run_process(
                argv,
                cwd=request.workdir,
                env=agent_env(request),
                stdin=stdin,
                limits=limits,
                pid_file=request.state_dir / PID_FILE,
                record={"agentId": request.agent_id, "turn": request.turn, "tool": name},
            )
        except ProcessNotStartedError as exc:
            raise ToolCommandError(name, exc.message, **exc.details) from None
        if finished.returncode != 0:
            raise ToolCommandError(
                name,
                exit_message("command", finished, limits.stderr_tail_bytes),
                exit_code=finished.returncode,
            )
        return finished.output

    return Tool.from_schema(
        run, name=name, description=spec.description, parameters=spec.parameters
    )


def extra_tools(request: TurnRequest) -> list[Tool]:
    """``request.extra_tools`` as :class:`corral.agent.Tool` objects (see
    :class:`~corral.daemon.harnesses.ExtraTool`)."""
    return [_extra_tool(extra) for extra in request.extra_tools]


def _extra_tool(extra: ExtraTool) -> Tool:
    async def run(arguments: dict[str, Any]) -> str:
        return await extra.call(arguments)

    return Tool.from_schema(
        run, name=extra.name, description=extra.description, parameters=extra.parameters
    )
