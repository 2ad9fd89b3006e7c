"""Errors of the agent service: a ``DaemonError`` with a stable code each (the HTTP status
of every code is in :mod:`corral.daemon._status`)."""

from __future__ import annotations

from typing import Any

from corral.kernel import BudgetExhaustedError, CorralError, RefusalError, UsageError


class DaemonError(CorralError):
    """Base of the agent service's own refusals."""

    code = "daemon_error"


class InvalidSpecError(DaemonError, UsageError):
    """A spec or command body is invalid; ``problems`` lists every problem found."""

    code = "invalid_spec"

    def __init__(self, problems: list[dict[str, Any]], what: str = "agent spec") -> None:
        shown = "; ".join(f"{p['field']}: {p['message']}" for p in problems[:10])
        more = f" (and {len(problems) - 10} more)" if len(problems) > 10 else ""
        super().__init__(
            f"invalid {what}: {len(problems)} problem(s): {shown}{more}", problems=problems
        )
        self.problems = problems


class InvalidRequestError(InvalidSpecError):
    """A command body, a query parameter or a tool's arguments are invalid; ``problems``
    lists every problem (a spec inside them is ``InvalidSpecError``)."""

    code = "invalid_request"

    def __init__(self, problems: list[dict[str, Any]], what: str = "request") -> None:
        super().__init__(problems, what)


class InvalidQueryError(InvalidRequestError):
    """A list's query value is refused (``?limit=``, ``?cursor=``, a filter): each problem
    names the parameter, the bound and the value seen (HTTP 422)."""

    code = "invalid_query"


class GuardrailsFileError(InvalidSpecError):
    """The daemon-wide guardrails file (``corral serve --guardrails FILE``) cannot be used:
    it is missing, unreadable, not JSON, or holds invalid rules; ``problems`` lists them and
    ``path`` names the file."""

    code = "invalid_guardrails_file"

    def __init__(self, path: str, problems: list[dict[str, Any]]) -> None:
        super().__init__(problems, what=f"guardrails file {path!r}")
        self.details["path"] = path
        self.path = path


class UnstorableValueError(DaemonError):
    """The store refused events holding a value it cannot keep (a lone surrogate or NUL in a
    string); nothing was written. Input is refused before it gets this far, and text from
    harnesses is escaped, so this is the last line of defence."""

    code = "unstorable_value"

    def __init__(self, event_type: str, field: str, problem: str) -> None:
        super().__init__(
            f"the store cannot keep event {event_type!r}: {field} {problem}; nothing was written",
            event_type=event_type,
            field=field,
            problem=problem,
        )


class AgentNotFoundError(DaemonError):
    code = "agent_not_found"

    def __init__(self, agent_id: str) -> None:
        super().__init__(f"no agent with id {agent_id!r}", agent_id=agent_id)
        self.agent_id = agent_id


class TurnNotFoundError(DaemonError):
    """The agent has no record of that turn (never ran, or deleted with the agent)."""

    code = "turn_not_found"

    def __init__(self, agent_id: str, turn: int) -> None:
        super().__init__(f"agent {agent_id!r} has no turn {turn}", agent_id=agent_id, turn=turn)


class NameTakenError(DaemonError):
    """A live agent of the run already has the name a new agent asks for (names are
    unique among the live agents of a run); ``holder`` is its id (None: beyond the
    caller's reach)."""

    code = "name_taken"

    def __init__(self, name: str, run_id: str, holder: str | None) -> None:
        who = (
            f"live agent {holder!r}"
            if holder is not None
            else "a live agent beyond this token's reach"
        )
        super().__init__(
            f"the name {name!r} is taken in run {run_id!r} by {who}; names are unique among "
            "the live agents of a run: choose another, or stop the holder first",
            name=name,
            run_id=run_id,
            holder=holder,
        )
        self.name = name
        self.run_id = run_id
        self.holder = holder


class AmbiguousNameError(DaemonError):
    """A name several agents hold (in several runs, or none of them live): give the id.
    ``candidates`` lists some of them (``{id, runId, state, parent, createdAt}``), ``total``
    says how many there are."""

    code = "ambiguous_name"

    def __init__(self, name: str, candidates: list[dict[str, Any]], total: int) -> None:
        shown = ", ".join(f"{c['id']} ({c['state']}, run {c['runId']})" for c in candidates)
        more = f" and {total - len(candidates)} more" if total > len(candidates) else ""
        super().__init__(
            f"{total} agents are named {name!r}: {shown}{more}; give the agent's id",
            name=name,
            candidates=candidates,
            total=total,
        )


class AgentNotLiveError(DaemonError):
    """The agent has ended (stopped or failed); it cannot take prompts any more."""

    code = "agent_not_live"

    def __init__(self, agent_id: str, state: str) -> None:
        super().__init__(
            f"agent {agent_id!r} is {state}; only running, idle and blocked agents take commands",
            agent_id=agent_id,
            state=state,
        )


class AgentLiveError(DaemonError):
    """A command for ended agents only (restart, delete) was given for a live one."""

    code = "agent_live"

    def __init__(self, agent_id: str, state: str, command: str, *, of: str | None = None) -> None:
        whose = f"agent {agent_id!r}" if of is None else f"descendant {agent_id!r} of {of!r}"
        details: dict[str, Any] = {"agent_id": agent_id, "state": state}
        if of is not None:
            details["of"] = of
        super().__init__(
            f"{whose} is {state}; only a stopped or failed agent can be {command} (stop it first)",
            **details,
        )


class ParentEndedError(DaemonError):
    """A restart of an agent whose parent has ended: a child lives under a live parent
    (whom its notices reach and whose budget bounds it), so the parent is restarted first."""

    code = "parent_ended"

    def __init__(self, agent_id: str, parent: str, state: str) -> None:
        super().__init__(
            f"agent {agent_id!r} cannot be restarted while its parent {parent!r} is {state}: "
            "restart the parent first",
            agent_id=agent_id,
            parent=parent,
            state=state,
        )


class AgentBusyError(DaemonError):
    """The agent is in the middle of a turn; prompt it again when it is idle or blocked."""

    code = "agent_busy"
    default_retryable = True

    def __init__(self, agent_id: str) -> None:
        super().__init__(
            f"agent {agent_id!r} is running a turn; prompt it once it is idle or blocked",
            agent_id=agent_id,
        )


class AgentHeldError(DaemonError):
    """The agent is held (``blocked``) waiting on a person: its process may begin no turn
    until they answer the decision (``retry`` frees it). A hold on its budget is
    :class:`AgentBudgetExhaustedError` instead."""

    code = "agent_held"

    def __init__(self, agent_id: str, reason: str | None, decision: str | None) -> None:
        on = f"decision {decision!r}" if decision else "a person"
        super().__init__(
            f"agent {agent_id!r} is held ({reason or 'blocked'}) waiting on {on}; it begins "
            "no turn until a person answers (retry frees it: corral decisions)",
            agent_id=agent_id,
            reason=reason,
            decision=decision,
        )


class ExternalAgentError(DaemonError):
    """A prompt for an agent that runs in its own process (harness ``external``): the daemon
    runs none of its turns, so it cannot run this one. Its process begins its turns itself
    (``POST /agents/{id}/turns``); a person frees a held one by answering its decision."""

    code = "agent_external"

    def __init__(self, agent_id: str) -> None:
        super().__init__(
            f"agent {agent_id!r} runs in its own process (harness 'external'): that process "
            f"begins its turns (POST /agents/{agent_id}/turns); the daemon cannot run a prompt "
            "for it (answer its decision to free a held one)",
            agent_id=agent_id,
        )


class NotExternalError(DaemonError):
    """Beginning or ending a turn of an agent whose turns the daemon runs itself (any
    harness but ``external``)."""

    code = "not_external"

    def __init__(self, agent_id: str, harness: str) -> None:
        super().__init__(
            f"agent {agent_id!r} runs harness {harness!r}: the daemon runs its turns (prompt "
            "it); only an agent of harness 'external' begins and ends its own",
            agent_id=agent_id,
            harness=harness,
        )


class TurnNotOpenError(DaemonError):
    """An end for a turn that is not open to be ended now: it is being settled (a stop is
    interrupting it, a store blip is retried). Retryable: asked again, the turn's settled
    outcome is answered."""

    code = "turn_not_open"
    default_retryable = True

    def __init__(self, agent_id: str, turn: int) -> None:
        super().__init__(
            f"agent {agent_id!r}'s turn {turn} is being settled; ask again for its outcome",
            agent_id=agent_id,
            turn=turn,
        )


class AgentBudgetExhaustedError(DaemonError):
    """The agent's budget leaves no room for another turn; the turn did not start."""

    code = "budget_exhausted"

    def __init__(self, agent_id: str, cause: BudgetExhaustedError) -> None:
        # Held by an ancestor's budget (see AncestorBudgetExhaustedError): that is the one
        # to raise.
        ancestor = getattr(cause, "ancestor", None)
        whose = agent_id if ancestor is None else ancestor
        super().__init__(
            f"agent {agent_id!r}: {cause.message}; the turn did not start (raise the budget: "
            f"PATCH /agents/{whose}, or corral budget {whose})",
            agent_id=agent_id,
            dimension=cause.dimension,
            limit=cause.limit,
            used=cause.used,
            **({} if ancestor is None else {"ancestor": ancestor}),
        )


class AncestorBudgetExhaustedError(BudgetExhaustedError):
    """An ancestor's budget leaves no room for a turn of one of its descendants: every turn
    counts against the agent and each ancestor (``ancestor`` names it; ``limit`` and ``used``
    are the ancestor's limit and what its whole subtree spent)."""

    def __init__(self, ancestor: str, name: str, cause: BudgetExhaustedError) -> None:
        super().__init__(cause.dimension, cause.limit, cause.used)
        self.ancestor = ancestor
        self.details["ancestor"] = ancestor
        self.message = f"the budget of ancestor {ancestor!r} ({name}) has no room: {cause.message}"
        self.args = (self.message,)


class RunNotFoundError(DaemonError):
    """No agent belongs to a run of that id."""

    code = "run_not_found"

    def __init__(self, run_id: str) -> None:
        super().__init__(f"no run with id {run_id!r}", run_id=run_id)


class NothingToSendError(DaemonError):
    code = "nothing_to_send"

    def __init__(self, agent_id: str) -> None:
        super().__init__(
            f"agent {agent_id!r} has no earlier prompt to re-send; give a text",
            agent_id=agent_id,
        )


class IdempotencyConflictError(DaemonError):
    """The idempotency key was used before for a different command."""

    code = "idempotency_conflict"

    def __init__(self, key: str, first: str, now: str, differs: list[str] | None = None) -> None:
        if differs:
            # The same command on the same agent: what differs is the arguments.
            told = f"{first} with other arguments (differing: {', '.join(differs)})"
        else:
            told = f"{first}, not {now}"
        super().__init__(
            f"idempotency key {key!r} was first used for {told}; use a new key for new work",
            key=key,
            first=first,
            now=now,
            differs=differs or [],
        )


class SpawnRefusedError(DaemonError, RefusalError):
    """The run's headcount cap is reached (retryable: a slot may free up)."""

    code = "spawn_budget_exceeded"
    default_retryable = True

    def __init__(self, run_id: str, max_agents: int, live: int, why: str | None = None) -> None:
        # ``live``: the agents that count against the cap (paused ones do not).
        super().__init__(
            f"spawn budget exceeded: run {run_id!r} has {live} live agents of a cap of "
            f"{max_agents}" + (f" ({why})" if why else ""),
            run_id=run_id,
            max_agents=max_agents,
            live=live,
        )


class AgentPausedError(DaemonError):
    """The agent is paused (preempted at its run's headcount cap): it takes no prompt until
    it resumes, which it does by itself as soon as headcount frees (retryable)."""

    code = "agent_paused"
    default_retryable = True

    def __init__(self, agent_id: str, by: str | None) -> None:
        super().__init__(
            f"agent {agent_id!r} is paused (preempted by {by!r} at its run's headcount cap); "
            "it resumes by itself when headcount frees: try again then",
            agent_id=agent_id,
            by=by,
        )


class StoreUnavailableError(DaemonError):
    """The store cannot be opened or written: the database is unreachable, dropped the
    connection, or (SQLite) the file cannot be opened as a database. Retryable unless said
    otherwise (a file that is not a database stays one)."""

    code = "store_unavailable"
    default_retryable = True

    def __init__(
        self,
        store: str,
        reason: str,
        sqlstate: str | None = None,
        *,
        retryable: bool | None = None,
    ) -> None:
        hint = "" if retryable is False else "; retry once the database answers"
        super().__init__(
            f"the store {store} is unavailable: {reason}{hint}",
            retryable=retryable,
            store=store,
            reason=reason,
            sqlstate=sqlstate,
        )
        self.store = store
        self.reason = reason
        self.sqlstate = sqlstate


class ServiceClosedError(DaemonError):
    """The service is shutting down and takes no more commands (retryable: a restarted
    daemon will)."""

    code = "shutting_down"
    default_retryable = True

    def __init__(self, command: str) -> None:
        super().__init__(
            f"the daemon is shutting down: {command} was not applied; retry once it is back",
            command=command,
        )


class UnauthorizedError(DaemonError):
    code = "unauthorized"

    def __init__(self) -> None:
        super().__init__("a valid bearer token is required")


class OutOfScopeError(DaemonError):
    """An agent's token reaches only that agent and its descendants."""

    code = "out_of_scope"

    def __init__(self, principal: str, target: str) -> None:
        super().__init__(
            f"the token of agent {principal!r} reaches only that agent and its descendants, "
            f"not {target}",
            principal=principal,
            target=target,
        )


class UnknownTargetError(DaemonError):
    """No database of that name (or none configured, or several and none named)."""

    code = "unknown_target"

    def __init__(self, target: str | None, names: list[str]) -> None:
        if not names:
            message = "the daemon fronts no database: start it with --db NAME=DSN"
        elif target is None:
            message = f"several databases are configured ({', '.join(names)}): name one as target"
        else:
            message = f"no database named {target!r}; the databases are {', '.join(names)}"
        super().__init__(message, target=target, targets=names)


class GatewayNotInstalledError(DaemonError, UsageError):
    """``--db`` was given but the gateway's dependencies are not installed."""

    code = "gateway_not_installed"

    def __init__(self, missing: str) -> None:
        super().__init__(
            f"--db needs the gateway extra (missing module {missing!r}): "
            "pip install 'corral[gateway]'",
            missing=missing,
        )


class OtelNotInstalledError(DaemonError, UsageError):
    """Traces are to be exported (``--otlp-endpoint``, ``OTEL_EXPORTER_OTLP_ENDPOINT``) but
    OpenTelemetry's SDK and exporter are not installed."""

    code = "otel_not_installed"

    def __init__(self, missing: str) -> None:
        super().__init__(
            f"exporting traces needs the otel extra (missing module {missing!r}): "
            "pip install 'corral[otel]'",
            missing=missing,
        )


class NotFrozenError(DaemonError):
    """A reinstatement of an agent that is not frozen in that database (already
    reinstated, perhaps by someone else)."""

    code = "not_frozen"

    def __init__(self, target: str, agent_id: str) -> None:
        super().__init__(
            f"agent {agent_id!r} is not frozen in {target!r}: nothing to reinstate",
            target=target,
            agent_id=agent_id,
        )


class DecisionNotFoundError(DaemonError):
    code = "decision_not_found"

    def __init__(self, decision_id: str) -> None:
        super().__init__(f"no decision {decision_id!r}", decision_id=decision_id)


class DecisionAnsweredError(DaemonError):
    """The decision was answered already: the first answer stands."""

    code = "decision_answered"

    def __init__(
        self, decision_id: str, answer: str | None, by: str | None, at: str | None
    ) -> None:
        super().__init__(
            f"decision {decision_id!r} was answered already: {answer!r} by "
            f"{by or 'nobody named'} at {at}",
            decision_id=decision_id,
            answer=answer,
            by=by,
            at=at,
        )


class AnswerNotAcceptedError(DaemonError, UsageError):
    """The answer is not one the decision takes."""

    code = "answer_not_accepted"

    def __init__(self, decision_id: str, kind: str, answer: object, accepted: list[str]) -> None:
        super().__init__(
            f"decision {decision_id!r} ({kind}) takes the answers {accepted}, got {answer!r}",
            decision_id=decision_id,
            kind=kind,
            answer=answer,
            accepted=accepted,
        )


class TokenExistsError(DaemonError):
    """A named operator token is live under that name (or the name is the daemon's own)."""

    code = "token_exists"

    def __init__(self, name: str, live: str, created_at: str | None) -> None:
        if created_at is None:
            said = f"{name!r} is the name of the daemon's own token; choose another name"
        else:
            same = "" if live == name else f", and {name!r} differs from it only in case"
            said = (
                f"a token named {live!r} is live since {created_at}{same}; revoke it first "
                f"(corral token revoke {live}) or choose another name"
            )
        super().__init__(said, name=name, live=live, created_at=created_at)


class TokenNotFoundError(DaemonError):
    """No live named operator token has that name (never made, or already revoked)."""

    code = "token_not_found"

    def __init__(self, name: str) -> None:
        super().__init__(f"no live token named {name!r} (corral token list shows them)", name=name)


class TokenFileError(DaemonError, UsageError):
    """The daemon's token file cannot be trusted or used: readable by others, owned by
    someone else, not a regular file, or not a token. Nothing is sent or served with it."""

    code = "token_file_unsafe"

    def __init__(self, path: str, problem: str, fix: str) -> None:
        super().__init__(f"the token file {path} {problem}: {fix}", path=path, problem=problem)


class TooManyApprovalsError(DaemonError):
    """The agent (or its run, ``run``) has as many approvals waiting on people as it may;
    one must be answered (or time out) before it asks again."""

    code = "too_many_approvals"
    default_retryable = True

    def __init__(self, agent_id: str, limit: int, waiting: int, *, run: str | None = None) -> None:
        who = f"agent {agent_id!r}" if run is None else f"the run {run!r} of agent {agent_id!r}"
        super().__init__(
            f"{who} has {waiting} approvals waiting on people, the most it may have at once "
            f"is {limit}: wait for an answer before asking again",
            agent_id=agent_id,
            limit=limit,
            waiting=waiting,
            run=run,
        )


# --- several daemons on one store (see _cluster) -----------------------------------------------


class NotOwnerError(DaemonError):
    """This daemon no longer holds the agent's lease (it was paused or cut off from the
    database past its lease, and another daemon took the agent over): nothing was written.
    Retryable: the agent's owner takes the command, through any daemon."""

    code = "not_owner"
    default_retryable = True

    def __init__(self, agent_id: str, node: str) -> None:
        super().__init__(
            f"agent {agent_id!r} is not owned by daemon {node!r} any more: nothing was "
            "written; retry, and its owner takes the command",
            agent_id=agent_id,
            node=node,
        )
        self.agent_id = agent_id
        self.node = node


class OwnerUnreachableError(DaemonError):
    """The daemon that owns the agent did not answer a forwarded command (it may have just
    died): retryable, once its lease has run out another daemon adopts the agent
    (``retry_after_s`` says when at the latest)."""

    code = "owner_unreachable"
    default_retryable = True

    def __init__(self, agent_id: str, node: str, reason: str, retry_after_s: float) -> None:
        super().__init__(
            f"daemon {node!r}, which owns agent {agent_id!r}, did not answer ({reason}); "
            f"retry in {retry_after_s:g} s, when another daemon has adopted the agent if "
            f"{node!r} is gone",
            agent_id=agent_id,
            node=node,
            reason=reason,
            retry_after_s=retry_after_s,
        )
        self.retry_after_s = retry_after_s


class NodeNotFoundError(DaemonError):
    """``?node=NAME`` names no live daemon of this store (``GET /nodes`` lists them)."""

    code = "node_not_found"

    def __init__(self, node: str, live: list[str]) -> None:
        shown = ", ".join(live[:20]) if live else "none"
        super().__init__(
            f"no live daemon named {node!r} shares this store (live: {shown})",
            node=node,
            live=live[:20],
        )


class NodeTakenError(DaemonError, UsageError):
    """Another live daemon already runs under this node name (its heartbeat is fresh), or
    the store's live daemons use another token: this one does not start."""

    code = "node_taken"

    def __init__(self, node: str, why: str) -> None:
        super().__init__(f"daemon {node!r} cannot join the store: {why}", node=node, why=why)


class ClusterModeError(DaemonError, UsageError):
    """Daemons with and without ``--node`` on one store: a daemon alone acts for every
    agent, so it refuses to share the store, and a node refuses a store held by one alone;
    ``--node`` also needs a PostgreSQL store."""

    code = "cluster_mode"

    def __init__(self, why: str) -> None:
        super().__init__(why)
