"""Oversight, the framework-neutral core every adapter translates its hooks onto."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import pytest

from corral.gateway import Gateway
from corral.guard import AgentGroup, GuardrailResult, Supervisor
from corral.integrations import Oversight
from corral.kernel import (
    BudgetExhaustedError,
    CancellationError,
    CostUnknownError,
    DeadlineExceededError,
    ExecutionBudget,
    InvalidArgumentError,
    ToolRefused,
    UsageError,
)
from corral.runtime import Cancellation, FakeClock, ModelPrice


class NoDeletes:
    name = "no-deletes"

    def check(self, agent_id: str, action: str, context: Any) -> GuardrailResult:
        if action.startswith("delete_rows"):
            return GuardrailResult.blocked("deleting rows needs a person")
        return GuardrailResult.allow()


def supervisor() -> Supervisor:
    return Supervisor(AgentGroup("crew"), [NoDeletes()])


async def test_a_refused_tool_does_not_run_and_an_allowed_one_does() -> None:
    oversight = Oversight(agent_id="a1", supervisor=supervisor())
    ran: list[str] = []

    async def tool() -> str:
        ran.append("x")
        return "done"

    with pytest.raises(ToolRefused, match="deleting rows needs a person"):
        await oversight.run_tool("delete_rows", {"table": "users"}, tool)
    assert ran == []
    assert await oversight.run_tool("read_rows", {"table": "users"}, tool) == "done"
    assert ran == ["x"]
    assert await oversight.check_tool("delete_rows", {}) == (
        "tool 'delete_rows' refused: deleting rows needs a person"
    )
    assert await oversight.check_tool("read_rows", {}) is None


async def test_the_action_text_is_the_one_corral_loop_uses() -> None:
    seen: list[tuple[str, str]] = []

    class Spy:
        name = "spy"

        def check(self, agent_id: str, action: str, context: Any) -> GuardrailResult:
            seen.append((agent_id, action))
            return GuardrailResult.allow()

    oversight = Oversight(agent_id="a1", supervisor=Supervisor(AgentGroup("g"), [Spy()]))
    assert await oversight.check_tool("lookup", {"b": 2, "a": "é"}) is None
    assert seen == [("a1", 'lookup {"a": "é", "b": 2}')]


async def test_tokens_dollars_and_turns_are_counted_and_stop_the_run() -> None:
    oversight = Oversight(
        budget=ExecutionBudget(max_tokens=100),
        prices={"m": ModelPrice(1.0, 2.0)},
    )
    oversight.before_model()
    oversight.record_model_call(model="m", input_tokens=30, output_tokens=20)
    usage = oversight.usage()
    assert (usage.tokens, usage.turns) == (50, 1)
    assert usage.cost_usd == pytest.approx((30 * 1.0 + 20 * 2.0) / 1e6)
    with pytest.raises(BudgetExhaustedError) as caught:
        oversight.record_model_call(model="m", input_tokens=40, output_tokens=20)
    assert (caught.value.limit, caught.value.used) == (100, 110)
    with pytest.raises(BudgetExhaustedError):
        oversight.before_model()


async def test_a_dollar_budget_without_a_price_stops_with_cost_unknown() -> None:
    oversight = Oversight(budget=ExecutionBudget(max_cost_usd=1.0))
    with pytest.raises(CostUnknownError, match="'mystery'"):
        oversight.record_model_call(model="mystery", input_tokens=5, output_tokens=5)
    assert oversight.usage().tokens == 10  # spent all the same
    # a cost the framework gives is used as is
    oversight.record_model_call(model="mystery", input_tokens=1, cost_usd=0.5)
    assert oversight.usage().cost_usd == 0.5


async def test_a_model_call_in_flight_is_abandoned_at_the_deadline() -> None:
    clock = FakeClock()
    oversight = Oversight(budget=ExecutionBudget(deadline_s=30), clock=clock)
    started = asyncio.Event()

    async def hangs() -> str:
        started.set()
        await asyncio.Event().wait()
        return "never"

    task = asyncio.ensure_future(oversight.run_model(hangs))
    await started.wait()
    clock.advance(30)
    with pytest.raises(DeadlineExceededError):
        await task
    with pytest.raises(DeadlineExceededError):
        oversight.before_model()


async def test_a_cancellation_stops_the_tool_in_flight_and_the_next_call() -> None:
    parent = Cancellation()
    oversight = Oversight(cancellation=parent)
    started = asyncio.Event()

    async def hangs() -> str:
        started.set()
        await asyncio.Event().wait()
        return "never"

    task = asyncio.ensure_future(oversight.run_tool("slow", {}, hangs))
    await started.wait()
    parent.cancel("operator said stop")
    with pytest.raises(CancellationError, match="operator said stop"):
        await task
    with pytest.raises(CancellationError):
        await oversight.run_model(lambda: asyncio.sleep(0))


async def test_a_failed_model_call_still_counts_a_turn() -> None:
    oversight = Oversight(budget=ExecutionBudget(max_turns=2))

    async def fails() -> None:
        raise ConnectionError("model down")

    for _ in range(2):
        with pytest.raises(ConnectionError):
            await oversight.run_model(fails)
    with pytest.raises(BudgetExhaustedError):
        await oversight.run_model(fails)


async def test_the_gateway_tool_answers_rows_and_refusals_as_text(tmp_path: Any) -> None:
    import sqlite3

    path = tmp_path / "shop.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, email TEXT)")
        db.execute("INSERT INTO users VALUES (1, 'ada@example.com')")
    gateway = await Gateway.connect(f"sqlite:///{path}")
    try:
        oversight = Oversight(agent_id="a1", gateway=gateway)
        [tool] = oversight.gateway_tools()
        assert tool.name == "db_query"
        assert tool.parameters["required"] == ["request"]
        rows = json.loads(await tool({"request": {"sql": "SELECT email FROM users"}}))
        assert rows["rows"] == [{"email": "ada@example.com"}]
        refused = json.loads(await tool({"request": {"sql": "SELECT emial FROM users"}}))
        assert refused["error"] == "unknown_column"
        assert "email" in json.dumps(refused["details"])
        bad = json.loads(await tool({"request": "SELECT 1"}))
        assert bad["error"] == "invalid_argument"
    finally:
        await gateway.close()


def test_bad_arguments_are_refused_up_front() -> None:
    with pytest.raises(InvalidArgumentError, match="supervisor"):
        Oversight(supervisor=object())  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="prices"):
        Oversight(prices={"m": 1.0})  # type: ignore[dict-item]
    with pytest.raises(InvalidArgumentError, match="agent_id"):
        Oversight(agent_id="")


def test_importing_the_package_imports_no_framework() -> None:
    import subprocess

    code = (
        "import sys, corral.integrations; "
        "print([m for m in ('pydantic_ai', 'agents', 'langchain', 'langgraph') "
        "if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_made_outside_an_event_loop_the_deadline_is_armed_by_the_first_call() -> None:
    # Frameworks' run_sync start their own loop after the agent (and its Oversight) is made.
    oversight = Oversight(budget=ExecutionBudget(deadline_s=0.05))

    async def hangs() -> str:
        await asyncio.Event().wait()
        return "never"

    async def run() -> None:
        with pytest.raises(DeadlineExceededError):
            await oversight.run_model(hangs)

    asyncio.run(run())


def test_one_oversight_runs_on_one_event_loop_after_another_with_its_deadline() -> None:
    # a script's asyncio.run twice: the deadline is armed again on the second loop
    oversight = Oversight(budget=ExecutionBudget(deadline_s=0.2))

    async def quick() -> None:
        await oversight.run_model(lambda: asyncio.sleep(0))

    async def hangs() -> None:
        async def forever() -> None:
            await asyncio.Event().wait()

        with pytest.raises(DeadlineExceededError):
            await oversight.run_model(forever)

    asyncio.run(quick())
    asyncio.run(hangs())  # abandoned at the deadline on this loop too


def test_without_an_event_loop_no_call_starts_past_the_deadline() -> None:
    oversight = Oversight(budget=ExecutionBudget(deadline_s=0))
    with pytest.raises(DeadlineExceededError):
        oversight.before_model()


class FakeHandle:
    """A daemon agent handle's shape (``corral.client.AgentHandle``): an id, a check that
    records what it was asked, and a cancellation read only where a loop runs."""

    def __init__(self, agent_id: str = "a_1f2e") -> None:
        self.id = agent_id
        self.asked: list[tuple[str, str]] = []
        self.reads = 0
        self._cancellation = Cancellation()

    @property
    def cancellation(self) -> Cancellation:
        self.reads += 1
        return self._cancellation

    async def check_action(
        self, agent_id: str, action: str, context: dict[str, object] | None = None
    ) -> GuardrailResult:
        self.asked.append((agent_id, action))
        if action.startswith("refund"):
            return GuardrailResult.blocked("denied by alice: not this one")
        return GuardrailResult.allow()


async def test_connected_checks_with_the_handle_as_its_agent_and_stops_with_it() -> None:
    handle = FakeHandle()
    oversight = Oversight.connected(handle, budget=ExecutionBudget(max_turns=5))
    assert (oversight.agent_id, oversight.supervisor, oversight.budget.max_turns) == (
        "a_1f2e",
        handle,
        5,
    )

    async def tool() -> str:
        return "ran"

    assert await oversight.run_tool("lookup", {"order_id": 7}, tool) == "ran"
    assert await oversight.check_tool("refund", {"order_id": 7}) == (
        "tool 'refund' refused: denied by alice: not this one"
    )
    assert handle.asked == [
        ("a_1f2e", 'lookup {"order_id": 7}'),
        ("a_1f2e", 'refund {"order_id": 7}'),
    ]
    handle.cancellation.cancel("agent a_1f2e was stopped by alice in the daemon")
    assert oversight.cancellation.is_cancelled
    with pytest.raises(CancellationError, match="stopped by alice"):
        await oversight.run_model(lambda: asyncio.sleep(0))


def test_connected_needs_a_running_loop_and_reads_nothing_before() -> None:
    handle = FakeHandle()
    with pytest.raises(UsageError, match="needs a running event loop"):
        Oversight.connected(handle)
    assert handle.reads == 0  # the handle's watch of the daemon was not started


async def test_connected_refuses_what_is_not_a_handle() -> None:
    with pytest.raises(InvalidArgumentError, match="a daemon agent handle"):
        Oversight.connected(supervisor())  # type: ignore[arg-type]
    handle = FakeHandle("")
    with pytest.raises(InvalidArgumentError, match=r"Oversight\.connected: agent\.id"):
        Oversight.connected(handle)
