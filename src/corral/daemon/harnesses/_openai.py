"""``OpenAIHarness``: one turn is one run of the agent loop against an OpenAI-compatible server."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from corral.agent import Agent
from corral.daemon.harnesses import _conversation
from corral.daemon.harnesses._base import TurnFailedError, TurnRequest, TurnResult
from corral.daemon.harnesses._call_log import CallLog as _Logged
from corral.daemon.harnesses._process import PID_FILE, Limits, reap_pid_file
from corral.daemon.harnesses._timer import TurnTimer
from corral.daemon.harnesses._tools import command_tools, extra_tools
from corral.kernel import (
    BudgetExhaustedError,
    CorralError,
    CostUnknownError,
    InvalidArgumentError,
    MiddlewareStage,
    RunMeta,
)
from corral.kernel import _validate as v
from corral.runtime import (
    CallNext,
    Cancellation,
    ChatResult,
    ExecutionTracker,
    Middleware,
    MiddlewareContext,
    ModelPrice,
    OpenAIClient,
    ToolGuard,
    WorstCaseBudget,
)
from corral.runtime.middleware import Tracing


class OpenAIHarness:
    """Runs :class:`corral.agent.Agent` over :class:`corral.runtime.OpenAIClient` for one prompt.

    The client talks to ``spec.openai.base_url`` with ``spec.openai.model``; its API key is
    ``os.environ[spec.openai.api_key_env]`` when ``api_key_env`` is set (the spec holds the
    variable's name, never the key); ``spec.openai.price`` prices the model. The agent gets
    ``spec.openai.instructions``, the tools of ``spec.openai.tools`` and of
    ``request.extra_tools`` (corral's own, when the spec asks for them), and
    ``request.remaining`` as its budget with ``max_turns`` lifted: the daemon counts its own
    turns, and one daemon turn may take several model round-trips. The model is not retried
    here: a failed call fails the turn and the agent's failure policy decides what comes
    next. ``spec.openai.model_options`` are sent with every call.

    No call starts that could pass what is left of the budget
    (:class:`corral.runtime.WorstCaseBudget`): before each call its worst case is bounded
    (input tokens by the bytes of the request, output tokens by the options'
    ``max_tokens``/``max_completion_tokens``, or, when the budget limits tokens or dollars
    and the spec gives no cap, by a cap the harness sets: 4096 tokens, lowered to what is
    left affords), and a call that could pass a limit, or whose cost cannot be bounded (a
    dollar budget and no price), is not made. A turn that stops on its budget, before a call
    or after one that passed a limit, fails with ``dimension`` set: the daemon holds the
    agent ``budget-exhausted`` whatever its policy.

    Tools: a call runs the tool's command in ``request.workdir`` with the agent's
    environment, in a process group of its own, the arguments as JSON on its stdin; its
    stdout is the result (at most ``tool_output_bytes`` kept, then a line saying how much was
    dropped). A command that cannot start or exits non-zero is a tool error the model is told
    about (the exit code and the last ``tool_stderr_tail_bytes`` of its stderr) and the run
    goes on. A turn that is cancelled or times out kills the running tool's process group;
    its pid is kept in ``<state_dir>/turn.pid`` meanwhile, for :meth:`reap`. Tool calls run
    one at a time. With ``request.check_action`` every tool call is checked first
    (:class:`corral.runtime.middleware.ToolGuard`: the action is the tool's name, a space and
    its arguments as JSON): a call not allowed does not run and the model is told it was
    refused, with the reason; a check that raises refuses too. A check may wait on a person
    (an ``ask`` rule): the turn waits with it.

    Liveness: when the daemon watches the turn (``request.heartbeat``, the spec's
    ``heartbeatS``), each model call and tool call is a sign of life as it starts and ends.

    The turn's time limit counts its own time only: time it waits on a person
    (``request.paused_s``) does not count against ``request.timeout_s``; see
    :class:`TurnTimer`.

    The result carries the tokens and dollars of the whole run; ``cost_usd`` is None when a
    model reply could not be priced (no ``price`` in the spec, or a reply without usage).

    Session: ``request.session`` goes to the model before the prompt (after the
    instructions), shaped by ``spec.compaction`` (``_conversation``; a ``summarize`` call is
    paid from the turn's budget and counted in its usage); the result's ``messages`` are the
    turn's replies, tool calls and tool results, for the agent's session.

    Failed turns (:class:`TurnFailedError`, with ``usage`` ``{"tokens", "costUsd"}`` spent
    before the failure): the key variable is unset or empty (the message names it); any
    :class:`CorralError` of the run -- a budget dimension exhausted, a model error (HTTP
    error, unreachable server, invalid reply) -- with its message and ``cause`` set to its
    code; any other exception; a run longer than ``request.timeout_s`` ("turn timed out after
    N s"; the model call in flight is abandoned, the tool running is killed). Cancellation
    does the same and propagates.
    """

    def __init__(
        self,
        *,
        tool_output_bytes: int = 64 * 1024,
        tool_stderr_tail_bytes: int = 2048,
        tool_drain_s: float = 2.0,
    ) -> None:
        where = "OpenAIHarness"
        v.positive_int(where, "tool_output_bytes", tool_output_bytes)
        v.positive_int(where, "tool_stderr_tail_bytes", tool_stderr_tail_bytes)
        v.positive_number(where, "tool_drain_s", tool_drain_s)
        self.tool_limits = Limits(tool_output_bytes, tool_stderr_tail_bytes, tool_drain_s)

    def __repr__(self) -> str:
        return f"OpenAIHarness(tool_output_bytes={self.tool_limits.max_output_bytes})"

    async def run_turn(self, request: TurnRequest) -> TurnResult:
        """Run one turn; see the class docstring. Raises ``InvalidArgumentError`` when the
        request is not a TurnRequest for an ``openai`` spec."""
        v.instance_of("OpenAIHarness.run_turn", "request", request, TurnRequest)
        options = request.spec.openai
        if request.spec.harness != "openai" or options is None:
            raise InvalidArgumentError(
                "OpenAIHarness.run_turn",
                "request.spec",
                "a spec of harness 'openai' with openai options",
                request.spec.harness,
            )
        api_key: str | None = None
        if options.api_key_env is not None:
            api_key = os.environ.get(options.api_key_env)
            if not api_key:
                state = "empty" if api_key is not None else "not set"
                raise TurnFailedError(
                    f"the API key variable {options.api_key_env!r} is {state} in the "
                    "daemon's environment",
                    api_key_env=options.api_key_env,
                )
        prices: dict[str, ModelPrice] = {}
        if options.price is not None:
            prices[options.model] = ModelPrice(
                options.price.input_per_mtok_usd, options.price.output_per_mtok_usd
            )
        budget = dataclasses.replace(request.remaining, max_turns=None)
        tracker = ExecutionTracker(budget)
        priced = _PriceWatch()
        price = prices.get(options.model)
        said = _conversation.Transcript()
        middleware: list[Middleware] = [said, priced, WorstCaseBudget(tracker, price)]
        if request.heartbeat is not None:
            middleware.insert(0, _Alive(request.heartbeat))
        if request.check_action is not None:
            middleware.append(ToolGuard(request.check_action))
        if request.log is not None:
            middleware.insert(0, _Logged(request.log))
        # First: its spans (model and tool calls) cover the others' work. The run's id is its
        # trace id, so the spans join the daemon's span of the turn (see docs/daemon.md).
        middleware.insert(0, Tracing())
        run_id = request.env.get("CORRAL_RUN_ID")
        timer = TurnTimer(request.timeout_s, request.paused_s)
        limit: asyncio.Timeout | None = None
        try:
            async with (
                timer.limit() as limit,
                OpenAIClient(
                    options.base_url,
                    options.model,
                    api_key=api_key,
                    prices=prices,
                    # past the turn's own limit: a slow call ends as a turn timeout
                    timeout_s=request.timeout_s + 1.0,
                ) as client,
            ):
                history = await _conversation.prior_messages(
                    request.session, request.spec.compaction, client, tracker
                )
                # The turn's own messages follow the instructions, the history and the prompt.
                said.start = (1 if options.instructions else 0) + len(history) + 1
                agent = Agent(
                    client,
                    agent_id=request.agent_id,
                    instructions=options.instructions,
                    budget=budget,
                    tools=[
                        *command_tools(request, self.tool_limits),
                        *extra_tools(request),
                    ],
                    middleware=middleware,
                    model_options=options.model_options,
                )
                meta = None
                if run_id:
                    meta = RunMeta(
                        cancellation=Cancellation(clock=agent.clock),
                        run_id=run_id,
                        trace_id=run_id,
                        clock=agent.clock,
                    )
                run = await agent.run(request.prompt, meta=meta, tracker=tracker, history=history)
        except asyncio.CancelledError:
            # Cut short from outside: what the model calls spent still counts.
            if request.spent is not None:
                request.spent(_usage(tracker, priced))
            raise
        except TimeoutError as exc:
            if limit is None or not limit.expired():
                raise _failed(exc, tracker, priced, said) from exc
            raise TurnFailedError(
                timer.timeout_message(),
                usage=_usage(tracker, priced),
                messages=said.said(),
                timeout_s=request.timeout_s,
            ) from None
        except Exception as exc:
            raise _failed(exc, tracker, priced, said) from exc
        return TurnResult(
            output=run.output or "",
            tokens=run.usage.tokens,
            cost_usd=run.usage.cost_usd if priced.all_priced else None,
            messages=said.said(),
        )

    async def reap(self, agent_id: str, state_dir: Path) -> bool:
        """End the process group of a tool that was running when the daemon died; True when
        one was signalled (the model call in flight died with the daemon). The same pid file
        rules as :meth:`CommandHarness.reap`. Idempotent."""
        v.non_empty_str("OpenAIHarness.reap", "agent_id", agent_id)
        v.instance_of("OpenAIHarness.reap", "state_dir", state_dir, Path)
        return reap_pid_file(state_dir / PID_FILE)


class _Alive:
    """Tells the daemon the turn is alive as each model call and tool call starts and ends
    (``request.heartbeat``): a call that takes longer than ``heartbeatS`` stalls the turn."""

    stages = frozenset({MiddlewareStage.CHAT, MiddlewareStage.TOOL})

    def __init__(self, beat: Callable[[], None]) -> None:
        self.beat = beat

    async def process(self, ctx: MiddlewareContext, call_next: CallNext) -> None:
        self.beat()
        try:
            await call_next()
        finally:
            self.beat()


class _PriceWatch:
    """Notes whether every model reply of the run had a dollar cost."""

    stages = frozenset({MiddlewareStage.CHAT})

    def __init__(self) -> None:
        self.all_priced = True

    async def process(self, ctx: MiddlewareContext, call_next: CallNext) -> None:
        try:
            await call_next()
        finally:
            # also when the budget refuses an unpriced reply: its cost stays unknown
            result = ctx.result
            if isinstance(result, ChatResult) and result.cost_usd is None:
                self.all_priced = False


def _usage(tracker: ExecutionTracker, priced: _PriceWatch) -> dict[str, Any]:
    spent = tracker.usage()
    return {"tokens": spent.tokens, "costUsd": spent.cost_usd if priced.all_priced else None}


def _failed(
    exc: Exception,
    tracker: ExecutionTracker,
    priced: _PriceWatch,
    said: _conversation.Transcript,
) -> TurnFailedError:
    if isinstance(exc, CorralError):
        dimension = None
        if isinstance(exc, BudgetExhaustedError):
            dimension = exc.dimension
        elif isinstance(exc, CostUnknownError):
            dimension = "cost_usd"
        return TurnFailedError(
            exc.message,
            usage=_usage(tracker, priced),
            messages=said.said(),
            dimension=dimension,
            retryable=exc.retryable,
            cause=exc.code,
        )
    return TurnFailedError(
        f"the agent loop raised {type(exc).__name__}: {exc}",
        usage=_usage(tracker, priced),
        messages=said.said(),
        cause=type(exc).__name__,
    )
