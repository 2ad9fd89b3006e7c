"""The MCP tools: each one's arguments (a pydantic model, its JSON schema the tool's input
schema), description and hints, and the one :class:`AgentApi` call it makes."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import mcp_types as types
import pydantic
from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from corral.daemon._api import AgentApi, LocalApi
from corral.daemon._errors import InvalidRequestError
from corral.daemon._spec import AgentSpec, problems_of
from corral.daemon._text import json_problems
from corral.kernel import CorralError

logger = logging.getLogger("corral.daemon.mcp")

# --- tool arguments ---------------------------------------------------------------------------


class Args(BaseModel):
    """A tool's arguments: camelCase (snake_case accepted), no unknown fields."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


_KEY = Field(
    default=None,
    min_length=1,
    description="Idempotency key: a retry with the same key gets the first answer and "
    "is not applied twice.",
)
_AGENT = Field(min_length=1, description="The agent's id (like a_1f2e3d4c) or its name.")
_BY = Field(default=None, description="Who decides (recorded when it resolves a decision).")
_WHY = Field(default=None, description="Why (recorded when it resolves a decision).")


class SpawnArgs(Args):
    spec: dict[str, Any] = Field(description="The agent spec (camelCase JSON).")
    idempotency_key: str | None = _KEY


class PromptArgs(Args):
    agent_id: str = _AGENT
    text: str | None = Field(
        default=None, description="The prompt; without it the last prompt is sent again."
    )
    by: str | None = _BY
    why: str | None = _WHY
    idempotency_key: str | None = _KEY


class StopArgs(Args):
    agent_id: str = _AGENT
    by: str | None = _BY
    why: str | None = _WHY
    idempotency_key: str | None = _KEY
    now: bool = Field(
        default=False, strict=True, description="Kill its turn at once (no SIGTERM, no grace)."
    )
    keep_children: bool = Field(
        default=False, strict=True, description="Leave its descendants running."
    )


class RunArgs(Args):
    run_id: str | None = Field(
        default=None, min_length=1, description="The run's id (runId of its agents' records)."
    )
    agent_id: str | None = Field(
        default=None, min_length=1, description="An agent of the run, when runId is not given."
    )

    @model_validator(mode="after")
    def _one_of(self) -> RunArgs:
        if self.run_id is None and self.agent_id is None:
            raise ValueError("give runId, or agentId for that agent's run")
        return self


class RunStopArgs(Args):
    run_id: str = Field(min_length=1, description="The run's id (runId of its agents' records).")
    by: str | None = _BY
    why: str | None = _WHY
    idempotency_key: str | None = _KEY


class BudgetArgs(Args):
    agent_id: str = _AGENT
    budget: dict[str, float | int | None] = Field(
        description="The dimensions to change: maxTokens, maxCostUsd, maxTurns, deadlineS "
        "(null: unlimited); the others stay."
    )
    by: str = Field(min_length=1, description="Who decides (recorded).")
    why: str = Field(min_length=1, description="Why (recorded).")
    idempotency_key: str | None = _KEY


class AgentArgs(Args):
    agent_id: str = _AGENT


class ActionArgs(Args):
    agent_id: str = Field(min_length=1, description="The agent that wants to act (yourself).")
    action: str = Field(
        min_length=1, description='What it wants to do, in words: "deploy web to prod".'
    )
    context: dict[str, Any] | None = Field(
        default=None, description="Details a person deciding should see."
    )
    wait_s: float = Field(
        default=0.0,
        ge=0,
        le=300,
        description="Seconds to wait for a person when a rule asks one (then pending).",
    )


class VerdictArgs(Args):
    decision: str = Field(min_length=1, description="The decision id a pending check gave.")
    wait_s: float = Field(default=0.0, ge=0, le=300, description="Seconds to wait for a person.")


class DecisionsArgs(Args):
    resolved: bool = Field(
        default=False, description="The answered decisions instead, newest first."
    )


class AnswerArgs(Args):
    decision: str = Field(min_length=1, description="The decision's id (see decisions_list).")
    answer: str = Field(
        min_length=1,
        description="One of the decision's answers: approve or deny (approval), retry or "
        "stop (blocked), budget or stop (budget_exhausted), reinstate (gateway_frozen).",
    )
    why: str | None = Field(default=None, description="Why (recorded).")
    text: str | None = Field(default=None, description="With retry: the prompt to re-send.")
    budget: dict[str, float | int | None] | None = Field(
        default=None, description="With budget: the dimensions to change (camelCase)."
    )
    idempotency_key: str | None = _KEY


class NoArgs(Args):
    pass


class ListArgs(Args):
    limit: int = Field(default=100, ge=1, le=1000, description="Agents per page.")
    cursor: str | None = Field(
        default=None, min_length=1, description="The nextCursor of the previous page."
    )
    state: str | None = Field(default=None, min_length=1, description="Only in this state.")
    run: str | None = Field(default=None, min_length=1, description="Only of this run (runId).")
    parent: str | None = Field(default=None, min_length=1, description="Only its children.")
    name: str | None = Field(default=None, min_length=1, description="Only of this name.")


_TARGET = Field(
    default=None,
    min_length=1,
    description="The database's name (see db_targets); may be left out when there is one.",
)


class DbQueryArgs(Args):
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


class DbTargetArgs(Args):
    target: str | None = _TARGET


class DbAgentArgs(Args):
    agent_id: str = _AGENT
    target: str | None = _TARGET


class DbReinstateArgs(Args):
    agent_id: str = _AGENT
    by: str | None = Field(
        default=None,
        min_length=1,
        description="A name kept as a note (the record names the caller's token).",
    )
    reason: str = Field(min_length=1, description="Why the agent may use the database again.")
    target: str | None = _TARGET


Handler = Callable[[AgentApi, Any], Awaitable[dict[str, Any]]]


@dataclass(frozen=True, slots=True)
class Tool:
    """One MCP tool: ``run(api, args)`` answers its structured content; ``definition()`` is
    what ``tools/list`` shows of it."""

    name: str
    title: str
    description: str
    args: type[Args]
    run: Handler
    read_only: bool
    idempotent: bool

    def definition(self) -> types.Tool:
        return types.Tool(
            name=self.name,
            title=self.title,
            description=self.description,
            input_schema=input_schema(self.args),
            annotations=types.ToolAnnotations(
                title=self.title,
                read_only_hint=self.read_only,
                destructive_hint=self.name in ("agent_stop", "run_stop"),
                idempotent_hint=self.idempotent,
                open_world_hint=False,
            ),
        )


def parse_args(tool: Tool, arguments: Mapping[str, Any] | None) -> Args:
    """The tool's arguments, checked: ``InvalidRequestError`` (every problem listed) for
    arguments its model refuses, or text no store could keep (the spec is ``parse_spec``'s
    to check, a gateway request the gateway's: only lone surrogates are refused in it)."""
    what = f"{tool.name} arguments"
    try:
        args = tool.args.model_validate(dict(arguments or {}))
    except pydantic.ValidationError as exc:
        raise InvalidRequestError(problems_of(exc), what=what) from None
    problems = json_problems(
        args.model_dump(by_alias=True, exclude_none=True, exclude={"spec"}),
        skip={"request"},
    )
    if problems:
        raise InvalidRequestError(problems, what=what)
    return args


async def run_tool(tool: Tool, api: AgentApi, args: Args) -> dict[str, Any]:
    """Run the tool on ``api`` (arguments from :func:`parse_args`): its structured result.
    Every refusal is the ``CorralError`` the API raised; anything else (a bug) is logged and
    raised as a ``CorralError`` that says the tool failed inside the daemon."""
    try:
        return await tool.run(api, _resolved(api, args))
    except CorralError:
        raise
    except Exception:
        logger.exception("MCP tool %s failed", tool.name)
        raise CorralError(
            f"{tool.name} failed inside the daemon; see its log", tool=tool.name
        ) from None


def _resolved(api: AgentApi, args: Args) -> Args:
    """``args`` with ``agentId`` as the id of the agent it names (an id or a name: see
    corral.daemon._names); a daemon reached over HTTP resolves it itself."""
    ref = getattr(args, "agent_id", None)
    if isinstance(api, LocalApi) and isinstance(ref, str):
        return args.model_copy(update={"agent_id": api.resolve(ref)})
    return args


def input_schema(args: type[Args]) -> dict[str, Any]:
    """The JSON schema of a tool's arguments, in camelCase, without pydantic's titles."""
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
    return await api.stop(
        a.agent_id,
        by=a.by,
        why=a.why,
        idempotency_key=a.idempotency_key,
        now=a.now,
        keep_children=a.keep_children,
    )


async def _run(api: AgentApi, a: RunArgs) -> dict[str, Any]:
    run_id = a.run_id
    if run_id is None:
        assert a.agent_id is not None  # RunArgs asks for one of them
        run_id = str((await api.get(a.agent_id))["runId"])
    return await api.run(run_id)


async def _run_stop(api: AgentApi, a: RunStopArgs) -> dict[str, Any]:
    return await api.stop_run(a.run_id, by=a.by, why=a.why, idempotency_key=a.idempotency_key)


async def _budget(api: AgentApi, a: BudgetArgs) -> dict[str, Any]:
    return await api.budget(
        a.agent_id, a.budget, by=a.by, why=a.why, idempotency_key=a.idempotency_key
    )


async def _status(api: AgentApi, a: AgentArgs) -> dict[str, Any]:
    return await api.get(a.agent_id)


async def _list(api: AgentApi, a: ListArgs) -> dict[str, Any]:
    filters = {"state": a.state, "run": a.run, "parent": a.parent, "name": a.name}
    return await api.list_page(a.limit, a.cursor, **filters)


async def _inbox(api: AgentApi, a: AgentArgs) -> dict[str, Any]:
    return {"notices": await api.inbox(a.agent_id)}


async def _session(api: AgentApi, a: AgentArgs) -> dict[str, Any]:
    return await api.session(a.agent_id)


async def _decisions(api: AgentApi, a: DecisionsArgs) -> dict[str, Any]:
    return {"decisions": await api.decisions(resolved=a.resolved)}


async def _check(api: AgentApi, a: ActionArgs) -> dict[str, Any]:
    return await api.check_action(a.agent_id, a.action, a.context, wait_s=a.wait_s)


async def _verdict(api: AgentApi, a: VerdictArgs) -> dict[str, Any]:
    return await api.action_verdict(a.decision, wait_s=a.wait_s)


async def _answer(api: AgentApi, a: AnswerArgs) -> dict[str, Any]:
    return await api.answer(
        a.decision,
        a.answer,
        why=a.why,
        text=a.text,
        budget=a.budget,
        idempotency_key=a.idempotency_key,
    )


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


TOOLS: tuple[Tool, ...] = (
    Tool(
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
    Tool(
        "agent_prompt",
        "Prompt an agent",
        "Start a turn of an idle or blocked agent (a blocked agent's decision is resolved, "
        "recorded with by and why). Without text the last prompt is sent again. Returns "
        '{"id", "accepted": "prompt", "turn"}; the turn runs in the background (see agent_status).',
        PromptArgs,
        _prompt,
        read_only=False,
        idempotent=False,
    ),
    Tool(
        "agent_stop",
        "Stop an agent",
        "End an agent and its live descendants (children first; keepChildren leaves them): "
        "a turn in flight gets SIGTERM, then SIGKILL after the spec's stopGraceS (now: at "
        'once). Returns {"id", "accepted": "stop", "stopped": [ids]}. A stopped agent takes '
        "no more commands but a person's restart.",
        StopArgs,
        _stop,
        read_only=False,
        idempotent=False,
    ),
    Tool(
        "run_get",
        "Show a run",
        'A run\'s tree (of runId, or of agentId\'s run), depth first, as {"runId", "rootId", '
        '"top", "headcount": {"active", "paused", "max", "allowPreempt"}, "agents": [{"id", '
        '"name", "parent", "depth", "state", "usage", "treeUsage", "budget"}]}: each agent\'s '
        "state, and what its subtree spent (treeUsage) against its limits (budget). An "
        "agent's token sees its own subtree of its own run.",
        RunArgs,
        _run,
        read_only=True,
        idempotent=True,
    ),
    Tool(
        "run_stop",
        "Stop a run",
        "Stop every live agent of a run, children before their parents, in one step with one "
        'reason (by, why). Returns {"runId", "accepted": "stop", "stopped": [ids]}. An '
        "agent's token stops only a run it is the root of.",
        RunStopArgs,
        _run_stop,
        read_only=False,
        idempotent=False,
    ),
    Tool(
        "agent_budget",
        "Change an agent's budget",
        "Change an agent's budget (maxTokens, maxCostUsd, maxTurns, deadlineS; null is "
        "unlimited), recorded with by and why. An agent held budget-exhausted that the new "
        "budget gives room goes idle (prompt it to go on). An agent's own token may lower "
        "budgets in its reach, never raise one. Returns the agent's record.",
        BudgetArgs,
        _budget,
        read_only=False,
        idempotent=False,
    ),
    Tool(
        "agent_status",
        "Agent status",
        "One agent's record: state (running, idle, blocked, failed, stopped), reason, last "
        "error and output, turns, consecutive failures, usage, parent and children.",
        AgentArgs,
        _status,
        read_only=True,
        idempotent=True,
    ),
    Tool(
        "agent_list",
        "List agents",
        "Agent summaries (state, reason, turns, parent, usage; no output: see agent_status), "
        'oldest first, as {"agents": [...], "nextCursor"}: pass nextCursor back as cursor '
        "for the next page (null: the last). Filters: state, run, parent, name.",
        ListArgs,
        _list,
        read_only=True,
        idempotent=True,
    ),
    Tool(
        "inbox_read",
        "Read an inbox",
        "The notices sent to an agent by its children (supervision needed, done, failed, "
        'blocked), pending or delivered, as {"notices": [...]}.',
        AgentArgs,
        _inbox,
        read_only=True,
        idempotent=True,
    ),
    Tool(
        "session_get",
        "Read a session",
        "An agent's session, the conversation of its turns, oldest first, as "
        '{"agentId", "history", "messages": [{"role", "turn", "content", "at", ...}]}: '
        "each turn's prompt (user), its output or the model's replies and tool calls "
        "(assistant, tool), or why it failed (error).",
        AgentArgs,
        _session,
        read_only=True,
        idempotent=True,
    ),
    Tool(
        "decisions_list",
        "List decisions",
        'Everything waiting on a person, oldest first, as {"decisions": [...]}: approvals '
        "(an agent asked before acting), blocked agents (a failure policy held them), agents "
        "held on their budget, agents frozen in a database; each with its id, kind, agent, "
        "reason and the answers it takes (answer with decision_answer). resolved=true lists "
        "the answered ones with who answered, when and why.",
        DecisionsArgs,
        _decisions,
        read_only=True,
        idempotent=True,
    ),
    Tool(
        "decision_answer",
        "Answer a decision",
        "Answer a decision of decisions_list with one of its answers, recorded with the "
        "caller's name and why. A decision answered already is refused, naming who "
        "answered. An agent may answer only its descendants' decisions of the kinds its "
        "spec's mayAnswer lists, never its own.",
        AnswerArgs,
        _answer,
        read_only=False,
        idempotent=False,
    ),
    Tool(
        "action_check",
        "Check an action",
        "Ask before acting: may this agent do this action? Its guardrails answer "
        '{"verdict": "allowed" | "blocked" | "pending", "reason", "warnings", "decision"}. '
        "pending means a person was asked: wait with action_verdict and the decision id. "
        "Act only on allowed.",
        ActionArgs,
        _check,
        read_only=False,
        idempotent=False,
    ),
    Tool(
        "action_verdict",
        "Wait for an action's verdict",
        "The verdict of a check a person was asked about (the decision id action_check "
        "gave), waiting up to waitS seconds.",
        VerdictArgs,
        _verdict,
        read_only=True,
        idempotent=True,
    ),
    Tool(
        "db_targets",
        "List databases",
        "The databases agents reach through the gateway: name, dialect (postgresql or "
        "sqlite), number of tables, agents frozen there, and the limits each enforces "
        "(maxRows, maxBytes, maxStatementChars, statementTimeoutS, agentRole), as "
        '{"targets": [...]}.',
        NoArgs,
        _db_targets,
        read_only=True,
        idempotent=True,
    ),
    Tool(
        "db_schema",
        "Database schema",
        "The tables and columns of a database that agents may use (name, type, nullable, "
        "primary key).",
        DbTargetArgs,
        _db_schema,
        read_only=True,
        idempotent=True,
    ),
    Tool(
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
    Tool(
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
    Tool(
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
