"""The records the projections hold, typed: agents, notices, resolutions, commands.

Their keys are the JSON the HTTP API returns (camelCase), so a record is served as it is.
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict


class Usage(TypedDict):
    """What an agent's turns have spent; ``unpricedTurns`` counts turns of unknown cost."""

    tokens: int
    costUsd: float
    turns: int
    unpricedTurns: NotRequired[int]


class TurnUsage(TypedDict):
    """What one turn spent, as a harness reports it (``costUsd`` None: unknown)."""

    tokens: int
    costUsd: NotRequired[float | None]


class AgentRecord(TypedDict):
    id: str
    name: str
    spec: dict[str, Any]  # the AgentSpec as JSON; the service keeps it parsed beside
    state: str
    reason: str | None
    error: str | None
    dimension: NotRequired[str]  # the budget dimension it is held on (budget-exhausted)
    parent: str | None
    runId: str
    rootId: str
    children: list[str]
    turns: int
    turnInFlight: int | None
    consecutiveFailures: int
    retriesUsed: int
    lastPrompt: str | None
    lastNotices: NotRequired[list[int]]
    lastOutput: str | None
    lastError: str | None
    usage: Usage
    budget: NotRequired[dict[str, Any]]  # the budget in force, once changed since spawn
    workdir: str
    createdAt: str
    updatedAt: str
    endedAt: NotRequired[str]


# ``from`` is a keyword: the functional form spells the key as the JSON does.
Notice = TypedDict(
    "Notice",
    {
        "id": int,
        "to": str,
        "from": str,
        "fromName": str,
        "kind": str,
        "state": str,
        "createdAt": str,
        "reason": NotRequired[str | None],
        "error": NotRequired[str | None],
        "output": NotRequired[str],
        "target": NotRequired[str],
        "deliveredAt": NotRequired[str],
        "droppedAt": NotRequired[str],
    },
)


class Resolution(TypedDict):
    """A decision a person resolved: ``agent_blocked`` (prompt, stop) or ``gateway_frozen``."""

    id: int
    at: str
    kind: str
    agentId: str
    reason: str | None
    action: str
    by: str | None
    why: str | None
    error: NotRequired[str | None]
    target: NotRequired[str]
    freezeId: NotRequired[str | None]


class CommandRecord(TypedDict):
    """A command's answer kept under its idempotency key."""

    fingerprint: str
    command: dict[str, Any]
    status: int
    response: dict[str, Any]
    at: str


class TokenRecord(TypedDict):
    """A named operator token: the SHA-256 (hex) of its secret, never the secret; who made
    it, and when. A revoked token keeps its record (``revokedAt``), so its name can be given
    to a new token and the log still says who revoked which."""

    name: str
    sha256: str
    by: str | None
    createdAt: str
    revokedAt: str | None
    revokedBy: str | None
