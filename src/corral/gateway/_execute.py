"""Running one analysed request on a leased PostgreSQL connection.

Reads. Connections are opened with ``default_transaction_read_only=on``, so a read runs as
one statement in a READ ONLY transaction the engine enforces; the connection's reported
setting is checked before each read, and a connection whose session default was changed runs
the read in an explicit ``BEGIN ... READ ONLY`` and is then closed. Rows are streamed in
chunks of ``max_rows + 1``: the gateway never holds more than that many rows of a read, and
a longer result is cancelled on the server and returned truncated. A read that returns no rows
is run once more in a single ``REPEATABLE READ READ ONLY`` transaction (one network round
trip, pipelined: ``DECLARE`` a cursor, ``FETCH`` ``max_rows + 1``) together with an exact
``SELECT EXISTS (SELECT 1 FROM t)`` on every table it read, so the rows, the columns and the
emptiness verdict all come from one snapshot. Reads are not prepared on the server (psycopg
prepares only what it fetches whole).

Writes. One pipelined round trip: ``BEGIN READ WRITE``, the journal claim (an INSERT of the
key, waiting at most ``key_wait_s`` for a concurrent holder of the same key), then the write;
a second one stores the result in the journal row and commits (two round trips: the result
stored is the one the write returned). When the key is already
journalled the claim fails, the server discards the rest of the pipeline unexecuted, and
:class:`KeyTaken` tells the caller to read the journal.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, cast

import psycopg
from psycopg import AsyncRawCursor, pq

from corral.gateway._errors import GatewayError
from corral.gateway._journal import JournalName, StoredResult, encode_result
from corral.gateway._pools import Lease
from corral.gateway._result import GatewayResult

__all__ = ["KeyTaken", "Plan", "map_error", "run_read", "run_write"]

_CURSOR = "_corral_read"
_CHUNKED = pq.version() >= 170000  # libpq 17 streams in chunks; older ones row by row
_UNAVAILABLE_STATES = frozenset({"57P01", "57P02", "57P03", "53300"})


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """An analysed request, ready to run.

    ``raw``: ``sql`` uses PostgreSQL's ``$n`` placeholders (sent as they are, bound by the
    server); otherwise psycopg's ``%s``. ``exists`` lists ``(label, qualified name)`` of
    every table the read reads. ``count_op``: a structured ``count``, whose zero counts as
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


class KeyTaken(Exception):
    """The idempotency key is already journalled (committed by another transaction)."""


def _cursor(conn: psycopg.AsyncConnection[Any], raw: bool) -> psycopg.AsyncCursor[Any]:
    return AsyncRawCursor(conn) if raw else conn.cursor()


def _params(plan: Plan) -> Sequence[Any] | None:
    # psycopg reads %% as % only when parameters are passed: compiled operations always pass.
    return plan.params if (plan.params or not plan.raw) else None


def _columns(description: Sequence[Any] | None) -> tuple[str, ...]:
    if not description:
        return ()
    names = [str(column.name) for column in description]
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


def _dicts(columns: tuple[str, ...], rows: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
    return [dict(zip(columns, row, strict=True)) for row in rows]


def _counted_none(plan: Plan, rows: Sequence[Sequence[Any]]) -> bool:
    return plan.count_op and len(rows) == 1 and rows[0][0] == 0


async def run_read(lease: Lease, plan: Plan, *, max_rows: int) -> GatewayResult:
    """Run the read ``plan``; see the module docstring. psycopg errors propagate."""
    conn = lease.conn
    if conn.info.parameter_status("default_transaction_read_only") != "on":
        # The session default was changed (or is not reported): never trust this session.
        lease.discard = True
        return await _read_in_snapshot(lease, plan, max_rows=max_rows)
    cur = _cursor(conn, plan.raw)
    rows: list[Any] = []
    size = max_rows + 1 if _CHUNKED else 1
    # stream() is an async generator: closing it early cancels the rest on the server.
    rows_in = cast(AsyncGenerator[Any, None], cur.stream(plan.sql, _params(plan), size=size))
    async with contextlib.aclosing(rows_in) as stream:
        async for row in stream:
            rows.append(row)
            if len(rows) > max_rows:
                break  # closing the stream cancels the rest on the server
    if not rows or _counted_none(plan, rows):
        # Columns of an empty stream are not reported, and the verdict needs one snapshot.
        return await _read_in_snapshot(lease, plan, max_rows=max_rows)
    columns = _columns(cur.description)
    truncated = len(rows) > max_rows
    kept = rows[:max_rows]
    return GatewayResult(
        rows=_dicts(columns, kept), columns=columns, row_count=len(kept), truncated=truncated
    )


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

    Raises :class:`KeyTaken` when ``(agent_id, key)`` is already journalled (nothing ran),
    ``GatewayError("idempotency_in_progress")`` when another transaction holds the key for
    longer than ``key_wait_ms``; psycopg errors of the write propagate (rolled back).
    """
    conn = lease.conn
    begin, lock, claim, unlock = (conn.cursor() for _ in range(4))
    write = _cursor(conn, plan.raw)
    try:
        async with conn.pipeline():
            await begin.execute("BEGIN ISOLATION LEVEL READ COMMITTED READ WRITE")
            await lock.execute(f"SET LOCAL lock_timeout = {int(key_wait_ms)}")
            await claim.execute(journal.claim_sql, [agent_id, key, fingerprint, now])
            await unlock.execute("SET LOCAL lock_timeout TO DEFAULT")
            await write.execute(plan.sql, _params(plan))
    except psycopg.Error as exc:
        await _rollback(lease)
        if lock.pgresult is not None and claim.pgresult is None:
            if exc.sqlstate == "23505":
                raise KeyTaken(key) from None
            if exc.sqlstate == "55P03":
                raise GatewayError(
                    "idempotency_in_progress",
                    f"idempotency key {key!r} is held by a write still running elsewhere "
                    f"(waited {key_wait_ms} ms); retry with the same key",
                    key=key,
                    waited_ms=key_wait_ms,
                ) from None
        raise
    except BaseException:
        await _rollback(lease)
        raise
    rows: list[Any] = await write.fetchall() if write.description else []
    columns = _columns(write.description)
    truncated = len(rows) > max_rows
    kept = _dicts(columns, rows[:max_rows])
    stored = StoredResult(columns, kept, max(write.rowcount, 0), truncated)
    complete, commit = conn.cursor(), conn.cursor()
    try:
        async with conn.pipeline():
            await complete.execute(
                journal.complete_sql, [encode_result(stored), now, agent_id, key]
            )
            await commit.execute("COMMIT")
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
    except BaseException:
        await _rollback(lease)
        raise
    result = GatewayResult(
        rows=kept, columns=columns, row_count=stored.row_count, truncated=truncated
    )
    return result, stored


async def _rollback(lease: Lease) -> None:
    conn = lease.conn
    if conn.closed or conn.info.transaction_status == pq.TransactionStatus.IDLE:
        return
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
