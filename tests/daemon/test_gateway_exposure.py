"""The gateway through the daemon: ``POST /gateway/query`` and the breaker routes over HTTP,
freezes in ``GET /decisions`` and the event log, the same calls through ``LocalApi`` and
``HttpApi``, and the MCP ``db_*`` tools. Against a real PostgreSQL and a real SQLite file."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from mcp import Client

from corral.daemon import (
    HttpApi,
    LocalApi,
    RemoteError,
    build_mcp_server,
    create_app,
)
from corral.daemon._databases import Databases, to_json
from corral.daemon._errors import UnknownTargetError
from corral.daemon._targets import parse_db_option
from corral.gateway import BreakerPolicy, Gateway, GatewayError
from corral.kernel import InvalidArgumentError
from tests.gateway.corpus import SHOP_ROWS, shop_sqlite_file
from tests.gateway.gateway_support import shop_dsn
from tests.support.front_door import DAEMON_TOKEN, FrontDoor, serving
from tests.support.polling import settle

__all__ = ["shop_dsn"]  # a fixture

pytestmark = pytest.mark.postgres

# Tight enough that a test trips it in three requests, and wide enough not to expire.
POLICY = BreakerPolicy(window_s=3600, max_errors=3, max_refusals=3, max_suspicious_empties=3)


class Env:
    """A service with a token, fronting the shop on PostgreSQL and on SQLite."""

    def __init__(self, front: FrontDoor, databases: Databases, sqlite_path: Path) -> None:
        self.front = front
        self.service = front.service
        self.databases = databases
        self.sqlite_path = sqlite_path

    def client(self, token: str | None = None) -> httpx.AsyncClient:
        app = self.front.app(databases=self.databases)
        return self.front.client(app, Authorization=f"Bearer {token or DAEMON_TOKEN}")

    async def spawn(self, **spec: Any) -> str:
        return await self.front.spawn(command=["w"], **spec)


@pytest.fixture
async def env(tmp_path: Path, shop_dsn: str, scoped_front: FrontDoor) -> AsyncIterator[Env]:
    sqlite_path = shop_sqlite_file(tmp_path)
    databases = await Databases.open(
        {"shop": shop_dsn, "local": f"sqlite:///{sqlite_path}"},
        service=scoped_front.service,
        breaker=POLICY,
    )
    yield Env(scoped_front, databases, sqlite_path)
    await databases.close()


def error_of(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == code, error
    return error


# --- queries ----------------------------------------------------------------------------------


async def test_sql_read_answers_rows_as_json(env: Env) -> None:
    async with env.client() as http:
        r = await http.post(
            "/gateway/query",
            json={
                "target": "shop",
                "agent": "agent-1",
                "sql": "SELECT id, total, created_at FROM orders WHERE status = $1 ORDER BY id",
                "params": ["paid"],
            },
        )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["target"] == "shop"
    assert body["status"] == "ok"
    assert body["columns"] == ["id", "total", "created_at"]
    assert body["rows"][0] == {"id": 1, "total": "25.00", "created_at": "2024-01-05T10:00:00+00:00"}
    assert body["rowCount"] == len(body["rows"]) >= 2
    assert body["emptiness"] is None
    assert body["truncated"] is False


async def test_structured_find_on_sqlite_with_camel_case_keys(env: Env) -> None:
    async with env.client() as http:
        r = await http.post(
            "/gateway/query",
            json={
                "target": "local",
                "agent": "agent-1",
                "op": "find",
                "table": "orders",
                "where": {"status": "paid"},
                "columns": ["id"],
                "orderBy": ["id"],
            },
        )
    assert r.status_code == 200, r.text
    _, rows = SHOP_ROWS["orders"]
    assert [row["id"] for row in r.json()["rows"]] == sorted(o[0] for o in rows if o[2] == "paid")


async def test_keyed_write_is_replayed_and_a_different_one_conflicts(env: Env) -> None:
    write = {
        "target": "shop",
        "agent": "agent-1",
        "op": "update",
        "table": "orders",
        "where": {"id": 3},
        "set": {"status": "refunded"},
        "idempotencyKey": "refund-3",
        "planHash": "p1",
    }
    async with env.client() as http:
        first = await http.post("/gateway/query", json=write)
        again = await http.post("/gateway/query", json=write)
        other = await http.post("/gateway/query", json={**write, "set": {"status": "lost"}})
        keyless = await http.post(
            "/gateway/query", json={k: v for k, v in write.items() if k != "idempotencyKey"}
        )
        both = await http.post("/gateway/query", json={**write, "idempotency_key": "x"})
    assert first.status_code == 200
    assert first.json()["status"] == "ok"
    assert first.json()["rowCount"] == 1
    assert "Idempotency-Replayed" not in first.headers
    assert again.status_code == 200
    assert again.json()["status"] == "replayed"
    assert again.headers["Idempotency-Replayed"] == "true"
    error = error_of(other, 422, "idempotency_conflict")
    assert error["retryable"] is False
    error_of(keyless, 400, "idempotency_key_required")
    error_of(both, 400, "invalid_argument")


async def test_refusals_keep_their_code_status_and_details(env: Env) -> None:
    async with env.client() as http:
        misspelt = await http.post(
            "/gateway/query",
            json={"target": "shop", "agent": "a", "sql": "SELECT stauts FROM orders"},
        )
        ddl = await http.post(
            "/gateway/query", json={"target": "shop", "agent": "a", "sql": "DROP TABLE orders"}
        )
        no_agent = await http.post("/gateway/query", json={"target": "shop", "sql": "SELECT 1"})
        no_target = await http.post("/gateway/query", json={"agent": "a", "sql": "SELECT 1"})
        unknown = await http.post(
            "/gateway/query", json={"target": "nope", "agent": "a", "sql": "SELECT 1"}
        )
        not_object = await http.post("/gateway/query", json=["SELECT 1"])
    error = error_of(misspelt, 400, "unknown_column")
    assert "status" in error["details"]["suggestions"] or "status" in error["message"]
    error_of(ddl, 400, "forbidden_statement")
    assert {
        p["field"] for p in error_of(no_agent, 400, "invalid_request")["details"]["problems"]
    } == {"agent"}
    assert error_of(no_target, 404, "unknown_target")["details"]["targets"] == ["local", "shop"]
    assert "local, shop" in error_of(unknown, 404, "unknown_target")["message"]
    error_of(not_object, 400, "invalid_request")


async def test_targets_and_schema(env: Env) -> None:
    async with env.client() as http:
        targets = (await http.get("/gateway")).json()["targets"]
        schema = (await http.get("/gateway/local/schema")).json()
        missing = await http.get("/gateway/nope/schema")
    assert [(t["name"], t["dialect"]) for t in targets] == [
        ("local", "sqlite"),
        ("shop", "postgresql"),
    ]
    assert all(t["tables"] >= 4 and t["frozenAgents"] == 0 for t in targets)
    assert [t["limits"]["maxRows"] for t in targets] == [1000, 1000]
    assert not any(t["limits"]["agentRole"] for t in targets)
    orders = next(t for t in schema["tables"] if t["name"] == "orders")
    assert orders["primaryKey"] == ["id"]
    assert "status" in [c["name"] for c in orders["columns"]]
    error_of(missing, 404, "unknown_target")


# --- breakers, freezes and decisions ----------------------------------------------------------


async def test_a_freeze_is_a_decision_an_event_and_a_notice_until_reinstated(env: Env) -> None:
    parent = await env.spawn(name="lead")
    child = await env.spawn(name="analyst", parent=parent)
    bad = {"target": "shop", "agent": child, "sql": "SELECT nope FROM orders"}
    async with env.client() as http:
        codes = [
            (await http.post("/gateway/query", json=bad)).json()["error"]["code"] for _ in "123"
        ]
        frozen = await http.post(
            "/gateway/query", json={"target": "shop", "agent": child, "sql": "SELECT 1"}
        )
        decisions = (await http.get("/decisions")).json()["decisions"]
        status = (await http.get(f"/gateway/shop/agents/{child}")).json()
        missing_why = await http.post(
            f"/gateway/shop/agents/{child}/reinstate", json={"by": "dana"}
        )
        done = await http.post(
            f"/gateway/shop/agents/{child}/reinstate",
            json={"by": "dana", "reason": "typo fixed in the prompt"},
        )
        after = (await http.get("/decisions")).json()
        answered = (await http.get("/decisions?resolved=true")).json()
        history = (await http.get(f"/gateway/shop/agents/{child}/history")).json()["history"]
        works = await http.post(
            "/gateway/query", json={"target": "shop", "agent": child, "sql": "SELECT 1 AS one"}
        )
    assert codes == ["unknown_column"] * 3
    assert error_of(frozen, 423, "agent_frozen")["retryable"] is False

    [decision] = [d for d in decisions if d["kind"] == "gateway_frozen"]
    assert decision["agentId"] == child
    assert decision["target"] == "shop"
    assert decision["freeze"]["signal"] == "refusals"
    assert [e["code"] for e in decision["freeze"]["evidence"]] == ["unknown_column"] * 3
    assert decision["resolve"]["reinstate"] == f"POST /gateway/shop/agents/{child}/reinstate"
    assert status["frozen"] is True
    assert status["freeze"]["count"] == 3

    events = await env.service.events(0, agent_id=child)
    [told] = [e for e in events if e.type == "gateway.agent_frozen"]
    assert told.data["target"] == "shop"
    assert told.data["signal"] == "refusals"
    [notice] = [n for n in env.service.inbox(parent) if n["kind"] == "gateway_frozen"]
    assert notice["from"] == child
    assert notice["target"] == "shop"

    error_of(missing_why, 400, "invalid_request")
    assert done.status_code == 200, done.text
    # The record names the token that answered; the name typed is kept as a note.
    assert done.json()["by"] == "operator"
    assert not [d for d in after["decisions"] if d["kind"] == "gateway_frozen"]
    [resolution] = [r for r in answered["decisions"] if r["kind"] == "gateway_frozen"]
    assert resolution["agentId"] == child
    assert resolution["id"] == decision["id"]
    assert (resolution["by"], resolution["note"], resolution["why"], resolution["answer"]) == (
        "operator",
        "dana",
        "typo fixed in the prompt",
        "reinstate",
    )
    assert [h["kind"] for h in history] == ["freeze", "reinstatement"]
    assert works.status_code == 200
    assert works.json()["rows"] == [{"one": 1}]


async def test_manual_freeze_is_idempotent_and_told_once(env: Env) -> None:
    async with env.client() as http:
        first = await http.post(
            "/gateway/local/agents/bot-9/freeze", json={"reason": "looping", "by": "dana"}
        )
        second = await http.post("/gateway/local/agents/bot-9/freeze", json={"reason": "again"})
        refused = await http.post(
            "/gateway/query",
            json={"target": "local", "agent": "bot-9", "op": "count", "table": "orders"},
        )
        elsewhere = await http.post(
            "/gateway/query",
            json={"target": "shop", "agent": "bot-9", "op": "count", "table": "orders"},
        )
    assert first.status_code == 200
    assert first.json()["reason"] == "looping"
    assert second.json()["id"] == first.json()["id"]
    error_of(refused, 423, "agent_frozen")
    assert elsewhere.status_code == 200  # a freeze holds in its own database only
    frozen_events = [e for e in await env.service.events(0) if e.type == "gateway.agent_frozen"]
    assert len(frozen_events) == 1
    assert frozen_events[0].data["by"] == "operator"  # the token's name, not the one typed


async def test_an_agent_token_reaches_its_subtree_and_cannot_reinstate(env: Env) -> None:
    agent = await env.spawn(name="lead")
    child = await env.spawn(name="child", parent=agent)
    other = await env.spawn(name="other")
    token = env.front.agent_token(agent)
    async with env.client(token) as http:
        mine = await http.post("/gateway/query", json={"target": "shop", "sql": "SELECT 1 AS x"})
        as_other = await http.post(
            "/gateway/query", json={"target": "shop", "agent": other, "sql": "SELECT 1"}
        )
        as_child = await http.post(
            "/gateway/query", json={"target": "shop", "agent": child, "sql": "SELECT 1"}
        )
        out_of_scope = [
            await http.get(f"/gateway/shop/agents/{other}"),
            await http.get(f"/gateway/shop/agents/{other}/history"),
            await http.post(f"/gateway/shop/agents/{other}/freeze", json={"reason": "x"}),
        ]
        child_status = await http.get(f"/gateway/shop/agents/{child}")
        in_a_name = await http.post(
            f"/gateway/shop/agents/{child}/freeze", json={"reason": "loop", "by": "alice"}
        )
        froze_child = await http.post(
            f"/gateway/shop/agents/{child}/freeze", json={"reason": "looping"}
        )
        reinstate = await http.post(
            f"/gateway/shop/agents/{child}/reinstate", json={"by": agent, "reason": "fixed"}
        )
    assert mine.status_code == 200, mine.text
    assert mine.json()["rows"] == [{"x": 1}]
    error_of(as_other, 403, "out_of_scope")
    error_of(as_child, 403, "out_of_scope")  # not even its own child: breakers count per agent
    for answer in out_of_scope:
        error_of(answer, 403, "out_of_scope")
    assert child_status.status_code == 200
    error_of(in_a_name, 403, "out_of_scope")
    assert froze_child.status_code == 200
    assert froze_child.json()["by"] == agent  # recorded in the agent's name, never a person's
    error_of(reinstate, 403, "out_of_scope")
    assert env.databases.status("shop", child)["frozen"] is True
    assert env.databases.status("shop", other)["frozen"] is False


async def test_control_characters_are_refused_before_the_gateway(env: Env) -> None:
    async with env.client() as http:
        nul_agent = await http.post(
            "/gateway/query", json={"target": "shop", "agent": "a\u0000b", "sql": "SELECT 1"}
        )
        nul_reason = await http.post(
            "/gateway/shop/agents/bot/freeze", json={"reason": "loop\u0000", "by": "ops"}
        )
        newline_by = await http.post(
            "/gateway/shop/agents/bot/reinstate", json={"by": "ops\n", "reason": "x"}
        )
    # Refused at the door, naming the field (the gateway's own check is behind it).
    for answer, field in ((nul_agent, "agent"), (nul_reason, "reason"), (newline_by, "by")):
        error = error_of(answer, 400, "invalid_request")
        assert [p["field"] for p in error["details"]["problems"]] == [field]
        assert "must not contain" in error["message"]
    assert env.databases.decisions() == []


async def test_reinstating_an_agent_not_frozen_is_409(env: Env) -> None:
    async with env.client() as http:
        answer = await http.post(
            "/gateway/shop/agents/bot/reinstate", json={"by": "dana", "reason": "why not"}
        )
    error = error_of(answer, 409, "not_frozen")
    assert error["message"] == "agent 'bot' is not frozen in 'shop': nothing to reinstate"


async def test_a_reinstatement_the_event_log_cannot_take_still_answers(
    env: Env, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def store_down(*args: Any) -> None:
        raise RuntimeError("store down")

    await env.databases.freeze("shop", "bot", reason="loop")
    monkeypatch.setattr(env.service, "record_gateway_resolution", store_down)
    done = await env.databases.reinstate("shop", "bot", by="dana", reason="fixed")
    assert (done["by"], done["reason"]) == ("dana", "fixed")
    assert env.databases.status("shop", "bot")["frozen"] is False
    assert "could not log the reinstatement of bot in shop" in caplog.text


async def test_a_freeze_the_event_log_missed_is_logged_when_the_daemon_starts(
    env: Env, shop_dsn: str
) -> None:
    # Frozen from Python while the daemon was not looking (or just before it crashed).
    await env.databases.close()
    async with await Gateway.connect(shop_dsn, breaker=POLICY) as gw:
        missed = await gw.freeze("bot-3", "frozen from a script", by="ops")
    reopened = await Databases.open({"shop": shop_dsn}, service=env.service, breaker=POLICY)
    try:
        again = await Databases.open({"shop": shop_dsn}, service=env.service, breaker=POLICY)
        await again.close()
    finally:
        await reopened.close()
    logged = [e for e in await env.service.events(0) if e.type == "gateway.agent_frozen"]
    assert [(e.agent_id, e.data["id"], e.data["by"]) for e in logged] == [
        ("bot-3", missed.id, "ops")
    ]


# --- the client APIs and MCP ------------------------------------------------------------------


async def test_local_and_http_apis_agree(env: Env) -> None:
    local = LocalApi(env.service, env.databases)
    app = create_app(env.service, databases=env.databases, heartbeat_s=60)
    async with serving(app) as url, HttpApi(url) as remote:
        for api in (local, remote):
            assert [t["name"] for t in await api.db_targets()] == ["local", "shop"]
            read = await api.db_query("a-1", {"op": "count", "table": "orders"}, "shop")
            assert read["rows"][0]["count"] >= 5
            with pytest.raises(UnknownTargetError):
                await api.db_status("a-1")  # two databases: name one
            frozen = await api.db_freeze("a-1", "by hand", by="dana", target="local")
            assert frozen["target"] == "local"
            assert [d["agentId"] for d in await api.decisions()] == ["a-1"]
            await api.db_reinstate("a-1", "dana", "done", target="local")
            assert [h["kind"] for h in await api.db_history("a-1", "local")][-2:] == [
                "freeze",
                "reinstatement",
            ]
        with pytest.raises(RemoteError) as caught:
            await remote.db_query("a-1", {"sql": "SELECT nope FROM orders"}, "shop")
        assert (caught.value.code, caught.value.status) == ("unknown_column", 400)


async def test_http_api_paths_cannot_be_bent(env: Env) -> None:
    app = create_app(env.service, databases=env.databases, heartbeat_s=60)
    async with serving(app) as url, HttpApi(url) as remote:
        with pytest.raises(InvalidArgumentError, match="target"):
            await remote.db_status("a1", "..")
        await remote.db_freeze("..", "dots are an id like any other", target="shop")
        status = await remote.db_status("..", "shop")
    assert (status["agentId"], status["frozen"]) == ("..", True)


async def test_mcp_takes_camel_case_keys_too(env: Env) -> None:
    api = LocalApi(env.service, env.databases)
    write = {
        "op": "insert",
        "table": "refunds",
        "values": {"id": 1, "order_id": 3, "amount": "10.00"},
        "idempotencyKey": "refund-1",
    }
    first = await api.db_query("a-1", write, "shop")
    again = await api.db_query("a-1", write, "shop")
    assert (first["status"], again["status"]) == ("ok", "replayed")


async def test_without_databases_both_apis_say_so(daemon: FrontDoor, http_api: HttpApi) -> None:
    for api in (daemon.api, http_api):
        assert await api.db_targets() == []
        with pytest.raises((UnknownTargetError, RemoteError)) as caught:
            await api.db_query("a", {"sql": "SELECT 1"}, "shop")
        assert caught.value.code == "unknown_target"
        assert "--db NAME=DSN" in caught.value.message


async def test_local_api_without_databases_says_so(front: FrontDoor) -> None:
    assert await front.api.db_targets() == []
    with pytest.raises(UnknownTargetError, match="--db NAME=DSN"):
        await front.api.db_query("a", {"sql": "SELECT 1"})


async def test_mcp_db_tools(env: Env) -> None:
    server = build_mcp_server(LocalApi(env.service, env.databases))
    async with Client(server) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert {"db_targets", "db_schema", "db_query", "db_status", "db_reinstate"} <= names
        read = await client.call_tool(
            "db_query",
            {
                "agentId": "mcp-agent",
                "target": "shop",
                "request": {"sql": "SELECT id FROM orders WHERE status = $1", "params": ["nope"]},
            },
        )
        assert not read.is_error
        assert read.structured_content is not None
        assert read.structured_content["emptiness"] == "suspiciously_empty"
        refused = await client.call_tool(
            "db_query",
            {"agentId": "mcp-agent", "target": "shop", "request": {"sql": "VACUUM"}},
        )
        assert refused.is_error
        assert refused.structured_content is not None
        assert refused.structured_content["error"]["code"] == "forbidden_statement"
        for _ in range(2):
            await client.call_tool(
                "db_query",
                {
                    "agentId": "mcp-agent",
                    "target": "shop",
                    "request": {"sql": "SELECT id FROM orders WHERE status = 'x'"},
                },
            )
        decisions = await client.call_tool("decisions_list", {})
        assert decisions.structured_content is not None
        [frozen] = decisions.structured_content["decisions"]
        assert frozen["freeze"]["signal"] == "suspicious_empties"
        done = await client.call_tool(
            "db_reinstate",
            {"agentId": "mcp-agent", "target": "shop", "by": "dana", "reason": "checked"},
        )
        assert not done.is_error


# --- configuration ----------------------------------------------------------------------------


def test_db_option_parsing() -> None:
    assert parse_db_option("shop=postgresql://127.0.0.1/shop") == (
        "shop",
        "postgresql://127.0.0.1/shop",
    )
    assert parse_db_option("kw=host=127.0.0.1 dbname=shop") == ("kw", "host=127.0.0.1 dbname=shop")
    for bad, what in (("shop", "NAME=DSN"), ("=x", "NAME"), ("9x=a", "NAME"), ("a=", "NAME=DSN")):
        with pytest.raises(InvalidArgumentError, match=what):
            parse_db_option(bad)


async def test_a_target_that_cannot_be_opened_closes_the_others(
    tmp_path: Path, shop_dsn: str
) -> None:
    with pytest.raises(GatewayError) as caught:
        await Databases.open(
            {"shop": shop_dsn, "gone": str(tmp_path / "missing" / "nothing.db")},
            breaker=POLICY,
        )
    assert caught.value.code == "database_unavailable"

    def others() -> int:
        with psycopg.connect(shop_dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid()"
            ).fetchone()
        assert row is not None
        return int(row[0])

    # A closed connection's backend leaves pg_stat_activity a moment after the client has
    # gone (the server process exits on its own time): wait for it, with a bound.
    await settle(lambda: others() == 0)


def test_values_become_json() -> None:
    import datetime as dt
    import decimal
    import uuid

    assert to_json(decimal.Decimal("12.50")) == "12.50"
    assert to_json(float("nan")) == to_json(decimal.Decimal("NaN")) == "NaN"
    assert to_json(float("-inf")) == "-Infinity"
    assert to_json(dt.date(2024, 1, 2)) == "2024-01-02"
    assert to_json(dt.timedelta(minutes=1, seconds=30)) == 90.0
    assert to_json(b"\x00\xff") == "AP8="
    assert to_json(uuid.UUID(int=1)) == "00000000-0000-0000-0000-000000000001"
    assert to_json({"a": [decimal.Decimal("1.0"), None]}) == {"a": ["1.0", None]}


async def test_a_freeze_that_cannot_be_logged_still_holds_and_answers(
    env: Env, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def store_down(target: str, freeze: dict[str, Any]) -> None:
        raise RuntimeError("store down")

    monkeypatch.setattr(env.service, "record_gateway_freeze", store_down)
    bad = {"op": "find", "table": "orders", "where": {"nope": 1}}
    codes = []
    for _ in range(4):
        with pytest.raises(GatewayError) as caught:
            await env.databases.query("local", "bot-2", bad)
        codes.append(caught.value.code)
    assert codes == ["unknown_column"] * 3 + ["agent_frozen"]
    assert [d["agentId"] for d in env.databases.decisions()] == ["bot-2"]
    assert "could not log the freeze of bot-2 in local" in caplog.text


async def test_a_helper_does_not_reach_a_database_where_its_ancestor_is_frozen(env: Env) -> None:
    lead = await env.spawn(name="lead")
    helper = await env.spawn(name="helper", parent=lead)
    await env.databases.freeze("shop", lead, reason="looping", by="ops")
    async with env.client(env.front.agent_token(helper)) as http:
        refused = await http.post("/gateway/query", json={"target": "shop", "sql": "SELECT 1"})
    error = error_of(refused, 403, "out_of_scope")
    assert f"its ancestor '{lead}' is frozen there" in error["message"]
    await env.databases.reinstate("shop", lead, by="ops", reason="fixed")
    async with env.client(env.front.agent_token(helper)) as http:
        allowed = await http.post("/gateway/query", json={"target": "shop", "sql": "SELECT 1"})
    assert allowed.status_code == 200, allowed.text
