"""corral inside an OpenAI Agents SDK agent: the ten lines of docs/integrations.md.

Run it with ``.venv/bin/python examples/integrations/openai_agents_agent.py``. It needs no
network and no API key: the SDK's own test model (``agents.testing.ScriptedModel``) stands in
for gpt-4.1-mini, and the "person" asked before rows are deleted is a function that says no.
Everything else -- the SDK's runner, its tool guardrails, corral's supervisor, budget and
deadline -- is the real thing.

As a daemon agent (the ``python`` harness), ``turn`` runs one turn::

    {"name": "ops", "harness": "python",
     "function": "examples.integrations.openai_agents_agent:turn"}

with the scripted model, unless the spec's ``env`` names a real one (``CORRAL_EXAMPLE_MODEL``:
``gpt-4.1-mini``, with ``OPENAI_API_KEY`` set). Its answer carries the turn's tokens and
dollars, which the daemon counts. The person here is the same function that says no; an
approval answered from ``corral decisions`` or the console is the ``supervisor`` argument's
seam: a daemon agent handle (``corral.connect(url, token).agent(agent_id)``) in its place.
"""

from __future__ import annotations

import asyncio
from typing import Any

from agents import Agent, Model, RunResult, Usage, function_tool, set_tracing_disabled
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call

# --- corral: imports ---
from corral.guard import AgentGroup, ApprovalRequest, HumanApproval, Supervisor
from corral.integrations.openai_agents import CorralRunner
from corral.kernel import ExecutionBudget
from corral.runtime import ModelPrice

# --- end ---


@function_tool
def delete_rows(table: str) -> str:
    """Delete every row of a table."""
    return f"deleted every row of {table}"


def ops_agent(model: str | Model = "gpt-4.1-mini") -> Agent[Any]:
    """The agent as written for the SDK, with no corral in it."""
    return Agent(
        name="ops",
        instructions="You keep the database tidy. Say what you did, or why you could not.",
        model=model,
        tools=[delete_rows],
    )


class StandIn(ScriptedModel):
    """The SDK's scripted test model, priced as gpt-4.1-mini: it asks to delete the rows of
    the table its prompt names last, then says what the tool answered."""

    model = "gpt-4.1-mini"

    def __init__(self) -> None:
        usage = Usage(requests=1, input_tokens=120, output_tokens=30, total_tokens=150)
        super().__init__([ModelStep.respond(self.ask), ModelStep.respond(self.report)])
        self.set_default_usage(usage)

    @staticmethod
    def ask(call: ModelCall) -> list[Any]:
        words = str(_prompt(call.input)).replace(".", " ").split()
        return [function_call("delete_rows", {"table": words[-1]}, call_id="call_1")]

    @staticmethod
    def report(call: ModelCall) -> list[Any]:
        outputs = [i for i in call.input if isinstance(i, dict) and "output" in i]
        return [assistant_message(f"I could not do it: {outputs[-1]['output']}")]


def _prompt(items: Any) -> Any:
    return items if isinstance(items, str) else items[0]["content"]


def ask_a_person(request: ApprovalRequest) -> None:
    """The person asked before rows are deleted: here, a function that always says no (a
    real one answers later, from a chat message or a page: ``request.approve()``)."""
    print(f"asked a person: may {request.agent_id} run {request.action}? -> no")
    request.deny()


async def supervised_run(agent: Agent[Any], prompt: str) -> tuple[RunResult, CorralRunner]:
    """``Runner.run(agent, prompt)`` with corral: the ten lines of docs/integrations.md."""
    # --- corral: the run ---
    approval = HumanApproval({"delete_rows"}, ask_a_person, timeout_s=300)  # no answer: no
    corral = CorralRunner(
        agent_id="ops",
        supervisor=Supervisor(AgentGroup("ops"), [approval]),
        budget=ExecutionBudget(max_cost_usd=0.50, deadline_s=120),
        prices={"gpt-4.1-mini": ModelPrice(input_per_mtok_usd=0.40, output_per_mtok_usd=1.60)},
    )
    result = await corral.run(agent, prompt)  # instead of Runner.run(agent, prompt)
    # --- end ---
    return result, corral


async def main() -> None:
    set_tracing_disabled(True)  # offline: no API key to export traces with
    result, corral = await supervised_run(ops_agent(StandIn()), "empty the table test_accounts")
    print(f"agent: {result.final_output}")
    usage = corral.usage()
    print(f"spent: {usage.tokens} tokens, ${usage.cost_usd:.6f}, {usage.turns} model calls")


async def turn(prompt: str, context: Any) -> dict[str, Any]:
    """One turn of a daemon agent (the ``python`` harness): the agent above, corral inside;
    the answer carries the turn's tokens and dollars."""
    named = context.env.get("CORRAL_EXAMPLE_MODEL")
    if named is None:
        set_tracing_disabled(True)
    result, corral = await supervised_run(ops_agent(named or StandIn()), prompt)
    usage = corral.usage()
    return {"output": str(result.final_output), "tokens": usage.tokens, "costUsd": usage.cost_usd}


if __name__ == "__main__":
    asyncio.run(main())
