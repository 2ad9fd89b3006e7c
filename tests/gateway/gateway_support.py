"""Shared pieces of the gateway's PostgreSQL tests: the shop with helpers, and a checksum."""

from __future__ import annotations

import contextlib
import hashlib
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from corral.gateway import Gateway, GatewayError
from corral.gateway.postgres._engine import PostgresEngine
from corral.gateway.sqlite._engine import SQLiteEngine
from tests.gateway.corpus import SHOP_ROWS, load_shop_postgres

__all__ = ["AGENT", "HELPERS", "checksum", "execute", "fetch", "refund", "refused", "shop_dsn"]

AGENT = "agent-7"

# Objects the tests need besides the shop: a table that stays empty, a slow function (the
# gateway refuses pg_sleep itself, not functions that call it), a function that writes (a
# volatile function analysis cannot see into) and one that unlocks the session's read-only
# default.
HELPERS = (
    "CREATE TABLE refunds (id integer PRIMARY KEY, order_id integer, amount numeric(10, 2))",
    "CREATE TABLE crash_writes (n integer NOT NULL)",
    "CREATE FUNCTION gw_sleep(seconds float8) RETURNS integer LANGUAGE sql VOLATILE "
    "AS 'SELECT 1 FROM pg_sleep(seconds)'",
    "CREATE FUNCTION gw_touch() RETURNS integer LANGUAGE sql VOLATILE AS "
    "$$ UPDATE orders SET status = 'touched' WHERE id = 1 RETURNING 1 $$",
    "CREATE FUNCTION gw_unlock() RETURNS text LANGUAGE sql VOLATILE AS "
    "$$ SELECT set_config('default_transaction_read_only', 'off', false) $$",
)


@pytest.fixture
def shop_dsn(postgres_dsn: str) -> str:
    with psycopg.connect(postgres_dsn) as conn:
        load_shop_postgres(conn)
        for statement in HELPERS:
            conn.execute(statement)
        conn.commit()
    return postgres_dsn


def execute(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def fetch(dsn: str, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()


def checksum(dsn: str) -> dict[str, Any]:
    """Everything an escape could change: every shop table's rows, the sequence, the
    relations and functions that exist, large objects, the journal, and settings."""
    state: dict[str, Any] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for table in (*SHOP_ROWS, "refunds", "crash_writes"):
            rows = conn.execute(f"SELECT t::text FROM {table} t ORDER BY 1").fetchall()
            state[table] = hashlib.sha256(repr(rows).encode()).hexdigest()
        state["sequence"] = conn.execute(
            "SELECT last_value, is_called FROM invoice_numbers"
        ).fetchone()
        state["relations"] = conn.execute(
            "SELECT n.nspname, c.relname, c.relkind::text FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast') "
            "ORDER BY 1, 2"
        ).fetchall()
        state["functions"] = conn.execute(
            "SELECT proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = 'public' ORDER BY 1"
        ).fetchall()
        state["large_objects"] = conn.execute(
            "SELECT count(*) FROM pg_largeobject_metadata"
        ).fetchone()
        state["journal"] = conn.execute("SELECT count(*) FROM corral.gateway_journal").fetchone()
        state["database_settings"] = conn.execute(
            "SELECT setconfig FROM pg_db_role_setting ORDER BY 1"
        ).fetchall()
    return state


async def refused(gw: Gateway, request: Any, agent: str = AGENT) -> GatewayError:
    """The ``GatewayError`` ``gw.query(agent, request)`` raises (fails the test if none)."""
    with pytest.raises(GatewayError) as info:
        await gw.query(agent, request)
    return info.value


def refund(
    id_: int, amount: str = "5.00", key: str | None = "refund-1", **extra: Any
) -> dict[str, Any]:
    """A keyed insert into ``refunds`` returning its row."""
    request: dict[str, Any] = {
        "op": "insert",
        "table": "refunds",
        "values": {"id": id_, "order_id": 4, "amount": amount},
        "returning": True,
        **extra,
    }
    if key is not None:
        request["idempotency_key"] = key
    return request


def postgres_of(gw: Gateway) -> PostgresEngine:
    """The PostgreSQL engine behind ``gw``, for tests that reach its pools."""
    engine = gw._engine
    assert isinstance(engine, PostgresEngine)
    return engine


def sqlite_of(gw: Gateway) -> SQLiteEngine:
    """The SQLite engine behind ``gw``, for tests that reach its file."""
    engine = gw._engine
    assert isinstance(engine, SQLiteEngine)
    return engine


async def on_thread(gw: Gateway, method: str, *args: Any, **kwargs: Any) -> Any:
    """Call the SQLite file's blocking ``method`` on one of ``gw``'s worker threads."""
    engine = sqlite_of(gw)
    return await engine.call(getattr(engine.file, method), *args, **kwargs)


@contextlib.contextmanager
def separated_roles(shop_dsn: str, *, writes: str) -> Iterator[tuple[str, str]]:
    """An owner's DSN and an agent role, made as docs/gateway.md "Deploying on PostgreSQL"
    lists: the owner logs in and owns the gateway's schema; the agent role holds ``writes``
    (``INSERT, UPDATE``, ...) on orders and refunds and nothing of the gateway's. Roles are
    the cluster's: unique names, dropped after."""
    suffix = uuid.uuid4().hex[:8]
    owner, agent = f"corral_owner_{suffix}", f"corral_agents_{suffix}"
    with psycopg.connect(shop_dsn, autocommit=True) as conn:
        dbname = conn.info.dbname
        conn.execute(f"CREATE ROLE {agent} NOLOGIN NOSUPERUSER")
        conn.execute(f"CREATE ROLE {owner} LOGIN NOSUPERUSER")
        conn.execute(f"GRANT {agent} TO {owner}")  # so that the owner may SET ROLE to it
        conn.execute(f"GRANT CONNECT ON DATABASE {dbname} TO {owner}")
        conn.execute(f"GRANT USAGE ON SCHEMA public TO {agent}")
        conn.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {agent}")
        conn.execute(f"GRANT {writes} ON orders, refunds TO {agent}")
        conn.execute(f"GRANT USAGE ON SEQUENCE invoice_numbers TO {agent}")
        conn.execute(f"CREATE SCHEMA corral AUTHORIZATION {owner}")
    params = conninfo_to_dict(shop_dsn)
    params["user"] = owner
    params.pop("password", None)
    try:
        yield make_conninfo("", **params), agent
    finally:
        with psycopg.connect(shop_dsn, autocommit=True) as conn:
            conn.execute("DROP SCHEMA corral CASCADE")
            for role in (owner, agent):
                conn.execute(f"DROP OWNED BY {role}")
                conn.execute(f"DROP ROLE {role}")
