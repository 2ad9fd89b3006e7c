"""One agent holding every connection it may have cannot slow another agent down.

What makes it true, checked without timing: each agent has connections of its own (no shared
pool, no queue in front of the database), an agent at its limit is refused before anything is
looked for or opened, and another agent's requests run on its own connections while the first
agent's statements are provably still running on the server.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from corral.gateway import Gateway, GatewayError
from tests.gateway.gateway_support import fetch, shop_dsn

__all__ = ["shop_dsn"]

pytestmark = pytest.mark.postgres

POINT_READ = {"sql": "SELECT id, status FROM orders WHERE id = $1", "params": [3]}
LONG_READ = {"sql": "SELECT gw_sleep(20)"}


def _backends(dsn: str, agent: str) -> dict[int, str]:
    """``{pid: state}`` of the server backends of ``agent``'s connections."""
    rows = fetch(
        dsn,
        "SELECT pid, state FROM pg_stat_activity "
        "WHERE datname = current_database() AND application_name = %s",
        [f"corral-gateway:{agent}"],
    )
    return {int(pid): str(state) for pid, state in rows}


def _sleeping(dsn: str, agent: str) -> set[int]:
    rows = fetch(
        dsn,
        "SELECT pid FROM pg_stat_activity "
        "WHERE datname = current_database() AND application_name = %s "
        "AND state = 'active' AND wait_event = 'PgSleep'",
        [f"corral-gateway:{agent}"],
    )
    return {int(pid) for (pid,) in rows}


async def _until_sleeping(dsn: str, agent: str, count: int) -> set[int]:
    deadline = time.monotonic() + 10
    while len(pids := _sleeping(dsn, agent)) < count:
        assert time.monotonic() < deadline, f"{agent} never had {count} statements sleeping"
        await asyncio.sleep(0.005)
    return pids


async def _hold_everything(gw: Gateway, dsn: str, agent: str, size: int) -> tuple[Any, set[int]]:
    """Start ``size`` long reads for ``agent`` and wait until all of them run on the server."""
    held = [asyncio.create_task(gw.query(agent, LONG_READ)) for _ in range(size)]
    pids = await _until_sleeping(dsn, agent, size)
    assert gw.connections_in_use(agent) == size
    return held, pids


async def _release(gw: Gateway, agent: str, held: list[Any]) -> None:
    await gw.drain(agent)
    for task in held:
        with pytest.raises(GatewayError) as info:
            await asyncio.wait_for(task, 5)
        assert info.value.code == "database_unavailable"


async def test_an_agent_at_its_limit_is_refused_without_touching_the_database(
    shop_dsn: str,
) -> None:
    async with Gateway.connect(shop_dsn, pool_size=2, statement_timeout_s=30) as gw:
        held, pids = await _hold_everything(gw, shop_dsn, "hog", 2)
        backends = _backends(shop_dsn, "hog")
        for request in (
            POINT_READ,
            {"op": "count", "table": "orders"},
            {"op": "delete", "table": "refunds", "where": {"id": 1}, "idempotency_key": "k"},
        ):
            with pytest.raises(GatewayError) as info:
                await gw.query("hog", request)
            assert info.value.code == "pool_exhausted"
            assert info.value.retryable is True
        # Refused while both statements still sleep: the refusal waited for neither of them,
        # opened no connection and claimed no key.
        assert _sleeping(shop_dsn, "hog") == pids
        assert _backends(shop_dsn, "hog").keys() == backends.keys()
        assert not any(task.done() for task in held)
        assert fetch(shop_dsn, "SELECT count(*) FROM corral.gateway_journal") == [(0,)]
        await _release(gw, "hog", held)


async def test_another_agent_reads_and_writes_on_its_own_connections_meanwhile(
    shop_dsn: str,
) -> None:
    async with Gateway.connect(shop_dsn, pool_size=2, statement_timeout_s=30) as gw:
        held, hog_pids = await _hold_everything(gw, shop_dsn, "hog", 2)
        for i in range(30):
            result = await gw.query("reader", POINT_READ)
            assert result.rows == [{"id": 3, "status": "paid"}]
            assert gw.connections_in_use("hog") == 2
            if i % 10 == 0:
                # The reader's statements run on the reader's backends, never the hog's.
                reader = _backends(shop_dsn, "reader")
                assert reader
                assert not reader.keys() & hog_pids
        for i in range(5):
            written = await gw.query(
                "reader",
                {
                    "sql": "INSERT INTO refunds (id, order_id, amount) VALUES ($1, 4, 1)",
                    "params": [100 + i],
                    "idempotency_key": f"w-{i}",
                },
            )
            assert (written.status, written.row_count) == ("ok", 1)
        # Every answer came while both of the hog's statements were still sleeping.
        assert _sleeping(shop_dsn, "hog") == hog_pids
        assert not any(task.done() for task in held)
        assert gw.connections_in_use("reader") == 0
        assert len(_backends(shop_dsn, "reader")) <= 2  # its own pool, within its own limit
        await _release(gw, "hog", held)
    assert fetch(shop_dsn, "SELECT count(*) FROM refunds") == [(5,)]


async def test_many_agents_at_their_limit_leave_others_untouched(shop_dsn: str) -> None:
    async with Gateway.connect(shop_dsn, pool_size=1, statement_timeout_s=30) as gw:
        hogs = [f"hog-{n}" for n in range(4)]
        holding = [await _hold_everything(gw, shop_dsn, hog, 1) for hog in hogs]
        readers = [f"reader-{n}" for n in range(3)]
        results = await asyncio.gather(*(gw.query(reader, POINT_READ) for reader in readers))
        assert [r.rows for r in results] == [[{"id": 3, "status": "paid"}]] * len(readers)
        for hog, (held, pids) in zip(hogs, holding, strict=True):
            assert _sleeping(shop_dsn, hog) == pids
            assert not any(task.done() for task in held)
        for hog, (held, _) in zip(hogs, holding, strict=True):
            await _release(gw, hog, held)


async def test_a_drained_agent_does_not_disturb_another_agents_statement(shop_dsn: str) -> None:
    async with Gateway.connect(shop_dsn, pool_size=1, statement_timeout_s=30) as gw:
        held, _ = await _hold_everything(gw, shop_dsn, "hog", 1)
        other = asyncio.create_task(gw.query("reader", {"sql": "SELECT gw_sleep(1) AS slept"}))
        await _until_sleeping(shop_dsn, "reader", 1)
        await _release(gw, "hog", held)  # cancels the hog's statement on the server
        assert (await other).rows == [{"slept": 1}]
