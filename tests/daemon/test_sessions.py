"""Sessions in process: what the reducer keeps of an agent's turns, within its bounds and its
``history`` policy, what survives a reopen of either store, and what each harness is given
(the command harness's session file, the python harness's context, the openai harness's
prior messages, shaped by the spec's compaction)."""

from __future__ import annotations

import json
import os
import random
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from mcp import Client

from corral.daemon import (
    AgentService,
    CommandHarness,
    LocalApi,
    OpenAIHarness,
    PythonHarness,
    SQLiteStore,
    Store,
    TurnFailedError,
    TurnRequest,
    TurnResult,
    _sessions,
)
from corral.daemon import _events as ev
from corral.daemon._errors import InvalidSpecError, OutOfScopeError
from corral.daemon._events import Event, NewEvent
from corral.daemon._mcp import build_mcp_server
from corral.daemon._records import AgentRecord
from corral.daemon._spec import parse_spec
from corral.daemon._state import PROJECTIONS_VERSION, replay
from corral.daemon.harnesses._conversation import chat_history, strategy
from corral.daemon.stores import PostgresStore
from corral.kernel import Role
from corral.runtime import LLMSummarization, SlidingWindow, TokenTruncation
from tests.daemon.conftest import MakeService
from tests.support.harness import ScriptedHarness, fail
from tests.support.openai_server import OpenAIServer, completion, reply, tool_call

TS = "2026-01-01T00:00:00+00:00"


def spec(name: str = "w", **fields: Any) -> dict[str, Any]:
    return {"name": name, "harness": "command", "command": ["true"], **fields}


def record(agent_id: str, history: str = "run", **extra: Any) -> AgentRecord:
    """A record as ``agent.created`` carries it (enough of it for the reducer)."""
    found: dict[str, Any] = {
        "id": agent_id,
        "name": agent_id,
        "spec": {"history": history},
        "state": "running",
        "reason": None,
        "error": None,
        "parent": None,
        "runId": "r1",
        "rootId": agent_id,
        "children": [],
        "turns": 0,
        "turnInFlight": None,
        "consecutiveFailures": 0,
        "retriesUsed": 0,
        "lastPrompt": None,
        "lastOutput": None,
        "lastError": None,
        "usage": {"tokens": 0, "costUsd": 0.0, "turns": 0},
        "workdir": "/w",
        **extra,
    }
    return cast(AgentRecord, found)


def log(*events: NewEvent) -> list[Event]:
    return [Event(i, TS, e.type, e.agent_id, e.data) for i, e in enumerate(events, 1)]


def turn(agent_id: str, n: int, prompt: str, output: str) -> list[NewEvent]:
    return [
        ev.turn_started(agent_id, n, prompt, retry=False, notices=[]),
        ev.turn_completed(agent_id, n, output, {"tokens": 0}),
    ]


def contents(messages: Any) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in messages]


# --- the reducer ------------------------------------------------------------------------------


def test_turns_make_the_session_and_replay_gives_it_back() -> None:
    state = replay(
        log(
            ev.agent_created(record("a")),
            ev.turn_started("a", 1, "count the rows", retry=False, notices=[], text="[n]\n\ncount"),
            ev.turn_failed("a", 1, "no table rows", 1, None),
            *turn("a", 2, "the table is users_v2", "42"),
        )
    )
    assert contents(state.sessions["a"]) == [
        ("user", "[n]\n\ncount"),  # what the agent got, its notices in front
        ("error", "no table rows"),
        ("user", "the table is users_v2"),
        ("assistant", "42"),
    ]
    assert [m["turn"] for m in state.sessions["a"]] == [1, 1, 2, 2]
    assert state.snapshot()["sessions"] == {"a": state.sessions["a"]}


def test_history_none_keeps_nothing() -> None:
    state = replay(log(ev.agent_created(record("a", "none")), *turn("a", 1, "hi", "ok")))
    assert "a" not in state.sessions


def test_harness_messages_replace_the_output_and_cleared_removes_the_session() -> None:
    said: list[dict[str, Any]] = [
        {
            "role": "assistant",
            "content": "",
            "toolCalls": [{"id": "c1", "name": "ls", "arguments": "{}"}],
        },
        {"role": "tool", "content": "a.txt", "toolCallId": "c1", "name": "ls"},
        {"role": "assistant", "content": "one file"},
    ]
    events = [
        ev.agent_created(record("a")),
        ev.turn_started("a", 1, "list", retry=False, notices=[]),
        ev.turn_completed("a", 1, "one file", {"tokens": 3}, said),
    ]
    state = replay(log(*events))
    assert [m["role"] for m in state.sessions["a"]] == ["user", "assistant", "tool", "assistant"]
    assert state.sessions["a"][1]["toolCalls"][0]["name"] == "ls"
    assert state.sessions["a"][2]["toolCallId"] == "c1"
    state = replay(log(*events, ev.sessions_cleared("r1", ["a"], "run ended")))
    assert state.sessions == {}


def test_a_session_is_bounded_oldest_first_and_each_message_clipped() -> None:
    events: list[NewEvent] = [ev.agent_created(record("a"))]
    for n in range(1, _sessions.MAX_MESSAGES):
        events += turn("a", n, f"p{n}", f"o{n}")
    session = replay(log(*events)).sessions["a"]
    assert len(session) == _sessions.MAX_MESSAGES
    assert session[0]["content"] == f"p{_sessions.MAX_MESSAGES // 2}"
    assert session[-1]["content"] == f"o{_sessions.MAX_MESSAGES - 1}"

    big = "x" * (_sessions.MAX_MESSAGE_CHARS + 10)
    events = [ev.agent_created(record("a"))]
    for n in range(1, 30):
        events += turn("a", n, big, "ok")
    session = replay(log(*events)).sessions["a"]
    assert session[-2]["content"].endswith("[corral] 10 characters dropped")
    assert sum(_sessions.size(m) for m in session) <= _sessions.MAX_SESSION_CHARS
    assert len(session) < 58  # the oldest went for room


def test_a_bounded_session_never_opens_with_a_tool_result(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    call = {"id": "c", "name": "t", "arguments": "{}"}
    session: list[Any] = [
        _sessions.message("user", 1, "go", TS),
        {"role": "assistant", "turn": 1, "content": "", "at": TS, "toolCalls": [call]},
        {"role": "tool", "turn": 1, "content": "x" * 1000, "at": TS, "toolCallId": "c"},
        {"role": "tool", "turn": 1, "content": "y", "at": TS, "toolCallId": "c"},
        _sessions.message("assistant", 1, "done", TS),
    ]
    # Room for the last two messages only: the first of them is a tool result.
    room = _sessions.size(session[-1]) + _sessions.size(session[-2]) + 10
    monkeypatch.setattr(_sessions, "MAX_SESSION_CHARS", room)
    kept = _sessions.bounded(session)
    assert [m["role"] for m in kept] == ["assistant"]


def _plainly_appended(session: list[Any], new: list[Any]) -> list[Any]:
    """``_sessions.appended`` as a plain walk: every message of the session added up again at
    each append. What the session's kept size must agree with."""
    n = session[-1].get("n", len(session)) if session else 0
    numbered = list(session)
    for message in new:
        n += 1
        numbered.append({**message, "n": n})
    total = sum(_sessions.size(m) for m in numbered)
    start = 0
    while start < len(numbered) and (
        len(numbered) - start > _sessions.MAX_MESSAGES or total > _sessions.MAX_SESSION_CHARS
    ):
        total -= _sessions.size(numbered[start])
        start += 1
    while start < len(numbered) and numbered[start]["role"] == "tool":
        start += 1
    return numbered[start:]


@pytest.mark.parametrize("seed", range(4))
def test_appending_keeps_what_adding_up_the_whole_session_each_time_keeps(
    monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    monkeypatch.setattr(_sessions, "MAX_MESSAGES", 12)
    monkeypatch.setattr(_sessions, "MAX_SESSION_CHARS", 1500)
    rng = random.Random(seed)
    call = {"id": "c", "name": "t", "arguments": "{}"}
    session: list[Any] = []
    expected: list[Any] = []
    for turn_n in range(1, 200):
        new: list[Any] = []
        for _ in range(rng.randint(1, 4)):
            role = rng.choice(["user", "assistant", "tool", "error"])
            message: dict[str, Any] = {
                "role": role,
                "turn": turn_n,
                "content": "x" * rng.choice([0, 5, 100, 700]),
                "at": TS,
            }
            if role == "tool":
                message["toolCallId"] = "c"
            elif role == "assistant" and rng.random() < 0.3:
                message["toolCalls"] = [call] * rng.randint(1, 3)
            new.append(message)
        session = _sessions.appended(session, new)
        expected = _plainly_appended(expected, new)
        assert session == expected
    # A session changed in place (no code does) is added up again, not taken at its word.
    grown = _sessions.appended(session, [_sessions.message("user", 300, "go", TS)])
    grown.extend(_sessions.message("user", 300, "y" * 400, TS) for _ in range(6))
    assert _sessions.appended(grown, []) == _plainly_appended(list(grown), [])


def test_turn_messages_keep_only_well_formed_storable_messages() -> None:
    raw: list[Any] = [
        "junk",
        {"role": "tool", "content": "orphan at the front", "toolCallId": "z"},
        {"role": "system", "content": "not from a harness"},
        {"role": "tool", "content": "no call id"},
        {
            "role": "assistant",
            "content": "bad\udc80\x00",
            "toolCalls": [{"id": "c", "name": "t", "arguments": 5}, {"id": 1}],
        },
        {"role": "tool", "content": None, "toolCallId": "c", "name": "t"},
    ]
    kept = _sessions.turn_messages(raw)
    assert kept == [
        {
            "role": "assistant",
            "content": "bad\ufffd\ufffd",
            "toolCalls": [{"id": "c", "name": "t", "arguments": "{}"}],
        },
        {"role": "tool", "content": "", "toolCallId": "c", "name": "t"},
    ]
    many = [{"role": "assistant", "content": str(i)} for i in range(200)]
    assert len(_sessions.turn_messages(many)) == _sessions.MAX_TURN_MESSAGES
    assert _sessions.turn_messages(many)[-1]["content"] == "199"
    assert _sessions.turn_messages("nope") == []


def test_a_turn_logs_no_more_than_a_session_could_keep_of_it() -> None:
    # One model reply may carry any number of tool calls: 10k calls of 2 KB each, with their
    # results, made a 40 MB turn_completed event, though the session keeps 256 KB.
    calls = [{"id": f"c{i}", "name": "t", "arguments": "x" * 2000} for i in range(10_000)]
    raw: list[Any] = [{"role": "assistant", "content": "", "toolCalls": calls}]
    raw += [{"role": "tool", "content": "y" * 2000, "toolCallId": f"c{i}"} for i in range(60)]
    raw.append({"role": "assistant", "content": "done"})
    kept = _sessions.turn_messages(raw)
    assert len(json.dumps(kept)) < 2 * _sessions.MAX_SESSION_CHARS
    assert sum(_sessions.size(m) for m in kept) <= _sessions.MAX_SESSION_CHARS
    assert kept[-1] == {"role": "assistant", "content": "done"}
    assert kept[0]["role"] == "assistant"
    assert len(kept[0]["toolCalls"]) == _sessions.MAX_TURN_CALLS


# --- the spec ---------------------------------------------------------------------------------


def test_history_and_compaction_fields() -> None:
    assert parse_spec(spec()).history == "run"
    openai: dict[str, Any] = {"harness": "openai", "openai": {"baseUrl": "http://x", "model": "m"}}
    got = parse_spec(
        spec(**openai, command=None, compaction={"strategy": "window", "maxMessages": 8})
    )
    assert got.compaction is not None
    assert got.compaction.max_messages == 8
    with pytest.raises(InvalidSpecError) as caught:
        parse_spec(spec(history="forever", compaction={"strategy": "window"}))
    fields = {p["field"] for p in caught.value.problems}
    assert {"history"} <= fields
    with pytest.raises(InvalidSpecError) as caught:
        parse_spec(
            spec(
                **openai,
                command=None,
                compaction={"strategy": "summarize", "maxTokens": 5, "keepLast": 30},
            )
        )
    assert {p["field"] for p in caught.value.problems} == {
        "compaction.maxTokens",
        "compaction.keepLast",
    }
    with pytest.raises(InvalidSpecError) as caught:
        parse_spec(spec(compaction={"strategy": "window"}))
    assert [p["field"] for p in caught.value.problems] == ["compaction"]


# --- the service ------------------------------------------------------------------------------


async def test_a_correction_continues_the_session_of_a_failed_turn(
    service: AgentService, harness: ScriptedHarness
) -> None:
    harness.script("w", fail("relation users does not exist"), "42 rows")
    agent_id = (await service.spawn(spec(prompt="count the users", onFailure="ask"))).body["id"]
    await service.settled(agent_id)
    assert service.get(agent_id)["state"] == "blocked"
    await service.prompt(agent_id, "the table is called users_v2, try again")
    await service.settled(agent_id)
    second = harness.requests[-1]
    assert second.prompt == "the table is called users_v2, try again"
    assert contents(second.session) == [
        ("user", "count the users"),
        ("error", "relation users does not exist"),
    ]
    assert harness.requests[0].session == ()
    assert contents(service.session(agent_id)["messages"])[-2:] == [
        ("user", "the table is called users_v2, try again"),
        ("assistant", "42 rows"),
    ]


async def test_a_retry_sees_the_attempt_before_and_notices_are_kept_as_sent(
    service: AgentService, harness: ScriptedHarness
) -> None:
    harness.script("w", fail("flaky"), "fine")
    agent_id = (await service.spawn(spec(prompt="go", onFailure="retry", maxRetries=1))).body["id"]
    await service.settled(agent_id)
    assert contents(harness.requests[1].session) == [("user", "go"), ("error", "flaky")]
    parent = (await service.spawn(spec("boss"))).body["id"]
    child = (await service.spawn(spec("kid", parent=parent, prompt="x", notifyOn=["done"]))).body[
        "id"
    ]
    await service.settled(child)
    await service.prompt(parent, "report")
    await service.settled(parent)
    sent = harness.requests[-1].prompt
    assert sent.startswith("[corral] notices since your last turn:")
    assert sent.endswith("report")
    assert service.session(parent)["messages"][0]["content"] == sent


async def test_history_none_gives_a_turn_its_own_prompt_only(
    service: AgentService, harness: ScriptedHarness
) -> None:
    agent_id = (await service.spawn(spec(prompt="one", history="none"))).body["id"]
    await service.settled(agent_id)
    await service.prompt(agent_id, "two")
    await service.settled(agent_id)
    assert harness.requests[-1].session == ()
    assert service.session(agent_id) == {"agentId": agent_id, "history": "none", "messages": []}


async def test_run_history_is_deleted_when_the_run_ends_and_permanent_is_kept(
    service: AgentService, sqlite_store: SQLiteStore
) -> None:
    root = (await service.spawn(spec("root", prompt="lead"))).body["id"]
    kid = (await service.spawn(spec("kid", parent=root, prompt="work"))).body["id"]
    kept = (
        await service.spawn(spec("keeper", parent=root, prompt="note", history="permanent"))
    ).body["id"]
    await service.settled()
    await service.stop(kid)
    assert service.session(kid)["messages"]  # its run goes on
    await service.stop(kept)
    await service.stop(root)
    assert service.session(root)["messages"] == []
    assert service.session(kid)["messages"] == []
    assert contents(service.session(kept)["messages"]) == [("user", "note"), ("assistant", "ok")]
    cleared = [e for e in await service.events() if e.type == ev.SESSIONS_CLEARED]
    assert [e.data for e in cleared] == [
        {"runId": service.get(root)["runId"], "agents": sorted([root, kid]), "reason": "run ended"}
    ]
    assert (await sqlite_store.replay()).snapshot() == sqlite_store.state.snapshot()


async def test_scoped_reads_of_a_session(front: Any) -> None:
    api: LocalApi = front.api
    parent = (await api.spawn(spec("p", prompt="hi")))["id"]
    child = (await api.spawn(spec("c", parent=parent)))["id"]
    other = (await api.spawn(spec("o")))["id"]
    await front.service.settled()
    mine = api.as_agent(parent)
    assert contents((await mine.session(parent))["messages"]) == [
        ("user", "hi"),
        ("assistant", "ok"),
    ]
    assert (await mine.session(child))["messages"] == []
    with pytest.raises(OutOfScopeError):
        await mine.session(other)
    with pytest.raises(OutOfScopeError):
        await api.as_agent(child).session(parent)


async def test_session_get_over_mcp(front: Any) -> None:
    agent_id = (await front.api.spawn(spec(prompt="hi")))["id"]
    await front.service.settled()
    async with Client(build_mcp_server(front.api)) as client:
        result = await client.call_tool("session_get", {"agentId": agent_id})
        assert isinstance(result.structured_content, dict)
        assert result.structured_content["agentId"] == agent_id
        assert contents(result.structured_content["messages"]) == [
            ("user", "hi"),
            ("assistant", "ok"),
        ]
        assert (await client.call_tool("session_get", {"agentId": "a_00000000"})).is_error


async def test_get_session_over_http(front: Any) -> None:
    agent_id = (await front.api.spawn(spec(prompt="hi")))["id"]
    await front.service.settled()
    transport = httpx.ASGITransport(app=front.app())
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        answer = await client.get(f"/agents/{agent_id}/session")
        assert answer.status_code == 200
        assert answer.json()["history"] == "run"
        assert contents(answer.json()["messages"]) == [("user", "hi"), ("assistant", "ok")]
        assert (await client.get("/agents/a_nobody/session")).status_code == 404


# --- the stores -------------------------------------------------------------------------------


async def _filled(service: AgentService) -> str:
    agent_id = (await service.spawn(spec(prompt="first", history="permanent"))).body["id"]
    await service.settled(agent_id)
    await service.prompt(agent_id, "second")
    await service.settled(agent_id)
    return str(agent_id)


async def test_sessions_survive_a_reopen_and_a_rebuild_of_the_projections(
    make_service: MakeService, open_sqlite: Any, tmp_path: Path
) -> None:
    store = await open_sqlite()
    service = await make_service(store)
    agent_id = await _filled(service)
    before = store.state.snapshot()
    await service.close()
    await store.close()
    reopened = await open_sqlite()
    assert reopened.state.snapshot() == before
    assert len(reopened.state.sessions[agent_id]) == 4
    await reopened.close()
    # A store whose projections an older reducer wrote rebuilds them, sessions included.
    with sqlite3.connect(tmp_path / "corral.db") as conn:
        conn.execute("DELETE FROM session_messages")
        conn.execute("UPDATE meta SET value = '2' WHERE key = 'projections'")
    conn.close()
    rebuilt = await open_sqlite()
    assert rebuilt.state.snapshot() == before
    with sqlite3.connect(tmp_path / "corral.db") as conn:
        (version,) = conn.execute("SELECT value FROM meta WHERE key = 'projections'").fetchone()
    conn.close()
    assert int(version) == PROJECTIONS_VERSION


def test_row_changes_write_only_what_is_new() -> None:
    def msgs(*ns: int) -> list[Any]:
        return [{"role": "user", "turn": n, "content": "", "at": TS, "n": n} for n in ns]

    grown = _sessions.row_changes(msgs(1, 2), msgs(1, 2, 3, 4))
    assert (grown.clear, grown.drop_below, [m["n"] for m in grown.insert]) == (False, None, [3, 4])
    moved = _sessions.row_changes(msgs(1, 2, 3), msgs(3, 4))
    assert (moved.clear, moved.drop_below, [m["n"] for m in moved.insert]) == (False, 3, [4])
    assert _sessions.row_changes(msgs(1), None).clear
    again = _sessions.row_changes(msgs(5, 6), msgs(1))
    assert (again.clear, [m["n"] for m in again.insert]) == (True, [1])
    fresh = _sessions.row_changes([], msgs(1, 2))
    assert (fresh.clear, fresh.drop_below, len(fresh.insert)) == (False, None, 2)


@pytest.mark.parametrize(
    "kind", [pytest.param("sqlite"), pytest.param("postgres", marks=pytest.mark.postgres)]
)
async def test_a_store_keeps_one_row_per_message_of_a_bounded_session(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_sessions, "MAX_MESSAGES", 5)

    def open_one() -> Store:
        if kind == "sqlite":
            return SQLiteStore(tmp_path / "c.db")
        return PostgresStore(request.getfixturevalue("postgres_dsn"))

    store = open_one()
    await store.open()
    try:
        await store.append([ev.agent_created(record("a")), ev.agent_created(record("b"))])
        for n in range(1, 5):
            await store.append([*turn("a", n, f"p{n}", f"o{n}"), *turn("b", n, "x", "y")])
        await store.append([ev.sessions_cleared("r1", ["b"], "run ended")])
        assert [m["n"] for m in store.state.sessions["a"]] == [4, 5, 6, 7, 8]
        again = open_one()
        await again.open()
        try:
            assert again.state.snapshot() == store.state.snapshot()
            assert (await again.replay()).snapshot() == store.state.snapshot()
        finally:
            await again.close()
    finally:
        await store.close()
    if kind == "sqlite":
        with sqlite3.connect(tmp_path / "c.db") as conn:
            rows = conn.execute("SELECT agent_id, n FROM session_messages").fetchall()
        conn.close()
        assert sorted(rows) == [("a", n) for n in range(4, 9)]


@pytest.mark.postgres
async def test_postgres_keeps_and_deletes_sessions(
    make_service: MakeService, postgres_dsn: str
) -> None:
    store = PostgresStore(postgres_dsn)
    await store.open()
    try:
        service = await make_service(store)
        agent_id = await _filled(service)
        kid = (await service.spawn(spec("kid", prompt="x"))).body["id"]
        await service.settled(kid)
        await service.stop(kid)  # its own run: ended, its session deleted
        await service.close()
        again = PostgresStore(postgres_dsn)
        await again.open()
        try:
            assert again.state.snapshot() == store.state.snapshot()
            assert len(again.state.sessions[agent_id]) == 4
            assert kid not in again.state.sessions
            assert (await again.replay()).snapshot() == again.state.snapshot()
        finally:
            await again.close()
    finally:
        await store.close()


# --- the harnesses ----------------------------------------------------------------------------

SESSION = (
    _sessions.message("user", 1, "count the users", TS),
    _sessions.message("error", 1, "no such table", TS),
)


def turn_request(tmp_path: Path, data: dict[str, Any], **fields: Any) -> TurnRequest:
    (tmp_path / "work").mkdir(exist_ok=True)
    (tmp_path / "state").mkdir(exist_ok=True)
    return TurnRequest(
        agent_id="a_5e55",
        turn=2,
        prompt=fields.pop("prompt", "users_v2"),
        spec=parse_spec(data),
        workdir=tmp_path / "work",
        state_dir=tmp_path / "state",
        timeout_s=20.0,
        session=fields.pop("session", SESSION),
        **fields,
    )


async def test_the_command_harness_writes_the_session_file(tmp_path: Path) -> None:
    script = 'cat "$CORRAL_SESSION_FILE"; echo "prompt: $(cat)"; stat -c %a "$CORRAL_SESSION_FILE"'
    request = turn_request(tmp_path, spec(command=["sh", "-c", script]))
    output = (await CommandHarness().run_turn(request)).output.splitlines()
    assert [json.loads(line) for line in output[:2]] == list(SESSION)
    assert output[2:] == ["prompt: users_v2", "600"]
    # The session file is removed once the turn is over (the heartbeat file is kept).
    assert [p.name for p in (tmp_path / "state").iterdir()] == ["heartbeat"]
    empty = turn_request(tmp_path, spec(command=["sh", "-c", script]), session=())
    assert (await CommandHarness().run_turn(empty)).output == "prompt: users_v2\n600\n"


async def test_the_python_harness_puts_the_session_in_its_context(tmp_path: Path) -> None:
    data = {"name": "p", "harness": "python", "function": "tests.daemon.workers.session_funcs:echo"}
    harness = PythonHarness()
    try:
        result = await harness.run_turn(turn_request(tmp_path, data))
    finally:
        await harness.aclose()
    assert json.loads(result.output) == {"prompt": "users_v2", "session": list(SESSION)}


def openai_spec(server: OpenAIServer, **fields: Any) -> dict[str, Any]:
    return {
        "name": "model",
        "harness": "openai",
        "openai": {"baseUrl": server.base_url, "model": "m", "instructions": "be brief"},
        **fields,
    }


async def test_the_openai_harness_sends_the_session_and_returns_the_turns_messages(
    tmp_path: Path, openai_server: OpenAIServer
) -> None:
    tool = {"name": "ls", "command": ["sh", "-c", "echo a.txt"]}
    data = openai_spec(openai_server)
    data["openai"]["tools"] = [tool]
    openai_server.enqueue(
        completion(tool_calls=[tool_call("ls", {}, id="c1")], usage=(10, 2)),
        completion("one file", usage=(12, 3)),
    )
    result = await OpenAIHarness().run_turn(turn_request(tmp_path, data))
    sent = openai_server.requests[0].json["messages"]
    assert [(m["role"], m["content"]) for m in sent] == [
        ("system", "be brief"),
        ("user", "count the users"),
        ("user", "[corral] turn 1 failed: no such table"),
        ("user", "users_v2"),
    ]
    assert [m["role"] for m in result.messages] == ["assistant", "tool", "assistant"]
    assert result.messages[0]["toolCalls"][0]["name"] == "ls"
    assert result.messages[1] == {
        "role": "tool",
        "content": "a.txt\n",
        "toolCallId": "c1",
        "name": "ls",
    }
    assert result.messages[2]["content"] == "one file"


async def test_a_failed_openai_turn_keeps_what_it_said_before_it_failed(
    tmp_path: Path, openai_server: OpenAIServer, make_service: MakeService, open_sqlite: Any
) -> None:
    tool = {"name": "ls", "command": ["sh", "-c", "echo a.txt"]}
    data = openai_spec(openai_server)
    data["openai"]["tools"] = [tool]
    openai_server.enqueue(
        completion(tool_calls=[tool_call("ls", {}, id="c1")], usage=(10, 2)),
        reply({"error": "down"}, status=500),
    )
    with pytest.raises(TurnFailedError) as caught:
        await OpenAIHarness().run_turn(turn_request(tmp_path, data, session=()))
    assert [m["role"] for m in caught.value.messages] == ["assistant", "tool"]

    # Through the service: the session holds the tool call and its result before the error.
    openai_server.enqueue(
        completion(tool_calls=[tool_call("ls", {}, id="c2")], usage=(10, 2)),
        reply({"error": "down"}, status=500),
    )
    service = await make_service(await open_sqlite(), harnesses={"openai": OpenAIHarness()})
    agent_id = (await service.spawn({**data, "prompt": "list", "onFailure": "ask"})).body["id"]
    await service.settled(agent_id)
    messages = service.session(agent_id)["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "error"]
    assert messages[2]["content"] == "a.txt\n"


async def test_compaction_shapes_what_the_model_gets(
    tmp_path: Path, openai_server: OpenAIServer
) -> None:
    long = tuple(_sessions.message("user", n, f"m{n}", TS) for n in range(1, 11))
    window = openai_spec(openai_server, compaction={"strategy": "window", "maxMessages": 3})
    openai_server.enqueue(completion("ok", usage=(1, 1)))
    await OpenAIHarness().run_turn(turn_request(tmp_path, window, session=long))
    sent = openai_server.requests[-1].json["messages"]
    assert [m["content"] for m in sent] == ["be brief", "m8", "m9", "m10", "users_v2"]

    summarize = openai_spec(
        openai_server, compaction={"strategy": "summarize", "keepLast": 2, "triggerMessages": 4}
    )
    openai_server.enqueue(
        completion("they said m1..m8", usage=(50, 7)), completion("ok", usage=(5, 1))
    )
    result = await OpenAIHarness().run_turn(turn_request(tmp_path, summarize, session=long))
    summary_call, turn_call = openai_server.requests[-2:]
    assert "m1" in summary_call.json["messages"][-1]["content"]
    assert [m["content"] for m in turn_call.json["messages"]][-3:] == ["m9", "m10", "users_v2"]
    assert "they said m1..m8" in turn_call.json["messages"][1]["content"]
    assert result.tokens == 57 + 6  # the summary is paid by the turn


def test_strategies_map_to_the_runtimes() -> None:
    from corral.runtime import OpenAIClient

    client = OpenAIClient("http://127.0.0.1:9", "m")
    made = [
        strategy(parse_spec(s).compaction, client)
        for s in (
            {**openai_spec_plain(), "compaction": {"strategy": "window"}},
            {**openai_spec_plain(), "compaction": {"strategy": "truncate", "maxTokens": 99}},
            {**openai_spec_plain(), "compaction": {"strategy": "summarize"}},
        )
    ]
    assert isinstance(made[0], SlidingWindow)
    assert made[0].max_messages == 40
    assert isinstance(made[1], TokenTruncation)
    assert made[1].max_tokens == 99
    assert isinstance(made[2], LLMSummarization)
    assert made[2].keep_last == 6
    assert strategy(None, client) is None


def openai_spec_plain() -> dict[str, Any]:
    return {"name": "m", "harness": "openai", "openai": {"baseUrl": "http://x", "model": "m"}}


def test_chat_history_mends_what_an_api_would_refuse() -> None:
    call = {"id": "c1", "name": "t", "arguments": "not json"}
    lost = {"id": "c2", "name": "t", "arguments": "{}"}
    session: Any = [
        {"role": "tool", "turn": 1, "content": "orphan", "at": TS, "toolCallId": "zz"},
        {"role": "assistant", "turn": 1, "content": "", "at": TS, "toolCalls": [call, lost]},
        {"role": "tool", "turn": 1, "content": "r1", "at": TS, "toolCallId": "c1"},
        {"role": "assistant", "turn": 1, "content": "", "at": TS, "toolCalls": [lost]},
        {"role": "assistant", "turn": 1, "content": "done", "at": TS},
    ]
    messages = chat_history(session)
    assert [m.role for m in messages] == [Role.ASSISTANT, Role.TOOL, Role.ASSISTANT]
    assert [c.id for c in messages[0].tool_calls] == ["c1"]
    assert messages[0].tool_calls[0].invalid_arguments == "not json"
    assert messages[2].content == "done"


# --- a fast harness that records what it was given -------------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.seen: list[TurnRequest] = []

    async def run_turn(self, request: TurnRequest) -> TurnResult:
        self.seen.append(request)
        return TurnResult(output=f"done {request.turn}")

    async def reap(self, agent_id: str, state_dir: Path) -> bool:
        return False


@pytest.fixture
async def restartable(tmp_path: Path) -> AsyncIterator[list[Store]]:
    opened: list[Store] = []
    yield opened
    for store in opened:
        await store.close()


async def test_after_a_restart_the_next_turn_gets_the_session(
    tmp_path: Path, restartable: list[Store]
) -> None:
    store = SQLiteStore(tmp_path / "c.db")
    restartable.append(store)
    await store.open()
    first = AgentService(store, home=tmp_path / "h", harnesses={"command": Recorder()})
    await first.start()
    agent_id = (await first.spawn(spec(prompt="remember 7"))).body["id"]
    await first.settled()
    await first.close()
    await store.close()
    store = SQLiteStore(tmp_path / "c.db")
    restartable.append(store)
    await store.open()
    recorder = Recorder()
    second = AgentService(store, home=tmp_path / "h", harnesses={"command": recorder})
    await second.start()
    try:
        await second.prompt(agent_id, "what was it?")
        await second.settled()
    finally:
        await second.close()
    assert contents(recorder.seen[0].session) == [("user", "remember 7"), ("assistant", "done 1")]


@pytest.mark.timeout(10)
async def test_a_fifo_the_agent_left_for_the_session_file_cannot_block_the_daemon(
    tmp_path: Path,
) -> None:
    # A command agent can write in its state directory (its heartbeat file is there): a FIFO
    # where the session file's temp file goes made the next turn's open block the event loop.
    state = tmp_path / "state"
    state.mkdir()
    os.mkfifo(state / "session.jsonl.tmp")
    (tmp_path / "elsewhere").write_text("kept")
    os.symlink(tmp_path / "elsewhere", state / "session.jsonl")
    script = 'cat "$CORRAL_SESSION_FILE"'
    request = turn_request(tmp_path, spec(command=["sh", "-c", script]))
    output = (await CommandHarness().run_turn(request)).output.splitlines()
    assert [json.loads(line) for line in output] == list(SESSION)
    assert (tmp_path / "elsewhere").read_text() == "kept"  # a link is replaced, not followed
