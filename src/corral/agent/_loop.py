"""``Agent``: a small tool-using loop (model -> tool calls -> model ...) under supervision."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from corral.agent._tool import Tool, ToolError, ToolFunction, UnknownToolError
from corral.kernel import (
    SYSTEM_CLOCK,
    ChatMessage,
    Clock,
    CorralError,
    ExecutionBudget,
    InvalidArgumentError,
    MiddlewareStage,
    RefusalError,
    RunError,
    RunMeta,
    Supervision,
    UsageError,
)
from corral.kernel import _validate as v
from corral.runtime import (
    AgentContext,
    BudgetAccounting,
    BudgetUsage,
    Cancellation,
    CancellationCheck,
    ChatResult,
    ExecutionTracker,
    LLMClient,
    Middleware,
    MiddlewareContext,
    MiddlewarePipeline,
    ModelResponseError,
)
from corral.runtime._cancellation import race
from corral.runtime._compaction import compaction_tracker

T = TypeVar("T")

logger = logging.getLogger("corral.agent")

ToolStatus = Literal["ok", "refused", "invalid", "error"]


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """What became of one tool call: ``ok``, ``refused`` by a policy, ``invalid`` (unknown
    tool or bad arguments) or ``error`` (the tool raised). ``output`` is what the model saw."""

    tool_call_id: str
    tool: str
    arguments: Mapping[str, Any]
    status: ToolStatus
    output: str
    error_code: str | None = None


@dataclass(frozen=True, slots=True)
class AgentRun:
    """The result of :meth:`Agent.run`."""

    run_id: str
    output: str | None
    messages: tuple[ChatMessage, ...]
    tool_calls: tuple[ToolOutcome, ...]
    usage: BudgetUsage


class Agent:
    """A tool-using agent loop that honours budgets, cancellation, deadlines and middleware.

    One :meth:`run` handles one prompt: it asks the model, runs the tools the model asks for,
    feeds their results back, and repeats until the model answers without tool calls.

    Every call goes through the middleware pipeline at its stage (TURN around the whole run,
    CHAT around each model call, TOOL around each tool call). Inside the caller's middleware the
    agent adds a cancellation/deadline check and budget accounting, so every model call --
    retries included -- is checked before it starts and counted after it ends.

    Stops:
    - cancellation or deadline -> ``CancellationError`` / ``DeadlineExceededError``; a call in
      flight when the token is cancelled (or the deadline passes) is abandoned at once;
    - a budget dimension without room -> ``BudgetExhaustedError`` (the call does not start);
    - a middleware that refuses a TURN or CHAT call -> its ``RefusalError`` (such as
      ``MiddlewareTermination`` or ``RateLimitedError``);
    - a model error that no middleware recovered -> the ``ModelError``.
    A refusal of a TOOL call (a guardrail, a rate limit), an unknown tool, invalid
    arguments or a tool that raises do not end the run: the model is told, and the outcome is
    recorded in ``AgentRun.tool_calls``. Outside ``asyncio.CancelledError`` passes through
    untouched.
    """

    def __init__(
        self,
        client: LLMClient,
        *,
        agent_id: str = "agent",
        instructions: str | None = None,
        tools: Iterable[Tool | ToolFunction] = (),
        middleware: Iterable[Middleware] = (),
        budget: ExecutionBudget | None = None,
        model_options: Mapping[str, Any] | None = None,
        context: AgentContext | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        where = "Agent"
        if not isinstance(client, LLMClient):
            raise InvalidArgumentError(where, "client", "an LLMClient", client)
        v.non_empty_str(where, "agent_id", agent_id)
        v.non_empty_str(where, "instructions", instructions, optional=True)
        if budget is not None:
            v.instance_of(where, "budget", budget, ExecutionBudget)
        _iterable(where, "tools", tools)
        _iterable(where, "middleware", middleware)
        layers = tuple(middleware)
        for mw in layers:
            if not callable(getattr(mw, "process", None)):
                raise InvalidArgumentError(where, "middleware[]", "a Middleware", mw)
        MiddlewarePipeline(layers)  # a bad ``stages`` attribute is refused now, not per run
        options = {} if model_options is None else model_options
        if not isinstance(options, Mapping):
            raise InvalidArgumentError(where, "model_options", "a Mapping or None", options)
        for key in options:
            v.non_empty_str(where, "model_options key", key)
        if context is not None:
            v.instance_of(where, "context", context, AgentContext)
            if context.agent_id != agent_id:
                raise InvalidArgumentError(
                    where, "context", f"the context of agent {agent_id!r}", context.agent_id
                )
        v.instance_of(where, "clock", clock, Clock)
        self.client = client
        self.agent_id = agent_id
        self.instructions = instructions
        self.budget = budget
        self.middleware = layers
        self.model_options = dict(options)
        self.context = context
        self.clock = clock
        self.tools: dict[str, Tool] = {}
        for item in tools:
            t = item if isinstance(item, Tool) else Tool(item)
            if t.name in self.tools:
                raise InvalidArgumentError(where, "tools", "tools with distinct names", t.name)
            self.tools[t.name] = t

    async def run(
        self,
        prompt: str,
        *,
        meta: RunMeta | None = None,
        tracker: ExecutionTracker | None = None,
        history: Sequence[ChatMessage] = (),
        session_id: str | None = None,
    ) -> AgentRun:
        """Handle ``prompt`` to a final answer.

        ``meta`` defaults to a fresh root run on the agent's clock, in session ``session_id``
        (a new session when None). The budget is the agent's ``budget``, else the
        supervision's execution budget; ``deadline_s`` becomes a deadline on the run (the
        sooner of it and ``meta.deadline``). Pass a ``tracker`` to share accounting across
        runs. ``history`` is prepended (after the instructions).

        With a ``context``, the session's compacted history comes before ``history`` (a
        compaction still running when the run is cancelled or its deadline passes is
        abandoned, like a model call, and its own model calls are paid from the run's budget,
        tokens and dollars but not turns), and
        the run's messages (from the prompt on) are appended to the session with the
        supervision's retention, whether the run succeeds or fails (a trailing model message
        whose tool calls got no results is left out, so the history stays valid). A store
        error fails a successful run; after a failed run it is logged and the run's own error
        is raised. Nothing is saved when the task is cancelled from outside.
        """
        where = "Agent.run"
        v.non_empty_str(where, "prompt", prompt)
        v.non_empty_str(where, "session_id", session_id, optional=True)
        if meta is None:
            meta = RunMeta(
                cancellation=Cancellation(clock=self.clock),
                supervision=Supervision.root(self.agent_id, session_id=session_id),
                clock=self.clock,
            )
        v.instance_of(where, "meta", meta, RunMeta)
        if tracker is not None:
            v.instance_of(where, "tracker", tracker, ExecutionTracker)
        _iterable(where, "history", history)
        history = list(history)
        for message in history:
            v.instance_of(where, "history[]", message, ChatMessage)
        supervision = meta.supervision
        if session_id is not None and (supervision is None or supervision.session_id != session_id):
            raise InvalidArgumentError(
                where, "session_id", "None or the session of meta.supervision", session_id
            )
        if self.context is not None and supervision is None:
            raise InvalidArgumentError(
                where, "meta.supervision", "a Supervision when the agent has a context", None
            )
        budget = self.budget
        if budget is None and meta.supervision is not None:
            budget = meta.supervision.execution_budget
        budget = budget or ExecutionBudget()
        if budget.deadline_s is not None:
            meta = meta.with_deadline_after(budget.deadline_s)
        if tracker is None:
            # started after the run's deadline is set, so the deadline (checked first, by
            # CancellationCheck) always fires before the tracker's own deadline_s
            tracker = ExecutionTracker(budget, clock=meta.clock)
        token = meta.cancellation.child()
        if meta.deadline is not None and isinstance(token, Cancellation):
            token.cancel_at(meta.deadline)
        meta = dataclasses.replace(meta, cancellation=token)
        try:
            if self.context is not None and supervision is not None:
                # Compaction may call a model (summarisation): the deadline and a cancel
                # stop it like any other call of the run.
                # Its model calls are the run's: paid from the run's budget.
                paying = compaction_tracker.set(tracker)
                try:
                    window = await race(
                        self.context.get_prompt_window(supervision.session_id), token
                    )
                finally:
                    compaction_tracker.reset(paying)
                history = [*window, *history]
            run = _Run(self, meta, tracker, history)
            try:
                result = await run.execute(prompt)
            except Exception as exc:
                if self.context is not None and supervision is not None:
                    try:
                        await self._save(self.context, supervision, meta.id, run.new_messages())
                    except Exception:
                        logger.exception("could not save the history of a failed run")
                        exc.add_note("the run's messages could not be saved to the history store")
                raise
        finally:
            if isinstance(token, Cancellation) and not token.is_cancelled:
                token.cancel("run finished")  # releases the deadline timer
        if self.context is not None and supervision is not None:
            await self._save(self.context, supervision, meta.id, run.new_messages())
        return result

    @staticmethod
    async def _save(
        context: AgentContext,
        supervision: Supervision,
        run_id: str,
        messages: list[ChatMessage],
    ) -> None:
        await context.store.append(
            supervision.session_id, messages, run_id=run_id, retention=supervision.retention
        )


class _Run:
    """The state of one :meth:`Agent.run`."""

    def __init__(
        self, agent: Agent, meta: RunMeta, tracker: ExecutionTracker, history: list[ChatMessage]
    ) -> None:
        self.agent = agent
        self.meta = meta
        self.tracker = tracker
        self.messages: list[ChatMessage] = []
        if agent.instructions:
            self.messages.append(ChatMessage.system(agent.instructions))
        self.messages.extend(history)
        self.start = len(self.messages)  # where this run's own messages begin
        self.outcomes: list[ToolOutcome] = []
        self.pipeline = MiddlewarePipeline(
            [*agent.middleware, CancellationCheck(), BudgetAccounting(tracker)]
        )
        self.specs = [t.spec for t in agent.tools.values()]

    def new_messages(self) -> list[ChatMessage]:
        """This run's messages, without a trailing tool request that got no results."""
        new = self.messages[self.start :]
        for i in range(len(new) - 1, -1, -1):
            calls = new[i].tool_calls
            if calls:
                answered = {m.tool_call_id for m in new[i + 1 :]}
                if any(call.id not in answered for call in calls):
                    return new[:i]
                break
        return new

    def context(self, stage: MiddlewareStage, **fields: Any) -> MiddlewareContext:
        return MiddlewareContext(
            stage=stage, agent_id=self.agent.agent_id, meta=self.meta, **fields
        )

    async def execute(self, prompt: str) -> AgentRun:
        self.messages.append(ChatMessage.user(prompt))
        ctx = self.context(MiddlewareStage.TURN, prompt=prompt, messages=self.messages)
        try:
            output = await self.pipeline.run(ctx, self._turn)
        except CorralError as exc:
            usage = self.tracker.usage()
            exc.add_note(
                f"agent {self.agent.agent_id!r} stopped after {usage.turns} turns, "
                f"{usage.tokens} tokens, ${usage.cost_usd:.4f}"
            )
            raise
        return AgentRun(
            run_id=self.meta.id,
            output=output,
            messages=tuple(self.messages),
            tool_calls=tuple(self.outcomes),
            usage=self.tracker.usage(),
        )

    async def _turn(self, ctx: MiddlewareContext) -> None:
        while True:
            self.meta.check()
            chat = self.context(
                MiddlewareStage.CHAT,
                messages=list(self.messages),
                tools=list(self.specs),
                options=dict(self.agent.model_options),
            )
            result = await race(self.pipeline.run(chat, self._chat), self.meta.cancellation)
            if not isinstance(result, ChatResult):
                raise UsageError(
                    "the chat call produced no ChatResult (a middleware short-circuited it "
                    f"without setting ctx.result); got {type(result).__name__}",
                    stage="chat",
                )
            self.messages.append(result.message)
            if not result.tool_calls:
                ctx.result = result.text
                return
            for call in result.tool_calls:
                self.meta.check()
                await self._tool_call(call.id, call.name, call.arguments, call.invalid_arguments)

    async def _chat(self, ctx: MiddlewareContext) -> None:
        tools = ctx.tools or None
        ctx.result = await self.agent.client.generate(ctx.messages, tools=tools, **ctx.options)
        if not isinstance(ctx.result, ChatResult):
            raise ModelResponseError(
                repr(self.agent.client), f"generate returned {type(ctx.result).__name__}"
            )

    async def _tool(self, ctx: MiddlewareContext) -> None:
        assert ctx.tool_name is not None
        found = self.agent.tools.get(ctx.tool_name)
        if found is None:
            raise UnknownToolError(ctx.tool_name, sorted(self.agent.tools))
        ctx.result = await found.call(ctx.arguments)

    async def _tool_call(
        self, call_id: str, name: str, arguments: Mapping[str, Any], invalid: str | None
    ) -> None:
        status: ToolStatus = "ok"
        code: str | None = None
        if invalid is not None:
            status, code = "invalid", "tool_arguments_invalid"
            output = f"error: the arguments were not a JSON object: {invalid[:200]}"
        else:
            ctx = self.context(
                MiddlewareStage.TOOL,
                tool_name=name,
                tool_call_id=call_id,
                arguments=dict(arguments),
            )
            try:
                output = str(await race(self.pipeline.run(ctx, self._tool), self.meta.cancellation))
            except RunError:
                raise  # budget, cancellation, deadline: the run ends
            except RefusalError as exc:
                status, code, output = "refused", exc.code, exc.message
            except ToolError as exc:
                status = "error" if exc.code == "tool_failed" else "invalid"
                code, output = exc.code, f"error: {exc.message}"
        self.outcomes.append(ToolOutcome(call_id, name, dict(arguments), status, output, code))
        self.messages.append(ChatMessage.tool(call_id, output, name=name))


def _iterable(where: str, name: str, value: object) -> None:
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Iterable):
        raise InvalidArgumentError(where, name, "a sequence", value)
