"""The thread side of :class:`~._sqlite_gateway.SQLiteGateway`: blocking SQLite calls only.

Everything here runs on the gateway's worker threads, never on the event loop.

Reads. Each worker thread keeps one connection opened with ``mode=ro`` (and ``PRAGMA
query_only``), so the engine refuses any write a read might carry (``read_only_violation``).
A read fetches at most ``max_rows + 1`` rows; one that returns none (or counts zero) with a
filter is run again in one read transaction together with the compiled ``exists_sql``, so rows
and emptiness verdict come from one snapshot. A progress handler interrupts a statement past
the statement timeout (``statement_timeout``).

Writes. One read-write connection to the target and one to the journal, used under one lock
(SQLite has a single writer anyway). The journal row is committed as ``in_flight`` before the
write runs, then updated to ``completed`` with the result after the write committed. A write
the engine refused rolls back and its journal row is deleted (its fate is known: not applied).
A crash between the two journal commits leaves ``in_flight``: the write may or may not have
been applied, and the key is ``outcome_unknown`` from then on.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from corral.gateway._catalog import Catalog
from corral.gateway._catalog_load import load_sqlite_catalog
from corral.gateway._errors import GatewayError
from corral.gateway._journal import StoredResult, decode_result, encode_result
from corral.gateway._ops import CompiledOperation
from corral.gateway._result import GatewayResult

__all__ = ["JOURNAL_TABLE", "ReadPlan", "SQLiteEngine"]

JOURNAL_TABLE = "corral_gateway_journal"
_JOURNAL_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {JOURNAL_TABLE} (
    agent_id TEXT NOT NULL,
    key TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('in_flight', 'completed')),
    result TEXT,
    created_at TEXT NOT NULL,
    completed_at TEXT,
    PRIMARY KEY (agent_id, key)
)
"""
_PROGRESS_STEPS = 1000  # SQLite virtual-machine instructions between timeout checks


@dataclass(frozen=True, slots=True)
class ReadPlan:
    """A read as the engine runs it: ``exists_sql`` only for a filtered read."""

    sql: str
    params: tuple[Any, ...]
    table: str
    exists_sql: str | None
    count_op: bool

    @classmethod
    def of(cls, compiled: CompiledOperation) -> ReadPlan:
        return cls(
            compiled.sql,
            compiled.params,
            compiled.table,
            compiled.exists_sql if compiled.filtered else None,
            compiled.op == "count",
        )


def _columns(cursor: sqlite3.Cursor) -> tuple[str, ...]:
    names = [str(d[0]) for d in cursor.description or ()]
    taken, seen, unique = set(names), set(), []
    for name in names:
        if name in seen:
            n = 2
            while f"{name}_{n}" in taken:
                n += 1
            name = f"{name}_{n}"
            taken.add(name)
        seen.add(name)
        unique.append(name)
    return tuple(unique)


class SQLiteEngine:
    """Blocking access to one SQLite target and its journal; see the module docstring."""

    def __init__(
        self,
        path: Path,
        journal_path: Path,
        *,
        statement_timeout_s: float,
        max_rows: int,
        monotonic: Callable[[], float],
    ) -> None:
        self.path = path
        self.journal_path = journal_path
        self._timeout_s = statement_timeout_s
        self._max_rows = max_rows
        self._monotonic = monotonic
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._target: sqlite3.Connection | None = None
        self._journal: sqlite3.Connection | None = None

    # --- lifecycle (worker thread) -----------------------------------------------------------

    def open(self) -> tuple[Catalog, int]:
        """Open the target and the journal; the catalog and the count of keys in flight."""
        if not self.path.is_file():
            raise GatewayError(
                "database_unavailable",
                f"the SQLite database {str(self.path)!r} does not exist",
                path=str(self.path),
            )
        try:
            self._target = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self._target.execute("PRAGMA busy_timeout=5000")
            self.journal_path.parent.mkdir(parents=True, exist_ok=True)
            journal = sqlite3.connect(
                self.journal_path, isolation_level=None, check_same_thread=False
            )
            self._journal = journal
            journal.execute("PRAGMA journal_mode=WAL")
            journal.execute("PRAGMA synchronous=FULL")
            journal.execute("PRAGMA busy_timeout=5000")
            journal.execute(_JOURNAL_SCHEMA)
            in_flight = journal.execute(
                f"SELECT count(*) FROM {JOURNAL_TABLE} WHERE state = 'in_flight'"
            ).fetchone()[0]
            return self.load_catalog(), int(in_flight)
        except sqlite3.Error as exc:
            self.close()
            raise _unavailable(self.path, exc) from None

    def load_catalog(self) -> Catalog:
        return load_sqlite_catalog(self._reader())

    def close(self) -> None:
        with self._readers_lock:
            readers, self._readers = self._readers, []
        for conn in [*readers, self._target, self._journal]:
            if conn is not None:
                conn.close()
        self._target = self._journal = None

    # --- reads ------------------------------------------------------------------------------

    def _reader(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            uri = f"file:{quote(str(self.path.resolve()))}?mode=ro"
            conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA query_only=ON")
            self._local.conn = conn
            with self._readers_lock:
                self._readers.append(conn)
        return conn

    def read(self, plan: ReadPlan) -> GatewayResult:
        """Run ``plan`` read-only; raises ``GatewayError`` (``read_only_violation``,
        ``statement_timeout``, ``database_error``, ``database_unavailable``)."""
        conn = self._reader()
        deadline = self._monotonic() + self._timeout_s
        conn.set_progress_handler(lambda: int(self._monotonic() > deadline), _PROGRESS_STEPS)
        try:
            rows, columns = self._fetch(conn, plan)
            if (rows and not _counted_none(plan, rows)) or plan.exists_sql is None:
                return _answer(
                    rows, columns, self._max_rows, empty=not rows or _counted_none(plan, rows)
                )
            # Empty with a filter: rows and verdict from one snapshot.
            conn.execute("BEGIN")
            try:
                rows, columns = self._fetch(conn, plan)
                holds = bool(conn.execute(plan.exists_sql).fetchone()[0])
            finally:
                conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise self._mapped(exc, reading=True) from None
        finally:
            conn.set_progress_handler(None, 0)
        if rows and not _counted_none(plan, rows):
            return _answer(rows, columns, self._max_rows, empty=False)
        if not holds:
            return _answer(rows, columns, self._max_rows, empty=True)
        what = "counted none" if plan.count_op else "returned no rows"
        warning = (
            f"suspiciously empty: the read {what}, but {plan.table} holds rows that its "
            "filter matched none of; a wrong value or column in the filter is more likely "
            "than a true absence"
        )
        return GatewayResult(
            rows=_dicts(columns, rows),
            columns=columns,
            row_count=len(rows),
            emptiness="suspiciously_empty",
            warnings=(warning,),
        )

    def _fetch(
        self, conn: sqlite3.Connection, plan: ReadPlan
    ) -> tuple[list[tuple[Any, ...]], tuple[str, ...]]:
        cursor = conn.execute(plan.sql, plan.params)
        try:
            rows = cursor.fetchmany(self._max_rows + 1)
            return rows, _columns(cursor)
        finally:
            cursor.close()

    # --- writes -----------------------------------------------------------------------------

    def lookup(self, agent_id: str, key: str) -> tuple[str, str, StoredResult | None] | None:
        """``(fingerprint, state, result)`` journalled for the key, or None."""
        with self._write_lock:
            row = (
                self._require_journal()
                .execute(
                    f"SELECT fingerprint, state, result FROM {JOURNAL_TABLE} "
                    "WHERE agent_id = ? AND key = ?",
                    (agent_id, key),
                )
                .fetchone()
            )
        if row is None:
            return None
        stored = decode_result(row[2]) if row[2] is not None else None
        return str(row[0]), str(row[1]), stored

    def write(
        self, plan: CompiledOperation, *, agent_id: str, key: str, fingerprint: str, now: str
    ) -> StoredResult:
        """Journal the key ``in_flight``, run the write, journal the result ``completed``.

        The caller checked the journal for the key first (under its own per-key lock).
        Raises ``GatewayError``; a write the engine refused leaves no journal row.
        """
        with self._write_lock:
            journal, target = self._require_journal(), self._require_target()
            try:
                journal.execute(
                    f"INSERT INTO {JOURNAL_TABLE} (agent_id, key, fingerprint, state, "
                    "created_at) VALUES (?, ?, ?, 'in_flight', ?)",
                    (agent_id, key, fingerprint, now),
                )
            except sqlite3.Error as exc:
                raise self._mapped(exc, reading=False) from None
            try:
                stored = self._apply(target, plan)
            except sqlite3.Error as exc:
                if target.in_transaction:
                    target.execute("ROLLBACK")
                journal.execute(
                    f"DELETE FROM {JOURNAL_TABLE} WHERE agent_id = ? AND key = ?",
                    (agent_id, key),
                )
                raise self._mapped(exc, reading=False) from None
            journal.execute(
                f"UPDATE {JOURNAL_TABLE} SET state = 'completed', result = ?, "
                "completed_at = ? WHERE agent_id = ? AND key = ?",
                (encode_result(stored), now, agent_id, key),
            )
            return stored

    def _apply(self, target: sqlite3.Connection, plan: CompiledOperation) -> StoredResult:
        deadline = self._monotonic() + self._timeout_s
        target.set_progress_handler(lambda: int(self._monotonic() > deadline), _PROGRESS_STEPS)
        try:
            target.execute("BEGIN IMMEDIATE")
            cursor = target.execute(plan.sql, plan.params)
            rows = cursor.fetchall() if cursor.description else []
            columns = _columns(cursor) if cursor.description else ()
            count = len(rows) if cursor.description else max(cursor.rowcount, 0)
            target.execute("COMMIT")
        finally:
            target.set_progress_handler(None, 0)
        kept = _dicts(columns, rows[: self._max_rows])
        return StoredResult(columns, kept, count, len(rows) > self._max_rows)

    # --- helpers ----------------------------------------------------------------------------

    def _require_journal(self) -> sqlite3.Connection:
        if self._journal is None:
            raise GatewayError("database_unavailable", "the gateway is closed or not open")
        return self._journal

    def _require_target(self) -> sqlite3.Connection:
        if self._target is None:
            raise GatewayError("database_unavailable", "the gateway is closed or not open")
        return self._target

    def _mapped(self, exc: sqlite3.Error, *, reading: bool) -> GatewayError:
        text = str(exc)
        if "interrupted" in text:
            return GatewayError(
                "statement_timeout",
                "the statement ran longer than the statement timeout of "
                f"{self._timeout_s} s and was interrupted",
                timeout_s=self._timeout_s,
            )
        if reading and ("readonly" in text or "query_only" in text or "read-only" in text):
            return GatewayError(
                "read_only_violation",
                "the statement tried to write inside a read, which runs on a read-only "
                "connection; nothing was changed",
                database_message=text,
            )
        if isinstance(exc, sqlite3.OperationalError) and (
            "unable to open" in text or "locked" in text or "disk i/o" in text
        ):
            return _unavailable(self.path, exc)
        return GatewayError(
            "database_error",
            f"the database refused the statement: {text}",
            database_message=text,
        )


def _unavailable(path: Path, exc: BaseException) -> GatewayError:
    return GatewayError(
        "database_unavailable",
        f"the SQLite database {str(path)!r} is unavailable: {exc}",
        path=str(path),
    )


def _counted_none(plan: ReadPlan, rows: list[tuple[Any, ...]]) -> bool:
    return plan.count_op and len(rows) == 1 and rows[0][0] == 0


def _dicts(columns: tuple[str, ...], rows: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    return [dict(zip(columns, row, strict=True)) for row in rows]


def _answer(
    rows: list[tuple[Any, ...]], columns: tuple[str, ...], max_rows: int, *, empty: bool
) -> GatewayResult:
    kept = rows[:max_rows]
    return GatewayResult(
        rows=_dicts(columns, kept),
        columns=columns,
        row_count=len(kept),
        truncated=len(rows) > max_rows,
        emptiness="genuinely_empty" if empty else None,
    )
