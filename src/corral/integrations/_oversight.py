"""``Oversight``: what corral adds around one agent of another framework -- the checks before
each model and tool call, the accounting after, and the gateway as tools. The framework
adapters (``corral.integrations.pydantic_ai``, ``openai_agents``, ``langchain``) are thin
translations of their framework's hooks onto this one object."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol, TypeVar, runtime_checkable

from corral.kernel import (
    SYSTEM_CLOCK,
    Clock,
    CorralError,
    CostUnknownError,
    DeadlineExceededError,
    ExecutionBudget,
    InvalidArgumentError,
    RunError,
    RunMeta,
    ToolRefused,
    UsageError,
)
from corral.kernel import _validate as v
from corral.runtime import (
    BudgetUsage,
    Cancellation,
    ExecutionTracker,
    Middleware,
    MiddlewareContext,
    MiddlewarePipeline,
    ModelPrice,
    ToolGuard,
    Usage,
)
from corral.runtime._cancellation import race
from corral.runtime.middleware import CancellationCheck

T = TypeVar("T")

_CONNECTED = ("id", "check_action", "cancellation")


@runtime_checkable
class ActionChecker(Protocol):
    """Anything that answers "may this agent do this?" the way
    :meth:`corral.guard.Supervisor.check_action` does: a local ``Supervisor``, or a daemon
    agent handle (``corral.connect(...).agent(...)``), where a person may answer."""

    def check_action(
        self, agent_id: str, action: str, context: dict[str, object] | None = None
    ) -> Any: ...


@runtime_checkable
class QueryGateway(Protocol):
    """Anything with the gateway's ``query(agent_id, request)``: a ``corral.gateway.Gateway``,
    or a daemon agent handle."""

    async def query(self, agent_id: str, request: Mapping[str, Any]) -> Any: ...


@runtime_checkable
class ConnectedAgent(Protocol):
    """An agent of the daemon as its own process holds it -- a ``corral.client.AgentHandle``
    (``corral.connect(...).register(...)`` or ``.agent(...)``): its ``id``, its
    ``check_action`` (the daemon's rules, a person's answer) and a ``cancellation`` the
    daemon cancels when it stops the agent. See :meth:`Oversight.connected`."""

    @property
    def id(self) -> str: ...

    @property
    def cancellation(self) -> Cancellation: ...

    def check_action(
        self, agent_id: str, action: str, context: dict[str, object] | None = None
    ) -> Any: ...


@dataclass(frozen=True, slots=True)
class GatewayTool:
    """One gateway tool, framework-neutral: the adapters turn it into their framework's tool.

    ``parameters`` is the JSON schema of the arguments; ``__call__`` takes them and returns
    the text the model sees. A gateway refusal (``unknown_column`` with its suggestions,
    ``agent_frozen``, ...) is returned as text too -- the model reads it and can correct
    itself -- never raised; a budget or cancellation error is raised and ends the run.
    """

    name: str
    description: str
    parameters: Mapping[str, Any]
    call: Callable[[Mapping[str, Any]], Awaitable[str]]

    async def __call__(self, arguments: Mapping[str, Any]) -> str:
        return await self.call(arguments)


_DB_QUERY_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "properties": {
        "request": {
            "type": "object",
            "description": (
                'One request: {"sql": "SELECT ... WHERE id = $1", "params": [7]}, or a '
                'structured operation {"op": "find"|"count"|"insert"|"update"|"delete", '
                '"table": ..., "where": {"field": value or {"eq"|"ne"|"lt"|"lte"|"gt"|"gte"|'
                '"in"|"like"|"is_null": ...}}, "set": {...}, "values": {...}, "columns": '
                '[...], "order_by": [...], "limit": n}. Writes need "idempotency_key".'
            ),
        }
    },
    "required": ["request"],
    "additionalProperties": False,
}

_DB_QUERY_DESCRIPTION = (
    "Run one SQL statement or structured operation on the database through corral's gateway. "
    "Reads run read-only; an empty filtered read says genuinely_empty (the tables hold "
    "nothing) or suspiciously_empty (rows exist that the filter missed: check it before "
    "concluding). Writes need an idempotency_key; a retry with the same key is replayed, not "
    "applied twice. Refusals name what is wrong (unknown_column with close matches, ...)."
)


class Oversight:
    """corral's supervision for one agent of another framework.

    - ``supervisor``: checks every tool call before it runs (a :class:`corral.guard.Supervisor`
      or a daemon agent handle, where a person may be asked and the call waits for the
      answer). The action text is the tool's name, a space and its arguments as JSON with
      sorted keys, as for corral's own loop, so the same guardrail rules match. A refused call
      raises :class:`~corral.kernel.ToolRefused` from :meth:`run_tool`; adapters tell the
      model, they do not end the run.
    - ``budget``: tokens, dollars, turns (one per model call) and ``deadline_s`` (counted from
      the Oversight's creation), kept by one :class:`~corral.runtime.ExecutionTracker` for the
      object's whole life: several runs through one Oversight share it. Make one per task.
      It may be made outside an event loop (before a framework's ``run_sync`` starts one): the
      deadline is then armed by the first call, still counted from the creation, and again on
      each later event loop (a script's second ``asyncio.run``); without a loop at all (a
      framework's synchronous hooks) no call starts past the deadline, but one in flight
      cannot be abandoned.
      Dollars come from ``prices`` (model name -> :class:`~corral.runtime.ModelPrice`) unless
      the framework gives a cost; a dollar budget with a model that has no price stops with
      ``CostUnknownError`` (``cost_unknown``), as in corral's own loop.
    - ``cancellation``: cancelling it (or reaching ``deadline_s``) abandons a model or tool call
      in flight at once and stops the next one (``CancellationError`` /
      ``DeadlineExceededError``).
    - ``gateway``: the database gateway offered as tools (:meth:`gateway_tools`), queried as
      ``agent_id``.
    - ``middleware``: corral middlewares run around every tool call (TOOL stage), outside the
      guard (an audit sees refusals too).

    Errors from :meth:`before_model`, :meth:`record_model_call`, :meth:`run_model` and
    :meth:`run_tool` that end the run are ``corral.kernel.RunError`` subclasses
    (``BudgetExhaustedError``, ``CostUnknownError``, ``CancellationError``).
    """

    def __init__(
        self,
        *,
        agent_id: str = "agent",
        supervisor: ActionChecker | None = None,
        budget: ExecutionBudget | None = None,
        prices: Mapping[str, ModelPrice] | None = None,
        cancellation: Cancellation | None = None,
        gateway: QueryGateway | None = None,
        middleware: Iterable[Middleware] = (),
        tenant_id: str | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        where = "Oversight"
        v.non_empty_str(where, "agent_id", agent_id)
        if supervisor is not None and not callable(getattr(supervisor, "check_action", None)):
            raise InvalidArgumentError(
                where, "supervisor", "a Supervisor or an agent handle (check_action)", supervisor
            )
        if budget is not None:
            v.instance_of(where, "budget", budget, ExecutionBudget)
        price_table = {} if prices is None else prices
        v.instance_of(where, "prices", price_table, Mapping)
        for name, price in price_table.items():
            v.non_empty_str(where, "prices key", name)
            v.instance_of(where, f"prices[{name!r}]", price, ModelPrice)
        if cancellation is not None:
            v.instance_of(where, "cancellation", cancellation, Cancellation)
        if gateway is not None and not callable(getattr(gateway, "query", None)):
            raise InvalidArgumentError(where, "gateway", "a Gateway (query)", gateway)
        layers = tuple(middleware)
        for mw in layers:
            if not callable(getattr(mw, "process", None)):
                raise InvalidArgumentError(where, "middleware[]", "a Middleware", mw)
        v.non_empty_str(where, "tenant_id", tenant_id, optional=True)
        v.instance_of(where, "clock", clock, Clock)
        self.agent_id = agent_id
        self.supervisor = supervisor
        self.budget = budget or ExecutionBudget()
        self.prices: dict[str, ModelPrice] = dict(price_table)
        self.gateway = gateway
        self.clock = clock
        self.tracker = ExecutionTracker(self.budget, clock=clock)
        token = (cancellation or Cancellation(clock=clock)).child()
        self.cancellation = token
        self._deadline_at: datetime | None = None
        self._armed_on: asyncio.AbstractEventLoop | None = None
        if self.budget.deadline_s is not None:
            # the deadline is a cancellation, so a call in flight is abandoned when it passes
            self._deadline_at = clock.now() + timedelta(seconds=self.budget.deadline_s)
            self._arm_deadline()
        self.meta = RunMeta(cancellation=token, tenant_id=tenant_id, clock=clock)
        guard: list[Middleware] = []
        if supervisor is not None:
            guard.append(ToolGuard(supervisor.check_action))
        self._tools = MiddlewarePipeline([*layers, CancellationCheck(), *guard])

    @classmethod
    def connected(
        cls,
        agent: ConnectedAgent,
        *,
        budget: ExecutionBudget | None = None,
        prices: Mapping[str, ModelPrice] | None = None,
        gateway: QueryGateway | None = None,
        middleware: Iterable[Middleware] = (),
        tenant_id: str | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> Oversight:
        """An Oversight for a daemon agent in its own process: ``agent`` (a
        ``corral.client.AgentHandle``) checks every tool call (the daemon's rules; a person
        answers what a rule asks, the call waiting), its ``cancellation`` stops the work when
        the daemon stops the agent (``corral stop``, the console, its parent), and its ``id``
        is the ``agent_id`` -- the three things a connected agent must not get wrong, set in
        one place. The other arguments are the constructor's; ``budget`` is typically the
        turn's ``turn.remaining`` (the daemon refuses the next turn past a budget, this
        stops the loop inside the turn). Give it to an adapter in place of its arguments:
        ``CorralCapability(Oversight.connected(handle, ...))``.

        Call it inside the running event loop the agent runs on (the handle follows the
        daemon's events from there): ``UsageError`` without one. ``InvalidArgumentError``
        when ``agent`` has no ``id``, ``check_action`` or ``cancellation``.
        """
        where = "Oversight.connected"
        # Looked up statically: reading ``cancellation`` starts following the daemon's
        # events, which only happens once a loop is known to run (isinstance on the protocol
        # would read it, on Python 3.11).
        if any(inspect.getattr_static(agent, name, None) is None for name in _CONNECTED):
            raise InvalidArgumentError(
                where, "agent", "a daemon agent handle (id, check_action, cancellation)", agent
            )
        v.non_empty_str(where, "agent.id", agent.id)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            raise UsageError(
                f"{where} needs a running event loop: the handle's cancellation follows the "
                "daemon's events on it; call it inside the coroutine that runs the agent",
                agent_id=agent.id,
            ) from None
        cancellation = agent.cancellation
        v.instance_of(where, "agent.cancellation", cancellation, Cancellation)
        return cls(
            agent_id=agent.id,
            supervisor=agent,
            budget=budget,
            prices=prices,
            cancellation=cancellation,
            gateway=gateway,
            middleware=middleware,
            tenant_id=tenant_id,
            clock=clock,
        )

    # --- model calls -----------------------------------------------------------------------

    def _arm_deadline(self) -> None:
        """Schedule the deadline on the token, on the running event loop. Made outside a
        running loop (before a framework's ``run_sync`` starts its own), the system clock
        cannot schedule it yet: it is then armed by the first call, still counted from the
        Oversight's creation; and again by the first call on each later loop (a second
        ``asyncio.run``), whose timers the first loop's do not reach."""
        when = self._deadline_at
        if when is None:
            return
        try:
            self.cancellation.cancel_at(when)
        except UsageError:
            return  # no running loop yet
        try:
            self._armed_on = asyncio.get_running_loop()
        except RuntimeError:
            self._armed_on = None  # a fake clock schedules without a loop

    def _ready(self) -> None:
        """Before each call: the deadline armed on this call's event loop."""
        when = self._deadline_at
        if when is None:
            return
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None  # a framework's synchronous hook
        if loop is not None and loop is not self._armed_on:
            self._arm_deadline()
        if loop is None or self._armed_on is not loop:
            now = self.clock.now()
            if now >= when:
                # no loop to arm it on: a call in flight cannot be abandoned, but none starts
                raise DeadlineExceededError(when.isoformat(), now.isoformat())

    def before_model(self) -> None:
        """Raise unless a model call may start: not cancelled, deadline not passed, room left
        in every budget dimension."""
        self._ready()
        self.meta.check()
        self.tracker.check()

    def record_model_call(
        self,
        *,
        model: str | None,
        input_tokens: int = 0,
        output_tokens: int = 0,
        total_tokens: int | None = None,
        cost_usd: float | None = None,
    ) -> None:
        """Count one model call: its tokens, its dollars and one turn.

        ``total_tokens`` defaults to input + output. ``cost_usd`` None means "compute it from
        ``prices``" (looked up under ``model``). Raises ``BudgetExhaustedError`` the instant a
        limit is passed (the usage is counted all the same: it was spent), and
        ``CostUnknownError`` when a dollar budget is set and no cost can be had.
        """
        where = "Oversight.record_model_call"
        v.non_negative_int(where, "input_tokens", input_tokens)
        v.non_negative_int(where, "output_tokens", output_tokens)
        v.non_negative_int(where, "total_tokens", total_tokens, optional=True)
        v.non_negative_number(where, "cost_usd", cost_usd, optional=True)
        usage = Usage(prompt_tokens=input_tokens, completion_tokens=output_tokens)
        if cost_usd is None:
            price = self.prices.get(model) if model else None
            cost_usd = price.cost(usage) if price is not None else None
        self.tracker.record(
            tokens=usage.total_tokens if total_tokens is None else total_tokens,
            cost_usd=float(cost_usd) if cost_usd is not None else 0.0,
            turns=1,
        )
        limit = self.budget.max_cost_usd
        if cost_usd is None and limit is not None:
            raise CostUnknownError(model, limit)

    async def run_model(self, call: Callable[[], Awaitable[T]]) -> T:
        """Check, then await ``call()`` -- abandoned at once when the run is cancelled or its
        deadline passes. The caller records the usage (:meth:`record_model_call`); a call that
        fails still counts one turn, so a retry loop cannot run for ever."""
        self.before_model()
        try:
            return await race(_coroutine(call), self.cancellation)
        except CorralError:
            raise
        except Exception:
            self.tracker.record(turns=1)
            raise

    # --- tool calls ------------------------------------------------------------------------

    async def run_tool(
        self,
        name: str,
        arguments: Mapping[str, Any],
        call: Callable[[], Awaitable[T]],
        *,
        call_id: str | None = None,
    ) -> T:
        """Check the tool call, then await ``call()`` under the run's cancellation.

        Raises :class:`~corral.kernel.ToolRefused` (the tool did not run) when the supervisor
        refuses -- or when a person said no, or did not answer before the rule's timeout --
        and ``CancellationError`` / ``DeadlineExceededError`` when the run is stopped. What
        the tool itself raises passes through.
        """
        v.non_empty_str("Oversight.run_tool", "name", name)
        self._ready()
        if not isinstance(arguments, Mapping):
            raise InvalidArgumentError("Oversight.run_tool", "arguments", "a Mapping", arguments)
        ctx = MiddlewareContext.tool(
            self.agent_id, self.meta, name, dict(arguments), tool_call_id=call_id
        )
        box: list[T] = []

        async def handler(ctx: MiddlewareContext) -> None:
            box.append(await call())

        await race(self._tools.run(ctx, handler), self.cancellation)
        if not box:  # a middleware answered without running the tool
            return ctx.result  # type: ignore[no-any-return]
        return box[-1]

    async def check_tool(
        self, name: str, arguments: Mapping[str, Any], *, call_id: str | None = None
    ) -> str | None:
        """The refusal of a tool call as the model should read it, or None when it may run.
        For frameworks whose hook checks before the call and runs the tool itself; ``call_id``
        is the framework's id of the call, handed to the middlewares as in :meth:`run_tool`."""
        ran = False

        async def probe() -> None:
            nonlocal ran
            ran = True

        try:
            await self.run_tool(name, arguments, probe, call_id=call_id)
        except ToolRefused as exc:
            return exc.message
        return None if ran else "refused by a middleware"

    # --- the gateway as tools --------------------------------------------------------------

    def gateway_tools(self) -> list[GatewayTool]:
        """``db_query`` over the gateway, as ``agent_id``; empty without a gateway. The call
        goes through :meth:`run_tool`, so the guardrails see it like any other tool."""
        gateway = self.gateway
        if gateway is None:
            return []

        async def db_query(arguments: Mapping[str, Any]) -> str:
            request = arguments.get("request")
            if not isinstance(request, Mapping):
                return _json(
                    {
                        "error": "invalid_argument",
                        "message": "request must be an object: "
                        '{"sql": ..., "params": [...]} or {"op": ..., "table": ...}',
                    }
                )

            async def query() -> str:
                try:
                    result = await gateway.query(self.agent_id, request)
                except CorralError as exc:
                    if isinstance(exc, RunError):
                        raise  # budget, cancellation: the run ends
                    return _json({"error": exc.code, **exc.to_dict()})
                return _json(_result_json(result))

            try:
                return await self.run_tool("db_query", dict(arguments), query)
            except ToolRefused as exc:
                return _json({"error": exc.code, "message": exc.message})

        return [GatewayTool("db_query", _DB_QUERY_DESCRIPTION, _DB_QUERY_SCHEMA, db_query)]

    # --- state -----------------------------------------------------------------------------

    def usage(self) -> BudgetUsage:
        """What the agent has spent through this Oversight."""
        return self.tracker.usage()

    def cancel(self, reason: str | None = None) -> None:
        """Stop the agent: the call in flight is abandoned, the next one refused."""
        self.cancellation.cancel(reason)

    def __repr__(self) -> str:
        return f"Oversight(agent_id={self.agent_id!r}, tracker={self.tracker!r})"


async def _coroutine(call: Callable[[], Awaitable[T]]) -> T:
    return await call()


def _result_json(result: Any) -> Any:
    if dataclasses.is_dataclass(result) and not isinstance(result, type):
        data = {f.name: getattr(result, f.name) for f in dataclasses.fields(result)}
        return {k: val for k, val in data.items() if val not in (None, (), False) or k == "rows"}
    return result


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def oversight_of(where: str, oversight: Oversight | None, **options: Any) -> Oversight:
    """What an adapter's constructor was given: ``oversight``, or an Oversight made of the
    ``options`` that are not None (Oversight's keyword arguments). Raises
    ``InvalidArgumentError`` for an ``oversight`` that is not one, or one given with options
    (they belong on the Oversight: pass one or the other, not both)."""
    given = {name: value for name, value in options.items() if value is not None}
    if oversight is None:
        return Oversight(**given)
    v.instance_of(where, "oversight", oversight, Oversight)
    if given:
        name = next(iter(given))
        raise InvalidArgumentError(
            where,
            name,
            "given to the Oversight, not next to it (an Oversight or its arguments, not both)",
            given[name],
        )
    return oversight
