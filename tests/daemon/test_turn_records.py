"""Turn records and their logs: the per-turn cap and its marker, the live fan-out's bounds,
the store tables (SQLite and PostgreSQL), and the service keeping a record per turn with the
log its harness wrote, scoped like every agent route."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from corral.daemon import AgentService, SQLiteStore
from corral.daemon._turn_log import (
    MAX_LINE_BYTES,
    SUBSCRIBER_CHARS,
    SUBSCRIBER_LINES,
    LogFanout,
    TurnLog,
    lines_of,
)
from corral.daemon._turn_records import clip_output
from corral.daemon.harnesses import TurnFailedError, TurnRequest, TurnResult
from corral.daemon.stores._turns import MemoryTurns, TurnStore
from tests.daemon.conftest import MakeService
from tests.support.front_door import FrontDoor

# --- the capped log ---------------------------------------------------------------------------


def test_lines_are_kept_up_to_the_cap_then_counted_with_a_marker() -> None:
    log = TurnLog("a_1", 1, cap=100)
    log.write("stdout", b"hello\nwor")
    log.write("stderr", "oops\n")
    log.write("stdout", b"ld\n")
    assert log.snapshot() == [
        {"stream": "stdout", "text": "hello\n"},
        {"stream": "stderr", "text": "oops\n"},
        {"stream": "stdout", "text": "world\n"},
    ]
    log.write("stdout", b"x" * 250 + b"\n")
    log.write("stdout", b"more\n")
    log.close()
    assert log.kept == 100
    assert log.dropped == 6 + 5 + 6 + 251 + 5 - 100
    last = log.snapshot()[-1]
    assert last == {
        "stream": "corral",
        "text": f"[corral: the turn's log was capped at 100 bytes: dropped {log.dropped} "
        "more bytes]\n",
    }
    log.write("stdout", b"after the end\n")
    assert log.snapshot()[-1] == last  # a closed log takes nothing


def test_a_line_without_end_is_cut_and_an_unfinished_one_kept_at_close() -> None:
    log = TurnLog("a_1", 1, cap=1 << 20)
    log.write("stdout", b"z" * (20 * 1024))  # longer than MAX_LINE_BYTES, no newline
    log.write("stderr", b"partial")
    log.close()
    texts = [(e["stream"], len(e["text"])) for e in log.snapshot()]
    assert texts == [("stdout", 16 * 1024), ("stdout", 4 * 1024), ("stderr", 7)]
    assert log.dropped == 0


def test_undecodable_bytes_and_nul_are_replaced() -> None:
    log = TurnLog("a_1", 1)
    log.write("stdout", b"\xff\x00ok\n")
    assert log.snapshot() == [{"stream": "stdout", "text": "\ufffd\ufffdok\n"}]


def test_entries_are_bounded_too() -> None:
    log = TurnLog("a_1", 1, cap=64 * 16)  # at most 16 entries
    for i in range(100):
        log.write("stdout" if i % 2 else "stderr", b"x\n")
    log.close()
    assert len(log.entries) == 17  # 16, then the marker
    assert log.dropped == 2 * (100 - 16)


def test_lines_of_splits_entries() -> None:
    entries = [{"stream": "stdout", "text": "a\nb\n"}, {"stream": "stderr", "text": "c"}]
    assert lines_of(entries, 3) == [
        {"turn": 3, "stream": "stdout", "text": "a"},
        {"turn": 3, "stream": "stdout", "text": "b"},
        {"turn": 3, "stream": "stderr", "text": "c"},
    ]


def test_clip_output_keeps_the_head_and_says_what_was_dropped() -> None:
    assert clip_output("short", 10) == "short"
    clipped = clip_output("é" * 10, 5)  # 20 bytes; a character is not cut in two
    assert clipped.startswith("éé\n[corral: output capped at 5 bytes: dropped 16 more bytes]")


# --- the fan-out ------------------------------------------------------------------------------


async def test_a_slow_follower_loses_lines_not_memory_and_is_told() -> None:
    fanout = LogFanout()
    follower = fanout.follow("a_1")
    for i in range(SUBSCRIBER_LINES + 500):
        fanout.publish("a_1", {"text": f"{i}\n"})
    assert len(follower.items) == SUBSCRIBER_LINES
    fanout.publish("a_2", {"text": "someone else's\n"})
    fanout.end("a_1")
    got = [item async for item in fanout.lines(follower)]
    assert len(got) == SUBSCRIBER_LINES + 1
    assert got[-1]["lagged"] == 500
    assert fanout.followers == 0


async def test_a_slow_follower_of_long_lines_is_bounded_by_their_size_too() -> None:
    # 1000 lines of 16 KiB each would be 16 MB held for each stalled reader.
    fanout = LogFanout()
    follower = fanout.follow("a_1")
    line = "x" * (MAX_LINE_BYTES - 1) + "\n"
    for _ in range(SUBSCRIBER_LINES):
        fanout.publish("a_1", {"text": line})
    held = sum(len(item["text"]) for item in follower.items)
    assert held <= SUBSCRIBER_CHARS
    fanout.end("a_1")
    got = [item async for item in fanout.lines(follower)]
    assert got[-1]["lagged"] == SUBSCRIBER_LINES - SUBSCRIBER_CHARS // len(line)
    assert follower.size == 0


async def test_a_follower_hears_of_its_lag_before_the_next_line() -> None:
    fanout = LogFanout()
    follower = fanout.follow("a_1")
    for i in range(SUBSCRIBER_LINES + 2):
        fanout.publish("a_1", {"text": f"{i}\n"})
    stream = fanout.lines(follower)
    for _ in range(SUBSCRIBER_LINES):
        await anext(stream)
    fanout.publish("a_1", {"text": "next\n"})
    assert (await anext(stream))["lagged"] == 2
    assert (await anext(stream))["text"] == "next\n"
    await stream.aclose()
    assert fanout.followers == 0


# --- the store tables -------------------------------------------------------------------------


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
        pytest.param("memory", id="memory"),
    ]
)
async def turn_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    if request.param == "memory":
        yield MemoryTurns
        return
    opened: list[Any] = []

    async def reopen() -> Any:
        if request.param == "sqlite":
            store: Any = SQLiteStore(tmp_path / "corral.db")
        else:
            from corral.daemon.stores import PostgresStore

            store = PostgresStore(request.getfixturevalue("postgres_dsn"))
        await store.open()
        opened.append(store)
        return store

    yield reopen
    for store in opened:
        await store.close()


def _record(agent: str, turn: int, **fields: Any) -> dict[str, Any]:
    return {"agentId": agent, "turn": turn, "outcome": "succeeded", **fields}


async def test_turn_tables_keep_records_and_logs_and_delete_them_with_the_agent(
    turn_store: Any,
) -> None:
    memory = turn_store is MemoryTurns
    store: Any = turn_store() if memory else await turn_store()
    assert isinstance(store, TurnStore)
    logs = [{"stream": "stdout", "text": "hi\n"}, {"stream": "stderr", "text": "é\n"}]
    for n in (1, 2, 3):
        await store.save_turn(_record("a_1", n, error=None), {"output": f"out {n}", "logs": logs})
    await store.save_turn(_record("a_2", 1), {"output": None, "logs": []})
    await store.save_turn(_record("a_1", 3, outcome="failed"), {"output": None, "logs": logs})
    if not memory:
        opened: Any = store
        await opened.close()
        store = await turn_store()  # they survive a restart
    listed = await store.list_turns("a_1")
    assert [(r["turn"], r["outcome"]) for r in listed] == [
        (3, "failed"),
        (2, "succeeded"),
        (1, "succeeded"),
    ]
    assert "output" not in listed[0]
    assert "logs" not in listed[0]
    assert [r["turn"] for r in await store.list_turns("a_1", before=3, limit=1)] == [2]
    record, detail = await store.get_turn("a_1", 2)
    assert record == _record("a_1", 2, error=None)
    assert detail == {"output": "out 2", "logs": logs}
    assert await store.get_turn("a_1", 9) is None
    assert await store.delete_turns("a_1") == 3
    assert await store.list_turns("a_1") == []
    assert await store.get_turn("a_1", 1) is None
    assert [r["agentId"] for r in await store.list_turns("a_2")] == ["a_2"]


# --- the service ------------------------------------------------------------------------------


class LoggingHarness:
    """Writes two lines to the turn's log, then answers from the prompt: ``fail`` fails."""

    def __init__(self) -> None:
        self.requests: list[TurnRequest] = []

    async def run_turn(self, request: TurnRequest) -> TurnResult:
        self.requests.append(request)
        assert request.log is not None
        request.log.write("stdout", f"working on {request.prompt}\n")
        request.log.write("stderr", b"a warning\n")
        if request.prompt == "fail":
            raise TurnFailedError("it broke")
        return TurnResult(output=f"done: {request.prompt}", tokens=7, cost_usd=0.5)

    async def reap(self, agent_id: str, state_dir: Path) -> bool:
        return False


async def test_the_service_keeps_a_record_per_turn_with_its_log(
    make_service: MakeService, sqlite_store: SQLiteStore
) -> None:
    service: AgentService = await make_service(sqlite_store, harness=LoggingHarness())
    spec = {"name": "w", "harness": "command", "command": ["x"], "prompt": "first"}
    agent = (await service.spawn(spec)).body["id"]
    await service.settled(agent)
    await service.prompt(agent, "fail")
    await service.settled(agent)
    listed = await service.turn_book.list(agent)
    assert [(t["turn"], t["outcome"], t["error"]) for t in listed] == [
        (2, "failed", "it broke"),
        (1, "succeeded", None),
    ]
    first = await service.turn_book.get(agent, 1)
    assert first is not None
    assert first["prompt"] == "first"
    assert first["usage"] == {"tokens": 7, "costUsd": 0.5}
    assert first["output"] == "done: first"
    assert first["logs"] == [
        {"stream": "stdout", "text": "working on first\n"},
        {"stream": "stderr", "text": "a warning\n"},
    ]
    assert first["startedAt"] <= first["endedAt"]
    assert await service.turn_book.delete(agent) == 2
    assert await service.turn_book.list(agent) == []


async def test_a_stopped_turn_is_interrupted_and_followers_end(
    make_service: MakeService, sqlite_store: SQLiteStore
) -> None:
    from tests.support.harness import ScriptedHarness

    harness = ScriptedHarness()
    harness.script("h", "hang")
    service: AgentService = await make_service(sqlite_store, harness=harness)
    agent = (
        await service.spawn({"name": "h", "harness": "command", "command": ["x"], "prompt": "p"})
    ).body["id"]
    follower = service.turn_book.fanout.follow(agent)
    live = service.turn_book.live(agent)
    assert live is not None
    assert live[0]["outcome"] == "running"
    await service.stop(agent)
    got = [item async for item in service.turn_book.fanout.lines(follower)]
    assert got[-1] == {"turn": 1, "event": "ended", "outcome": "interrupted"}
    (record,) = await service.turn_book.list(agent)
    assert (record["outcome"], record["error"]) == ("interrupted", "agent stopped")


# --- the routes -------------------------------------------------------------------------------


async def test_routes_are_scoped_like_every_agent_route(scoped_front: FrontDoor) -> None:
    door = scoped_front
    parent = await door.spawn(name="p", prompt="go")
    other = await door.spawn(name="o", prompt="go")
    await door.settled(parent, "idle")
    await door.settled(other, "idle")
    async with door.agent_client(parent) as api:
        mine = await api.get(f"/agents/{parent}/turns")
        assert mine.status_code == 200, mine.text
        assert [t["turn"] for t in mine.json()["turns"]] == [1]
        assert (await api.get(f"/agents/{parent}/turns/1")).status_code == 200
        assert (await api.get(f"/agents/{parent}/logs")).status_code == 200
        for path in ("turns", "turns/1", "logs", "logs?follow=true"):
            refused = await api.get(f"/agents/{other}/{path}")
            assert refused.status_code == 403, (path, refused.text)
            assert refused.json()["error"]["code"] == "out_of_scope"
    async with door.client() as api:
        missing = await api.get(f"/agents/{parent}/turns/5")
        assert missing.json()["error"]["code"] == "turn_not_found"
        bad = await api.get(f"/agents/{parent}/logs", params={"tail": "-1"})
        assert bad.status_code in (400, 422)
