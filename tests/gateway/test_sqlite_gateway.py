"""SQLiteGateway against a real SQLite file holding the shop."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from corral.gateway import BreakerPolicy, GatewayError, SQLiteGateway
from corral.gateway._sqlite_engine import JOURNAL_TABLE, ReadPlan
from corral.kernel import SYSTEM_CLOCK
from corral.kernel._errors import InvalidArgumentError
from corral.runtime import FakeClock
from tests.gateway.corpus import SHOP_ROWS, shop_sqlite_file

AGENT = "agent-7"


@pytest.fixture
def shop(tmp_path: Path) -> Path:
    return shop_sqlite_file(tmp_path)


def _count(path: Path, sql: str, *params: Any) -> Any:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql, params).fetchone()[0]
    finally:
        conn.close()


async def _refused(gw: SQLiteGateway, request: dict[str, Any]) -> GatewayError:
    with pytest.raises(GatewayError) as info:
        await gw.query(AGENT, request)
    return info.value


async def test_find_returns_rows(shop: Path) -> None:
    async with SQLiteGateway.connect(shop, clock=FakeClock()) as gw:
        result = await gw.query(
            AGENT,
            {"op": "find", "table": "orders", "where": {"status": "open"}, "order_by": ["id"]},
        )
    assert [r["id"] for r in result.rows] == [5, 8]
    assert result.columns[0] == "id"
    assert result.row_count == 2
    assert result.emptiness is None
    assert result.status == "ok"
    assert not result.truncated


async def test_loud_empties_both_ways(shop: Path, tmp_path: Path) -> None:
    async with SQLiteGateway.connect(shop, clock=FakeClock()) as gw:
        suspicious = await gw.query(
            AGENT, {"op": "find", "table": "orders", "where": {"status": "opne"}}
        )
        counted = await gw.query(
            AGENT, {"op": "count", "table": "orders", "where": {"status": "opne"}}
        )
    assert suspicious.emptiness == "suspiciously_empty"
    assert suspicious.rows == []
    assert "orders" in suspicious.warnings[0]
    assert counted.emptiness == "suspiciously_empty"
    assert counted.rows == [{"count": 0}]
    conn = sqlite3.connect(shop)
    conn.execute("DELETE FROM order_items")
    conn.commit()
    conn.close()
    async with SQLiteGateway.connect(shop, clock=FakeClock()) as gw:
        genuine = await gw.query(
            AGENT, {"op": "find", "table": "order_items", "where": {"quantity": 2}}
        )
    assert genuine.emptiness == "genuinely_empty"
    assert genuine.warnings == ()


async def test_row_cap_truncates(shop: Path) -> None:
    async with SQLiteGateway.connect(shop, max_rows=3, clock=FakeClock()) as gw:
        result = await gw.query(AGENT, {"op": "find", "table": "orders", "order_by": ["id"]})
        fits = await gw.query(AGENT, {"op": "find", "table": "orders", "where": {"id": 1}})
    assert [r["id"] for r in result.rows] == [1, 2, 3]
    assert result.truncated
    assert result.row_count == 3
    assert not fits.truncated
    assert fits.row_count == 1


async def test_write_through_the_read_path_fails_and_changes_nothing(shop: Path) -> None:
    async with SQLiteGateway.connect(shop, clock=FakeClock()) as gw:
        plan = ReadPlan("UPDATE orders SET status = 'x'", (), "orders", None, False)
        with pytest.raises(GatewayError) as info:
            await gw._call(gw._engine.read, plan)
    assert info.value.code == "read_only_violation"
    assert _count(shop, "SELECT count(*) FROM orders WHERE status = 'x'") == 0


async def test_statement_timeout_interrupts_a_long_read(shop: Path) -> None:
    slow = ReadPlan(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT count(*) FROM n",
        (),
        "orders",
        None,
        False,
    )
    async with SQLiteGateway.connect(shop, statement_timeout_s=0.05, clock=SYSTEM_CLOCK) as gw:
        with pytest.raises(GatewayError) as info:
            await gw._call(gw._engine.read, slow)
    assert info.value.code == "statement_timeout"
    assert info.value.retryable
    assert "0.05 s" in info.value.message


async def test_sql_text_is_refused(shop: Path) -> None:
    async with SQLiteGateway.connect(shop, clock=FakeClock()) as gw:
        error = await _refused(gw, {"sql": "SELECT 1"})
    assert error.code == "invalid_operation"
    assert "PostgreSQL" in error.message


async def test_keyed_writes_replay_and_conflict(shop: Path, tmp_path: Path) -> None:
    update = {
        "op": "update",
        "table": "orders",
        "where": {"id": 5},
        "set": {"status": "paid"},
        "idempotency_key": "pay-5",
        "plan_hash": "p1",
        "returning": ["id", "status"],
    }
    async with SQLiteGateway.connect(shop, clock=FakeClock()) as gw:
        assert (await _refused(gw, {**update, "idempotency_key": None})).code == (
            "idempotency_key_required"
        )
        first = await gw.query(AGENT, update)
        assert first.status == "ok"
        assert first.rows == [{"id": 5, "status": "paid"}]
        again = await gw.query(AGENT, update)
        assert again.status == "replayed"
        assert again.rows == first.rows
        changed = await _refused(gw, {**update, "set": {"status": "shipped"}})
        assert changed.code == "idempotency_conflict"
    assert _count(shop, "SELECT status FROM orders WHERE id = 5") == "paid"
    # Keys survive restarts; the journal is outside the target.
    assert not _count(shop, "SELECT count(*) FROM sqlite_master WHERE name = ?", JOURNAL_TABLE)
    async with SQLiteGateway.connect(shop, clock=FakeClock()) as gw:
        assert (await gw.query(AGENT, update)).status == "replayed"


async def test_concurrent_same_key_runs_once(shop: Path) -> None:
    insert = {
        "op": "insert",
        "table": "customers",
        "values": {"id": 50, "name": "N", "email": "n@x", "country": "FR", "created_at": "t"},
        "idempotency_key": "new-50",
    }
    async with SQLiteGateway.connect(shop, clock=FakeClock()) as gw:
        outcomes = await asyncio.gather(
            *(gw.query(AGENT, insert) for _ in range(20)), return_exceptions=True
        )
    codes = {
        o.code if isinstance(o, GatewayError) else getattr(o, "status", repr(o)) for o in outcomes
    }
    assert codes <= {"ok", "replayed", "idempotency_in_progress"}
    assert sum(1 for o in outcomes if not isinstance(o, BaseException) and o.status == "ok") == 1
    assert _count(shop, "SELECT count(*) FROM customers WHERE id = 50") == 1


async def test_in_flight_key_after_crash_is_outcome_unknown(shop: Path) -> None:
    delete = {
        "op": "delete",
        "table": "order_items",
        "where": {"order_id": 1},
        "idempotency_key": "drop-1",
    }
    async with SQLiteGateway.connect(shop, clock=FakeClock()) as gw:
        assert (await gw.query(AGENT, delete)).row_count == 1
    journal = shop.with_name(shop.name + ".corral-journal")
    conn = sqlite3.connect(journal)
    # What a crash between the write and its completion leaves behind.
    conn.execute(f"UPDATE {JOURNAL_TABLE} SET state = 'in_flight', result = NULL")
    conn.commit()
    conn.close()
    async with SQLiteGateway.connect(shop, clock=FakeClock()) as gw:
        assert gw.keys_in_flight_at_open == 1
        error = await _refused(gw, delete)
        assert error.code == "outcome_unknown"
        assert "drop-1" in error.message
        assert not error.retryable
        other = await _refused(gw, {**delete, "where": {"order_id": 2}})
        assert other.code == "idempotency_conflict"
        fresh = await gw.query(AGENT, {**delete, "idempotency_key": "drop-1-b"})
    assert fresh.row_count == 0  # already applied before the crash
    assert _count(shop, "SELECT count(*) FROM order_items") == len(SHOP_ROWS["order_items"][1]) - 1


async def test_refused_write_leaves_no_journal_row(shop: Path) -> None:
    dup = {
        "op": "insert",
        "table": "customers",
        "values": {"id": 1, "name": "D", "email": "d@x", "country": "FR", "created_at": "t"},
        "idempotency_key": "dup",
    }
    async with SQLiteGateway.connect(shop, clock=FakeClock()) as gw:
        assert (await _refused(gw, dup)).code == "database_error"
        assert await gw._call(gw._engine.lookup, AGENT, "dup") is None


async def test_breakers_freeze_on_repeated_unknown_column(shop: Path, tmp_path: Path) -> None:
    policy = BreakerPolicy(max_refusals=3)
    journal = tmp_path / "j" / "journal.db"
    bad = {"op": "find", "table": "orders", "where": {"statsu": "open"}}
    async with SQLiteGateway.connect(
        shop, journal_path=journal, breaker=policy, clock=FakeClock()
    ) as gw:
        first = await _refused(gw, bad)
        assert first.code == "unknown_column"
        assert "status" in first.details["suggestions"]
        for _ in range(2):
            assert (await _refused(gw, bad)).code == "unknown_column"
        assert gw.status(AGENT).frozen
        assert (await _refused(gw, {"op": "count", "table": "orders"})).code == "agent_frozen"
    async with SQLiteGateway.connect(
        shop, journal_path=journal, breaker=policy, clock=FakeClock()
    ) as gw:
        assert (await _refused(gw, {"op": "count", "table": "orders"})).code == "agent_frozen"
        await gw.reinstate(AGENT, by="ops", reason="typo fixed")
        assert (await gw.query(AGENT, {"op": "count", "table": "orders"})).rows == [{"count": 10}]
        kinds = [r.kind for r in await gw.history(AGENT)]
    assert kinds == ["freeze", "reinstatement"]


async def test_bad_arguments(shop: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="path"):
        SQLiteGateway.connect(42)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="max_rows"):
        SQLiteGateway.connect(shop, max_rows=0)
    with pytest.raises(InvalidArgumentError, match="statement_timeout_s"):
        SQLiteGateway.connect(shop, statement_timeout_s=-1)
    with pytest.raises(InvalidArgumentError, match="journal_path"):
        SQLiteGateway.connect(shop, journal_path=shop)
    with pytest.raises(InvalidArgumentError, match="breaker"):
        SQLiteGateway.connect(shop, breaker="x")  # type: ignore[arg-type]
    with pytest.raises(GatewayError) as info:
        await SQLiteGateway.connect(shop.with_name("missing.db"))
    assert info.value.code == "database_unavailable"
    async with SQLiteGateway.connect(shop, breaker=None, clock=FakeClock()) as gw:
        with pytest.raises(InvalidArgumentError):
            await gw.query("", {"op": "count", "table": "orders"})
        assert (await _refused(gw, {"op": "count", "table": "nope"})).code == "unknown_table"
