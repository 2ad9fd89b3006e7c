import threading

import pytest

from corral.guard import AgentGroup, UnknownAgentError
from corral.kernel import InvalidArgumentError, UsageError


class Agent:
    def __init__(self, label: str) -> None:
        self.label = label


def test_members_by_id_in_joining_order() -> None:
    a, b = Agent("a"), Agent("b")
    group = AgentGroup("crew", {"a": a})
    group.add("b", b)
    assert group.name == "crew"
    assert group.ids() == ["a", "b"]
    assert list(group) == ["a", "b"]
    assert len(group) == 2
    assert "a" in group
    assert "z" not in group
    assert group.get("a") is a
    assert group.require("b") is b
    assert group.get("z") is None


def test_remove_returns_the_member_and_is_idempotent() -> None:
    a = Agent("a")
    group = AgentGroup("crew", {"a": a})
    assert group.remove("a") is a
    assert "a" not in group
    assert group.remove("a") is None
    assert group.ids() == []


def test_ids_is_a_snapshot() -> None:
    group = AgentGroup("crew", {"a": Agent("a")})
    ids = group.ids()
    ids.append("b")
    group.add("c", Agent("c"))
    assert group.ids() == ["a", "c"]


def test_contains_answers_false_for_non_strings() -> None:
    group = AgentGroup("crew", {"a": Agent("a")})
    assert [] not in group
    assert 1 not in group


def test_require_raises_a_typed_error_naming_agent_and_group() -> None:
    group = AgentGroup("crew", {"a": Agent("a")})
    with pytest.raises(UnknownAgentError) as caught:
        group.require("ghost")
    err = caught.value
    assert err.code == "unknown_agent"
    assert err.agent_id == "ghost"
    assert err.group == "crew"
    assert "'ghost'" in err.message
    assert "'crew'" in err.message
    assert "1 members" in err.message
    assert not err.retryable
    assert isinstance(err, UsageError)
    assert isinstance(err, LookupError)
    assert err.to_dict()["details"]["agent_id"] == "ghost"


def test_add_refuses_a_duplicate_id() -> None:
    group = AgentGroup("crew", {"a": Agent("a")})
    with pytest.raises(InvalidArgumentError, match="an id not already in group 'crew'") as caught:
        group.add("a", Agent("again"))
    assert caught.value.argument == "agent_id"
    assert group.get("a").label == "a"  # type: ignore[attr-defined]


@pytest.mark.parametrize("agent_id", ["", "   ", None, 7])
def test_add_refuses_bad_ids(agent_id: object) -> None:
    group = AgentGroup("crew")
    with pytest.raises(InvalidArgumentError, match="agent_id must be a non-empty string"):
        group.add(agent_id, Agent("x"))  # type: ignore[arg-type]


@pytest.mark.parametrize("agent_id", ["", None, 7, ["a"]])
def test_lookups_refuse_bad_ids(agent_id: object) -> None:
    group = AgentGroup("crew", {"a": Agent("a")})
    for method in (group.get, group.require, group.remove):
        with pytest.raises(InvalidArgumentError, match="agent_id must be a non-empty string"):
            method(agent_id)  # type: ignore[arg-type]
    assert group.ids() == ["a"]


def test_add_refuses_none_as_an_agent() -> None:
    with pytest.raises(InvalidArgumentError, match="agent must be an agent object, not None"):
        AgentGroup("crew").add("a", None)


@pytest.mark.parametrize("name", ["", " ", None, 3])
def test_name_must_be_a_non_empty_string(name: object) -> None:
    with pytest.raises(InvalidArgumentError, match="AgentGroup: name must be a non-empty string"):
        AgentGroup(name)  # type: ignore[arg-type]


def test_members_must_be_a_mapping() -> None:
    with pytest.raises(InvalidArgumentError, match="members must be a Mapping"):
        AgentGroup("crew", [("a", Agent("a"))])  # type: ignore[arg-type]


def test_initial_members_are_validated() -> None:
    with pytest.raises(InvalidArgumentError, match="agent_id must be a non-empty string"):
        AgentGroup("crew", {"": Agent("a")})


def test_concurrent_adds_from_threads_lose_nothing() -> None:
    group = AgentGroup("crew")
    start = threading.Barrier(8)

    def worker(n: int) -> None:
        start.wait()
        for i in range(200):
            group.add(f"w{n}-{i}", Agent(f"{n}-{i}"))

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(group) == 1600
    assert len(set(group.ids())) == 1600


def test_racing_adds_of_one_id_let_exactly_one_win() -> None:
    group = AgentGroup("crew")
    start = threading.Barrier(16)
    outcomes: list[str] = []
    lock = threading.Lock()

    def worker(n: int) -> None:
        start.wait()
        try:
            group.add("same", Agent(str(n)))
            result = "won"
        except InvalidArgumentError:
            result = "refused"
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes.count("won") == 1
    assert outcomes.count("refused") == 15
