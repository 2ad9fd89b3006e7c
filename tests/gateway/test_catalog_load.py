"""Loading a Catalog from a real PostgreSQL database and a real SQLite file."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg
import pytest

from corral.gateway._catalog import Catalog, Column
from corral.gateway._catalog_load import load_postgres_catalog, load_sqlite_catalog
from corral.kernel import InvalidArgumentError
from tests.gateway.corpus import (
    SHOP_TABLES,
    load_shop_postgres,
    load_shop_sqlite,
    shop_sqlite_file,
)


async def _pg_catalog(dsn: str) -> Catalog:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        return await load_postgres_catalog(conn)


def _ddl(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


@pytest.fixture
def shop_dsn(postgres_dsn: str) -> str:
    with psycopg.connect(postgres_dsn) as conn:
        load_shop_postgres(conn)
    return postgres_dsn


# --- PostgreSQL --------------------------------------------------------------------------------


@pytest.mark.postgres
async def test_postgres_loads_tables_views_columns_types_nullability_and_keys(
    shop_dsn: str,
) -> None:
    catalog = await _pg_catalog(shop_dsn)

    assert catalog.dialect == "postgresql"
    assert sorted(catalog.tables) == sorted(SHOP_TABLES)  # the sequence is not a table
    orders = catalog.tables["orders"]
    assert (orders.name, orders.schema) == ("orders", "public")
    assert list(orders.columns) == ["id", "customer_id", "status", "total", "created_at", "meta"]
    assert orders.columns["id"] == Column("id", "integer", nullable=False, primary_key=True)
    assert orders.columns["total"] == Column("total", "numeric(10,2)", False, False)
    assert orders.columns["created_at"].type == "timestamp with time zone"
    assert orders.columns["meta"] == Column("meta", "jsonb", nullable=True, primary_key=False)
    assert catalog.tables["customers"].columns["tags"].type == "text[]"
    assert catalog.tables["order_items"].primary_key == ("order_id", "product_id")
    view = catalog.tables["customer_revenue"]
    assert list(view.columns) == ["customer_id", "name", "revenue"]
    assert view.primary_key == ()
    assert catalog.table("ORDERS") is orders


@pytest.mark.postgres
async def test_postgres_keys_other_schemas_qualified_and_skips_system_schemas(
    postgres_dsn: str,
) -> None:
    _ddl(
        postgres_dsn,
        "CREATE TABLE orders (id int PRIMARY KEY)",
        "CREATE SCHEMA audit",
        "CREATE TABLE audit.events (id bigint, what text NOT NULL)",
        "CREATE TABLE audit.orders (id int)",  # hidden behind public.orders on search_path
        "CREATE MATERIALIZED VIEW audit.counts AS SELECT count(*) AS n FROM audit.events",
    )
    catalog = await _pg_catalog(postgres_dsn)

    assert sorted(catalog.tables) == ["audit.counts", "audit.events", "audit.orders", "orders"]
    assert catalog.tables["audit.events"].schema == "audit"
    assert catalog.tables["audit.events"].columns["what"].nullable is False
    assert catalog.tables["orders"].schema == "public"
    assert not any(
        t.schema in ("pg_catalog", "information_schema") for t in catalog.tables.values()
    )


@pytest.mark.postgres
async def test_postgres_version_is_stable_and_changes_with_every_ddl(shop_dsn: str) -> None:
    first = await _pg_catalog(shop_dsn)
    again = await _pg_catalog(shop_dsn)
    assert first.version == again.version
    assert len(first.version) == 64

    seen = {first.version}
    for statement in (
        "ALTER TABLE orders ADD COLUMN note text DEFAULT ''",
        "ALTER TABLE orders ALTER COLUMN note SET NOT NULL",
        "ALTER TABLE orders ALTER COLUMN note TYPE varchar(20)",
        "ALTER TABLE orders RENAME COLUMN note TO remark",
        "CREATE TABLE coupons (code text)",
        "ALTER TABLE coupons ADD PRIMARY KEY (code)",
    ):
        _ddl(shop_dsn, statement)
        version = (await _pg_catalog(shop_dsn)).version
        assert version not in seen, statement
        seen.add(version)

    _ddl(shop_dsn, "DROP TABLE coupons", "ALTER TABLE orders DROP COLUMN remark")
    assert (await _pg_catalog(shop_dsn)).version == first.version


@pytest.mark.postgres
async def test_postgres_empty_database_gives_an_empty_catalog(postgres_dsn: str) -> None:
    catalog = await _pg_catalog(postgres_dsn)
    assert dict(catalog.tables) == {}
    assert catalog.version


async def test_postgres_loader_refuses_other_connections() -> None:
    with pytest.raises(InvalidArgumentError, match="load_postgres_catalog: conn must be"):
        await load_postgres_catalog(sqlite3.connect(":memory:"))  # type: ignore[arg-type]


# --- SQLite ------------------------------------------------------------------------------------


@pytest.fixture
def shop_file(tmp_path: Path) -> Path:
    return shop_sqlite_file(tmp_path)


def _sqlite_catalog(path: Path, *, read_only: bool = False) -> Catalog:
    target = f"file:{path}?mode=ro" if read_only else str(path)
    conn = sqlite3.connect(target, uri=read_only)
    try:
        return load_sqlite_catalog(conn)
    finally:
        conn.close()


def test_sqlite_loads_tables_views_columns_and_keys(shop_file: Path) -> None:
    catalog = _sqlite_catalog(shop_file, read_only=True)

    assert catalog.dialect == "sqlite"
    assert sorted(catalog.tables) == sorted(SHOP_TABLES)
    orders = catalog.tables["orders"]
    assert orders.schema is None
    assert list(orders.columns) == ["id", "customer_id", "status", "total", "created_at", "meta"]
    # INTEGER PRIMARY KEY is the rowid: never NULL even without NOT NULL.
    assert orders.columns["id"] == Column("id", "integer", nullable=False, primary_key=True)
    assert orders.columns["total"] == Column("total", "numeric", nullable=False)
    assert orders.columns["meta"] == Column("meta", "text", nullable=True)
    assert catalog.tables["order_items"].primary_key == ("order_id", "product_id")
    assert list(catalog.tables["customer_revenue"].columns) == ["customer_id", "name", "revenue"]


def test_sqlite_skips_internal_tables_and_versions_track_ddl(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    conn = sqlite3.connect(path)
    try:
        empty = load_sqlite_catalog(conn)
        assert dict(empty.tables) == {}
        conn.execute("CREATE TABLE events (id INTEGER PRIMARY KEY AUTOINCREMENT, what)")
        conn.execute("INSERT INTO events (what) VALUES ('x')")  # creates sqlite_sequence
        first = load_sqlite_catalog(conn)
        assert list(first.tables) == ["events"]
        assert first.tables["events"].columns["what"] == Column("what", "", nullable=True)
        assert load_sqlite_catalog(conn).version == first.version
        conn.execute("ALTER TABLE events ADD COLUMN at TEXT")
        second = load_sqlite_catalog(conn)
        assert second.version not in (first.version, empty.version)
    finally:
        conn.close()


def test_sqlite_same_schema_in_two_files_has_the_same_version(
    shop_file: Path, tmp_path: Path
) -> None:
    other = tmp_path / "copy.db"
    conn = sqlite3.connect(other)
    try:
        load_shop_sqlite(conn)
        conn.execute("DELETE FROM order_items")  # rows are not part of the description
        conn.commit()
    finally:
        conn.close()
    assert _sqlite_catalog(other).version == _sqlite_catalog(shop_file).version


@pytest.mark.parametrize("conn", ["shop.db", None, object()])
def test_sqlite_loader_refuses_other_connections(conn: object) -> None:
    with pytest.raises(InvalidArgumentError, match="load_sqlite_catalog: conn must be"):
        load_sqlite_catalog(conn)  # type: ignore[arg-type]
