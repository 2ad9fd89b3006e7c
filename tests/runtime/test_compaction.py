"""Compaction strategies: windows keep system messages, whole turns, and never mutate input."""

from __future__ import annotations

import random
from typing import Any

import pytest

from corral.kernel import ChatMessage, CompactionStrategy, InvalidArgumentError, Role, ToolCall
from corral.runtime import (
    LLMSummarization,
    ModelHTTPError,
    ModelResponseError,
    ScriptedClient,
    SlidingWindow,
    TokenTruncation,
    approx_tokens,
)

SYS = ChatMessage.system("you are terse")


def u(text: str) -> ChatMessage:
    return ChatMessage.user(text)


def a(text: str) -> ChatMessage:
    return ChatMessage.assistant(text)


def calls(*ids: str) -> ChatMessage:
    return ChatMessage.assistant(None, tuple(ToolCall(i, "lookup", {"k": i}) for i in ids))


def result(call_id: str) -> ChatMessage:
    return ChatMessage.tool(call_id, f"result {call_id}")


def contents(messages: list[ChatMessage]) -> list[str | None]:
    return [m.content if m.content is not None else f"calls:{m.tool_calls[0].id}" for m in messages]


def random_history(rng: random.Random, length: int) -> list[ChatMessage]:
    history: list[ChatMessage] = [SYS] if rng.random() < 0.8 else []
    n = 0
    while len(history) < length:
        n += 1
        kind = rng.random()
        if kind < 0.35:
            history.append(u(f"q{n} " + "x" * rng.randrange(0, 40)))
        elif kind < 0.65:
            history.append(a(f"r{n} " + "y" * rng.randrange(0, 40)))
        elif kind < 0.95:
            ids = [f"c{n}_{k}" for k in range(rng.randrange(1, 4))]
            history.append(calls(*ids))
            history.extend(result(i) for i in ids)
        else:
            history.append(ChatMessage.system(f"note {n}"))
    return history


def assert_window_invariants(history: list[ChatMessage], window: list[ChatMessage]) -> None:
    # A subsequence of the input, in order.
    position = -1
    for message in window:
        position = next(i for i in range(position + 1, len(history)) if history[i] is message)
    # No tool result without the assistant call that asked for it earlier in the window.
    offered: set[str] = set()
    for message in window:
        offered.update(call.id for call in message.tool_calls)
        if message.role is Role.TOOL:
            assert message.tool_call_id in offered, f"orphan tool result in {contents(window)}"
    # Turns are whole: every result of a kept call is kept.
    kept = {id(m) for m in window}
    for i, message in enumerate(history):
        if message.tool_calls and id(message) in kept:
            j = i + 1
            while j < len(history) and history[j].role is Role.TOOL:
                assert id(history[j]) in kept, "a turn was split"
                j += 1


# --- approx_tokens ------------------------------------------------------------------------


def test_approx_tokens_is_a_quarter_of_the_characters_plus_overhead() -> None:
    assert approx_tokens(u("")) == 4
    assert approx_tokens(u("abcd")) == 5
    assert approx_tokens(u("abcde")) == 6
    assert approx_tokens(u("x" * 400)) == 104
    call = calls("c1")  # "c1" + "lookup" + '{"k": "c1"}' = 2 + 6 + 11 characters
    assert approx_tokens(call) == 4 + 5
    assert approx_tokens(result("c1")) == 4 + 3  # "result c1" + "c1"


# --- SlidingWindow ------------------------------------------------------------------------


async def test_sliding_window_keeps_newest_messages_and_system() -> None:
    history = [SYS, u("1"), a("2"), u("3"), a("4"), u("5")]
    window = await SlidingWindow(3).compact(history)
    assert contents(window) == ["you are terse", "3", "4", "5"]


async def test_sliding_window_keeps_mid_history_system_messages_in_place() -> None:
    note = ChatMessage.system("note")
    history = [SYS, u("1"), a("2"), note, u("3"), a("4")]
    window = await SlidingWindow(2).compact(history)
    assert window == [SYS, note, history[4], history[5]]


async def test_sliding_window_does_not_mutate_and_returns_a_new_list() -> None:
    history = [SYS, u("1"), a("2")]
    snapshot = list(history)
    window = await SlidingWindow(10).compact(history)
    assert window == history
    assert window is not history
    window.append(u("x"))
    assert history == snapshot


async def test_sliding_window_never_splits_a_tool_turn() -> None:
    history = [SYS, u("q"), calls("c1", "c2"), result("c1"), result("c2"), a("done")]
    # Four non-system messages would start inside the tool turn: the whole turn is left out.
    window = await SlidingWindow(3).compact(history)
    assert contents(window) == ["you are terse", "done"]
    window = await SlidingWindow(4).compact(history)
    assert contents(window) == ["you are terse", "calls:c1", "result c1", "result c2", "done"]


async def test_sliding_window_keeps_the_newest_turn_whole_even_over_the_limit() -> None:
    history = [SYS, u("q"), calls("c1", "c2", "c3"), result("c1"), result("c2"), result("c3")]
    window = await SlidingWindow(2).compact(history)
    assert contents(window) == ["you are terse", "calls:c1", "result c1", "result c2", "result c3"]


async def test_sliding_window_drops_orphans_at_the_start() -> None:
    # An input that already starts with an orphaned tool result (its call was lost).
    history = [result("lost"), u("q"), a("r")]
    window = await SlidingWindow(5).compact(history)
    assert contents(window) == ["q", "r"]


async def test_sliding_window_without_keep_system_counts_and_drops_system() -> None:
    history = [SYS, u("1"), a("2")]
    window = await SlidingWindow(2, keep_system=False).compact(history)
    assert contents(window) == ["1", "2"]
    assert await SlidingWindow(3, keep_system=False).compact(history) == history


async def test_sliding_window_empty_history() -> None:
    assert await SlidingWindow(3).compact([]) == []


@pytest.mark.parametrize("seed", range(40))
async def test_sliding_window_invariants_on_random_histories(seed: int) -> None:
    rng = random.Random(seed)
    history = random_history(rng, rng.randrange(1, 40))
    snapshot = list(history)
    for size in (1, 2, 3, 5, 8, 13):
        window = await SlidingWindow(size).compact(history)
        assert history == snapshot
        assert_window_invariants(history, window)
        systems = [m for m in history if m.role is Role.SYSTEM]
        assert [m for m in window if m.role is Role.SYSTEM] == systems
        others = [m for m in window if m.role is not Role.SYSTEM]
        if len(others) > size:  # only allowed when the newest turn alone is that long
            assert all(m.role is Role.TOOL for m in others[1:])
            assert others[0].tool_calls


@pytest.mark.parametrize("bad", [0, -1, 1.5, "3", None, True])
def test_sliding_window_refuses_bad_sizes(bad: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="max_messages must be a positive integer"):
        SlidingWindow(bad)


def test_sliding_window_refuses_bad_keep_system() -> None:
    with pytest.raises(InvalidArgumentError, match="keep_system must be a bool"):
        SlidingWindow(3, keep_system="yes")  # type: ignore[arg-type]


async def test_compact_refuses_what_is_not_a_history() -> None:
    with pytest.raises(InvalidArgumentError, match="history must be a sequence of ChatMessage"):
        await SlidingWindow(3).compact("hello")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match=r"history\[\] must be a ChatMessage"):
        await TokenTruncation(10).compact([{"role": "user"}])  # type: ignore[list-item]


# --- TokenTruncation ----------------------------------------------------------------------


def by_length(message: ChatMessage) -> int:
    return len(message.content or "") + 1


async def test_token_truncation_keeps_what_fits_after_system_tokens() -> None:
    history = [SYS, u("aaaa"), a("bbbb"), u("cccc"), a("dddd")]  # 14 + 5 each
    strategy = TokenTruncation(14 + 10, count_tokens=by_length)
    assert contents(await strategy.compact(history)) == ["you are terse", "cccc", "dddd"]
    strategy = TokenTruncation(14 + 9, count_tokens=by_length)
    assert contents(await strategy.compact(history)) == ["you are terse", "dddd"]


async def test_token_truncation_takes_whole_turns() -> None:
    history = [u("q"), calls("c1"), result("c1"), a("ok")]
    counts = {id(m): 10 for m in history}
    strategy = TokenTruncation(25, count_tokens=lambda m: counts[id(m)], keep_system=False)
    # "ok" (10) fits, the tool turn (20) does not: it is dropped whole.
    assert contents(await strategy.compact(history)) == ["ok"]
    strategy = TokenTruncation(30, count_tokens=lambda m: counts[id(m)], keep_system=False)
    assert contents(await strategy.compact(history)) == ["calls:c1", "result c1", "ok"]


async def test_token_truncation_keeps_newest_turn_when_nothing_fits() -> None:
    history = [SYS, u("x" * 1000)]
    window = await TokenTruncation(10).compact(history)
    assert window == history


async def test_token_truncation_accepts_an_async_counter() -> None:
    async def count(message: ChatMessage) -> int:
        return 5

    history = [u("1"), a("2"), u("3")]
    window = await TokenTruncation(10, count_tokens=count).compact(history)
    assert contents(window) == ["2", "3"]


async def test_token_truncation_default_counter_is_approx_tokens() -> None:
    history = [u("x" * 40), a("y" * 40), u("z" * 40)]  # 14 tokens each
    window = await TokenTruncation(30).compact(history)
    assert window == history[1:]


@pytest.mark.parametrize("bad", [-1, 1.5, "3", None])
async def test_token_truncation_refuses_a_bad_count(bad: Any) -> None:
    strategy = TokenTruncation(10, count_tokens=lambda m: bad)
    with pytest.raises(InvalidArgumentError, match=r"count_tokens\(message\) must be"):
        await strategy.compact([u("x")])


@pytest.mark.parametrize("seed", range(30))
async def test_token_truncation_invariants_on_random_histories(seed: int) -> None:
    rng = random.Random(1000 + seed)
    history = random_history(rng, rng.randrange(1, 40))
    snapshot = list(history)
    for budget in (1, 20, 60, 150, 400):
        window = await TokenTruncation(budget).compact(history)
        assert history == snapshot
        assert_window_invariants(history, window)
        systems = [m for m in history if m.role is Role.SYSTEM]
        assert [m for m in window if m.role is Role.SYSTEM] == systems
        others = [m for m in window if m.role is not Role.SYSTEM]
        spent = sum(approx_tokens(m) for m in window)
        if others and spent > budget:
            # Over budget only by the system messages and one newest turn.
            first_turn_len = 1 + sum(
                1 for m in others[1:] if m.role is Role.TOOL and others[0].tool_calls
            )
            assert len(others) == first_turn_len


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_tokens": 0}, "max_tokens must be a positive integer"),
        ({"max_tokens": "100"}, "max_tokens must be a positive integer"),
        ({"max_tokens": 10, "count_tokens": 3}, "count_tokens must be callable"),
        ({"max_tokens": 10, "keep_system": 1}, "keep_system must be a bool"),
    ],
)
def test_token_truncation_refuses_bad_arguments(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        TokenTruncation(**kwargs)


# --- LLMSummarization ---------------------------------------------------------------------


def long_history(n: int) -> list[ChatMessage]:
    history = [SYS]
    for i in range(n):
        history.append(u(f"q{i}") if i % 2 == 0 else a(f"r{i}"))
    return history


async def test_summarization_below_trigger_returns_history_without_calling() -> None:
    client = ScriptedClient()
    history = long_history(4)
    window = await LLMSummarization(client, keep_last=2, trigger_messages=4).compact(history)
    assert window == history
    assert window is not history
    assert client.requests == []


async def test_summarization_replaces_older_messages_with_one_system_summary() -> None:
    client = ScriptedClient(["the user asked q0..q2"])
    history = long_history(6)
    snapshot = list(history)
    strategy = LLMSummarization(client, keep_last=3, trigger_messages=5, instructions="Sum up.")
    window = await strategy.compact(history)
    assert history == snapshot
    assert window[0] is SYS
    assert window[1] == ChatMessage.system(
        "Summary of the earlier conversation:\nthe user asked q0..q2"
    )
    assert window[2:] == history[-3:]
    (request,) = client.requests
    assert request.messages[0] == ChatMessage.system("Sum up.")
    transcript = request.messages[1].content or ""
    assert transcript.splitlines() == ["user: q0", "assistant: r1", "user: q2"]
    assert request.tools is None


async def test_summarization_moves_the_split_before_a_tool_turn() -> None:
    client = ScriptedClient(["summary"])
    history = [SYS, u("q0"), a("r0"), u("q1"), calls("c1", "c2"), result("c1"), result("c2")]
    strategy = LLMSummarization(client, keep_last=2, trigger_messages=3)
    window = await strategy.compact(history)
    assert contents(window) == [
        "you are terse",
        "Summary of the earlier conversation:\nsummary",
        "calls:c1",
        "result c1",
        "result c2",
    ]
    transcript = client.requests[0].messages[1].content or ""
    assert "lookup" not in transcript
    assert_window_invariants(history, [m for m in window if m is not window[1]])


async def test_summarization_transcript_shows_tool_calls_and_results() -> None:
    client = ScriptedClient(["summary"])
    history = [u("q"), calls("c1"), result("c1"), a("r"), u("q2")]
    await LLMSummarization(client, keep_last=1, trigger_messages=4).compact(history)
    transcript = client.requests[0].messages[1].content or ""
    assert transcript.splitlines() == [
        "user: q",
        'assistant called lookup({"k": "c1"})',
        "tool result (c1): result c1",
        "assistant: r",
    ]


async def test_summarization_with_keep_last_zero_summarises_everything() -> None:
    client = ScriptedClient(["all of it"])
    window = await LLMSummarization(client, keep_last=0, trigger_messages=2).compact(
        long_history(3)
    )
    assert window == [SYS, ChatMessage.system("Summary of the earlier conversation:\nall of it")]


async def test_summarization_model_error_propagates_typed() -> None:
    error = ModelHTTPError(503, "busy", url="http://m/v1/chat/completions")
    client = ScriptedClient([error])
    strategy = LLMSummarization(client, keep_last=1, trigger_messages=2)
    with pytest.raises(ModelHTTPError) as caught:
        await strategy.compact(long_history(5))
    assert caught.value is error


async def test_summarization_empty_reply_is_a_response_error() -> None:
    client = ScriptedClient(["   "])
    strategy = LLMSummarization(client, keep_last=1, trigger_messages=2)
    with pytest.raises(ModelResponseError, match="the summarisation reply has no text"):
        await strategy.compact(long_history(5))


@pytest.mark.parametrize("seed", range(20))
async def test_summarization_invariants_on_random_histories(seed: int) -> None:
    rng = random.Random(2000 + seed)
    history = random_history(rng, rng.randrange(10, 40))
    snapshot = list(history)
    client = ScriptedClient(lambda messages, tools: "S" for _ in range(3))
    strategy = LLMSummarization(client, keep_last=4, trigger_messages=8)
    window = await strategy.compact(history)
    assert history == snapshot
    summaries = [m for m in window if (m.content or "").startswith("Summary of the earlier")]
    tail = [m for m in window if m not in summaries]
    assert_window_invariants(history, tail)
    assert [m for m in tail if m.role is Role.SYSTEM] == [
        m for m in history if m.role is Role.SYSTEM
    ]
    if sum(1 for m in history if m.role is not Role.SYSTEM) > 8:
        assert len(summaries) == 1
        kept = [m for m in tail if m.role is not Role.SYSTEM]
        assert len(kept) >= 4  # keep_last, more when the split moved before a turn


def test_summarization_is_a_compaction_strategy() -> None:
    for strategy in (
        SlidingWindow(3),
        TokenTruncation(100),
        LLMSummarization(ScriptedClient()),
    ):
        assert isinstance(strategy, CompactionStrategy)


@pytest.mark.parametrize(
    ("client", "kwargs", "match"),
    [
        ("not a client", {}, "client must be a LLMClient"),
        (ScriptedClient(), {"keep_last": -1}, "keep_last must be a non-negative integer"),
        (ScriptedClient(), {"trigger_messages": 0}, "trigger_messages must be a positive"),
        (ScriptedClient(), {"keep_last": 5, "trigger_messages": 5}, "keep_last must be below"),
        (ScriptedClient(), {"instructions": " "}, "instructions must be a non-empty string"),
    ],
)
def test_summarization_refuses_bad_arguments(
    client: Any, kwargs: dict[str, Any], match: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        LLMSummarization(client, **kwargs)
