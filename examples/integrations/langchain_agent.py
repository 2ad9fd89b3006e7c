"""corral inside a LangChain agent (LangChain v1 ``create_agent``): a person's approval before a
risky tool call, a budget in dollars and a deadline -- about ten lines in :func:`run`.

Run it with ``.venv/bin/python examples/integrations/langchain_agent.py``. The model is a
scripted stand-in (no network, no API key); put yours in its place, e.g.
``init_chat_model("openai:gpt-4o")``. The daemon's ``python`` harness can run :func:`turn`:
``{"harness": "python", "function": "langchain_agent:turn"}`` with this directory on the
daemon's ``PYTHONPATH``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool

from corral.guard import AgentGroup, ApprovalRequest, HumanApproval, Supervisor
from corral.integrations import ActionChecker
from corral.integrations.langchain import CorralMiddleware
from corral.kernel import CorralError, ExecutionBudget
from corral.runtime import BudgetUsage, ModelPrice


@tool
async def count_rows(table: str) -> str:
    """Count the rows of a table."""
    return f"{table} has 1204 rows"


@tool
async def delete_rows(table: str) -> str:
    """Delete every row of a table."""
    return f"deleted every row of {table}"


def ask_a_person(request: ApprovalRequest) -> None:
    """Where a person is asked (a chat message, a ticket, ``corral decisions``); this one
    says no."""
    print(f"a person is asked: {request.action} -> no")
    request.deny()


def approvals() -> Supervisor:
    """Deleting rows waits for a person, five minutes at most (no answer is a no)."""
    gate = HumanApproval({"delete_rows"}, ask_a_person, timeout_s=300)
    return Supervisor(AgentGroup("crew"), [gate])


# --- corral around the agent: the lines to copy ----------------------------------------------


async def run(
    model: BaseChatModel,
    prompt: str,
    supervisor: ActionChecker,  # a Supervisor, or a daemon's agent handle (corral.connect)
    budget: ExecutionBudget,
) -> tuple[str, BudgetUsage]:
    corral = CorralMiddleware(
        supervisor=supervisor,
        budget=budget,
        prices={"gpt-4o": ModelPrice(input_per_mtok_usd=2.50, output_per_mtok_usd=10.00)},
    )
    agent = create_agent(model, tools=[count_rows, delete_rows], middleware=[corral])
    result = await agent.ainvoke({"messages": [{"role": "user", "content": prompt}]})
    return result["messages"][-1].text, corral.oversight.usage()


# ---------------------------------------------------------------------------------------------


class StandInModel(BaseChatModel):
    """A scripted stand-in for a chat model: counts the rows, tries to delete them, then
    reports what its tools answered; 1,200 tokens in and 80 out a call, as ``gpt-4o``."""

    model_name: str = "gpt-4o"

    @property
    def _llm_type(self) -> str:
        return "stand-in"

    def bind_tools(self, tools: Any, **kwargs: Any) -> StandInModel:
        return self  # it knows its script

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        results = [m.text for m in messages if isinstance(m, ToolMessage)]
        steps = [("count_rows", {"table": "users"}), ("delete_rows", {"table": "users"})]
        if len(results) < len(steps):
            name, args = steps[len(results)]
            reply = AIMessage("", tool_calls=[{"name": name, "args": args, "id": f"call_{name}"}])
        else:
            reply = AIMessage("; ".join(results))
        reply.usage_metadata = {"input_tokens": 1200, "output_tokens": 80, "total_tokens": 1280}
        return ChatResult(generations=[ChatGeneration(message=reply)])


async def turn(prompt: str, context: Any) -> dict[str, Any]:
    """One turn for the daemon's ``python`` harness: the agent with corral inside, its answer
    and what it spent (``output``, ``tokens``, ``costUsd``)."""
    budget = ExecutionBudget(max_cost_usd=0.50, deadline_s=120)
    answer, usage = await run(StandInModel(), prompt, approvals(), budget)
    return {"output": answer, "tokens": usage.tokens, "costUsd": usage.cost_usd}


async def main() -> None:
    task = "Clean up the users table."
    budget = ExecutionBudget(max_cost_usd=0.50, deadline_s=120)
    answer, usage = await run(StandInModel(), task, approvals(), budget)
    print(f"answer: {answer}")
    print(f"spent: {usage.tokens} tokens, ${usage.cost_usd:.4f}, {usage.turns} model calls")
    # The same task on a budget of half a cent: the run ends at the call that went over.
    try:
        await run(StandInModel(), task, approvals(), ExecutionBudget(max_cost_usd=0.005))
    except CorralError as exc:
        print(f"stopped: {exc.code}: {exc.message}")


if __name__ == "__main__":
    asyncio.run(main())
