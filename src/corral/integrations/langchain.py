"""corral inside LangChain v1 agents: :class:`CorralMiddleware`, an ``AgentMiddleware`` for
``langchain.agents.create_agent`` (and so for the LangGraph graph it builds).

::

    corral = CorralMiddleware(supervisor=supervisor, budget=ExecutionBudget(max_cost_usd=0.5),
                              prices={"gpt-4o": ModelPrice(2.5, 10.0)})
    agent = create_agent(model, tools=[...], middleware=[corral])
    await agent.ainvoke({"messages": [...]})

Each hook is a translation onto one :class:`~corral.integrations.Oversight`:

- ``awrap_model_call``: the model call runs in :meth:`Oversight.run_model` (refused before it
  starts when the run is cancelled, past its deadline or out of budget; abandoned in flight at
  the deadline or on cancellation), then its usage is counted
  (:meth:`Oversight.record_model_call`).
- ``awrap_tool_call``: the tool call runs in :meth:`Oversight.run_tool`; a refusal becomes the
  tool's result (a ``ToolMessage`` with ``status="error"``), which the model reads, and the
  run goes on.
- ``tools``: the gateway's ``db_query`` (with a ``gateway``), which ``create_agent`` adds to
  the agent's tools by itself.

This module imports LangChain; ``import corral.integrations`` alone does not.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from langchain.agents.middleware import (
    AgentMiddleware,
    AgentState,
    ExtendedModelResponse,
    ModelRequest,
    ModelResponse,
    ToolCallRequest,
)
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.runtime import Runtime
from langgraph.types import Command

from corral.integrations._oversight import (
    ActionChecker,
    GatewayTool,
    Oversight,
    QueryGateway,
    oversight_of,
)
from corral.kernel import (
    BudgetExhaustedError,
    CancellationError,
    Clock,
    CostUnknownError,
    ExecutionBudget,
    RunError,
    ToolRefused,
    UsageError,
)
from corral.runtime import Cancellation, Middleware, ModelPrice

__all__ = ["CorralMiddleware", "SyncPathError"]

_WHERE = "CorralMiddleware"


class SyncPathError(UsageError):
    """A LangChain agent with :class:`CorralMiddleware` was run on its sync path
    (``invoke``, ``stream``). Raised before the model or the tool is called, so nothing ran
    unsupervised; run the agent with ``ainvoke`` / ``astream``."""

    code = "sync_path"

    def __init__(self, hook: str) -> None:
        super().__init__(
            f"CorralMiddleware supervises LangChain agents on their async path only ({hook} was "
            "called by invoke() or stream()): run the agent with `await agent.ainvoke(...)` or "
            "`agent.astream(...)` -- a sync call can neither wait on a person without blocking "
            "nor be abandoned at its deadline",
            hook=hook,
        )
        self.hook = hook


class CorralMiddleware(AgentMiddleware[AgentState[Any], Any, Any]):
    """corral's supervision as LangChain v1 agent middleware.

    Give EITHER an :class:`~corral.integrations.Oversight` (positional) OR its keyword
    arguments (``agent_id``, ``supervisor``, ``budget``, ``prices``, ``cancellation``,
    ``gateway``, ``middleware``, ``tenant_id``, ``clock``), from which one is made; both at
    once raise ``InvalidArgumentError``. The Oversight's budget and deadline last as long as
    it does (the deadline counts from its creation, and with the system clock it must be made
    inside a running event loop): make one middleware, and so one agent, per task.
    :attr:`oversight` is the one in use (its :meth:`~Oversight.usage`, :meth:`~Oversight.cancel`).

    Hooks (``create_agent`` puts this middleware around every model and tool call; several
    middlewares compose with the first in the list outermost -- put corral first, so that
    its stops never pass through another middleware that would catch them, and so that its
    deadline and cancellation cover the retries and fallbacks of the others):

    - model calls (``awrap_model_call``): checked before they start and abandoned in flight
      at the deadline or on cancellation; then counted: ``input_tokens`` and
      ``output_tokens`` of each ``AIMessage.usage_metadata`` the call returned (cache reads
      and writes are part of ``input_tokens``, reasoning tokens of ``output_tokens``, so all
      are counted, at the input and output price: a cache discount is not applied, the
      dollar figure errs high), ``total_tokens`` for a token budget. The price is looked up
      under the model the provider names (``response_metadata["model_name"]`` or
      ``["model"]``), then the model asked for (its ``model_name``, ``model`` or
      ``model_id``, else its ``_llm_type``); the first name that has a price wins. A reply
      without ``usage_metadata`` counts no tokens and an unknown cost (``cost_unknown``
      under a dollar budget), as in corral's own loop.
    - tool calls (``awrap_tool_call``): the supervisor sees ``name`` and the call's ``args``
      (the action text of corral's own loop); a refusal -- a guardrail's block, a person's
      no, an approval that timed out -- is the tool's result, a ``ToolMessage`` with
      ``status="error"`` and the refusal's sentence, and the tool does not run. The
      gateway's own ``db_query`` is checked inside the tool (once), not here.
    - ``tools``: ``db_query`` over ``gateway`` (empty without one).
    - ``aafter_agent``: raises again a stop that a middleware outside this one turned into a
      message (see below).

    What ends the run -- ``BudgetExhaustedError``, ``CostUnknownError``,
    ``CancellationError``, ``DeadlineExceededError`` -- propagates out of ``ainvoke`` /
    ``astream`` as itself (LangGraph does not wrap a node's exception, and the ``ToolNode``
    of ``create_agent`` handles only invalid tool arguments). A middleware listed before
    this one may catch it (``ModelRetryMiddleware`` retries every exception by default, then
    answers with a message): the run then ends with that message, and ``aafter_agent``
    raises the stop again, so the caller still gets it -- after the other middleware's
    retries, which fail at once.

    Sync paths (``invoke``, ``stream``) raise :class:`SyncPathError` before the first model
    call: corral's checks await (a person's answer, an async supervisor) and abandon calls in
    flight, which a sync call cannot do.
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
            _WHERE,
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
        self.tools: Sequence[BaseTool] = [_as_tool(t) for t in oversight.gateway_tools()]
        # The gateway's tools check themselves (GatewayTool runs through run_tool): their calls
        # pass awrap_tool_call unchecked, or a person would be asked twice.
        self._checked_inside = frozenset(id(t) for t in self.tools)
        # The stop that ended a call (a budget, the cancellation, the deadline): an Oversight's
        # stops are for good, so it is kept for the middleware's life and raised again at the
        # end of a run that a middleware outside this one finished all the same.
        self._stop: RunError | None = None

    def __repr__(self) -> str:
        return f"CorralMiddleware({self.oversight!r})"

    # --- model calls -----------------------------------------------------------------------

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any] | AIMessage | ExtendedModelResponse[Any]:
        """Run the model call under the oversight and count what it used. Raises the
        ``RunError`` that ends the run (see the class docstring); what the model raises
        passes through (counted as one turn)."""
        try:
            response = await self.oversight.run_model(lambda: handler(request))
            self._record(request.model, response.result)
        except (BudgetExhaustedError, CostUnknownError, CancellationError) as exc:
            self._stop = exc
            raise
        return response

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelResponse[Any] | AIMessage | ExtendedModelResponse[Any]:
        """Raises :class:`SyncPathError`: the model is not called."""
        raise SyncPathError("wrap_model_call")

    def _record(self, model: Any, messages: Sequence[BaseMessage]) -> None:
        replies = [m for m in messages if isinstance(m, AIMessage)]
        usages = [m.usage_metadata for m in replies if m.usage_metadata is not None]
        name = self._model_name(model, replies)
        oversight = self.oversight
        if not usages:
            # No usage reported: no tokens to count, and a cost nobody knows (a price times
            # nothing would pass for free).
            oversight.record_model_call(model=name, cost_usd=0.0)
            limit = oversight.budget.max_cost_usd
            if limit is not None:
                raise CostUnknownError(name, limit)
            return
        input_tokens = sum(u.get("input_tokens", 0) for u in usages)
        output_tokens = sum(u.get("output_tokens", 0) for u in usages)
        total_tokens = sum(
            u.get("total_tokens", u.get("input_tokens", 0) + u.get("output_tokens", 0))
            for u in usages
        )
        oversight.record_model_call(
            model=name,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            total_tokens=total_tokens,
        )

    def _model_name(self, model: Any, replies: Sequence[AIMessage]) -> str | None:
        """The first of the candidate names that has a price, else the first candidate."""
        names: list[str] = []
        for reply in replies:
            for key in ("model_name", "model"):
                _add_name(names, reply.response_metadata.get(key))
        for attribute in ("model_name", "model", "model_id"):
            _add_name(names, getattr(model, attribute, None))
        if not names:
            # a property of someone else's model: a name is only a hint, never a failure
            with contextlib.suppress(Exception):
                _add_name(names, getattr(model, "_llm_type", None))
        prices = self.oversight.prices
        return next((n for n in names if n in prices), names[0] if names else None)

    # --- the end of a run -------------------------------------------------------------------

    async def aafter_agent(
        self, state: AgentState[Any], runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        """Raise again the stop that ended a model or tool call of this run, if the run ended
        all the same: a middleware outside this one (``ModelRetryMiddleware``,
        ``ToolRetryMiddleware`` and ``ToolErrorMiddleware`` by default) turned it into a
        message, and the caller would otherwise get an answer instead of the stop."""
        if self._stop is not None:
            raise self._stop
        return None

    # --- tool calls ------------------------------------------------------------------------

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
    ) -> ToolMessage | Command[Any]:
        """Check the call, then run it under the oversight; a refusal is returned as the
        tool's result (``status="error"``). Raises what ends the run."""
        if request.tool is not None and id(request.tool) in self._checked_inside:
            return await handler(request)
        call = request.tool_call
        name = call["name"]
        call_id = call.get("id") or ""
        try:
            answer: object = await self.oversight.run_tool(
                name, call.get("args") or {}, lambda: handler(request), call_id=call_id or None
            )
        except ToolRefused as exc:
            return ToolMessage(content=exc.message, name=name, tool_call_id=call_id, status="error")
        except CancellationError as exc:
            if self.oversight.cancellation.is_cancelled:  # this run's stop, not the tool's own
                self._stop = exc
            raise
        if isinstance(answer, ToolMessage | Command):
            return answer
        # a corral middleware answered in the tool's place: its answer is the tool's result
        return ToolMessage(content=_text(answer), name=name, tool_call_id=call_id)

    def wrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], ToolMessage | Command[Any]],
    ) -> ToolMessage | Command[Any]:
        """Raises :class:`SyncPathError`: the tool is not called."""
        raise SyncPathError("wrap_tool_call")


def _add_name(names: list[str], value: object) -> None:
    if isinstance(value, str) and value and value not in names:
        names.append(value)


def _as_tool(tool: GatewayTool) -> BaseTool:
    """A gateway tool as a LangChain tool (async only, as the gateway is)."""

    async def call(**arguments: Any) -> str:
        return await tool(arguments)

    return StructuredTool(
        name=tool.name,
        description=tool.description,
        args_schema=dict(tool.parameters),
        coroutine=call,
    )


def _text(value: object) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except ValueError:  # a circular structure
        return str(value)
