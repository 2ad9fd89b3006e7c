"""SQLite writes killed with SIGKILL at random points: each applied at most once, and the
journal (in the target, in the write's own transaction) agrees with the data exactly."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from corral.gateway import GatewayError, SQLiteGateway
from corral.gateway.sqlite._file import JOURNAL_TABLE
from corral.runtime import FakeClock
from tests.gateway.corpus import shop_sqlite_file
from tests.gateway.crash_worker import AGENT, insert, kill_at_random_points

REPO = Path(__file__).resolve().parents[3]


def _fetch(path: Path, sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


@pytest.mark.parametrize("journal_mode", ["delete", "wal"])
async def test_writes_killed_at_random_points_apply_exactly_once(
    tmp_path: Path, journal_mode: str
) -> None:
    count, seed = 200, 11
    shop = shop_sqlite_file(tmp_path)
    conn = sqlite3.connect(shop)
    conn.execute(f"PRAGMA journal_mode={journal_mode}")
    conn.execute("CREATE TABLE crash_writes (n INTEGER NOT NULL)")
    conn.commit()
    conn.close()
    kills = await kill_at_random_points("sqlite", str(shop), count, seed)
    assert kills >= 4

    # What the kills left: the data and the journal agree exactly (one transaction each).
    applied = {int(n) for (n,) in _fetch(shop, "SELECT n FROM crash_writes")}
    journalled = {
        int(str(key).removeprefix("w-"))
        for (key,) in _fetch(shop, f"SELECT key FROM {JOURNAL_TABLE} WHERE state = 'completed'")
    }
    assert applied == journalled, f"seed {seed}"
    assert _fetch(shop, f"SELECT count(*) FROM {JOURNAL_TABLE} WHERE state <> 'completed'") == [
        (0,)
    ]

    # A fresh gateway retries every write with its key.
    replayed: set[int] = set()
    ran: set[int] = set()
    async with SQLiteGateway.connect(shop, breaker=None, clock=FakeClock()) as gw:
        assert gw.keys_in_flight_at_open == 0
        for n in range(count):
            try:
                result = await gw.query(AGENT, insert(n))
            except GatewayError as exc:  # pragma: no cover - the assertion says which
                raise AssertionError(f"write {n} refused: {exc.code} (seed {seed})") from exc
            (replayed if result.status == "replayed" else ran).add(n)
    assert replayed == applied, f"seed {seed}"
    assert ran == set(range(count)) - applied
    assert len(applied) >= 5  # the writes done before the kills
    rows = _fetch(shop, "SELECT n, count(*) FROM crash_writes GROUP BY n ORDER BY n")
    assert rows == [(n, 1) for n in range(count)], f"seed {seed}"
    assert _fetch(shop, f"SELECT count(*), sum(state = 'completed') FROM {JOURNAL_TABLE}") == [
        (count, count)
    ]
