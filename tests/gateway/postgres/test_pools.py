"""Per-agent pools: fail-fast exhaustion, isolation between agents, draining."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg
import pytest

from corral.gateway import Gateway, GatewayError
from corral.gateway.postgres._pools import AgentPools
from tests.gateway.gateway_support import fetch, shop_dsn
from tests.support.polling import settle

__all__ = ["shop_dsn"]

pytestmark = pytest.mark.postgres

POINT_READ = {"sql": "SELECT id, status FROM orders WHERE id = $1", "params": [3]}


def _sleeping(dsn: str, agent: str) -> int:
    """How many of ``agent``'s statements are inside pg_sleep right now."""
    rows = fetch(
        dsn,
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND application_name = %s "
        "AND state = 'active' AND wait_event = 'PgSleep'",
        [f"corral-gateway:{agent}"],
    )
    return int(rows[0][0])


async def _until_sleeping(dsn: str, agent: str, count: int) -> None:
    deadline = time.monotonic() + 10
    while _sleeping(dsn, agent) < count:
        assert time.monotonic() < deadline, f"{agent} never had {count} statements sleeping"
        await asyncio.sleep(0.005)


async def test_an_agent_at_its_limit_is_refused_at_once_while_it_holds_the_connection(
    shop_dsn: str,
) -> None:
    async with Gateway.connect(shop_dsn, pool_size=1, statement_timeout_s=20) as gw:
        held = asyncio.create_task(gw.query("hog", {"sql": "SELECT gw_sleep(15)"}))
        await _until_sleeping(shop_dsn, "hog", 1)
        assert gw.connections_in_use("hog") == 1
        started = time.perf_counter()
        with pytest.raises(GatewayError) as info:
            await gw.query("hog", POINT_READ)
        elapsed = time.perf_counter() - started
        assert not held.done()  # refused while the connection is still held
        assert elapsed < 0.1, elapsed  # milliseconds, not the statement timeout
        error = info.value
        assert error.code == "pool_exhausted"
        assert error.retryable is True
        assert error.details == {"agent_id": "hog", "pool_size": 1, "in_use": 1}
        assert "pool_size=1" in error.message
        # Writes are refused the same way, before their key is claimed.
        with pytest.raises(GatewayError) as write:
            await gw.query(
                "hog",
                {"op": "delete", "table": "refunds", "where": {"id": 1}, "idempotency_key": "k"},
            )
        assert write.value.code == "pool_exhausted"
        assert fetch(shop_dsn, "SELECT count(*) FROM corral.gateway_journal") == [(0,)]

        assert await gw.drain("hog") is True
        with pytest.raises(GatewayError) as drained:
            await asyncio.wait_for(held, 5)  # cancelled on the server, not after 15 s
        assert drained.value.code == "database_unavailable"
        assert "drained" in drained.value.message
        assert gw.connections_in_use("hog") == 0
        assert await gw.drain("hog") is False
        # The next request opens a fresh pool.
        assert (await gw.query("hog", POINT_READ)).rows == [{"id": 3, "status": "paid"}]


async def test_an_agent_holding_all_its_connections_does_not_block_another(shop_dsn: str) -> None:
    async with Gateway.connect(shop_dsn, pool_size=2, statement_timeout_s=20) as gw:
        hogs = [
            asyncio.create_task(gw.query("hog", {"sql": "SELECT gw_sleep(15)"})) for _ in range(2)
        ]
        await _until_sleeping(shop_dsn, "hog", 2)
        assert gw.connections_in_use("hog") == 2
        for _ in range(20):
            result = await gw.query("reader", POINT_READ)
            assert result.rows == [{"id": 3, "status": "paid"}]
        # All twenty answered while both of the hog's statements were still sleeping.
        assert not any(h.done() for h in hogs)
        assert _sleeping(shop_dsn, "hog") == 2
        await gw.drain("hog")
        for hog in hogs:
            with pytest.raises(GatewayError) as info:
                await asyncio.wait_for(hog, 5)
            assert info.value.code == "database_unavailable"


async def test_concurrent_requests_of_one_agent_share_its_limit(shop_dsn: str) -> None:
    async with Gateway.connect(shop_dsn, pool_size=3, statement_timeout_s=20) as gw:
        outcomes = await asyncio.gather(
            *(gw.query("busy", {"sql": "SELECT gw_sleep(0.3)"}) for _ in range(8)),
            return_exceptions=True,
        )
    answered = [o for o in outcomes if not isinstance(o, BaseException)]
    refused = [o for o in outcomes if isinstance(o, GatewayError)]
    assert len(answered) == 3
    assert len(refused) == 5
    assert {e.code for e in refused} == {"pool_exhausted"}


async def test_a_connection_left_in_a_transaction_is_closed_not_reused(shop_dsn: str) -> None:
    pools = AgentPools(
        shop_dsn, pool_size=1, connect_timeout_s=5, connect_kwargs={"autocommit": True}
    )
    try:
        async with pools.lease("a") as lease:
            first = lease.conn
            await first.execute("BEGIN")
            assert pools.in_use("a") == 1
        assert first.closed
        assert pools.in_use("a") == 0
        async with pools.lease("a") as lease:
            assert lease.conn is not first
            assert lease.conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            reused = lease.conn
        async with pools.lease("a") as lease:
            assert lease.conn is reused
    finally:
        await pools.close()
    with pytest.raises(GatewayError) as info:
        async with pools.lease("a"):
            pass
    assert info.value.code == "database_unavailable"


async def test_leases_are_counted_per_agent(shop_dsn: str) -> None:
    pools = AgentPools(
        shop_dsn, pool_size=2, connect_timeout_s=5, connect_kwargs={"autocommit": True}
    )
    try:
        async with pools.lease("a"), pools.lease("a"):
            assert pools.in_use("a") == 2
            with pytest.raises(GatewayError) as info:
                async with pools.lease("a"):
                    pass
            assert info.value.code == "pool_exhausted"
            async with pools.lease("b"), pools.lease("b"):
                assert (pools.in_use("a"), pools.in_use("b")) == (2, 2)
            assert set(pools.agents) == {"a", "b"}
        assert pools.in_use("a") == 0
    finally:
        await pools.close()


async def test_a_database_that_does_not_answer_is_unavailable(postgres_admin_dsn: str) -> None:
    pools = AgentPools(
        "postgresql://postgres@127.0.0.1:1/none",
        pool_size=1,
        connect_timeout_s=0.5,
        connect_kwargs={"connect_timeout": 2},
    )
    try:
        with pytest.raises(GatewayError) as info:
            async with pools.lease("a"):
                pass
        assert info.value.code == "database_unavailable"
        assert info.value.retryable is True
        assert "0.5 s" in info.value.message
        await settle(lambda: pools.in_use("a") == 0)
    finally:
        await pools.close()


async def test_draining_while_a_connection_is_being_opened_is_unavailable(shop_dsn: str) -> None:
    pools = AgentPools(
        shop_dsn, pool_size=1, connect_timeout_s=5, connect_kwargs={"autocommit": True}
    )
    entered: list[Any] = []

    async def use() -> None:
        async with pools.lease("a") as lease:
            entered.append(lease)

    try:
        task = asyncio.create_task(use())
        await settle(lambda: pools.in_use("a") == 1)
        assert entered == []  # still opening its connection
        await pools.drain("a")
        with pytest.raises(GatewayError) as info:
            await task
        assert info.value.code == "database_unavailable"
        assert "drained while one was being opened" in info.value.message
        assert entered == []
    finally:
        await pools.close()
