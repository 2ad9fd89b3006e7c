"""A daemon starting on a PostgreSQL store that other daemons are writing to: opening the
store must not wait for an append in flight (it held the log counter's row while the
appender waited for the opener's lock on the events table: a deadlock, and one of the two
failed, the new daemon exiting 75 or an append refused)."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from corral.daemon.stores._postgres import PostgresStore

pytestmark = pytest.mark.postgres

BOUND_S = 20.0  # a bound on a wait that must not block; never a measure


async def test_opening_the_store_does_not_wait_for_an_append_in_flight(postgres_dsn: str) -> None:
    first = PostgresStore(postgres_dsn)
    await first.open()
    await first.close()
    with psycopg.connect(postgres_dsn) as appender:
        # Another daemon's append, between bumping the counter and its commit.
        appender.execute("UPDATE event_counter SET last_seq = last_seq + 1")
        second = PostgresStore(postgres_dsn)
        await asyncio.wait_for(second.open(), BOUND_S)
        try:
            appender.execute(
                "INSERT INTO events (seq, ts, type, agent_id, data) "
                "VALUES (1, '2026-01-01T00:00:00+00:00', 'x.y', NULL, '{}')"
            )
            appender.rollback()
        finally:
            await second.close()
