"""The blocking side of the SQLite engine: connections to one file, reads, journalled writes and
crash recovery. Everything here runs on the engine's worker threads, never on the event loop."""

# Over 500 lines: the connections, the reads, the writes and the mapping of SQLite's errors
# share the file's connections and locks; what bounds a request is in _bounded.

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

from corral.gateway._bounds import bytes_warning, too_large
from corral.gateway._catalog import Catalog
from corral.gateway._catalog_load import load_sqlite_catalog
from corral.gateway._errors import GatewayError, database_refusal
from corral.gateway._journal import StoredResult, encode_result
from corral.gateway._result import GatewayResult, unique_names
from corral.gateway._rows import empty_warning, holds
from corral.gateway.sqlite._analysis import (
    SqliteAnalysis,
    SqliteSqlAnalyzer,
    compile_error,
    located,
)
from corral.gateway.sqlite._bounded import Fetched, Watch, answer, read_rows
from corral.gateway.sqlite._journal import JOURNAL_TABLE, RECORD_SQL, ensure_journal, lookup
from corral.gateway.sqlite._plan import Journalled, ReadPlan, WritePlan
from corral.gateway.sqlite._wall import Wall, prewarm

__all__ = ["JOURNAL_TABLE", "SQLiteFile"]

_HIDDEN = frozenset({JOURNAL_TABLE})
_PROGRESS_STEPS = 1000  # SQLite virtual-machine instructions between timeout checks
_BUSY_TIMEOUT_MS = 5000


def _columns(cursor: sqlite3.Cursor) -> tuple[str, ...]:
    return unique_names([str(d[0]) for d in cursor.description or ()])


def _hide(catalog: Catalog) -> Catalog:
    tables = {key: table for key, table in catalog.tables.items() if key not in _HIDDEN}
    return Catalog(tables=tables, version=catalog.version, dialect=catalog.dialect)


class SQLiteFile:
    """Blocking access to one SQLite target (docs/architecture.md, seed 003, tells how)."""

    def __init__(
        self,
        path: Path,
        *,
        statement_timeout_s: float,
        max_rows: int,
        max_bytes: int,
        monotonic: Callable[[], float],
    ) -> None:
        self.path = path
        self._timeout_s = statement_timeout_s
        self._max_rows = max_rows
        self._max_bytes = max_bytes
        self._monotonic = monotonic
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._target: sqlite3.Connection | None = None
        self._target_wall = Wall()
        self._analysis: sqlite3.Connection | None = None
        self._analysis_wall = Wall()
        self._analysis_lock = threading.Lock()
        self._journal_ready = False
        self._schema_version: int | None = None
        self._visible: frozenset[str] = frozenset()
        self._hidden: frozenset[str] = _HIDDEN
        self.catalog: Catalog | None = None
        self.analyzer = SqliteSqlAnalyzer()

    # --- lifecycle (worker thread) -----------------------------------------------------------

    def open(self) -> int:
        """Open the target; the count of keys journalled in flight. Creates the journal table
        when the target is writable. Raises ``GatewayError("database_unavailable")``."""
        if not self.path.is_file():
            raise GatewayError(
                "database_unavailable",
                f"the SQLite database {str(self.path)!r} does not exist",
                path=str(self.path),
            )
        try:
            target = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self._target = target
            target.execute(f"PRAGMA busy_timeout={_BUSY_TIMEOUT_MS}")
            # An "ok" answer is a promise that the write and its key are on disk: FULL is
            # SQLite's usual default, but a build may lower it (this connection only).
            target.execute("PRAGMA synchronous=FULL")
            # First touch on the read-write connection: it rolls back a hot journal a crash
            # left, which the read-only connections opened next could not.
            target.execute("SELECT count(*) FROM sqlite_master").fetchone()
            prewarm(target)
            self._hidden = _HIDDEN | _modules(target)
            self._target_wall.hidden = self._analysis_wall.hidden = self._hidden
            target.set_authorizer(self._target_wall)
            self._create_journal(target)
            analysis = self._connect_read_only(cached_statements=0)
            self._analysis = analysis
            analysis.set_authorizer(self._analysis_wall)
            return self._in_flight(target)
        except sqlite3.Error as exc:
            self.close()
            raise _unavailable(self.path, exc) from None

    def _create_journal(self, target: sqlite3.Connection) -> None:
        try:
            ensure_journal(target)
            self._journal_ready = True
        except sqlite3.OperationalError as exc:
            if "readonly" not in str(exc):
                raise
            # A target that cannot be written: reads work; a write fails as it runs.
        except GatewayError:
            self.close()
            raise

    def _in_flight(self, target: sqlite3.Connection) -> int:
        if not self._journal_ready:
            return 0
        row = target.execute(
            f"SELECT count(*) FROM {JOURNAL_TABLE} WHERE state = 'in_flight'"
        ).fetchone()
        return int(row[0])

    def first_catalog(self) -> Catalog:
        """:meth:`load_catalog` at open; raises ``GatewayError("database_unavailable")``."""
        try:
            return self.load_catalog()
        except sqlite3.Error as exc:
            raise _unavailable(self.path, exc) from None

    def load_catalog(self) -> Catalog:
        """Read the catalog (the journal hidden) and make it the one agents' SQL is checked
        against."""
        conn = self._reader()
        catalog = _hide(load_sqlite_catalog(conn))
        self._schema_version = int(conn.execute("PRAGMA schema_version").fetchone()[0])
        self.catalog = catalog
        self._visible = frozenset(catalog.tables)
        return catalog

    def refresh_catalog(self) -> Catalog | None:
        """A new catalog when the schema changed since the last load, else None."""
        version = int(self._reader().execute("PRAGMA schema_version").fetchone()[0])
        if version == self._schema_version:
            return None
        return self.load_catalog()

    def close(self) -> None:
        with self._readers_lock:
            readers, self._readers = self._readers, []
        for conn in [*readers, self._target, self._analysis]:
            if conn is not None:
                conn.close()
        self._target = self._analysis = None

    # --- analysis ---------------------------------------------------------------------------

    def analyze(self, sql: str, catalog: Catalog) -> SqliteAnalysis:
        """Analyse an agent's SQL (cached); see :func:`~._analysis.analyze_sqlite`."""
        with self._analysis_lock:
            conn = self._analysis
            if conn is None:
                raise GatewayError("database_unavailable", "the gateway is closed or not open")
            return self.analyzer.analyze(sql, catalog, conn, self._analysis_wall)

    # --- reads ------------------------------------------------------------------------------

    def _connect_read_only(self, *, cached_statements: int = 128) -> sqlite3.Connection:
        uri = f"file:{quote(str(self.path.resolve()))}?mode=ro"
        conn = sqlite3.connect(
            uri,
            uri=True,
            isolation_level=None,
            check_same_thread=False,
            cached_statements=cached_statements,
        )
        conn.execute("PRAGMA query_only=ON")
        conn.execute(f"PRAGMA busy_timeout={_BUSY_TIMEOUT_MS}")
        prewarm(conn)
        return conn

    def _reader(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect_read_only()
            # No string or blob over the byte cap is made or read by a read: one value can
            # neither fill memory nor take long to build (hex() of a large blob, ...).
            conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, self._max_bytes)
            wall = Wall()
            wall.hidden = self._hidden
            conn.set_authorizer(wall)
            self._local.conn, self._local.wall = conn, wall
            with self._readers_lock:
                self._readers.append(conn)
        return conn

    def read(self, plan: ReadPlan, watch: Watch | None = None) -> GatewayResult:
        """Run ``plan`` read-only, interruptible through ``watch``; raises ``GatewayError``
        (``read_only_violation``, ``statement_timeout``, ``result_too_large``,
        ``invalid_data``, ``database_error``, ``database_unavailable``, and for an agent's SQL
        the refusals of its wall)."""
        for attempt in range(2):
            try:
                if watch is None:
                    return self._read(plan)
                with watch.running(self._reader()):
                    return self._read(plan)
            except sqlite3.Error as exc:
                name = getattr(exc, "sqlite_errorname", "")
                if attempt or name != "SQLITE_READONLY_ROLLBACK":
                    raise self._mapped(exc, reading=True, wall=None) from None
            self._recover()
        raise AssertionError("unreachable")  # pragma: no cover

    def _read(self, plan: ReadPlan) -> GatewayResult:
        conn = self._reader()
        wall: Wall = self._local.wall
        deadline = self._monotonic() + self._timeout_s
        conn.set_progress_handler(lambda: int(self._monotonic() > deadline), _PROGRESS_STEPS)
        try:
            fetched = self._fetch(conn, plan, wall)
            rows = fetched.rows
            if (rows and not _counted_none(plan, rows)) or not plan.filtered:
                return answer(
                    fetched,
                    self._max_rows,
                    self._max_bytes,
                    empty=not rows or _counted_none(plan, rows),
                )
            flags: tuple[Any, ...] = ()
            if plan.exists_sql is not None:
                # Empty with a filter: rows and verdict from one snapshot.
                conn.execute("BEGIN")
                try:
                    fetched = self._fetch(conn, plan, wall)
                    rows = fetched.rows
                    flags = tuple(conn.execute(plan.exists_sql).fetchone() or ())
                finally:
                    conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if getattr(exc, "sqlite_errorname", "") == "SQLITE_READONLY_ROLLBACK":
                raise
            raise self._mapped(exc, reading=True, wall=wall, plan=plan) from None
        finally:
            conn.set_progress_handler(None, 0)
        if rows and not _counted_none(plan, rows):
            return answer(fetched, self._max_rows, self._max_bytes, empty=False)
        has = {name: bool(flag) for name, flag in zip(plan.tables, flags, strict=False)}
        suspicious, holding = holds(plan.rows, has)
        if not suspicious:
            return answer(fetched, self._max_rows, self._max_bytes, empty=True)
        warning = empty_warning(holding, counted=plan.count_op)
        return GatewayResult(
            rows=_dicts(fetched.columns, rows),
            columns=fetched.columns,
            row_count=len(rows),
            emptiness="suspiciously_empty",
            warnings=(warning,),
        )

    def _fetch(self, conn: sqlite3.Connection, plan: ReadPlan, wall: Wall) -> Fetched:
        with _armed(wall, self._visible, plan):
            cursor = conn.execute(plan.sql, plan.params)
            try:
                return read_rows(
                    cursor,
                    _columns(cursor),
                    max_rows=self._max_rows,
                    max_bytes=self._max_bytes,
                    stop=True,
                )
            finally:
                cursor.close()

    def _recover(self) -> None:
        # A hot journal of a crashed writer: the read-write connection rolls it back.
        with self._write_lock:
            try:
                self._require_target().execute("SELECT count(*) FROM sqlite_master").fetchone()
            except sqlite3.Error as exc:
                raise _unavailable(self.path, exc) from None

    # --- writes -----------------------------------------------------------------------------

    def lookup(self, agent_id: str, key: str, plan_hash: str = "") -> Journalled | None:
        """What the journal holds for the key (``plan_hash`` as stored:
        :func:`~corral.gateway._journal.stored_plan`), or None."""
        with self._write_lock:
            if not self._journal_ready:
                return None
            try:
                return lookup(self._require_target(), agent_id, key, plan_hash)
            except sqlite3.Error as exc:
                raise self._mapped(exc, reading=False, wall=None) from None

    def write(
        self,
        plan: WritePlan,
        *,
        agent_id: str,
        key: str,
        plan_hash: str,
        fingerprint: str,
        now: str,
        watch: Watch | None = None,
    ) -> StoredResult | Journalled:
        """Run the write ``plan`` journalled under ``(agent_id, key, plan_hash)`` (the plan
        hash as stored: :func:`~corral.gateway._journal.stored_plan`), in one transaction.

        Returns what the journal already holds for the key (nothing ran), or the new result
        (committed with its journal row). Raises ``GatewayError`` (``constraint_violation``,
        ``invalid_data``, ``database_error``, ...); a write the engine refused leaves neither
        the write nor its key. ``watch`` can interrupt the agent's statement. The rows it
        returns are capped at ``max_rows`` and ``max_bytes`` (the rest read and dropped), in
        the answer and the journal alike.
        """
        with self._write_lock:
            target = self._require_target()
            wall = self._target_wall
            try:
                with self._transaction(target):
                    if not self._journal_ready:
                        ensure_journal(target)
                    found = lookup(target, agent_id, key, plan_hash)
                    if found is not None:
                        return found
                    stored = self._apply(target, plan, wall, watch)
                    target.execute(
                        RECORD_SQL,
                        (agent_id, key, plan_hash, fingerprint, encode_result(stored), now, now),
                    )
                self._journal_ready = True
                return stored
            except sqlite3.Error as exc:
                raise self._mapped(exc, reading=False, wall=wall, plan=plan) from None

    @contextlib.contextmanager
    def _transaction(self, target: sqlite3.Connection) -> Iterator[None]:
        target.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            if target.in_transaction:
                target.execute("ROLLBACK")
            raise
        target.execute("COMMIT")

    def _apply(
        self, target: sqlite3.Connection, plan: WritePlan, wall: Wall, watch: Watch | None
    ) -> StoredResult:
        deadline = self._monotonic() + self._timeout_s
        target.set_progress_handler(lambda: int(self._monotonic() > deadline), _PROGRESS_STEPS)
        try:
            with (
                watch.running(target) if watch is not None else contextlib.nullcontext(),
                _armed(wall, self._visible, plan),
            ):
                cursor = target.execute(plan.sql, plan.params)
                # A write is never refused for its size (it ran): its rows are cut, even to none.
                fetched = read_rows(
                    cursor,
                    _columns(cursor) if cursor.description else (),
                    max_rows=self._max_rows,
                    max_bytes=self._max_bytes,
                    stop=False,
                )
                count = fetched.count if cursor.description else max(cursor.rowcount, 0)
                cursor.close()
        finally:
            target.set_progress_handler(None, 0)
        kept = _dicts(fetched.columns, fetched.rows[: self._max_rows])
        warnings: tuple[str, ...] = ()
        if fetched.cut == "bytes":
            warnings = (bytes_warning(self._max_bytes, len(kept), fetched.bytes),)
        return StoredResult(fetched.columns, kept, count, fetched.cut is not None, warnings)

    # --- helpers ----------------------------------------------------------------------------

    def _require_target(self) -> sqlite3.Connection:
        if self._target is None:
            raise GatewayError("database_unavailable", "the gateway is closed or not open")
        return self._target

    def _mapped(
        self,
        exc: sqlite3.Error,
        *,
        reading: bool,
        wall: Wall | None,
        plan: ReadPlan | WritePlan | None = None,
    ) -> GatewayError:
        text = str(exc)
        name = getattr(exc, "sqlite_errorname", "")
        if plan is not None and plan.agent_sql and wall is not None and wall.refusal is not None:
            return located(wall.refusal, plan.sql)
        if name == "SQLITE_TOOBIG" and reading:
            return too_large(self._max_bytes, None)
        if "interrupted" in text:
            return GatewayError(
                "statement_timeout",
                "the statement ran longer than the statement timeout of "
                f"{self._timeout_s} s and was interrupted",
                timeout_s=self._timeout_s,
            )
        if reading and (name == "SQLITE_READONLY" or "query_only" in text):
            return GatewayError(
                "read_only_violation",
                "the statement tried to write inside a read, which runs on a read-only "
                "connection; nothing was changed",
                database_message=text,
            )
        if isinstance(exc, sqlite3.OperationalError) and (
            "unable to open" in text
            or "locked" in text
            or "disk i/o" in text
            or name.startswith("SQLITE_READONLY_")
        ):
            return _unavailable(self.path, exc)
        if (
            plan is not None
            and plan.agent_sql
            and self.catalog is not None
            and text.startswith(("no such table", "no such column"))
        ):
            # The schema changed under a cached analysis.
            return compile_error(exc, plan.sql, self.catalog)
        constraint = text.partition("constraint failed: ")[2] or None
        return database_refusal(
            _refusal_code(exc, name, text),
            text,
            database_message=text,
            sqlite_error=name or None,
            constraint=constraint,
        )


@contextlib.contextmanager
def _armed(wall: Wall, visible: frozenset[str], plan: ReadPlan | WritePlan) -> Iterator[None]:
    if not plan.agent_sql:
        yield
        return
    wall.arm(visible, plan.ctes)
    try:
        yield
    finally:
        wall.disarm()


def _modules(conn: sqlite3.Connection) -> frozenset[str]:
    # Virtual-table modules, some usable as tables by name (dbstat, sqlite_stmt, ...).
    try:
        rows = conn.execute("SELECT name FROM pragma_module_list").fetchall()
    except sqlite3.Error:  # pragma: no cover - a SQLite built without the pragma
        return frozenset()
    return frozenset(str(row[0]).lower() for row in rows)


# SQLite's own words for a value it cannot work with, raised as plain SQLITE_ERROR.
_DATA_MESSAGES = (
    "malformed JSON",
    "bad JSON path",
    "JSON path error",
    "JSON cannot hold BLOB",
    "integer overflow",
)


def _refusal_code(exc: sqlite3.Error, name: str, text: str) -> str:
    """The code of a statement SQLite refused (see :func:`~._errors.sqlstate_code` for the
    PostgreSQL side): a value of the wrong type or size ``invalid_data``, a failed
    constraint ``constraint_violation``, anything else ``database_error``."""
    if name == "SQLITE_CONSTRAINT_DATATYPE" or text.startswith("cannot store "):
        return "invalid_data"  # a STRICT table's column refused the value's type
    if name.startswith("SQLITE_CONSTRAINT") or (
        isinstance(exc, sqlite3.IntegrityError) and "constraint failed" in text
    ):
        return "constraint_violation"
    if (
        name in ("SQLITE_MISMATCH", "SQLITE_TOOBIG")
        or isinstance(exc, sqlite3.DataError)
        or text.startswith(_DATA_MESSAGES)
    ):
        return "invalid_data"
    return "database_error"


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
