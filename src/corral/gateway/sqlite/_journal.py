"""The SQLite idempotency journal: a hidden table in the target, keyed by agent, key and
plan hash, written in each write's own transaction (docs/architecture.md, seed 003)."""

from __future__ import annotations

import sqlite3

from corral.gateway._errors import GatewayError
from corral.gateway._journal import decode_result
from corral.gateway.sqlite._plan import Journalled

__all__ = ["JOURNAL_TABLE", "RECORD_SQL", "ensure_journal", "lookup"]

JOURNAL_TABLE = "corral_gateway_journal"
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {JOURNAL_TABLE} (
    agent_id TEXT NOT NULL,
    key TEXT NOT NULL,
    plan_hash TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('in_flight', 'completed')),
    result TEXT,
    created_at TEXT NOT NULL,
    completed_at TEXT,
    PRIMARY KEY (agent_id, key, plan_hash)
)
"""
_COLUMNS = "agent_id, key, plan_hash, fingerprint, state, result, created_at, completed_at"
RECORD_SQL = f"INSERT INTO {JOURNAL_TABLE} ({_COLUMNS}) VALUES (?, ?, ?, ?, 'completed', ?, ?, ?)"


def ensure_journal(target: sqlite3.Connection) -> None:
    """Create the journal unless it exists; ``GatewayError("database_error")`` when it has the
    layout before keys were (agent, key, plan_hash): its rows cannot be carried over (their
    plan hash is inside their fingerprint), so the gateway does not open on it."""
    target.execute(_SCHEMA)
    columns = {str(row[1]) for row in target.execute(f"PRAGMA table_info({JOURNAL_TABLE})")}
    if "plan_hash" not in columns:
        raise GatewayError(
            "database_error",
            f"the idempotency journal {JOURNAL_TABLE} was created by an older corral, whose "
            "keys were (agent, key) without plan_hash; its keys cannot be carried over: "
            "rename or drop the table (its keys will not replay) and open the gateway again",
            journal=JOURNAL_TABLE,
            missing_column="plan_hash",
        )


def lookup(
    target: sqlite3.Connection, agent_id: str, key: str, plan_hash: str
) -> Journalled | None:
    """What the journal holds for ``(agent_id, key, plan_hash)`` (the plan hash as stored:
    :func:`~corral.gateway._journal.stored_plan`), or None."""
    row = target.execute(
        f"SELECT fingerprint, state, result FROM {JOURNAL_TABLE} "
        "WHERE agent_id = ? AND key = ? AND plan_hash = ?",
        (agent_id, key, plan_hash),
    ).fetchone()
    if row is None:
        return None
    stored = decode_result(row[2]) if row[2] is not None else None
    return Journalled(str(row[0]), str(row[1]), stored)
