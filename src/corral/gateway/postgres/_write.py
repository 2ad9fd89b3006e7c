"""A keyed write on a leased PostgreSQL connection: the key's lock, its check, the write with its
journal row and the commit in one round trip (docs/architecture.md, seed 003, tells why)."""

from __future__ import annotations

import functools
import importlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import adapt
from psycopg.abc import Transformer
from psycopg.pq.abc import PGresult

from corral.gateway._bounds import bytes_warning
from corral.gateway._errors import GatewayError
from corral.gateway._journal import StoredResult, encode_result
from corral.gateway._result import GatewayResult
from corral.gateway.postgres import _wire as wire
from corral.gateway.postgres._execute import Plan, map_error, plan_params
from corral.gateway.postgres._journal import JournalName
from corral.gateway.postgres._pools import Lease

__all__ = ["KeyTaken", "run_write"]

# The wrapped form of a write failing with these runs unwrapped instead: PostgreSQL refuses
# some writes inside WITH (DO INSTEAD rules: 0A000), and a statement the wrapping misread
# would not parse (42601).
_UNWRAPPABLE_STATES = frozenset({"0A000", "42601"})

_BEGIN_WRITE = b"BEGIN ISOLATION LEVEL READ COMMITTED READ WRITE"
# With an agent role, agents' connections log in as the owner and run as the agent role (set
# at connection start); the journal's statements run as the owner, back in the session user.
_AS_OWNER = b"SET LOCAL ROLE NONE"
_LOCK_DEFAULT = b"SET LOCAL lock_timeout TO DEFAULT"
_COMMIT = b"COMMIT"

# postgast's generated stubs do not type-check, so its modules are loaded untyped (as in _sql).
_pg_query: Any = importlib.import_module("postgast.native").lib
_pg_query_errors: Any = importlib.import_module("postgast.errors")


class KeyTaken(Exception):
    """The idempotency key is already journalled (committed by another transaction); the
    write did not run, or was rolled back."""


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
        return (self.check, _THREE_TEXTS)


_INT8 = (20,)
_THREE_TEXTS = (25, 25, 25)


@functools.lru_cache(maxsize=64)
def _journal_sql(journal: JournalName, encoding: str) -> _JournalSql:
    return _JournalSql(
        try_lock=wire.encoded(journal.try_lock_sql, False, encoding),
        lock=wire.encoded(journal.lock_sql, False, encoding),
        check=wire.encoded(journal.check_sql, False, encoding),
        record=wire.encoded(journal.record_sql, False, encoding),
    )


@functools.lru_cache(maxsize=64)
def _as_role(role: str) -> wire.Command:
    # A lower-case identifier (checked with the options): nothing to escape.
    return wire.constant(b'SET LOCAL ROLE "%s"' % role.encode("ascii"))


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
    rows it wrote; parameters ``$first`` .. ``$first+4``: agent_id, key, plan_hash,
    fingerprint, now."""
    return (
        b"WITH _corral_write AS (\n" + body + b"\nRETURNING 1\n), "
        b"_corral_journal AS (INSERT INTO " + journal.qualified.encode("utf-8") + b" "
        b"(agent_id, key, plan_hash, fingerprint, state, result, created_at, completed_at) "
        b"SELECT $%d, $%d, $%d, $%d, 'completed', jsonb_build_object("
        b"'columns', '[]'::jsonb, 'rows', '[]'::jsonb, 'row_count', count(*), "
        b"'truncated', false), $%d, $%d FROM _corral_write) "
        b"SELECT count(*) FROM _corral_write"
        % (first, first + 1, first + 2, first + 3, first + 4, first + 4)
    )


@functools.lru_cache(maxsize=1024)
def _counting_alone(body: bytes) -> bytes:
    """The write ``body`` keeping the number of rows it wrote in a transaction-local setting,
    for the journal row that the owner inserts next (:func:`_journal_from_count`)."""
    return (
        b"WITH _corral_write AS (\n" + body + b"\nRETURNING 1\n) "
        b"SELECT set_config('corral.write_rows', count(*)::text, true) FROM _corral_write"
    )


@functools.lru_cache(maxsize=64)
def _journal_from_count(journal: JournalName, encoding: str) -> bytes:
    """The journal row of a write run by :func:`_counting_alone`; parameters agent_id, key,
    plan_hash, fingerprint, now."""
    return (
        f"INSERT INTO {journal.qualified} "
        "(agent_id, key, plan_hash, fingerprint, state, result, created_at, completed_at) "
        "SELECT $1, $2, $3, $4, 'completed', jsonb_build_object("
        "'columns', '[]'::jsonb, 'rows', '[]'::jsonb, 'row_count', "
        "current_setting('corral.write_rows')::bigint, 'truncated', false), $5, $5"
    ).encode(encoding)


async def run_write(
    lease: Lease,
    plan: Plan,
    *,
    journal: JournalName,
    agent_id: str,
    key: str,
    plan_hash: str,
    fingerprint: str,
    now: datetime,
    key_wait_ms: int,
    max_rows: int,
    max_bytes: int,
    agent_role: str | None = None,
) -> tuple[GatewayResult, StoredResult]:
    """Run the write ``plan`` with its journal row, in one transaction, and commit.

    ``agent_role``: the role the connection runs agents' SQL as (set at its start), which has
    no rights on the journal; the journal's statements then run as the session user, the
    write alone as ``agent_role``, still in one transaction and one round trip.

    ``plan_hash`` is as stored (:func:`~corral.gateway._journal.stored_plan`). Raises
    :class:`KeyTaken` when ``(agent_id, key, plan_hash)`` is already journalled (the write was
    not run, or was rolled back), ``GatewayError("idempotency_in_progress")`` when another
    transaction holds the key for longer than ``key_wait_ms``,
    ``GatewayError("database_unavailable")`` (retry with the same key) when the connection was
    lost once the COMMIT was sent; psycopg errors of the write propagate (rolled back). The
    rows it returns are capped at ``max_rows`` and ``max_bytes`` (rows past either are read
    and dropped, never the write cancelled), in the answer and its journal row alike.
    """
    conn = lease.conn
    tx = adapt.Transformer(conn)
    encoding = wire.statements_of(conn).encoding
    sql = wire.encoded(plan.sql, plan.raw, encoding)
    params = tuple(plan_params(plan) or ())
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
        max_bytes=max_bytes,
        row=(
            agent_id.encode(encoding),
            key.encode(encoding),
            plan_hash.encode(encoding),
            fingerprint.encode(encoding),
            stamp.encode(encoding),
        ),
        row_types=(wire.TEXT_OID, wire.TEXT_OID, wire.TEXT_OID, wire.TEXT_OID, stamp_type),
        lock=(b"%d" % journal.lock_key(agent_id, key, plan_hash),),
        as_owner=[wire.constant(_AS_OWNER)] if agent_role else [],
        as_agent=[_as_role(agent_role)] if agent_role else [],
    )
    body = None if sql in _UNWRAPPED else _countable(sql)
    counting: list[wire.Command] | None = None
    if body is not None and agent_role:
        # Two statements: one role each. The count passes in a transaction-local setting.
        journal_sql = _journal_from_count(journal, encoding)
        counting = [
            wire.command(tx, _counting_alone(body), params),
            *write.as_owner,
            wire.Command(
                journal_sql, write.row, write.row_types, None, (journal_sql, write.row_types)
            ),
        ]
    elif body is not None:
        counting = [
            wire.with_text(
                wire.command(tx, _counting(body, journal, len(params) + 1), params),
                write.row,
                write.row_types,
            )
        ]
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
    max_bytes: int
    row: tuple[bytes, ...]  # agent_id, key, plan_hash, fingerprint, now: dumped
    row_types: tuple[int, ...]
    lock: tuple[bytes]  # the key's advisory lock, dumped
    as_owner: list[wire.Command]  # back to the session user (empty without an agent role)
    as_agent: list[wire.Command]  # to the agent role (empty without one)

    async def run(
        self, sql: bytes, params: Sequence[Any], counting: list[wire.Command] | None
    ) -> tuple[GatewayResult, StoredResult]:
        """The write ``sql`` with ``params``, wrapped as ``counting`` when it can be (the write
        first, then what records its journal row)."""
        waiting = False  # the key was held: wait for it (up to key_wait_ms) this time
        stale = False  # a prepared statement went stale: sent once more
        while True:
            head, lock_at, check_at = self._head(waiting)
            at = len(head)  # where the write is
            if counting is not None:
                groups = await _committing(
                    self.lease, [*head, *counting, _COMMIT_COMMAND], self.key
                )
            else:
                groups, fetched = await wire.run_pipeline(
                    self.lease,
                    [*head, wire.command(self.tx, sql, params)],
                    limit=self.max_rows,
                    max_bytes=self.max_bytes,
                    limited=at,
                    stop=False,
                )
            failed = wire.first_error(groups, self.lease)
            if failed is None:
                if counting is not None:
                    count = int(groups[at][-1].get_value(0, 0) or 0)
                    stored = StoredResult((), [], count, False)
                    return GatewayResult(rows=[], columns=(), row_count=count), stored
                return await self._record(groups[at], fetched)
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
            if (index == check_at and state == "22012") or self._journalled(index, at, error):
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

    def _head(self, waiting: bool) -> tuple[list[wire.Command], int, int]:
        """BEGIN, the key's lock, the journal check (as the owner, then back to the agent
        role, when there is one); and where the lock and the check are."""
        statements = self.statements
        check = wire.Command(
            statements.check, self.row[:3], _THREE_TEXTS, None, statements.check_key
        )
        if not waiting:
            try_lock = wire.Command(statements.try_lock, self.lock, _INT8, None, statements.try_key)
            head = [_BEGIN_COMMAND, try_lock, *self.as_owner]
            lock_at = 1
        else:
            lock = wire.Command(statements.lock, self.lock, _INT8, None, statements.lock_key)
            head = [
                _BEGIN_COMMAND,
                _lock_timeout(self.key_wait_ms),
                lock,
                wire.constant(_LOCK_DEFAULT),
                *self.as_owner,
            ]
            lock_at = 2
        check_at = len(head)
        return [*head, check, *self.as_agent], lock_at, check_at

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

    async def _record(
        self, results: list[PGresult], fetched: wire.Fetched
    ) -> tuple[GatewayResult, StoredResult]:
        """The second round trip: the write's rows stored in its journal row, and COMMIT."""
        lease, tx = self.lease, self.tx
        described = wire.described(results)
        encoding = wire.statements_of(lease.conn).encoding
        columns = wire.column_names(described, encoding) if described else ()
        limit = min(self.max_rows, fetched.rows)
        kept = wire.load_rows(tx, results, columns, limit) if described else []
        # A chunk of the rows holds the tag when they came in chunks (and may not be kept).
        tag = fetched.tuples
        if tag is None and results:
            tag = results[-1].command_tuples
        affected = max(tag or 0, 0)
        truncated = fetched.cut is not None
        # A write is never refused for its size (it ran): its rows are cut, even to none.
        warnings: tuple[str, ...] = ()
        if fetched.cut == "bytes":
            warnings = (bytes_warning(self.max_bytes, len(kept), fetched.bytes),)
        stored = StoredResult(columns, kept, affected, truncated, warnings)
        agent, key, plan, fingerprint, now = self.row
        values = (agent, key, plan, fingerprint, encode_result(stored).encode(encoding), now, now)
        stamp = self.row_types[4]
        text = wire.TEXT_OID
        types = (text, text, text, text, text, stamp, stamp)
        record = wire.Command(
            self.statements.record, values, types, None, (self.statements.record, types)
        )
        groups = await _committing(lease, [*self.as_owner, record, _COMMIT_COMMAND], self.key)
        failed = wire.first_error(groups, lease)
        if failed is not None:
            await wire.rollback(lease)
            if self._journalled(failed[0], 0, failed[1]):
                raise KeyTaken(self.key)
            raise failed[1]
        result = GatewayResult(
            rows=kept,
            columns=columns,
            row_count=affected,
            truncated=truncated,
            warnings=warnings,
        )
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
