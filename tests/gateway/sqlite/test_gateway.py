"""SQLiteGateway against a real SQLite file holding the shop."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest

from corral.gateway import BreakerPolicy, GatewayError, SQLiteGateway
from corral.gateway.sqlite._file import JOURNAL_TABLE
from corral.gateway.sqlite._plan import ReadPlan
from corral.kernel import SYSTEM_CLOCK, InvalidArgumentError
from corral.runtime import FakeClock
from tests.gateway.corpus import SHOP_ROWS, shop_sqlite_file
from tests.gateway.gateway_support import on_thread

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
        plan = ReadPlan("UPDATE orders SET status = 'x'", ())
        with pytest.raises(GatewayError) as info:
            await on_thread(gw, "read", plan)
    assert info.value.code == "read_only_violation"
    assert _count(shop, "SELECT count(*) FROM orders WHERE status = 'x'") == 0


async def test_statement_timeout_interrupts_a_long_read(shop: Path) -> None:
    slow = ReadPlan(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT count(*) FROM n",
        (),
    )
    async with SQLiteGateway.connect(shop, statement_timeout_s=0.05, clock=SYSTEM_CLOCK) as gw:
        with pytest.raises(GatewayError) as info:
            await on_thread(gw, "read", slow)
    assert info.value.code == "statement_timeout"
    assert info.value.retryable
    assert "0.05 s" in info.value.message


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
    # Keys survive restarts; the journal is in the target, hidden from agents.
    assert _count(shop, f"SELECT count(*) FROM {JOURNAL_TABLE}") == 1
    async with SQLiteGateway.connect(shop, clock=FakeClock()) as gw:
        assert JOURNAL_TABLE not in gw.catalog.tables
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


async def test_keys_journalled_in_flight_are_outcome_unknown(shop: Path) -> None:
    delete = {
        "op": "delete",
        "table": "order_items",
        "where": {"order_id": 1},
        "idempotency_key": "drop-1",
    }
    async with SQLiteGateway.connect(shop, clock=FakeClock()) as gw:
        assert (await gw.query(AGENT, delete)).row_count == 1
        stored = await on_thread(gw, "lookup", AGENT, "drop-1")
    assert stored is not None
    # One key in flight at a crash (its write applied), one completed.
    conn = sqlite3.connect(shop)
    conn.execute(f"DELETE FROM {JOURNAL_TABLE}")
    conn.execute(
        f"INSERT INTO {JOURNAL_TABLE} VALUES (?, 'drop-1', '', ?, 'in_flight', NULL, 't', NULL)",
        (AGENT, stored.fingerprint),
    )
    conn.execute(
        f"INSERT INTO {JOURNAL_TABLE} VALUES (?, 'old', '', ?, 'completed', ?, 't', 't')",
        (AGENT, "f" * 64, '{"columns":[],"rows":[],"row_count":3,"truncated":false}'),
    )
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
        old = await on_thread(gw, "lookup", AGENT, "old")
    assert fresh.row_count == 0  # already applied before the crash
    assert old is not None
    assert old.result is not None
    assert old.result.row_count == 3
    assert _count(shop, "SELECT count(*) FROM order_items") == len(SHOP_ROWS["order_items"][1]) - 1


async def test_refused_write_leaves_no_journal_row(shop: Path) -> None:
    dup = {
        "op": "insert",
        "table": "customers",
        "values": {"id": 1, "name": "D", "email": "d@x", "country": "FR", "created_at": "t"},
        "idempotency_key": "dup",
    }
    async with SQLiteGateway.connect(shop, clock=FakeClock()) as gw:
        assert (await _refused(gw, dup)).code == "constraint_violation"
        assert await on_thread(gw, "lookup", AGENT, "dup") is None


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


# --- SQL text -----------------------------------------------------------------------------------


async def test_sql_reads_bind_their_parameters(shop: Path) -> None:
    async with SQLiteGateway.connect(shop, clock=FakeClock()) as gw:
        dollar = await gw.query(
            AGENT,
            {"sql": "SELECT id FROM orders WHERE status = $1 ORDER BY id", "params": ["open"]},
        )
        bare = await gw.query(
            AGENT,
            {
                "sql": "SELECT id FROM orders WHERE status = ? AND total > ? ORDER BY id",
                "params": ["open", 10],
            },
        )
        listed = await gw.query(
            AGENT, {"sql": "SELECT value FROM json_each($1) ORDER BY value", "params": [[3, 1, 2]]}
        )
        obj = await gw.query(
            AGENT, {"sql": "SELECT json_extract($1, '$.a.b') AS v", "params": [{"a": {"b": 7}}]}
        )
        flag = await gw.query(AGENT, {"sql": "SELECT $1 AS t, $2 AS n", "params": [True, None]})
        unchanged = await gw.query(
            AGENT, {"sql": "SELECT $1 AS s", "params": ["'); DROP TABLE orders; --"]}
        )
    assert [r["id"] for r in dollar.rows] == [5, 8]
    assert [r["id"] for r in bare.rows] == [8]
    assert [r["value"] for r in listed.rows] == [1, 2, 3]
    assert obj.rows == [{"v": 7}]
    assert flag.rows == [{"t": 1, "n": None}]
    assert unchanged.rows == [{"s": "'); DROP TABLE orders; --"}]
    assert _count(shop, "SELECT count(*) FROM orders") == 10


async def test_sql_requests_are_checked_before_they_run(shop: Path) -> None:
    async with SQLiteGateway.connect(shop, breaker=None, clock=FakeClock()) as gw:
        few = await _refused(gw, {"sql": "SELECT $2 AS b, $1 AS a", "params": [1]})
        assert (few.code, few.details["expected"], few.details["value"]) == (
            "invalid_operation",
            2,
            1,
        )
        assert "$2" in few.message
        many = await _refused(gw, {"sql": "SELECT 1", "params": [1]})
        assert many.details["expected"] == 0
        cases: list[tuple[dict[str, Any], str]] = [
            ({"sql": "SELECT $1", "params": [2**63]}, "params[0]"),
            ({"sql": "SELECT $1", "params": [float("nan")]}, "params[0]"),
            ({"sql": "SELECT $1", "params": [{"a": [float("inf")]}]}, "params[0].a[0]"),
            ({"sql": "SELECT $1", "params": [{1: "x"}]}, "params[0]"),
            ({"sql": "SELECT $1", "params": [b"x"]}, "params[0]"),
            ({"sql": "SELECT $1", "params": "x"}, "params"),
            ({"sql": "SELECT 1", "timeout": 3}, "timeout"),
            ({"sql": "  "}, "sql"),
            ({"sql": 42}, "sql"),
            ({"sql": "SELECT 1", "op": "find", "table": "orders"}, "request"),
            ({"sql": "SELECT 1", "idempotency_key": ""}, "idempotency_key"),
        ]
        for request, key in cases:
            error = await _refused(gw, request)
            assert (error.code, error.details["key"]) == ("invalid_operation", key), request
        assert (await _refused(gw, {"sql": "SELECT totl FROM orders"})).code == "unknown_column"


async def test_sql_reads_are_loud_about_empty_answers(shop: Path) -> None:
    conn = sqlite3.connect(shop)
    conn.execute("CREATE TABLE refunds (id INTEGER PRIMARY KEY, order_id INTEGER)")
    conn.commit()
    conn.close()
    async with SQLiteGateway.connect(shop, clock=FakeClock()) as gw:
        missed = await gw.query(
            AGENT, {"sql": "SELECT id FROM orders WHERE status = $1", "params": ["opne"]}
        )
        joined = await gw.query(
            AGENT,
            {
                "sql": "SELECT o.id FROM orders o JOIN customers c ON c.id = o.customer_id "
                "WHERE c.country = 'XX'"
            },
        )
        empty_table = await gw.query(AGENT, {"sql": "SELECT id FROM refunds WHERE order_id = 1"})
        no_filter = await gw.query(AGENT, {"sql": "SELECT id FROM orders"})
        counted = await gw.query(AGENT, {"sql": "SELECT count(*) AS n FROM orders WHERE id < 0"})
    assert missed.emptiness == "suspiciously_empty"
    assert missed.columns == ("id",)
    assert "orders holds rows" in missed.warnings[0]
    assert joined.emptiness == "suspiciously_empty"
    assert "orders, customers hold rows" in joined.warnings[0]
    assert (empty_table.emptiness, empty_table.warnings) == ("genuinely_empty", ())
    assert no_filter.emptiness is None
    assert counted.rows == [{"n": 0}]
    assert counted.emptiness is None  # SQL counts are rows, as on PostgreSQL


async def test_limits_offsets_and_table_valued_functions_make_empties_loud(shop: Path) -> None:
    conn = sqlite3.connect(shop)
    conn.execute("CREATE TABLE refunds (id INTEGER PRIMARY KEY, order_id INTEGER)")
    conn.commit()
    conn.close()
    suspicious: list[dict[str, Any]] = [
        {"sql": "SELECT id FROM orders LIMIT 0"},
        {"sql": "SELECT id FROM orders LIMIT 5 OFFSET 100"},
        {"sql": "SELECT o.id FROM orders o, json_each('[]')"},
        {"sql": "SELECT o.id FROM orders o, json_each(o.meta, '$.nosuchkey')"},
        {"op": "find", "table": "orders", "offset": 100},
        {"op": "find", "table": "orders", "limit": 5, "offset": 100},
    ]
    genuine: list[dict[str, Any]] = [
        {"sql": "SELECT id FROM refunds LIMIT 0"},
        {"sql": "SELECT r.id FROM refunds r, json_each('[1]')"},
        {"op": "find", "table": "refunds", "offset": 100},
    ]
    async with SQLiteGateway.connect(shop, clock=FakeClock(), breaker=None) as gw:
        for request in suspicious:
            result = await gw.query(AGENT, request)
            assert (result.rows, result.emptiness) == ([], "suspiciously_empty"), request
            assert "orders holds rows" in result.warnings[0], request
        for request in genuine:
            result = await gw.query(AGENT, request)
            assert (result.rows, result.emptiness) == ([], "genuinely_empty"), request
        paged = await gw.query(AGENT, {"sql": "SELECT id FROM orders ORDER BY id LIMIT 1"})
        limit_zero = await _refused(gw, {"op": "find", "table": "orders", "limit": 0})
    assert paged.emptiness is None
    assert paged.rows == [{"id": 1}]
    assert (limit_zero.code, limit_zero.details["key"]) == ("invalid_operation", "limit")


async def test_sql_reads_are_capped_and_timed_out(shop: Path) -> None:
    async with SQLiteGateway.connect(
        shop, max_rows=3, statement_timeout_s=0.05, clock=SYSTEM_CLOCK
    ) as gw:
        capped = await gw.query(AGENT, {"sql": "SELECT id FROM orders ORDER BY id"})
        error = await _refused(
            gw,
            {
                "sql": "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) "
                "SELECT count(*) FROM n"
            },
        )
    assert [r["id"] for r in capped.rows] == [1, 2, 3]
    assert capped.truncated
    assert error.code == "statement_timeout"
    assert error.retryable


async def test_sql_writes_are_keyed_replayed_and_conflicting(shop: Path) -> None:
    sql = (
        "INSERT INTO customers (id, name, email, country, created_at) "
        "VALUES ($1, $2, $3, 'FR', 't') RETURNING id, name"
    )
    insert: dict[str, Any] = {
        "sql": sql,
        "params": [60, "Nina", "nina@x"],
        "idempotency_key": "new-60",
        "plan_hash": "p1",
    }
    async with SQLiteGateway.connect(shop, breaker=None, clock=FakeClock()) as gw:
        missing = await _refused(gw, {**insert, "idempotency_key": None})
        assert missing.code == "idempotency_key_required"
        assert _count(shop, "SELECT count(*) FROM customers WHERE id = 60") == 0
        first = await gw.query(AGENT, insert)
        again = await gw.query(AGENT, insert)
        # The same work written differently is the same work.
        relaid = await gw.query(
            AGENT,
            {
                **insert,
                "sql": "insert into CUSTOMERS (id, name, email, country, created_at)\n"
                "  values (?1, ?2, ?3, 'FR', 't') -- retry\n  returning id, name;",
            },
        )
        other_params = await _refused(gw, {**insert, "params": [61, "Nina", "nina@x"]})
        # A new plan is new work (the key's identity is agent, key and plan_hash).
        other_plan = await gw.query(
            AGENT, {**insert, "plan_hash": "p2", "params": [63, "P", "p@x"]}
        )
        other_sql = await _refused(gw, {**insert, "sql": sql.replace("'FR'", "'DE'")})
        other_agent = await gw.query("agent-8", {**insert, "params": [62, "Olga", "olga@x"]})
    assert (first.status, first.row_count, first.rows) == ("ok", 1, [{"id": 60, "name": "Nina"}])
    assert (again.status, again.rows) == ("replayed", first.rows)
    assert relaid.status == "replayed"
    assert {other_params.code, other_sql.code} == {"idempotency_conflict"}
    assert other_plan.status == "ok"
    assert other_agent.status == "ok"  # keys are per agent
    assert _count(shop, "SELECT count(*) FROM customers WHERE id IN (60, 61, 62, 63)") == 3


async def test_a_sql_write_the_database_refuses_leaves_its_key_free(shop: Path) -> None:
    dup = {
        "sql": "INSERT INTO customers (id, name, email, country, created_at) "
        "VALUES (1, 'D', 'd@x', 'FR', 't')",
        "idempotency_key": "k",
    }
    slow = {
        "sql": "INSERT INTO customers (id, name, email, country, created_at) "
        "SELECT 100 + i, 'n', 'n' || i, 'FR', 't' FROM (WITH RECURSIVE n(i) AS "
        "(SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT i FROM n)",
        "idempotency_key": "slow",
    }
    async with SQLiteGateway.connect(
        shop, breaker=None, statement_timeout_s=0.05, clock=SYSTEM_CLOCK
    ) as gw:
        refused = await _refused(gw, dup)
        timed_out = await _refused(gw, slow)
        assert await on_thread(gw, "lookup", AGENT, "k") is None
        assert await on_thread(gw, "lookup", AGENT, "slow") is None
        fixed = await gw.query(AGENT, {**dup, "sql": dup["sql"].replace("(1,", "(70,")})
    assert refused.code == "constraint_violation"
    assert "UNIQUE" in refused.message
    assert timed_out.code == "statement_timeout"
    assert fixed.status == "ok"
    assert _count(shop, "SELECT count(*) FROM customers") == len(SHOP_ROWS["customers"][1]) + 1


async def test_concurrent_sql_writes_with_one_key_run_once(shop: Path) -> None:
    insert = {
        "sql": "INSERT INTO customers (id, name, email, country, created_at) "
        "VALUES (80, 'N', 'n@x', 'FR', 't')",
        "idempotency_key": "new-80",
    }
    async with SQLiteGateway.connect(shop, breaker=None, clock=FakeClock()) as gw:
        outcomes = await asyncio.gather(
            *(gw.query(AGENT, insert) for _ in range(20)), return_exceptions=True
        )
    codes = {
        o.code if isinstance(o, GatewayError) else getattr(o, "status", repr(o)) for o in outcomes
    }
    assert codes <= {"ok", "replayed", "idempotency_in_progress"}
    assert sum(1 for o in outcomes if not isinstance(o, BaseException) and o.status == "ok") == 1
    assert _count(shop, "SELECT count(*) FROM customers WHERE id = 80") == 1


async def test_schema_changes_reach_sql_analysis(shop: Path) -> None:
    async with SQLiteGateway.connect(shop, breaker=None, clock=FakeClock()) as gw:
        read = {"sql": "SELECT id, note FROM refunds"}
        assert (await _refused(gw, read)).code == "unknown_table"
        conn = sqlite3.connect(shop)
        conn.execute("CREATE TABLE refunds (id INTEGER PRIMARY KEY, note TEXT)")
        conn.execute("INSERT INTO refunds VALUES (1, 'late')")
        conn.commit()
        assert (await gw.query(AGENT, read)).rows == [{"id": 1, "note": "late"}]
        # The analysis is cached for this catalog; SQLite still refuses the dropped column.
        conn.execute("ALTER TABLE refunds DROP COLUMN note")
        conn.commit()
        conn.close()
        gone = await _refused(gw, read)
        assert gone.code == "unknown_column"
        assert gone.details["column"] == "note"
        assert (await _refused(gw, read)).code == "unknown_column"


async def test_a_wal_target_works_the_same(shop: Path) -> None:
    conn = sqlite3.connect(shop)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.close()
    update = {
        "sql": "UPDATE orders SET status = $1 WHERE id = $2",
        "params": ["paid", 5],
        "idempotency_key": "pay-5",
    }
    async with SQLiteGateway.connect(shop, clock=FakeClock()) as gw:
        assert (await gw.query(AGENT, update)).row_count == 1
        assert (await gw.query(AGENT, update)).status == "replayed"
        paid = await gw.query(AGENT, {"sql": "SELECT status FROM orders WHERE id = 5"})
    assert paid.rows == [{"status": "paid"}]
    assert _count(shop, "PRAGMA journal_mode") == "wal"


_CRASHING_WRITER = """
import os, signal, sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("PRAGMA cache_size=1")  # spill to the file before the commit
conn.execute("BEGIN IMMEDIATE")
conn.execute("UPDATE orders SET status = 'lost'")
conn.execute("INSERT INTO order_items SELECT order_id + 100, product_id, quantity, unit_price "
             "FROM order_items")
conn.execute("CREATE TABLE filler AS WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL "
             "SELECT i + 1 FROM n WHERE i < 20000) SELECT i, randomblob(200) AS b FROM n")
os.kill(os.getpid(), signal.SIGKILL)
"""


async def test_a_hot_journal_another_process_left_is_rolled_back(shop: Path) -> None:
    async with SQLiteGateway.connect(shop, clock=FakeClock()) as gw:
        assert (await gw.query(AGENT, {"sql": "SELECT count(*) AS n FROM orders"})).rows
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _CRASHING_WRITER, str(shop)
        )
        assert await proc.wait() == -signal.SIGKILL
        assert shop.with_name(shop.name + "-journal").exists()  # hot: the writer died
        # The read-only connection cannot roll it back; the gateway does, then reads.
        result = await gw.query(
            AGENT, {"sql": "SELECT count(*) AS n FROM orders WHERE status = 'lost'"}
        )
    assert result.rows == [{"n": 0}]
    assert _count(shop, "SELECT count(*) FROM order_items") == len(SHOP_ROWS["order_items"][1])
