"""The records the projections hold, typed: agents, notices, decisions, commands.

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
    decision: NotRequired[str]  # the decision it waits on, while blocked or waiting
    parent: str | None
    runId: str
    rootId: str
    children: list[str]
    turns: int
    turnInFlight: int | None
    queuedTurn: NotRequired[int]  # the turn in flight, while it waits for a slot (not started)
    consecutiveFailures: int
    retriesUsed: int
    stallRecoveries: NotRequired[int]  # since its last completed turn (see _stall)
    lastPrompt: str | None
    lastNotices: NotRequired[list[int]]
    lastOutput: str | None
    lastError: str | None
    usage: Usage
    treeUsage: NotRequired[Usage]  # its own usage plus its descendants' (see _tree_budget)
    budget: NotRequired[dict[str, Any]]  # the budget in force, once changed since spawn
    budgetCapped: NotRequired[list[dict[str, Any]]]  # what its ancestors' room capped
    workdir: str
    createdAt: str
    updatedAt: str
    endedAt: NotRequired[str]
    restarts: NotRequired[int]  # how many times it was restarted after it ended
    # while paused (preempted at the run's cap; see _headcount): for whom, since when, and
    # what it resumes to (idle, blocked, retry: a retry its policy asked for, turn: its
    # cancelled turn again)
    pausedBy: NotRequired[str]
    pausedAt: NotRequired[str]
    resumeTo: NotRequired[str]


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


class DecisionRecord(TypedDict):
    """Something waiting on a person, or answered by one.

    ``kind``: ``approval`` (an agent asked before acting), ``blocked`` (a failure policy held
    the agent), ``budget_exhausted`` (its budget left no room), ``gateway_frozen`` (a
    database breaker froze it). ``answers`` are what :meth:`answer` accepts while it is
    ``pending``; once ``resolved`` it carries the ``answer``, who gave it (``by``: the
    caller's token name; ``note``: a name the caller typed, kept only as a note), ``why``,
    ``at``, and ``timedOut`` when nobody answered before its ``deadline``.
    """

    id: str
    kind: str
    state: str
    agentId: str
    name: NotRequired[str]
    runId: NotRequired[str]
    reason: str | None
    since: str
    answers: list[str]
    error: NotRequired[str | None]
    dimension: NotRequired[str]
    ancestor: NotRequired[str]  # a budget hold: the ancestor whose budget has no room
    # approvals
    action: NotRequired[str]
    context: NotRequired[dict[str, Any]]
    rule: NotRequired[dict[str, Any]]
    checkId: NotRequired[str]
    ruleIndex: NotRequired[int]
    deadline: NotRequired[str | None]
    onTimeout: NotRequired[str]
    # gateway freezes
    target: NotRequired[str]
    freezeId: NotRequired[str | None]
    # once resolved
    answer: NotRequired[str]
    by: NotRequired[str | None]
    note: NotRequired[str | None]
    why: NotRequired[str | None]
    at: NotRequired[str]
    timedOut: NotRequired[bool]


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


class SessionToolCall(TypedDict):
    """A tool call of an assistant message: ``arguments`` is the JSON text the model sent."""

    id: str
    name: str
    arguments: str


class SessionMessage(TypedDict):
    """One message of an agent's session (see ``corral.daemon._sessions``).

    ``role``: ``user`` (a turn's prompt, the notices that went in front of it included),
    ``assistant`` (a turn's output; for ``openai`` agents also each model reply, with its
    ``toolCalls``), ``tool`` (a tool's result: ``toolCallId``, ``name``) or ``error`` (why a
    turn failed). ``turn`` is the agent's turn it belongs to, ``at`` when it was recorded,
    ``n`` its number in the agent's session (from 1, never reused while the session lasts;
    every message of a session has one).
    """

    role: str
    turn: int
    content: str
    at: str
    n: NotRequired[int]
    toolCalls: NotRequired[list[SessionToolCall]]
    toolCallId: NotRequired[str]
    name: NotRequired[str]
