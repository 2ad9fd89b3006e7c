"""Running one planned read on a leased PostgreSQL connection (in one round trip, its emptiness
checked in the same snapshot), and the database's errors as ``GatewayError``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import psycopg
from psycopg import AsyncRawCursor, adapt

from corral.gateway._bounds import bytes_warning, row_bytes, timed_out, too_large
from corral.gateway._errors import GatewayError, database_refusal, sqlstate_code
from corral.gateway._result import GatewayResult, unique_names
from corral.gateway._rows import Rows, empty_warning, holds
from corral.gateway.postgres import _wire as wire
from corral.gateway.postgres._pools import Lease

__all__ = ["Plan", "map_error", "plan_params", "run_read"]

_CURSOR = "_corral_read"
_UNAVAILABLE_STATES = frozenset({"57P01", "57P02", "57P03", "53300"})


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """An analysed request, ready to run.

    ``raw``: ``sql`` uses PostgreSQL's ``$n`` placeholders (sent as they are, bound by the
    server); otherwise psycopg's ``%s`` (``%%`` for a ``%``). ``exists`` lists ``(label,
    qualified name)`` of every table ``rows`` names (labels are its leaves): whether the read
    without its filters has rows, the verdict on a filtered empty answer; ``only``: the read
    names a table with ``ONLY``. ``count_op``: a structured ``count``, whose zero counts as
    an empty answer.
    """

    kind: Literal["read", "write"]
    sql: str
    params: tuple[Any, ...]
    raw: bool
    filtered: bool
    exists: tuple[tuple[str, str], ...] = ()
    explain: bool = False
    count_op: bool = False
    rows: Rows = True
    only: bool = False


# --- reads ------------------------------------------------------------------------------------


def _cursor(conn: psycopg.AsyncConnection[Any], raw: bool) -> psycopg.AsyncCursor[Any]:
    return AsyncRawCursor(conn) if raw else conn.cursor()


def plan_params(plan: Plan) -> Sequence[Any] | None:
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


async def run_read(lease: Lease, plan: Plan, *, max_rows: int, max_bytes: int) -> GatewayResult:
    """Run the read ``plan`` in one round trip (an empty filtered answer: once more, with its
    EXISTS checks, in one snapshot), keeping at most ``max_rows`` rows and ``max_bytes``
    bytes; raises ``GatewayError("result_too_large")`` when the first row alone passes
    ``max_bytes``. psycopg errors propagate."""
    conn = lease.conn
    if conn.pgconn.parameter_status(b"default_transaction_read_only") != b"on":
        # The session default was changed (or is not reported): never trust this session.
        lease.discard = True
        return await _read_in_snapshot(lease, plan, max_rows=max_rows, max_bytes=max_bytes)
    tx = adapt.Transformer(conn)
    encoding = wire.statements_of(conn).encoding
    command = wire.command(tx, wire.encoded(plan.sql, plan.raw, encoding), plan_params(plan))
    groups, fetched = await wire.run_pipeline(lease, [command], limit=max_rows, max_bytes=max_bytes)
    error = wire.error_in(groups[0], lease)
    if error is not None and wire.stale_plan(error, lease):
        groups, fetched = await wire.run_pipeline(
            lease, [command], limit=max_rows, max_bytes=max_bytes
        )
        error = wire.error_in(groups[0], lease)
    if error is not None:
        raise error
    results = groups[0]
    described = wire.described(results)
    if fetched.cut == "bytes" and (described is None or wire.row_count(results) == 0):
        raise too_large(max_bytes, fetched.over)
    if described is None or wire.row_count(results) == 0:
        # The verdict on an empty answer needs one snapshot for the rows and the EXISTS.
        return await _read_in_snapshot(lease, plan, max_rows=max_rows, max_bytes=max_bytes)
    columns = wire.column_names(described, encoding)
    rows = wire.load_rows(tx, results, columns, min(max_rows, fetched.rows))
    if plan.count_op and len(rows) == 1 and next(iter(rows[0].values())) == 0:
        return await _read_in_snapshot(lease, plan, max_rows=max_rows, max_bytes=max_bytes)
    if fetched.cut == "bytes":
        warning = bytes_warning(max_bytes, len(rows), fetched.bytes)
        return GatewayResult(
            rows=rows, columns=columns, row_count=len(rows), truncated=True, warnings=(warning,)
        )
    truncated = fetched.cut == "rows"
    return GatewayResult(rows=rows, columns=columns, row_count=len(rows), truncated=truncated)


async def _read_in_snapshot(
    lease: Lease, plan: Plan, *, max_rows: int, max_bytes: int
) -> GatewayResult:
    conn = lease.conn
    checks = plan.exists if plan.filtered else ()
    begin, declare, main = conn.cursor(), _cursor(conn, plan.raw), conn.cursor()
    exists, commit = conn.cursor(), conn.cursor()
    try:
        async with conn.pipeline():
            await begin.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            if plan.explain:
                main = declare
                await main.execute(plan.sql, plan_params(plan))
            else:
                prefix = f"DECLARE {_CURSOR} NO SCROLL CURSOR FOR "
                await declare.execute(prefix + plan.sql, plan_params(plan))
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
    # This path is taken when the first read found no rows (or its session is in doubt):
    # rows that arrived since are capped here, once loaded, as the first read caps them.
    kept, size = _within(rows, max_bytes)
    warnings: tuple[str, ...] = ()
    if kept < len(rows):
        if kept == 0:
            raise too_large(max_bytes, row_bytes(rows[0]))
        rows, truncated = rows[:kept], True
        warnings = (bytes_warning(max_bytes, kept, size),)
    result = _dicts(columns, rows)
    if rows and not _counted_none(plan, rows):
        return GatewayResult(
            rows=result,
            columns=columns,
            row_count=len(rows),
            truncated=truncated,
            warnings=warnings,
        )
    suspicious = False
    holding: tuple[str, ...] = ()
    if plan.filtered:
        flags = (await exists.fetchone() or ()) if checks else ()
        has = {label: bool(flag) for (label, _), flag in zip(checks, flags, strict=True)}
        suspicious, holding = holds(plan.rows, has)
    if not suspicious:
        return GatewayResult(
            rows=result, columns=columns, row_count=len(rows), emptiness="genuinely_empty"
        )
    warning = empty_warning(holding, counted=plan.count_op, only=plan.only)
    return GatewayResult(
        rows=result,
        columns=columns,
        row_count=len(rows),
        emptiness="suspiciously_empty",
        warnings=(warning,),
    )


def _within(rows: Sequence[Sequence[Any]], max_bytes: int) -> tuple[int, int]:
    """How many of ``rows`` fit in ``max_bytes``, and their bytes."""
    total = 0
    for index, values in enumerate(rows):
        size = row_bytes(values)
        if total + size > max_bytes:
            return index, total
        total += size
    return len(rows), total


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
    if lease is not None and lease.timed_out:
        return timed_out(statement_timeout_s, writing=not reading)
    if lease is not None and lease.drained:
        return GatewayError(
            "database_unavailable",
            f"agent {lease.agent_id!r}'s connections were drained while its statement ran",
            agent_id=lease.agent_id,
        )
    sqlstate: str | None = getattr(exc, "sqlstate", None)
    diag = getattr(exc, "diag", None)
    if sqlstate == "57014":
        message = (
            f"the statement ran longer than the statement timeout of {statement_timeout_s} s "
            "and was cancelled"
        )
        if not reading:
            # The database cancelled it, so its transaction rolled back: the same retry
            # advice as when the gateway gave up first, which is safe in both cases.
            message += "; nothing was written: retry with the same idempotency key"
        return GatewayError("statement_timeout", message, timeout_s=statement_timeout_s)
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
