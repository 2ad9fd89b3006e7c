"""corral.client: the daemon's oversight for an agent that runs in its own process.

``connect()`` a daemon (``$CORRAL_URL``, ``$CORRAL_TOKEN``), ``register`` the agent (harness
``external``: the daemon runs none of its turns) or take up one it runs (``agent()``), then
ask before acting (``handle.check_action``, a ``corral.guard.Supervisor``'s shape: rules,
a person's approval) and report turns (``async with handle.turn(prompt) as turn``: usage
against budgets, failure policy and breaker, events, ``corral agents``, the console,
``/metrics``), and query the daemon's gateway as itself (``handle.query``). A framework
agent takes all of it through ``corral.integrations.Oversight.connected(handle)``. See
docs/daemon.md, "Agents in their own process".

    async with corral.connect() as conn:
        agent = await conn.register("researcher", budget={"maxCostUsd": 2.0})
        async with agent.turn("summarise the report") as turn:
            verdict = await agent.check_action(agent.id, "send email", {"to": "ceo"})
            turn.record(tokens=1200, cost_usd=0.01)
            turn.output = "..."

It talks HTTP (httpx) and imports nothing of the daemon.
"""

from corral.client._agent import AgentHandle
from corral.client._connection import Connection, connect
from corral.client._errors import (
    ClientSettingError,
    DaemonRefusedError,
    DaemonUnreachableError,
    TurnRefusedError,
)
from corral.client._turn import Turn, TurnReport, TurnScope

__all__ = [
    "AgentHandle",
    "ClientSettingError",
    "Connection",
    "DaemonRefusedError",
    "DaemonUnreachableError",
    "Turn",
    "TurnRefusedError",
    "TurnReport",
    "TurnScope",
    "connect",
]
