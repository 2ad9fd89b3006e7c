"""Where the idempotency journal lives in a PostgreSQL database, the SQL that reads and writes
it, and its creation (the format is described in docs/architecture.md, seed 003)."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from corral.gateway._errors import GatewayError
from corral.kernel._errors import InvalidArgumentError

if TYPE_CHECKING:
    from psycopg import AsyncConnection

__all__ = ["JournalName", "check_identifier", "ensure_journal", "quote_name"]


def quote_name(name: str) -> str:
    """``name`` as a double-quoted PostgreSQL identifier, for SQL that psycopg does not format
    (a ``%`` stays single; :func:`~corral.gateway._ops.quote_identifier` doubles it)."""
    return '"' + name.replace('"', '""') + '"'


_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]{0,62}\Z")


def check_identifier(where: str, argument: str, value: object) -> None:
    """Raise ``InvalidArgumentError`` unless ``value`` is a plain lower-case identifier."""
    if not isinstance(value, str) or not _IDENTIFIER.match(value):
        raise InvalidArgumentError(
            where,
            argument,
            "a lower-case identifier ([a-z_][a-z0-9_]*, at most 63 characters)",
            value,
        )


@dataclass(frozen=True, slots=True)
class JournalName:
    """Where the journal lives: lower-case unquoted identifiers (``[a-z_][a-z0-9_]*``)."""

    schema: str = "corral"
    table: str = "gateway_journal"

    def __post_init__(self) -> None:
        check_identifier("JournalName", "schema", self.schema)
        check_identifier("JournalName", "table", self.table)

    @property
    def qualified(self) -> str:
        """``"schema"."table"``, for SQL run with or without parameters (no ``%`` in names)."""
        return f"{quote_name(self.schema)}.{quote_name(self.table)}"

    def lock_key(self, agent_id: str, key: str, plan: str) -> int:
        """The advisory lock (a signed 64-bit number) that holds ``(agent_id, key, plan)`` of
        this journal while its write runs: the same in every process. ``plan`` is the stored
        plan hash (:func:`~corral.gateway._journal.stored_plan`)."""
        # Lengths first, so that no two (agent, plan, key) triples spell the same text.
        named = (
            f"{self.schema}.{self.table}:{len(agent_id)}:{agent_id}:{len(plan)}:{plan}:{key}"
        ).encode()
        return int.from_bytes(hashlib.blake2b(named, digest_size=8).digest(), "big", signed=True)

    @property
    def try_lock_sql(self) -> str:
        # Fails (division by zero) when another transaction holds the key, so that the
        # statements sent after it in the same pipeline are discarded unexecuted.
        return "SELECT 1 / pg_try_advisory_xact_lock(%s::bigint)::int"

    @property
    def lock_sql(self) -> str:
        return "SELECT pg_advisory_xact_lock(%s::bigint)"

    @property
    def check_sql(self) -> str:
        # Fails (division by zero) when the key is journalled, so that the write sent after
        # it in the same pipeline is discarded unexecuted. Run after the lock is held, in a
        # snapshot of its own: a holder that committed meanwhile is seen.
        return (
            "SELECT 1 / (octet_length(key) - octet_length(key)) "
            f"FROM {self.qualified} WHERE agent_id = %s AND key = %s AND plan_hash = %s"
        )

    @property
    def record_sql(self) -> str:
        return (
            f"INSERT INTO {self.qualified} (agent_id, key, plan_hash, fingerprint, state, "
            "result, created_at, completed_at) "
            "VALUES (%s, %s, %s, %s, 'completed', %s::jsonb, %s, %s)"
        )

    @property
    def lookup_sql(self) -> str:
        return (
            f"SELECT fingerprint, state, result, created_at, completed_at FROM {self.qualified} "
            "WHERE agent_id = %s AND key = %s AND plan_hash = %s"
        )


async def ensure_journal(conn: AsyncConnection[Any], name: JournalName) -> None:
    """Create the journal's schema and table unless they exist.

    ``conn`` must be in autocommit mode and allowed to create them. Safe when several
    gateways start at once (an advisory lock serialises the creation). Database errors
    propagate; a journal of the layout before keys were (agent, key, plan_hash), without a
    ``plan_hash`` column, is ``GatewayError("database_error")``: its rows cannot be carried
    over (their plan hash is inside their fingerprint), so the gateway does not open on it.
    """
    async with conn.transaction():
        # Two gateways creating the same table at once would otherwise race in the catalog.
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [name.qualified])
        cur = await conn.execute("SELECT to_regclass(%s) IS NOT NULL", [name.qualified])
        row = await cur.fetchone()
        if row is not None and row[0]:
            await _check_layout(conn, name)
            return
        # Only when missing: CREATE SCHEMA IF NOT EXISTS needs CREATE on the database even
        # when the schema is there (a least-privileged role's schema made by its owner).
        cur = await conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", [name.schema])
        if await cur.fetchone() is None:
            await conn.execute(f"CREATE SCHEMA {quote_name(name.schema)}")
        await conn.execute(
            f"""CREATE TABLE IF NOT EXISTS {name.qualified} (
                agent_id text NOT NULL,
                key text NOT NULL,
                plan_hash text NOT NULL,
                fingerprint text NOT NULL,
                state text NOT NULL CHECK (state IN ('running', 'completed')),
                result jsonb,
                created_at timestamptz NOT NULL,
                completed_at timestamptz,
                PRIMARY KEY (agent_id, key, plan_hash)
            )"""
        )


async def _check_layout(conn: AsyncConnection[Any], name: JournalName) -> None:
    cur = await conn.execute(
        "SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass(%s) "
        "AND attname = 'plan_hash' AND NOT attisdropped",
        [name.qualified],
    )
    if await cur.fetchone() is None:
        raise GatewayError(
            "database_error",
            f"the idempotency journal {name.schema}.{name.table} was created by an older "
            "corral, whose keys were (agent, key) without plan_hash; its keys cannot be "
            "carried over: rename or drop the table (its keys will not replay) and open the "
            "gateway again",
            journal=f"{name.schema}.{name.table}",
            missing_column="plan_hash",
        )
