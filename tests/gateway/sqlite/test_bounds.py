"""SQLite: every request ends within its statement timeout plus the gateway's margin, even
inside one long instruction, and no result or journalled result holds more bytes than its
cap."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import pytest

from corral.daemon import http_status
from corral.gateway import GatewayError, SQLiteGateway
from tests.gateway.corpus import shop_sqlite_file

AGENT = "agent-bounds"
TIMEOUT_S = 0.5
MARGIN_S = 0.5  # the gateway's margin at this timeout: max(0.5 s, 20 %)
BOUND_S = TIMEOUT_S + MARGIN_S + 1.0  # generous: room for a loaded machine
# One row of 160 calls, each building an 8 MB string (under max_bytes): SQLite checks its
# progress handler and interrupts between instructions, never inside one of these.
LONG_ROW = "SELECT " + " + ".join(["length(hex(zeroblob(4000000)))"] * 160) + " AS n"


@pytest.fixture
def shop(tmp_path: Path) -> Path:
    return shop_sqlite_file(tmp_path)


async def test_a_request_ends_within_its_timeout_inside_one_instruction(shop: Path) -> None:
    async with SQLiteGateway.connect(shop, statement_timeout_s=TIMEOUT_S) as gw:
        started = time.monotonic()
        with pytest.raises(GatewayError) as caught:
            await gw.query(AGENT, {"sql": LONG_ROW})
        assert time.monotonic() - started < BOUND_S
        assert caught.value.code == "statement_timeout"
        assert caught.value.retryable
        assert http_status(caught.value) == 408
        # Other reads go on, on the other worker threads.
        result = await gw.query(AGENT, {"sql": "SELECT id FROM orders WHERE id = 1"})
        assert result.rows == [{"id": 1}]


async def test_a_result_is_cut_at_max_bytes_while_it_is_read(shop: Path) -> None:
    sql = (
        "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < 10) "
        "SELECT zeroblob(300000) AS b FROM g"
    )
    async with SQLiteGateway.connect(shop, max_bytes=1_000_000) as gw:
        result = await gw.query(AGENT, {"sql": sql})
        assert result.truncated
        assert result.row_count == len(result.rows) == 3
        assert sum(len(row["b"]) for row in result.rows) <= 1_000_000
        assert "max_bytes=1000000" in result.warnings[0]
        small = await gw.query(AGENT, {"sql": "SELECT id FROM orders ORDER BY id"})
        assert not small.truncated
        assert small.warnings == ()


@pytest.mark.parametrize(
    "sql",
    [
        # A value over the cap: SQLite's own length limit refuses to make it.
        "SELECT zeroblob(100000000) AS b",
        "SELECT length(hex(zeroblob(15000000))) AS n",
        # A first row over the cap, of values under it.
        "SELECT zeroblob(600000) AS a, zeroblob(600000) AS b",
    ],
)
async def test_a_value_or_first_row_over_max_bytes_is_refused(shop: Path, sql: str) -> None:
    async with SQLiteGateway.connect(shop, max_bytes=1_000_000) as gw:
        with pytest.raises(GatewayError) as caught:
            await gw.query(AGENT, {"sql": sql})
    assert caught.value.code == "result_too_large"
    assert not caught.value.retryable
    assert http_status(caught.value) == 422
    assert caught.value.details["max_bytes"] == 1_000_000


async def test_keyed_writes_store_and_replay_a_capped_result(shop: Path) -> None:
    write = {
        "sql": "WITH RECURSIVE g(n) AS (SELECT 100 UNION ALL SELECT n + 1 FROM g "
        "WHERE n < 109) INSERT INTO customers (id, name, email, country, created_at) "
        "SELECT n, 'c', n || '@x', 'FR', 't' FROM g WHERE true "
        "RETURNING id, zeroblob(300000) AS note",
        "idempotency_key": "big-returning",
    }
    async with SQLiteGateway.connect(shop, max_bytes=1_000_000) as gw:
        first = await gw.query(AGENT, write)
        assert first.row_count == 10  # the write ran in full; its returned rows are cut
        assert len(first.rows) == 3
        assert first.truncated
        assert first.warnings
        again = await gw.query(AGENT, write)
    assert again.status == "replayed"
    assert (again.rows, again.truncated, again.warnings) == (first.rows, True, first.warnings)
    conn = sqlite3.connect(shop)
    try:
        assert conn.execute("SELECT count(*) FROM customers WHERE id >= 100").fetchone() == (10,)
        (size,) = conn.execute(
            "SELECT length(result) FROM corral_gateway_journal WHERE key = 'big-returning'"
        ).fetchone()
    finally:
        conn.close()
    assert size < 1_500_000  # three 300 KB blobs, as base64


async def test_cancelled_requests_are_still_interrupted_at_their_deadline(shop: Path) -> None:
    # A client that gives up (a dropped connection cancels the request's task) must not leave
    # its statement holding a worker thread: the statement is still interrupted at its
    # deadline, or never starts. Without that, 40 cancelled 0.25 s statements queued on four
    # threads kept every agent waiting for about 2.5 s.
    endless = (
        "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r"
    )
    async with SQLiteGateway.connect(shop, statement_timeout_s=0.25) as gw:
        for _ in range(40):
            task = asyncio.create_task(gw.query("agent-gone", {"sql": endless}))
            await asyncio.sleep(0.005)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        started = time.monotonic()
        codes: list[str] = []
        result = None
        while result is None and time.monotonic() - started < 1.5:
            try:
                result = await gw.query(AGENT, {"sql": "SELECT 1 AS one"})
            except GatewayError as exc:  # queued behind the cancelled ones: try again
                codes.append(exc.code)
        assert set(codes) <= {"statement_timeout"}
        assert result is not None
        assert result.rows == [{"one": 1}]
        assert time.monotonic() - started < 1.5
