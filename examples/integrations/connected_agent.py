"""A Pydantic AI agent in its own process, under the daemon's oversight (docs/integrations.md,
"Connected to the daemon").

The process registers itself with ``corral serve`` as an agent of harness ``external`` and runs
each prompt as one of its turns: the daemon's rules check every tool call (its ``refund``
rule asks a person, in ``corral decisions`` or the console, and the call waits for the
answer), its budget bounds the turn, the turn and its usage show in ``corral agents``, and
``corral stop support`` stops the run in flight.

    CORRAL_URL=http://127.0.0.1:4600 CORRAL_TOKEN=... \\
        .venv/bin/python examples/integrations/connected_agent.py "refund order 7"

``stand_in()`` plays the model (no network, no API key): it asks to refund the order the
prompt names, then answers with what the tool said. Put
``"openai:gpt-4o"`` in its place for a real one.
"""

from __future__ import annotations

import asyncio
import re
import sys

from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models import Model
from pydantic_ai.models.function import AgentInfo, FunctionModel

from corral.client import AgentHandle, connect
from corral.integrations import Oversight
from corral.integrations.pydantic_ai import CorralCapability
from corral.runtime import BudgetUsage, ModelPrice

PRICES = {"gpt-4o": ModelPrice(input_per_mtok_usd=2.50, output_per_mtok_usd=10.00)}
GUARDRAILS = [
    {"match": "refund", "verdict": "ask", "reason": "refunds need a person", "timeoutS": 600}
]

refunded: list[int] = []  # stands in for the payment system


async def refund(order_id: int) -> str:
    """Refund an order."""
    refunded.append(order_id)
    return f"order {order_id} refunded"


# --- the stand-in model ---------------------------------------------------------------------


def _script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Refund the order the prompt names last (``refund order 7``), then answer with what the
    tool said: its result, or the refusal the model was given in its place."""
    parts = [part for message in messages for part in message.parts]
    said = [part for part in parts if isinstance(part, ToolReturnPart)]
    if said:
        return ModelResponse(parts=[TextPart(f"the tool said: {said[-1].content}")])
    prompt = " ".join(str(p.content) for p in parts if isinstance(p, UserPromptPart))
    order_id = int(re.findall(r"\d+", prompt)[-1])
    return ModelResponse(parts=[ToolCallPart("refund", {"order_id": order_id})])


def stand_in() -> FunctionModel:
    """A scripted model (Pydantic AI's ``FunctionModel``) answering as gpt-4o would be asked."""
    return FunctionModel(_script, model_name="gpt-4o")


# --- the turn, and the process (docs/integrations.md shows these) ------------------------


async def run_turn(handle: AgentHandle, prompt: str, model: Model | str) -> tuple[str, BudgetUsage]:
    async with handle.turn(prompt) as turn:  # refused when the agent is held or spent
        corral = CorralCapability(Oversight.connected(handle, budget=turn.remaining, prices=PRICES))
        agent = Agent(model, tools=[refund], capabilities=[corral])
        try:
            result = await agent.run(turn.text)
        finally:  # what the daemon counts against the agent's budget, also for a stop
            spent = corral.usage()
            turn.record(tokens=spent.tokens, cost_usd=spent.cost_usd)
        turn.output = result.output
    return result.output, spent


async def main(prompt: str) -> None:
    async with connect() as conn:  # $CORRAL_URL, $CORRAL_TOKEN
        handle = await conn.register("support", guardrails=GUARDRAILS, budget={"maxCostUsd": 1.0})
        output, spent = await run_turn(handle, prompt, stand_in())
        print(output)
        print(f"spent: {spent.tokens} tokens, ${spent.cost_usd:.6f}")


if __name__ == "__main__":
    asyncio.run(main(" ".join(sys.argv[1:]) or "refund order 7"))
