"""The agent spec: what ``POST /agents`` takes (JSON, camelCase)."""

from __future__ import annotations

import json
import re
from typing import Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from corral.daemon._errors import InvalidSpecError
from corral.daemon._text import json_problems
from corral.daemon.guardrails._rules import RuleList, field_path
from corral.kernel import ExecutionBudget, SpawnBudget
from corral.recovery import RecoveryAction, RecoveryPolicy

NOTIFY_KINDS = ("done", "failed", "blocked")
ANSWER_KINDS = ("blocked", "approval")
SPEC_IDENTIFIERS = frozenset({"name", "parent"})
_FUNCTION_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_RESERVED_OPTIONS = frozenset({"model", "messages", "tools", "stream"})
_CAP_OPTIONS = frozenset({"max_tokens", "max_completion_tokens"})
# corral's own tools an ``openai`` agent may be given (``openai.corralTools``): the MCP tools
# of the same names, called with the agent's token (see corral.daemon._agent_tools).
CORRAL_TOOLS = (
    "agent_spawn",
    "agent_prompt",
    "agent_stop",
    "agent_status",
    "agent_list",
    "run_get",
    "session_get",
    "inbox_read",
    "decisions_list",
    "decision_answer",
    "action_check",
    "db_targets",
    "db_schema",
    "db_query",
)


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


# Numbers and booleans are strict (``Field(strict=True)``): JSON's true is not the number 1,
# and "5" is not 5, as in every other body of the API.


class BudgetSpec(_Model):
    """Per-agent limits; each None means unlimited."""

    max_tokens: int | None = Field(default=None, ge=0, strict=True)
    max_cost_usd: float | None = Field(default=None, ge=0, allow_inf_nan=False, strict=True)
    max_turns: int | None = Field(default=None, ge=0, strict=True)
    deadline_s: float | None = Field(default=None, ge=0, allow_inf_nan=False, strict=True)

    def to_budget(self) -> ExecutionBudget:
        return ExecutionBudget(
            max_tokens=self.max_tokens,
            max_cost_usd=self.max_cost_usd,
            max_turns=self.max_turns,
            deadline_s=self.deadline_s,
        )


class SpawnBudgetSpec(_Model):
    """The headcount cap of the run a root agent starts (root included)."""

    max_agents: int = Field(default=50, ge=1, strict=True)
    allow_preempt: bool = Field(default=True, strict=True)

    def to_budget(self) -> SpawnBudget:
        return SpawnBudget(max_agents=self.max_agents, allow_preempt=self.allow_preempt)


class RecoverySpec(_Model):
    """What the daemon does with a stalled turn (see ``heartbeat_s``): seed 000's
    :class:`corral.recovery.RecoveryPolicy`, field for field.

    ``action`` (``restart``, ``escalate`` or ``eject``) is what a stall leads to while the
    agent's count of stall recoveries is below both limits; once the count reaches
    ``escalate_after`` a stall escalates (the agent is held for a person), once it reaches
    ``max_retries`` it ejects (the agent fails). ``cooldown_s`` is the quiet time after a
    recovery: a stall inside it is recovered only when it ends, if the turn is still silent.
    The defaults are RecoveryPolicy's: restart, 3, 3, 5 s (so an agent is ejected after
    three restarts without being escalated; set ``escalate_after`` lower to escalate first).
    """

    action: Literal["restart", "escalate", "eject"] = "restart"
    max_retries: int = Field(default=3, ge=1, le=1000, strict=True)
    escalate_after: int = Field(default=3, ge=1, le=1000, strict=True)
    cooldown_s: float = Field(default=5.0, ge=0, le=86400, allow_inf_nan=False, strict=True)

    def to_policy(self) -> RecoveryPolicy:
        return RecoveryPolicy(
            max_retries=self.max_retries,
            escalate_after=self.escalate_after,
            cooldown_s=self.cooldown_s,
            default_action=RecoveryAction(self.action),
        )


class PriceSpec(_Model):
    input_per_mtok_usd: float = Field(ge=0, allow_inf_nan=False, strict=True)
    output_per_mtok_usd: float = Field(ge=0, allow_inf_nan=False, strict=True)


MAX_TOOLS = 32
MAX_TOOL_DESCRIPTION = 4096
MAX_TOOL_PARAMETERS_BYTES = 64 * 1024
MAX_TOOL_ARGV = 256
_TOOL_NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _no_tool_parameters() -> dict[str, Any]:
    return {"type": "object", "properties": {}}


def _problem(message: str) -> PydanticCustomError:
    # The message goes in as a value, so braces in what it quotes are not a template.
    return PydanticCustomError("invalid_tool", "{message}", {"message": message})


class OpenAIToolSpec(_Model):
    """One tool of an ``openai`` agent: a command the model may call.

    ``name`` is what the model calls (1 to 64 letters, digits, ``_`` or ``-``, as OpenAI
    requires of function names); ``parameters`` is the JSON Schema of its arguments (an
    object schema, at most 64 KiB as JSON; none by default); ``command`` is the argv (no
    shell) run for each call, with the arguments as JSON on its stdin and its stdout as the
    result.
    """

    name: str
    description: str = Field(default="", max_length=MAX_TOOL_DESCRIPTION)
    parameters: dict[str, Any] = Field(default_factory=_no_tool_parameters)
    command: list[str] = Field(min_length=1, max_length=MAX_TOOL_ARGV)

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not _TOOL_NAME_RE.fullmatch(name):
            raise _problem(
                "must be 1 to 64 letters, digits, '_' or '-' (what OpenAI takes as a "
                f"function name), got {name[:80]!r}"
            )
        return name

    @field_validator("parameters")
    @classmethod
    def _parameters(cls, parameters: dict[str, Any]) -> dict[str, Any]:
        if parameters.get("type") != "object":
            raise _problem('must be a JSON Schema object with "type": "object"')
        if not isinstance(parameters.get("properties", {}), dict):
            raise _problem('"properties" must be an object')
        try:
            size = len(json.dumps(parameters, allow_nan=False).encode())
        except (TypeError, ValueError, RecursionError):
            raise _problem("must be JSON (no NaN or infinity, not nested too deep)") from None
        if size > MAX_TOOL_PARAMETERS_BYTES:
            raise _problem(f"must be at most {MAX_TOOL_PARAMETERS_BYTES} bytes as JSON, got {size}")
        return parameters

    @field_validator("command")
    @classmethod
    def _command(cls, command: list[str]) -> list[str]:
        # What reaches a process's argv cannot hold NUL.
        for i, part in enumerate(command):
            if not part:
                raise _problem(f"argv entries must be non-empty strings; [{i}] is empty")
            if "\0" in part:
                raise _problem(f"argv entries must not contain NUL characters; [{i}] does")
        return command


class OpenAISpec(_Model):
    """The ``openai`` harness: the agent loop against an OpenAI-compatible server.

    ``model_options`` are body fields sent with every model call (``temperature``,
    ``max_tokens``, ...); ``max_tokens`` / ``max_completion_tokens`` bound a call's output,
    which is what a budget's worst case is estimated from. ``tools`` (at most 32, names
    unique) are commands the model may call (see :class:`OpenAIToolSpec`). ``corral_tools``
    gives the model corral's own tools, scoped by the agent's token: ``true`` for all of
    :data:`CORRAL_TOOLS`, a list for some of them, ``false`` (the default) for none.
    """

    base_url: str = Field(min_length=1)
    model: str = Field(min_length=1)
    api_key_env: str | None = Field(default=None, min_length=1)
    instructions: str | None = None
    price: PriceSpec | None = None
    model_options: dict[str, Any] = Field(default_factory=dict)
    tools: list[OpenAIToolSpec] = Field(default_factory=list, max_length=MAX_TOOLS)
    corral_tools: StrictBool | list[str] = False

    def corral_tool_names(self) -> list[str]:
        """The names of corral's tools the agent is given (none unless ``corralTools``)."""
        if self.corral_tools is True:
            return list(CORRAL_TOOLS)
        if self.corral_tools is False:
            return []
        return list(self.corral_tools)

    @field_validator("corral_tools")
    @classmethod
    def _known_corral_tools(cls, names: bool | list[str]) -> bool | list[str]:
        if isinstance(names, bool):
            return names
        for i, name in enumerate(names):
            if name not in CORRAL_TOOLS:
                raise _problem(f"[{i}] must be one of {list(CORRAL_TOOLS)}, got {name[:80]!r}")
            if name in names[:i]:
                raise _problem(f"[{i}] {name!r} is listed twice")
        return names

    @field_validator("tools")
    @classmethod
    def _unique_tools(cls, tools: list[OpenAIToolSpec]) -> list[OpenAIToolSpec]:
        first: dict[str, int] = {}
        for i, tool in enumerate(tools):
            if tool.name in first:
                raise _problem(
                    f"tool names must be unique: {tool.name!r} is the name of "
                    f"tools[{first[tool.name]}] and tools[{i}]"
                )
            first[tool.name] = i
        return tools

    @model_validator(mode="after")
    def _no_name_twice(self) -> OpenAISpec:
        taken = sorted({t.name for t in self.tools} & set(self.corral_tool_names()))
        if taken:
            raise _problem(f"tools {taken} have the names of corral's tools (corralTools)")
        return self


class CompactionSpec(_Model):
    """How an ``openai`` agent's session is shaped before it goes to the model (the
    runtime's strategies, ``corral.runtime``).

    ``window`` keeps the newest ``maxMessages`` messages (whole tool-call turns);
    ``truncate`` keeps the newest messages that fit ``maxTokens`` (estimated: a token per
    four characters); ``summarize`` has the model summarise all but the newest ``keepLast``
    messages once there are more than ``triggerMessages``, paid from the agent's budget.
    Fields of another strategy are refused.
    """

    strategy: Literal["window", "truncate", "summarize"]
    max_messages: int | None = Field(default=None, ge=1, strict=True)
    max_tokens: int | None = Field(default=None, ge=1, strict=True)
    keep_last: int | None = Field(default=None, ge=0, strict=True)
    trigger_messages: int | None = Field(default=None, ge=1, strict=True)
    instructions: str | None = Field(default=None, min_length=1, max_length=4096)

    def problems(self) -> list[tuple[str, str]]:
        """(field, message) for fields the strategy does not take, or that disagree."""
        takes = {
            "window": {"max_messages"},
            "truncate": {"max_tokens"},
            "summarize": {"keep_last", "trigger_messages", "instructions"},
        }[self.strategy]
        found = [
            (to_camel(name), f"not an option of strategy {self.strategy!r}")
            for name in sorted(self.model_fields_set - takes - {"strategy"})
        ]
        keep = 6 if self.keep_last is None else self.keep_last
        trigger = 20 if self.trigger_messages is None else self.trigger_messages
        if self.strategy == "summarize" and keep >= trigger:
            found.append(("keepLast", f"must be below triggerMessages ({trigger}), got {keep}"))
        return found


class AgentSpec(_Model):
    """One agent, as given to ``POST /agents``.

    Harnesses: ``command`` (``command`` argv; the prompt on stdin, the result from stdout),
    ``python`` (``function`` as ``module:function``), ``openai`` (``openai`` options),
    ``external`` (an agent in its own process, which begins and ends its turns itself:
    ``POST /agents/{id}/turns``; see ``corral.daemon._external``).
    ``guardrails`` are the agent's own rules (``corral.daemon.guardrails``; its descendants
    inherit them); ``may_answer`` the kinds of its descendants' decisions its token answers;
    ``priority`` and ``on_preempt`` its place in its run's headcount (see ``_headcount``);
    ``heartbeat_s`` and ``recovery``: a turn silent for longer than ``heartbeat_s`` is
    stalled, and ``recovery`` (:class:`RecoverySpec`) decides what comes of it.
    Validating a spec never imports a custom rule's module.
    """

    name: str = Field(min_length=1, max_length=200)
    harness: Literal["command", "python", "openai", "external"]
    command: list[str] | None = Field(default=None, min_length=1)
    function: str | None = None
    openai: OpenAISpec | None = None
    env: dict[str, str] = Field(default_factory=dict)
    prompt: str | None = None
    on_failure: Literal["fail", "ask", "retry"] = "fail"
    max_retries: int | None = Field(default=None, ge=0, strict=True)
    max_consecutive_failures: int = Field(default=3, ge=1, strict=True)
    parent: str | None = Field(default=None, min_length=1)
    notify_on: list[str] = Field(default_factory=list)
    budget: BudgetSpec = Field(default_factory=BudgetSpec)
    spawn_budget: SpawnBudgetSpec | None = None
    turn_timeout_s: float = Field(default=600.0, gt=0, allow_inf_nan=False, strict=True)
    stop_grace_s: float = Field(default=10.0, ge=0, le=300, allow_inf_nan=False, strict=True)
    """How long a stopped agent's turn has to end after SIGTERM before it is killed (see
    "Stopping, restarting, deleting" in docs/daemon.md); 0 kills at once."""
    guardrails: RuleList = ()
    may_answer: list[Literal["blocked", "approval"]] = Field(default_factory=list)
    # Headcount and priority (docs/daemon.md, "Headcount and priority"; corral.daemon._headcount):
    priority: Literal["low", "normal", "high", "critical"] = "normal"
    """Who is paused for whom at the run's cap (only high and critical spawns preempt), the
    resume order, and the share of the daemon's concurrent turns (weights 1/2/4/8)."""
    on_preempt: Literal["finish", "cancel"] = "finish"
    """What a turn in flight does when its agent is preempted: ``finish`` runs it to its end
    (its outcome is kept; the agent stays paused), ``cancel`` cancels it (interrupted, not a
    failure; it runs again when the agent resumes)."""
    # A turn silent for longer than ``heartbeat_s`` seconds is stalled (None: never); what
    # comes of it is ``recovery``'s (its defaults when None). See "Stalled turns" in
    # docs/daemon.md.
    heartbeat_s: float | None = Field(default=None, gt=0, allow_inf_nan=False, strict=True)
    recovery: RecoverySpec | None = None
    # Coordinators (docs/daemon.md, "Coordinators"): ``wake`` starts a turn of this agent,
    # idle, when notices from its children reach it; at most ``max_wakes_per_minute`` wakes
    # in a row within a minute, then it is held for a person (``wake-limit``).
    wake: bool = Field(default=False, strict=True)
    max_wakes_per_minute: int = Field(default=20, ge=1, le=10_000, strict=True)
    # Sessions (see corral.daemon._sessions):
    history: Literal["none", "run", "permanent"] = "run"
    """What the agent's session keeps between turns: nothing, until its run ends, or as
    long as the agent's record."""
    compaction: CompactionSpec | None = None
    """How an ``openai`` agent's session is shaped for the model (None: all of it)."""

    def cross_field_problems(self) -> list[dict[str, Any]]:
        """Problems that need more than one field to see."""
        problems: list[dict[str, Any]] = []

        def bad(field: str, message: str) -> None:
            problems.append({"field": field, "message": message})

        needs = {"command": "command", "python": "function", "openai": "openai"}
        for harness, field in needs.items():
            given = getattr(self, field) is not None
            if self.harness == harness and not given:
                bad(field, f"required by harness {harness!r}")
            elif self.harness != harness and given:
                bad(field, f"only for harness {harness!r}, not {self.harness!r}")
        if self.harness == "external":
            # Nothing the daemon would start for it: its own process begins its turns.
            why = "not for harness 'external': its own process begins its turns"
            for field, given in (
                ("prompt", self.prompt is not None),
                ("env", bool(self.env)),
                ("wake", self.wake),
                ("heartbeatS", self.heartbeat_s is not None),
            ):
                if given:
                    bad(field, why)
        if self.command is not None and any(not part for part in self.command):
            bad("command", "argv entries must be non-empty strings")
        # What reaches a process's argv or environment cannot hold NUL; names cannot hold '='.
        if "\0" in self.name:
            bad("name", "must not contain NUL characters (it is passed in the environment)")
        if self.command is not None and any("\0" in part for part in self.command):
            bad("command", "argv entries must not contain NUL characters")
        for key, value in self.env.items():
            if not key or "=" in key or "\0" in key:
                bad(f"env.{key}", "variable names must be non-empty, without '=' or NUL")
            if "\0" in value:
                bad(f"env.{key}", "values must not contain NUL characters")
        if self.openai is not None:
            for key, value in self.openai.model_options.items():
                if not key or key in _RESERVED_OPTIONS:
                    bad(f"openai.modelOptions.{key}", "is set by the harness, not the spec")
                elif key in _CAP_OPTIONS and (
                    isinstance(value, bool) or not isinstance(value, int) or value < 1
                ):
                    bad(f"openai.modelOptions.{key}", "must be an integer >= 1")
        if self.function is not None and not _FUNCTION_RE.match(self.function):
            bad("function", f"must look like 'package.module:function', got {self.function!r}")
        if self.max_retries is not None and self.on_failure != "retry":
            bad("maxRetries", f"only meaningful with onFailure 'retry', not {self.on_failure!r}")
        for i, kind in enumerate(self.notify_on):
            if kind not in NOTIFY_KINDS:
                bad(f"notifyOn[{i}]", f"must be one of {list(NOTIFY_KINDS)}, got {kind!r}")
        if self.notify_on and self.parent is None:
            bad("notifyOn", "needs a parent to notify")
        if self.spawn_budget is not None and self.parent is not None:
            bad("spawnBudget", "only a root agent (no parent) sets its run's spawn budget")
        if self.recovery is not None and self.heartbeat_s is None:
            bad("recovery", "needs heartbeatS: without it no turn is ever stalled")
        for i, kind in enumerate(self.may_answer):
            if kind in self.may_answer[:i]:
                bad(f"mayAnswer[{i}]", f"{kind!r} is listed twice")
        if self.compaction is not None:
            if self.harness != "openai":
                bad("compaction", f"only for harness 'openai', not {self.harness!r}")
            for name, message in self.compaction.problems():
                bad(f"compaction.{name}", message)
        return problems

    def text_problems(self) -> list[dict[str, Any]]:
        """Text no store could keep (a lone surrogate or NUL, in any field), and control
        characters in ``name`` and ``parent`` (names are printed and passed on)."""
        return json_problems(self.to_json(), identifiers=SPEC_IDENTIFIERS)

    def to_json(self) -> dict[str, Any]:
        """The spec as JSON with camelCase keys, defaults included."""
        return self.model_dump(mode="json", by_alias=True)


def parse_spec(data: Any) -> AgentSpec:
    """Validate ``data`` into an AgentSpec; raise InvalidSpecError listing every problem."""
    if not isinstance(data, dict):
        raise InvalidSpecError([{"field": "(body)", "message": "must be a JSON object"}])
    try:
        spec = AgentSpec.model_validate(data)
    except pydantic.ValidationError as exc:
        raise InvalidSpecError(problems_of(exc)) from None
    problems = spec.cross_field_problems()
    # A field the cross-field checks already found wanting (NUL in argv, say) is told once.
    seen = {p["field"].split(".")[0] for p in problems}
    problems += [p for p in spec.text_problems() if p["field"].split(".")[0] not in seen]
    if problems:
        raise InvalidSpecError(problems)
    return spec


# Fields whose paths show list items as ``field[i]``, as the examples do; the older
# fields keep their dotted paths, which clients may already match.
_BRACKETED = frozenset({"guardrails", "mayAnswer"})


def problems_of(exc: pydantic.ValidationError) -> list[dict[str, Any]]:
    """Pydantic's errors as ``{"field", "message"}`` with camelCase dotted paths
    (``guardrails[2].match.regex`` under ``guardrails`` and ``mayAnswer``)."""
    found = []
    for error in exc.errors():
        loc = error["loc"]
        if loc and loc[0] in _BRACKETED:
            path = field_path("", loc)
        else:
            path = ".".join(str(part) for part in loc) or "(body)"
        message = error["msg"]
        if error["type"] == "extra_forbidden":
            message = "unknown field"
        found.append({"field": path, "message": message})
    return found
