import dataclasses
import json
import math

import pytest

from corral.kernel import (
    ExecutionBudget,
    HistoryRetention,
    InvalidArgumentError,
    Priority,
    SpawnBudget,
    Supervision,
)


def test_priority_and_retention_values_are_the_contract() -> None:
    assert [(p.name, int(p)) for p in Priority] == [
        ("BACKGROUND", 0),
        ("LOW", 1),
        ("NORMAL", 2),
        ("HIGH", 4),
        ("CRITICAL", 8),
    ]
    assert [r.value for r in HistoryRetention] == ["none", "run", "permanent"]


def test_budget_defaults_mean_unlimited() -> None:
    assert SpawnBudget() == SpawnBudget(max_agents=50, allow_preempt=True)
    budget = ExecutionBudget()
    assert budget.unlimited
    assert not ExecutionBudget(max_turns=3).unlimited


def test_budgets_are_keyword_only_and_frozen() -> None:
    with pytest.raises(TypeError):
        ExecutionBudget(10)  # type: ignore[call-arg]
    budget = ExecutionBudget(max_tokens=10)
    with pytest.raises(AttributeError):
        budget.max_tokens = 20  # type: ignore[misc]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", -1),
        ("max_tokens", 1.5),
        ("max_tokens", True),
        ("max_cost_usd", -0.01),
        ("max_cost_usd", math.nan),
        ("max_cost_usd", math.inf),
        ("max_cost_usd", "1"),
        ("max_turns", -3),
        ("deadline_s", math.nan),
        ("deadline_s", -1.0),
    ],
)
def test_execution_budget_refuses_bad_limits(field: str, value: object) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        ExecutionBudget(**{field: value})  # type: ignore[arg-type]
    err = info.value
    assert err.code == "invalid_argument"
    assert err.argument == field
    assert field in err.message
    assert repr(value) in err.message
    assert not err.retryable
    assert isinstance(err, ValueError)


@pytest.mark.parametrize("value", [0, -1, 2.0, None, True])
def test_spawn_budget_refuses_bad_caps(value: object) -> None:
    with pytest.raises(InvalidArgumentError, match="max_agents must be a positive integer"):
        SpawnBudget(max_agents=value)  # type: ignore[arg-type]


def test_root_mints_ids_and_applies_defaults() -> None:
    sup = Supervision.root("boss")
    other = Supervision.root("boss")
    assert sup.run_id != other.run_id
    assert sup.session_id != other.session_id
    assert sup.root_id == "boss"
    assert sup.parent_id is None
    assert sup.depth == 0
    assert sup.retention is HistoryRetention.PERMANENT
    assert sup.priority is Priority.NORMAL
    assert sup.spawn_budget == SpawnBudget()
    assert sup.execution_budget.unlimited


def test_root_keeps_a_given_session() -> None:
    sup = Supervision.root("boss", session_id="chat-1")
    assert sup.session_id == "chat-1"


def test_spawn_child_shares_the_same_spawn_budget_object() -> None:
    spawn = SpawnBudget(max_agents=4)
    budget = ExecutionBudget(max_turns=10)
    root = Supervision.root("boss", spawn_budget=spawn, execution_budget=budget)
    child = root.spawn_child("boss", priority=Priority.HIGH)
    grandchild = child.spawn_child("helper", execution_budget=ExecutionBudget(max_turns=2))
    assert child.spawn_budget is spawn
    assert grandchild.spawn_budget is spawn
    assert (child.run_id, child.session_id, child.root_id) == (
        root.run_id,
        root.session_id,
        root.root_id,
    )
    assert child.parent_id == "boss"
    assert child.depth == 1
    assert grandchild.depth == 2
    assert child.execution_budget is budget  # inherited
    assert grandchild.execution_budget.max_turns == 2  # overridden
    assert child.retention is HistoryRetention.RUN
    assert child.priority is Priority.HIGH


def test_round_trip_through_json() -> None:
    root = Supervision.root(
        "boss",
        spawn_budget=SpawnBudget(max_agents=7, allow_preempt=False),
        execution_budget=ExecutionBudget(max_tokens=100, max_cost_usd=1.5, deadline_s=60),
    )
    child = root.spawn_child("boss", priority=Priority.CRITICAL)
    data = json.loads(json.dumps(child.to_dict()))
    assert Supervision.from_dict(data) == child


@pytest.mark.parametrize(
    ("data", "argument"),
    [
        ("nope", "data"),
        ({"session_id": "s", "root_id": "r"}, "run_id"),
        ({"run_id": "r", "session_id": "s", "root_id": "a", "bogus": 1}, "data"),
        ({"run_id": "r", "session_id": "s", "root_id": "a", "priority": "URGENT"}, "priority"),
        ({"run_id": "r", "session_id": "s", "root_id": "a", "retention": "forever"}, "retention"),
        (
            {"run_id": "r", "session_id": "s", "root_id": "a", "execution_budget": {"x": 1}},
            "budget",
        ),
        (
            {
                "run_id": "r",
                "session_id": "s",
                "root_id": "a",
                "execution_budget": {"max_turns": -1},
            },
            "max_turns",
        ),
        ({"run_id": "r", "session_id": "s", "root_id": "a", "depth": 2}, "parent_id"),
    ],
)
def test_from_dict_refuses_bad_input(data: object, argument: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        Supervision.from_dict(data)
    assert info.value.argument == argument


def test_direct_construction_is_validated() -> None:
    with pytest.raises(InvalidArgumentError, match="run_id must be a non-empty string"):
        Supervision(run_id="", session_id="s", root_id="r")
    with pytest.raises(InvalidArgumentError, match="priority must be a Priority"):
        Supervision(run_id="x", session_id="s", root_id="r", priority=3)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="agent_id"):
        Supervision.root("")
    with pytest.raises(InvalidArgumentError, match="parent_id"):
        Supervision.root("a").spawn_child("")


def _kernel_values() -> list[object]:
    from corral.kernel import ChatMessage, RunMeta, ToolCall
    from corral.runtime import Cancellation

    sup = Supervision.root("boss")
    return [
        SpawnBudget(),
        ExecutionBudget(),
        sup,
        RunMeta(cancellation=Cancellation(), supervision=sup),
        ChatMessage.user("hi"),
        ToolCall("c1", "search"),
    ]


@pytest.mark.parametrize("value", _kernel_values(), ids=lambda v: type(v).__name__)
def test_kernel_contracts_are_frozen_and_slotted(value: object) -> None:
    assert not hasattr(value, "__dict__")  # slots=True
    first = dataclasses.fields(value)[0].name  # type: ignore[arg-type]
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(value, first, getattr(value, first))
