"""Running one analysed request on a leased PostgreSQL connection.

The wire. Requests go to the server through libpq's pipeline mode, driven here on psycopg's
``pq`` layer with psycopg's adapters for parameters and rows: every statement of a request is
queued, then one ``Sync``, so a request costs one network round trip (two for a write whose
rows must come back before the journal can store them, see below). Statements are prepared on
their connection: the first execution of a text (with the same parameter types) parses it as
a named statement in the same round trip, later ones skip parsing and planning on the server.
Each connection keeps its ``_STATEMENTS_PER_CONNECTION`` most recently used statements; the
others are closed in its next round trip. PostgreSQL chooses between custom and generic plans
for them as for any client that prepares (``plan_cache_mode``). A prepared statement whose
result shape changed under it (a column type altered, ``0A000``) makes the connection forget
every statement, and the request is sent once more. Named statements live in the server
session: the gateway needs session-level connections (a pooler in transaction mode between it
and the server would hand them to other sessions).

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

import contextlib
import functools
import importlib
import json
import re
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, NamedTuple

import psycopg
from psycopg import AsyncRawCursor, adapt, pq
from psycopg.abc import Buffer, PQGen, Transformer
from psycopg.adapt import PyFormat
from psycopg.errors import error_from_result
from psycopg.generators import send
from psycopg.pq.abc import PGconn, PGresult
from psycopg.waiting import Wait

from corral.gateway._errors import GatewayError
from corral.gateway._journal import JournalName, StoredResult, encode_result
from corral.gateway._pools import Lease
from corral.gateway._result import GatewayResult

__all__ = ["KeyTaken", "Plan", "map_error", "run_read", "run_write"]

_CURSOR = "_corral_read"
_CHUNKED = pq.version() >= 170000  # libpq 17 streams in chunks; older ones row by row
# Dropping a prepared statement inside a pipeline (a Close message) needs libpq 17 as well;
# older ones run every statement unprepared.
_PREPARE = pq.version() >= 170000
_STATEMENTS_PER_CONNECTION = 128
_UNAVAILABLE_STATES = frozenset({"57P01", "57P02", "57P03", "53300"})
# The wrapped form of a write failing with these runs unwrapped instead: PostgreSQL refuses
# some writes inside WITH (DO INSTEAD rules: 0A000), and a statement the wrapping misread
# would not parse (42601).
_UNWRAPPABLE_STATES = frozenset({"0A000", "42601"})

_S = pq.ExecStatus
_OK, _FATAL = _S.COMMAND_OK, _S.FATAL_ERROR
_ROWS = frozenset({_S.TUPLES_OK, _S.TUPLES_CHUNK, _S.SINGLE_TUPLE})
_SYNC = _S.PIPELINE_SYNC
_WAIT_R = Wait.R
_IDLE = pq.TransactionStatus.IDLE

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


# --- the wire ---------------------------------------------------------------------------------

_Key = tuple[bytes, tuple[int, ...]]


@dataclass(eq=False, slots=True)
class _Statements:
    """The named statements prepared on one connection, least recently used first, and the
    connection's encoding (Python's name; agents cannot change it)."""

    encoding: str
    names: OrderedDict[_Key, bytes] = field(default_factory=OrderedDict)
    closing: list[bytes] = field(default_factory=list)
    serial: int = 0

    def add(self, key: _Key, name: bytes) -> None:
        self.names[key] = name
        while len(self.names) > _STATEMENTS_PER_CONNECTION:
            self.closing.append(self.names.popitem(last=False)[1])

    def forget(self) -> None:
        self.closing.extend(self.names.values())
        self.names.clear()


_PREPARED: weakref.WeakKeyDictionary[psycopg.AsyncConnection[Any], _Statements] = (
    weakref.WeakKeyDictionary()
)


def _statements(conn: psycopg.AsyncConnection[Any]) -> _Statements:
    statements = _PREPARED.get(conn)
    if statements is None:
        statements = _PREPARED[conn] = _Statements(conn.info.encoding)
    return statements


class _Command(NamedTuple):
    """One statement with its parameters dumped for the wire; ``key`` names its prepared
    form (the text and the parameters' types)."""

    sql: bytes
    values: Sequence[Buffer | None] | None
    types: tuple[int, ...]
    formats: Sequence[pq.Format] | None
    key: _Key


def _command(tx: Transformer, sql: bytes, params: Sequence[Any] | None = None) -> _Command:
    if not params:
        return _Command(sql, None, (), None, (sql, ()))
    n = len(params)
    values = tx.dump_sequence(params, _AUTO[n] if n < len(_AUTO) else [PyFormat.AUTO] * n)
    types = tx.types or ()
    return _Command(sql, values, types, list(tx.formats or ()), (sql, types))


_AUTO = [[PyFormat.AUTO] * n for n in range(16)]
_CONSTANTS: dict[bytes, _Command] = {}


def _constant(sql: bytes) -> _Command:
    command = _CONSTANTS.get(sql)
    if command is None:
        command = _CONSTANTS[sql] = _Command(sql, None, (), None, (sql, ()))
    return command


_BEGIN_COMMAND = _constant(_BEGIN_WRITE)
_COMMIT_COMMAND = _constant(_COMMIT)

_PERCENT = re.compile(r"%(.|\Z)", re.DOTALL)


@functools.lru_cache(maxsize=2048)
def _encoded(sql: str, raw: bool, encoding: str) -> bytes:
    """``sql`` as sent: ``$n`` placeholders, in the connection's encoding."""
    if raw:
        return sql.encode(encoding)
    count = 0

    def placeholder(match: re.Match[str]) -> str:
        nonlocal count
        if match.group(1) == "%":
            return "%"
        if match.group(1) != "s":
            raise psycopg.ProgrammingError(f"only %s placeholders are allowed, got {match[0]!r}")
        count += 1
        return f"${count}"

    return _PERCENT.sub(placeholder, sql).encode(encoding)


def _result_mode(pgconn: PGconn, chunk: int) -> None:
    if _CHUNKED:
        pgconn.set_chunked_rows_mode(chunk)
    else:
        pgconn.set_single_row_mode()


def _next_result(pgconn: PGconn) -> PQGen[PGresult | None]:
    """The next result of the pipeline (None between two commands' results), waiting for
    the socket as needed: psycopg's ``fetch``, inlined by its callers for speed."""
    if pgconn.is_busy():
        while not (yield _WAIT_R):
            pass
        while True:
            pgconn.consume_input()
            if not pgconn.is_busy():
                break
            while not (yield _WAIT_R):
                pass
        _notifies(pgconn)
    return pgconn.get_result()


def _notifies(pgconn: PGconn) -> None:
    while notify := pgconn.notifies():
        if pgconn.notify_handler:
            pgconn.notify_handler(notify)


def _exchange(
    pgconn: PGconn, chunk_group: int | None, chunk: int, limit: int | None
) -> PQGen[tuple[list[list[PGresult]], bool]]:
    """Send the pipeline and read every command's results up to its ``Sync``.

    Group ``chunk_group`` is read in chunks of ``chunk`` rows, and reading stops (returning
    True) once it has more than ``limit`` rows: the rest is then still on its way.
    """
    yield from send(pgconn)
    group: list[PGresult] = []
    groups = [group]
    rows = 0
    while True:
        # _next_result, inlined: a generator per result costs more than the rest of the loop.
        if pgconn.is_busy():
            while not (yield _WAIT_R):
                pass
            while True:
                pgconn.consume_input()
                if not pgconn.is_busy():
                    break
                while not (yield _WAIT_R):
                    pass
            _notifies(pgconn)
        result = pgconn.get_result()
        if result is None:
            group = []
            groups.append(group)
            if len(groups) - 1 == chunk_group:
                # Only the command at the head of the queue can change its result mode.
                _result_mode(pgconn, chunk)
            continue
        if result.status == _SYNC:
            groups.pop()
            return groups, False
        group.append(result)
        if limit is not None and len(groups) - 1 == chunk_group:
            rows += result.ntuples
            if rows > limit:
                return groups, True


def _drain(pgconn: PGconn) -> PQGen[None]:
    while True:
        result = yield from _next_result(pgconn)
        if result is not None and result.status == _SYNC:
            return


async def _run(
    lease: Lease, commands: Sequence[_Command], *, limit: int | None = None
) -> tuple[list[list[PGresult]], bool]:
    """Run ``commands`` in one pipeline; each command's results (its parse error first, if
    preparing it failed), and whether the first command was cut short past ``limit`` rows
    (then it was cancelled and the rest of its rows dropped).

    Errors of the statements come back as results, not exceptions. Anything raised (a lost
    connection, a cancelled task) marks the lease ``discard``: the connection's state is then
    unknown.
    """
    conn = lease.conn
    pgconn = conn.pgconn
    statements = _statements(conn)
    parses: list[tuple[int, int, _Key, bytes]] = []  # (group, command, key, name)
    execs: list[int] = []
    groups: list[list[PGresult]] = []
    cut = False
    async with conn.lock:
        try:
            pgconn.enter_pipeline_mode()
            sent = 0
            for closed in statements.closing:
                pgconn.send_close_prepared(closed)
                sent += 1
            statements.closing.clear()
            pending: dict[_Key, bytes] = {}
            for index, command in enumerate(commands):
                key = command.key
                name: bytes | None = statements.names.get(key)
                if name is not None:
                    statements.names.move_to_end(key)
                elif _PREPARE:
                    name = pending.get(key)
                    if name is None:
                        statements.serial += 1
                        name = pending[key] = b"_corral_%d" % statements.serial
                        pgconn.send_prepare(name, command.sql, param_types=command.types)
                        parses.append((sent, index, key, name))
                        sent += 1
                if name is not None:
                    pgconn.send_query_prepared(name, command.values, param_formats=command.formats)
                else:
                    pgconn.send_query_params(
                        command.sql,
                        command.values,
                        param_types=command.types,
                        param_formats=command.formats,
                    )
                execs.append(sent)
                sent += 1
            chunk_group = execs[0] if limit is not None else None
            if chunk_group == 0:
                _result_mode(pgconn, (limit or 0) + 1)
            pgconn.pipeline_sync()
            groups, cut = await conn.wait(_exchange(pgconn, chunk_group, (limit or 0) + 1, limit))
            if cut:
                # The rest of the rows are not wanted: stop the statement on the server.
                with contextlib.suppress(psycopg.Error):
                    await conn.cancel_safe(timeout=5.0)
                await conn.wait(_drain(pgconn))
            pgconn.exit_pipeline_mode()
        except BaseException:
            lease.discard = True
            raise
    out = [groups[g] if g < len(groups) else [] for g in execs]
    if len(groups) > sent and out:
        # Results after the last command's (an error at Sync): they belong to the last one.
        out[-1] = [*out[-1], *(r for extra in groups[sent:] for r in extra)]
    for group, index, key, name in parses:
        results = groups[group] if group < len(groups) else []
        if results and results[0].status == _OK:
            statements.add(key, name)
        elif results and results[0].status == _FATAL:
            out[index] = [results[0], *out[index]]
    return out, cut


def _error(results: Sequence[PGresult], lease: Lease) -> psycopg.Error | None:
    for result in results:
        if result.status == _FATAL:
            return error_from_result(result, encoding=_statements(lease.conn).encoding)
    return None


def _first_error(
    groups: Sequence[Sequence[PGresult]], lease: Lease
) -> tuple[int, psycopg.Error] | None:
    for index, results in enumerate(groups):
        error = _error(results, lease)
        if error is not None:
            return index, error
    return None


def _stale_plan(error: psycopg.Error, lease: Lease) -> bool:
    """Whether a prepared statement's result shape changed under it; the connection then
    forgets its statements."""
    primary = error.diag.message_primary or ""
    if error.sqlstate != "0A000" or "cached plan" not in primary:
        return False
    _statements(lease.conn).forget()
    return True


def _names(result: PGresult, encoding: str) -> tuple[str, ...]:
    names = []
    for i in range(result.nfields):
        name = result.fname(i)
        names.append(name.decode(encoding) if name is not None else "?column?")
    return _unique(names)


def _load(
    tx: Transformer, results: Sequence[PGresult], columns: tuple[str, ...], limit: int
) -> list[dict[str, Any]]:
    """At most ``limit`` rows of ``results``, as dicts keyed by ``columns``."""
    rows: list[dict[str, Any]] = []
    first = True

    def row(values: Sequence[Any]) -> dict[str, Any]:
        return dict(zip(columns, values, strict=True))

    for result in results:
        take = min(result.ntuples, limit - len(rows))
        if take <= 0:
            continue
        tx.set_pgresult(result, set_loaders=first)
        first = False
        rows.extend(tx.load_rows(0, take, row))
    return rows


def _described(results: Sequence[PGresult]) -> PGresult | None:
    for result in results:
        if result.status in _ROWS and result.nfields:
            return result
    return None


def _row_count(results: Sequence[PGresult]) -> int:
    return sum(r.ntuples for r in results if r.status in _ROWS)


# --- reads ------------------------------------------------------------------------------------


def _cursor(conn: psycopg.AsyncConnection[Any], raw: bool) -> psycopg.AsyncCursor[Any]:
    return AsyncRawCursor(conn) if raw else conn.cursor()


def _params(plan: Plan) -> Sequence[Any] | None:
    # psycopg reads %% as % only when parameters are passed: compiled operations always pass.
    return plan.params if (plan.params or not plan.raw) else None


def _unique(names: Sequence[str]) -> tuple[str, ...]:
    if len(set(names)) == len(names):
        return tuple(names)
    # A repeated name gets the first free suffix, free of every name the statement gives.
    taken = set(names)
    seen: set[str] = set()
    unique: list[str] = []
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


def _columns(description: Sequence[Any] | None) -> tuple[str, ...]:
    if not description:
        return ()
    return _unique([str(column.name) for column in description])


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
    encoding = _statements(conn).encoding
    command = _command(tx, _encoded(plan.sql, plan.raw, encoding), _params(plan))
    groups, truncated = await _run(lease, [command], limit=max_rows)
    error = _error(groups[0], lease)
    if error is not None and _stale_plan(error, lease):
        groups, truncated = await _run(lease, [command], limit=max_rows)
        error = _error(groups[0], lease)
    if error is not None:
        raise error
    results = groups[0]
    described = _described(results)
    if described is None or _row_count(results) == 0:
        # The verdict on an empty answer needs one snapshot for the rows and the EXISTS.
        return await _read_in_snapshot(lease, plan, max_rows=max_rows)
    columns = _names(described, encoding)
    rows = _load(tx, results, columns, max_rows)
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
        await _rollback(lease)
        raise
    rows = await main.fetchall()
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


@dataclass(frozen=True, slots=True)
class _JournalSql:
    """The journal's statements as sent on connections of one encoding."""

    try_lock: bytes
    lock: bytes
    check: bytes
    record: bytes

    @property
    def try_key(self) -> _Key:
        return (self.try_lock, _INT8)

    @property
    def lock_key(self) -> _Key:
        return (self.lock, _INT8)

    @property
    def check_key(self) -> _Key:
        return (self.check, _TWO_TEXTS)


_INT8 = (20,)
_TWO_TEXTS = (25, 25)


@functools.lru_cache(maxsize=64)
def _journal_sql(journal: JournalName, encoding: str) -> _JournalSql:
    return _JournalSql(
        try_lock=_encoded(journal.try_lock_sql, False, encoding),
        lock=_encoded(journal.lock_sql, False, encoding),
        check=_encoded(journal.check_sql, False, encoding),
        record=_encoded(journal.record_sql, False, encoding),
    )


@functools.lru_cache(maxsize=64)
def _lock_timeout(key_wait_ms: int) -> _Command:
    return _constant(b"SET LOCAL lock_timeout = %d" % int(key_wait_ms))


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
    encoding = _statements(conn).encoding
    sql = _encoded(plan.sql, plan.raw, encoding)
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
        row_types=(_TEXT_OID, _TEXT_OID, _TEXT_OID, stamp_type),
        lock=(b"%d" % journal.lock_key(agent_id, key),),
    )
    body = None if sql in _UNWRAPPED else _countable(sql)
    counting = None
    if body is not None:
        counting = _with_text(
            _command(tx, _counting(body, journal, len(params) + 1), params),
            write.row,
            write.row_types,
        )
    return await write.run(sql, params, counting)


_TEXT_OID = 25


def _timestamp(now: datetime) -> tuple[str, int]:
    """``now`` as PostgreSQL reads it, and its type: timestamptz when it knows its zone."""
    return now.isoformat(), (1184 if now.tzinfo is not None else 1114)


def _with_text(command: _Command, values: tuple[bytes, ...], types: tuple[int, ...]) -> _Command:
    """``command`` with text ``values`` of ``types`` appended to its parameters."""
    count = len(command.types)
    formats = list(command.formats or [pq.Format.TEXT] * count) + [pq.Format.TEXT] * len(values)
    all_types = command.types + types
    return _Command(
        command.sql,
        [*(command.values or ()), *values],
        all_types,
        formats,
        (command.sql, all_types),
    )


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
        self, sql: bytes, params: Sequence[Any], counting: _Command | None
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
                groups, _ = await _run(self.lease, [*head, _command(self.tx, sql, params)])
            failed = _first_error(groups, self.lease)
            if failed is None:
                if counting is not None:
                    count = int(groups[at][-1].get_value(0, 0) or 0)
                    stored = StoredResult((), [], count, False)
                    return GatewayResult(rows=[], columns=(), row_count=count), stored
                return await self._record(groups[at])
            await _rollback(self.lease)
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
                if not _stale_plan(error, self.lease) and len(_UNWRAPPED) < 1024:
                    _UNWRAPPED.add(sql)
                counting = None  # this attempt was rolled back: run the write unwrapped
                continue
            if not stale and _stale_plan(error, self.lease):
                stale = True
                continue
            raise error

    def _head(self, waiting: bool) -> tuple[list[_Command], int]:
        """BEGIN, the key's lock, the journal check; and where the lock is."""
        statements = self.statements
        check = _Command(statements.check, self.row[:2], _TWO_TEXTS, None, statements.check_key)
        if not waiting:
            try_lock = _Command(statements.try_lock, self.lock, _INT8, None, statements.try_key)
            return [_BEGIN_COMMAND, try_lock, check], 1
        lock = _Command(statements.lock, self.lock, _INT8, None, statements.lock_key)
        return [
            _BEGIN_COMMAND,
            _lock_timeout(self.key_wait_ms),
            lock,
            _constant(_LOCK_DEFAULT),
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
        described = _described(results)
        encoding = _statements(lease.conn).encoding
        columns = _names(described, encoding) if described else ()
        kept = _load(tx, results, columns, self.max_rows) if described else []
        affected = max(results[-1].command_tuples or 0, 0) if results else 0
        truncated = _row_count(results) > self.max_rows
        stored = StoredResult(columns, kept, affected, truncated)
        agent, key, fingerprint, now = self.row
        values = (agent, key, fingerprint, encode_result(stored).encode(encoding), now, now)
        stamp = self.row_types[3]
        types = (_TEXT_OID, _TEXT_OID, _TEXT_OID, _TEXT_OID, stamp, stamp)
        record = _Command(
            self.statements.record, values, types, None, (self.statements.record, types)
        )
        groups = await _committing(lease, [record, _COMMIT_COMMAND], self.key)
        failed = _first_error(groups, lease)
        if failed is not None:
            await _rollback(lease)
            if self._journalled(failed[0], 0, failed[1]):
                raise KeyTaken(self.key)
            raise failed[1]
        result = GatewayResult(rows=kept, columns=columns, row_count=affected, truncated=truncated)
        return result, stored


async def _committing(lease: Lease, commands: list[_Command], key: str) -> list[list[PGresult]]:
    """Run ``commands``, which end with COMMIT; a connection lost meanwhile leaves the commit
    in doubt, which the key resolves."""
    try:
        groups, _ = await _run(lease, commands)
    except psycopg.Error as exc:
        await _rollback(lease)
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


async def _rollback(lease: Lease) -> None:
    conn = lease.conn
    if conn.closed or conn.info.transaction_status == _IDLE:
        return
    if lease.discard:
        return  # the connection is closed when it comes back, which rolls back
    try:
        await conn.execute("ROLLBACK")
    except psycopg.Error:
        lease.discard = True


def map_error(
    exc: Exception, lease: Lease | None, *, statement_timeout_s: float, reading: bool = True
) -> GatewayError:
    """A psycopg error as the ``GatewayError`` the agent is given.

    ``database_error`` carries the SQLSTATE and PostgreSQL's primary message only (no
    detail, no connection parameters). A read-only refusal is ``read_only_violation`` only
    when ``reading`` (a write refused so runs against a read-only server: a database error).
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
    if sqlstate == "57014":
        return GatewayError(
            "statement_timeout",
            f"the statement ran longer than the statement timeout of {statement_timeout_s} s "
            "and was cancelled",
            timeout_s=statement_timeout_s,
        )
    if sqlstate == "25006" and reading:
        diag = getattr(exc, "diag", None)
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
    diag = getattr(exc, "diag", None)
    primary = getattr(diag, "message_primary", None)
    message = primary or (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return GatewayError(
        "database_error",
        f"the database refused the statement: {message}"
        + (f" (SQLSTATE {sqlstate})" if sqlstate else ""),
        sqlstate=sqlstate,
        database_message=message,
    )
