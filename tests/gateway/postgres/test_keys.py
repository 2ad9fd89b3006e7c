"""Keyed writes under concurrency and crashes: each key's work runs exactly once."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from corral.gateway import Gateway, GatewayError
from corral.gateway._journal import StoredResult, encode_result, fingerprint
from corral.gateway.postgres._plan import plan_request
from corral.runtime import FakeClock
from tests.gateway.crash_worker import AGENT as CRASH_AGENT
from tests.gateway.crash_worker import insert, kill_at_random_points
from tests.gateway.gateway_support import AGENT, fetch, refund, refused, shop_dsn
from tests.support.polling import settle

__all__ = ["shop_dsn"]

REPO = Path(__file__).resolve().parents[3]


# --- concurrency ------------------------------------------------------------------------------


@pytest.mark.postgres
async def test_twenty_tasks_with_one_key_run_the_write_once(shop_dsn: str) -> None:
    async with Gateway.connect(shop_dsn, pool_size=2) as gw:
        outcomes = await asyncio.gather(
            *(gw.query(AGENT, refund(1)) for _ in range(20)), return_exceptions=True
        )
        statuses = sorted(
            o.status if not isinstance(o, BaseException) else getattr(o, "code", repr(o))
            for o in outcomes
        )
        assert statuses.count("ok") == 1, statuses
        assert set(statuses) <= {"ok", "replayed", "idempotency_in_progress"}, statuses
        assert (await gw.query(AGENT, refund(1))).status == "replayed"
    assert int(fetch(shop_dsn, "SELECT count(*) FROM refunds")[0][0]) == 1


@pytest.mark.postgres
async def test_twenty_gateways_racing_on_one_key_run_it_once(shop_dsn: str) -> None:
    gateways = [await Gateway.connect(shop_dsn, key_wait_s=5) for _ in range(20)]
    try:
        outcomes = await asyncio.gather(*(gw.query(AGENT, refund(1)) for gw in gateways))
    finally:
        for gw in gateways:
            await gw.close()
    assert sorted(o.status for o in outcomes) == ["ok"] + ["replayed"] * 19
    assert int(fetch(shop_dsn, "SELECT count(*) FROM refunds")[0][0]) == 1


@pytest.mark.postgres
async def test_a_duplicate_of_a_running_key_waits_for_its_outcome(shop_dsn: str) -> None:
    clock = FakeClock()
    request = {
        "op": "update",
        "table": "orders",
        "where": {"id": 1},
        "set": {"status": "x"},
        "idempotency_key": "k",
    }
    with psycopg.connect(shop_dsn) as blocker:
        blocker.execute("SELECT * FROM orders WHERE id = 1 FOR UPDATE")
        async with Gateway.connect(shop_dsn, clock=clock, key_wait_s=1) as gw:
            first = asyncio.create_task(gw.query(AGENT, request))
            await _until_waiting_on_lock(shop_dsn)
            other_work = await refused(gw, {**request, "set": {"status": "y"}})
            assert other_work.code == "idempotency_conflict"
            assert "is running" in other_work.message
            duplicate = asyncio.create_task(gw.query(AGENT, request))
            await settle(lambda: clock.pending_timers == 1)
            clock.advance(1)  # the duplicate's wait runs out while the first is blocked
            error = await asyncio.wait_for(_raises(duplicate), 5)
            assert error.code == "idempotency_in_progress"
            assert error.retryable is True
            waiting = asyncio.create_task(gw.query(AGENT, request))
            await settle(lambda: clock.pending_timers == 1)
            blocker.rollback()  # releases the row: the first write finishes
            assert (await first).status == "ok"
            assert (await waiting).status == "replayed"
    assert fetch(shop_dsn, "SELECT status FROM orders WHERE id = 1") == [("x",)]


@pytest.mark.postgres
async def test_a_key_held_by_another_process_is_in_progress_then_replayed(shop_dsn: str) -> None:
    request = {
        "op": "update",
        "table": "orders",
        "where": {"id": 1},
        "set": {"status": "x"},
        "idempotency_key": "k",
    }
    with psycopg.connect(shop_dsn) as blocker:
        blocker.execute("SELECT * FROM orders WHERE id = 1 FOR UPDATE")
        async with (
            Gateway.connect(shop_dsn) as holder,
            Gateway.connect(shop_dsn, key_wait_s=0.05) as other,
        ):
            first = asyncio.create_task(holder.query(AGENT, request))
            await _until_waiting_on_lock(shop_dsn)
            started = time.monotonic()
            error = await refused(other, request)
            assert error.code == "idempotency_in_progress"
            assert error.retryable is True
            assert time.monotonic() - started < 2
            # Its fingerprint is not visible until it commits: a different write waits too.
            assert (await refused(other, {**request, "set": {"status": "y"}})).code == (
                "idempotency_in_progress"
            )
            blocker.rollback()
            assert (await first).status == "ok"
            assert (await other.query(AGENT, request)).status == "replayed"
            conflict = await refused(other, {**request, "set": {"status": "y"}})
            assert conflict.code == "idempotency_conflict"


@pytest.mark.postgres
async def test_a_write_over_the_timeout_is_rolled_back_with_its_key(shop_dsn: str) -> None:
    request = {
        "op": "update",
        "table": "orders",
        "where": {"id": 1},
        "set": {"status": "x"},
        "idempotency_key": "k",
    }
    with psycopg.connect(shop_dsn) as blocker:
        blocker.execute("SELECT * FROM orders WHERE id = 1 FOR UPDATE")
        async with Gateway.connect(shop_dsn, statement_timeout_s=0.2) as gw:
            error = await refused(gw, request)
            assert error.code == "statement_timeout"
            blocker.rollback()
            assert (await gw.query(AGENT, request)).status == "ok"
    assert fetch(shop_dsn, "SELECT count(*) FROM corral.gateway_journal") == [(1,)]


async def _until_waiting_on_lock(dsn: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        rows = fetch(
            dsn,
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND application_name LIKE 'corral-gateway:%%'",
        )
        if rows[0][0] >= 1:
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the write never waited on the row lock")


async def _raises(task: asyncio.Task[Any]) -> GatewayError:
    with pytest.raises(GatewayError) as info:
        await task
    return info.value


# --- the crash test ---------------------------------------------------------------------------


@pytest.mark.postgres
async def test_writes_killed_at_random_points_apply_exactly_once(shop_dsn: str) -> None:
    count, seed = 200, 5
    kills = await kill_at_random_points("postgresql", shop_dsn, count, seed)
    assert kills >= 4

    # A fresh gateway retries every write with its key.
    statuses: dict[str, int] = {}
    refusals: list[GatewayError] = []
    async with Gateway.connect(shop_dsn, pool_size=4, key_wait_s=2) as gw:
        for n in range(count):
            for _ in range(100):
                try:
                    result = await gw.query(CRASH_AGENT, insert(n))
                except GatewayError as exc:
                    refusals.append(exc)
                    await asyncio.sleep(0.01)  # a killed client's transaction is still ending
                    continue
                statuses[result.status] = statuses.get(result.status, 0) + 1
                break
    assert all(e.retryable for e in refusals), (seed, refusals)
    applied = fetch(shop_dsn, "SELECT n, count(*) FROM crash_writes GROUP BY n ORDER BY n")
    assert applied == [(n, 1) for n in range(count)], f"seed {seed}"
    assert sum(statuses.values()) == count
    assert statuses.get("replayed", 0) >= 5  # the writes done before the kills
    journal = fetch(
        shop_dsn,
        "SELECT count(*), count(*) FILTER (WHERE state = 'completed') FROM corral.gateway_journal",
    )
    assert journal == [(count, count)]


@pytest.mark.postgres
async def test_twenty_gateways_racing_on_a_write_without_returning_run_it_once(
    shop_dsn: str,
) -> None:
    request = {
        "sql": "INSERT INTO refunds (id, order_id, amount) VALUES ($1, 4, 5)",
        "params": [1],
        "idempotency_key": "refund-1",
    }
    gateways = [await Gateway.connect(shop_dsn, key_wait_s=5) for _ in range(20)]
    try:
        outcomes = await asyncio.gather(*(gw.query(AGENT, request) for gw in gateways))
    finally:
        for gw in gateways:
            await gw.close()
    assert sorted(o.status for o in outcomes) == ["ok"] + ["replayed"] * 19
    assert {o.row_count for o in outcomes} == {1}
    assert int(fetch(shop_dsn, "SELECT count(*) FROM refunds")[0][0]) == 1


@pytest.mark.postgres
@pytest.mark.parametrize("returning", [False, True])
async def test_a_key_journalled_by_a_transaction_without_its_lock_is_replayed(
    shop_dsn: str, returning: bool
) -> None:
    # A transaction that writes the journal row without taking the key's lock (as older
    # gateways did) commits first: the write waiting on its row is rolled back and replays.
    request: dict[str, Any] = {
        "sql": "INSERT INTO refunds (id, order_id, amount) VALUES ($1, 4, 5)"
        + (" RETURNING id" if returning else ""),
        "params": [1],
        "idempotency_key": "refund-1",
    }
    stored = (
        StoredResult(("id",), [{"id": 1}], 1, False)
        if returning
        else StoredResult((), [], 1, False)
    )
    with psycopg.connect(shop_dsn) as older:
        async with Gateway.connect(shop_dsn) as gw:
            planned = plan_request(request, gw.catalog)
            fp = fingerprint(planned.normalized(), planned.params, planned.plan_hash)
            older.execute(
                "INSERT INTO corral.gateway_journal (agent_id, key, plan_hash, fingerprint, "
                "state, result, created_at, completed_at) "
                "VALUES (%s, 'refund-1', '', %s, 'completed', %s::jsonb, now(), now())",
                [AGENT, fp, encode_result(stored)],
            )
            task = asyncio.create_task(gw.query(AGENT, request))
            await _until_waiting_on_lock(shop_dsn)
            older.commit()
            result = await asyncio.wait_for(task, 5)
    assert (result.status, result.row_count, result.rows) == ("replayed", 1, stored.rows)
    assert fetch(shop_dsn, "SELECT count(*) FROM refunds") == [(0,)]  # its write rolled back
