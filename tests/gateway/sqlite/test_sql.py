"""SQL text on SQLite targets: the analysis, its two walls and the corpora, on a real file."""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from corral.gateway import GatewayError, SQLiteGateway
from corral.gateway._catalog_load import load_sqlite_catalog
from corral.gateway.sqlite._analysis import SqliteSqlAnalyzer, analyze_sqlite
from corral.gateway.sqlite._file import JOURNAL_TABLE
from corral.gateway.sqlite._plan import ReadPlan, WritePlan
from corral.gateway.sqlite._tokens import cte_names, tokenize
from corral.gateway.sqlite._wall import Wall, prewarm
from corral.kernel import InvalidArgumentError
from corral.runtime import FakeClock
from tests.gateway.corpus import shop_sqlite_file
from tests.gateway.corpus_sqlite import SQLITE_ESCAPES, SQLITE_VALID_READS, sqlite_text
from tests.gateway.gateway_support import on_thread, sqlite_of

AGENT = "agent-7"


@pytest.fixture
def shop(tmp_path: Path) -> Path:
    return shop_sqlite_file(tmp_path)


@pytest.fixture
async def gw(shop: Path) -> AsyncIterator[SQLiteGateway]:
    async with SQLiteGateway.connect(shop, breaker=None, clock=FakeClock()) as gateway:
        yield gateway


def _state(directory: Path) -> tuple[list[str], dict[str, str]]:
    """The files of ``directory`` and the digest of each: a write or a new file shows."""
    names = sorted(p.name for p in directory.iterdir())
    digests = {n: hashlib.sha256((directory / n).read_bytes()).hexdigest() for n in names}
    return names, digests


async def _refusal(gw: SQLiteGateway, sql: str, *params: Any) -> GatewayError:
    with pytest.raises(GatewayError) as info:
        await gw.query(AGENT, {"sql": sql, "params": list(params)})
    return info.value


def _analysis(shop: Path, sql: str) -> Any:
    conn = sqlite3.connect(
        f"file:{shop}?mode=ro", uri=True, isolation_level=None, cached_statements=0
    )
    try:
        catalog = load_sqlite_catalog(conn)
        wall = Wall()
        prewarm(conn)
        conn.set_authorizer(wall)
        return analyze_sqlite(sql, catalog, conn, wall)
    finally:
        conn.close()


# --- the corpora ------------------------------------------------------------------------------


def test_the_corpora_are_large_enough() -> None:
    assert len(SQLITE_ESCAPES) >= 30
    assert len(SQLITE_VALID_READS) >= 30
    assert len({e.sql for e in SQLITE_ESCAPES}) == len(SQLITE_ESCAPES)


async def test_every_escape_is_refused_or_harmless_and_the_files_are_unchanged(
    gw: SQLiteGateway, shop: Path
) -> None:
    before = _state(shop.parent)
    wrong: list[tuple[str, str, str]] = []
    for escape in SQLITE_ESCAPES:
        request = {"sql": escape.sql, "params": list(escape.params)}
        try:
            result = await gw.query(AGENT, request)
            got = "harmless"
            assert result.status == "ok"
        except GatewayError as exc:
            got = "write" if exc.code == "idempotency_key_required" else exc.code
        if got != escape.expect:
            wrong.append((escape.sql, escape.expect, got))
        if escape.expect == "write":
            # Had the analysis taken it for a read, the read-only connection refuses it.
            analysis = await on_thread(gw, "analyze", escape.sql, gw.catalog)
            plan = ReadPlan(analysis.executable, escape.params, agent_sql=True)
            with pytest.raises(GatewayError) as info:
                await on_thread(gw, "read", plan)
            assert info.value.code == "read_only_violation", escape.sql
    assert wrong == []
    assert _state(shop.parent) == before


async def test_every_valid_read_returns_what_sqlite_returns(gw: SQLiteGateway, shop: Path) -> None:
    direct = sqlite3.connect(shop)
    try:
        for read in SQLITE_VALID_READS:
            result = await gw.query(AGENT, {"sql": read.sql, "params": list(read.params)})
            expected = direct.execute(sqlite_text(read.sql), read.params).fetchall()
            assert [tuple(row.values()) for row in result.rows] == expected, read.sql
            analysis = sqlite_of(gw).file.analyzer.cached(read.sql, gw.catalog)
            assert analysis is not None
            assert analysis.kind == "read"
            assert set(analysis.tables) == read.tables, read.sql
    finally:
        direct.close()


# --- what the analysis says -------------------------------------------------------------------


def test_refusals_carry_what_the_agent_can_act_on(shop: Path) -> None:
    cases: dict[str, tuple[str, dict[str, Any]]] = {
        "SELECT o.totl FROM orders o": (
            "unknown_column",
            {"column": "totl", "table": "orders", "suggestions": ["total"], "position": 10},
        ),
        "SELECT nme FROM customers": (
            "unknown_column",
            {"column": "nme", "table": None, "suggestions": ["name"], "position": 8},
        ),
        "SELECT * FROM ordrs": (
            "unknown_table",
            {"table": "ordrs", "suggestions": ["orders", "order_items"], "position": 15},
        ),
        "SELECT 1 FROM sqlite_master": ("unknown_table", {"table": "sqlite_master"}),
        "SELECT 1; SELECT 2; SELECT 3": ("multiple_statements", {"count": 3}),
        "VACUUM INTO '/tmp/x'": ("forbidden_statement", {"statement": "VACUUM"}),
        "CREATE TEMP TABLE t (x)": ("forbidden_statement", {"statement": "CREATE TEMP TABLE"}),
        "EXPLAIN DROP TABLE orders": ("forbidden_statement", {"statement": "EXPLAIN DROP TABLE"}),
        "SELECT 1 AS x, upper(load_extension('x'))": (
            "forbidden_function",
            {"function": "load_extension", "position": 22},
        ),
        "SELEC 1": ("parse_error", {"position": None}),
        "SELECT nosuchfn(1)": ("parse_error", {}),
        "SELECT @who": ("invalid_operation", {"key": "sql", "value": "@who"}),
        "SELECT ?, ?2": ("invalid_operation", {"key": "sql"}),
        " -- nothing\n ; ": ("parse_error", {"parser_message": "empty statement"}),
        "SELECT 'a\x00'": ("parse_error", {"parser_message": "NUL character"}),
        "SELECT '\ud800'": ("parse_error", {"parser_message": "encoding"}),
    }
    for sql, (code, details) in cases.items():
        with pytest.raises(GatewayError) as info:
            _analysis(shop, sql)
        assert info.value.code == code, sql
        for key, value in details.items():
            assert info.value.details[key] == value, (sql, key, info.value.details)


def test_empty_statements_around_one_statement_are_dropped(shop: Path) -> None:
    analysis = _analysis(shop, ";; SELECT 1 AS one ;;; -- done\n")
    assert analysis.executable == "SELECT 1 AS one"


def test_a_misspelt_double_quoted_column_is_unknown_not_a_string(shop: Path) -> None:
    # Left to itself SQLite reads "statsu" as the string 'statsu': the filter would match
    # nothing, silently.
    with pytest.raises(GatewayError) as info:
        _analysis(shop, "SELECT id FROM orders WHERE \"statsu\" = 'open'")
    assert info.value.code == "unknown_column"
    assert info.value.details["suggestions"] == ["status"]
    assert "single quotes" in info.value.message
    with pytest.raises(GatewayError) as info:
        _analysis(shop, 'SELECT id FROM orders WHERE status = "open"')
    assert info.value.details["column"] == "open"
    fine = _analysis(shop, 'SELECT "id" FROM "orders" WHERE "status" = \'open\'')
    assert fine.executable == "SELECT `id` FROM `orders` WHERE `status` = 'open'"


def test_placeholders_are_found_only_outside_strings_names_and_comments(shop: Path) -> None:
    analysis = _analysis(
        shop,
        'SELECT \'$1\' AS a, "$2" AS "$3", [$4] AS b, a$5 -- $6\n'
        'FROM (SELECT 1 AS "$2", 2 AS [$4], 3 AS a$5) /* $7 */ WHERE $1 = $2',
    )
    assert analysis.param_count == 2
    assert analysis.executable.endswith("/* $7 */ WHERE ?1 = ?2")
    assert "'$1' AS a" in analysis.executable
    assert _analysis(shop, "SELECT ?, ?, ?").param_count == 3
    assert _analysis(shop, "SELECT ?3, ?1").param_count == 3
    assert _analysis(shop, "SELECT 1").param_count == 0


def test_classification_tables_and_filters(shop: Path) -> None:
    upsert = _analysis(
        shop,
        "INSERT INTO orders (id, customer_id, status, total, created_at) "
        "VALUES ($1, 1, 'x', 1, 't') ON CONFLICT (id) DO UPDATE SET status = 'y' RETURNING id",
    )
    assert (upsert.kind, upsert.statement_type, upsert.written) == ("write", "INSERT", ("orders",))
    cte_delete = _analysis(shop, "WITH x AS (SELECT 1) DELETE FROM orders WHERE id = 1")
    assert (cte_delete.kind, cte_delete.statement_type) == ("write", "DELETE")
    explained = _analysis(shop, "EXPLAIN QUERY PLAN DELETE FROM orders")
    assert (explained.kind, explained.written) == ("read", ())
    assert explained.statement_type == "EXPLAIN DELETE"
    view = _analysis(shop, "SELECT count(*) FROM customer_revenue")
    assert view.tables == ("customer_revenue",)  # the view, not the tables behind it
    assert not view.filtered
    joined = _analysis(shop, "SELECT 1 FROM orders JOIN customers USING (id)")
    assert joined.filtered
    assert set(joined.tables) == {"orders", "customers"}
    assert not _analysis(shop, "SELECT * FROM orders ORDER BY id").filtered
    assert _analysis(shop, "VALUES (1)").statement_type == "VALUES"


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM orders LIMIT 0",
        "SELECT * FROM orders LIMIT -1 OFFSET 100",
        "SELECT * FROM orders LIMIT 100, 5",
        "WITH o AS (SELECT * FROM orders LIMIT $1) SELECT count(*) FROM o",
        "SELECT o.id FROM orders o, json_each(o.meta)",
        "SELECT o.id, j.value FROM orders o JOIN json_tree('[1]') j",
        'SELECT o.id FROM orders o, "json_each"(o.meta)',
    ],
)
def test_limits_offsets_and_table_valued_functions_are_filters(shop: Path, sql: str) -> None:
    # Each can leave out every row of a table that has some: an empty answer is checked.
    assert _analysis(shop, sql).filtered


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM orders ORDER BY id",
        "SELECT * FROM orders ORDER BY id LIMIT 3",  # keeps a row of a table that has some
        "SELECT json_extract(meta, '$.limit') AS l FROM orders",
        'SELECT "limit" FROM (SELECT 1 AS "limit")',
        "SELECT 'json_each(x) LIMIT 0' AS s FROM orders",
    ],
)
def test_names_and_strings_are_not_filters(shop: Path, sql: str) -> None:
    assert not _analysis(shop, sql).filtered


def test_normalisation_keeps_the_work_and_drops_the_layout(shop: Path) -> None:
    a = _analysis(shop, "UPDATE orders SET status = $1 WHERE id = $2")
    b = _analysis(shop, 'update  ORDERS\n  set status=?1 -- pay\n where "id" = ?2;')
    c = _analysis(shop, "UPDATE orders SET status = $1 WHERE id = 3")
    assert a.normalized == "update orders set status = ?1 where id = ?2"
    assert b.normalized == "update orders set status = ?1 where `id` = ?2"
    assert a.normalized != c.normalized
    assert _analysis(shop, "SELECT ?, ?").normalized == "select ?1 , ?2"


def test_cte_names_are_read_from_every_with_clause() -> None:
    tokens = tokenize(
        'WITH RECURSIVE a(x) AS (SELECT 1), "B" AS MATERIALIZED (SELECT 2) '
        "SELECT * FROM a, (WITH c AS NOT MATERIALIZED (SELECT 3) SELECT * FROM c) "
        "WINDOW w AS (ORDER BY 1)"
    )
    assert cte_names(tokens) == frozenset({"a", "b", "c"})


def test_the_tokenizer_follows_sqlite() -> None:
    kinds = [(t.kind, t.text) for t in tokenize("x'41' X 'a''b' 1.5e+3 0x1F ?12 $a::b(c) ->>")]
    assert kinds == [
        ("blob", "x'41'"),
        ("word", "X"),
        ("string", "'a''b'"),
        ("number", "1.5e+3"),
        ("number", "0x1F"),
        ("param", "?12"),
        ("param", "$a::b(c)"),
        ("other", "->>"),
    ]
    assert [t.text for t in tokenize("\ufeffSELECT/* x */1--y")] == ["SELECT", "1"]
    assert [t.name for t in tokenize('"a""b" `c``d` [e"f]')] == ['a"b', "c`d", 'e"f']
    assert [t.kind for t in tokenize("'open")] == ["string"]  # unterminated: SQLite refuses


def test_the_analysis_cache_keys_on_text_and_catalog_version(shop: Path) -> None:
    analyzer = SqliteSqlAnalyzer(cache_size=2)
    conn = sqlite3.connect(
        f"file:{shop}?mode=ro", uri=True, isolation_level=None, cached_statements=0
    )
    wall = Wall()
    prewarm(conn)
    conn.set_authorizer(wall)
    try:
        catalog = load_sqlite_catalog(conn)
        first = analyzer.analyze("SELECT id FROM orders", catalog, conn, wall)
        assert analyzer.analyze("SELECT id FROM orders", catalog, conn, wall) is first
        for _ in range(2):
            with pytest.raises(GatewayError):
                analyzer.analyze("SELECT * FROM nope", catalog, conn, wall)
        assert (analyzer.hits, analyzer.misses) == (2, 2)
        other = type(catalog)(tables=catalog.tables, version="other", dialect="sqlite")
        again = analyzer.analyze("SELECT id FROM orders", other, conn, wall)
        # Compiled again (the connection caches no statements), with the same result.
        assert again is not first
        assert again == first
        assert analyzer.misses == 3
        assert analyzer.cached("SELECT id FROM orders", catalog) is None  # evicted (size 2)
    finally:
        conn.close()
    with pytest.raises(InvalidArgumentError):
        SqliteSqlAnalyzer(cache_size=0)


# --- the second wall: SQLite refuses at run time what analysis let through ----------------------


async def test_the_wall_refuses_at_run_time_what_analysis_would_have(
    gw: SQLiteGateway, shop: Path
) -> None:
    before = _state(shop.parent)
    cases = {
        "SELECT sql FROM sqlite_master": "unknown_table",
        f"SELECT * FROM {JOURNAL_TABLE}": "unknown_table",
        "SELECT load_extension('x')": "forbidden_function",
        "SELECT * FROM pragma_table_info('orders')": "unknown_table",
        "SELECT count(*) FROM dbstat": "unknown_table",
    }
    for sql, code in cases.items():
        with pytest.raises(GatewayError) as info:
            await on_thread(gw, "read", ReadPlan(sql, (), agent_sql=True))
        assert info.value.code == code, sql
    plan = WritePlan(f"DELETE FROM {JOURNAL_TABLE}", (), agent_sql=True)
    with pytest.raises(GatewayError) as info:
        await on_thread(
            gw, "write", plan, agent_id=AGENT, key="k", plan_hash="", fingerprint="f", now="t"
        )
    assert info.value.code == "unknown_table"
    assert await on_thread(gw, "lookup", AGENT, "k") is None
    assert _state(shop.parent) == before
    # The gateway's own statements on the same connections are not checked.
    plain = await on_thread(gw, "read", ReadPlan("SELECT count(*) FROM sqlite_master", ()))
    assert plain.rows[0]["count(*)"] > 0


async def test_the_journal_is_invisible_to_agents(gw: SQLiteGateway, shop: Path) -> None:
    assert JOURNAL_TABLE not in gw.catalog.tables
    conn = sqlite3.connect(shop)
    try:
        found = conn.execute("SELECT count(*) FROM sqlite_master WHERE name = ?", (JOURNAL_TABLE,))
        assert found.fetchone()[0] == 1  # it lives in the target, hidden
    finally:
        conn.close()
    error = await _refusal(gw, f"SELECT * FROM {JOURNAL_TABLE}")
    assert error.code == "unknown_table"
    with pytest.raises(GatewayError) as info:
        await gw.query(AGENT, {"op": "count", "table": JOURNAL_TABLE})
    assert info.value.code == "unknown_table"
