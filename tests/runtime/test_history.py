"""History keyed by session id with retention none / run / permanent, and AgentContext."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from corral.kernel import AgentContextProtocol, ChatMessage, HistoryRetention, InvalidArgumentError
from corral.runtime import AgentContext, HistoryStore, InMemoryHistoryStore, SlidingWindow

NONE, RUN, PERMANENT = HistoryRetention.NONE, HistoryRetention.RUN, HistoryRetention.PERMANENT


def texts(messages: list[ChatMessage]) -> list[str | None]:
    return [m.content for m in messages]


async def test_none_retention_stores_nothing() -> None:
    store = InMemoryHistoryStore()
    await store.append("s1", [ChatMessage.user("hi")], run_id="r1", retention=NONE)
    assert await store.load("s1") == []
    assert store.sessions() == []


async def test_run_retention_is_deleted_when_its_run_ends() -> None:
    store = InMemoryHistoryStore()
    await store.append(
        "s1", [ChatMessage.user("a"), ChatMessage.assistant("b")], run_id="r1", retention=RUN
    )
    assert texts(await store.load("s1")) == ["a", "b"]
    await store.end_run("r1")
    assert await store.load("s1") == []
    assert store.sessions() == []


async def test_permanent_retention_survives_the_end_of_its_run() -> None:
    store = InMemoryHistoryStore()
    await store.append("s1", [ChatMessage.user("keep")], run_id="r1", retention=PERMANENT)
    await store.end_run("r1")
    assert texts(await store.load("s1")) == ["keep"]


async def test_history_is_keyed_by_session_across_runs() -> None:
    store = InMemoryHistoryStore()
    await store.append("s1", [ChatMessage.user("run1")], run_id="r1", retention=PERMANENT)
    await store.append("s1", [ChatMessage.user("run2 scratch")], run_id="r2", retention=RUN)
    await store.append("s1", [ChatMessage.user("run2 kept")], run_id="r2", retention=PERMANENT)
    await store.append("s2", [ChatMessage.user("other session")], run_id="r2", retention=RUN)
    assert texts(await store.load("s1")) == ["run1", "run2 scratch", "run2 kept"]
    await store.end_run("r2")
    assert texts(await store.load("s1")) == ["run1", "run2 kept"]
    assert await store.load("s2") == []
    assert store.sessions() == ["s1"]


async def test_end_run_touches_only_that_run() -> None:
    store = InMemoryHistoryStore()
    await store.append("s1", [ChatMessage.user("r1")], run_id="r1", retention=RUN)
    await store.append("s1", [ChatMessage.user("r2")], run_id="r2", retention=RUN)
    await store.end_run("r1")
    assert texts(await store.load("s1")) == ["r2"]
    await store.end_run("r1")  # idempotent
    await store.end_run("never-ran")
    assert texts(await store.load("s1")) == ["r2"]


async def test_load_returns_a_copy_and_unknown_sessions_are_empty() -> None:
    store = InMemoryHistoryStore()
    await store.append("s1", (ChatMessage.user("a"),), run_id="r1", retention=PERMANENT)
    loaded = await store.load("s1")
    loaded.append(ChatMessage.user("injected"))
    assert texts(await store.load("s1")) == ["a"]
    assert await store.load("unknown") == []


async def test_appending_nothing_creates_no_session() -> None:
    store = InMemoryHistoryStore()
    await store.append("s1", [], run_id="r1", retention=PERMANENT)
    assert store.sessions() == []


def test_concurrent_appends_from_threads_lose_nothing() -> None:
    store = InMemoryHistoryStore()
    threads_n, per_thread = 8, 200
    start = threading.Barrier(threads_n)

    def writer(t: int) -> None:
        async def run() -> None:
            for i in range(per_thread):
                retention = RUN if i % 2 else PERMANENT
                message = ChatMessage.user(f"{t}:{i}")
                await store.append("shared", [message], run_id=f"run{t}", retention=retention)

        start.wait()
        asyncio.run(run())

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(threads_n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    loaded = texts(asyncio.run(store.load("shared")))
    assert len(loaded) == threads_n * per_thread
    for t in range(threads_n):
        mine = [x for x in loaded if x is not None and x.startswith(f"{t}:")]
        assert mine == [f"{t}:{i}" for i in range(per_thread)]  # each writer's order kept
    for t in range(threads_n):
        asyncio.run(store.end_run(f"run{t}"))
    assert len(asyncio.run(store.load("shared"))) == threads_n * per_thread // 2


def test_in_memory_store_is_a_history_store() -> None:
    assert isinstance(InMemoryHistoryStore(), HistoryStore)


@pytest.mark.parametrize(
    ("args", "kwargs", "argument"),
    [
        (("", [ChatMessage.user("a")]), {"run_id": "r", "retention": RUN}, "session_id"),
        (("s", [ChatMessage.user("a")]), {"run_id": "", "retention": RUN}, "run_id"),
        (("s", [ChatMessage.user("a")]), {"run_id": "r", "retention": "run"}, "retention"),
        (("s", "hello"), {"run_id": "r", "retention": RUN}, "messages"),
        (("s", ["hello"]), {"run_id": "r", "retention": RUN}, "messages[]"),
    ],
)
async def test_append_refuses_bad_arguments(
    args: tuple[Any, ...], kwargs: dict[str, Any], argument: str
) -> None:
    store = InMemoryHistoryStore()
    with pytest.raises(InvalidArgumentError) as caught:
        await store.append(*args, **kwargs)
    assert caught.value.argument == argument
    assert store.sessions() == []


async def test_load_and_end_run_refuse_empty_ids() -> None:
    store = InMemoryHistoryStore()
    with pytest.raises(InvalidArgumentError, match="session_id must be a non-empty string"):
        await store.load("")
    with pytest.raises(InvalidArgumentError, match="run_id must be a non-empty string"):
        await store.end_run(None)  # type: ignore[arg-type]


# --- AgentContext -------------------------------------------------------------------------


async def test_agent_context_without_compaction_returns_the_whole_history() -> None:
    store = InMemoryHistoryStore()
    history = [ChatMessage.system("sys"), ChatMessage.user("a"), ChatMessage.assistant("b")]
    await store.append("s1", history, run_id="r1", retention=PERMANENT)
    context = AgentContext("agent-1", store)
    assert context.agent_id == "agent-1"
    assert await context.get_prompt_window("s1") == history
    assert await context.get_prompt_window("other") == []


async def test_agent_context_compacts_the_window_not_the_store() -> None:
    store = InMemoryHistoryStore()
    history = [ChatMessage.system("sys")] + [ChatMessage.user(str(i)) for i in range(6)]
    await store.append("s1", history, run_id="r1", retention=RUN)
    context = AgentContext("agent-1", store, compaction=SlidingWindow(2))
    assert texts(await context.get_prompt_window("s1")) == ["sys", "4", "5"]
    assert await store.load("s1") == history
    await store.end_run("r1")
    assert await context.get_prompt_window("s1") == []


def test_agent_context_implements_the_kernel_protocol() -> None:
    context = AgentContext("agent-1", InMemoryHistoryStore())
    assert isinstance(context, AgentContextProtocol)
    assert "agent-1" in repr(context)


@pytest.mark.parametrize(
    ("args", "argument"),
    [
        (("", InMemoryHistoryStore()), "agent_id"),
        (("a", object()), "store"),
        (("a", InMemoryHistoryStore(), object()), "compaction"),
    ],
)
def test_agent_context_refuses_bad_arguments(args: tuple[Any, ...], argument: str) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        AgentContext(*args)
    assert caught.value.argument == argument


async def test_get_prompt_window_refuses_an_empty_session_id() -> None:
    context = AgentContext("a", InMemoryHistoryStore())
    with pytest.raises(InvalidArgumentError, match="session_id must be a non-empty string"):
        await context.get_prompt_window(" ")
