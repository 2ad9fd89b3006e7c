"""What corral adds to an OpenAI Agents SDK run: the adapter's overhead per model call and per
tool call, against the bare SDK with its own test model (``agents.testing.ScriptedModel``).

Run with ``.venv/bin/python -m bench bench_integration_openai_agents``.

Two views, p50 in microseconds, bare and corral measured in the same process, one sample of
each in turn (after a warm-up), so that drift on a shared machine weighs on both alike:

- whole runs (``Runner.run`` against ``CorralRunner.run``) of 0 and of 10 rounds (a round is
  one model call asking for a tool, then that tool call), each run ending with one more model
  call that answers. The overhead of a round is the difference of the two runs' overheads
  over 10; what is left at 0 rounds is the per-run cost (a runner, the agent's clone, the run
  raced against its cancellation) plus one model call.
- one call alone: ``SupervisedModel.get_response`` against the scripted model's own, and
  corral's tool guardrail on its own (the whole of what a tool call pays, besides the SDK
  keeping the guardrail's verdict).

corral's side: a supervisor with three rules (none matching), a budget in tokens, dollars and
time, and a price for the model, so every check and every sum is made.
"""

from __future__ import annotations

import asyncio
import functools
import statistics
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from agents import (
    Agent,
    FunctionTool,
    ModelSettings,
    ModelTracing,
    RunConfig,
    Runner,
    ToolInputGuardrailData,
    Usage,
    function_tool,
    set_tracing_disabled,
)
from agents.testing import ScriptedModel, assistant_message, function_call
from agents.tool_context import ToolContext

from bench._harness import row
from corral.guard import AgentGroup, GuardrailResult, Supervisor
from corral.integrations.openai_agents import CorralRunner
from corral.kernel import ExecutionBudget
from corral.runtime import ModelPrice

ROUNDS = 10
WARMUP = 30
RUNS = 300  # of each kind of run, taken in turn
CALLS = 3_000  # of each single call, taken in turn
USAGE = Usage(requests=1, input_tokens=200, output_tokens=40, total_tokens=240)
NAME = "bench-model"


class Refuse:
    """Blocks actions containing a pattern (none of the benchmark's do)."""

    def __init__(self, pattern: str) -> None:
        self.name = f"refuse-{pattern}"
        self.pattern = pattern

    def check(self, agent_id: str, action: str, context: Mapping[str, object]) -> GuardrailResult:
        if self.pattern in action:
            return GuardrailResult.blocked(f"{self.pattern} is refused")
        return GuardrailResult.allow()


@function_tool
def search(query: str) -> str:
    """Search the knowledge base."""
    return f"3 documents about {query}"


def runner() -> CorralRunner:
    return CorralRunner(
        agent_id="bench",
        supervisor=Supervisor(
            AgentGroup("bench"), [Refuse(p) for p in ("drop", "rm -rf", "deploy")]
        ),
        budget=ExecutionBudget(max_tokens=10**9, max_cost_usd=10.0**6, deadline_s=3600),
        prices={NAME: ModelPrice(2.0, 8.0)},
    )


def scripted(rounds: int) -> ScriptedModel:
    steps: list[Any] = [
        [function_call("search", {"query": f"q{n}"}, call_id=f"c{n}")] for n in range(rounds)
    ]
    steps.append([assistant_message("done")])
    return ScriptedModel(steps, default_usage=USAGE)


CONFIG = RunConfig(tracing_disabled=True)


async def bare_run(rounds: int) -> None:
    agent = Agent(name="bench", model=scripted(rounds), tools=[search])
    await Runner.run(agent, "go", run_config=CONFIG, max_turns=rounds + 2)


async def corral_run(rounds: int) -> None:
    corral = runner()
    agent = Agent(name="bench", model=corral.model(scripted(rounds), name=NAME), tools=[search])
    await corral.run(agent, "go", run_config=CONFIG, max_turns=rounds + 2)


async def interleaved(
    cases: dict[str, Callable[[], Awaitable[object]]], samples: int, warmup: int
) -> dict[str, float]:
    """p50 seconds of each case, one sample of each in turn."""
    for call in cases.values():
        for _ in range(warmup):
            await call()
    times: dict[str, list[float]] = {label: [] for label in cases}
    clock = time.perf_counter
    for _ in range(samples):
        for label, call in cases.items():
            started = clock()
            await call()
            times[label].append(clock() - started)
    return {label: statistics.median(values) for label, values in times.items()}


async def whole_runs() -> dict[str, float]:
    cases: dict[str, Callable[[], Awaitable[object]]] = {}
    for rounds in (0, ROUNDS):
        cases[f"bare {rounds}"] = functools.partial(bare_run, rounds)
        cases[f"corral {rounds}"] = functools.partial(corral_run, rounds)
    return await interleaved(cases, RUNS, WARMUP)


async def single_calls() -> dict[str, float]:
    bare_model = ScriptedModel([], default_usage=USAGE)
    corral = runner()
    inner = ScriptedModel([], default_usage=USAGE)
    supervised = corral.model(inner, name=NAME)
    answer = [assistant_message("done")]
    settings = ModelSettings()

    async def ask(model: Any, queue: ScriptedModel) -> None:
        queue.enqueue(answer)  # one step per call
        await model.get_response(
            None, "go", settings, [], None, [], ModelTracing.DISABLED,
            previous_response_id=None, conversation_id=None, prompt=None,
        )  # fmt: skip

    guarded = corral.guarded([search])[0]
    assert isinstance(guarded, FunctionTool)
    context = ToolContext(
        context=None, tool_name="search", tool_call_id="c1", tool_arguments='{"query": "corral"}'
    )
    data = ToolInputGuardrailData(context=context, agent=Agent(name="bench"))

    async def check() -> None:
        verdict = await corral.guardrail.run(data)
        assert verdict.behavior["type"] == "allow"

    cases: dict[str, Callable[[], Awaitable[object]]] = {
        "model bare": lambda: ask(bare_model, bare_model),
        "model corral": lambda: ask(supervised, inner),
        "tool check": check,
    }
    return await interleaved(cases, CALLS, WARMUP * 10)


def us(seconds: float) -> str:
    return f"{seconds * 1e6:,.0f} us"


def main() -> None:
    set_tracing_disabled(True)
    runs = asyncio.run(whole_runs())
    calls = asyncio.run(single_calls())
    print(
        f"Whole runs, p50 of {RUNS} each (a round: one model call asking for a tool, the call):\n"
    )
    print(row("run", "bare SDK", "with corral", "overhead"))
    print(row("---", "---:", "---:", "---:"))
    over = {}
    for rounds in (0, ROUNDS):
        bare, with_corral = runs[f"bare {rounds}"], runs[f"corral {rounds}"]
        over[rounds] = with_corral - bare
        label = f"{rounds} rounds + 1 answer ({rounds + 1} model calls, {rounds} tool calls)"
        print(row(label, us(bare), us(with_corral), f"{over[rounds] * 1e6:+,.0f} us"))
    per_round = (over[ROUNDS] - over[0]) / ROUNDS
    print(f"\noverhead per round (one model call + one tool call): {per_round * 1e6:+,.0f} us")
    print(
        f"overhead per run (runner, agent clone, race) + one model call: {over[0] * 1e6:+,.0f} us"
    )
    print(f"\nOne call alone, p50 of {CALLS:,} each:\n")
    print(row("call", "bare SDK", "with corral", "overhead"))
    print(row("---", "---:", "---:", "---:"))
    model_over = calls["model corral"] - calls["model bare"]
    print(
        row(
            "model call (`get_response`, ScriptedModel)",
            us(calls["model bare"]),
            us(calls["model corral"]),
            f"{model_over * 1e6:+,.0f} us",
        )
    )
    check = calls["tool check"]
    print(
        row(
            "tool call (corral's input guardrail, 3 rules)",
            "none",
            us(check),
            f"+{check * 1e6:,.0f} us",
        )
    )


if __name__ == "__main__":
    main()
