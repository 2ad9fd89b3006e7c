"""Turn records and their logs in a store: two tables next to the event log.

``turns`` holds one row per turn of an agent (``agent_id``, ``n``, ``data``: the record
without its output and log, see ``_turn_records``); ``turn_logs`` holds the turn's output and
log (``agent_id``, ``n``, ``logs``: a JSON object ``{"output", "logs"}``, ``logs`` a list of
``{"stream", "text"}`` entries, both capped by the daemon): a list of turns reads only the
small rows. They
are not projections of the event log: the log says what happened, these keep what agents
printed, which the log never held. They are written in the transaction of the events that
make them (the ``turns`` of ``Store.append``: :data:`TurnRows`), so a record commits with its
events or not at all; they survive a restart and are deleted with the agent
(:meth:`TurnStore.delete_turns`, and ``agent.deleted``).

The mixins give :class:`~.SQLiteStore` and :class:`~.PostgresStore` these methods;
:class:`MemoryTurns` is the same for a store without tables (a test's store), in memory.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from psycopg import sql

    from corral.daemon._events import Event

Json = dict[str, Any]

TurnRow = tuple[Json, Json]
"""One turn's row: its record (``agentId``, ``turn``, ...) and its ``{"output", "logs"}``."""

TurnRows = Callable[[Sequence["Event"]], list[TurnRow]]
"""What ``Store.append(events, turns=...)`` calls with the append's events once numbered: the
turn rows to write in the same transaction (replacing a stored row of the same agent and
turn), after the events' projection rows. Pure: a store may call it more than once."""

SQLITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS turns (
    agent_id TEXT NOT NULL,
    n INTEGER NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (agent_id, n)
);
CREATE TABLE IF NOT EXISTS turn_logs (
    agent_id TEXT NOT NULL,
    n INTEGER NOT NULL,
    logs TEXT NOT NULL,
    PRIMARY KEY (agent_id, n)
);
"""


@runtime_checkable
class TurnStore(Protocol):
    """Where turn records are kept (see the module docstring)."""

    async def save_turn(self, record: Mapping[str, Any], detail: Mapping[str, Any]) -> None:
        """Write turn ``record["turn"]`` of ``record["agentId"]`` and its ``detail``
        (``{"output", "logs"}``), replacing what was there."""

    async def list_turns(
        self, agent_id: str, *, before: int | None = None, limit: int = 50
    ) -> list[Json]:
        """The agent's turn records (without logs), newest first; with ``before``, only
        turns numbered below it."""
        ...

    async def get_turn(self, agent_id: str, turn: int) -> tuple[Json, Json] | None:
        """Turn ``turn`` of the agent and its detail (``{"output", "logs"}``), None when
        there is no such record."""
        ...

    async def delete_turns(self, agent_id: str) -> int:
        """Delete every turn record and log of the agent; how many turns were deleted."""
        ...


def _dump(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


Statement = tuple[str, list[tuple[Any, ...]]]
"""One SQLite statement and the rows it is run with (``executemany``): made where the JSON is
serialised, run where the connection lives."""


_ROWS_AT_ONCE = 200  # rows in one INSERT: at most 200 x 5 variables, far below SQLite's limit


def execute(conn: sqlite3.Connection, statements: Sequence[Statement]) -> None:
    """Run ``statements`` with ``conn``, in its transaction; a statement with no rows is
    skipped. An ``INSERT ... VALUES (?, ...)`` of many rows goes as one statement with many
    ``VALUES`` rows: the connection's thread then takes the GIL once a statement, not once a
    row, and does not queue behind a busy event loop for every row."""
    for text, rows in statements:
        if not rows:
            continue
        head, values, tail = text.partition(" VALUES ")
        if not values or len(rows) == 1:
            conn.executemany(text, rows)
            continue
        for start in range(0, len(rows), _ROWS_AT_ONCE):
            chunk = rows[start : start + _ROWS_AT_ONCE]
            many = ", ".join([tail] * len(chunk))
            conn.execute(f"{head} VALUES {many}", [v for row in chunk for v in row])


class MemoryTurns:
    """:class:`TurnStore` in memory (lost with the process)."""

    def __init__(self) -> None:
        self._turns: dict[str, dict[int, tuple[Json, Json]]] = {}

    async def save_turn(self, record: Mapping[str, Any], detail: Mapping[str, Any]) -> None:
        found = self._turns.setdefault(str(record["agentId"]), {})
        found[int(record["turn"])] = (dict(record), dict(detail))

    async def list_turns(
        self, agent_id: str, *, before: int | None = None, limit: int = 50
    ) -> list[Json]:
        found = self._turns.get(agent_id, {})
        numbers = sorted((n for n in found if before is None or n < before), reverse=True)
        return [dict(found[n][0]) for n in numbers[:limit]]

    async def get_turn(self, agent_id: str, turn: int) -> tuple[Json, Json] | None:
        found = self._turns.get(agent_id, {}).get(turn)
        return None if found is None else (dict(found[0]), dict(found[1]))

    async def delete_turns(self, agent_id: str) -> int:
        return len(self._turns.pop(agent_id, {}))


# --- SQLite ----------------------------------------------------------------------------------


class SQLiteTurns:
    """The turn tables of a :class:`~.SQLiteStore` (its connection's worker thread)."""

    if TYPE_CHECKING:

        async def _run(self, fn: Any, *args: Any) -> Any: ...

        def _require(self) -> sqlite3.Connection: ...

    async def save_turn(self, record: Mapping[str, Any], detail: Mapping[str, Any]) -> None:
        await self._run(self._save_turn, dict(record), dict(detail))

    def _save_turn(self, record: Json, detail: Json) -> None:
        conn = self._require()
        conn.execute("BEGIN IMMEDIATE")
        try:
            execute(conn, self.turn_statements([(record, detail)]))
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    @staticmethod
    def turn_statements(rows: Sequence[TurnRow]) -> list[Statement]:
        """What writes turn ``rows`` (replacing what was there)."""
        if not rows:
            return []
        keys = [(str(record["agentId"]), int(record["turn"])) for record, _ in rows]
        return [
            (
                "INSERT OR REPLACE INTO turns (agent_id, n, data) VALUES (?, ?, ?)",
                [(*key, _dump(record)) for key, (record, _) in zip(keys, rows, strict=True)],
            ),
            (
                "INSERT OR REPLACE INTO turn_logs (agent_id, n, logs) VALUES (?, ?, ?)",
                [(*key, _dump(detail)) for key, (_, detail) in zip(keys, rows, strict=True)],
            ),
        ]

    async def list_turns(
        self, agent_id: str, *, before: int | None = None, limit: int = 50
    ) -> list[Json]:
        rows: list[tuple[str]] = await self._run(self._list_turns, agent_id, before, limit)
        return [json.loads(data) for (data,) in rows]

    def _list_turns(self, agent_id: str, before: int | None, limit: int) -> list[tuple[str]]:
        return (
            self._require()
            .execute(
                "SELECT data FROM turns WHERE agent_id = ? AND n < ? ORDER BY n DESC LIMIT ?",
                (agent_id, 2**62 if before is None else before, limit),
            )
            .fetchall()
        )

    async def get_turn(self, agent_id: str, turn: int) -> tuple[Json, Json] | None:
        row: tuple[str, str | None] | None = await self._run(self._get_turn, agent_id, turn)
        if row is None:
            return None
        return json.loads(row[0]), json.loads(row[1] or "{}")

    def _get_turn(self, agent_id: str, turn: int) -> tuple[str, str | None] | None:
        found: tuple[str, str | None] | None = (
            self._require()
            .execute(
                "SELECT t.data, l.logs FROM turns t LEFT JOIN turn_logs l "
                "ON l.agent_id = t.agent_id AND l.n = t.n WHERE t.agent_id = ? AND t.n = ?",
                (agent_id, turn),
            )
            .fetchone()
        )
        return found

    async def delete_turns(self, agent_id: str) -> int:
        deleted: int = await self._run(self._delete_turns, agent_id)
        return deleted

    def _delete_turns(self, agent_id: str) -> int:
        conn = self._require()
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute("DELETE FROM turn_logs WHERE agent_id = ?", (agent_id,))
            count = conn.execute("DELETE FROM turns WHERE agent_id = ?", (agent_id,)).rowcount
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return int(count)


# --- PostgreSQL ------------------------------------------------------------------------------


def postgres_ddl(table: Callable[[str], sql.Identifier]) -> list[sql.Composed]:
    """The turn tables' DDL, named by ``table`` (qualified by the store's schema)."""
    from psycopg import sql

    turns, logs = table("turns"), table("turn_logs")
    return [
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (agent_id text NOT NULL, n bigint NOT NULL, "
            "data json NOT NULL, PRIMARY KEY (agent_id, n))"
        ).format(turns),
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (agent_id text NOT NULL, n bigint NOT NULL, "
            "logs json NOT NULL, PRIMARY KEY (agent_id, n))"
        ).format(logs),
    ]


class PostgresTurns:
    """The turn tables of a :class:`~.PostgresStore` (its pool; its schema)."""

    if TYPE_CHECKING:
        schema: str | None

        def _require(self) -> Any: ...

        def _unavailable(self, exc: Any) -> Exception: ...

    def _tables(self) -> tuple[sql.Identifier, sql.Identifier]:
        from psycopg import sql

        if self.schema:
            return sql.Identifier(self.schema, "turns"), sql.Identifier(self.schema, "turn_logs")
        return sql.Identifier("turns"), sql.Identifier("turn_logs")

    async def _pg(self, work: Callable[[Any], Any]) -> Any:
        import psycopg

        try:
            async with self._require().connection() as conn:
                return await work(conn)
        except psycopg.OperationalError as exc:
            raise self._unavailable(exc) from exc

    async def save_turn(self, record: Mapping[str, Any], detail: Mapping[str, Any]) -> None:
        async def work(conn: Any) -> None:
            async with conn.transaction(), conn.cursor() as cur:
                await self.write_turns(cur, [(dict(record), dict(detail))])

        await self._pg(work)

    async def write_turns(self, cur: Any, rows: Sequence[TurnRow]) -> None:
        """Write turn ``rows`` with ``cur``, in its transaction (replacing what was there)."""
        if not rows:
            return
        from psycopg import sql

        turns, logs_table = self._tables()
        # One row per turn, the last one given winning (as one statement per row did): an
        # INSERT ... ON CONFLICT may not touch a row twice.
        last: dict[tuple[str, int], TurnRow] = {}
        for record, detail in rows:
            last[(str(record["agentId"]), int(record["turn"]))] = (record, detail)
        agents = [agent_id for agent_id, _ in last]
        numbers = [n for _, n in last]
        await cur.execute(
            sql.SQL(
                "INSERT INTO {} (agent_id, n, data) "
                "SELECT a, n, d::json FROM unnest(%b::text[], %b::bigint[], %b::text[]) "
                "AS u(a, n, d) ON CONFLICT (agent_id, n) DO UPDATE SET data = EXCLUDED.data"
            ).format(turns),
            (agents, numbers, [_dump(record) for record, _ in last.values()]),
        )
        await cur.execute(
            sql.SQL(
                "INSERT INTO {} (agent_id, n, logs) "
                "SELECT a, n, d::json FROM unnest(%b::text[], %b::bigint[], %b::text[]) "
                "AS u(a, n, d) ON CONFLICT (agent_id, n) DO UPDATE SET logs = EXCLUDED.logs"
            ).format(logs_table),
            (agents, numbers, [_dump(detail) for _, detail in last.values()]),
        )

    async def list_turns(
        self, agent_id: str, *, before: int | None = None, limit: int = 50
    ) -> list[Json]:
        from psycopg import sql

        turns, _ = self._tables()

        async def work(conn: Any) -> list[Json]:
            cur = await conn.execute(
                sql.SQL(
                    "SELECT data FROM {} WHERE agent_id = %s AND n < %s ORDER BY n DESC LIMIT %s"
                ).format(turns),
                (agent_id, 2**62 if before is None else before, limit),
            )
            return [data for (data,) in await cur.fetchall()]

        found: list[Json] = await self._pg(work)
        return found

    async def get_turn(self, agent_id: str, turn: int) -> tuple[Json, Json] | None:
        from psycopg import sql

        turns, logs = self._tables()

        async def work(conn: Any) -> tuple[Json, Json] | None:
            cur = await conn.execute(
                sql.SQL(
                    "SELECT t.data, l.logs FROM {} t LEFT JOIN {} l "
                    "ON l.agent_id = t.agent_id AND l.n = t.n WHERE t.agent_id = %s AND t.n = %s"
                ).format(turns, logs),
                (agent_id, turn),
            )
            row = await cur.fetchone()
            return None if row is None else (row[0], row[1] or {})

        found: tuple[Json, Json] | None = await self._pg(work)
        return found

    async def delete_turns(self, agent_id: str) -> int:
        from psycopg import sql

        turns, logs = self._tables()

        async def work(conn: Any) -> int:
            async with conn.transaction():
                await conn.execute(
                    sql.SQL("DELETE FROM {} WHERE agent_id = %s").format(logs), (agent_id,)
                )
                cur = await conn.execute(
                    sql.SQL("DELETE FROM {} WHERE agent_id = %s").format(turns), (agent_id,)
                )
                return int(cur.rowcount)

        deleted: int = await self._pg(work)
        return deleted


def turns_of(store: object) -> TurnStore:
    """``store``'s turn tables, or memory for a store without them."""
    return store if isinstance(store, TurnStore) else MemoryTurns()


__all__ = [
    "SQLITE_SCHEMA",
    "MemoryTurns",
    "PostgresTurns",
    "SQLiteTurns",
    "Statement",
    "TurnRow",
    "TurnRows",
    "TurnStore",
    "execute",
    "postgres_ddl",
    "turns_of",
]
