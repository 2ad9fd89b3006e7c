"""Every request ends within its statement timeout plus the gateway's margin, whatever it
computes, and no result, stored result or replay cache holds more bytes than its cap."""

from __future__ import annotations

import time

import pytest

from corral.daemon import http_status
from corral.gateway import Gateway, GatewayError
from corral.gateway.postgres._engine import PostgresEngine
from tests.gateway.gateway_support import fetch, shop_dsn
from tests.support.polling import settle

__all__ = ["shop_dsn"]

pytestmark = pytest.mark.postgres

AGENT = "agent-bounds"
TIMEOUT_S = 0.5
MARGIN_S = 0.5  # the gateway's margin at this timeout: max(0.5 s, 20 %)
# Generous: the bound is timeout + margin; the rest is room for a loaded machine. Without
# the gateway's deadline the request below runs for the whole of its md5 calls.
BOUND_S = TIMEOUT_S + MARGIN_S + 1.0
# One long expression over a materialised 50 MB value: the server checks its statement
# timeout between rows, not inside the evaluation of one row's 40 md5 calls.
LONG_EXPRESSION = (
    "WITH t AS MATERIALIZED (SELECT repeat('x', 50000000) AS s) SELECT length("
    + " || ".join(["md5(s)"] * 40)
    + ") AS n FROM t"
)


def _busy(dsn: str) -> bool:
    rows = fetch(
        dsn,
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
        [f"corral-gateway:{AGENT}"],
    )
    return bool(rows[0][0])


async def test_a_request_ends_within_its_timeout_whatever_it_computes(shop_dsn: str) -> None:
    async with Gateway.connect(shop_dsn, statement_timeout_s=TIMEOUT_S) as gw:
        started = time.monotonic()
        with pytest.raises(GatewayError) as caught:
            await gw.query(AGENT, {"sql": LONG_EXPRESSION})
        elapsed = time.monotonic() - started
        assert caught.value.code == "statement_timeout"
        assert caught.value.retryable
        assert http_status(caught.value) == 408
        assert elapsed < BOUND_S, elapsed
        # The connection was cut, not given back: the agent's next read gets a new one.
        assert gw.connections_in_use(AGENT) == 0
        result = await gw.query(AGENT, {"sql": "SELECT id FROM orders WHERE id = 1"})
        assert result.rows == [{"id": 1}]
    # The server finishes the evaluation it could not interrupt, then sees the client gone.
    await settle(lambda: not _busy(shop_dsn), within_s=60)


async def test_a_keyed_write_past_its_deadline_answers_a_retryable_timeout(
    shop_dsn: str,
) -> None:
    write = {
        "sql": "INSERT INTO refunds (id, order_id, amount) SELECT 9, 1, length("
        + " || ".join(["md5(s)"] * 40)
        + ") FROM (SELECT repeat('x', 50000000) AS s OFFSET 0) t",
        "idempotency_key": "slow-refund",
    }
    async with Gateway.connect(shop_dsn, statement_timeout_s=TIMEOUT_S) as gw:
        started = time.monotonic()
        with pytest.raises(GatewayError) as caught:
            await gw.query(AGENT, write)
        assert time.monotonic() - started < BOUND_S
        assert caught.value.code == "statement_timeout"
        assert caught.value.retryable
        assert "same idempotency key" in caught.value.message
    await settle(lambda: not _busy(shop_dsn), within_s=60)
    assert fetch(shop_dsn, "SELECT count(*) FROM refunds WHERE id = 9") == [(0,)]


async def test_a_result_is_cut_at_max_bytes_while_it_is_read(shop_dsn: str) -> None:
    async with Gateway.connect(shop_dsn, max_bytes=1_000_000) as gw:
        result = await gw.query(
            AGENT, {"sql": "SELECT repeat('x', 300000) AS s FROM generate_series(1, 10)"}
        )
        assert result.truncated
        assert result.row_count == len(result.rows) == 3
        assert sum(len(row["s"]) for row in result.rows) <= 1_000_000
        assert "max_bytes=1000000" in result.warnings[0]
        # Small results are untouched.
        small = await gw.query(AGENT, {"sql": "SELECT id FROM orders ORDER BY id"})
        assert not small.truncated
        assert small.warnings == ()


async def test_the_cut_is_exact_when_the_cap_is_met_chunks_into_a_result(shop_dsn: str) -> None:
    # 10,000-byte rows: the first chunks fit whole, and the cap falls exactly after row 100.
    async with Gateway.connect(shop_dsn, max_bytes=1_000_000) as gw:
        result = await gw.query(
            AGENT,
            {"sql": "SELECT repeat('x', 10000) AS s FROM generate_series(1, 300) ORDER BY 1"},
        )
        assert result.truncated
        assert result.row_count == len(result.rows) == 100
        assert "the first 100 row(s), 1000000 bytes" in result.warnings[0]


async def test_a_first_row_over_max_bytes_is_refused(shop_dsn: str) -> None:
    async with Gateway.connect(shop_dsn, max_bytes=1_000_000) as gw:
        with pytest.raises(GatewayError) as caught:
            await gw.query(
                # Five times the limit: big enough to be refused, small enough that a busy
                # machine builds it well within the statement timeout.
                AGENT,
                {"sql": "SELECT repeat('x', 5000000) AS s FROM generate_series(1, 4)"},
            )
        error = caught.value
        assert error.code == "result_too_large"
        assert not error.retryable
        assert http_status(error) == 422
        assert error.details == {"max_bytes": 1_000_000, "seen_bytes": 5_000_000}
        # The connection was cancelled cleanly and serves the next read.
        result = await gw.query(AGENT, {"sql": "SELECT id FROM orders WHERE id = 2"})
        assert result.rows == [{"id": 2}]


async def test_keyed_writes_store_and_replay_a_capped_result(shop_dsn: str) -> None:
    write = {
        "sql": "INSERT INTO refunds (id, order_id, amount) SELECT g, 1, 1 "
        "FROM generate_series(100, 109) g RETURNING id, repeat('y', 300000) AS note",
        "idempotency_key": "big-returning",
    }
    async with Gateway.connect(shop_dsn, max_bytes=1_000_000) as gw:
        first = await gw.query(AGENT, write)
        # The write ran in full; only its returned rows are cut.
        assert first.row_count == 10
        assert len(first.rows) == 3
        assert first.truncated
        assert first.warnings
    assert fetch(shop_dsn, "SELECT count(*) FROM refunds WHERE id >= 100") == [(10,)]
    stored = fetch(
        shop_dsn,
        "SELECT octet_length(result::text) FROM corral.gateway_journal WHERE key = %s",
        ["big-returning"],
    )
    assert stored[0][0] < 1_100_000
    # A new gateway replays it from the journal, saying it was cut.
    async with Gateway.connect(shop_dsn, max_bytes=1_000_000) as gw:
        again = await gw.query(AGENT, write)
        assert again.status == "replayed"
        assert (again.rows, again.truncated, again.warnings) == (
            first.rows,
            True,
            first.warnings,
        )


async def test_the_replay_cache_is_bounded_in_bytes(shop_dsn: str) -> None:
    def write(n: int) -> dict[str, object]:
        return {
            "sql": "INSERT INTO refunds (id, order_id, amount) VALUES ($1, 1, 1) "
            "RETURNING id, repeat('z', 400000) AS note",
            "params": [200 + n],
            "idempotency_key": f"cached-{n}",
        }

    async with Gateway.connect(shop_dsn, max_bytes=1_000_000, replay_cache_bytes=1_000_000) as gw:
        engine = gw._engine
        assert isinstance(engine, PostgresEngine)
        cache = engine._writes.replays
        for n in range(3):
            await gw.query(AGENT, write(n))
            assert cache.bytes <= 1_000_000
        # Two results of 400 KB fit; the oldest was let go, and replays from the journal.
        assert len(cache) == 2
        assert cache.get((AGENT, "cached-0", "")) is None
        replay = await gw.query(AGENT, write(0))
        assert replay.status == "replayed"
        assert len(replay.rows[0]["note"]) == 400_000
        assert cache.bytes <= 1_000_000
    async with Gateway.connect(shop_dsn, max_bytes=2_000_000, replay_cache_bytes=100) as gw:
        engine = gw._engine
        assert isinstance(engine, PostgresEngine)
        await gw.query(AGENT, write(3))
        # Larger than the whole cache: never kept.
        assert len(engine._writes.replays) == 0
        assert (await gw.query(AGENT, write(3))).status == "replayed"
