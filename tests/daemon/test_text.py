"""Text the daemon takes and keeps: lone surrogates, NUL and control characters are refused at
every door (HTTP bodies, query and path parameters, MCP arguments), text from harnesses is
stored escaped, and a store refuses what it cannot keep, the same on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mcp import Client

from corral.daemon import (
    AgentService,
    NewEvent,
    SQLiteStore,
    Store,
    TurnResult,
    UnstorableValueError,
    build_mcp_server,
    create_app,
)
from corral.daemon._text import text_problem, unstorable
from corral.daemon.stores import PostgresStore
from tests.daemon.conftest import MakeService
from tests.support.front_door import FrontDoor
from tests.support.harness import ScriptedHarness, fail

WORKER = {"name": "w", "harness": "command", "command": ["worker"]}
JSON = {"content-type": "application/json"}


def problems(response: httpx.Response, code: str) -> dict[str, str]:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == code, error
    return {p["field"]: p["message"] for p in error["details"]["problems"]}


# --- the HTTP door -------------------------------------------------------------------------


async def test_a_lone_surrogate_in_a_spawn_is_refused_and_creates_nothing(
    front: FrontDoor,
) -> None:
    # The JSON escape of a lone surrogate: valid JSON, but no UTF-8 text can hold it.
    body = (
        b'{"name": "w", "harness": "command", "command": ["worker"], "prompt": "half \\ud800 pair"}'
    )
    async with front.client() as client:
        answer = await client.post("/agents", content=body, headers=JSON)
        found = problems(answer, "invalid_spec")
        assert list(found) == ["prompt"]
        assert "lone surrogates (U+D800)" in found["prompt"]
        listed = await client.get("/agents")
    assert listed.status_code == 200
    assert listed.json() == {"agents": [], "nextCursor": None}
    assert front.harness.requests == []


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({**WORKER, "prompt": "a\u0000b"}, "prompt"),
        ({**WORKER, "env": {"K": "v"}, "prompt": "x", "name": "bad\u001b[31m"}, "name"),
        ({**WORKER, "name": "two\nlines"}, "name"),
        ({**WORKER, "name": "hidden\u202eevil"}, "name"),
        ({**WORKER, "idempotencyKey": "k\u0007"}, "idempotencyKey"),
    ],
)
async def test_spawn_refuses_nul_anywhere_and_control_characters_in_names(
    front: FrontDoor, body: dict[str, Any], field: str
) -> None:
    async with front.client() as client:
        answer = await client.post("/agents", json=body)
    found = problems(answer, "invalid_spec")
    assert field in found
    assert "must not contain" in found[field]
    assert front.service.list_agents() == []


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"text": "a\u0000b"}, "text"),
        ({"text": "ok", "by": "ops\u001b]0;pwned\u0007"}, "by"),
        ({"text": "ok", "why": "nul \u0000 here"}, "why"),
        ({"text": "ok", "idempotencyKey": "nul\u0000A"}, "idempotencyKey"),
    ],
)
async def test_command_bodies_refuse_nul_and_control_characters_in_identifiers(
    front: FrontDoor, body: dict[str, Any], field: str
) -> None:
    agent_id = await front.spawn(name="w")
    async with front.client() as client:
        answer = await client.post(f"/agents/{agent_id}/prompt", json=body)
        stopped = await client.post(f"/agents/{agent_id}/stop", json={"by": "ops\ninjected"})
    assert field in problems(answer, "invalid_request")
    assert "by" in problems(stopped, "invalid_request")
    assert front.harness.requests == []
    assert front.state(agent_id) == "idle"


async def test_a_lone_surrogate_in_a_command_body_names_the_field(front: FrontDoor) -> None:
    agent_id = await front.spawn(name="w")
    async with front.client() as client:
        answer = await client.post(
            f"/agents/{agent_id}/prompt", content=b'{"text": "x\\udcff"}', headers=JSON
        )
    found = problems(answer, "invalid_request")
    assert "lone surrogates (U+DCFF)" in found["text"]


async def test_query_and_path_parameters_are_checked(front: FrontDoor) -> None:
    async with front.client() as client:
        nul_agent = await client.get("/events", params={"format": "json", "agent": "a\u0000"})
        escape_path = await client.get("/agents/a_%1b%5b2J")
    assert "agent" in problems(nul_agent, "invalid_request")
    assert "agent_id" in problems(escape_path, "invalid_request")


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/healthz", {"verbose": "1"}),
        ("/agents", {"status": "idle"}),
        ("/events", {"format": "json", "formt": "json"}),
        ("/decisions", {"resolve": "true"}),
        ("/gateway", {"x": ""}),
    ],
)
async def test_unknown_query_parameters_are_refused(
    front: FrontDoor, path: str, params: dict[str, str]
) -> None:
    async with front.client() as client:
        answer = await client.get(path, params=params)
    found = problems(answer, "invalid_request")
    unknown = [name for name in params if name not in {"format"}]
    assert list(found) == unknown
    assert "unknown query parameter" in found[unknown[0]]


async def test_declared_query_parameters_are_still_taken(front: FrontDoor) -> None:
    async with front.client() as client:
        page = await client.get("/events", params={"format": "json", "after": 0, "limit": 5})
        decisions = await client.get("/decisions", params={"resolved": "true"})
    assert page.status_code == 200, page.text
    assert decisions.status_code == 200, decisions.text


# --- the MCP door --------------------------------------------------------------------------


async def test_mcp_arguments_follow_the_same_rules(front: FrontDoor) -> None:
    agent_id = await front.spawn(name="w")
    async with Client(build_mcp_server(front.api)) as client:
        nul = await client.call_tool("agent_prompt", {"agentId": agent_id, "text": "a\u0000"})
        by = await client.call_tool("agent_stop", {"agentId": agent_id, "by": "x\u001b[2J"})
        spec = await client.call_tool("agent_spawn", {"spec": {**WORKER, "name": "a\nb"}})
    for result, code, field in (
        (nul, "invalid_request", "text"),
        (by, "invalid_request", "by"),
        (spec, "invalid_spec", "name"),
    ):
        assert result.is_error
        error = (result.structured_content or {})["error"]
        assert error["code"] == code, error
        assert [p["field"] for p in error["details"]["problems"]] == [field]
    assert front.state(agent_id) == "idle"
    assert front.harness.requests == []


# --- what harnesses return, on both stores, across a restart -------------------------------


StoreFactory = Callable[[], Store]


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ]
)
def new_store(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    if request.param == "sqlite":
        return lambda: SQLiteStore(tmp_path / "corral.db")
    dsn = request.getfixturevalue("postgres_dsn")
    return lambda: PostgresStore(dsn)


@pytest.fixture
async def opened(new_store: StoreFactory) -> AsyncIterator[list[Store]]:
    stores: list[Store] = []
    yield stores
    for store in reversed(stores):
        await store.close()


async def _open(new_store: StoreFactory, opened: list[Store]) -> Store:
    store = new_store()
    opened.append(store)
    await store.open()
    return store


async def _read_everything(service: AgentService) -> list[Any]:
    """Every read a client makes, through the HTTP app, as JSON (each must answer 200)."""
    transport = httpx.ASGITransport(app=create_app(service))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        answers = [await client.get("/agents"), await client.get("/events?format=json")]
        for agent in answers[0].json()["agents"]:
            answers.append(await client.get(f"/agents/{agent['id']}"))
            answers.append(await client.get(f"/events?format=json&agent={agent['id']}"))
    for answer in answers:
        assert answer.status_code == 200, answer.text
    return [answer.json() for answer in answers]


async def test_harness_output_and_errors_are_stored_escaped_and_read_back(
    new_store: StoreFactory,
    opened: list[Store],
    make_service: MakeService,
    harness: ScriptedHarness,
) -> None:
    store = await _open(new_store, opened)
    service = await make_service(store)
    # A surrogate-escaped byte (what a python agent decoding bytes may return), NUL, and a
    # failure whose message holds both.
    harness.script("w", TurnResult(output="x\udcff\u0000y"), fail("bad \ud800 and \u0000"))
    agent = (await service.spawn({**WORKER, "prompt": "go", "onFailure": "ask"})).body
    await service.settled(agent["id"])
    await service.prompt(agent["id"], "again")
    await service.settled(agent["id"])
    record = service.get(agent["id"])
    assert record["lastOutput"] == "x\ufffd\ufffdy"
    assert record["error"] == "bad \ufffd and \ufffd"
    before = await _read_everything(service)
    # Everything stored reads back, and after a restart (a new store over the same data)
    # the replayed log equals the projections.
    await service.close()
    await store.close()
    again = await _open(new_store, opened)
    assert (await again.replay()).snapshot() == again.state.snapshot()
    restarted = await make_service(again)
    assert await _read_everything(restarted) == before
    json.dumps(before, ensure_ascii=False).encode()  # valid UTF-8 throughout


@pytest.mark.parametrize("bad", ["lone \ud800", "nul \u0000", "\udcff"])
async def test_the_store_refuses_what_it_cannot_keep_and_writes_nothing(
    new_store: StoreFactory, opened: list[Store], bad: str
) -> None:
    store = await _open(new_store, opened)
    await store.append([NewEvent("gateway.agent_frozen", "a_1", {"reason": "ok"})])
    before = store.state.snapshot()
    events = [
        NewEvent("gateway.agent_frozen", "a_1", {"reason": "fine"}),
        NewEvent("gateway.agent_frozen", "a_1", {"reason": bad}),
    ]
    with pytest.raises(UnstorableValueError) as refused:
        await store.append(events)
    assert refused.value.code == "unstorable_value"
    assert refused.value.details["field"] == "data.reason"
    assert not refused.value.retryable
    assert store.state.snapshot() == before
    with pytest.raises(UnstorableValueError):
        await store.append([NewEvent("gateway.agent_frozen", f"a_{bad}", {})])
    await store.close()
    again = await _open(new_store, opened)
    assert again.state.last_seq == 1
    assert [e.seq for e in await again.read()] == [1]


# --- what the schemathesis suite found (tests/daemon/test_api_fuzz.py) ---------------------


def test_the_openapi_document_lists_what_every_route_may_answer(front: FrontDoor) -> None:
    document = front.app(token="t0ken-0123456789").openapi()
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            # Every route checks its parameters, so each may answer 400.
            assert "400" in operation["responses"], (method, path)
    assert document["paths"]["/healthz"]["get"]["security"] == []  # no token needed
    assert "403" in document["paths"]["/events"]["get"]["responses"]  # an agent's token


@pytest.mark.parametrize(
    "extra",
    [
        {"budget": {"maxTokens": True}},
        {"turnTimeoutS": True},
        {"maxConsecutiveFailures": "3"},
        {"spawnBudget": {"allowPreempt": 1}},
    ],
)
async def test_spec_numbers_and_booleans_are_strict(
    front: FrontDoor, extra: dict[str, Any]
) -> None:
    async with front.client() as client:
        answer = await client.post("/agents", json={**WORKER, **extra})
    assert problems(answer, "invalid_spec")
    assert front.service.list_agents() == []


def _walked(value: Any, path: str = "") -> tuple[str, str] | None:
    """``unstorable`` as a plain walk, every string looked at with ``text_problem``: what its
    fast path must agree with."""
    if isinstance(value, str):
        message = text_problem(value)
        return None if message is None else (path or "(value)", message)
    if isinstance(value, dict):
        for key, inner in value.items():
            child = f"{path}.{key}" if path else str(key)
            found = _walked(key, child) or _walked(inner, child)
            if found is not None:
                return found
    elif isinstance(value, list | tuple):
        for i, inner in enumerate(value):
            found = _walked(inner, f"{path}.{i}" if path else str(i))
            if found is not None:
                return found
    return None


class _Text(str):
    pass


_TEXT = st.text(
    alphabet=st.one_of(
        st.characters(codec="ascii"),
        st.sampled_from(["\x00", "\ud800", "\udfff", "é", "\u202e", "\U0001f600", "\ufffd"]),
    ),
    max_size=6,
)
_SCALAR = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), _TEXT)
_JSON = st.recursive(
    _SCALAR,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(st.one_of(_TEXT, st.integers()), inner, max_size=4),
        st.dictionaries(_TEXT.map(_Text), inner.map(lambda v: [v]), max_size=3),
    ),
    max_leaves=12,
)


@settings(max_examples=400, deadline=None)
@given(value=_JSON, path=st.sampled_from(["", "data"]))
def test_unstorable_finds_what_a_plain_walk_finds(value: Any, path: str) -> None:
    assert unstorable(value, path) == _walked(value, path)


@pytest.mark.parametrize(
    ("value", "found"),
    [
        ({"a": "ok", "b": ["x", "nul \x00"]}, "b.1"),
        ({"é": {"\ud800": 1}}, "é.\ud800"),
        ({"k": ("fine", "\udcff")}, "k.1"),
        ({1: "é\x00"}, "1"),
        (_Text("a\x00"), "(value)"),
    ],
)
def test_unstorable_names_the_first_string_no_store_can_hold(value: Any, found: str) -> None:
    where = unstorable(value)
    assert where is not None
    assert where[0] == found
    assert unstorable({"fine": ["ascii", "é", "\U0001f600", 1, 2.5, None, True]}) is None
