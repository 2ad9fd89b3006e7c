"""corral inside a Pydantic AI agent (docs/integrations.md, "Pydantic AI").

Run it with ``.venv/bin/python examples/integrations/pydantic_ai_agent.py``: Pydantic AI's
``TestModel`` plays the model (it calls every tool once, then answers with what they
returned), so it needs no network and no API key. Put ``"openai:gpt-4o"`` (and its price)
in its place for a real one.

``turn`` runs the same agent as one turn of a daemon agent, through the python harness::

    {"name": "support", "harness": "python",
     "function": "examples.integrations.pydantic_ai_agent:turn", "prompt": "refund order 7"}
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic_ai import Agent
from pydantic_ai.models.test import TestModel

from corral.guard import AgentGroup, ApprovalRequest, HumanApproval, Supervisor
from corral.integrations.pydantic_ai import CorralCapability
from corral.kernel import ExecutionBudget
from corral.runtime import ModelPrice


def lookup_order(order_id: int) -> str:
    """Find an order."""
    return f"order {order_id}: 2 items, paid"


def refund(order_id: int) -> str:
    """Refund an order."""
    return f"order {order_id} refunded"


def ask_a_person(request: ApprovalRequest) -> None:
    """Your pager, chat or console goes here; this person says no."""
    print(f"asked a person: may {request.agent_id} {request.action}? no")
    request.deny()


def main() -> None:
    corral = CorralCapability(
        agent_id="support-bot",
        supervisor=Supervisor(AgentGroup("support"), [HumanApproval({"refund"}, ask_a_person)]),
        budget=ExecutionBudget(max_cost_usd=0.50, max_turns=20, deadline_s=120),
        prices={"test": ModelPrice(input_per_mtok_usd=2.5, output_per_mtok_usd=10.0)},
    )
    agent = Agent(TestModel(), tools=[lookup_order, refund], capabilities=[corral])
    result = agent.run_sync("refund order 7")
    print(result.output)
    print(corral.usage())


# --- the same agent as a daemon agent's turn (the python harness) ----------------------------

if TYPE_CHECKING:
    from corral.daemon import TurnContext


async def turn(prompt: str, context: TurnContext) -> dict[str, object]:
    """One turn: the agent under corral, its usage reported to the daemon (``tokens``,
    ``costUsd``), also when a budget, the deadline or a cancellation ends it."""
    from corral.daemon import TurnFailedError
    from corral.kernel import RunError

    corral = CorralCapability(
        agent_id=context.agent_id,
        # The seam for the daemon's approvals: corral.connect(url, token).agent(agent_id)
        # in place of this Supervisor lets a person answer from `corral decisions`.
        supervisor=Supervisor(AgentGroup("support"), [HumanApproval({"refund"}, ask_a_person)]),
        budget=ExecutionBudget(max_cost_usd=0.50, max_turns=20, deadline_s=120),
        prices={"test": ModelPrice(input_per_mtok_usd=2.5, output_per_mtok_usd=10.0)},
    )
    agent = Agent(TestModel(), tools=[lookup_order, refund], capabilities=[corral])
    try:
        result = await agent.run(prompt)
    except RunError as exc:
        spent = corral.usage()
        usage = {"tokens": spent.tokens, "costUsd": spent.cost_usd}
        raise TurnFailedError(f"{exc.code}: {exc.message}", usage=usage) from exc
    spent = corral.usage()
    return {"output": result.output, "tokens": spent.tokens, "costUsd": spent.cost_usd}


if __name__ == "__main__":
    main()
