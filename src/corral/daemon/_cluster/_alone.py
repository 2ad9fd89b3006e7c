"""A daemon without ``--node`` on a PostgreSQL store holds it alone: it acts for every agent,
so it takes the mode lock exclusively for as long as it runs."""

from __future__ import annotations

import psycopg
from psycopg.rows import TupleRow

from corral.daemon._cluster._tables import MODE_LOCK_KEY
from corral.daemon._errors import ClusterModeError, StoreUnavailableError
from corral.daemon.stores._postgres import PostgresStore


async def hold_alone(store: PostgresStore) -> psycopg.AsyncConnection[TupleRow]:
    """A connection holding the store's mode lock exclusively (close it to let go). Raises
    :class:`ClusterModeError` when daemons with ``--node``, or another daemon alone, hold
    it: two daemons that each act for every agent would run every turn twice."""
    try:
        conn = await psycopg.AsyncConnection.connect(store.dsn, autocommit=True)
    except psycopg.OperationalError as exc:
        raise StoreUnavailableError(store.dsn_shown, str(exc).strip()) from exc
    row = await (await conn.execute("SELECT pg_try_advisory_lock(%s)", (MODE_LOCK_KEY,))).fetchone()
    if not (row and row[0]):
        await conn.close()
        raise ClusterModeError(
            f"another daemon runs on the store {store.dsn_shown}: one daemon alone acts for "
            "every agent, so several daemons on one store each need --node NAME"
        )
    return conn
