"""corral's LangChain middleware (``CorralMiddleware``) against the bare LangChain agent.

Goal (issue 15): the adapter's overhead per model call and per tool call against the bare
framework with its test model. Run with
``.venv/bin/python -m bench bench_integration_langchain``.

Two measures. First the hooks alone: ``await corral.awrap_model_call(request, handler)``
against ``await handler(request)`` (and the same for ``awrap_tool_call``), the handler
answering a ready reply at once: what corral itself adds per call (``_harness.time_async``:
median over runs of the mean per call). Then whole runs: ``ainvoke`` of a ``create_agent``
agent whose scripted model (no network) asks for ``STEPS`` tool calls, one at a time, then
answers; agents built once -- bare, with a pass-through middleware (what LangChain charges for
any wrap hook), with ``CorralMiddleware()`` and with a supervisor of three guardrails -- one run
of each in turn (after a warm-up), so drift on a shared machine weighs on each alike. A run
with no tool call is one model call; a step (one model call and one tool call) is the p50 of
the long runs less the p50 of the one-call runs, over ``STEPS``.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any

from langchain.agents import create_agent
from langchain.agents.middleware import (
    AgentMiddleware,
    InputAgentState,
    ModelRequest,
    ModelResponse,
    ToolCallRequest,
)
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.tools import tool
from tests.support.langchain_models import ScriptedChatModel, call_tool

from bench._harness import row, time_async
from corral.guard import AgentGroup, GuardrailResult, Supervisor
from corral.integrations.langchain import CorralMiddleware

HOOK_CALLS = 5_000
STEPS = 10
WARMUP = 20
RUNS = 200  # of each agent and length, taken in turn
BUILDS = 200
BARE = "bare LangChain agent"
NOOP = "+ a pass-through middleware"


class Allow:
    """An allowing guardrail that reads the action, as a real rule would."""

    def __init__(self, name: str, word: str) -> None:
        self.name = name
        self.word = word

    def check(self, agent_id: str, action: str, context: Mapping[str, object]) -> GuardrailResult:
        if self.word in action:
            return GuardrailResult.blocked(f"no {self.word}")
        return GuardrailResult.allow()


@tool
async def lookup(query: str) -> str:
    """Look something up."""
    return f"3 documents about {query}"


def script(steps: int) -> Any:
    """``steps`` tool calls, one a reply, then an answer (read off the conversation, so one
    model serves every run)."""

    def reply(n: int, messages: Sequence[BaseMessage]) -> AIMessage:
        done = sum(isinstance(m, ToolMessage) for m in messages)
        if done < steps:
            return call_tool("lookup", {"query": f"q{done}"}, f"call_{done}")
        return AIMessage(content="done")

    return reply


class PassThrough(AgentMiddleware[Any, Any, Any]):
    """A middleware that only calls on: what LangChain charges for any wrap hook."""

    async def awrap_model_call(self, request: Any, handler: Any) -> Any:
        return await handler(request)

    async def awrap_tool_call(self, request: Any, handler: Any) -> Any:
        return await handler(request)


def three_rules() -> Supervisor:
    return Supervisor(
        AgentGroup("bench"),
        [Allow("no-drop", "drop table"), Allow("no-rm", "rm -rf"), Allow("no-ssh", "ssh ")],
    )


def hook_figures() -> dict[str, tuple[float, float]]:
    """Seconds per call of each hook and of its handler alone."""
    model = ScriptedChatModel(script=script(0))
    usage = {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15}
    reply = ModelResponse(result=[AIMessage(content="done", usage_metadata=usage)])
    request = ModelRequest(model=model, messages=[])
    answer = ToolMessage(content="3 documents", name="lookup", tool_call_id="call_1")
    call = ToolCallRequest(
        tool_call={"name": "lookup", "args": {"query": "bees"}, "id": "call_1"},
        tool=lookup,
        state={},
        runtime=None,  # type: ignore[arg-type]  # unused by the hooks
    )

    async def model_handler(request: Any) -> ModelResponse[Any]:
        return reply

    async def tool_handler(request: Any) -> ToolMessage:
        return answer

    plain, guarded = CorralMiddleware(), CorralMiddleware(supervisor=three_rules())
    number = HOOK_CALLS
    bare_model = time_async(lambda: model_handler(request), number=number)
    bare_tool = time_async(lambda: tool_handler(call), number=number)
    return {
        "model call: `awrap_model_call`": (
            bare_model,
            time_async(lambda: plain.awrap_model_call(request, model_handler), number=number),
        ),
        "tool call: `awrap_tool_call`, no supervisor": (
            bare_tool,
            time_async(lambda: plain.awrap_tool_call(call, tool_handler), number=number),
        ),
        "tool call: `awrap_tool_call`, 3 guardrails": (
            bare_tool,
            time_async(lambda: guarded.awrap_tool_call(call, tool_handler), number=number),
        ),
    }


def middlewares() -> dict[str, list[AgentMiddleware[Any, Any, Any]]]:
    three = three_rules()
    return {
        BARE: [],
        NOOP: [PassThrough()],
        "+ CorralMiddleware()": [CorralMiddleware()],
        "+ CorralMiddleware(supervisor=3 rules)": [CorralMiddleware(supervisor=three)],
    }


def p50(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


async def figures() -> tuple[dict[str, dict[int, list[float]]], list[float], list[float]]:
    prompt: InputAgentState = {"messages": [{"role": "user", "content": "go"}]}
    agents = {
        (label, steps): create_agent(
            ScriptedChatModel(script=script(steps)), tools=[lookup], middleware=layers
        )
        for steps in (0, STEPS)
        for label, layers in middlewares().items()
    }
    for agent in agents.values():  # each answers as it should before it is timed
        result = await agent.ainvoke(prompt)
        assert result["messages"][-1].text == "done"
        for _ in range(WARMUP):
            await agent.ainvoke(prompt)
    samples: dict[str, dict[int, list[float]]] = {}
    clock = time.perf_counter
    for _ in range(RUNS):
        for (label, steps), agent in agents.items():
            started = clock()
            await agent.ainvoke(prompt)
            samples.setdefault(label, {}).setdefault(steps, []).append(clock() - started)
    # what building the agent costs, for "one agent per task"
    model = ScriptedChatModel(script=script(0))
    builds: dict[str, list[float]] = {"bare": [], "corral": []}
    for _ in range(BUILDS):
        started = clock()
        create_agent(model, tools=[lookup])
        builds["bare"].append(clock() - started)
        started = clock()
        create_agent(model, tools=[lookup], middleware=[CorralMiddleware()])
        builds["corral"].append(clock() - started)
    return samples, builds["bare"], builds["corral"]


def main() -> None:
    hooks = hook_figures()
    print(f"The hooks alone, handler answering at once ({HOOK_CALLS:,} calls, median of runs):\n")
    print(row("hook", "handler alone", "through corral", "corral adds"))
    print(row("---", "---:", "---:", "---:"))
    for label, (bare, corral) in hooks.items():
        cells = (f"{bare * 1e6:,.1f} us", f"{corral * 1e6:,.1f} us")
        print(row(label, *cells, f"{(corral - bare) * 1e6:+,.1f} us"))

    samples, bare_builds, corral_builds = asyncio.run(figures())
    base = samples[BARE]

    def step(runs: dict[int, list[float]]) -> float:
        return (p50(runs[STEPS]) - p50(runs[0])) / STEPS

    print(f"\n`ainvoke` of a `create_agent` agent, scripted model, {RUNS} runs each (p50):\n")
    long = f"{STEPS + 1} model + {STEPS} tool calls"
    head = ("1 model call", long, "a step (model + tool call)")
    print(row("agent", *head, "1 model call over bare", "a step over bare"))
    print(row("---", "---:", "---:", "---:", "---:", "---:"))
    for label, runs in samples.items():
        line = [f"{p50(runs[0]):,.0f} us", f"{p50(runs[STEPS]):,.0f} us", f"{step(runs):,.0f} us"]
        if label == BARE:
            line += ["", ""]
        else:
            line.append(f"{p50(runs[0]) - p50(base[0]):+,.0f} us")
            line.append(f"{step(runs) - step(base):+,.0f} us")
        print(row(label, *line))
    print(
        "\n(LangChain runs every async wrap hook through langsmith's `traceable`, which makes "
        "two thread hops per call even with tracing off: the pass-through row)"
    )
    print(
        f"\n`create_agent(...)` itself, p50 of {BUILDS}: bare {p50(bare_builds):,.0f} us, "
        f"with `CorralMiddleware()` (made and added) {p50(corral_builds):,.0f} us"
    )


if __name__ == "__main__":
    main()
