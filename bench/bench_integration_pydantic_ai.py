"""The Pydantic AI adapter's overhead: ``CorralCapability`` against the bare framework.

Run with ``.venv/bin/python -m bench bench_integration_pydantic_ai``.

Agents on Pydantic AI's ``FunctionModel`` (its test model driven by a function: no network,
scripted steps, fixed usage), in two shapes: ``answer`` (one model call) and ``tools`` (N steps
of one tool call each, then the answer: N + 1 model calls, N tool calls). One run of each
(agent, shape) in turn after a warm-up, so that drift on a shared machine weighs on every case
alike. The agents: bare; with a capability whose hooks only call on (what Pydantic AI charges
for having hooks at all); with corral (a budget in tokens, dollars, turns and time, and a price
for the model); with corral and a supervisor of one guardrail, which allows every call.

Two figures: each run's wall time (p50), and the time corral itself takes per model call and
per tool call, measured inside its hooks in the same runs (the hook's time less the time of the
handler it wraps: the checks, the accounting, and the task and wake-up the deadline's race adds).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

from pydantic_ai import Agent, RunContext
from pydantic_ai.capabilities import (
    AbstractCapability,
    WrapModelRequestHandler,
    WrapToolExecuteHandler,
)
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models import ModelRequestContext
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.usage import RequestUsage

from bench._harness import row
from corral.guard import AgentGroup, GuardrailResult, Supervisor
from corral.integrations.pydantic_ai import CorralCapability
from corral.kernel import ExecutionBudget
from corral.runtime import ModelPrice

N = 5  # tool steps in the "tools" shape
WARMUP = 20
RUNS = 200  # of each (agent, shape)
MODEL = "bench-model"
SHAPES = ("answer", "tools")
clock = time.perf_counter


class AllowAll:
    name = "allow-all"

    def check(self, agent_id: str, action: str, context: Mapping[str, object]) -> GuardrailResult:
        return GuardrailResult.allow()


def steps(shape: str) -> Callable[[list[ModelMessage], AgentInfo], Any]:
    """The model of one shape: what each step answers, from how many requests it has seen."""

    async def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        step = sum(isinstance(m, ModelRequest) for m in messages) - 1
        usage = RequestUsage(input_tokens=100, output_tokens=20)
        if shape == "tools" and step < N:
            return ModelResponse(
                parts=[ToolCallPart("lookup", {"key": step}, tool_call_id=f"c{step}")],
                usage=usage,
            )
        return ModelResponse(parts=[TextPart("done")], usage=usage)

    return respond


def lookup(key: int) -> str:
    """Look a key up."""
    return f"value {key}"


class PassThrough(AbstractCapability[Any]):
    """Hooks that only call on: what Pydantic AI charges for a capability with these hooks."""

    async def wrap_model_request(
        self,
        ctx: RunContext[Any],
        *,
        request_context: ModelRequestContext,
        handler: WrapModelRequestHandler,
    ) -> ModelResponse:
        return await handler(request_context)

    async def wrap_tool_execute(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: dict[str, Any],
        handler: WrapToolExecuteHandler,
    ) -> Any:
        return await handler(args)


class Timed(CorralCapability):
    """CorralCapability, timing its own part of each hook: the hook less the handler."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.model_s: list[float] = []
        self.tool_s: list[float] = []

    async def wrap_model_request(
        self,
        ctx: RunContext[Any],
        *,
        request_context: ModelRequestContext,
        handler: WrapModelRequestHandler,
    ) -> ModelResponse:
        inner = 0.0

        async def timed(request: ModelRequestContext) -> ModelResponse:
            nonlocal inner
            started = clock()
            try:
                return await handler(request)
            finally:
                inner = clock() - started

        started = clock()
        try:
            return await super().wrap_model_request(
                ctx, request_context=request_context, handler=timed
            )
        finally:
            self.model_s.append(clock() - started - inner)

    async def wrap_tool_execute(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: dict[str, Any],
        handler: WrapToolExecuteHandler,
    ) -> Any:
        inner = 0.0

        async def timed(arguments: dict[str, Any]) -> Any:
            nonlocal inner
            started = clock()
            try:
                return await handler(arguments)
            finally:
                inner = clock() - started

        started = clock()
        try:
            return await super().wrap_tool_execute(
                ctx, call=call, tool_def=tool_def, args=args, handler=timed
            )
        finally:
            self.tool_s.append(clock() - started - inner)


def corral(supervised: bool) -> Timed:
    return Timed(
        agent_id="bench",
        supervisor=Supervisor(AgentGroup("bench"), [AllowAll()]) if supervised else None,
        budget=ExecutionBudget(
            max_tokens=10**12, max_cost_usd=10.0**6, max_turns=10**9, deadline_s=3600
        ),
        prices={MODEL: ModelPrice(2.5, 10.0)},
    )


BARE = "bare Pydantic AI"
FLAVOURS: dict[str, Callable[[], AbstractCapability[Any] | None]] = {
    BARE: lambda: None,
    "pass-through capability": PassThrough,
    "corral (budget)": lambda: corral(False),
    "corral (budget + supervisor)": lambda: corral(True),
}


async def measure() -> tuple[dict[tuple[str, str], list[float]], dict[str, Timed]]:
    agents: dict[tuple[str, str], Agent[None, str]] = {}
    timed: dict[str, Timed] = {}
    for flavour, make in FLAVOURS.items():
        capability = make()  # one per flavour: its Oversight spans all its runs
        if isinstance(capability, Timed):
            timed[flavour] = capability
        for shape in SHAPES:
            agents[flavour, shape] = Agent(
                FunctionModel(steps(shape), model_name=MODEL),
                tools=[lookup],
                capabilities=[] if capability is None else [capability],
            )
    for agent in agents.values():  # each answers what it should before it is timed
        assert (await agent.run("go")).output == "done"
        for _ in range(WARMUP):
            await agent.run("go")
    for capability in timed.values():
        capability.model_s.clear()
        capability.tool_s.clear()
    samples: dict[tuple[str, str], list[float]] = {key: [] for key in agents}
    plan = list(agents.items())
    for _ in range(RUNS):
        for key, agent in plan:
            started = clock()
            await agent.run("go")
            samples[key].append(clock() - started)
    return samples, timed


def p50_us(times: list[float]) -> float:
    return statistics.median(times) * 1e6


def main() -> None:
    samples, timed = asyncio.run(measure())
    print(
        f"Runs on FunctionModel; `answer`: 1 model call; `tools`: {N + 1} model calls and "
        f"{N} tool calls. p50 of {RUNS} runs each, taken in turn:\n"
    )
    print(row("agent", *(f"{shape} (us)" for shape in SHAPES), "over bare (answer, tools)"))
    print(row("---", *("---:" for _ in SHAPES), "---:"))
    for flavour in FLAVOURS:
        cells = [p50_us(samples[flavour, shape]) for shape in SHAPES]
        bare = [p50_us(samples[BARE, shape]) for shape in SHAPES]
        over = [cell - was for cell, was in zip(cells, bare, strict=True)]
        shown_over = "" if flavour == BARE else ", ".join(f"{o:+,.0f}" for o in over)
        print(row(flavour, *(f"{c:,.0f}" for c in cells), shown_over))
    print("\ncorral's own time per call, inside its hooks (same runs, all shapes):\n")
    print(row("agent", "per model call p50", "p99", "per tool call p50", "p99"))
    print(row("---", "---:", "---:", "---:", "---:"))
    for flavour, capability in timed.items():
        model = sorted(capability.model_s)
        tool = sorted(capability.tool_s)

        def at(values: list[float], q: float) -> str:
            return f"{values[min(len(values) - 1, int(len(values) * q))] * 1e6:,.0f} us"

        print(row(flavour, at(model, 0.5), at(model, 0.99), at(tool, 0.5), at(tool, 0.99)))


if __name__ == "__main__":
    main()
