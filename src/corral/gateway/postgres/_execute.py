"""Running one analysed request on a leased PostgreSQL connection.

Every request is sent as one pipeline of statements, prepared on its connection, in one
network round trip (two for a write whose rows must come back before the journal can store
them, see below): :mod:`~._wire` sends them and loads their rows; this module decides what to
send and what the results mean. A statement's error (found while it was prepared or while it
ran) is raised as psycopg's error for its SQLSTATE, which :func:`map_error` turns into the
``GatewayError`` the agent is given.

Reads. Connections are opened with ``default_transaction_read_only=on``, so a read runs as
one statement in a READ ONLY transaction the engine enforces; the connection's reported
setting is checked before each read, and a connection whose session default was changed runs
the read in an explicit ``BEGIN ... READ ONLY`` and is then closed. Rows come in chunks of
``max_rows + 1``: the gateway never holds more than that many rows of a read, and a longer
result is cancelled on the server and returned truncated. A read that returns no rows is run
once more in a single ``REPEATABLE READ READ ONLY`` transaction (one network round trip,
pipelined: ``DECLARE`` a cursor, ``FETCH`` ``max_rows + 1``) together with an exact ``SELECT
EXISTS (SELECT 1 FROM t)`` on every table it read, so the rows, the columns and the emptiness
verdict all come from one snapshot.

Writes. One round trip: ``BEGIN READ WRITE``; the key's advisory lock, tried
(:meth:`~._journal.JournalName.lock_key`); a check that the key is not journalled; the write
with its journal row; ``COMMIT``. The lock and the check fail (a division by zero, on purpose)
when the key is held or journalled, so that the server discards the rest of the pipeline
unexecuted: a held key is then waited for once, in the database, for at most ``key_wait_s``
(``idempotency_in_progress`` after that), and a journalled one raises :class:`KeyTaken` (the
caller reads the journal). The journal row is inserted by the write's own statement, with the
number of rows the write wrote: a write without ``RETURNING`` (a plain INSERT, UPDATE or
DELETE, with no ``WITH`` of its own) runs as::

    WITH _corral_write AS (<the write> RETURNING 1),
         _corral_journal AS (INSERT INTO <journal> ... SELECT ..., count(*) FROM _corral_write)
    SELECT count(*) FROM _corral_write

A write with ``RETURNING`` (or with its own ``WITH``, or one PostgreSQL refuses to run inside
a ``WITH``, such as a write to a table with rules) needs its rows in hand before they can be
stored: its first round trip stops after the write, a second inserts the journal row with the
rows and commits. Either way the journal row commits or rolls back with the write. A
transaction that wrote the key's row without holding its lock (an older gateway) and committed
first makes the journal's primary key refuse the row: the write is rolled back and
:class:`KeyTaken` raised.
"""

from __future__ import annotations

import functools
import importlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import psycopg
from psycopg import AsyncRawCursor, adapt
from psycopg.abc import Transformer
from psycopg.pq.abc import PGresult

from corral.gateway._errors import GatewayError, database_refusal, sqlstate_code
from corral.gateway._journal import StoredResult, encode_result
from corral.gateway._result import GatewayResult, unique_names
from corral.gateway.postgres import _wire as wire
from corral.gateway.postgres._journal import JournalName
from corral.gateway.postgres._pools import Lease

__all__ = ["KeyTaken", "Plan", "map_error", "run_read", "run_write"]

_CURSOR = "_corral_read"
_UNAVAILABLE_STATES = frozenset({"57P01", "57P02", "57P03", "53300"})
# The wrapped form of a write failing with these runs unwrapped instead: PostgreSQL refuses
# some writes inside WITH (DO INSTEAD rules: 0A000), and a statement the wrapping misread
# would not parse (42601).
_UNWRAPPABLE_STATES = frozenset({"0A000", "42601"})

_BEGIN_WRITE = b"BEGIN ISOLATION LEVEL READ COMMITTED READ WRITE"
_LOCK_DEFAULT = b"SET LOCAL lock_timeout TO DEFAULT"
_COMMIT = b"COMMIT"

# postgast's generated stubs do not type-check, so its modules are loaded untyped (as in _sql).
_pg_query: Any = importlib.import_module("postgast.native").lib
_pg_query_errors: Any = importlib.import_module("postgast.errors")


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """An analysed request, ready to run.

    ``raw``: ``sql`` uses PostgreSQL's ``$n`` placeholders (sent as they are, bound by the
    server); otherwise psycopg's ``%s`` (``%%`` for a ``%``). ``exists`` lists ``(label,
    qualified name)`` of every table the read reads. ``count_op``: a structured ``count``,
    whose zero counts as an empty answer.
    """

    kind: Literal["read", "write"]
    sql: str
    params: tuple[Any, ...]
    raw: bool
    filtered: bool
    exists: tuple[tuple[str, str], ...] = ()
    explain: bool = False
    count_op: bool = False


class KeyTaken(Exception):
    """The idempotency key is already journalled (committed by another transaction); the
    write did not run, or was rolled back."""


# --- reads ------------------------------------------------------------------------------------


def _cursor(conn: psycopg.AsyncConnection[Any], raw: bool) -> psycopg.AsyncCursor[Any]:
    return AsyncRawCursor(conn) if raw else conn.cursor()


def _params(plan: Plan) -> Sequence[Any] | None:
    # psycopg reads %% as % only when parameters are passed: compiled operations always pass.
    return plan.params if (plan.params or not plan.raw) else None


def _columns(description: Sequence[Any] | None) -> tuple[str, ...]:
    if not description:
        return ()
    return unique_names([str(column.name) for column in description])


def _dicts(columns: tuple[str, ...], rows: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
    return [dict(zip(columns, row, strict=True)) for row in rows]


def _counted_none(plan: Plan, rows: Sequence[Sequence[Any]]) -> bool:
    return plan.count_op and len(rows) == 1 and rows[0][0] == 0


async def run_read(lease: Lease, plan: Plan, *, max_rows: int) -> GatewayResult:
    """Run the read ``plan``; see the module docstring. psycopg errors propagate."""
    conn = lease.conn
    if conn.pgconn.parameter_status(b"default_transaction_read_only") != b"on":
        # The session default was changed (or is not reported): never trust this session.
        lease.discard = True
        return await _read_in_snapshot(lease, plan, max_rows=max_rows)
    tx = adapt.Transformer(conn)
    encoding = wire.statements_of(conn).encoding
    command = wire.command(tx, wire.encoded(plan.sql, plan.raw, encoding), _params(plan))
    groups, truncated = await wire.run_pipeline(lease, [command], limit=max_rows)
    error = wire.error_in(groups[0], lease)
    if error is not None and wire.stale_plan(error, lease):
        groups, truncated = await wire.run_pipeline(lease, [command], limit=max_rows)
        error = wire.error_in(groups[0], lease)
    if error is not None:
        raise error
    results = groups[0]
    described = wire.described(results)
    if described is None or wire.row_count(results) == 0:
        # The verdict on an empty answer needs one snapshot for the rows and the EXISTS.
        return await _read_in_snapshot(lease, plan, max_rows=max_rows)
    columns = wire.column_names(described, encoding)
    rows = wire.load_rows(tx, results, columns, max_rows)
    if plan.count_op and len(rows) == 1 and next(iter(rows[0].values())) == 0:
        return await _read_in_snapshot(lease, plan, max_rows=max_rows)
    return GatewayResult(rows=rows, columns=columns, row_count=len(rows), truncated=truncated)


async def _read_in_snapshot(lease: Lease, plan: Plan, *, max_rows: int) -> GatewayResult:
    conn = lease.conn
    checks = plan.exists if plan.filtered else ()
    begin, declare, main = conn.cursor(), _cursor(conn, plan.raw), conn.cursor()
    exists, commit = conn.cursor(), conn.cursor()
    try:
        async with conn.pipeline():
            await begin.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            if plan.explain:
                main = declare
                await main.execute(plan.sql, _params(plan))
            else:
                prefix = f"DECLARE {_CURSOR} NO SCROLL CURSOR FOR "
                await declare.execute(prefix + plan.sql, _params(plan))
                await main.execute(f"FETCH FORWARD {max_rows + 1} FROM {_CURSOR}")
            if checks:
                listed = ", ".join(f"EXISTS (SELECT 1 FROM {name})" for _, name in checks)
                await exists.execute(f"SELECT {listed}")
            await commit.execute("COMMIT")
    except BaseException:
        await wire.rollback(lease)
        raise
    try:
        rows = await main.fetchall()
    except psycopg.DataError:
        # A date or time Python cannot hold: the rows are loaded again, such values as text.
        if main.pgresult is None:
            raise
        rows = wire.load_all(conn, main.pgresult)
    columns = _columns(main.description)
    truncated = len(rows) > max_rows
    rows = rows[:max_rows]
    result = _dicts(columns, rows)
    if rows and not _counted_none(plan, rows):
        return GatewayResult(rows=result, columns=columns, row_count=len(rows), truncated=truncated)
    holding: list[str] = []
    if checks:
        flags = await exists.fetchone()
        holding = [label for (label, _), has in zip(checks, flags or (), strict=True) if has]
    if not holding:
        return GatewayResult(
            rows=result, columns=columns, row_count=len(rows), emptiness="genuinely_empty"
        )
    named = ", ".join(holding)
    what = "counted none" if plan.count_op else "returned no rows"
    warning = (
        f"suspiciously empty: the read {what}, but {named} "
        f"{'holds' if len(holding) == 1 else 'hold'} rows that its filter matched none of; "
        "a wrong value or column in the filter is more likely than a true absence"
    )
    return GatewayResult(
        rows=result,
        columns=columns,
        row_count=len(rows),
        emptiness="suspiciously_empty",
        warnings=(warning,),
    )


# --- writes -----------------------------------------------------------------------------------

_BEGIN_COMMAND = wire.constant(_BEGIN_WRITE)
_COMMIT_COMMAND = wire.constant(_COMMIT)


@dataclass(frozen=True, slots=True)
class _JournalSql:
    """The journal's statements as sent on connections of one encoding."""

    try_lock: bytes
    lock: bytes
    check: bytes
    record: bytes

    @property
    def try_key(self) -> wire.Key:
        return (self.try_lock, _INT8)

    @property
    def lock_key(self) -> wire.Key:
        return (self.lock, _INT8)

    @property
    def check_key(self) -> wire.Key:
        return (self.check, _TWO_TEXTS)


_INT8 = (20,)
_TWO_TEXTS = (25, 25)


@functools.lru_cache(maxsize=64)
def _journal_sql(journal: JournalName, encoding: str) -> _JournalSql:
    return _JournalSql(
        try_lock=wire.encoded(journal.try_lock_sql, False, encoding),
        lock=wire.encoded(journal.lock_sql, False, encoding),
        check=wire.encoded(journal.check_sql, False, encoding),
        record=wire.encoded(journal.record_sql, False, encoding),
    )


@functools.lru_cache(maxsize=64)
def _lock_timeout(key_wait_ms: int) -> wire.Command:
    return wire.constant(b"SET LOCAL lock_timeout = %d" % int(key_wait_ms))


@functools.lru_cache(maxsize=1024)
def _countable(sql: bytes) -> bytes | None:
    """The statement of ``sql`` (bytes, ``$n`` placeholders) when it can run as
    ``WITH w AS (<it> RETURNING 1)``: a single INSERT, UPDATE or DELETE with neither
    ``RETURNING`` nor a ``WITH`` of its own. None otherwise (or when it does not parse)."""
    try:
        parsed = _pg_query.pg_query_parse(sql)
        try:
            _pg_query_errors.check_error(parsed)
            tree = json.loads(parsed.parse_tree)
        finally:
            _pg_query.pg_query_free_parse_result(parsed)
    except Exception:  # anything but a clean parse keeps the general path
        return None
    statements = tree.get("stmts") or []
    if len(statements) != 1:
        return None
    node = statements[0].get("stmt") or {}
    if len(node) != 1:
        return None
    ((kind, stmt),) = node.items()
    if kind not in ("InsertStmt", "UpdateStmt", "DeleteStmt") or not isinstance(stmt, dict):
        return None
    if any(k in stmt for k in ("withClause", "returningList", "returningClause")):
        return None
    # Locations and lengths are in bytes; a length of 0 runs to the end of the text. A
    # trailing comment ends at the newline the wrapping puts after the statement.
    start = int(statements[0].get("stmt_location") or 0)
    length = int(statements[0].get("stmt_len") or 0)
    body = sql[start : start + length] if length else sql[start:]
    return body.strip() or None


@functools.lru_cache(maxsize=1024)
def _counting(body: bytes, journal: JournalName, first: int) -> bytes:
    """The write ``body`` recording its journal row in the same statement, with the number of
    rows it wrote; parameters ``$first`` .. ``$first+3``: agent_id, key, fingerprint, now."""
    return (
        b"WITH _corral_write AS (\n" + body + b"\nRETURNING 1\n), "
        b"_corral_journal AS (INSERT INTO " + journal.qualified.encode("utf-8") + b" "
        b"(agent_id, key, fingerprint, state, result, created_at, completed_at) "
        b"SELECT $%d, $%d, $%d, 'completed', jsonb_build_object("
        b"'columns', '[]'::jsonb, 'rows', '[]'::jsonb, 'row_count', count(*), "
        b"'truncated', false), $%d, $%d FROM _corral_write) "
        b"SELECT count(*) FROM _corral_write" % (first, first + 1, first + 2, first + 3, first + 3)
    )


async def run_write(
    lease: Lease,
    plan: Plan,
    *,
    journal: JournalName,
    agent_id: str,
    key: str,
    fingerprint: str,
    now: datetime,
    key_wait_ms: int,
    max_rows: int,
) -> tuple[GatewayResult, StoredResult]:
    """Run the write ``plan`` with its journal row, in one transaction, and commit.

    Raises :class:`KeyTaken` when ``(agent_id, key)`` is already journalled (the write was
    not run, or was rolled back), ``GatewayError("idempotency_in_progress")`` when another
    transaction holds the key for longer than ``key_wait_ms``,
    ``GatewayError("database_unavailable")`` (retry with the same key) when the connection was
    lost once the COMMIT was sent; psycopg errors of the write propagate (rolled back).
    """
    conn = lease.conn
    tx = adapt.Transformer(conn)
    encoding = wire.statements_of(conn).encoding
    sql = wire.encoded(plan.sql, plan.raw, encoding)
    params = tuple(_params(plan) or ())
    # The journal's own parameters are dumped here, as text of known types.
    stamp, stamp_type = _timestamp(now)
    write = _Write(
        lease=lease,
        tx=tx,
        journal=journal,
        statements=_journal_sql(journal, encoding),
        key=key,
        key_wait_ms=key_wait_ms,
        max_rows=max_rows,
        row=(
            agent_id.encode(encoding),
            key.encode(encoding),
            fingerprint.encode(encoding),
            stamp.encode(encoding),
        ),
        row_types=(wire.TEXT_OID, wire.TEXT_OID, wire.TEXT_OID, stamp_type),
        lock=(b"%d" % journal.lock_key(agent_id, key),),
    )
    body = None if sql in _UNWRAPPED else _countable(sql)
    counting = None
    if body is not None:
        counting = wire.with_text(
            wire.command(tx, _counting(body, journal, len(params) + 1), params),
            write.row,
            write.row_types,
        )
    return await write.run(sql, params, counting)


def _timestamp(now: datetime) -> tuple[str, int]:
    """``now`` as PostgreSQL reads it, and its type: timestamptz when it knows its zone."""
    return now.isoformat(), (1184 if now.tzinfo is not None else 1114)


# Texts that PostgreSQL refused to run wrapped (a table with rules): run unwrapped at once.
_UNWRAPPED: set[bytes] = set()


@dataclass(slots=True, kw_only=True)
class _Write:
    """One keyed write: the statements around it and what their failures mean."""

    lease: Lease
    tx: Transformer
    journal: JournalName
    statements: _JournalSql
    key: str
    key_wait_ms: int
    max_rows: int
    row: tuple[bytes, ...]  # agent_id, key, fingerprint, now: dumped
    row_types: tuple[int, ...]
    lock: tuple[bytes]  # the key's advisory lock, dumped

    async def run(
        self, sql: bytes, params: Sequence[Any], counting: wire.Command | None
    ) -> tuple[GatewayResult, StoredResult]:
        """The write ``sql`` with ``params``, wrapped as ``counting`` when it can be."""
        waiting = False  # the key was held: wait for it (up to key_wait_ms) this time
        stale = False  # a prepared statement went stale: sent once more
        while True:
            head, lock_at = self._head(waiting)
            at = len(head)  # where the write is
            if counting is not None:
                groups = await _committing(self.lease, [*head, counting, _COMMIT_COMMAND], self.key)
            else:
                groups, _ = await wire.run_pipeline(
                    self.lease, [*head, wire.command(self.tx, sql, params)]
                )
            failed = wire.first_error(groups, self.lease)
            if failed is None:
                if counting is not None:
                    count = int(groups[at][-1].get_value(0, 0) or 0)
                    stored = StoredResult((), [], count, False)
                    return GatewayResult(rows=[], columns=(), row_count=count), stored
                return await self._record(groups[at])
            await wire.rollback(self.lease)
            index, error = failed
            state = error.sqlstate
            if index == lock_at and state == "22012" and not waiting:
                waiting = True
                continue
            if index == lock_at and state == "55P03":
                raise GatewayError(
                    "idempotency_in_progress",
                    f"idempotency key {self.key!r} is held by a write still running elsewhere "
                    f"(waited {self.key_wait_ms} ms); retry with the same key",
                    key=self.key,
                    waited_ms=self.key_wait_ms,
                )
            if (index == at - 1 and state == "22012") or self._journalled(index, at, error):
                raise KeyTaken(self.key)
            if counting is not None and index == at and state in _UNWRAPPABLE_STATES:
                if not wire.stale_plan(error, self.lease) and len(_UNWRAPPED) < 1024:
                    _UNWRAPPED.add(sql)
                counting = None  # this attempt was rolled back: run the write unwrapped
                continue
            if not stale and wire.stale_plan(error, self.lease):
                stale = True
                continue
            raise error

    def _head(self, waiting: bool) -> tuple[list[wire.Command], int]:
        """BEGIN, the key's lock, the journal check; and where the lock is."""
        statements = self.statements
        check = wire.Command(statements.check, self.row[:2], _TWO_TEXTS, None, statements.check_key)
        if not waiting:
            try_lock = wire.Command(statements.try_lock, self.lock, _INT8, None, statements.try_key)
            return [_BEGIN_COMMAND, try_lock, check], 1
        lock = wire.Command(statements.lock, self.lock, _INT8, None, statements.lock_key)
        return [
            _BEGIN_COMMAND,
            _lock_timeout(self.key_wait_ms),
            lock,
            wire.constant(_LOCK_DEFAULT),
            check,
        ], 2

    def _journalled(self, index: int, at: int, error: psycopg.Error) -> bool:
        """Whether the journal's own key refused the row: a transaction that held the key
        without its lock (an older gateway) committed it first. The write was rolled back."""
        diag = error.diag
        return (
            index >= at
            and error.sqlstate == "23505"
            and diag.schema_name == self.journal.schema
            and diag.table_name == self.journal.table
        )

    async def _record(self, results: list[PGresult]) -> tuple[GatewayResult, StoredResult]:
        """The second round trip: the write's rows stored in its journal row, and COMMIT."""
        lease, tx = self.lease, self.tx
        described = wire.described(results)
        encoding = wire.statements_of(lease.conn).encoding
        columns = wire.column_names(described, encoding) if described else ()
        kept = wire.load_rows(tx, results, columns, self.max_rows) if described else []
        affected = max(results[-1].command_tuples or 0, 0) if results else 0
        truncated = wire.row_count(results) > self.max_rows
        stored = StoredResult(columns, kept, affected, truncated)
        agent, key, fingerprint, now = self.row
        values = (agent, key, fingerprint, encode_result(stored).encode(encoding), now, now)
        stamp = self.row_types[3]
        types = (wire.TEXT_OID, wire.TEXT_OID, wire.TEXT_OID, wire.TEXT_OID, stamp, stamp)
        record = wire.Command(
            self.statements.record, values, types, None, (self.statements.record, types)
        )
        groups = await _committing(lease, [record, _COMMIT_COMMAND], self.key)
        failed = wire.first_error(groups, lease)
        if failed is not None:
            await wire.rollback(lease)
            if self._journalled(failed[0], 0, failed[1]):
                raise KeyTaken(self.key)
            raise failed[1]
        result = GatewayResult(rows=kept, columns=columns, row_count=affected, truncated=truncated)
        return result, stored


async def _committing(lease: Lease, commands: list[wire.Command], key: str) -> list[list[PGresult]]:
    """Run ``commands``, which end with COMMIT; a connection lost meanwhile leaves the commit
    in doubt, which the key resolves."""
    try:
        groups, _ = await wire.run_pipeline(lease, commands)
    except psycopg.Error as exc:
        await wire.rollback(lease)
        error = map_error(exc, lease, statement_timeout_s=0)
        if error.code == "database_unavailable":
            # COMMIT may or may not have reached the server; the journal row shares its fate.
            raise GatewayError(
                "database_unavailable",
                "the connection was lost while the write committed; whether it was applied "
                f"is recorded with its key: retry with the same key {key!r}",
                key=key,
                sqlstate=error.details.get("sqlstate"),
            ) from None
        raise
    return groups


def map_error(
    exc: Exception, lease: Lease | None, *, statement_timeout_s: float, reading: bool = True
) -> GatewayError:
    """A psycopg error as the ``GatewayError`` the agent is given.

    A statement the server refused is classified by its SQLSTATE
    (:func:`~._errors.sqlstate_code`: ``invalid_data``, ``constraint_violation``,
    ``transaction_conflict``, else ``database_error``); its details are ``sqlstate``,
    ``database_message`` (PostgreSQL's primary message, also in the message),
    ``database_detail``, ``database_hint`` and ``constraint`` (None when the server gave
    none). A value of a result that could not be loaded is ``invalid_data`` without a
    SQLSTATE. A read-only refusal is ``read_only_violation`` only when ``reading`` (a write
    refused so runs against a read-only server: a database error). Never connection
    parameters.
    """
    if isinstance(exc, GatewayError):
        return exc
    if lease is not None and lease.drained:
        return GatewayError(
            "database_unavailable",
            f"agent {lease.agent_id!r}'s connections were drained while its statement ran",
            agent_id=lease.agent_id,
        )
    sqlstate: str | None = getattr(exc, "sqlstate", None)
    diag = getattr(exc, "diag", None)
    if sqlstate == "57014":
        return GatewayError(
            "statement_timeout",
            f"the statement ran longer than the statement timeout of {statement_timeout_s} s "
            "and was cancelled",
            timeout_s=statement_timeout_s,
        )
    if sqlstate == "25006" and reading:
        return GatewayError(
            "read_only_violation",
            "the statement tried to write inside a read, which runs in a READ ONLY "
            "transaction; nothing was changed",
            sqlstate=sqlstate,
            database_message=getattr(diag, "message_primary", None),
        )
    broken = lease is not None and (lease.conn.closed or lease.conn.broken)
    if (
        broken
        or isinstance(exc, psycopg.InterfaceError)
        or (sqlstate or "").startswith("08")
        or sqlstate in _UNAVAILABLE_STATES
        or (sqlstate is None and isinstance(exc, psycopg.OperationalError))
    ):
        if lease is not None:
            lease.discard = True
        return GatewayError(
            "database_unavailable",
            "the connection to the database was lost or refused",
            sqlstate=sqlstate,
        )
    primary = getattr(diag, "message_primary", None)
    message = primary or (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    code = sqlstate_code(sqlstate)
    if sqlstate is None and isinstance(exc, psycopg.DataError):
        # Raised by psycopg, not the server: a value of the result Python cannot hold.
        code, message = "invalid_data", f"a value of the result could not be loaded: {message}"
    return database_refusal(
        code,
        message + (f" (SQLSTATE {sqlstate})" if sqlstate else ""),
        sqlstate=sqlstate,
        database_message=message,
        database_detail=getattr(diag, "message_detail", None),
        database_hint=getattr(diag, "message_hint", None),
        constraint=getattr(diag, "constraint_name", None),
    )
