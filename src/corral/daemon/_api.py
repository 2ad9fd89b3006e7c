"""The daemon's one way in: what a caller, the operator or an agent by its own token, may see
and do. The HTTP routes and the MCP tools both call it (see "One way in" in
docs/architecture.md)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from typing import Any, Protocol, runtime_checkable

from corral.daemon import _approvals, _listing, _names
from corral.daemon._approvals import Verdict
from corral.daemon._auth import Caller
from corral.daemon._client import page_args, spec_mapping
from corral.daemon._databases import Databases, waiting_decisions
from corral.daemon._errors import (
    AnswerNotAcceptedError,
    DecisionNotFoundError,
    NameTakenError,
    OutOfScopeError,
)
from corral.daemon._events import Event
from corral.daemon._external import Report
from corral.daemon._headcount import PRIORITIES
from corral.daemon._policy import BUDGET_EXHAUSTED
from corral.daemon._service import AgentService, CommandResult
from corral.daemon._spec import AgentSpec, parse_spec
from corral.daemon._state import ENDED_STATES
from corral.daemon.guardrails import has_custom
from corral.kernel import InvalidArgumentError
from corral.kernel import _validate as v

Json = dict[str, Any]


@runtime_checkable
class AgentApi(Protocol):
    """The agent service's commands and queries, as JSON dicts.

    ``spawn`` answers the new agent's record; ``prompt`` and ``stop`` answer
    ``{"id", "accepted"}``; ``budget`` changes an agent's budget (camelCase dimensions, None
    for unlimited) and answers its record. A retried command with the same
    ``idempotency_key`` answers the first answer and is not applied twice. Every refusal is
    a ``CorralError`` subclass (``AgentNotFoundError``, ``InvalidSpecError``, ...).
    """

    async def spawn(self, spec: Mapping[str, Any], idempotency_key: str | None = None) -> Json: ...

    async def prompt(
        self,
        agent_id: str,
        text: str | None = None,
        by: str | None = None,
        why: str | None = None,
        idempotency_key: str | None = None,
    ) -> Json: ...

    async def stop(
        self,
        agent_id: str,
        by: str | None = None,
        why: str | None = None,
        idempotency_key: str | None = None,
        now: bool = False,
        keep_children: bool = False,
    ) -> Json: ...

    async def restart(
        self,
        agent_id: str,
        by: str | None = None,
        why: str | None = None,
        idempotency_key: str | None = None,
    ) -> Json:
        """Run a stopped or failed agent again: ``{"id", "accepted", "turn"}``."""
        ...

    async def delete(
        self,
        agent_id: str,
        by: str | None = None,
        why: str | None = None,
        idempotency_key: str | None = None,
    ) -> Json:
        """Delete an ended agent and its descendants: ``{"id", "deleted"}``."""
        ...

    async def budget(
        self,
        agent_id: str,
        budget: Mapping[str, Any],
        by: str | None = None,
        why: str | None = None,
        idempotency_key: str | None = None,
    ) -> Json: ...

    async def patch(
        self,
        agent_id: str,
        changes: Mapping[str, Any],
        by: str | None = None,
        why: str | None = None,
        idempotency_key: str | None = None,
    ) -> Json:
        """Change a live agent: ``changes`` holds ``budget``, ``notifyOn`` and/or
        ``guardrails`` (camelCase, as ``PATCH /agents/{id}`` takes them); its record."""
        ...

    async def get(self, agent_id: str) -> Json: ...

    async def run(self, run_id: str) -> Json: ...

    async def stop_run(
        self,
        run_id: str,
        by: str | None = None,
        why: str | None = None,
        idempotency_key: str | None = None,
    ) -> Json: ...

    async def list_agents(self, **filters: str | None) -> list[Json]:
        """Every agent's summary matching ``filters`` (``state``, ``run``, ``parent``,
        ``name``), oldest first: :meth:`list_page` followed to its last page."""
        ...

    async def list_page(
        self, limit: int | None = None, cursor: str | None = None, **filters: str | None
    ) -> Json:
        """One page of agent summaries: ``{"agents", "nextCursor"}`` (None: the last page);
        see :mod:`corral.daemon._listing`."""
        ...

    async def inbox(self, agent_id: str) -> list[Json]: ...

    async def session(self, agent_id: str) -> Json:
        """The agent's session: ``{"agentId", "history", "messages"}``."""
        ...

    async def decisions(self, resolved: bool = False) -> list[Json]: ...

    async def decision(self, decision_id: str) -> Json: ...

    async def answer(
        self,
        decision_id: str,
        answer: str,
        why: str | None = None,
        by: str | None = None,
        text: str | None = None,
        budget: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> Json: ...

    async def check_action(
        self,
        agent_id: str,
        action: str,
        context: Mapping[str, Any] | None = None,
        wait_s: float = 0.0,
    ) -> Json: ...

    async def action_verdict(self, decision_id: str, wait_s: float = 0.0) -> Json: ...

    # The gateway (a daemon started with --db NAME=DSN). ``target`` None names the only
    # database there is; gateway refusals raise errors with the gateway's codes.

    async def db_targets(self) -> list[Json]: ...

    async def db_schema(self, target: str | None = None) -> Json: ...

    async def db_query(
        self, agent_id: str, request: Mapping[str, Any], target: str | None = None
    ) -> Json: ...

    async def db_status(self, agent_id: str, target: str | None = None) -> Json: ...

    async def db_history(self, agent_id: str, target: str | None = None) -> list[Json]: ...

    async def db_freeze(
        self, agent_id: str, reason: str, by: str | None = None, target: str | None = None
    ) -> Json: ...

    async def db_reinstate(
        self, agent_id: str, by: str | None, reason: str, target: str | None = None
    ) -> Json: ...


class ScopedService:
    """The service and its databases as one caller sees them.

    ``principal`` None is an operator (the daemon's own token, a named operator token, or
    none): everything. An
    agent id is that agent's own token: it reaches the agent and its descendants only
    (:meth:`AgentService.in_scope`); it lists and reads them, prompts and stops them, lowers
    (never raises) their budgets, spawns
    children under them (never a new root), reads their events one agent at a time and
    their decisions, queries a database as itself only, reads and freezes its subtree's
    breakers (in its own name), and may not reinstate (a person decides). Anything else
    raises ``OutOfScopeError`` (403 ``out_of_scope``), before the command is applied.

    ``caller_name`` is who is calling, as the token says (:class:`~._auth.Caller`'s
    ``name``: an operator token's name, or the agent's id); None is trusted code in this
    process, which no request can be.
    """

    __slots__ = ("caller_name", "databases", "principal", "service")

    def __init__(
        self,
        service: AgentService,
        databases: Databases,
        principal: str | None = None,
        caller_name: str | None = None,
    ) -> None:
        self.service = service
        self.databases = databases
        self.principal = principal
        # The caller's token name (None: code in this process, trusted to name anyone).
        self.caller_name = caller_name

    def as_agent(self, agent_id: str | None) -> ScopedService:
        """The same service as seen with ``agent_id``'s token (None: in-process code)."""
        return ScopedService(self.service, self.databases, agent_id, agent_id)

    def as_caller(self, caller: Caller | None) -> ScopedService:
        """The same service as ``caller`` sees it (None: trusted code in this process)."""
        if caller is None:
            return ScopedService(self.service, self.databases)
        return ScopedService(self.service, self.databases, caller.agent, caller.name)

    async def _elsewhere(self, agent_id: str) -> AgentApi | None:
        """A client of the daemon that owns ``agent_id``, acting as this caller, when
        another daemon of the store owns it (several daemons: ``_cluster``); else None."""
        relay = self.service.relay
        if relay is None or agent_id not in self.service.store.state.agents:
            return None
        return await relay.api_for(agent_id, self.caller_name, self.principal)

    def check(self, agent_id: str) -> None:
        """Refuse an agent outside the caller's reach (``OutOfScopeError``)."""
        self.check_live()
        if self.principal is not None and not self.service.in_scope(self.principal, agent_id):
            raise OutOfScopeError(self.principal, f"agent {agent_id!r}")

    def resolve(self, ref: str) -> str:
        """The id of the agent ``ref`` (an id or a name) stands for, among the agents the
        caller reaches; ``ref`` itself when none is (see :mod:`._names`)."""
        principal = self.principal
        if principal is None:
            return _names.resolve(self.service.store.state.agents, ref)
        return _names.resolve(
            self.service.store.state.agents, ref, lambda a: self.service.in_scope(principal, a)
        )

    def check_live(self) -> None:
        """An ended agent's token opens nothing any more: whatever it left running loses
        its reach with it (``OutOfScopeError``)."""
        principal = self.principal
        if principal is None:
            return
        rec = self.service.store.state.agents.get(principal)
        if rec is None or rec["state"] in ENDED_STATES:
            state = "unknown" if rec is None else rec["state"]
            raise OutOfScopeError(principal, f"anything: the agent is {state}")

    def _mine(self, items: list[Json], key: str) -> list[Json]:
        principal = self.principal
        if principal is None:
            return items
        self.check_live()
        return [item for item in items if self.service.in_scope(principal, item[key])]

    # --- agents ------------------------------------------------------------------------------

    async def spawn(
        self, spec: AgentSpec | Mapping[str, Any], idempotency_key: str | None = None
    ) -> CommandResult:
        """A new agent; an agent's token spawns only under an agent it reaches. Its
        ``parent`` may be named by id or name (the record holds the id)."""
        parsed = spec if isinstance(spec, AgentSpec) else parse_spec(dict(spec))
        if parsed.parent is not None:
            parsed = parsed.model_copy(update={"parent": self.resolve(parsed.parent)})
        if self.principal is None:
            return await self.service.spawn(parsed, idempotency_key=idempotency_key)
        if parsed.parent is None:
            raise OutOfScopeError(self.principal, "a new root agent (give a parent)")
        if has_custom(parsed.guardrails):
            raise OutOfScopeError(
                self.principal, "a custom Python guardrail (it would run inside the daemon)"
            )
        # A child answers no more kinds of decisions than the agent that makes it: an agent
        # must not hand a helper the approvals a person was meant to give.
        own = self.service.get(self.principal)["spec"]
        granted = set(own.get("mayAnswer", []))
        beyond = sorted(set(parsed.may_answer) - granted)
        if beyond:
            raise OutOfScopeError(
                self.principal,
                f"a child that may answer {beyond} (its own spec's mayAnswer is {sorted(granted)})",
            )
        # Nor a higher priority than its own: a helper of higher priority would pause others'
        # agents at the run's cap and take a larger share of the daemon's turns.
        mine = own.get("priority", "normal")
        if PRIORITIES[parsed.priority] > PRIORITIES.get(mine, PRIORITIES["normal"]):
            raise OutOfScopeError(
                self.principal,
                f"a child of priority {parsed.priority!r} (its own spec's priority is {mine!r})",
            )
        self.check(parsed.parent)
        principal = self.principal
        try:
            return await self.service.spawn(parsed, idempotency_key=idempotency_key)
        except NameTakenError as exc:
            raise _names.hidden(exc, lambda a: self.service.in_scope(principal, a)) from None

    async def prompt(
        self,
        agent_id: str,
        text: str | None = None,
        *,
        by: str | None = None,
        why: str | None = None,
        idempotency_key: str | None = None,
    ) -> CommandResult:
        self.check(agent_id)
        remote = await self._elsewhere(agent_id)
        if remote is not None:
            body = await remote.prompt(
                agent_id, text, by=by, why=why, idempotency_key=idempotency_key
            )
            return CommandResult(202, body)
        self.check_answer(agent_id, "blocked", "retry")
        by, note = self.attribution(by, "prompting")
        return await self.service.prompt(
            agent_id, text, by=by, why=why, idempotency_key=idempotency_key, note=note
        )

    def check_own(self, agent_id: str, doing: str) -> None:
        """Refuse an agent outside the caller's reach, and an agent's token acting as
        another agent (``doing``): an agent reports its own turns only."""
        self.check(agent_id)
        if self.principal is not None and agent_id != self.principal:
            raise OutOfScopeError(self.principal, f"{doing} of agent {agent_id!r}")

    async def begin_turn(
        self, agent_id: str, prompt: str, *, idempotency_key: str | None = None
    ) -> CommandResult:
        """An agent in its own process begins a turn (:meth:`AgentService.begin_turn`)."""
        self.check_own(agent_id, "beginning the turns")
        return await self.service.begin_turn(agent_id, prompt, idempotency_key=idempotency_key)

    async def end_turn(self, agent_id: str, turn: int, report: Report) -> Json:
        """An agent in its own process ends a turn (:meth:`AgentService.end_turn`)."""
        self.check_own(agent_id, "ending the turns")
        return await self.service.end_turn(agent_id, turn, report)

    async def stop(
        self,
        agent_id: str,
        *,
        by: str | None = None,
        why: str | None = None,
        idempotency_key: str | None = None,
        now: bool = False,
        keep_children: bool = False,
    ) -> CommandResult:
        self.check(agent_id)
        remote = await self._elsewhere(agent_id)
        if remote is not None:
            body = await remote.stop(
                agent_id,
                by=by,
                why=why,
                idempotency_key=idempotency_key,
                now=now,
                keep_children=keep_children,
            )
            return CommandResult(202, body)
        self.check_own_decision(agent_id)
        by, note = self.attribution(by, "stopping")
        return await self.service.stop(
            agent_id,
            by=by,
            why=why,
            idempotency_key=idempotency_key,
            note=note,
            now=now,
            keep_children=keep_children,
        )

    async def restart(
        self,
        agent_id: str,
        *,
        by: str | None = None,
        why: str | None = None,
        idempotency_key: str | None = None,
    ) -> CommandResult:
        """Restart an ended agent in reach (an agent's token: a descendant, in its own
        name; its own token died with it)."""
        self.check(agent_id)
        remote = await self._elsewhere(agent_id)
        if remote is not None:
            return CommandResult(
                202, await remote.restart(agent_id, by=by, why=why, idempotency_key=idempotency_key)
            )
        by, _ = self.attribution(by, "restarting")
        return await self.service.restart(agent_id, by=by, why=why, idempotency_key=idempotency_key)

    async def delete(
        self,
        agent_id: str,
        *,
        by: str | None = None,
        why: str | None = None,
        idempotency_key: str | None = None,
    ) -> CommandResult:
        """Delete an ended agent: a person's decision (an agent's token is refused), as it
        deletes what supervision reads (sessions, working directories)."""
        if self.principal is not None:
            raise OutOfScopeError(self.principal, "deleting an agent (a person decides)")
        remote = await self._elsewhere(agent_id)
        if remote is not None:
            return CommandResult(
                200, await remote.delete(agent_id, by=by, why=why, idempotency_key=idempotency_key)
            )
        by, _ = self.attribution(by, "deleting")
        return await self.service.delete(agent_id, by=by, why=why, idempotency_key=idempotency_key)

    async def change_budget(
        self,
        agent_id: str,
        changes: Mapping[str, Any],
        *,
        by: str | None = None,
        why: str | None = None,
        idempotency_key: str | None = None,
    ) -> CommandResult:
        """Change a budget in reach; an agent's token may lower budgets (its own included),
        never raise one, and changes them in its own name."""
        self.check(agent_id)
        remote = await self._elsewhere(agent_id)
        if remote is not None:
            body = await remote.budget(
                agent_id, changes, by=by, why=why, idempotency_key=idempotency_key
            )
            return CommandResult(200, body)
        by, note = self.attribution(by, "changing a budget")
        return await self.service.change_budget(
            agent_id,
            changes,
            by=by,
            why=why,
            idempotency_key=idempotency_key,
            lower_only=self.principal,
            note=note,
        )

    async def patch(
        self,
        agent_id: str,
        changes: Mapping[str, Any],
        *,
        by: str | None = None,
        why: str | None = None,
        idempotency_key: str | None = None,
    ) -> CommandResult:
        """Change a live agent in reach (budget, notifyOn, guardrails: see ``_patch``); an
        agent's token may only tighten, and in its own name."""
        self.check(agent_id)
        remote = await self._elsewhere(agent_id)
        if remote is not None:
            return CommandResult(
                200,
                await remote.patch(
                    agent_id, changes, by=by, why=why, idempotency_key=idempotency_key
                ),
            )
        by, note = self.attribution(by, "changing an agent")
        return await self.service.patch(
            agent_id,
            changes,
            by=by,
            why=why,
            idempotency_key=idempotency_key,
            lower_only=self.principal,
            note=note,
        )

    def get(self, agent_id: str) -> Json:
        self.check(agent_id)
        return self.service.get(agent_id)

    # --- runs (see _runs) ----------------------------------------------------------------------

    def run(self, run_id: str) -> Json:
        """The run's tree: the operator sees all of it; an agent's token the subtree of its
        own agent, when the agent is in that run (``top`` says where the tree starts)."""
        principal = self.principal
        if principal is None:
            return self.service.run(run_id)
        self.check_live()
        if self.service.get(principal)["runId"] != run_id:
            raise OutOfScopeError(principal, f"run {run_id!r} (its own run is another)")
        return self.service.run(run_id, top=principal)

    async def stop_run(
        self,
        run_id: str,
        *,
        by: str | None = None,
        why: str | None = None,
        idempotency_key: str | None = None,
    ) -> CommandResult:
        """Stop every live agent of the run; an agent's token only the run it is the root of
        (and in its own name)."""
        principal = self.principal
        if principal is not None:
            self.check_live()
            rec = self.service.get(principal)
            if rec["runId"] != run_id or rec["parent"] is not None:
                raise OutOfScopeError(principal, f"stopping run {run_id!r} (only its root may)")
            self.check_own_decision(principal)
        by, note = self.attribution(by, "stopping a run")
        return await self.service.stop_run(
            run_id, by=by, why=why, idempotency_key=idempotency_key, note=note
        )

    def list_page(
        self,
        *,
        limit: int = _listing.DEFAULT_LIMIT,
        cursor: str | None = None,
        state: str | None = None,
        run: str | None = None,
        parent: str | None = None,
        name: str | None = None,
    ) -> Json:
        """A page of summaries (see :mod:`._listing`); an agent's token sees its subtree."""
        self.check_live()
        parent = _listing.check_filter("parent", parent)
        filters = {
            "state": _listing.check_filter("state", state),
            "run": _listing.check_filter("run", run),
            "parent": parent and self.resolve(parent),  # an id or a name
            "name": _listing.check_filter("name", name),
        }
        return self.service.list_page(within=self.principal, limit=limit, cursor=cursor, **filters)

    def inbox(self, agent_id: str) -> list[Json]:
        self.check(agent_id)
        return self.service.inbox(agent_id)

    def session(self, agent_id: str) -> Json:
        self.check(agent_id)
        return self.service.session(agent_id)

    def decisions(self, *, resolved: bool = False) -> list[Json]:
        """Everything waiting on a person (approvals, held agents, agents frozen in a
        database), oldest first; with ``resolved``, every answered one, newest first."""
        if resolved:
            return self._mine(self.service.decisions(resolved=True), "agentId")
        return self._mine(waiting_decisions(self.service, self.databases), "agentId")

    def resolutions(self) -> list[Json]:
        return self.decisions(resolved=True)

    def decision(self, decision_id: str) -> Json:
        """One decision, pending or answered (a gateway freeze's while it holds)."""
        if decision_id.startswith("g_"):
            for found in self.decisions():
                if found["id"] == decision_id:
                    return found
        found = self.service.decision(decision_id)
        self._check_decision(found)
        return found

    def _check_decision(self, found: Mapping[str, Any]) -> None:
        """A decision of an agent beyond the caller's reach is not found, to it."""
        self.check_live()
        if self.principal is not None and not self.service.in_scope(
            self.principal, found["agentId"]
        ):
            raise DecisionNotFoundError(str(found["id"]))

    # --- actions and decisions -----------------------------------------------------------------

    async def check_action(
        self, agent_id: str, action: Any, context: Any = None, *, wait_s: Any = 0.0
    ) -> Verdict:
        """An agent asks whether it may act: an agent's token asks for itself only."""
        self.check(agent_id)
        if self.principal is not None and agent_id != self.principal:
            raise OutOfScopeError(self.principal, f"checking an action as agent {agent_id!r}")
        return await self.service.check_action(agent_id, action, context, wait_s=wait_s)

    async def action_verdict(self, decision_id: str, *, wait_s: Any = 0.0) -> Verdict:
        found = self.service.decision(decision_id)
        self._check_decision(found)
        _approvals.check_input("-", None, wait_s)
        return await self.service.action_verdict(decision_id, wait_s=wait_s)

    def check_own_decision(self, agent_id: str) -> None:
        """An agent's token never answers the agent's own decision."""
        if self.principal is None or agent_id != self.principal:
            return
        rec = self.service.get(agent_id)
        if rec["state"] == "blocked":
            raise OutOfScopeError(self.principal, "answering its own decision (a person decides)")

    def check_answer(self, agent_id: str, kind: str, answer: str) -> None:
        """An agent's token answers a descendant's decision only when its spec's
        ``mayAnswer`` names the decision's kind; never its own."""
        if self.principal is None:
            return
        rec = self.service.get(agent_id)
        if kind != "approval" and rec["state"] != "blocked":
            return  # not a decision: prompting an idle agent
        self.check_own_decision(agent_id)
        if kind == "approval" and agent_id == self.principal:
            raise OutOfScopeError(self.principal, "answering its own decision (a person decides)")
        mine = self.service.get(self.principal)["spec"].get("mayAnswer", [])
        if rec.get("reason") == BUDGET_EXHAUSTED or kind not in mine:
            raise OutOfScopeError(
                self.principal,
                f"answering a descendant's {kind} decision ({answer}): its spec's mayAnswer "
                f"is {mine}",
            )

    async def answer(
        self,
        decision_id: str,
        answer: Any,
        *,
        by: str | None = None,
        why: str | None = None,
        text: str | None = None,
        budget: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> CommandResult:
        """Answer any decision the caller reaches (see :meth:`AgentService.answer`); a
        gateway freeze's only ``reinstate`` (a person's decision)."""
        if decision_id.startswith("g_"):
            found = self.decision(decision_id)
            if answer != "reinstate":
                raise AnswerNotAcceptedError(decision_id, "gateway_frozen", answer, ["reinstate"])
            self.check_reinstate()
            who, note = self.attribution(by, "reinstating")
            if why is None or not why.strip():
                raise InvalidArgumentError("answer", "why", "the reason for reinstating", why)
            if who is None:
                raise InvalidArgumentError("answer", "by", "the name of who decides", by)
            await self.databases.reinstate(
                found.get("target"), found["agentId"], by=who, reason=why, note=note
            )
            return CommandResult(
                200, {"decision": decision_id, "answer": answer, "agentId": found["agentId"]}
            )
        found = self.service.decision(decision_id)
        self._check_decision(found)
        remote = await self._elsewhere(found["agentId"])
        if remote is not None and isinstance(answer, str):
            body = await remote.answer(
                decision_id,
                answer,
                why=why,
                by=by,
                text=text,
                budget=budget,
                idempotency_key=idempotency_key,
            )
            return CommandResult(200, body)
        if found["state"] == "pending" and isinstance(answer, str):
            if answer == "stop" and found["kind"] != "approval":
                # Stopping a descendant is what an agent may do anyway (POST .../stop):
                # answered here too, in its own name, but never for itself.
                self.check_own_decision(found["agentId"])
            else:
                if self.principal is not None and found["kind"] == "budget_exhausted":
                    raise OutOfScopeError(
                        self.principal, "answering a budget decision (a person decides)"
                    )
                kind = "approval" if found["kind"] == "approval" else "blocked"
                self.check_answer(found["agentId"], kind, answer)
        who, note = self.attribution(by, "answering")
        return await self.service.answer(
            decision_id,
            answer,
            by=who,
            why=why,
            note=note,
            text=text,
            budget=budget,
            idempotency_key=idempotency_key,
            lower_only=self.principal,
        )

    def check_events(self, agent_id: str | None) -> None:
        """Refuse a read of the event log beyond the caller's reach: an agent's token reads
        one agent's events at a time."""
        if agent_id is None:
            if self.principal is not None:
                raise OutOfScopeError(self.principal, "the whole event log (add ?agent=ID)")
            return
        self.check(agent_id)

    async def events(
        self, after: int = 0, agent_id: str | None = None, limit: int = 1000
    ) -> list[Event]:
        self.check_events(agent_id)
        return await self.service.events(after, agent_id=agent_id, limit=limit)

    def subscribe(self, after: int, agent_id: str | None) -> AsyncGenerator[Event, None]:
        self.check_events(agent_id)
        return self.service.subscribe(after, agent_id=agent_id)

    # --- named operator tokens (a person's; an agent's token is refused) ---------------------

    def check_operator(self, doing: str) -> None:
        """Refuse an agent's token (``OutOfScopeError``): ``doing`` is a person's business."""
        if self.principal is not None:
            raise OutOfScopeError(self.principal, doing)

    def tokens(self) -> list[Json]:
        self.check_operator("the operator tokens")
        return self.service.tokens()

    async def create_token(self, name: str) -> Json:
        """A new operator token, recorded as made by the caller."""
        self.check_operator("making an operator token")
        return await self.service.create_token(name, by=self.caller_name)

    async def revoke_token(self, name: str) -> Json:
        """Revoke an operator token, recorded as revoked by the caller."""
        self.check_operator("revoking an operator token")
        return await self.service.revoke_token(name, by=self.caller_name)

    # --- the gateway -------------------------------------------------------------------------

    def targets(self) -> list[Json]:
        return self.databases.targets()

    def schema(self, target: str | None) -> Json:
        return self.databases.schema(target)

    def query_agent(self, agent_id: str | None) -> str | None:
        """The agent a gateway request runs as: an agent's token queries as itself (``agent``
        left out, or naming it)."""
        if self.principal is None:
            return agent_id
        self.check_live()
        if agent_id is not None and agent_id != self.principal:
            raise OutOfScopeError(self.principal, f"queries as agent {agent_id!r}")
        return self.principal

    def check_ancestors_not_frozen(self, target: str | None) -> None:
        """An agent's token does not reach a database where one of its ancestors is frozen:
        a helper it made must not lift its freeze without a person."""
        principal = self.principal
        if principal is None or not self.databases.names:
            return
        rec = self.service.store.state.agents.get(principal)
        while rec is not None and rec["parent"] is not None:
            parent = rec["parent"]
            if self.databases.status(target, parent).get("frozen"):
                raise OutOfScopeError(
                    principal,
                    f"database {target or 'the only one'}: its ancestor {parent!r} is frozen "
                    "there until a person reinstates it",
                )
            rec = self.service.store.state.agents.get(parent)

    async def query(self, target: str | None, agent_id: str | None, request: Any) -> Json:
        agent = self.query_agent(agent_id)
        self.check_ancestors_not_frozen(target)
        if agent is None:
            raise InvalidArgumentError("gateway", "agent", "the agent making the request", None)
        return await self.databases.query(target, agent, request)

    def status(self, target: str | None, agent_id: str) -> Json:
        self.check(agent_id)
        return self.databases.status(target, agent_id)

    async def history(self, target: str | None, agent_id: str) -> list[Json]:
        self.check(agent_id)
        return await self.databases.history(target, agent_id)

    def attribution(self, by: str | None, doing: str) -> tuple[str | None, str | None]:
        """Who a command is recorded as, and the note beside it: an operator's token records
        its own name (a different ``by`` is kept as a note only, so a record cannot be made
        to name someone else); an agent acts in its own name only (``OutOfScopeError`` for
        another); code in this process names whom it likes."""
        if self.principal is None and self.caller_name is not None:
            return self.caller_name, (by if by and by != self.caller_name else None)
        return self.actor(by, doing), None

    def actor(self, by: str | None, doing: str) -> str | None:
        """Who a command is recorded as: the operator names anyone (``by``); an agent acts in
        its own name only (``OutOfScopeError`` for another name): a record must never say a
        person decided what an agent did."""
        if self.principal is None:
            return by
        if by is not None and by != self.principal:
            raise OutOfScopeError(self.principal, f"{doing} in the name of {by!r}")
        return self.principal

    def freezer(self, by: str | None) -> str | None:
        """Who a freeze is recorded as: an agent freezes in its own name only."""
        return self.actor(by, "freezing")

    async def freeze(
        self, target: str | None, agent_id: str, *, reason: str, by: str | None = None
    ) -> Json:
        self.check(agent_id)
        who, _ = self.attribution(by, "freezing")
        return await self.databases.freeze(target, agent_id, reason=reason, by=who)

    def check_reinstate(self) -> None:
        """Reinstating a frozen agent is a person's decision: an agent's token is refused."""
        if self.principal is not None:
            raise OutOfScopeError(self.principal, "reinstating a frozen agent (a person decides)")

    async def reinstate(
        self, target: str | None, agent_id: str, *, by: str | None, reason: str
    ) -> Json:
        """Reinstate in the caller's name (a person's token; code in this process names
        who decides in ``by``)."""
        self.check_reinstate()
        who, note = self.attribution(by, "reinstating")
        if who is None:
            raise InvalidArgumentError("reinstate", "by", "the name of who decides", by)
        return await self.databases.reinstate(target, agent_id, by=who, reason=reason, note=note)


class LocalApi:
    """:class:`AgentApi` over an :class:`AgentService` (and the daemon's ``databases``, if
    it fronts any) in this process, with the operator's reach; :meth:`as_agent` gives the
    reach of one agent's token."""

    def __init__(self, service: AgentService, databases: Databases | None = None) -> None:
        v.instance_of("LocalApi", "service", service, AgentService)
        v.instance_of("LocalApi", "databases", databases, (Databases, type(None)))
        self.service = service
        self.databases = databases if databases is not None else Databases({}, service=service)
        self._scope = ScopedService(service, self.databases)

    def as_agent(self, agent_id: str) -> LocalApi:
        """This API as ``agent_id``'s own token reaches it (see :class:`ScopedService`)."""
        v.non_empty_str("as_agent", "agent_id", agent_id)
        return self.as_caller(Caller(agent_id, agent_id))

    def as_caller(self, caller: Caller | None) -> LocalApi:
        """This API as ``caller``'s token reaches it: an operator's everything (in its
        name), an agent's its own subtree; None is trusted in-process code."""
        v.instance_of("as_caller", "caller", caller, (Caller, type(None)))
        api = LocalApi(self.service, self.databases)
        api._scope = self._scope.as_caller(caller)
        return api

    @property
    def caller_name(self) -> str | None:
        """Who this API acts as (see :attr:`ScopedService.caller_name`)."""
        return self._scope.caller_name

    def resolve(self, ref: str) -> str:
        """The id of the agent ``ref`` (an id or a name) stands for, in this API's reach
        (see :meth:`ScopedService.resolve`)."""
        v.non_empty_str("resolve", "ref", ref)
        return self._scope.resolve(ref)

    async def spawn(self, spec: Mapping[str, Any], idempotency_key: str | None = None) -> Json:
        spec_mapping("spawn", "spec", spec)
        return (await self._scope.spawn(spec, idempotency_key)).body

    async def prompt(
        self,
        agent_id: str,
        text: str | None = None,
        by: str | None = None,
        why: str | None = None,
        idempotency_key: str | None = None,
    ) -> Json:
        v.non_empty_str("prompt", "agent_id", agent_id)
        result = await self._scope.prompt(
            agent_id, text, by=by, why=why, idempotency_key=idempotency_key
        )
        return result.body

    async def stop(
        self,
        agent_id: str,
        by: str | None = None,
        why: str | None = None,
        idempotency_key: str | None = None,
        now: bool = False,
        keep_children: bool = False,
    ) -> Json:
        v.non_empty_str("stop", "agent_id", agent_id)
        result = await self._scope.stop(
            agent_id,
            by=by,
            why=why,
            idempotency_key=idempotency_key,
            now=now,
            keep_children=keep_children,
        )
        return result.body

    async def restart(
        self,
        agent_id: str,
        by: str | None = None,
        why: str | None = None,
        idempotency_key: str | None = None,
    ) -> Json:
        v.non_empty_str("restart", "agent_id", agent_id)
        result = await self._scope.restart(
            agent_id, by=by, why=why, idempotency_key=idempotency_key
        )
        return result.body

    async def delete(
        self,
        agent_id: str,
        by: str | None = None,
        why: str | None = None,
        idempotency_key: str | None = None,
    ) -> Json:
        v.non_empty_str("delete", "agent_id", agent_id)
        result = await self._scope.delete(agent_id, by=by, why=why, idempotency_key=idempotency_key)
        return result.body

    async def budget(
        self,
        agent_id: str,
        budget: Mapping[str, Any],
        by: str | None = None,
        why: str | None = None,
        idempotency_key: str | None = None,
    ) -> Json:
        v.non_empty_str("budget", "agent_id", agent_id)
        result = await self._scope.change_budget(
            agent_id, budget, by=by, why=why, idempotency_key=idempotency_key
        )
        return result.body

    async def patch(
        self,
        agent_id: str,
        changes: Mapping[str, Any],
        by: str | None = None,
        why: str | None = None,
        idempotency_key: str | None = None,
    ) -> Json:
        v.non_empty_str("patch", "agent_id", agent_id)
        v.instance_of("patch", "changes", changes, Mapping)
        result = await self._scope.patch(
            agent_id, changes, by=by, why=why, idempotency_key=idempotency_key
        )
        return result.body

    async def get(self, agent_id: str) -> Json:
        v.non_empty_str("get", "agent_id", agent_id)
        return self._scope.get(agent_id)

    async def run(self, run_id: str) -> Json:
        v.non_empty_str("run", "run_id", run_id)
        return self._scope.run(run_id)

    async def stop_run(
        self,
        run_id: str,
        by: str | None = None,
        why: str | None = None,
        idempotency_key: str | None = None,
    ) -> Json:
        v.non_empty_str("stop_run", "run_id", run_id)
        result = await self._scope.stop_run(run_id, by=by, why=why, idempotency_key=idempotency_key)
        return result.body

    async def list_agents(self, **filters: str | None) -> list[Json]:
        found: list[Json] = []
        cursor = None
        while True:
            page = self._scope.list_page(limit=_listing.MAX_LIMIT, cursor=cursor, **filters)
            found += page["agents"]
            cursor = page["nextCursor"]
            if cursor is None:
                return found

    async def list_page(
        self, limit: int | None = None, cursor: str | None = None, **filters: str | None
    ) -> Json:
        limit = _listing.DEFAULT_LIMIT if limit is None else limit
        return self._scope.list_page(limit=limit, cursor=cursor, **filters)

    async def inbox(self, agent_id: str) -> list[Json]:
        v.non_empty_str("inbox", "agent_id", agent_id)
        return self._scope.inbox(agent_id)

    async def session(self, agent_id: str) -> Json:
        v.non_empty_str("session", "agent_id", agent_id)
        return self._scope.session(agent_id)

    async def decisions(self, resolved: bool = False) -> list[Json]:
        return self._scope.decisions(resolved=resolved)

    async def decision(self, decision_id: str) -> Json:
        v.non_empty_str("decision", "decision_id", decision_id)
        return self._scope.decision(decision_id)

    async def answer(
        self,
        decision_id: str,
        answer: str,
        why: str | None = None,
        by: str | None = None,
        text: str | None = None,
        budget: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> Json:
        v.non_empty_str("answer", "decision_id", decision_id)
        result = await self._scope.answer(
            decision_id,
            answer,
            by=by,
            why=why,
            text=text,
            budget=budget,
            idempotency_key=idempotency_key,
        )
        return result.body

    async def check_action(
        self,
        agent_id: str,
        action: str,
        context: Mapping[str, Any] | None = None,
        wait_s: float = 0.0,
    ) -> Json:
        v.non_empty_str("check_action", "agent_id", agent_id)
        return (await self._scope.check_action(agent_id, action, context, wait_s=wait_s)).to_json()

    async def action_verdict(self, decision_id: str, wait_s: float = 0.0) -> Json:
        v.non_empty_str("action_verdict", "decision_id", decision_id)
        return (await self._scope.action_verdict(decision_id, wait_s=wait_s)).to_json()

    async def db_targets(self) -> list[Json]:
        return self._scope.targets()

    async def db_schema(self, target: str | None = None) -> Json:
        return self._scope.schema(target)

    async def db_query(
        self, agent_id: str, request: Mapping[str, Any], target: str | None = None
    ) -> Json:
        return await self._scope.query(target, agent_id, request)

    async def db_status(self, agent_id: str, target: str | None = None) -> Json:
        return self._scope.status(target, agent_id)

    async def db_history(self, agent_id: str, target: str | None = None) -> list[Json]:
        return await self._scope.history(target, agent_id)

    async def db_freeze(
        self, agent_id: str, reason: str, by: str | None = None, target: str | None = None
    ) -> Json:
        return await self._scope.freeze(target, agent_id, reason=reason, by=by)

    async def db_reinstate(
        self, agent_id: str, by: str | None, reason: str, target: str | None = None
    ) -> Json:
        return await self._scope.reinstate(target, agent_id, by=by, reason=reason)

    async def events(
        self, after: int = 0, agent: str | None = None, limit: int = 1000
    ) -> list[Event]:
        """One page of the event log: up to ``limit`` events with ``seq > after``."""
        page_args(after, agent, limit)
        return await self._scope.events(after, agent, limit)
