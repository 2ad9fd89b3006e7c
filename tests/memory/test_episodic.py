import pickle
import threading
from dataclasses import FrozenInstanceError
from datetime import UTC, datetime, timedelta

import pytest

from corral.kernel import InvalidArgumentError
from corral.memory import Episode, EpisodicMemory
from corral.runtime import FakeClock

CLOCK = FakeClock()


def ep(
    task_id: str, agent_id: str = "a", task_type: str = "faq", outcome: str = "success"
) -> Episode:
    return Episode.of(task_id, agent_id, task_type, outcome, clock=CLOCK)


def ids(episodes: list[Episode]) -> list[str]:
    return [e.task_id for e in episodes]


# --- Episode ------------------------------------------------------------------------------


def test_of_stamps_the_clocks_time_and_copies_metadata() -> None:
    clock = FakeClock()
    clock.advance(12)
    metadata = {"chars": "42"}
    episode = Episode.of("q-1", "agent-1", "faq", "success", metadata, clock=clock)
    metadata["chars"] = "changed"
    assert episode.timestamp == clock.now()
    assert (episode.task_id, episode.agent_id, episode.task_type, episode.outcome) == (
        "q-1",
        "agent-1",
        "faq",
        "success",
    )
    assert episode.metadata == {"chars": "42"}
    with pytest.raises(TypeError):
        episode.metadata["chars"] = "x"  # type: ignore[index]
    with pytest.raises(FrozenInstanceError):
        episode.outcome = "failure"  # type: ignore[misc]


def test_of_uses_the_system_clock_by_default() -> None:
    before = datetime.now(UTC)
    episode = Episode.of("q", "a", "faq", "success")
    assert before <= episode.timestamp <= datetime.now(UTC)
    assert episode.metadata == {}


def test_episodes_compare_hash_and_pickle() -> None:
    one = ep("q-1")
    same = Episode(
        task_id="q-1",
        agent_id="a",
        task_type="faq",
        outcome="success",
        metadata={},
        timestamp=one.timestamp,
    )
    assert one == same
    assert hash(one) == hash(same)
    copy = pickle.loads(pickle.dumps(Episode.of("q", "a", "t", "o", {"k": 1}, clock=CLOCK)))
    assert copy.metadata == {"k": 1}
    with pytest.raises(TypeError):
        copy.metadata["k"] = 2


@pytest.mark.parametrize("field", ["task_id", "agent_id", "task_type", "outcome"])
@pytest.mark.parametrize("value", ["", "  ", None, 3])
def test_episode_strings_must_be_non_empty(field: str, value: object) -> None:
    args = {"task_id": "q", "agent_id": "a", "task_type": "t", "outcome": "o"}
    args[field] = value  # type: ignore[assignment]
    with pytest.raises(InvalidArgumentError, match=f"Episode: {field} must be a non-empty string"):
        Episode.of(**args, clock=CLOCK)  # type: ignore[arg-type]


def test_episode_metadata_and_timestamp_are_checked() -> None:
    with pytest.raises(InvalidArgumentError, match="metadata must be a Mapping"):
        Episode.of("q", "a", "t", "o", ["not", "a", "mapping"], clock=CLOCK)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="metadata must be a mapping with string keys"):
        Episode.of("q", "a", "t", "o", {1: "x"}, clock=CLOCK)  # type: ignore[dict-item]
    with pytest.raises(InvalidArgumentError, match="timestamp must be a timezone-aware datetime"):
        Episode(
            task_id="q",
            agent_id="a",
            task_type="t",
            outcome="o",
            timestamp=datetime(2026, 1, 1),
        )


# --- EpisodicMemory -----------------------------------------------------------------------


def test_record_drops_the_oldest_when_full() -> None:
    memory = EpisodicMemory(3)
    for i in range(5):
        memory.record(ep(f"q-{i}"))
    assert len(memory) == 3
    assert ids(memory.episodes()) == ["q-2", "q-3", "q-4"]
    assert memory.max_episodes == 3
    assert "3 of 3 episodes" in repr(memory)


def test_query_similar_matches_contained_task_type_ignoring_case_newest_first() -> None:
    memory = EpisodicMemory(100)
    memory.record(ep("1", task_type="FAQ-billing"))
    memory.record(ep("2", task_type="deploy"))
    memory.record(ep("3", task_type="faq"))
    memory.record(ep("4", task_type="billing faq"))
    assert ids(memory.query_similar("faq", 10)) == ["4", "3", "1"]
    assert ids(memory.query_similar("Billing", 10)) == ["4", "1"]
    assert ids(memory.query_similar("faq", 2)) == ["4", "3"]
    assert memory.query_similar("missing", 10) == []


def test_query_by_agent_newest_first_up_to_the_limit() -> None:
    memory = EpisodicMemory(100)
    for i, agent in enumerate(["a", "b", "a", "a", "b"]):
        memory.record(ep(str(i), agent_id=agent))
    assert ids(memory.query_by_agent("a", 10)) == ["3", "2", "0"]
    assert ids(memory.query_by_agent("a", 1)) == ["3"]
    assert ids(memory.query_by_agent("b")) == ["4", "1"]
    assert memory.query_by_agent("A", 10) == []  # agent ids match exactly


def test_query_by_outcome_equals_ignoring_case() -> None:
    memory = EpisodicMemory(100)
    memory.record(ep("1", outcome="success"))
    memory.record(ep("2", outcome="SUCCESS"))
    memory.record(ep("3", outcome="partial success"))
    memory.record(ep("4", outcome="failure"))
    assert ids(memory.query_by_outcome("Success", 10)) == ["2", "1"]
    assert ids(memory.query_by_outcome("failure", 10)) == ["4"]


def test_newest_means_most_recently_recorded() -> None:
    memory = EpisodicMemory(10)
    late = Episode.of("late", "a", "t", "o", clock=CLOCK)
    early = Episode(
        task_id="early",
        agent_id="a",
        task_type="t",
        outcome="o",
        timestamp=late.timestamp - timedelta(days=1),
    )
    memory.record(late)
    memory.record(early)
    assert ids(memory.query_by_agent("a")) == ["early", "late"]


def test_clear_empties_the_log() -> None:
    memory = EpisodicMemory(10)
    memory.record(ep("1"))
    memory.clear()
    assert len(memory) == 0
    assert memory.episodes() == []


def test_recording_and_querying_from_threads() -> None:
    memory = EpisodicMemory(1_000)
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            for i in range(500):
                memory.record(ep(f"{n}-{i}", agent_id=f"agent-{n}"))
                memory.query_similar("faq", 5)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(memory) == 1_000
    assert len(set(ids(memory.episodes()))) == 1_000
    for n in range(8):  # each agent's own episodes stay in its recording order
        mine = [int(t.split("-")[1]) for t in ids(memory.query_by_agent(f"agent-{n}", 1_000))]
        assert mine == sorted(mine, reverse=True)


# --- bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, -1, 2.5, True, None])
def test_max_episodes_must_be_a_positive_int(value: object) -> None:
    with pytest.raises(InvalidArgumentError, match="max_episodes must be a positive integer"):
        EpisodicMemory(value)  # type: ignore[arg-type]


def test_record_takes_episodes_only() -> None:
    with pytest.raises(InvalidArgumentError, match="episode must be an Episode"):
        EpisodicMemory(5).record({"task_id": "q"})  # type: ignore[arg-type]


@pytest.mark.parametrize("method", ["query_similar", "query_by_agent", "query_by_outcome"])
def test_queries_check_their_text_and_limit(method: str) -> None:
    query = getattr(EpisodicMemory(5), method)
    with pytest.raises(InvalidArgumentError, match="must be a non-empty string"):
        query("", 5)
    with pytest.raises(InvalidArgumentError, match="must be a non-empty string"):
        query(None, 5)
    for limit in (0, -1, 1.5, None):
        with pytest.raises(InvalidArgumentError, match=f"{method}: limit must be a positive"):
            query("x", limit)
