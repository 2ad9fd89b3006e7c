"""SQL analysis: refusals with their codes, classification, the two corpora, the cache."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from corral.daemon import http_status
from corral.gateway import Gateway, GatewayError, compile_operation
from corral.gateway._catalog import Catalog, Column, Table
from corral.gateway._catalog_load import load_postgres_catalog, load_sqlite_catalog
from corral.gateway._sql_functions import (
    CATALOG_OBJECT_TYPES,
    FORBIDDEN_FUNCTION_PREFIXES,
    FORBIDDEN_FUNCTIONS,
    forbidden_function_reason,
    forbidden_type_reason,
)
from corral.gateway.postgres._names import Resolver
from corral.gateway.postgres._parse import parse
from corral.gateway.postgres._sql import Analysis, SqlAnalyzer, analyze
from corral.gateway.postgres._tree import unwrap
from corral.kernel import InvalidArgumentError
from tests.gateway.corpus import ESCAPES, VALID_READS, load_shop_postgres, load_shop_sqlite


def _table(name: str, *columns: tuple[str, str, bool, bool], schema: str = "public") -> Table:
    return Table(name, schema, {c[0]: Column(*c) for c in columns})


def shop_catalog(version: str = "shop-v1") -> Catalog:
    """The shop of tests/gateway/corpus.py, in memory (checked against PostgreSQL below)."""
    tables = [
        _table(
            "customer_revenue",
            ("customer_id", "integer", True, False),
            ("name", "text", True, False),
            ("revenue", "numeric", True, False),
        ),
        _table(
            "customers",
            ("id", "integer", False, True),
            ("name", "text", False, False),
            ("email", "text", False, False),
            ("country", "text", False, False),
            ("tags", "text[]", False, False),
            ("created_at", "timestamp with time zone", False, False),
        ),
        _table(
            "order_items",
            ("order_id", "integer", False, True),
            ("product_id", "integer", False, True),
            ("quantity", "integer", False, False),
            ("unit_price", "numeric(10,2)", False, False),
        ),
        _table(
            "orders",
            ("id", "integer", False, True),
            ("customer_id", "integer", False, False),
            ("status", "text", False, False),
            ("total", "numeric(10,2)", False, False),
            ("created_at", "timestamp with time zone", False, False),
            ("meta", "jsonb", True, False),
        ),
        _table(
            "products",
            ("id", "integer", False, True),
            ("sku", "text", False, False),
            ("name", "text", False, False),
            ("category", "text", False, False),
            ("price", "numeric(10,2)", False, False),
            ("attrs", "jsonb", False, False),
        ),
    ]
    sequence = _table(
        "invoice_numbers",
        ("last_value", "bigint", False, False),
        ("log_cnt", "bigint", False, False),
        ("is_called", "boolean", False, False),
    )
    return Catalog({t.name: t for t in tables}, version, "postgresql", {sequence.name: sequence})


SHOP = shop_catalog()


def refused(sql: str, catalog: Catalog = SHOP) -> GatewayError:
    with pytest.raises(GatewayError) as info:
        analyze(sql, catalog)
    return info.value


# --- the corpora, in memory --------------------------------------------------------------------


def test_corpora_are_large_enough() -> None:
    assert len(ESCAPES) >= 35
    assert len(VALID_READS) >= 35
    assert len({e.sql for e in ESCAPES}) == len(ESCAPES)
    assert len({r.sql for r in VALID_READS}) == len(VALID_READS)


@pytest.mark.parametrize("escape", ESCAPES, ids=[e.note for e in ESCAPES])
def test_escape_is_refused_with_its_code_or_classified_as_a_write(escape: Any) -> None:
    if escape.expect == "write":
        assert analyze(escape.sql, SHOP).kind == "write"
    else:
        assert refused(escape.sql).code == escape.expect


@pytest.mark.parametrize("read", VALID_READS, ids=range(len(VALID_READS)))
def test_valid_read_passes_as_a_read_of_its_tables(read: Any) -> None:
    result = analyze(read.sql, SHOP)
    assert result.kind == "read"
    assert set(result.tables) == read.tables
    assert result.written == ()
    assert result.param_count == len(read.params)


# --- the corpora against PostgreSQL ------------------------------------------------------------


@pytest.fixture
def shop_dsn(postgres_dsn: str) -> str:
    with psycopg.connect(postgres_dsn) as conn:
        load_shop_postgres(conn)
    return postgres_dsn


async def _load(dsn: str) -> Catalog:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        return await load_postgres_catalog(conn)


def _counts(conn: psycopg.Connection[Any]) -> dict[str, int]:
    return {
        t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]  # type: ignore[index]
        for t in ("customers", "products", "orders", "order_items")
    } | {"seq": conn.execute("SELECT last_value FROM invoice_numbers").fetchone()[0]}  # type: ignore[index]


@pytest.mark.postgres
async def test_corpora_against_the_catalog_loaded_from_postgres(shop_dsn: str) -> None:
    catalog = await _load(shop_dsn)
    # The in-memory shop is the same description as the real one.
    assert {k: (t.schema, dict(t.columns)) for k, t in catalog.tables.items()} == {
        k: (t.schema, dict(t.columns)) for k, t in SHOP.tables.items()
    }
    assert {k: (t.schema, dict(t.columns)) for k, t in catalog.sequences.items()} == {
        k: (t.schema, dict(t.columns)) for k, t in SHOP.sequences.items()
    }
    analyzer = SqlAnalyzer()
    wrong: list[tuple[str, str, object]] = []
    for escape in ESCAPES:
        try:
            outcome: str = analyzer.analyze(escape.sql, catalog).kind
        except GatewayError as exc:
            outcome = exc.code
        if outcome != escape.expect:
            wrong.append((escape.sql, escape.expect, outcome))
    for read in VALID_READS:
        try:
            result = analyzer.analyze(read.sql, catalog)
        except GatewayError as exc:
            wrong.append((read.sql, "read", exc.code))
            continue
        if result.kind != "read" or set(result.tables) != read.tables:
            wrong.append((read.sql, "read", result))
    assert wrong == []


@pytest.mark.postgres
def test_every_valid_read_runs_read_only_on_postgres(shop_dsn: str) -> None:
    """The corpus is real SQL: each read runs in a READ ONLY transaction and changes nothing."""
    with psycopg.connect(shop_dsn) as conn:
        before = _counts(conn)
        conn.rollback()
        failures = []
        for read in VALID_READS:
            try:
                with conn.transaction(), psycopg.RawCursor(conn) as cur:
                    cur.execute("SET TRANSACTION READ ONLY")
                    cur.execute(read.sql, read.params or None)
                    cur.fetchall()
            except psycopg.Error as exc:
                failures.append((read.sql, str(exc)))
        assert failures == []
        assert _counts(conn) == before


@pytest.mark.postgres
def test_escapes_classified_as_writes_fail_in_a_read_only_transaction(shop_dsn: str) -> None:
    with psycopg.connect(shop_dsn) as conn:
        before = _counts(conn)
        conn.rollback()
        writes = [e for e in ESCAPES if e.expect == "write"]
        assert len(writes) >= 4
        for escape in writes:
            with conn.transaction():
                conn.execute("SET TRANSACTION READ ONLY")
                with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
                    conn.execute(escape.sql)
        assert _counts(conn) == before


# --- parse_error and multiple_statements -------------------------------------------------------


def test_parse_error_carries_the_parser_message_and_position() -> None:
    error = refused("SELECT * FORM orders")
    assert error.code == "parse_error"
    assert error.details["position"] == 10
    assert error.details["parser_message"] == 'syntax error at or near "FORM"'
    assert "at position 10" in error.message
    assert http_status(error) == 400
    assert error.retryable is False


def test_parse_error_position_counts_characters_not_bytes() -> None:
    error = refused("SELECT 'éé' AS x FORM orders")
    assert error.details["position"] == 18
    assert error.details["parser_message"] == 'syntax error at or near "FORM"'
    located = refused("SELECT 'éé' FROM ordrs")  # node locations are bytes: converted
    assert located.details["position"] == 18


@pytest.mark.parametrize("sql", ["", "   ", "-- nothing", "/* x */ ;", ";;"])
def test_no_statement_is_a_parse_error(sql: str) -> None:
    error = refused(sql)
    assert error.code == "parse_error"
    assert "holds no statement" in error.message


@pytest.mark.parametrize(
    ("sql", "count"),
    [
        ("SELECT 1; SELECT 2", 2),
        ("SELECT 1;SELECT 2;SELECT 3;", 3),
        ("SELECT 'a;b'; SELECT 2", 2),
    ],
)
def test_multiple_statements_are_counted(sql: str, count: int) -> None:
    error = refused(sql)
    assert error.code == "multiple_statements"
    assert error.details == {"count": count}
    assert str(count) in error.message


@pytest.mark.parametrize("sql", ["SELECT 1;", "SELECT 1 ; ;", "SELECT ';' AS x", "SELECT 1 -- ;"])
def test_one_statement_with_semicolons_in_text_or_at_the_end_passes(sql: str) -> None:
    assert analyze(sql, SHOP).kind == "read"


# --- forbidden_statement -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "statement"),
    [
        ("COPY orders TO STDOUT", "COPY"),
        ("BEGIN", "BEGIN"),
        ("START TRANSACTION", "START TRANSACTION"),
        ("ROLLBACK TO SAVEPOINT s", "ROLLBACK TO SAVEPOINT"),
        ("COMMIT", "COMMIT"),
        ("SET TRANSACTION READ WRITE", "SET TRANSACTION"),
        ("SET search_path = evil", "SET"),
        ("RESET search_path", "RESET"),
        ("SHOW data_directory", "SHOW"),
        ("CREATE TABLE x (id int)", "CREATE TABLE"),
        ("CREATE TABLE x AS SELECT 1", "CREATE TABLE AS"),
        ("REFRESH MATERIALIZED VIEW customer_revenue", "REFRESH MATERIALIZED VIEW"),
        ("DO $$ BEGIN END $$", "DO"),
        ("CALL p()", "CALL"),
        ("LISTEN x", "LISTEN"),
        ("UNLISTEN *", "UNLISTEN"),
        ("CLUSTER orders", "CLUSTER"),
        ("REINDEX TABLE orders", "REINDEX"),
        ("REVOKE ALL ON orders FROM PUBLIC", "REVOKE"),
        ("GRANT SELECT ON orders TO PUBLIC", "GRANT"),
        ("VACUUM orders", "VACUUM"),
        ("ANALYZE orders", "ANALYZE"),
        ("FETCH ALL FROM c", "FETCH"),
        ("EXPLAIN CREATE TABLE x AS SELECT 1", "EXPLAIN CREATE TABLE AS"),
        ("EXPLAIN ANALYZE DELETE FROM orders", "EXPLAIN ANALYZE"),
        ("SELECT 1 INTO t", "SELECT INTO"),
        ("SELECT * FROM orders FOR SHARE", "SELECT FOR UPDATE"),
        ("MERGE INTO orders USING customers ON false WHEN MATCHED THEN DELETE", "MERGE"),
        (
            "WITH m AS (MERGE INTO orders USING customers ON false WHEN MATCHED THEN DELETE) "
            "SELECT 1",
            "MERGE",
        ),
    ],
)
def test_forbidden_statement_names_the_statement(sql: str, statement: str) -> None:
    error = refused(sql)
    assert error.code == "forbidden_statement"
    assert error.details["statement"] == statement
    assert statement.split()[0] in error.message


def test_explain_of_a_read_or_of_an_unexecuted_write_is_a_read() -> None:
    assert analyze("EXPLAIN ANALYZE SELECT * FROM orders", SHOP).kind == "read"
    plain = analyze("EXPLAIN DELETE FROM orders WHERE id = 1", SHOP)
    assert (plain.kind, plain.written, plain.statement_type) == ("read", (), "EXPLAIN")
    for option in ("false", "off", "0"):
        off = analyze(f"EXPLAIN (ANALYZE {option}) DELETE FROM orders", SHOP)
        assert off.kind == "read", option
    for option in ("", " true", " on", " 1"):
        error = refused(f"EXPLAIN (ANALYZE{option}, BUFFERS) DELETE FROM orders")
        assert error.details["statement"] == "EXPLAIN ANALYZE", option


@pytest.mark.parametrize(
    "options",
    ["ANALYZE false, ANALYZE true", "ANALYZE off, BUFFERS, ANALYZE", "ANALYZE 0, ANALYZE on"],
)
def test_the_last_of_repeated_analyze_options_counts_as_in_postgresql(options: str) -> None:
    error = refused(f"EXPLAIN ({options}) DELETE FROM orders")
    assert (error.code, error.details["statement"]) == ("forbidden_statement", "EXPLAIN ANALYZE")
    assert analyze("EXPLAIN (ANALYZE true, ANALYZE false) DELETE FROM orders", SHOP).kind == "read"


def test_row_locks_are_allowed_in_a_write() -> None:
    result = analyze(
        "UPDATE orders SET status = 'x' WHERE id IN (SELECT id FROM orders FOR UPDATE)", SHOP
    )
    assert result.kind == "write"


# --- forbidden_function ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "function"),
    [
        ("SELECT pg_read_file('/etc/passwd')", "pg_read_file"),
        ("SELECT PG_CATALOG.Pg_Read_File('/x')", "pg_catalog.pg_read_file"),
        ("SELECT * FROM orders WHERE id = pg_sleep(1)::int", "pg_sleep"),
        ("SELECT * FROM lo_import('/etc/passwd') AS x", "lo_import"),
        ("WITH c AS (SELECT dblink_connect('x')) SELECT * FROM c", "dblink_connect"),
        ("SELECT (SELECT pg_advisory_lock(1))", "pg_advisory_lock"),
        ("SELECT count(*) OVER (ORDER BY pg_sleep_for('1s')) FROM orders", "pg_sleep_for"),
        ("SELECT f(x => pg_ls_waldir()) ", "pg_ls_waldir"),
        ("SELECT ts_rewrite('a'::tsquery, 'SELECT 1')", "ts_rewrite"),
        ("SELECT ('x'::text).pg_read_file", "pg_read_file"),
        ("SELECT o.pg_sleep FROM generate_series(1, 2) o", "pg_sleep"),
        ("INSERT INTO orders (id) VALUES (lo_creat(-1))", "lo_creat"),
        ("UPDATE orders SET status = set_config('a', 'b', true)", "set_config"),
    ],
)
def test_forbidden_function_names_the_function_and_its_position(sql: str, function: str) -> None:
    error = refused(sql)
    assert error.code == "forbidden_function"
    assert error.details["function"].lower() == function
    assert f"function {error.details['function']} is not allowed" in error.message
    position = error.details["position"]
    bare = function.rsplit(".", 1)[-1]
    assert bare in sql[position - 1 :].lower()


@pytest.mark.parametrize("type_name", sorted(CATALOG_OBJECT_TYPES))
@pytest.mark.parametrize(
    "template",
    [
        "SELECT 'pg_authid'::{t}",
        "SELECT CAST('x' AS {t})",
        "SELECT CAST('x' AS pg_catalog.{t})",
        "SELECT r::{t}::text FROM generate_series(1, 100) AS r",
        "SELECT '{{}}'::{t}[]",
        "SELECT '{{}}'::_{t}",
        "SELECT {t} 'x'",
        "SELECT x FROM jsonb_to_record('{{}}') AS t(x {t})",
        "SELECT id FROM orders WHERE id::oid::{t} IS NOT NULL",
        "SELECT {t}in('x'::cstring)",
    ],
)
def test_casts_to_catalog_object_types_are_refused(type_name: str, template: str) -> None:
    error = refused(template.format(t=type_name.upper() if "CAST" in template else type_name))
    assert error.code == "forbidden_function"
    assert type_name in error.details["function"].lower()
    assert "catalog" in error.message


def test_a_cast_to_a_catalog_object_type_names_the_type_and_its_position() -> None:
    sql = "SELECT id, 'pg_authid'::regclass FROM orders"
    error = refused(sql)
    assert error.details["function"] == "regclass"
    assert error.message.startswith("cast to regclass is not allowed through the gateway: ")
    assert "casts to catalog object types are not allowed" in error.message
    assert sql[error.details["position"] - 1 :].startswith("regclass")


def test_types_named_like_catalog_object_types_are_allowed() -> None:
    assert forbidden_type_reason("regexp") is None
    assert forbidden_type_reason("regclass", "sqlite") is None
    assert analyze("SELECT pg_typeof(id)::text FROM orders", SHOP).kind == "read"


@pytest.mark.parametrize(
    "name",
    [
        "pg_describe_object",
        "pg_identify_object",
        "pg_identify_object_as_address",
        "pg_get_object_address",
        "format_type",
        "pg_get_viewdef",
        "pg_get_ruledef",
        "pg_get_triggerdef",
        "pg_get_constraintdef",
        "pg_get_functiondef",
        "pg_get_indexdef",
        "pg_get_function_arguments",
        "pg_get_expr",
        "pg_get_userbyid",
        "pg_get_serial_sequence",
        "pg_sequence_last_value",
        "pg_stat_get_numscans",
        "pg_stat_get_db_xact_commit",
        "pg_stat_get_tuples_inserted",
        "pg_stat_get_archiver",
        "pg_relation_size",
        "pg_total_relation_size",
        "pg_table_size",
        "pg_indexes_size",
        "pg_relation_filenode",
        "to_regclass",
        "to_regtype",
        "to_regproc",
        "to_regrole",
        "to_regnamespace",
        "has_table_privilege",
        "has_schema_privilege",
        "has_function_privilege",
        "has_column_privilege",
        "pg_has_role",
        "pg_tablespace_databases",
        "inet_server_addr",
        "inet_server_port",
        "inet_client_addr",
        "inet_client_port",
        "pg_postmaster_start_time",
        "pg_conf_load_time",
        "pg_walfile_name",
        "pg_walfile_name_offset",
        "pg_current_wal_lsn",
        "pg_current_wal_insert_lsn",
        "pg_last_wal_replay_lsn",
        "pg_xact_status",
        "pg_xact_commit_timestamp",
        "obj_description",
        "col_description",
        "shobj_description",
        "pg_partition_root",
        "regclass",
        "regroleout",
        "regprocedurein",
    ],
)
def test_functions_revealing_the_catalog_or_the_server_are_refused(name: str) -> None:
    error = refused(f"SELECT pg_catalog.{name}(1) FROM orders")
    assert error.code == "forbidden_function"
    assert error.details["function"] == f"pg_catalog.{name}"
    reason = forbidden_function_reason(name)
    assert reason is not None
    assert reason.startswith(("it reveals the database's catalog", "it exposes the database"))


def test_harmless_neighbours_of_the_catalog_functions_are_allowed() -> None:
    for name in ("pg_get_keywords", "pg_column_size", "regexp_replace", "regr_slope"):
        assert forbidden_function_reason(name) is None, name
    assert analyze("SELECT * FROM pg_get_keywords()", SHOP).kind == "read"


def test_the_forbidden_lists_are_what_the_reason_function_applies() -> None:
    for name in FORBIDDEN_FUNCTIONS:
        assert forbidden_function_reason(name) == FORBIDDEN_FUNCTIONS[name]
        assert forbidden_function_reason(f"pg_catalog.{name.upper()}") is not None
    for prefix in FORBIDDEN_FUNCTION_PREFIXES:
        assert forbidden_function_reason(prefix + "anything") is not None
    for name in ("lower", "log", "now", "pg_size_pretty", "jsonb_each", "similarity", "setval"):
        assert forbidden_function_reason(name) is None
    assert forbidden_function_reason("readfile") is None
    assert forbidden_function_reason("readfile", "sqlite") is not None


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("gin_clean_pending_list", "maintains an index"),
        ("brin_summarize_new_values", "maintains an index"),
        ("brin_summarize_range", "maintains an index"),
        ("brin_desummarize_range", "maintains an index"),
        ("set_limit", "session state"),
        ("setseed", "session state"),
        ("txid_current", "transaction id"),
        ("pg_current_xact_id", "transaction id"),
        ("pg_stat_get_activity", "other sessions"),
        ("pg_stat_get_backend_activity", "other sessions"),
        ("pg_stat_get_backend_client_addr", "other sessions"),
        ("pg_hba_file_rules", "configuration"),
        ("pg_ident_file_mappings", "configuration"),
        ("pg_show_all_file_settings", "configuration"),
        ("pg_show_all_settings", "configuration"),
        ("pg_lock_status", "other sessions"),
        ("pg_database_size", "database server"),
        ("pg_tablespace_size", "database server"),
        ("pg_control_checkpoint", "database server"),
        ("pg_control_system", "database server"),
        ("pg_control_init", "database server"),
        ("pg_control_recovery", "database server"),
        ("pg_ls_logicalsnapdir", "files"),
        ("current_setting", "server settings"),
    ],
)
def test_functions_that_last_or_expose_the_server_are_forbidden(name: str, why: str) -> None:
    reason = forbidden_function_reason(f"pg_catalog.{name}")
    assert reason is not None
    assert why in reason
    error = refused(f"SELECT * FROM {name}(1)")
    assert (error.code, error.details["function"]) == ("forbidden_function", name)
    assert why in error.message


def test_functions_that_change_nothing_that_lasts_stay_allowed() -> None:
    for name in ("txid_current_if_assigned", "pg_current_xact_id_if_assigned", "pg_size_pretty"):
        assert forbidden_function_reason(name) is None, name
        assert analyze(f"SELECT {name}()", SHOP).kind == "read"


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT current_setting('TimeZone'), current_setting('datestyle')",
        "SELECT current_setting('DEFAULT_TRANSACTION_READ_ONLY')",
        "SELECT pg_catalog.current_setting('server_version_num'::text, true)",
        "SELECT id FROM orders WHERE current_setting('transaction_read_only') = 'on'",
    ],
)
def test_current_setting_of_a_readable_setting_passes(sql: str) -> None:
    assert analyze(sql, SHOP).kind == "read"


@pytest.mark.parametrize(
    ("sql", "seen"),
    [
        ("SELECT current_setting('data_directory')", "'data_directory'"),
        ("SELECT current_setting('config_file')", "'config_file'"),
        ("SELECT current_setting('hba_file', true)", "'hba_file'"),
        ("SELECT current_setting('app.jwt_secret', true)", "'app.jwt_secret'"),
        ("SELECT current_setting($1)", None),
        ("SELECT current_setting('data_' || 'directory')", None),
        ("SELECT current_setting(setting_name => 'TimeZone')", None),
        ("SELECT ('TimeZone'::text).current_setting", None),
    ],
)
def test_current_setting_of_any_other_setting_is_forbidden(sql: str, seen: str | None) -> None:
    error = refused(sql)
    assert (error.code, error.details["function"]) == ("forbidden_function", "current_setting")
    assert "only these may be read" in error.message
    assert "timezone" in error.message  # the readable settings are named
    if seen is not None:
        assert f"not {seen}" in error.message


def test_functions_with_lookalike_names_and_pure_forms_pass() -> None:
    assert analyze("SELECT ts_rewrite('a'::tsquery, 'a'::tsquery, 'b'::tsquery)", SHOP)
    assert analyze("SELECT lower(name), log(2, 8), pg_size_pretty(1024) FROM customers", SHOP)
    # columns whose names look like forbidden functions are columns, not calls
    sub = "SELECT s.lo_price, s.http_code FROM (SELECT 1 AS lo_price, 2 AS http_code) s"
    assert analyze(sub, SHOP).kind == "read"


def test_nextval_and_setval_make_a_read_a_write() -> None:
    assert analyze("SELECT currval('invoice_numbers')", SHOP).kind == "read"
    assert analyze("SELECT id, nextval('invoice_numbers') FROM orders", SHOP).kind == "write"


def test_a_relation_named_by_a_string_is_resolved_like_a_table_name() -> None:
    for sql in (
        "SELECT nextval('public.invoice_numbers')",
        "SELECT nextval('\"invoice_numbers\"')",
        "SELECT setval(' Invoice_Numbers ', 4, false)",
        "SELECT row_security_active('orders'), pg_relation_is_updatable('public.orders', true)",
        "SELECT pg_column_is_updatable('orders'::text, 2::smallint, false)",
    ):
        analyze(sql, SHOP)
    error = refused("SELECT 1, nextval('invoice_number')")
    assert error.code == "unknown_table"
    assert error.details == {
        "table": "invoice_number",
        "suggestions": ["invoice_numbers"],
        "position": 19,
    }
    # Quoted, the name keeps its case, as PostgreSQL reads it.
    assert refused("SELECT nextval('\"Invoice_numbers\"')").code == "unknown_table"
    error = refused("SELECT row_security_active('shop.public.orders')")
    assert error.code == "unknown_table"
    assert "database part" in error.message
    for text in ("", "orders.", '"orders', "a b", "12"):
        assert refused(f"SELECT row_security_active('{text}')").code == "unknown_table", text


def test_a_relation_named_otherwise_than_by_a_string_literal_is_refused() -> None:
    error = refused("SELECT id, setval(name, 1) FROM orders, (VALUES ('x')) AS v(name)")
    assert error.code == "forbidden_function"
    assert error.details["function"] == "setval"
    assert "string literal" in error.message
    assert refused("SELECT ('orders'::text).row_security_active").code == "forbidden_function"


def test_pg_typeof_is_allowed_only_cast_to_text() -> None:
    for sql in (
        "SELECT pg_typeof(total)::text FROM orders",
        "SELECT CAST(pg_typeof(total) AS varchar(20)) FROM orders",
        "SELECT pg_catalog.pg_typeof(total)::pg_catalog.text FROM orders",
    ):
        assert analyze(sql, SHOP).kind == "read"
    error = refused("SELECT pg_typeof(total) FROM orders")
    assert error.code == "forbidden_function"
    assert "pg_typeof(...)::text" in error.message
    assert refused("SELECT pg_typeof(total)::oid::text FROM orders").code == "forbidden_function"


# --- unknown_table and unknown_column ----------------------------------------------------------


def test_unknown_table_suggests_close_matches() -> None:
    error = refused("SELECT * FROM ordrs WHERE id = 1")
    assert error.code == "unknown_table"
    assert error.details == {
        "table": "ordrs",
        "suggestions": ["orders", "order_items"],
        "position": 15,
    }
    assert "'ordrs'" in error.message
    assert "did you mean orders, order_items?" in error.message


def test_unknown_table_in_every_position() -> None:
    for sql in (
        "SELECT (SELECT count(*) FROM custmers)",
        "SELECT * FROM orders WHERE EXISTS (SELECT 1 FROM order_item)",
        "WITH x AS (SELECT * FROM prodcts) SELECT * FROM x",
        "INSERT INTO ordr (id) VALUES (1)",
        "DELETE FROM orders USING custmers c WHERE c.id = orders.customer_id",
        "SELECT * FROM other.orders",
    ):
        assert refused(sql).code == "unknown_table", sql


def test_quoted_table_names_keep_their_case() -> None:
    error = refused('SELECT * FROM "ORDERS"')
    assert (error.code, error.details["table"]) == ("unknown_table", "ORDERS")
    assert error.details["suggestions"][0] == "orders"
    assert refused('SELECT * FROM public."Orders"').code == "unknown_table"
    assert refused('SELECT * FROM "PUBLIC".orders').code == "unknown_table"
    assert refused('DELETE FROM "Order_Items" WHERE order_id = 1').code == "unknown_table"
    for sql in ('SELECT * FROM "orders"', "SELECT * FROM ORDERS", 'SELECT * FROM public."orders"'):
        assert analyze(sql, SHOP).tables == ("orders",), sql
    # A table created with a quoted mixed-case name is found by that name only.
    mixed = Catalog(
        {"orders": Table("Orders", "public", {"id": Column("id", "integer")})}, "m", "postgresql"
    )
    assert analyze('SELECT id FROM "Orders"', mixed).tables == ("orders",)
    assert refused("SELECT id FROM orders", mixed).code == "unknown_table"
    assert refused("SELECT id FROM Orders", mixed).code == "unknown_table"


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM otherdb.public.orders",
        "SELECT * FROM shop.public.orders",  # the catalog does not know the database's name
        "SELECT * FROM orders WHERE id IN (SELECT id FROM db.public.orders)",
        "UPDATE otherdb.public.orders SET status = 'x' WHERE id = 1",
    ],
)
def test_a_name_with_a_database_part_is_never_resolved(sql: str) -> None:
    error = refused(sql)
    assert error.code == "unknown_table"
    assert error.details["table"].endswith("public.orders")
    assert "database part" in error.message


@pytest.mark.parametrize(
    ("sql", "table"),
    [
        ("SELECT (NULL::corral.gateway_journal).*", "corral.gateway_journal"),
        ("SELECT (NULL::pg_authid).rolpassword", "pg_authid"),
        ("SELECT NULL::pg_catalog.pg_class", "pg_catalog.pg_class"),
        ("SELECT NULL::_pg_authid", "_pg_authid"),
        ("SELECT ARRAY[]::pg_roles[]", "pg_roles"),
        ("SELECT CAST(NULL AS pg_stat_activity)", "pg_stat_activity"),
        ("SELECT ROW(1)::information_schema.tables", "information_schema.tables"),
        ("SELECT NULL::pg_toast.pg_toast_1260", "pg_toast.pg_toast_1260"),
        ("SELECT NULL::shop.public.orders", "shop.public.orders"),
        ("SELECT * FROM jsonb_populate_recordset(NULL::pg_settings, '[]')", "pg_settings"),
        ("SELECT a FROM jsonb_to_record('{}') AS t(a pg_shadow)", "pg_shadow"),
        ("SELECT xmlserialize(content NULL AS pg_user)", "pg_user"),
        (
            "SELECT id FROM orders WHERE meta::text = (NULL::pg_authid)::text",
            "pg_authid",
        ),
        ("UPDATE orders SET meta = to_jsonb(NULL::pg_authid) WHERE id = 1", "pg_authid"),
    ],
)
def test_row_types_of_relations_outside_the_catalog_are_unknown_tables(
    sql: str, table: str
) -> None:
    error = refused(sql)
    assert (error.code, error.details["table"]) == ("unknown_table", table)
    assert "row type" in error.message
    assert table.rsplit(".", 1)[-1] in sql[error.details["position"] - 1 :]


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT (NULL::orders).*, NULL::public.customers, NULL::customer_revenue",
        "SELECT NULL::pg_lsn, NULL::pg_catalog.pg_snapshot, NULL::pg_catalog.int4",
        "SELECT NULL::int[], 'x'::varchar(3), 1::numeric(10, 2), '{}'::_text",
        "SELECT NULL::public.mood, 'a'::citext",  # a type in a schema the catalog shows
        "SELECT jsonb_populate_record(NULL::orders, '{}')",
    ],
)
def test_row_types_of_catalog_tables_and_other_types_pass(sql: str) -> None:
    assert analyze(sql, SHOP).kind == "read"


def test_qualified_names_ctes_and_shadowing_resolve() -> None:
    assert analyze("SELECT * FROM public.orders", SHOP).tables == ("orders",)
    cte = analyze("WITH orders AS (SELECT 1 AS n) SELECT n FROM orders", SHOP)
    assert cte.tables == ()
    nested = analyze("WITH a AS (SELECT id FROM orders) SELECT * FROM (SELECT id FROM a) b", SHOP)
    assert nested.tables == ("orders",)


def test_unknown_qualified_column_names_the_table_and_suggests() -> None:
    error = refused("SELECT o.totl FROM orders o WHERE o.id = 1")
    assert error.code == "unknown_column"
    assert error.details == {
        "column": "totl",
        "table": "orders",
        "suggestions": ["total"],
        "position": 8,
    }
    assert "did you mean total" in error.message


_INSERT = "INSERT INTO customers (id, name, email, country, created_at) "
_CONFLICT = "VALUES (1, 'x', 'x@x', 'FR', now()) ON CONFLICT (id) "

# Every place a subquery can go, {q} standing for it (an int).
POSITIONS: tuple[str, ...] = (
    # SELECT, clause by clause
    "SELECT {q}",
    "SELECT {q} AS n FROM orders",
    "SELECT id FROM orders WHERE id = {q}",
    "SELECT id FROM orders WHERE id BETWEEN {q} AND 10",
    "SELECT id FROM orders WHERE id IN (1, {q})",
    "SELECT id FROM orders WHERE (id, customer_id) = ({q}, 1)",
    "SELECT status FROM orders GROUP BY status HAVING count(*) > {q}",
    "SELECT count(*) FROM orders GROUP BY {q}",
    "SELECT count(*) FROM orders GROUP BY GROUPING SETS ((status), ({q}))",
    "SELECT count(*) FROM orders GROUP BY ROLLUP (status, {q})",
    "SELECT count(*) FROM orders GROUP BY CUBE (status, {q})",
    "SELECT id FROM orders ORDER BY {q}",
    "SELECT id FROM orders ORDER BY id LIMIT {q}",
    "SELECT id FROM orders ORDER BY id OFFSET {q}",
    "SELECT id FROM orders ORDER BY id FETCH FIRST {q} ROWS ONLY",
    "SELECT id FROM orders ORDER BY id FETCH FIRST {q} ROWS WITH TIES",
    "SELECT DISTINCT ON ({q}) id FROM orders",
    # windows and aggregates
    "SELECT sum(total) OVER (PARTITION BY {q}) FROM orders",
    "SELECT sum(total) OVER (ORDER BY {q}) FROM orders",
    "SELECT sum(total) OVER w FROM orders WINDOW w AS (PARTITION BY {q})",
    "SELECT sum(total) OVER w FROM orders WINDOW w AS (ORDER BY id ROWS {q} PRECEDING)",
    "SELECT sum(total) OVER (ORDER BY id ROWS BETWEEN {q} PRECEDING AND {q} FOLLOWING) FROM orders",
    "SELECT count(*) FILTER (WHERE id > {q}) FROM orders",
    "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY {q}) FROM orders",
    "SELECT string_agg(status, ',' ORDER BY {q}) FROM orders",
    "SELECT count(DISTINCT {q}) FROM orders",
    # expressions
    "SELECT abs({q})",
    "SELECT round(1.5, {q})",
    "SELECT jsonb_build_object('n', {q})",
    "SELECT CASE WHEN {q} > 0 THEN 1 END",
    "SELECT CASE {q} WHEN 1 THEN 1 ELSE 2 END",
    "SELECT CASE WHEN true THEN {q} ELSE 0 END",
    "SELECT ARRAY(SELECT {q})",
    "SELECT ARRAY[{q}]",
    "SELECT (ARRAY[1, 2])[{q}]",
    "SELECT (ARRAY[1, 2])[1:{q}]",
    "SELECT tags[{q}] FROM customers",
    "SELECT coalesce(NULL, {q})",
    "SELECT greatest(1, {q})",
    "SELECT nullif({q}, 0)",
    "SELECT ROW({q}, 1)",
    "SELECT ({q})::text",
    "SELECT CAST({q} AS bigint)",
    "SELECT 1 WHERE EXISTS (SELECT {q})",
    "SELECT 1 WHERE 1 IN (SELECT {q})",
    "SELECT 1 WHERE 1 = ANY (ARRAY[{q}])",
    "SELECT 1 WHERE 1 < ALL (SELECT {q})",
    "SELECT (SELECT (SELECT {q}))",
    "SELECT xmlelement(name n, {q})",
    "SELECT {q} IS NULL, {q} IS DISTINCT FROM 1",
    "SELECT 'x' COLLATE \"C\" = ({q})::text",
    # FROM
    "SELECT * FROM (SELECT {q} AS n) s",
    "SELECT * FROM orders o, LATERAL (SELECT {q} AS n) s",
    "SELECT * FROM orders o CROSS JOIN LATERAL (SELECT o.id + {q} AS n) s",
    "SELECT * FROM generate_series(1, {q}) g",
    "SELECT * FROM ROWS FROM (generate_series(1, {q})) g",
    "SELECT * FROM unnest(ARRAY[{q}]) WITH ORDINALITY AS u(n, i)",
    "SELECT * FROM orders TABLESAMPLE BERNOULLI ({q})",
    "SELECT * FROM orders TABLESAMPLE BERNOULLI (50) REPEATABLE ({q})",
    "SELECT * FROM orders o JOIN customers c ON c.id = {q}",
    "SELECT * FROM orders o LEFT JOIN customers c ON c.id = o.customer_id AND c.id > {q}",
    "SELECT * FROM orders o JOIN customers c USING (id) WHERE id > {q}",
    "SELECT * FROM (orders o JOIN customers c ON c.id = {q}) AS j",
    "SELECT * FROM XMLTABLE('/r' PASSING xmlelement(name r, {q}) COLUMNS n int PATH '.')",
    # CTEs and set operations
    "WITH c AS (SELECT {q} AS n) SELECT n FROM c",
    "WITH c AS MATERIALIZED (SELECT {q} AS n) SELECT n FROM c",
    "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < {q}) SELECT n FROM r",
    "SELECT id FROM orders UNION SELECT {q}",
    "SELECT id FROM orders INTERSECT SELECT {q}",
    "SELECT id FROM orders UNION SELECT id FROM orders LIMIT {q}",
    "SELECT id FROM orders EXCEPT SELECT id FROM orders OFFSET {q}",
    "(SELECT id FROM orders UNION SELECT id FROM orders) FETCH FIRST {q} ROWS ONLY",
    # VALUES
    "VALUES ({q})",
    "VALUES (1), ({q})",
    "VALUES (1) ORDER BY {q}",
    "VALUES (1) LIMIT {q}",
    "VALUES (1) OFFSET {q}",
    "VALUES (1) FETCH FIRST {q} ROWS ONLY",
    "SELECT * FROM (VALUES (1) LIMIT {q}) v",
    "WITH v AS (VALUES (1) OFFSET {q}) SELECT * FROM v",
    "EXPLAIN SELECT {q}",
    "EXPLAIN VALUES (1) LIMIT {q}",
    # INSERT
    _INSERT + "VALUES ({q} + 100, 'x', 'x@x', 'FR', now())",
    _INSERT + "SELECT {q} + 100, 'x', 'x@x', 'FR', now()",
    _INSERT + "SELECT 100, 'x', 'x@x', 'FR', now() LIMIT {q}",
    "INSERT INTO customers (id, name, email, country, created_at, tags[{q}]) "
    "VALUES (100, 'x', 'x@x', 'FR', now(), 'x')",
    "INSERT INTO customers (id, name, email, country, created_at, tags[{q}:{q}]) "
    "VALUES (100, 'x', 'x@x', 'FR', now(), '{x}')",
    _INSERT + _CONFLICT + "DO UPDATE SET name = ({q})::text",
    _INSERT + _CONFLICT + "DO UPDATE SET tags[{q}] = 'x'",
    _INSERT + _CONFLICT + "DO UPDATE SET (name, email) = (SELECT 'y', ({q})::text)",
    _INSERT + _CONFLICT + "DO UPDATE SET name = 'y' WHERE customers.id > {q}",
    _INSERT + "VALUES (100, 'x', 'x@x', 'FR', now()) RETURNING {q}",
    "WITH c AS (SELECT {q} AS n) " + _INSERT + "SELECT n + 100, 'x', 'x@x', 'FR', now() FROM c",
    # UPDATE
    "UPDATE customers SET name = ({q})::text WHERE id = 1",
    "UPDATE customers SET tags[{q}] = 'x' WHERE id = 1",
    "UPDATE customers SET tags[{q}:{q}] = '{x}' WHERE id = 1",
    "UPDATE customers SET (name, email) = (SELECT 'x', ({q})::text) WHERE id = 1",
    "UPDATE customers SET (name, country) = ('x', ({q})::text) WHERE id = 1",
    "UPDATE customers SET name = 'x' WHERE id = {q}",
    "UPDATE customers c SET name = 'x' FROM orders o WHERE o.customer_id = c.id AND o.id = {q}",
    "UPDATE customers c SET name = 'x' FROM (SELECT {q} AS n) s WHERE c.id = s.n",
    "UPDATE customers SET name = 'x' WHERE id = 1 RETURNING {q}",
    "WITH c AS (SELECT {q} AS n) UPDATE customers SET name = 'x' WHERE id IN (SELECT n FROM c)",
    # DELETE
    "DELETE FROM order_items WHERE order_id = {q}",
    "DELETE FROM order_items USING (SELECT {q} AS n) s WHERE order_id = s.n",
    "DELETE FROM order_items i USING orders o WHERE o.id = i.order_id AND o.id = {q}",
    "DELETE FROM order_items WHERE order_id = -1 RETURNING {q}",
    "WITH d AS (DELETE FROM order_items WHERE order_id = {q} RETURNING 1) SELECT count(*) FROM d",
    "EXPLAIN DELETE FROM order_items WHERE order_id = {q}",
)

# Subqueries reading what agents must not: system catalogs, the gateway's journal, other
# schemas and databases, a quoted name that is not the table, a system catalog's row type.
HIDDEN = (
    "(SELECT count(*)::int FROM pg_authid)",
    "(SELECT count(*)::int FROM corral.gateway_journal)",
    "(SELECT count(*)::int FROM pg_catalog.pg_class)",
    "(SELECT count(*)::int FROM information_schema.tables)",
    "(SELECT count(*)::int FROM otherdb.public.orders)",
    '(SELECT count(*)::int FROM "ORDERS")',
    "(SELECT count(*)::int FROM (SELECT (NULL::pg_authid).*) AS s)",
)
VISIBLE = "(SELECT count(*)::int FROM orders)"


def _at(template: str, subquery: str) -> str:
    return template.replace("{q}", subquery)


def test_positions_cover_every_kind_of_statement_and_many_clauses() -> None:
    assert len(POSITIONS) >= 100
    assert len(set(POSITIONS)) == len(POSITIONS)
    starts = {p.split()[0] for p in POSITIONS}
    assert {"SELECT", "VALUES", "WITH", "INSERT", "UPDATE", "DELETE", "EXPLAIN"} <= starts


@pytest.mark.parametrize("template", POSITIONS, ids=range(len(POSITIONS)))
def test_a_hidden_relation_is_refused_in_every_position(template: str) -> None:
    for subquery in HIDDEN:
        analyzer = SqlAnalyzer()  # no cache: each is analysed
        with pytest.raises(GatewayError) as info:
            analyzer.analyze(_at(template, subquery), SHOP)
        assert info.value.code == "unknown_table", (subquery, info.value.message)
    # The same statement reading a catalog table passes: the position itself is resolved.
    result = SqlAnalyzer().analyze(_at(template, VISIBLE), SHOP)
    assert "orders" in result.tables


class _Recording(Resolver):
    """A resolver that notes every subquery, relation and type name it resolved."""

    def __init__(self, sql: str, catalog: Catalog) -> None:
        super().__init__(sql, catalog)
        self.seen: set[int] = set()

    def select(self, stmt: Any, scope: Any) -> Any:
        self.seen.add(id(stmt))
        return super().select(stmt, scope)

    def range_var(self, body: Any, scope: Any) -> Any:
        self.seen.add(id(body))
        return super().range_var(body, scope)

    def type_name(self, node: Any) -> None:
        self.seen.add(id(node))
        super().type_name(node)


def _produced(node: Any, locking: bool = False) -> Iterator[Any]:
    """Every SELECT (set-operation arms too), FROM relation and type name in a parse tree."""
    if type(node) is list:
        for item in node:
            yield from _produced(item, locking)
    elif type(node) is dict:
        for key, value in node.items():
            arm = key in ("larg", "rarg") and unwrap(value)[0] == ""  # not a join's side
            relation = key == "RangeVar" and not locking  # FOR UPDATE OF names an alias
            if key in ("SelectStmt", "typeName", "TypeName") or arm or relation:
                yield value
            yield from _produced(value, locking or key == "lockingClause")


def test_resolution_reaches_every_subquery_relation_and_type_the_parser_produced() -> None:
    """Not a list of clauses: whatever the parser puts anywhere, the resolution visits."""
    statements = [_at(t, VISIBLE) for t in POSITIONS] + [r.sql for r in VALID_READS]
    statements += [
        _at(t, "(SELECT count(*)::int FROM (SELECT (NULL::orders).id) s)") for t in POSITIONS
    ]
    statements += [e.sql for e in ESCAPES if e.expect == "write"]
    statements.append(
        "UPDATE orders SET status = 'x' WHERE id IN (SELECT o.id FROM orders o FOR UPDATE OF o)"
    )
    for sql in statements:
        kind, stmt = unwrap(parse(sql)[0]["stmt"])
        if kind == "ExplainStmt":
            kind, stmt = unwrap(stmt["query"])
        resolver = _Recording(sql, SHOP)
        resolver.statement(kind, stmt)
        missed = [node for node in _produced({kind: stmt}) if id(node) not in resolver.seen]
        assert missed == [], sql


@pytest.mark.postgres
def test_every_position_is_sql_postgres_runs_even_with_the_hidden_relation(
    shop_dsn: str,
) -> None:
    """Each position is real: PostgreSQL runs it, reading pg_authid, so each refusal counts."""
    failures = []
    with psycopg.connect(shop_dsn) as conn:
        for template in POSITIONS:
            for subquery in (VISIBLE, HIDDEN[0]):
                sql = _at(template, subquery)
                try:
                    with conn.transaction(force_rollback=True):
                        conn.execute(sql)
                except psycopg.Error as exc:
                    failures.append((sql, str(exc)))
    assert failures == []


def test_unknown_unqualified_column_over_one_or_several_tables() -> None:
    one = refused("SELECT id FROM orders WHERE stauts = 'paid'")
    assert (one.details["table"], one.details["suggestions"]) == ("orders", ["status"])
    several = refused("SELECT nme FROM orders o JOIN customers c ON c.id = o.customer_id")
    assert several.details["table"] is None
    assert several.details["suggestions"] == ["name"]


@pytest.mark.parametrize(
    ("sql", "column"),
    [
        ("INSERT INTO orders (id, totl) VALUES (1, 2)", "totl"),
        ("UPDATE orders SET stat = 'x' WHERE id = 1", "stat"),
        ("UPDATE orders SET status = 'x' WHERE idd = 1", "idd"),
        ("DELETE FROM orders WHERE custmer_id = 1", "custmer_id"),
        ("INSERT INTO orders (id) VALUES (1) ON CONFLICT (idd) DO NOTHING", "idd"),
        (
            "INSERT INTO orders (id) VALUES (1) ON CONFLICT (id) DO UPDATE SET totl = 1",
            "totl",
        ),
        (
            "INSERT INTO orders (id) VALUES (1) ON CONFLICT (id) "
            "DO UPDATE SET total = excluded.totl",
            "totl",
        ),
        ("DELETE FROM orders WHERE id = 1 RETURNING totl", "totl"),
        ("WITH x AS (SELECT id FROM orders) SELECT x.total FROM x", "total"),
        ("SELECT v.c FROM (VALUES (1, 2)) AS v(a, b)", "c"),
        ("SELECT s.total FROM (SELECT id FROM orders) s", "total"),
        ("SELECT total AS t FROM orders WHERE t > 1", "t"),
        ("SELECT * FROM orders JOIN customers USING (customer)", "customer"),
        ("SELECT * FROM orders o WHERE EXISTS (SELECT 1 FROM customers c WHERE c.x = o.id)", "x"),
        ("SELECT name FROM customers UNION SELECT name FROM products ORDER BY nme", "nme"),
    ],
)
def test_unknown_column_in_every_position(sql: str, column: str) -> None:
    error = refused(sql)
    assert error.code == "unknown_column", error.message
    assert error.details["column"] == column


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT total * 2 AS doubled FROM orders ORDER BY doubled",
        "SELECT status AS s, count(*) FROM orders GROUP BY s",
        "SELECT g, g.x FROM generate_series(1, 3) AS g(x)",
        "SELECT n FROM generate_series(1, 3) n",
        "SELECT generate_series FROM generate_series(1, 3)",
        "SELECT x, y FROM orders, LATERAL some_extension_fn(orders.id) AS f",
        "SELECT o FROM orders o",
        "SELECT o.*, ctid, o.xmin FROM orders o",
        "SELECT * FROM orders o WHERE o.id IN (SELECT customer_id FROM customers c "
        "WHERE c.id = o.customer_id)",
        "INSERT INTO orders AS o (id, status) VALUES (1, 'x') ON CONFLICT (id) "
        "DO UPDATE SET status = excluded.status WHERE o.total > 0 RETURNING o.id, old.status",
        "UPDATE orders o SET total = c.id FROM customers c WHERE c.id = o.customer_id "
        "RETURNING c.name, o.total",
        "WITH t(a, b) AS (SELECT id, total FROM orders) SELECT a, b FROM t",
        "SELECT (SELECT max(total) FROM orders) AS m",
        "SELECT sub.max, sub.case, sub.coalesce, sub.exists, sub.int4 FROM (SELECT max(id), "
        "CASE WHEN true THEN 1 END, coalesce(null, 1), EXISTS (SELECT 1), 1::int4 "
        "FROM orders) sub",
        'SELECT s."?column?" FROM (SELECT (SELECT 1)::text) s',
        "SELECT j.ordinality, j.value FROM jsonb_array_elements('[1]') WITH ORDINALITY j",
        "SELECT jt.a FROM JSON_TABLE('[1]'::jsonb, '$[*]' COLUMNS (a int PATH '$')) jt",
        "SELECT * FROM (orders JOIN customers USING (id)) AS j WHERE j.status = 'x'",
        "SELECT x.id FROM orders JOIN customers USING (id) AS x",
        "DELETE FROM orders WHERE id = 1 RETURNING WITH (OLD AS before) before.total",
        "WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM t WHERE n < 3) "
        "SEARCH DEPTH FIRST BY n SET ord CYCLE n SET seen USING path "
        "SELECT t.n, ord, seen, path FROM t ORDER BY ord",
    ],
)
def test_names_that_are_not_catalog_columns_are_not_flagged(sql: str) -> None:
    assert analyze(sql, SHOP).kind in ("read", "write")


# --- classification, filtered, normalized, params ----------------------------------------------


def test_writes_report_their_target_and_statement_type() -> None:
    insert = analyze(
        "INSERT INTO orders (id, customer_id, status, total, created_at) "
        "SELECT 100, id, 'open', 0, now() FROM customers WHERE country = $1 "
        "ON CONFLICT (id) DO UPDATE SET status = excluded.status RETURNING id",
        SHOP,
    )
    assert (insert.kind, insert.statement_type) == ("write", "INSERT")
    assert (insert.tables, insert.written) == (("orders", "customers"), ("orders",))
    assert insert.param_count == 1
    update = analyze(
        "UPDATE orders o SET status = 'vip' FROM customers c WHERE c.id = o.customer_id", SHOP
    )
    assert (update.statement_type, update.written) == ("UPDATE", ("orders",))
    assert set(update.tables) == {"orders", "customers"}
    hidden = analyze("WITH d AS (DELETE FROM orders RETURNING id) SELECT count(*) FROM d", SHOP)
    assert (hidden.kind, hidden.statement_type, hidden.written) == ("write", "SELECT", ("orders",))


@pytest.mark.parametrize(
    ("sql", "filtered"),
    [
        ("SELECT * FROM orders", False),
        ("SELECT * FROM orders WHERE status = 'paid'", True),
        ("SELECT status FROM orders GROUP BY status HAVING count(*) > 3", True),
        ("SELECT * FROM orders o JOIN customers c ON c.id = o.customer_id", True),
        ("SELECT * FROM orders CROSS JOIN customers", False),
        ("SELECT * FROM customers c LEFT JOIN orders o ON o.customer_id = c.id", False),
        ("SELECT * FROM (SELECT * FROM orders WHERE total > 5) s", True),
        ("WITH p AS (SELECT * FROM orders WHERE status = 'paid') SELECT * FROM p", True),
        ("WITH p AS (SELECT * FROM orders) SELECT * FROM p", False),
        ("SELECT (SELECT count(*) FROM orders WHERE total > 1) FROM customers", False),
        ("SELECT id FROM orders UNION SELECT id FROM customers WHERE country = 'FR'", True),
        ("SELECT id FROM orders UNION ALL SELECT id FROM customers", False),
        ("SELECT id FROM orders INTERSECT SELECT id FROM customers", True),
        ("VALUES (1)", False),
        ("SELECT 1", False),
        ("DELETE FROM orders WHERE id = 1", True),
        ("DELETE FROM orders", False),
        (
            "WITH RECURSIVE r AS (SELECT 1 AS n UNION ALL SELECT n + 1 FROM r) SELECT n FROM r",
            False,
        ),
        # LIMIT, OFFSET, FETCH
        ("SELECT * FROM orders OFFSET 100", True),
        ("SELECT * FROM orders LIMIT 0", True),
        ("SELECT * FROM orders FETCH FIRST 0 ROWS ONLY", True),
        ("SELECT * FROM orders LIMIT $1", True),
        ("SELECT * FROM orders LIMIT 2 + 1", True),
        ("SELECT * FROM orders OFFSET $1", True),
        ("SELECT * FROM (SELECT * FROM orders LIMIT 0) s", True),
        ("WITH c AS (SELECT * FROM orders OFFSET 20) SELECT * FROM c", True),
        ("SELECT id FROM orders UNION ALL SELECT id FROM customers LIMIT 0", True),
        ("VALUES (1) LIMIT 0", True),
        ("SELECT * FROM orders LIMIT 5", False),
        ("SELECT * FROM orders LIMIT ALL OFFSET 0", False),
        ("SELECT * FROM orders OFFSET NULL", False),
        ("SELECT * FROM orders ORDER BY id FETCH FIRST ROW ONLY", False),
        # functions: in FROM, and set-returning calls in the select list
        ("SELECT o.id, e FROM orders o, jsonb_array_elements(o.meta->'items') e", True),
        ("SELECT * FROM orders CROSS JOIN LATERAL jsonb_each(orders.meta) e", True),
        ("SELECT * FROM generate_series(1, 3) g", True),
        ("SELECT unnest('{}'::text[]) FROM customers", True),
        ("SELECT id, jsonb_array_elements(meta->'items') FROM orders", True),
        ("SELECT (jsonb_each(meta)).key FROM orders", True),
        ("SELECT id, unnest(tags) + 'x' FROM customers ORDER BY 1", True),
        ("SELECT my_own_function(id) FROM orders", True),  # could be set-returning
        ("SELECT public.lower(status) FROM orders", True),
        ('SELECT "LOWER"(status) FROM orders', True),
        ("SELECT c.name, e FROM customers c LEFT JOIN LATERAL unnest(c.tags) e ON true", False),
        ("SELECT lower(status), round(total, 1), date_trunc('day', created_at) FROM orders", False),
        (
            "SELECT count(*), sum(total), my_agg(DISTINCT total), count(*) FILTER (WHERE true), "
            "percentile_cont(0.5) WITHIN GROUP (ORDER BY total), row_number() OVER () "
            "FROM orders",
            False,
        ),
        ("SELECT (SELECT unnest(tags) LIMIT 1) FROM customers", False),  # a scalar subquery
        # field selection may be a call: (expr).f is f(expr) when expr has no field f
        ("SELECT (o.meta -> 'nope').jsonb_array_elements AS item FROM orders o", True),
        ("SELECT (ARRAY[]::text[]).unnest AS t FROM orders", True),
        ("SELECT (o).jsonb_each FROM (SELECT meta FROM orders) AS s(o)", True),
        ("SELECT id FROM orders WHERE id = 1", True),
        ("UPDATE orders o SET status = 'x' FROM customers c", True),
        ("UPDATE orders SET status = 'x'", False),
    ],
)
def test_filtered_says_whether_a_filter_could_empty_the_result(sql: str, filtered: bool) -> None:
    assert analyze(sql, SHOP).filtered is filtered


def test_normalized_ignores_layout_and_keeps_constants() -> None:
    a = analyze("select id  FROM orders /* c */ WHERE id = 7 -- x", SHOP).normalized
    b = analyze("SELECT id\nFROM orders\nWHERE id = 7", SHOP).normalized
    c = analyze("SELECT id FROM orders WHERE id = 8", SHOP).normalized
    assert a == b == "SELECT id FROM orders WHERE id = 7"
    assert c != a
    assert analyze("SELECT id FROM orders WHERE id = $1", SHOP).normalized.endswith("$1")


def test_normalized_is_worked_out_once_and_does_not_affect_equality() -> None:
    sql = "UPDATE orders SET status = 'paid'   WHERE id = 3"
    first, second = SqlAnalyzer().analyze(sql, SHOP), SqlAnalyzer().analyze(sql, SHOP)
    assert first == second
    text = first.normalized
    assert text == "UPDATE orders SET status = 'paid' WHERE id = 3"
    assert first.normalized is text
    assert first == second  # one computed, the other not: still equal
    assert first.sql == sql


def test_param_count_is_the_highest_placeholder() -> None:
    assert analyze("SELECT 1", SHOP).param_count == 0
    assert analyze("SELECT $3::int, $1::int FROM orders WHERE id = $2", SHOP).param_count == 3


def test_analysis_is_frozen() -> None:
    result = analyze("SELECT 1", SHOP)
    assert isinstance(result, Analysis)
    with pytest.raises(AttributeError):
        result.kind = "write"  # type: ignore[misc]


@pytest.mark.postgres
async def test_rows_cut_by_limits_or_set_returning_functions_are_suspiciously_empty(
    shop_dsn: str,
) -> None:
    cases: list[tuple[str, list[Any]]] = [
        ("SELECT * FROM orders OFFSET 100", []),
        ("SELECT * FROM orders LIMIT 0", []),
        ("SELECT * FROM orders FETCH FIRST 0 ROWS ONLY", []),
        ("SELECT * FROM orders LIMIT $1", [0]),
        ("SELECT o.id, e FROM orders o, jsonb_array_elements(o.meta->'items') e", []),
        ("SELECT unnest('{}'::text[]) FROM customers", []),
        ("SELECT * FROM (SELECT * FROM orders LIMIT 0) s", []),
        ("SELECT (o.meta -> 'nope').jsonb_array_elements AS item FROM orders o", []),
        ("SELECT (ARRAY[]::text[]).unnest AS t FROM orders", []),
    ]
    # Analysis and the empty-answer check alone are under test: no freezes.
    async with Gateway.connect(shop_dsn, breaker=None) as gw:
        for sql, params in cases:
            result = await gw.query("agent-1", {"sql": sql, "params": params})
            assert (result.row_count, result.emptiness) == (0, "suspiciously_empty"), sql
            assert len(result.warnings) == 1, sql
        empty = await gw.query("agent-1", {"sql": "SELECT * FROM orders WHERE false LIMIT 0"})
        assert empty.emptiness == "suspiciously_empty"


# --- SQLite catalogs ---------------------------------------------------------------------------


@pytest.fixture
def sqlite_shop(tmp_path: Any) -> Iterator[Catalog]:
    conn = sqlite3.connect(tmp_path / "shop.db")
    try:
        load_shop_sqlite(conn)
        yield load_sqlite_catalog(conn)
    finally:
        conn.close()


def test_sqlite_catalog_resolves_names_and_refuses_its_file_functions(
    sqlite_shop: Catalog,
) -> None:
    assert analyze("SELECT rowid, name FROM main.customers", sqlite_shop).tables == ("customers",)
    # SQLite's names are case-insensitive, quoted or not.
    assert analyze('SELECT name FROM "CUSTOMERS"', sqlite_shop).tables == ("customers",)
    assert refused("SELECT nme FROM customers", sqlite_shop).details["suggestions"] == ["name"]
    assert refused("SELECT readfile('/etc/passwd')", sqlite_shop).code == "forbidden_function"
    assert refused("SELECT load_extension('x')", sqlite_shop).code == "forbidden_function"


# --- the cache ---------------------------------------------------------------------------------


def test_same_text_and_version_hits_the_cache_and_a_new_version_misses() -> None:
    analyzer = SqlAnalyzer()
    sql = "SELECT o.id FROM orders o JOIN customers c ON c.id = o.customer_id"
    first = analyzer.analyze(sql, SHOP)
    assert analyzer.analyze(sql, SHOP) is first
    info = analyzer.cache_info()
    assert (info.hits, info.misses, info.size) == (1, 1, 1)

    newer = shop_catalog(version="shop-v2")
    assert analyzer.analyze(sql, newer) == first
    assert analyzer.analyze(sql, newer) is not first
    info = analyzer.cache_info()
    assert (info.hits, info.misses, info.size) == (2, 2, 2)


def test_a_new_version_sees_the_schema_change() -> None:
    analyzer = SqlAnalyzer()
    sql = "SELECT coupon FROM orders"
    with pytest.raises(GatewayError) as info:
        analyzer.analyze(sql, SHOP)
    assert info.value.code == "unknown_column"
    changed = shop_catalog(version="shop-v3")
    orders = changed.tables["orders"]
    columns = {**orders.columns, "coupon": Column("coupon", "text")}
    changed = Catalog(
        {**changed.tables, "orders": Table("orders", "public", columns)}, "shop-v3", "postgresql"
    )
    assert analyzer.analyze(sql, changed).tables == ("orders",)


def test_refusals_are_cached_and_raised_fresh_each_time() -> None:
    analyzer = SqlAnalyzer()
    errors = []
    for _ in range(2):
        with pytest.raises(GatewayError) as info:
            analyzer.analyze("SELECT * FROM ordrs", SHOP)
        errors.append(info.value)
    assert errors[0] is not errors[1]
    assert errors[0].to_dict() == errors[1].to_dict()
    assert errors[1].details["suggestions"] == ["orders", "order_items"]
    assert analyzer.cache_info().hits == 1


def test_least_recently_used_entry_is_evicted() -> None:
    analyzer = SqlAnalyzer(cache_size=2)
    analyzer.analyze("SELECT 1", SHOP)
    analyzer.analyze("SELECT 2", SHOP)
    analyzer.analyze("SELECT 1", SHOP)  # now 2 is the oldest
    analyzer.analyze("SELECT 3", SHOP)
    assert analyzer.cache_info().size == 2
    analyzer.analyze("SELECT 1", SHOP)
    assert analyzer.cache_info().hits == 2
    analyzer.analyze("SELECT 2", SHOP)
    assert analyzer.cache_info().misses == 4
    analyzer.clear()
    info = analyzer.cache_info()
    assert (info.hits, info.misses, info.size, info.maxsize) == (0, 0, 0, 2)


def test_module_analyze_shares_one_cache() -> None:
    sql = "SELECT id FROM products WHERE sku = 'shared-cache-probe'"
    assert analyze(sql, SHOP) is analyze(sql, SHOP)


# --- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize("sql", [None, 1, b"SELECT 1"])
def test_sql_must_be_a_string(sql: object) -> None:
    with pytest.raises(InvalidArgumentError, match=r"SqlAnalyzer\.analyze: sql must be"):
        analyze(sql, SHOP)  # type: ignore[arg-type]


@pytest.mark.parametrize("catalog", [None, {}, "shop"])
def test_catalog_must_be_a_catalog(catalog: object) -> None:
    with pytest.raises(InvalidArgumentError, match="catalog must be"):
        analyze("SELECT 1", catalog)  # type: ignore[arg-type]


@pytest.mark.parametrize("size", [0, -1, 1.5, "10", True])
def test_cache_size_must_be_a_positive_int(size: object) -> None:
    with pytest.raises(InvalidArgumentError, match="SqlAnalyzer: cache_size must be"):
        SqlAnalyzer(cache_size=size)  # type: ignore[arg-type]


def _with_catalog_typed_columns() -> Catalog:
    audit = _table(
        "audit_log",
        ("id", "integer", False, True),
        ("rel", "regclass", True, False),
        ("rels", "regclass[]", True, False),
    )
    return Catalog({**SHOP.tables, "audit_log": audit}, "shop-audit", "postgresql")


def test_a_column_of_a_catalog_object_type_is_read_only_as_text() -> None:
    catalog = _with_catalog_typed_columns()
    for sql in (
        "SELECT id, rel::text, CAST(rels AS text) FROM audit_log",
        "SELECT a.rel::varchar FROM audit_log AS a WHERE a.id = 1",
        "SELECT count(*) FROM audit_log",
        "SELECT id FROM audit_log",
    ):
        analyze(sql, catalog)
    for sql in (
        "SELECT * FROM audit_log",
        "SELECT a.* FROM audit_log AS a",
        "SELECT rel FROM audit_log",
        "SELECT x::text FROM (SELECT rel AS x FROM audit_log UNION ALL SELECT 16390) AS s",
        "SELECT id FROM audit_log WHERE rel = 'corral.gateway_journal'",
        "SELECT a.rels[1]::text FROM audit_log AS a",
        "SELECT rel::oid FROM audit_log",
    ):
        error = refused(sql, catalog)
        assert error.code == "forbidden_function", sql
        assert "regclass" in error.message


def test_a_value_for_a_column_of_a_catalog_object_type_is_refused() -> None:
    catalog = _with_catalog_typed_columns()
    for sql in (
        "UPDATE audit_log SET rel = 'corral.gateway_journal' WHERE id = 1",
        "INSERT INTO audit_log (id, rel) VALUES (2, 'corral.gateway_journal')",
        "INSERT INTO audit_log VALUES (2, 'corral.gateway_journal')",
    ):
        assert refused(sql, catalog).code == "forbidden_function", sql
    analyze("UPDATE audit_log SET id = 3 WHERE id = 1", catalog)
    for request in (
        {"op": "find", "table": "audit_log", "where": {"rel": "corral.gateway_journal"}},
        {"op": "insert", "table": "audit_log", "values": {"id": 2, "rel": 16390}},
    ):
        with pytest.raises(GatewayError) as info:
            compile_operation(request, catalog)
        assert info.value.code == "forbidden_function", request


# --- too long, too deep ------------------------------------------------------------------------


def test_analyze_refuses_past_the_longest_statement_any_gateway_takes() -> None:
    error = refused("SELECT 1" + " " * 1_000_000)
    assert error.code == "statement_too_complex"
    assert error.details == {"limit": 1_000_000, "chars": 1_000_008}


@pytest.mark.parametrize(
    ("terms", "depth"), [(244, None), (245, 501), (2_000, 4_011), (100_000, 200_011)]
)
def test_a_chain_of_operators_is_refused_past_the_tree_depth(terms: int, depth: int | None) -> None:
    # 100,000 terms is past what the main thread's C stack holds: parsed on a deep stack.
    sql = "SELECT 1" + "+1" * terms
    if depth is None:
        assert analyze(sql, SHOP).kind == "read"
        return
    error = refused(sql)
    assert error.code == "statement_too_complex"
    assert error.details == {"limit": 500, "depth": depth}
    assert error.retryable is False


def test_brackets_inside_strings_do_not_count_as_depth() -> None:
    # The depth is counted on the tree's JSON text: brackets in a string value are not nesting.
    assert analyze("SELECT '" + "{[" * 3_000 + "' AS x", SHOP).kind == "read"
