"""The two stores a store test runs on, SQLite and PostgreSQL, each opened as the test asks
and with a way to make the database itself refuse a row (``inject_failure``); the
``backend`` fixture (tests/daemon/conftest.py) gives a test each in turn."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from psycopg import sql

from corral.daemon import SQLiteStore
from corral.daemon.stores import PostgresStore, Store
from corral.runtime import FakeClock

__all__ = ["Backend", "postgres_backend", "sqlite_backend"]


@dataclass
class Backend:
    kind: str
    clock: FakeClock
    factory: Callable[[], Store]
    # Makes the database itself refuse to store the command with this key (a trigger).
    inject_failure: Callable[[str], None]
    db_error: type[Exception]
    opened: list[Store] = field(default_factory=list)

    async def open(self) -> Store:
        store = self.factory()
        self.opened.append(store)
        await store.open()
        return store


def sqlite_backend(path: Path, clock: FakeClock) -> Backend:
    def inject(key: str) -> None:
        with sqlite3.connect(path) as conn:
            conn.execute(
                f"CREATE TRIGGER fail_{key} BEFORE INSERT ON commands WHEN NEW.key = '{key}' "
                "BEGIN SELECT RAISE(ABORT, 'injected failure'); END"
            )
        conn.close()

    return Backend("sqlite", clock, lambda: SQLiteStore(path, clock=clock), inject, sqlite3.Error)


def postgres_backend(dsn: str, clock: FakeClock) -> Backend:
    def inject(key: str) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "CREATE OR REPLACE FUNCTION fail_insert() RETURNS trigger LANGUAGE plpgsql "
                "AS $$ BEGIN RAISE EXCEPTION 'injected failure'; END $$"
            )
            conn.execute(
                sql.SQL(
                    "CREATE TRIGGER {} BEFORE INSERT OR UPDATE ON commands FOR EACH ROW "
                    "WHEN (NEW.key = {}) EXECUTE FUNCTION fail_insert()"
                ).format(sql.Identifier(f"fail_{key}"), sql.Literal(key))
            )

    factory = lambda: PostgresStore(dsn, clock=clock)  # noqa: E731
    return Backend("postgres", clock, factory, inject, psycopg.Error)
