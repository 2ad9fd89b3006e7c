"""corral's LangChain middleware (``CorralMiddleware``) against the bare LangChain agent.

Goal (issue 15): the adapter's overhead per model call and per tool call against the bare
framework with its test model. Run with
``.venv/bin/python -m bench bench_integration_langchain``.

Each sample is one ``ainvoke`` of a ``create_agent`` agent whose scripted model (no network)
asks for ``STEPS`` tool calls, one at a time, then answers: ``STEPS + 1`` model calls and
``STEPS`` tool calls. Three agents, built once: bare, with ``CorralMiddleware()`` (the budget
tracker, cancellation and deadline checks, no supervisor) and with a supervisor of three
allowing guardrails; one run of each in turn (after a warm-up), so drift on a shared machine
weighs on each alike. The overhead per model call is the p50 difference of runs with no tool
call (one model call); the overhead per step (one model call and one tool call) is the p50
difference of the long runs over ``STEPS``; per tool call is a step's less a model call's.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any

from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware, InputAgentState
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.tools import tool
from tests.support.langchain_models import ScriptedChatModel, call_tool

from bench._harness import row
from corral.guard import AgentGroup, GuardrailResult, Supervisor
from corral.integrations.langchain import CorralMiddleware

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


def middlewares() -> dict[str, list[AgentMiddleware[Any, Any, Any]]]:
    three = Supervisor(
        AgentGroup("bench"),
        [Allow("no-drop", "drop table"), Allow("no-rm", "rm -rf"), Allow("no-ssh", "ssh ")],
    )
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
    samples, bare_builds, corral_builds = asyncio.run(figures())

    def over(label: str, than: str) -> tuple[float, float]:
        """Overhead of ``label`` over ``than``: per model call, per tool call (us)."""
        per_model = p50(samples[label][0]) - p50(samples[than][0])
        per_step = (p50(samples[label][STEPS]) - p50(samples[than][STEPS]) - per_model) / STEPS
        return per_model, per_step - per_model

    print(f"`ainvoke` of a `create_agent` agent, scripted model, {RUNS} runs each (p50):\n")
    long = f"{STEPS + 1} model + {STEPS} tool calls"
    print(
        row("agent", "1 model call", long, "per model call", "per tool call", "over pass-through")
    )
    print(row("---", "---:", "---:", "---:", "---:", "---:"))
    for label, runs in samples.items():
        cells = [f"{p50(runs[0]):,.0f} us", f"{p50(runs[STEPS]):,.0f} us"]
        if label == BARE:
            print(row(label, *cells, "", "", ""))
            continue
        model, tool_ = over(label, BARE)
        cells += [f"{model:+,.0f} us", f"{tool_:+,.0f} us"]
        if label == NOOP:
            cells.append("")
        else:
            model, tool_ = over(label, NOOP)
            cells.append(f"model {model:+,.0f} us, tool {tool_:+,.0f} us")
        print(row(label, *cells))
    print(
        "\n(per model call: the difference of the 1-call runs; per tool call: the difference of "
        f"the long runs, less {STEPS + 1} model calls', over {STEPS}; LangChain runs every async "
        "wrap hook through langsmith's `traceable`, two thread hops per call even with tracing "
        "off, which the pass-through row shows)"
    )
    print(
        f"\n`create_agent(...)` itself, p50 of {BUILDS}: bare {p50(bare_builds):,.0f} us, "
        f"with `CorralMiddleware()` (made and added) {p50(corral_builds):,.0f} us"
    )


if __name__ == "__main__":
    main()
