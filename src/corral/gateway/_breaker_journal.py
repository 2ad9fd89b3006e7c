"""Where freezes and reinstatements are kept: ``FreezeJournal`` and its SQLite and PostgreSQL
implementations (one table, ``corral_breaker_records``)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

from corral.gateway._breaker_records import Freeze, Reinstatement, record_from_dict
from corral.gateway._errors import GatewayError
from corral.kernel import InvalidArgumentError, UsageError
from corral.kernel import _validate as v

if TYPE_CHECKING:
    from collections.abc import Callable

    from psycopg_pool import AsyncConnectionPool

__all__ = ["FreezeJournal", "PostgresFreezeJournal", "SQLiteFreezeJournal"]

T = TypeVar("T")

TABLE = "corral_breaker_records"
# The same key the daemon's store takes: concurrent first opens must not race on CREATE TABLE.
_SCHEMA_LOCK_KEY = 0x636F7272616C  # "corral"


@runtime_checkable
class FreezeJournal(Protocol):
    """Durable storage of freezes and reinstatements.

    ``open`` creates what it needs and is a no-op when already open; ``close`` is idempotent.
    ``record_*`` are idempotent by record id (writing the same record twice keeps one).
    ``current_freezes`` maps each agent whose latest record is a freeze to that freeze;
    ``history`` lists an agent's records oldest first. Storage failures raise
    ``GatewayError("database_unavailable")`` (retryable).
    """

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def record_freeze(self, freeze: Freeze) -> None: ...

    async def record_reinstatement(self, reinstatement: Reinstatement) -> None: ...

    async def current_freezes(self) -> dict[str, Freeze]: ...

    async def history(self, agent_id: str) -> list[Freeze | Reinstatement]: ...


def _dump(record: Freeze | Reinstatement) -> str:
    return json.dumps(record.to_dict(), separators=(",", ":"), sort_keys=True)


def _text(value: str) -> str:
    """``value`` as PostgreSQL can store it: text may not hold NUL, which an agent's request
    (kept as evidence) can carry; U+FFFD stands in for it."""
    return value.replace("\x00", "\ufffd")


def _storable(value: Any) -> Any:
    if isinstance(value, str):
        return _text(value)
    if isinstance(value, dict):
        return {_text(str(k)): _storable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_storable(v) for v in value]
    return value


def _unavailable(where: str, exc: BaseException) -> GatewayError:
    text = str(exc).strip()
    reason = text.splitlines()[0] if text else type(exc).__name__
    return GatewayError(
        "database_unavailable",
        f"the freeze journal at {where} cannot be used: {reason}",
        journal=where,
        reason=reason,
    )


# --- SQLite -------------------------------------------------------------------------------

_SQLITE_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {TABLE} (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    agent_id TEXT NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('freeze', 'reinstatement')),
    at TEXT NOT NULL,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS {TABLE}_agent ON {TABLE} (agent_id, seq);
"""


class SQLiteFreezeJournal:
    """A :class:`FreezeJournal` in one SQLite file (created with its directory if missing).

    Journal mode WAL, ``synchronous=FULL``: a recorded freeze survives a crash of the process
    or the machine. The connection lives on one worker thread, so the event loop never blocks
    on SQLite.
    """

    def __init__(self, path: str | Path) -> None:
        v.instance_of("SQLiteFreezeJournal", "path", path, (str, Path))
        if not str(path).strip():
            raise InvalidArgumentError("SQLiteFreezeJournal", "path", "a file path", path)
        self.path = Path(path)
        self._executor: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._executor is None:
            raise UsageError(f"the freeze journal at {str(self.path)!r} is not open")
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, fn, *args)
        except sqlite3.OperationalError as exc:
            raise _unavailable(f"sqlite:{self.path}", exc) from exc

    async def open(self) -> None:
        if self._executor is not None:
            return
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="corral-freezes")
        try:
            await self._run(self._open)
        except BaseException as exc:
            self._executor.shutdown(wait=False)
            self._executor = None
            if isinstance(exc, OSError | sqlite3.DatabaseError):
                raise _unavailable(f"sqlite:{self.path}", exc) from exc
            raise

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("PRAGMA busy_timeout=5000")
            conn.executescript(_SQLITE_SCHEMA)
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    def _require(self) -> sqlite3.Connection:
        if self._conn is None:
            raise UsageError(f"the freeze journal at {str(self.path)!r} is not open")
        return self._conn

    async def close(self) -> None:
        executor, self._executor = self._executor, None
        if executor is None:
            return
        conn, self._conn = self._conn, None
        if conn is not None:
            await asyncio.get_running_loop().run_in_executor(executor, conn.close)
        executor.shutdown(wait=True)

    def _insert(self, record: Freeze | Reinstatement) -> None:
        self._require().execute(
            f"INSERT INTO {TABLE} (id, agent_id, kind, at, data) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT (id) DO NOTHING",
            (record.id, record.agent_id, record.kind, record.at.isoformat(), _dump(record)),
        )

    async def record_freeze(self, freeze: Freeze) -> None:
        await self._run(self._insert, freeze)

    async def record_reinstatement(self, reinstatement: Reinstatement) -> None:
        await self._run(self._insert, reinstatement)

    def _current(self) -> dict[str, Freeze]:
        rows = self._require().execute(
            f"SELECT r.data FROM {TABLE} AS r JOIN (SELECT agent_id, MAX(seq) AS seq "
            f"FROM {TABLE} GROUP BY agent_id) AS latest ON r.seq = latest.seq "
            "WHERE r.kind = 'freeze'"
        )
        freezes = (Freeze.from_dict(json.loads(data)) for (data,) in rows)
        return {freeze.agent_id: freeze for freeze in freezes}

    async def current_freezes(self) -> dict[str, Freeze]:
        return await self._run(self._current)

    def _history(self, agent_id: str) -> list[Freeze | Reinstatement]:
        rows = self._require().execute(
            f"SELECT data FROM {TABLE} WHERE agent_id = ? ORDER BY seq", (agent_id,)
        )
        return [record_from_dict(json.loads(data)) for (data,) in rows]

    async def history(self, agent_id: str) -> list[Freeze | Reinstatement]:
        return await self._run(self._history, agent_id)

    def __repr__(self) -> str:
        return f"SQLiteFreezeJournal({str(self.path)!r})"


# --- PostgreSQL ---------------------------------------------------------------------------


def _import_psycopg() -> Any:
    try:
        import psycopg
    except ImportError as exc:  # pragma: no cover - the postgres extra is missing
        raise UsageError("PostgresFreezeJournal needs psycopg: install corral[postgres]") from exc
    return psycopg


class PostgresFreezeJournal:
    """A :class:`FreezeJournal` in a PostgreSQL database.

    ``dsn_or_pool`` is a libpq connection string (the journal then keeps a pool of at most two
    connections, opened by :meth:`open` and closed by :meth:`close`) or an open
    ``psycopg_pool.AsyncConnectionPool`` that the caller keeps ownership of. ``schema``
    (created if missing) keeps the table apart, default the search path's first schema. Each
    record is committed before ``record_*`` returns.
    """

    def __init__(
        self,
        dsn_or_pool: str | AsyncConnectionPool[Any],
        /,
        *,
        schema: str | None = None,
    ) -> None:
        where = "PostgresFreezeJournal"
        psycopg = _import_psycopg()
        from psycopg import sql

        v.non_empty_str(where, "schema", schema, optional=True)
        self.schema = schema
        self._owned = isinstance(dsn_or_pool, str)
        self._dsn: str | None = None
        self._pool: AsyncConnectionPool[Any] | None = None
        self._open = False
        if isinstance(dsn_or_pool, str):
            v.non_empty_str(where, "dsn_or_pool", dsn_or_pool)
            try:
                params = psycopg.conninfo.conninfo_to_dict(dsn_or_pool)
            except psycopg.ProgrammingError as exc:
                raise InvalidArgumentError(
                    where,
                    "dsn_or_pool",
                    "a libpq connection string or postgresql:// URI",
                    dsn_or_pool,
                ) from exc
            params.pop("password", None)
            self._dsn = dsn_or_pool
            self._where = psycopg.conninfo.make_conninfo(**params)
        elif callable(getattr(dsn_or_pool, "connection", None)):
            self._pool = dsn_or_pool
            self._where = f"pool {getattr(dsn_or_pool, 'name', '?')}"
        else:
            raise InvalidArgumentError(
                where,
                "dsn_or_pool",
                "a libpq connection string or a psycopg_pool.AsyncConnectionPool",
                dsn_or_pool,
            )
        table = sql.Identifier(schema, TABLE) if schema else sql.Identifier(TABLE)
        # Made only when missing: CREATE SCHEMA IF NOT EXISTS needs CREATE on the database
        # even when the schema is there, which a least-privileged role does not hold.
        self._schema = schema
        self._schema_ddl = (
            sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)) if schema else None
        )
        self._ddl: list[sql.Composable] = [
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (seq bigint GENERATED ALWAYS AS IDENTITY "
                "PRIMARY KEY, id text NOT NULL UNIQUE, agent_id text NOT NULL, kind text NOT "
                "NULL CHECK (kind IN ('freeze', 'reinstatement')), at timestamptz NOT NULL, "
                "data jsonb NOT NULL)"
            ).format(table),
            sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (agent_id, seq)").format(
                sql.Identifier(f"{TABLE}_agent"), table
            ),
        ]
        self._insert = sql.SQL(
            "INSERT INTO {} (id, agent_id, kind, at, data) VALUES (%s, %s, %s, %s, %s) "
            "ON CONFLICT (id) DO NOTHING"
        ).format(table)
        self._current = sql.SQL(
            "SELECT data FROM (SELECT DISTINCT ON (agent_id) kind, data FROM {} "
            "ORDER BY agent_id, seq DESC) AS latest WHERE kind = 'freeze'"
        ).format(table)
        self._history = sql.SQL("SELECT data FROM {} WHERE agent_id = %s ORDER BY seq").format(
            table
        )

    async def open(self) -> None:
        if self._open:
            return
        psycopg = _import_psycopg()
        from psycopg_pool import AsyncConnectionPool

        try:
            if self._owned:
                assert self._dsn is not None
                pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
                    self._dsn,
                    min_size=1,
                    max_size=2,
                    open=False,
                    kwargs={"autocommit": True, "connect_timeout": 10},
                    # A connection the server dropped while idle is replaced, not handed out.
                    check=AsyncConnectionPool.check_connection,
                    name=f"corral-freezes {self._where}",
                )
                # Fail at once when the server does not answer, not after the pool's timeout.
                conn = await psycopg.AsyncConnection.connect(self._dsn, connect_timeout=10)
                await conn.close()
                await pool.open()
                self._pool = pool
            try:
                await self._execute_ddl()
            except BaseException:
                if self._owned:
                    pool, self._pool = self._require(), None
                    await pool.close()
                raise
        except psycopg.OperationalError as exc:
            raise _unavailable(self._where, exc) from exc
        self._open = True

    async def _execute_ddl(self) -> None:
        async with self._require().connection() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK_KEY,))
            if self._schema_ddl is not None:
                found = await conn.execute(
                    "SELECT 1 FROM pg_namespace WHERE nspname = %s", (self._schema,)
                )
                if await found.fetchone() is None:
                    await conn.execute(self._schema_ddl)
            for statement in self._ddl:
                await conn.execute(statement)

    def _require(self) -> AsyncConnectionPool[Any]:
        if self._pool is None:
            raise UsageError(f"the freeze journal at {self._where!r} is not open")
        return self._pool

    async def close(self) -> None:
        self._open = False
        if self._owned and self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close()

    async def _write(self, record: Freeze | Reinstatement) -> None:
        psycopg = _import_psycopg()
        from psycopg.types.json import Jsonb

        self._require_open()
        data = _storable(record.to_dict())
        try:
            async with self._require().connection() as conn, conn.transaction():
                await conn.execute(
                    self._insert,
                    (record.id, _text(record.agent_id), record.kind, record.at, Jsonb(data)),
                )
        except psycopg.OperationalError as exc:
            raise _unavailable(self._where, exc) from exc
        except psycopg.Error as exc:
            raise GatewayError(
                "database_error",
                f"the freeze journal at {self._where!r} refused a record: {exc}",
                record=record.id,
            ) from exc

    async def _select(self, query: Any, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        psycopg = _import_psycopg()
        self._require_open()
        try:
            async with self._require().connection() as conn, conn.transaction():
                cursor = await conn.execute(query, params)
                rows = await cursor.fetchall()
        except psycopg.OperationalError as exc:
            raise _unavailable(self._where, exc) from exc
        return [row[0] for row in rows]

    def _require_open(self) -> None:
        if not self._open:
            raise UsageError(f"the freeze journal at {self._where!r} is not open")

    async def record_freeze(self, freeze: Freeze) -> None:
        await self._write(freeze)

    async def record_reinstatement(self, reinstatement: Reinstatement) -> None:
        await self._write(reinstatement)

    async def current_freezes(self) -> dict[str, Freeze]:
        freezes = (Freeze.from_dict(data) for data in await self._select(self._current))
        return {freeze.agent_id: freeze for freeze in freezes}

    async def history(self, agent_id: str) -> list[Freeze | Reinstatement]:
        rows = await self._select(self._history, (_text(agent_id),))
        return [record_from_dict(data) for data in rows]

    def __repr__(self) -> str:
        schema = f", schema={self.schema!r}" if self.schema else ""
        return f"PostgresFreezeJournal({self._where!r}{schema})"
