"""corral inside the OpenAI Agents SDK (``pip install 'corral[openai-agents]'``).

:class:`CorralRunner` puts one :class:`~corral.integrations.Oversight` into an SDK run, each
rule where the SDK carries it best:

- **Model calls: a** ``Model`` **wrapper** (:class:`SupervisedModel`). It checks before each
  request (cancelled? deadline passed? budget left?), runs the request in a task it can
  abandon the instant the run is cancelled or its deadline passes, and counts the usage of
  that one request exactly as the model returned it. Hooks (``on_llm_start`` /
  ``on_llm_end``) could check and count, but could not abandon a call that hangs. Models
  named by a string (``Agent(model="gpt-4.1")``, the default model) are wrapped through the
  run config's model provider (:class:`SupervisedModelProvider`); ``Model`` objects set on an
  agent are wrapped when the agent is (:meth:`CorralRunner.agent`).
- **Tool calls: a tool input guardrail** (``ToolInputGuardrail`` named ``corral``) on every
  function tool of the agent and of its handoff targets (an ``as_tool`` agent's call is
  checked like any other tool's; the tools inside it, when it was supervised first). It is the SDK's
  own refusal path: a refused call answers ``reject_content`` with corral's reason, the tool
  does not run, the model reads the reason as the tool's output and the run goes on, and the
  verdict is kept in ``RunResult.tool_input_guardrail_results``. A guardrail may await, so a
  check that waits for a person (an approval) waits there. Wrapping ``FunctionTool``'s
  invoker instead would bypass the SDK's failure handling, argument preparation and
  approval bookkeeping bound to it.
- **The whole run: raced against the cancellation** (:meth:`CorralRunner.run`), so a tool
  that hangs is abandoned too when the run is cancelled or its deadline passes.
- **The gateway: a** ``FunctionTool`` **named** ``db_query`` (:meth:`CorralRunner.gateway_tools`).

Errors that end the run (``BudgetExhaustedError``, ``CostUnknownError``,
``CancellationError``, ``DeadlineExceededError``) reach the caller of :meth:`CorralRunner.run`
as themselves. The SDK reports an error raised on a tool's path (a guardrail, a tool) as
``agents.UserError("Error running tool ...")`` with the corral error as its ``__cause__``;
``run`` unwraps it, and :func:`run_error_in` does the same for callers of ``Runner.run`` or
``Runner.run_streamed``. Errors raised on the model's path pass through the SDK unwrapped.

The manual is the "OpenAI Agents SDK" section of docs/integrations.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import json
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

from agents import (
    Agent,
    AgentsException,
    FunctionTool,
    Handoff,
    Model,
    ModelProvider,
    ModelResponse,
    ModelSettings,
    ModelTracing,
    RunConfig,
    RunContextWrapper,
    Runner,
    RunResult,
    Tool,
    ToolGuardrailFunctionOutput,
    ToolInputGuardrail,
    ToolInputGuardrailData,
    TResponseInputItem,
)
from agents.agent_output import AgentOutputSchemaBase
from agents.items import TResponseStreamEvent
from agents.retry import ModelRetryAdvice, ModelRetryAdviceRequest, ModelRetryNormalizedError
from agents.run_state import RunState
from agents.tool_context import ToolContext
from openai.types.responses.response_prompt_param import ResponsePromptParam

from corral.integrations._oversight import ActionChecker, Oversight, QueryGateway, oversight_of
from corral.kernel import Clock, ExecutionBudget, RunError
from corral.kernel import _validate as v
from corral.runtime import BudgetUsage, Cancellation, Middleware, ModelPrice
from corral.runtime._cancellation import race

__all__ = [
    "CorralRunner",
    "SupervisedModel",
    "SupervisedModelProvider",
    "run_error_in",
]

C = TypeVar("C")
T = TypeVar("T")

GUARDRAIL_NAME = "corral"
"""The name of corral's tool input guardrail (as in ``tool_input_guardrail_results``)."""


# --- model calls ------------------------------------------------------------------------------


class SupervisedModel(Model):
    """An SDK ``Model`` with corral's checks and accounting around each request.

    Before each request: :meth:`Oversight.before_model` (raises when the run is cancelled, its
    deadline has passed or a budget is spent). The request runs in a task abandoned the
    instant the run's cancellation fires (``CancellationError`` / ``DeadlineExceededError``).
    After it: :meth:`Oversight.record_model_call` with the request's ``Usage``:
    ``input_tokens``, ``output_tokens`` and ``total_tokens`` as the model gave them (cached
    input tokens are part of ``input_tokens`` and reasoning tokens part of
    ``output_tokens``, so both are counted, at the input and output price), and dollars from
    the Oversight's ``prices`` looked up under ``name`` (the SDK gives no cost). Raises
    ``BudgetExhaustedError`` when the request took the run past a limit (its usage counted all
    the same) and ``CostUnknownError`` under a dollar budget when ``name`` has no price.

    A streamed request (``Runner.run_streamed``) is checked the same way; its usage is read
    from its ``response.completed`` event, before that event is passed on. The wrapped stream
    is consumed in a task of its own, so that it can be abandoned between two events as well.

    ``name`` defaults to the wrapped model's ``model`` attribute (the SDK's OpenAI models have
    one), else None (no price: ``cost_unknown`` under a dollar budget). Attributes the
    wrapper lacks are read from the wrapped model (``model``, provider feature flags).
    """

    def __init__(self, model: Model, oversight: Oversight, *, name: str | None = None) -> None:
        where = "SupervisedModel"
        v.instance_of(where, "model", model, Model)
        v.instance_of(where, "oversight", oversight, Oversight)
        v.non_empty_str(where, "name", name, optional=True)
        self.inner = model
        self.oversight = oversight
        own = getattr(model, "model", None)
        self.name: str | None = name if name is not None else own if isinstance(own, str) else None
        # The price key: the name the agent gave, else the wrapped model's own name
        # ("openai/gpt-4.1" is priced under "gpt-4.1" when only that has a price).
        self._priced_as = self.name
        if self.name not in oversight.prices and isinstance(own, str) and own in oversight.prices:
            self._priced_as = own

    def __getattr__(self, attribute: str) -> Any:
        # Only called for what this wrapper lacks; never for dunders (copy, pickle probe them)
        # nor before ``inner`` is set.
        inner = self.__dict__.get("inner")
        if inner is None or attribute.startswith("__"):
            raise AttributeError(attribute)
        return getattr(inner, attribute)

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> ModelResponse:
        response = await self.oversight.run_model(
            lambda: self.inner.get_response(
                system_instructions,
                input,
                model_settings,
                tools,
                output_schema,
                handoffs,
                tracing,
                previous_response_id=previous_response_id,
                conversation_id=conversation_id,
                prompt=prompt,
            )
        )
        self._record(response.usage)
        return response

    async def stream_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> AsyncIterator[TResponseStreamEvent]:
        oversight = self.oversight
        oversight.before_model()
        stream = self.inner.stream_response(
            system_instructions,
            input,
            model_settings,
            tools,
            output_schema,
            handoffs,
            tracing,
            previous_response_id=previous_response_id,
            conversation_id=conversation_id,
            prompt=prompt,
        )
        # The stream is consumed in one task of its own: the SDK's models keep a tracing span
        # current across their events (a context variable set at the first and reset at the
        # last), which a task per event would break.
        events: asyncio.Queue[tuple[bool, Any]] = asyncio.Queue(maxsize=1)

        async def pump() -> None:
            try:
                async for event in stream:
                    await events.put((True, event))
            except Exception as exc:
                await events.put((False, exc))
            else:
                await events.put((False, None))
            finally:
                closing = getattr(stream, "aclose", None)
                if closing is not None:
                    await closing()

        producer = asyncio.ensure_future(pump())
        recorded = False
        try:
            while True:
                is_event, item = await race(events.get(), oversight.cancellation)
                if not is_event:
                    if item is not None:
                        oversight.tracker.record(turns=1)  # a failed call counts a turn
                        raise item
                    break
                if getattr(item, "type", None) == "response.completed":
                    recorded = True
                    self._record(getattr(getattr(item, "response", None), "usage", None))
                yield item
            if not recorded:  # it ended without saying what it used: a turn all the same
                self._record(None)
        finally:
            producer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await producer

    def _record(self, usage: Any) -> None:
        input_tokens = _tokens(usage, "input_tokens")
        output_tokens = _tokens(usage, "output_tokens")
        total = _tokens(usage, "total_tokens")
        self.oversight.record_model_call(
            model=self._priced_as,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            total_tokens=total or None,
        )

    def get_retry_advice(self, request: ModelRetryAdviceRequest) -> ModelRetryAdvice | None:
        """No retry of a request corral stopped (a spent budget, a cancellation): the SDK's
        retry policies see it as an abort. Other errors: the wrapped model's advice."""
        if isinstance(request.error, RunError):
            return ModelRetryAdvice(
                suggested=False,
                reason=request.error.message,
                normalized=ModelRetryNormalizedError(is_abort=True),
            )
        return self.inner.get_retry_advice(request)

    async def _cleanup_on_run_end(self, owner: object) -> None:
        await self.inner._cleanup_on_run_end(owner)

    async def close(self) -> None:
        await self.inner.close()

    def __repr__(self) -> str:
        return f"SupervisedModel({self.inner!r}, name={self.name!r})"


def _tokens(usage: Any, field: str) -> int:
    value = getattr(usage, field, 0) if usage is not None else 0
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


class SupervisedModelProvider(ModelProvider):
    """A ``ModelProvider`` whose models are :class:`SupervisedModel` (named as asked: the name
    an agent or the run config gives, or the wrapped model's own for the default model).
    ``aclose`` closes the wrapped provider."""

    def __init__(self, provider: ModelProvider, oversight: Oversight) -> None:
        v.instance_of("SupervisedModelProvider", "provider", provider, ModelProvider)
        v.instance_of("SupervisedModelProvider", "oversight", oversight, Oversight)
        self.provider = provider
        self.oversight = oversight

    def get_model(self, model_name: str | None) -> Model:
        model = self.provider.get_model(model_name)
        if isinstance(model, SupervisedModel) and model.oversight is self.oversight:
            return model
        return SupervisedModel(model, self.oversight, name=model_name or None)

    async def aclose(self) -> None:
        await self.provider.aclose()


# --- the bundle -------------------------------------------------------------------------------


class CorralRunner:
    """corral's supervision for agents of the OpenAI Agents SDK: ``Runner.run`` with corral.

    Takes an :class:`~corral.integrations.Oversight`, or the keyword arguments of one
    (``agent_id``, ``supervisor``, ``budget``, ``prices``, ``cancellation``, ``gateway``,
    ``middleware``, ``tenant_id``, ``clock``) -- not both. One runner is one task's
    supervision: its budget and deadline cover every run made through it.

    - :meth:`run`: ``Runner.run`` on the supervised agent with the supervised run config,
      raced against the cancellation, corral's errors unwrapped.
    - :meth:`agent`: the agent as corral runs it (function tools guarded, ``Model`` objects
      wrapped, handoff targets likewise), for ``Runner.run`` / ``Runner.run_streamed``.
    - :meth:`run_config`: a run config whose models are supervised.
    - :meth:`gateway_tools`: the gateway as SDK tools (``db_query``).
    - :attr:`guardrail`: the tool input guardrail itself, for tools built elsewhere.

    Raises ``InvalidArgumentError`` for an ``oversight`` that is not one, or one given with
    Oversight's keyword arguments; Oversight's own checks apply to those.
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
            "CorralRunner",
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
        self.guardrail: ToolInputGuardrail[Any] = ToolInputGuardrail(
            guardrail_function=self._check_tool, name=GUARDRAIL_NAME
        )
        # The agents and tools this runner made (by id, kept alive here), so that supervising
        # twice changes nothing and a cycle of handoffs ends.
        self._agents: dict[int, tuple[Agent[Any], Agent[Any]]] = {}
        self._made: dict[int, object] = {}

    # --- running --------------------------------------------------------------------------

    async def run(
        self,
        agent: Agent[C],
        input: str | list[TResponseInputItem] | RunState[C],
        **options: Any,
    ) -> RunResult:
        """``Runner.run(self.agent(agent), input, run_config=self.run_config(...), **options)``,
        abandoned at once when the run is cancelled or its deadline passes (a tool that hangs
        too). ``options`` are ``Runner.run``'s (``context``, ``max_turns``, ``hooks``,
        ``run_config``, ``session``, ...).

        Raises corral's ``RunError`` subclasses as themselves -- also when the SDK wrapped one
        raised on a tool's path -- and the SDK's own errors (``MaxTurnsExceeded``, ...) as the
        SDK raises them. A model provider the run made (none given in ``run_config``, which may
        be a ``RunConfig`` or a dict of its fields) is closed after it, as ``Runner.run`` does.
        """
        v.instance_of("CorralRunner.run", "agent", agent, Agent)
        given = options.pop("run_config", None)
        # as Runner.run: the provider is the run's own (closed after it) unless one was given
        owned = given is None or (isinstance(given, dict) and "model_provider" not in given)
        if isinstance(given, dict):
            given = RunConfig(**given)
        config = self.run_config(given)
        try:
            return await race(
                Runner.run(self.agent(agent), input, run_config=config, **options),
                self.oversight.cancellation,
            )
        except AgentsException as exc:
            found = run_error_in(exc)
            if found is None:
                raise
            raise found from None
        finally:
            if owned:
                await config.model_provider.aclose()

    def run_config(self, base: RunConfig | None = None) -> RunConfig:
        """A copy of ``base`` (default ``RunConfig()``) whose model provider hands out
        supervised models, and whose ``model``, when it is a ``Model`` object, is wrapped."""
        config = RunConfig() if base is None else base
        v.instance_of("CorralRunner.run_config", "base", config, RunConfig)
        provider = config.model_provider
        if not (
            isinstance(provider, SupervisedModelProvider) and provider.oversight is self.oversight
        ):
            provider = SupervisedModelProvider(provider, self.oversight)
        model = config.model
        if isinstance(model, Model):
            model = self.model(model)
        return dataclasses.replace(config, model_provider=provider, model=model)

    # --- what runs --------------------------------------------------------------------------

    def agent(self, agent: Agent[C]) -> Agent[C]:
        """The agent as corral runs it: a clone whose function tools carry :attr:`guardrail`
        (those that already do, and the gateway's, are kept as they are), whose ``Model``
        object, if it has one, is a :class:`SupervisedModel` (a model named by a string is
        supervised through :meth:`run_config`), and whose handoff targets are supervised the
        same way. The agent given is not changed; the same clone is answered each time.

        Not reached: tools of MCP servers (``mcp_servers``), hosted tools (they run at the
        provider), and the agent inside a tool made with ``as_tool`` from an agent that was
        not supervised first (``runner.agent(helper).as_tool(...)`` is).
        """
        v.instance_of("CorralRunner.agent", "agent", agent, Agent)
        return self._supervised(agent)

    def _supervised(self, agent: Agent[C]) -> Agent[C]:
        if id(agent) in self._made:
            return agent
        kept = self._agents.get(id(agent))
        if kept is not None and kept[0] is agent:
            return kept[1]
        changes: dict[str, Any] = {"tools": self.guarded(agent.tools)}
        if isinstance(agent.model, Model):
            # model_settings passed as they are, so the clone does not reset them to the
            # defaults of its new model
            changes["model"] = self.model(agent.model)
            changes["model_settings"] = agent.model_settings
        clone = agent.clone(**changes)
        self._agents[id(agent)] = (agent, clone)
        self._made[id(clone)] = clone
        # after the clone is known: a handoff back to this agent finds it
        clone.handoffs = [self._handoff(h) for h in agent.handoffs]
        return clone

    def _handoff(self, target: Agent[Any] | Handoff[Any, Any]) -> Agent[Any] | Handoff[Any, Any]:
        if isinstance(target, Agent):
            return self._supervised(target)
        if not isinstance(target, Handoff) or id(target) in self._made:
            return target
        invoke = target.on_invoke_handoff

        async def supervised(context: RunContextWrapper[Any], arguments: str) -> Any:
            chosen = await invoke(context, arguments)
            return self._supervised(chosen) if isinstance(chosen, Agent) else chosen

        made = copy.copy(target)
        made.on_invoke_handoff = supervised
        ref = getattr(target, "_agent_ref", None)
        original = ref() if ref is not None else None
        if isinstance(original, Agent):
            # the SDK reads the target's tools from here before it hands off
            made._agent_ref = weakref.ref(self._supervised(original))
        self._made[id(made)] = made
        return made

    def guarded(self, tools: Iterable[Tool]) -> list[Tool]:
        """``tools`` with :attr:`guardrail` added to each function tool (a copy of it, after
        its own input guardrails); other tools as they are."""
        result: list[Tool] = []
        for tool in tools:
            if (
                not isinstance(tool, FunctionTool)
                or id(tool) in self._made
                or any(g is self.guardrail for g in tool.tool_input_guardrails or ())
            ):
                result.append(tool)
                continue
            made = copy.copy(tool)  # as the SDK copies a tool (tool_namespace)
            made.tool_input_guardrails = [*(tool.tool_input_guardrails or ()), self.guardrail]
            self._made[id(made)] = made
            result.append(made)
        return result

    def model(self, model: Model, *, name: str | None = None) -> SupervisedModel:
        """``model`` supervised by this runner; ``name`` is the name it is priced under
        (default: its ``model`` attribute). A model this runner supervises already is
        answered as it is unless a ``name`` is given."""
        if isinstance(model, SupervisedModel) and model.oversight is self.oversight:
            if name is None or name == model.name:
                return model
            model = model.inner
        return SupervisedModel(model, self.oversight, name=name)

    def gateway_tools(self) -> list[Tool]:
        """The gateway as function tools (``db_query``, querying as the Oversight's
        ``agent_id``); empty without a gateway. Checked by the supervisor inside the tool (not
        by :attr:`guardrail`, which they do not carry); a gateway refusal is the tool's output,
        which the model reads. Arguments that are not JSON are passed on as
        ``{"arguments": text}``, which the tool refuses with ``invalid_argument``."""
        made: list[Tool] = []
        for gateway_tool in self.oversight.gateway_tools():
            tool = FunctionTool(
                name=gateway_tool.name,
                description=gateway_tool.description,
                params_json_schema=dict(gateway_tool.parameters),
                on_invoke_tool=_invoker(gateway_tool),
                # the request is a free-form object, which strict schemas cannot say
                strict_json_schema=False,
            )
            self._made[id(tool)] = tool
            made.append(tool)
        return made

    async def _check_tool(self, data: ToolInputGuardrailData) -> ToolGuardrailFunctionOutput:
        context = data.context
        refusal = await self.oversight.check_tool(
            context.tool_name, _arguments(context.tool_arguments), call_id=context.tool_call_id
        )
        if refusal is None:
            return ToolGuardrailFunctionOutput.allow()
        return ToolGuardrailFunctionOutput.reject_content(refusal, output_info={"refused": refusal})

    # --- state ------------------------------------------------------------------------------

    def usage(self) -> BudgetUsage:
        """What the agent has spent through this runner (tokens, dollars, turns, seconds)."""
        return self.oversight.usage()

    def cancel(self, reason: str | None = None) -> None:
        """Stop the agent: the call in flight is abandoned, the next one refused."""
        self.oversight.cancel(reason)

    def __repr__(self) -> str:
        return f"CorralRunner({self.oversight!r})"


def run_error_in(error: BaseException) -> RunError | None:
    """The corral ``RunError`` (spent budget, unknown cost, cancellation, deadline) that
    ended an SDK run, found in ``error`` or its causes (the SDK raises an error from a tool's
    path as ``UserError`` caused by it); None when the run ended for another reason."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, RunError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def _arguments(raw: str) -> dict[str, Any]:
    """A tool call's arguments as the guard sees them: the JSON object the model wrote, ``{}``
    for none, ``{"arguments": value}`` for anything else (so a rule can still match it)."""
    if not raw or not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        return {"arguments": raw}
    return value if isinstance(value, dict) else {"arguments": value}


def _invoker(
    gateway_tool: Callable[[Mapping[str, Any]], Awaitable[str]],
) -> Callable[[ToolContext[Any], str], Awaitable[str]]:
    async def invoke(context: ToolContext[Any], raw: str) -> str:
        return await gateway_tool(_arguments(raw))

    return invoke
