"""corral inside a Pydantic AI agent: :class:`CorralCapability`, one capability
(``Agent(..., capabilities=[CorralCapability(...)])``) that puts an
:class:`~corral.integrations.Oversight` into Pydantic AI's hooks.

- ``wrap_model_request`` (once per step of Pydantic AI's loop, around every attempt, retry
  and fallback the step makes): checks the run may call the model (cancellation, deadline,
  room in every budget dimension), abandons the call at once when the run is cancelled or
  its deadline passes, then counts what the step spent: its response's usage and that of
  the attempts it records (a fallback's).
- ``wrap_tool_execute`` (around every function tool call, after argument validation):
  checks the call with the supervisor (a person may be asked; the call waits) and runs it
  under the run's cancellation. A refusal reaches the model as the tool's failed result
  (Pydantic AI's ``ToolFailed``: no retry prompt, no retry budget spent) and the run goes on.
- ``get_toolset``: the gateway's ``db_query`` tool, queried as the Oversight's ``agent_id``.

Errors that end the run (``BudgetExhaustedError``, ``CostUnknownError``,
``CancellationError``, ``DeadlineExceededError``: ``corral.kernel.RunError``) come out of
``agent.run`` / ``run_sync`` / ``run_stream`` / ``iter`` as themselves, unwrapped. The
manual, with what each number maps to, is docs/integrations.md.

This module imports Pydantic AI (``corral[pydantic-ai]``); ``corral.integrations`` does not.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pydantic_core
from pydantic_ai.capabilities import (
    AbstractCapability,
    CapabilityOrdering,
    Instrumentation,
    WrapModelRequestHandler,
    WrapToolExecuteHandler,
)
from pydantic_ai.exceptions import ToolFailed
from pydantic_ai.messages import ModelResponse, ToolCallPart
from pydantic_ai.models import ModelRequestContext
from pydantic_ai.tools import RunContext, Tool, ToolDefinition
from pydantic_ai.toolsets import FunctionToolset
from pydantic_ai.usage import RequestUsage, RunUsage

from corral.integrations._oversight import (
    ActionChecker,
    GatewayTool,
    Oversight,
    QueryGateway,
    oversight_of,
)
from corral.kernel import Clock, ExecutionBudget, RunError, ToolRefused
from corral.runtime import BudgetUsage, Cancellation, Middleware, ModelPrice, Usage

__all__ = ["CorralCapability"]


class CorralCapability(AbstractCapability[Any]):
    """corral's supervision for a Pydantic AI agent, as one capability.

    Give it an :class:`~corral.integrations.Oversight`, or the keyword arguments of one
    (``agent_id``, ``supervisor``, ``budget``, ``prices``, ``cancellation``, ``gateway``,
    ``middleware``, ``tenant_id``, ``clock``), not both (``InvalidArgumentError``). One
    capability holds one Oversight, so every run of every agent it is given to shares its
    budget, deadline and cancellation: make one per task (a conversation spread over several
    ``agent.run`` calls is one task). The deadline counts from the Oversight's creation.

    ``supervisor`` is a ``corral.guard.Supervisor`` or anything with its ``check_action``
    (a daemon agent handle, where a person answers from ``corral decisions``); the action it
    checks is the tool's name, a space and the validated arguments as JSON with sorted keys,
    as in corral's own loop, so the same rules match.

    Usage, per step of Pydantic AI's loop: tokens are ``input_tokens + output_tokens`` of the
    step's response and of the attempts it records (a fallback's), as Pydantic AI counted them
    (its ``input_tokens`` include cache reads and writes and audio, its ``output_tokens``
    reasoning tokens: all are counted, as Pydantic AI's own ``total_tokens`` and
    ``UsageLimits`` count them); one step is one turn, however many attempts it made. Dollars
    are Pydantic AI's own cost (genai-prices, or what its gateway reported) where it has one;
    otherwise ``prices`` is looked up under the name the provider reported
    (``response.model_name``), then the model's configured name (``gpt-4o``), then its id
    (``openai:gpt-4o``), and applies its input price to every input token, cached or not. A
    step with a part that has no price stops the run with ``CostUnknownError`` under a dollar
    budget; so does a response that omitted its usage.
    """

    def __init__(
        self,
        oversight: Oversight | None = None,
        *,
        agent_id: str | None = None,
        supervisor: ActionChecker | None = None,
        budget: ExecutionBudget | None = None,
        prices: Mapping[str, ModelPrice] | None = None,
        cancellation: Cancellation | None = None,
        gateway: QueryGateway | None = None,
        middleware: Iterable[Middleware] | None = None,
        tenant_id: str | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.oversight = oversight_of(
            "CorralCapability",
            oversight,
            agent_id=agent_id,
            supervisor=supervisor,
            budget=budget,
            prices=prices,
            cancellation=cancellation,
            gateway=gateway,
            middleware=middleware,
            tenant_id=tenant_id,
            clock=clock,
        )
        oversight = self.oversight
        self._gateway_tools = {tool.name: tool for tool in oversight.gateway_tools()}

    # --- what Pydantic AI asks of a capability ----------------------------------------------

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None  # it holds live objects (a supervisor, a gateway): not for agent specs

    def get_ordering(self) -> CapabilityOrdering:
        # Outermost, so no other capability's hooks run before a refused tool is stopped or
        # can turn a budget, deadline or cancellation error into something else; inside
        # Instrumentation, so the spans show the approval waits and the refusals.
        return CapabilityOrdering(position="outermost", wrapped_by=[Instrumentation])

    def get_toolset(self) -> FunctionToolset[Any] | None:
        if not self._gateway_tools:
            return None
        return FunctionToolset(
            [_pydantic_tool(tool) for tool in self._gateway_tools.values()], id="corral-gateway"
        )

    async def wrap_model_request(
        self,
        ctx: RunContext[Any],
        *,
        request_context: ModelRequestContext,
        handler: WrapModelRequestHandler,
    ) -> ModelResponse:
        usage = ctx.usage
        before = _Spent.of(usage)
        try:
            response = await self.oversight.run_model(lambda: handler(request_context))
        except BaseException:
            # A step that failed may still have been billed (a response another capability
            # rejected, a stream cut short): its response went with the error, so what the
            # run's usage grew by is counted -- without a turn (run_model counted one) and
            # without replacing the error that ends the step; the next step's check sees it.
            self._count_failed_step(_Spent.of(usage) - before, request_context)
            raise
        # The step's own response and the attempts it records (a fallback's), not the growth
        # of ctx.usage: concurrent delegates share one RunUsage (usage=ctx.usage) and would
        # count each other's requests.
        billed = [(self._names(response, request_context), response.usage)]
        billed += [
            ([a.model_name], a.usage) for a in response.failed_attempts or () if a.usage is not None
        ]
        costs = [self._cost(names, spent) for names, spent in billed]
        # One part without a price and the step has none: named by that part's model.
        unpriced = [names for (names, _), part in zip(billed, costs, strict=True) if part is None]
        names = unpriced[0] if unpriced else billed[0][0]
        cost = None if unpriced else sum(part for part in costs if part is not None)
        self.oversight.record_model_call(
            model=names[0] if names else "unknown model",
            input_tokens=sum(spent.input_tokens for _, spent in billed),
            output_tokens=sum(spent.output_tokens for _, spent in billed),
            cost_usd=cost,
        )
        return response

    async def wrap_tool_execute(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: dict[str, Any],
        handler: WrapToolExecuteHandler,
    ) -> Any:
        name = call.tool_name
        if name in self._gateway_tools:
            return await handler(args)  # db_query checks itself, as the same tool elsewhere
        try:
            return await self.oversight.run_tool(
                name, _json_arguments(args), lambda: handler(args), call_id=call.tool_call_id
            )
        except ToolRefused as exc:
            raise ToolFailed(exc.message) from None

    # --- conveniences -----------------------------------------------------------------------

    def usage(self) -> BudgetUsage:
        """What the agent has spent through this capability (its Oversight)."""
        return self.oversight.usage()

    def cancel(self, reason: str | None = None) -> None:
        """Stop the agent: the model or tool call in flight is abandoned, the next refused."""
        self.oversight.cancel(reason)

    def __repr__(self) -> str:
        return f"CorralCapability({self.oversight!r})"

    # AbstractCapability is a dataclass comparing its fields (id, ...): two capabilities over
    # different Oversights are different things, and both must be usable as keys.
    __eq__ = object.__eq__
    __hash__ = object.__hash__

    # --- internals --------------------------------------------------------------------------

    def _names(self, response: ModelResponse, request_context: ModelRequestContext) -> list[str]:
        """The names a response's model may have a price under: the name the provider
        reported, the model's configured name, its id."""
        names = [response.model_name, request_context.model.model_name, response.model_id]
        return [name for name in names if name]

    def _cost(self, names: list[str], spent: RequestUsage) -> float | None:
        """What ``spent`` cost in dollars: Pydantic AI's own figure, or the first price found
        under ``names``; None when neither is known (or the response omitted its usage)."""
        if spent.unmeasured_requests:
            return None
        if spent.cost is not None:
            return float(spent.cost)
        if spent.input_tokens == 0 and spent.output_tokens == 0:
            return 0.0  # nothing was spent
        for name in names:
            price = self.oversight.prices.get(name)
            if price is not None:
                usage = Usage(
                    prompt_tokens=spent.input_tokens, completion_tokens=spent.output_tokens
                )
                return price.cost(usage)
        return None

    def _count_failed_step(self, spent: _Spent, request_context: ModelRequestContext) -> None:
        if spent.tokens == 0 and not spent.cost:
            return
        cost = float(spent.cost) if spent.cost is not None else None
        if cost is None:
            price = self.oversight.prices.get(request_context.model.model_name)
            usage = Usage(prompt_tokens=spent.input_tokens, completion_tokens=spent.output_tokens)
            cost = price.cost(usage) if price is not None else 0.0
        with contextlib.suppress(RunError):  # over a limit: the next check raises it
            self.oversight.tracker.record(tokens=spent.tokens, cost_usd=cost)


@dataclass(frozen=True, slots=True)
class _Spent:
    """The part of a run's ``RunUsage`` corral counts, to take one reading from another."""

    input_tokens: int
    output_tokens: int
    cost: Decimal | None
    unmeasured: int

    @classmethod
    def of(cls, usage: RunUsage) -> _Spent:
        return cls(usage.input_tokens, usage.output_tokens, usage.cost, usage.unmeasured_requests)

    def __sub__(self, earlier: _Spent) -> _Spent:
        # A run's usage only grows; max() keeps a reading that did not from becoming a
        # negative count that would fail the run.
        cost = None if self.cost is None else max(Decimal(0), self.cost - (earlier.cost or 0))
        return _Spent(
            max(0, self.input_tokens - earlier.input_tokens),
            max(0, self.output_tokens - earlier.output_tokens),
            cost,
            max(0, self.unmeasured - earlier.unmeasured),
        )

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens


def _json_arguments(args: Mapping[str, Any]) -> dict[str, Any]:
    """The validated arguments as JSON values (models, dates, ... as the model wrote them),
    for the guard's action text; what cannot be converted is left to the guard."""
    try:
        converted = pydantic_core.to_jsonable_python(dict(args))
    except (TypeError, ValueError, pydantic_core.PydanticSerializationError):
        return dict(args)
    return converted if isinstance(converted, dict) else dict(args)


def _pydantic_tool(tool: GatewayTool) -> Tool[Any]:
    async def call(**arguments: Any) -> str:
        return await tool(arguments)

    return Tool.from_schema(call, tool.name, tool.description, dict(tool.parameters))
