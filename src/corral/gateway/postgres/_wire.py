"""The wire: a request's statements sent to PostgreSQL in one pipeline (one round trip), prepared
per connection, and their results read back with psycopg's adapters."""

# Over 500 lines: sending, reading under the caps and loading share the connection's
# prepared statements and the inlined result loop; apart, they would hand those around.

from __future__ import annotations

import contextlib
import functools
import re
import sys
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

import psycopg
from psycopg import adapt, pq
from psycopg.abc import AdaptContext, Buffer, PQGen, Transformer
from psycopg.adapt import AdaptersMap, PyFormat
from psycopg.errors import error_from_result
from psycopg.generators import send
from psycopg.pq.abc import PGconn, PGresult
from psycopg.waiting import Wait

from corral.gateway._result import unique_names
from corral.gateway.postgres._memsize import has_memory_size, memory_size
from corral.gateway.postgres._pools import Lease

__all__ = [
    "CHUNK_ROWS",
    "TEXT_OID",
    "Command",
    "Fetched",
    "Key",
    "Statements",
    "column_names",
    "command",
    "constant",
    "described",
    "encoded",
    "error_in",
    "first_error",
    "load_all",
    "load_rows",
    "rollback",
    "row_count",
    "run_pipeline",
    "stale_plan",
    "statements_of",
    "with_text",
]

_NO_CAP = sys.maxsize
_CHUNKED = pq.version() >= 170000  # libpq 17 streams in chunks; older ones row by row
# Dropping a prepared statement inside a pipeline (a Close message) needs libpq 17 as well;
# older ones run every statement unprepared.
_PREPARE = pq.version() >= 170000
_STATEMENTS_PER_CONNECTION = 128
TEXT_OID = 25

_S = pq.ExecStatus
_OK, _FATAL = _S.COMMAND_OK, _S.FATAL_ERROR
_ROWS = frozenset({_S.TUPLES_OK, _S.TUPLES_CHUNK, _S.SINGLE_TUPLE})
_SYNC = _S.PIPELINE_SYNC
_WAIT_R = Wait.R
_IDLE = pq.TransactionStatus.IDLE
_ABORTED = pq.PipelineStatus.ABORTED

Key = tuple[bytes, tuple[int, ...]]


@dataclass(eq=False, slots=True)
class Statements:
    """The named statements prepared on one connection, least recently used first, and the
    connection's encoding (Python's name; agents cannot change it)."""

    encoding: str
    names: OrderedDict[Key, bytes] = field(default_factory=OrderedDict)
    closing: list[bytes] = field(default_factory=list)
    serial: int = 0

    def add(self, key: Key, name: bytes) -> None:
        self.names[key] = name
        while len(self.names) > _STATEMENTS_PER_CONNECTION:
            self.closing.append(self.names.popitem(last=False)[1])

    def forget(self) -> None:
        self.closing.extend(self.names.values())
        self.names.clear()


_PREPARED: weakref.WeakKeyDictionary[psycopg.AsyncConnection[Any], Statements] = (
    weakref.WeakKeyDictionary()
)


def statements_of(conn: psycopg.AsyncConnection[Any]) -> Statements:
    """The statements prepared on ``conn`` (an empty record the first time it is seen)."""
    statements = _PREPARED.get(conn)
    if statements is None:
        statements = _PREPARED[conn] = Statements(conn.info.encoding)
    return statements


class Command(NamedTuple):
    """One statement with its parameters dumped for the wire; ``key`` names its prepared
    form (the text and the parameters' types)."""

    sql: bytes
    values: Sequence[Buffer | None] | None
    types: tuple[int, ...]
    formats: Sequence[pq.Format] | None
    key: Key


def command(tx: Transformer, sql: bytes, params: Sequence[Any] | None = None) -> Command:
    """``sql`` (``$n`` placeholders, encoded) with ``params`` dumped by ``tx``; raises
    psycopg's errors for a value it cannot adapt."""
    if not params:
        return Command(sql, None, (), None, (sql, ()))
    n = len(params)
    values = tx.dump_sequence(params, _AUTO[n] if n < len(_AUTO) else [PyFormat.AUTO] * n)
    types = tx.types or ()
    return Command(sql, values, types, list(tx.formats or ()), (sql, types))


_AUTO = [[PyFormat.AUTO] * n for n in range(16)]
_CONSTANTS: dict[bytes, Command] = {}


def constant(sql: bytes) -> Command:
    """The parameterless command ``sql``, built once."""
    found = _CONSTANTS.get(sql)
    if found is None:
        found = _CONSTANTS[sql] = Command(sql, None, (), None, (sql, ()))
    return found


_PERCENT = re.compile(r"%(.|\Z)", re.DOTALL)


@functools.lru_cache(maxsize=2048)
def encoded(sql: str, raw: bool, encoding: str) -> bytes:
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
    if pgconn.pipeline_status == _ABORTED:
        # An earlier command failed (a statement that did not parse or plan): the rest of
        # the pipeline is skipped, and libpq refuses to change a skipped command's mode.
        return
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


@dataclass(slots=True)
class Fetched:
    """How the rows of a pipeline's limited command were read.

    ``cut``: ``rows`` when it had more than the row limit, ``bytes`` when its next row would
    have passed the byte cap (that row and the rest were not kept), else None. ``rows``: how
    many of its rows were kept, at most the row limit plus one (its results may hold more:
    the rest of the chunk the byte cap was met in). ``bytes``: the bytes of the rows kept
    (each value's length on the wire), counted once they came near the byte cap (so always
    when it cut them; else it may be 0). ``over``: the bytes of the first row not kept for
    the byte cap. ``tuples`` (when not stopping at a cap): the row count of its command
    tag, when a chunk of its rows held it (a chunk that ends the command does, and may be one
    past a cap, not kept).
    """

    cut: Literal["rows", "bytes"] | None = None
    rows: int = 0
    tuples: int | None = None
    bytes: int = 0
    over: int | None = None


# Rows per chunk when bytes are capped: libpq holds a whole chunk before it hands it over,
# so a read holds at most max_bytes plus one chunk. One row per chunk (one result, and one
# load, per row) made a thousand-row read take twice as long.
CHUNK_ROWS = 64


def _fitting(result: PGresult, count: int, total: int, max_bytes: int) -> tuple[int, int, int]:
    """How many of the first ``count`` rows of ``result`` fit within ``max_bytes`` after
    ``total`` bytes, the bytes they reach, and the bytes of the first row that does not fit
    (0 when all do)."""
    # psycopg gives a value's bytes, not its length alone: each copy is freed at once.
    value = result.get_value
    columns = range(result.nfields)
    for row in range(count):
        size = sum(len(data) for column in columns if (data := value(row, column)) is not None)
        if total + size > max_bytes:
            return row, total, size
        total += size
    return count, total, 0


def _exchange(
    pgconn: PGconn,
    chunk_group: int | None,
    chunk: int,
    limit: int | None,
    max_bytes: int | None,
    stop: bool,
) -> PQGen[tuple[list[list[PGresult]], Fetched]]:
    """Send the pipeline and read every command's results up to its ``Sync``.

    Group ``chunk_group`` is read in chunks of ``chunk`` rows. Once it has more than
    ``limit`` rows, or its next row would pass ``max_bytes``, either reading stops
    (``stop``: the rest is then still on its way) or its further rows are read and dropped.
    Its values' bytes are counted one by one only once libpq's size of its chunks
    (:func:`~._memsize.memory_size`, at least their bytes) could pass ``max_bytes``.
    """
    yield from send(pgconn)
    group: list[PGresult] = []
    groups = [group]
    fetched = Fetched()
    rows = 0
    total = 0  # the bytes of the rows kept, once counted exactly
    bound = 0  # until then, libpq's size of the chunks kept: at least their bytes
    exact = False
    sized = has_memory_size()
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
            return groups, fetched
        if len(groups) - 1 != chunk_group or not result.ntuples:
            group.append(result)
            continue
        if not stop:  # a write's row count (a read cut short has none)
            tuples = result.command_tuples
            if tuples is not None:
                fetched.tuples = tuples
        if fetched.cut is not None:
            continue  # past a cap, not stopping: the rows are read and dropped
        take = result.ntuples
        if limit is not None and rows + take > limit:
            take = limit + 1 - rows  # the row past the limit is kept, to say the rows were cut
        if max_bytes is not None and not exact:
            size = memory_size(result) if sized else None
            if size is not None and bound + size <= max_bytes:
                bound += size  # the chunk fits: its values take no more than libpq holds
            else:
                # Near the cap (or no bound): every value kept is counted from here on.
                exact = True
                total = sum(_fitting(r, r.ntuples, 0, _NO_CAP)[1] for r in group)
        if exact and max_bytes is not None:
            fit, total, over = _fitting(result, take, total, max_bytes)
            fetched.bytes = total
            if fit < take:
                if fit:
                    group.append(result)
                rows += fit
                fetched.rows = rows
                fetched.cut, fetched.over = "bytes", over
                if stop:
                    return groups, fetched
                continue
        group.append(result)
        rows += take
        fetched.rows = rows
        if limit is not None and rows > limit:
            fetched.cut = "rows"
            if stop:
                return groups, fetched


def _drain(pgconn: PGconn) -> PQGen[None]:
    while True:
        result = yield from _next_result(pgconn)
        if result is not None and result.status == _SYNC:
            return


async def run_pipeline(
    lease: Lease,
    commands: Sequence[Command],
    *,
    limit: int | None = None,
    max_bytes: int | None = None,
    limited: int = 0,
    stop: bool = True,
) -> tuple[list[list[PGresult]], Fetched]:
    """Run ``commands`` in one pipeline; each command's results (its parse error first, if
    preparing it failed), and how the rows of command ``limited`` were read.

    With ``limit`` or ``max_bytes``, command ``limited`` is read in chunks (of at most
    :data:`CHUNK_ROWS` rows with ``max_bytes``) and keeps at most ``limit + 1`` rows and
    ``max_bytes`` bytes of values (``Fetched.rows`` says how many of its results' rows);
    past either, it is cancelled on the server (``stop``) or its further rows are read and
    dropped (a write, which must finish).
    Errors of the statements come back as results, not exceptions. Anything raised (a lost
    connection, a cancelled task) marks the lease ``discard``: the connection's state is then
    unknown.
    """
    conn = lease.conn
    pgconn = conn.pgconn
    statements = statements_of(conn)
    parses: list[tuple[int, int, Key, bytes]] = []  # (group, command, key, name)
    execs: list[int] = []
    groups: list[list[PGresult]] = []
    fetched = Fetched()
    bounded = limit is not None or max_bytes is not None
    chunk = (limit or 0) + 1
    if max_bytes is not None and (limit is None or chunk > CHUNK_ROWS):
        chunk = CHUNK_ROWS  # libpq holds a whole chunk before it hands it over
    async with conn.lock:
        try:
            pgconn.enter_pipeline_mode()
            sent = 0
            for closed in statements.closing:
                pgconn.send_close_prepared(closed)
                sent += 1
            statements.closing.clear()
            pending: dict[Key, bytes] = {}
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
            chunk_group = execs[limited] if bounded else None
            if chunk_group == 0:
                _result_mode(pgconn, chunk)
            pgconn.pipeline_sync()
            groups, fetched = await conn.wait(
                _exchange(pgconn, chunk_group, chunk, limit, max_bytes, stop)
            )
            if fetched.cut is not None and stop:
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
    return out, fetched


def error_in(results: Sequence[PGresult], lease: Lease) -> psycopg.Error | None:
    """The error of a command's ``results`` (its first failed result), or None."""
    for result in results:
        if result.status == _FATAL:
            return error_from_result(result, encoding=statements_of(lease.conn).encoding)
    return None


def first_error(
    groups: Sequence[Sequence[PGresult]], lease: Lease
) -> tuple[int, psycopg.Error] | None:
    """The index of the first command that failed and its error, or None."""
    for index, results in enumerate(groups):
        error = error_in(results, lease)
        if error is not None:
            return index, error
    return None


def stale_plan(error: psycopg.Error, lease: Lease) -> bool:
    """Whether a prepared statement's result shape changed under it; the connection then
    forgets its statements."""
    primary = error.diag.message_primary or ""
    if error.sqlstate != "0A000" or "cached plan" not in primary:
        return False
    statements_of(lease.conn).forget()
    return True


def column_names(result: PGresult, encoding: str) -> tuple[str, ...]:
    """The columns of ``result``, repeated names made unique (see :func:`unique_names`)."""
    names = []
    for i in range(result.nfields):
        name = result.fname(i)
        names.append(name.decode(encoding) if name is not None else "?column?")
    return unique_names(names)


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


def described(results: Sequence[PGresult]) -> PGresult | None:
    """The first of ``results`` that describes rows, or None (a command without rows)."""
    for result in results:
        if result.status in _ROWS and result.nfields:
            return result
    return None


def row_count(results: Sequence[PGresult]) -> int:
    """How many rows ``results`` hold."""
    return sum(r.ntuples for r in results if r.status in _ROWS)


def with_text(command: Command, values: tuple[bytes, ...], types: tuple[int, ...]) -> Command:
    """``command`` with text ``values`` of ``types`` appended to its parameters."""
    count = len(command.types)
    formats = list(command.formats or [pq.Format.TEXT] * count) + [pq.Format.TEXT] * len(values)
    all_types = command.types + types
    return Command(
        command.sql,
        [*(command.values or ()), *values],
        all_types,
        formats,
        (command.sql, all_types),
    )


# Texts that PostgreSQL refused to run wrapped (a table with rules): run unwrapped at once.
_UNWRAPPED: set[bytes] = set()


async def rollback(lease: Lease) -> None:
    """Roll back the lease's open transaction, if any; a connection that cannot is marked
    ``discard``. Never raises psycopg's errors."""
    conn = lease.conn
    if conn.closed or conn.info.transaction_status == _IDLE:
        return
    if lease.discard:
        return  # the connection is closed when it comes back, which rolls back
    try:
        await conn.execute("ROLLBACK")
    except psycopg.Error:
        lease.discard = True


# --- values Python cannot hold ----------------------------------------------------------------

# date, timestamp, timestamptz, interval: text loaders that raise DataError on values outside
# Python's types.
_LENIENT_OIDS = (1082, 1114, 1184, 1186)


class _OrText(adapt.Loader):
    """A text loader that gives PostgreSQL's own text for a value ``inner`` cannot load."""

    inner: type[adapt.Loader]

    def __init__(self, oid: int, context: AdaptContext | None = None) -> None:
        super().__init__(oid, context)
        self._loader = self.inner(oid, context)

    def load(self, data: Buffer) -> Any:
        try:
            return self._loader.load(data)
        except psycopg.DataError:
            return bytes(data).decode("utf-8", "replace")


@functools.lru_cache(maxsize=32)
def _or_text(inner: type[adapt.Loader]) -> type[_OrText]:
    return type(f"OrText{inner.__name__}", (_OrText,), {"inner": inner})


@dataclass(frozen=True, slots=True)
class _Context:
    adapters: AdaptersMap
    connection: Any


def _lenient(tx: Transformer) -> Transformer:
    """A transformer like ``tx`` whose date and time loaders fall back to text."""
    adapters = AdaptersMap(tx.adapters)
    for oid in _LENIENT_OIDS:
        loader = tx.adapters.get_loader(oid, pq.Format.TEXT)
        if loader is not None:
            adapters.register_loader(oid, _or_text(loader))
    return adapt.Transformer(_Context(adapters, tx.connection))


def load_rows(
    tx: Transformer, results: Sequence[PGresult], columns: tuple[str, ...], limit: int
) -> list[dict[str, Any]]:
    """At most ``limit`` rows of ``results``, as dicts keyed by ``columns``.

    Loaded by ``tx``; when a value does not fit its Python type (``psycopg.DataError``) the
    rows are loaded again with dates and times that do not fit given as text (the fast path
    costs nothing). Raises ``psycopg.DataError`` for any other value that cannot be loaded.
    """
    try:
        return _load(tx, results, columns, limit)
    except psycopg.DataError:
        return _load(_lenient(tx), results, columns, limit)


def load_all(conn: psycopg.AsyncConnection[Any], result: PGresult) -> list[tuple[Any, ...]]:
    """Every row of ``result`` as tuples, for a cursor whose own loading raised
    ``psycopg.DataError``: dates and times that do not fit are given as text (see
    :func:`load_rows`). Raises ``psycopg.DataError`` for any other value."""
    tx = _lenient(adapt.Transformer(conn))
    tx.set_pgresult(result)
    return tx.load_rows(0, result.ntuples, tuple)
