"""The agent loop with a history store and compaction (AgentContext)."""

import asyncio
from collections.abc import Sequence

import pytest

from corral.agent import Agent
from corral.kernel import (
    BudgetExhaustedError,
    CancellationError,
    ChatMessage,
    CostUnknownError,
    DeadlineExceededError,
    ExecutionBudget,
    HistoryRetention,
    InvalidArgumentError,
    Role,
    RunMeta,
    Supervision,
)
from corral.runtime import (
    AgentContext,
    Cancellation,
    ExecutionTracker,
    FakeClock,
    InMemoryHistoryStore,
    LLMSummarization,
    ScriptedClient,
    SlidingWindow,
)

text = ScriptedClient.text_reply
call = ScriptedClient.tool_call_reply


def contents(messages: Sequence[ChatMessage]) -> list[str | None]:
    return [m.content for m in messages]


async def test_a_session_remembers_earlier_runs() -> None:
    store = InMemoryHistoryStore()
    client = ScriptedClient([text("hello Ada"), text("your name is Ada")])
    agent = Agent(client, agent_id="bot", context=AgentContext("bot", store))
    await agent.run("my name is Ada", session_id="chat-1")
    await agent.run("what is my name?", session_id="chat-1")
    assert contents(client.requests[1].messages) == [
        "my name is Ada",
        "hello Ada",
        "what is my name?",
    ]
    assert contents(await store.load("chat-1")) == [
        "my name is Ada",
        "hello Ada",
        "what is my name?",
        "your name is Ada",
    ]


async def test_other_sessions_do_not_leak_in() -> None:
    store = InMemoryHistoryStore()
    client = ScriptedClient([text("one"), text("two")])
    agent = Agent(client, agent_id="bot", context=AgentContext("bot", store))
    await agent.run("first", session_id="a")
    await agent.run("second", session_id="b")
    assert contents(client.requests[1].messages) == ["second"]


async def test_compaction_shapes_the_window_but_the_store_keeps_everything() -> None:
    store = InMemoryHistoryStore()
    client = ScriptedClient([text(f"reply {i}") for i in range(4)])
    context = AgentContext("bot", store, SlidingWindow(2))
    agent = Agent(client, agent_id="bot", instructions="be brief", context=context)
    for i in range(4):
        await agent.run(f"prompt {i}", session_id="s")
    assert contents(client.requests[3].messages) == [
        "be brief",
        "prompt 2",
        "reply 2",
        "prompt 3",
    ]
    assert len(await store.load("s")) == 8  # instructions are not history


async def test_run_retention_is_deleted_when_the_run_ends() -> None:
    store = InMemoryHistoryStore()
    root = Supervision.root("boss", session_id="s")
    child = root.spawn_child("boss")  # children keep history for the run only
    assert child.retention is HistoryRetention.RUN
    agent = Agent(ScriptedClient([text("done")]), agent_id="w", context=AgentContext("w", store))
    await agent.run("work", meta=RunMeta(cancellation=Cancellation(), supervision=child))
    assert contents(await store.load("s")) == ["work", "done"]
    await store.end_run(root.run_id)
    assert await store.load("s") == []


async def test_a_failed_run_is_saved_without_its_unanswered_tool_request() -> None:
    store = InMemoryHistoryStore()

    def lookup(key: str) -> str:
        return "value"

    client = ScriptedClient(
        [
            call("lookup", {"key": "a"}, prompt_tokens=10),
            call("lookup", {"key": "b"}, prompt_tokens=100),
        ]
    )
    agent = Agent(
        client,
        agent_id="bot",
        tools=[lookup],
        budget=ExecutionBudget(max_tokens=50),
        context=AgentContext("bot", store),
    )
    with pytest.raises(BudgetExhaustedError):
        await agent.run("look things up", session_id="s")
    saved = await store.load("s")
    assert [m.role for m in saved] == [Role.USER, Role.ASSISTANT, Role.TOOL]
    assert saved[1].tool_calls[0].arguments == {"key": "a"}


async def test_a_store_failure_after_a_failed_run_keeps_the_runs_error() -> None:
    class BrokenStore(InMemoryHistoryStore):
        async def append(self, *args: object, **kwargs: object) -> None:
            raise OSError("disk full")

    agent = Agent(
        ScriptedClient([text("x", prompt_tokens=10)]),
        agent_id="bot",
        budget=ExecutionBudget(max_tokens=5),
        context=AgentContext("bot", BrokenStore()),
    )
    with pytest.raises(BudgetExhaustedError) as info:
        await agent.run("go")
    assert any("could not be saved" in note for note in info.value.__notes__)


async def test_a_store_failure_after_a_good_run_is_raised() -> None:
    class BrokenStore(InMemoryHistoryStore):
        async def append(self, *args: object, **kwargs: object) -> None:
            raise OSError("disk full")

    agent = Agent(
        ScriptedClient([text("x")]), agent_id="bot", context=AgentContext("bot", BrokenStore())
    )
    with pytest.raises(OSError, match="disk full"):
        await agent.run("go")


async def test_session_and_context_mismatches_are_refused() -> None:
    store = InMemoryHistoryStore()
    with pytest.raises(InvalidArgumentError, match="context"):
        Agent(ScriptedClient(), agent_id="bot", context=AgentContext("other", store))
    agent = Agent(ScriptedClient([text("x")]), agent_id="bot", context=AgentContext("bot", store))
    meta = RunMeta(cancellation=Cancellation(), supervision=Supervision.root("bot", session_id="a"))
    with pytest.raises(InvalidArgumentError, match="session_id"):
        await agent.run("go", meta=meta, session_id="b")
    with pytest.raises(InvalidArgumentError, match=r"meta\.supervision"):
        await agent.run("go", meta=RunMeta(cancellation=Cancellation()))


async def test_the_deadline_stops_a_compaction_that_hangs() -> None:
    clock = FakeClock()
    started = asyncio.Event()

    class SlowSummary:
        """A summarising compaction whose model never answers."""

        async def compact(self, history: list[ChatMessage]) -> list[ChatMessage]:
            started.set()
            await clock.sleep(3600)
            return history

    client = ScriptedClient([text("never")])
    agent = Agent(
        client,
        agent_id="bot",
        budget=ExecutionBudget(deadline_s=30),
        context=AgentContext("bot", InMemoryHistoryStore(), SlowSummary()),
        clock=clock,
    )
    task = asyncio.create_task(agent.run("go"))
    await asyncio.wait_for(started.wait(), 5)
    clock.advance(30)
    with pytest.raises(DeadlineExceededError):
        await asyncio.wait_for(task, 5)
    assert client.requests == []
    assert clock.pending_timers == 0  # the abandoned sleep and the deadline timer are gone


async def test_a_run_cancelled_before_it_starts_calls_nothing() -> None:
    token = Cancellation()
    token.cancel("not today")
    client = ScriptedClient([text("never")])
    store = InMemoryHistoryStore()
    await store.append(
        "s", [ChatMessage.user("old")], run_id="r0", retention=HistoryRetention.PERMANENT
    )
    agent = Agent(client, agent_id="bot", context=AgentContext("bot", store))
    meta = RunMeta(cancellation=token, supervision=Supervision.root("bot", session_id="s"))
    with pytest.raises(CancellationError, match="not today"):
        await agent.run("go", meta=meta)
    assert client.requests == []
    assert contents(await store.load("s")) == ["old"]


async def _agent_with_summaries(
    summariser: ScriptedClient, client: ScriptedClient, budget: ExecutionBudget
) -> tuple[Agent, str]:
    store = InMemoryHistoryStore()
    session = "chat-long"
    history: list[ChatMessage] = []
    for i in range(6):
        history += [ChatMessage.user(f"question {i}"), ChatMessage.assistant(f"answer {i}")]
    await store.append(session, history, retention=HistoryRetention.PERMANENT, run_id="r0")
    context = AgentContext(
        "bot", store, compaction=LLMSummarization(summariser, keep_last=2, trigger_messages=4)
    )
    return Agent(client, agent_id="bot", context=context, budget=budget), session


async def test_a_summary_is_paid_from_the_runs_budget() -> None:
    summariser = ScriptedClient(
        [text("they asked six questions", prompt_tokens=50, completion_tokens=10)]
    )
    client = ScriptedClient([text("done", prompt_tokens=5, completion_tokens=5)])
    agent, session = await _agent_with_summaries(
        summariser, client, ExecutionBudget(max_tokens=1000)
    )
    tracker = ExecutionTracker(ExecutionBudget(max_tokens=1000))
    await agent.run("next", meta=_meta(session), tracker=tracker)
    assert len(summariser.requests) == 1
    assert tracker.usage().tokens == 70  # the summary's 60 and the answer's 10
    assert tracker.usage().turns == 1  # a summary is not a turn


async def test_a_summary_past_the_budget_stops_the_run_before_the_model() -> None:
    summariser = ScriptedClient([text("a long summary", prompt_tokens=50, completion_tokens=10)])
    client = ScriptedClient([text("never sent")])
    agent, session = await _agent_with_summaries(summariser, client, ExecutionBudget(max_tokens=40))
    with pytest.raises(BudgetExhaustedError) as caught:
        await agent.run("next", meta=_meta(session))
    assert caught.value.limit == 40
    assert client.requests == []


async def test_a_summary_of_unknown_price_under_a_dollar_limit_is_refused() -> None:
    summariser = ScriptedClient([text("summary", cost_usd=None)])
    client = ScriptedClient([text("never sent")])
    agent, session = await _agent_with_summaries(
        summariser, client, ExecutionBudget(max_cost_usd=1.0)
    )
    with pytest.raises(CostUnknownError):
        await agent.run("next", meta=_meta(session))
    assert client.requests == []


def _meta(session: str) -> RunMeta:
    return RunMeta(
        cancellation=Cancellation(), supervision=Supervision.root("bot", session_id=session)
    )
