"""``Supervisor.check_action`` with three allowing guardrails against calling them directly.

Goal: check_action costs at most 2x the three direct calls. Run with
``.venv/bin/python -m bench bench_guard``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from bench._harness import fmt_ns, row, time_async
from corral.guard import AgentGroup, GuardrailResult, Supervisor

NUMBER = 20_000
REPEATS = 9


class CostCap:
    """Blocks actions whose context carries a cost above a cap."""

    name = "cost-cap"

    def check(self, agent_id: str, action: str, context: Mapping[str, object]) -> GuardrailResult:
        cost = context.get("cost")
        if isinstance(cost, int | float) and cost > 100:
            return GuardrailResult.blocked(f"cost {cost} is over the cap of 100")
        return GuardrailResult.allow()


class DenyList:
    """Blocks a fixed set of actions."""

    name = "deny-list"

    def __init__(self) -> None:
        self.denied = frozenset({"drop-database", "rm-rf"})

    def check(self, agent_id: str, action: str, context: Mapping[str, object]) -> GuardrailResult:
        if action in self.denied:
            return GuardrailResult.blocked(f"action {action!r} is denied")
        return GuardrailResult.allow()


class AgentAllowList:
    """Only known agents may act."""

    name = "agent-allow-list"

    def __init__(self, agents: frozenset[str]) -> None:
        self.agents = agents

    def check(self, agent_id: str, action: str, context: Mapping[str, object]) -> GuardrailResult:
        if agent_id not in self.agents:
            return GuardrailResult.blocked(f"agent {agent_id!r} is not allowed")
        return GuardrailResult.allow()


def main() -> None:
    guardrails = (CostCap(), DenyList(), AgentAllowList(frozenset({"worker-1", "worker-2"})))
    first, second, third = guardrails
    supervisor = Supervisor(AgentGroup("bench", {"worker-1": object()}), guardrails)
    context: dict[str, object] = {"target": "staging", "cost": 40}

    async def direct() -> GuardrailResult:
        first.check("worker-1", "deploy", context)
        second.check("worker-1", "deploy", context)
        return third.check("worker-1", "deploy", context)

    async def via_supervisor() -> GuardrailResult:
        return await supervisor.check_action("worker-1", "deploy", context)

    # Both sides must agree before their speed means anything.
    assert asyncio.run(via_supervisor()).allowed
    assert asyncio.run(direct()).allowed

    t_direct = time_async(direct, number=NUMBER, repeats=REPEATS)
    t_supervisor = time_async(via_supervisor, number=NUMBER, repeats=REPEATS)
    ratio = t_supervisor / t_direct
    print(f"{len(guardrails)} allowing guardrails; median of {REPEATS} runs of {NUMBER:,} calls.\n")
    print(row("path", "per call", "ratio to direct"))
    print(row("---", "---:", "---:"))
    print(row("3 guardrails called directly", fmt_ns(t_direct), "1.00x"))
    print(row("Supervisor.check_action", fmt_ns(t_supervisor), f"{ratio:.2f}x"))
    print(f"\nGoal: at most 2.00x; {'met' if ratio <= 2.0 else 'NOT met'} ({ratio:.2f}x).")


if __name__ == "__main__":
    main()
