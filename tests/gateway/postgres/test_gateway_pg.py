"""The gateway on a real PostgreSQL: reads, escapes, read-only backstop, empties, limits."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import psycopg
import pytest

from corral.gateway import Catalog, Gateway, GatewayError, analyze
from corral.gateway.postgres import _plan, _wire
from corral.gateway.postgres._sql import Analysis
from corral.runtime import FakeClock
from tests.gateway.corpus import ESCAPES, VALID_READS
from tests.gateway.gateway_support import (
    AGENT,
    checksum,
    execute,
    fetch,
    postgres_of,
    refused,
    shop_dsn,
)

__all__ = ["shop_dsn"]

pytestmark = pytest.mark.postgres


def _direct_rows(dsn: str, sql: str, params: tuple[Any, ...]) -> tuple[list[str], list[Any]]:
    with (
        psycopg.connect(dsn, autocommit=True) as conn,
        psycopg.RawCursor(conn) as cur,
    ):
        cur.execute(sql, list(params) or None)
        assert cur.description is not None
        return [c.name for c in cur.description], cur.fetchall()


# --- reads ------------------------------------------------------------------------------------


async def test_every_valid_read_returns_the_rows_the_database_returns(shop_dsn: str) -> None:
    async with Gateway.connect(shop_dsn) as gw:
        for read in VALID_READS:
            result = await gw.query(AGENT, {"sql": read.sql, "params": list(read.params)})
            names, rows = _direct_rows(shop_dsn, read.sql, read.params)
            assert result.status == "ok", read.sql
            assert not result.truncated
            assert [re.sub(r"_\d+$", "", c) for c in result.columns] == names, read.sql
            assert result.row_count == len(rows) == len(result.rows), read.sql
            got = [tuple(row[c] for c in result.columns) for row in result.rows]
            if re.search(r"now\(\)|current_date", read.sql):
                continue  # the clock moved between the two runs
            # Unordered reads may come back in another order from another plan.
            assert sorted(map(repr, got)) == sorted(map(repr, rows)), read.sql


async def test_sql_placeholders_are_bound_by_the_server_and_text_is_sent_unchanged(
    shop_dsn: str,
) -> None:
    async with Gateway.connect(shop_dsn) as gw:
        result = await gw.query(
            AGENT,
            {
                "sql": "SELECT '$1 %s %%' AS lit, $1::text AS p, $2::int[] AS a, "
                "$3::jsonb ->> 'k' AS j, $4::int AS n",
                "params": ["it's; DROP TABLE orders", [1, 2], {"k": "v"}, None],
            },
        )
    assert result.rows == [
        {"lit": "$1 %s %%", "p": "it's; DROP TABLE orders", "a": [1, 2], "j": "v", "n": None}
    ]


async def test_repeated_column_names_get_a_suffix_so_no_value_is_lost(shop_dsn: str) -> None:
    async with Gateway.connect(shop_dsn) as gw:
        result = await gw.query(
            AGENT,
            {
                "sql": "SELECT o.id, c.id, o.id AS id_2 FROM orders o "
                "JOIN customers c ON c.id = o.customer_id WHERE o.id = $1",
                "params": [3],
            },
        )
    assert result.columns == ("id", "id_3", "id_2")
    assert result.rows == [{"id": 3, "id_3": 2, "id_2": 3}]


async def test_structured_reads_run(shop_dsn: str) -> None:
    async with Gateway.connect(shop_dsn) as gw:
        found = await gw.query(
            AGENT,
            {
                "op": "find",
                "table": "orders",
                "where": {"status": {"in": ["paid", "open"]}, "total": {"gt": 20}},
                "columns": ["id"],
                "order_by": ["-id"],
            },
        )
        counted = await gw.query(
            AGENT, {"op": "count", "table": "orders", "where": {"status": "paid"}}
        )
    assert found.rows == [{"id": 8}, {"id": 6}, {"id": 3}, {"id": 1}]
    assert counted.rows == [{"count": 5}]
    assert counted.emptiness is None


async def test_the_journal_is_invisible_to_agents(shop_dsn: str) -> None:
    async with Gateway.connect(shop_dsn) as gw:
        assert not any(t.schema == "corral" for t in gw.catalog.tables.values())
        error = await refused(gw, {"sql": "SELECT * FROM corral.gateway_journal"})
        assert error.code == "unknown_table"
        error = await refused(gw, {"op": "find", "table": "corral.gateway_journal"})
        assert error.code == "unknown_table"


async def test_a_keyed_write_cannot_reach_the_gateways_own_sequences(shop_dsn: str) -> None:
    seq = "corral.corral_breaker_records_seq_seq"
    async with Gateway.connect(shop_dsn) as gw:
        await gw.freeze("agent-1", "first", by="ops")
        (before,) = fetch(shop_dsn, f"SELECT last_value, is_called FROM {seq}")
        for n, sql in enumerate(
            (
                f"SELECT setval('{seq}', 9223372036854775807)",
                f"SELECT nextval('{seq}')",
                f"SELECT nextval('{seq.upper()}'::text)",
            )
        ):
            error = await refused(gw, {"sql": sql, "idempotency_key": f"k{n}"})
            assert error.code == "unknown_table", sql
            assert error.details["table"] == seq
        assert fetch(shop_dsn, f"SELECT last_value, is_called FROM {seq}") == [before]
        # Freezes are still recorded, and survive a restart.
        await gw.freeze("agent-2", "second", by="ops")
    async with Gateway.connect(shop_dsn) as gw:
        assert set(gw.frozen_agents()) == {"agent-1", "agent-2"}


async def test_a_column_of_a_catalog_object_type_names_nothing_hidden(shop_dsn: str) -> None:
    execute(
        shop_dsn,
        "CREATE TABLE audit_log (id integer PRIMARY KEY, rel regclass)",
        "INSERT INTO audit_log VALUES (1, 'orders')",
    )
    async with Gateway.connect(shop_dsn, breaker=None) as gw:
        read = await gw.query(AGENT, {"sql": "SELECT rel::text AS rel FROM audit_log"})
        assert read.rows == [{"rel": "orders"}]
        before = fetch(shop_dsn, "SELECT id, rel::text FROM audit_log")
        for request in (
            {"sql": "SELECT * FROM audit_log"},
            {
                "sql": "SELECT x::text FROM (SELECT rel AS x FROM audit_log UNION ALL "
                "SELECT g FROM generate_series(16384, 200000) g) s"
            },
            {"sql": "SELECT id FROM audit_log WHERE rel = 'corral.gateway_journal'"},
            {
                "sql": "UPDATE audit_log SET rel = 'corral.gateway_journal'",
                "idempotency_key": "k1",
            },
            {"op": "find", "table": "audit_log", "where": {"rel": "corral.gateway_journal"}},
        ):
            assert (await refused(gw, request)).code == "forbidden_function", request
        assert fetch(shop_dsn, "SELECT id, rel::text FROM audit_log") == before


# --- escapes and the read-only backstop ------------------------------------------------------


async def test_every_escape_is_refused_and_the_database_is_unchanged(shop_dsn: str) -> None:
    paths = {Path(p) for e in ESCAPES for p in re.findall(r"/tmp/[\w.]+", e.sql)}
    before_files = {p: p.exists() for p in paths}
    # Analysis alone is under test: the breakers would freeze the agent after ten refusals.
    async with Gateway.connect(shop_dsn, breaker=None) as gw:
        before = checksum(shop_dsn)
        for escape in ESCAPES:
            error = await refused(gw, {"sql": escape.sql})
            expected = "idempotency_key_required" if escape.expect == "write" else escape.expect
            assert error.code == expected, escape
            assert error.retryable is False
        assert len(ESCAPES) >= 30
        assert checksum(shop_dsn) == before
    assert {p: p.exists() for p in paths} == before_files


def _misclassify(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make analysis call every statement a read, as a classification bug would."""

    def as_read(sql: str, catalog: Catalog) -> Analysis:
        return dataclasses.replace(analyze(sql, catalog), kind="read", written=())

    monkeypatch.setattr(_plan, "analyze", as_read)
    # Plans keep what analysis said per text: a fresh cache for the misclassified ones.
    monkeypatch.setattr(_plan, "_SHAPES", {})


@pytest.mark.parametrize(
    "sql",
    [
        "WITH gone AS (DELETE FROM orders RETURNING id) SELECT count(*) FROM gone",
        "WITH x AS (UPDATE orders SET status = 'void' RETURNING id) SELECT * FROM x",
        "WITH x AS (INSERT INTO refunds VALUES (1, 1, 1) RETURNING id) SELECT * FROM x",
        "SELECT nextval('invoice_numbers')",
        "SELECT setval('invoice_numbers', 40)",
        "DELETE FROM order_items",
        "UPDATE orders SET status = 'void' WHERE status = $1",
    ],
)
async def test_a_write_the_analysis_missed_fails_read_only_and_changes_nothing(
    shop_dsn: str, monkeypatch: pytest.MonkeyPatch, sql: str
) -> None:
    _misclassify(monkeypatch)
    params = ["paid"] if "$1" in sql else []
    async with Gateway.connect(shop_dsn) as gw:
        before = checksum(shop_dsn)
        error = await refused(gw, {"sql": sql, "params": params})
        assert error.code == "read_only_violation"
        assert error.retryable is False
        assert error.details["sqlstate"] == "25006"
        assert "READ ONLY" in error.message
        assert checksum(shop_dsn) == before


async def test_a_volatile_function_that_writes_fails_read_only(shop_dsn: str) -> None:
    async with Gateway.connect(shop_dsn) as gw:
        before = checksum(shop_dsn)
        error = await refused(gw, {"sql": "SELECT gw_touch()"})
        assert error.code == "read_only_violation"
        # Also when the read comes back empty and is run again in a snapshot.
        error = await refused(gw, {"sql": "SELECT gw_touch() FROM orders WHERE id = 1"})
        assert error.code == "read_only_violation"
        assert checksum(shop_dsn) == before


async def test_a_session_whose_read_only_default_was_changed_is_not_trusted(shop_dsn: str) -> None:
    async with Gateway.connect(shop_dsn, pool_size=1) as gw:
        before = checksum(shop_dsn)
        unlocked = await gw.query(AGENT, {"sql": "SELECT gw_unlock()"})
        assert unlocked.rows == [{"gw_unlock": "off"}]
        # Same connection (pool_size=1): the read still runs READ ONLY, explicitly.
        error = await refused(gw, {"sql": "SELECT gw_touch()"})
        assert error.code == "read_only_violation"
        again = await gw.query(
            AGENT, {"sql": "SELECT current_setting('default_transaction_read_only') AS ro"}
        )
        assert again.rows == [{"ro": "on"}]  # the tampered connection was closed
        assert checksum(shop_dsn) == before


# --- loud empties -----------------------------------------------------------------------------


async def test_a_filter_that_matches_nothing_in_a_table_with_rows_is_suspicious(
    shop_dsn: str,
) -> None:
    async with Gateway.connect(shop_dsn) as gw:
        result = await gw.query(
            AGENT, {"sql": "SELECT id, status FROM orders WHERE status = $1", "params": ["PAID"]}
        )
        assert result.rows == []
        assert result.row_count == 0
        assert result.columns == ("id", "status")
        assert result.emptiness == "suspiciously_empty"
        assert len(result.warnings) == 1
        assert "orders holds rows" in result.warnings[0]
        assert "filter matched none" in result.warnings[0]

        joined = await gw.query(
            AGENT,
            {
                "sql": "SELECT o.id FROM orders o LEFT JOIN refunds r ON r.order_id = o.id "
                "WHERE o.status = 'PAID'"
            },
        )
        assert joined.emptiness == "suspiciously_empty"
        assert "orders holds rows" in joined.warnings[0]
        assert "refunds" not in joined.warnings[0]
        # Without its filters, an inner join with an empty table is still empty.
        inner = await gw.query(
            AGENT,
            {
                "sql": "SELECT o.id FROM orders o JOIN refunds r ON r.order_id = o.id "
                "WHERE o.status = 'paid'"
            },
        )
        assert (inner.emptiness, inner.warnings) == ("genuinely_empty", ())

        found = await gw.query(
            AGENT, {"op": "find", "table": "customers", "where": {"country": "XX"}}
        )
        assert found.emptiness == "suspiciously_empty"
        assert "customers holds rows" in found.warnings[0]
        counted = await gw.query(
            AGENT, {"op": "count", "table": "customers", "where": {"country": "XX"}}
        )
        assert counted.rows == [{"count": 0}]
        assert counted.emptiness == "suspiciously_empty"
        assert "counted none" in counted.warnings[0]


async def test_empty_tables_and_unfiltered_reads_are_genuinely_empty(shop_dsn: str) -> None:
    async with Gateway.connect(shop_dsn) as gw:
        cases: list[dict[str, Any]] = [
            {"sql": "SELECT * FROM refunds WHERE amount > $1", "params": [10]},
            {"sql": "SELECT * FROM refunds"},
            {"op": "find", "table": "refunds", "where": {"order_id": 3}},
            {"op": "find", "table": "refunds", "offset": 100},
            {"op": "count", "table": "refunds", "where": {"order_id": 3}},
        ]
        for request in cases:
            result = await gw.query(AGENT, request)
            assert result.emptiness == "genuinely_empty", request
            assert result.warnings == (), request
        # A function in FROM stands for one row without the filters: the filter, not the
        # data, emptied this read (no table to name).
        series = await gw.query(AGENT, {"sql": "SELECT g FROM generate_series(1, 3) g WHERE g > 5"})
        assert series.emptiness == "suspiciously_empty"
        assert "without its filters it returns rows" in series.warnings[0]
        described = await gw.query(AGENT, {"sql": "SELECT * FROM refunds"})
        assert described.columns == ("id", "order_id", "amount")
        assert described.rows == []

        present = await gw.query(
            AGENT, {"sql": "SELECT id FROM orders WHERE id = $1", "params": [1]}
        )
        assert present.emptiness is None
        assert present.warnings == ()


async def test_a_structured_read_paged_past_the_last_row_is_suspicious(shop_dsn: str) -> None:
    async with Gateway.connect(shop_dsn) as gw:
        past = await gw.query(AGENT, {"op": "find", "table": "orders", "offset": 100})
        paged = await gw.query(
            AGENT, {"op": "find", "table": "orders", "order_by": ["id"], "limit": 5, "offset": 1}
        )
        error = await refused(gw, {"op": "find", "table": "orders", "limit": 0})
    assert (past.rows, past.emptiness) == ([], "suspiciously_empty")
    assert "orders holds rows" in past.warnings[0]
    assert paged.emptiness is None
    assert paged.rows
    assert (error.code, error.details["key"]) == ("invalid_operation", "limit")


async def test_an_empty_read_ending_in_a_semicolon_and_comment_is_classified(shop_dsn: str) -> None:
    async with Gateway.connect(shop_dsn) as gw:
        result = await gw.query(AGENT, {"sql": "SELECT id FROM orders WHERE id = -1; -- none"})
    assert result.emptiness == "suspiciously_empty"
    assert result.columns == ("id",)


# --- row cap and statement timeout ------------------------------------------------------------


async def test_rows_beyond_max_rows_are_cut_and_flagged(shop_dsn: str) -> None:
    async with Gateway.connect(shop_dsn, max_rows=3) as gw:
        many = await gw.query(AGENT, {"sql": "SELECT g FROM generate_series(1, 100000) g"})
        assert many.rows == [{"g": 1}, {"g": 2}, {"g": 3}]
        assert many.truncated is True
        assert many.row_count == 3
        exact = await gw.query(AGENT, {"sql": "SELECT g FROM generate_series(1, 3) g"})
        assert exact.row_count == 3
        assert exact.truncated is False
        # Only the first max_rows + 1 rows are read: row 5 would divide by zero.
        early = await gw.query(
            AGENT, {"sql": "SELECT g, 10 / (5 - g) AS q FROM generate_series(1, 10) g"}
        )
        assert [r["q"] for r in early.rows] == [2, 3, 5]
        assert early.truncated is True
        ops = await gw.query(AGENT, {"op": "find", "table": "orders", "order_by": ["id"]})
        assert [r["id"] for r in ops.rows] == [1, 2, 3]
        assert ops.truncated
        # The connection is usable after a cut stream.
        after = await gw.query(AGENT, {"sql": "SELECT 1 AS one"})
        assert after.rows == [{"one": 1}]


async def test_a_statement_over_the_timeout_is_cancelled_and_retryable(shop_dsn: str) -> None:
    async with Gateway.connect(shop_dsn, statement_timeout_s=0.2) as gw:
        error = await refused(gw, {"sql": "SELECT gw_sleep(30)"})
        assert error.code == "statement_timeout"
        assert error.retryable is True
        assert "0.2 s" in error.message
        assert error.details["timeout_s"] == 0.2
        after = await gw.query(AGENT, {"sql": "SELECT 1 AS one"})
        assert after.rows == [{"one": 1}]


# --- database errors --------------------------------------------------------------------------


async def test_database_errors_carry_the_sqlstate_never_a_psycopg_exception(shop_dsn: str) -> None:
    async with Gateway.connect(shop_dsn) as gw:
        error = await refused(gw, {"sql": "SELECT 1 / 0 AS x"})
        assert error.code == "invalid_data"
        assert error.details["sqlstate"] == "22012"
        assert "division by zero" in error.message
        error = await refused(gw, {"sql": "SELECT $1::int AS n", "params": ["abc"]})
        assert (error.code, error.details["sqlstate"]) == ("invalid_data", "22P02")
        error = await refused(
            gw,
            {
                "op": "insert",
                "table": "customers",
                "values": {
                    "id": 1,
                    "name": "x",
                    "email": "x",
                    "country": "FR",
                    "created_at": "2024-01-01",
                },
                "idempotency_key": "dup",
            },
        )
        assert (error.code, error.details["sqlstate"]) == ("constraint_violation", "23505")
        assert "Key (id)" not in error.message  # the detail, with row values, is in details
        assert "Key (id)=(1)" in error.details["database_detail"]


async def test_a_lost_connection_is_unavailable_then_recovers(shop_dsn: str) -> None:
    async with Gateway.connect(shop_dsn, pool_size=1) as gw:
        await gw.query(AGENT, {"sql": "SELECT 1 AS one"})
        killed = fetch(
            shop_dsn,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name = %s",
            [f"corral-gateway:{AGENT}"],
        )
        assert killed == [(True,)]
        error = await refused(gw, {"sql": "SELECT 1 AS one"})
        assert error.code == "database_unavailable"
        assert error.retryable is True
        again = await gw.query(AGENT, {"sql": "SELECT 1 AS one"})
        assert again.rows == [{"one": 1}]


async def test_connecting_to_nothing_is_unavailable(shop_dsn: str) -> None:
    with pytest.raises(GatewayError) as info:
        async with Gateway.connect("postgresql://postgres@127.0.0.1:1/x", connect_timeout_s=2):
            pass
    assert info.value.code == "database_unavailable"
    assert "postgres@" not in info.value.message


# --- catalog refresh --------------------------------------------------------------------------


async def test_a_table_created_after_connect_is_found_and_a_dropped_column_refused(
    shop_dsn: str,
) -> None:
    async with Gateway.connect(shop_dsn) as gw:
        version = gw.catalog.version
        execute(shop_dsn, "CREATE TABLE shipments (id int PRIMARY KEY, carrier text)")
        result = await gw.query(AGENT, {"sql": "SELECT carrier FROM shipments"})
        assert result.emptiness == "genuinely_empty"
        assert gw.catalog.version != version

        execute(shop_dsn, "ALTER TABLE shipments DROP COLUMN carrier")
        error = await refused(gw, {"sql": "SELECT carrier FROM shipments"})
        assert error.code == "unknown_column"  # the database's 42703 led to a reload


async def test_on_demand_reloads_are_rate_limited_and_old_catalogs_reloaded(shop_dsn: str) -> None:
    clock = FakeClock()
    async with Gateway.connect(
        shop_dsn, clock=clock, catalog_refresh_s=10, catalog_max_age_s=60
    ) as gw:
        execute(shop_dsn, "CREATE TABLE first_new (id int)")
        await gw.query(AGENT, {"sql": "SELECT * FROM first_new"})
        execute(shop_dsn, "CREATE TABLE second_new (id int)")
        error = await refused(gw, {"sql": "SELECT * FROM second_new"})
        assert error.code == "unknown_table"  # within 10 s of the last reload: none
        clock.advance(10)
        await gw.query(AGENT, {"sql": "SELECT * FROM second_new"})

        execute(shop_dsn, "CREATE TABLE third_new (id int)")
        await gw.query(AGENT, {"sql": "SELECT 1 AS one"})
        assert gw.catalog.table("third_new") is None
        clock.advance(60)
        await gw.query(AGENT, {"sql": "SELECT 1 AS one"})
        assert gw.catalog.table("third_new") is not None


async def test_an_unchanged_schema_keeps_its_catalog(shop_dsn: str) -> None:
    async with Gateway.connect(shop_dsn) as gw:
        catalog = gw.catalog
        assert await gw.refresh_catalog() is catalog


# --- prepared statements ----------------------------------------------------------------------


async def test_prepared_statements_follow_a_change_of_their_result_shape(shop_dsn: str) -> None:
    read = {"sql": "SELECT * FROM customers WHERE id = $1", "params": [1]}

    def rename(n: int) -> dict[str, Any]:
        return {
            "sql": "UPDATE customers SET name = $1 WHERE id = 1 RETURNING *",
            "params": [f"name-{n}"],
            "idempotency_key": f"rename-{n}",
        }

    async with Gateway.connect(shop_dsn, pool_size=1) as gw:
        for _ in range(3):  # prepared by the first, reused by the others
            before = await gw.query(AGENT, read)
        await gw.query(AGENT, rename(0))
        execute(shop_dsn, "ALTER TABLE customers ADD COLUMN tier text DEFAULT 'gold'")
        renamed = await gw.query(AGENT, rename(1))  # the write's statements went stale
        assert renamed.rows == [{**before.rows[0], "name": "name-1", "tier": "gold"}]
        after = await gw.query(AGENT, read)
        assert after.columns == (*before.columns, "tier")
        assert after.rows == renamed.rows
        execute(shop_dsn, "ALTER TABLE customers ALTER COLUMN tier TYPE varchar(10)")
        assert (await gw.query(AGENT, read)).rows == after.rows  # the read's went stale


async def test_statements_past_the_limit_of_a_connection_are_closed(shop_dsn: str) -> None:
    limit = _wire._STATEMENTS_PER_CONNECTION

    def numbered(n: int) -> dict[str, Any]:
        return {"sql": f"SELECT id, {n} AS n FROM orders WHERE id = $1", "params": [1]}

    async with Gateway.connect(shop_dsn, pool_size=1) as gw:
        for n in range(limit + 20):
            assert (await gw.query(AGENT, numbered(n))).rows == [{"id": 1, "n": n}]
        assert (await gw.query(AGENT, numbered(0))).rows == [{"id": 1, "n": 0}]
        async with postgres_of(gw).pools.lease(AGENT) as lease:
            cur = await lease.conn.execute("SELECT count(*) FROM pg_prepared_statements")
            row = await cur.fetchone()
    # The statement evicted by the last request is closed with the next one.
    assert row is not None
    assert limit <= row[0] <= limit + 1


async def test_a_cut_read_leaves_its_connection_ready(shop_dsn: str) -> None:
    async with Gateway.connect(shop_dsn, pool_size=1, max_rows=2) as gw:
        for _ in range(3):
            many = await gw.query(AGENT, {"sql": "SELECT g FROM generate_series(1, 50000) g"})
            assert (many.rows, many.truncated) == ([{"g": 1}, {"g": 2}], True)
            point = {"sql": "SELECT id FROM orders WHERE id = $1", "params": [4]}
            one = await gw.query(AGENT, point)
            assert (one.rows, one.truncated) == ([{"id": 4}], False)


async def test_a_table_whose_name_differs_only_by_case_never_stands_in_for_another(
    shop_dsn: str,
) -> None:
    # "Orders" (quoted) beside orders: both used to share one catalog entry, and the one the
    # catalog query listed first answered for both: an update of orders changed "Orders".
    execute(
        shop_dsn,
        'CREATE TABLE "Orders" (id int PRIMARY KEY, status text)',
        "INSERT INTO \"Orders\" VALUES (1, 'other')",
        'CREATE TABLE "Ghost" (id int)',
        'CREATE TABLE "GHOST" (id int)',
    )
    before = fetch(shop_dsn, "SELECT status FROM orders WHERE id = 1")
    async with Gateway.connect(shop_dsn) as gw:
        table = gw.catalog.table("orders")
        assert table is not None
        assert table.name == "orders"
        found = await gw.query(AGENT, {"op": "find", "table": "orders", "where": {"id": 1}})
        assert found.rows[0]["status"] == before[0][0]
        read = await gw.query(AGENT, {"sql": "SELECT status FROM orders WHERE id = 1"})
        assert read.rows == [{"status": before[0][0]}]
        await gw.query(
            AGENT,
            {
                "op": "update",
                "table": "orders",
                "set": {"status": "changed"},
                "where": {"id": 1},
                "idempotency_key": "case-1",
            },
        )
        # Two names of which neither is the lower-case one: neither is offered.
        error = await refused(gw, {"sql": "SELECT * FROM ghost"})
        assert error.code == "unknown_table"
    assert fetch(shop_dsn, "SELECT status FROM orders WHERE id = 1") == [("changed",)]
    assert fetch(shop_dsn, 'SELECT status FROM "Orders" WHERE id = 1') == [("other",)]
