"""A tour of corral's foundation: budgets, deadlines and middleware around an agent loop.

Run it with ``make run`` (or ``.venv/bin/python examples/tour.py``). Every model reply is
scripted, so the tour needs no network and no API key; everything else -- the agent loop,
the middleware pipeline, the budget tracker, the cancellation token, the guardrails -- is
the real thing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence

from corral.agent import Agent, AgentRun
from corral.guard import AgentGroup, GuardrailResult, Supervisor
from corral.kernel import (
    BudgetExhaustedError,
    ChatMessage,
    CorralError,
    DeadlineExceededError,
    ExecutionBudget,
)
from corral.runtime import Audit, AuditEvent, ChatResult, ScriptedClient, ToolGuard, ToolSpec

text = ScriptedClient.text_reply
call = ScriptedClient.tool_call_reply


def say(line: str = "") -> None:
    print(line, flush=True)


def show_event(event: AuditEvent) -> None:
    """An audit sink: one line per model or tool call."""
    if event.stage.value == "turn":
        return
    what = f"tool {event.tool_name}" if event.tool_name else "model call"
    outcome = "ok" if event.outcome == "ok" else f"error ({event.error_code})"
    say(f"   [audit] {what:<22} {outcome:<28} {event.duration_s * 1000:7.1f} ms")


def search(query: str) -> str:
    """Search the knowledge base."""
    return f"3 documents about {query!r}"


async def runaway_loop() -> None:
    say("1. A token budget stops a runaway loop")
    say("   The model keeps asking for one more search; each reply costs 400 tokens.")
    client = ScriptedClient(
        [
            call("search", {"query": f"attempt {i}"}, prompt_tokens=350, completion_tokens=50)
            for i in range(1, 10)
        ]
    )
    agent = Agent(
        client,
        agent_id="researcher",
        tools=[search],
        middleware=[Audit(show_event)],
        budget=ExecutionBudget(max_tokens=1_000),
    )
    try:
        await agent.run("find everything about corral")
    except BudgetExhaustedError as err:
        say(f"   stopped: {err.code}: {err.message}")
        say(f"   the model was called {len(client.requests)} times, not 9")


async def slow_model() -> None:
    say()
    say("2. A deadline cancels a call that hangs")
    say("   The model takes 10 s to answer; the agent has a 0.3 s deadline.")

    async def hangs(
        messages: Sequence[ChatMessage], tools: Sequence[ToolSpec] | None
    ) -> ChatResult:
        await asyncio.sleep(10)
        return text("too late")

    agent = Agent(ScriptedClient([hangs]), budget=ExecutionBudget(deadline_s=0.3))
    started = time.monotonic()
    try:
        await agent.run("summarise the quarter")
    except DeadlineExceededError as err:
        elapsed = time.monotonic() - started
        say(f"   stopped after {elapsed:.2f} s: {err.code}: {err.message}")


class NoDeletes:
    """A guardrail: deleting anything needs a person."""

    name = "no-deletes"

    def check(self, agent_id: str, action: str, context: Mapping[str, object]) -> GuardrailResult:
        if action.startswith("delete"):
            return GuardrailResult.blocked("deleting data needs a person's approval")
        return GuardrailResult.allow()


async def guarded_tool() -> AgentRun | None:
    say()
    say("3. A guardrail stops a tool call before it runs")
    deleted: list[str] = []

    def delete_table(name: str) -> str:
        """Drop a table."""
        deleted.append(name)
        return f"dropped {name}"

    supervisor = Supervisor(AgentGroup("ops"), [NoDeletes()])
    client = ScriptedClient(
        [
            call("delete_table", {"name": "customers"}),
            text("I was not allowed to drop the table; I have asked a person instead."),
        ]
    )
    agent = Agent(
        client,
        agent_id="janitor",
        tools=[delete_table],
        middleware=[Audit(show_event), ToolGuard(supervisor.check_action)],
    )
    try:
        run = await agent.run("clean up the old customers table")
    except CorralError as err:  # not expected: the refusal goes back to the model
        say(f"   unexpected: {err}")
        return None
    outcome = run.tool_calls[0]
    say(f"   tool call: {outcome.tool}({dict(outcome.arguments)}) -> {outcome.status}")
    say(f"   the model was told: {outcome.output}")
    say(f"   the table was dropped: {bool(deleted)}")
    say(f"   final answer: {run.output}")
    return run


async def main() -> None:
    say("corral tour: an agent loop under supervision")
    say("=" * 46)
    await runaway_loop()
    await slow_model()
    await guarded_tool()
    say()
    say("Next: `make test` runs the whole suite; docs/ explains each part.")


if __name__ == "__main__":
    asyncio.run(main())
