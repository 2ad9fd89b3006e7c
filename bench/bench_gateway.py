"""The database gateway against direct psycopg, side by side on the same PostgreSQL database.

Goals (issue: the database gateway): a primary-key read's p50 at most 1.3x a direct pooled
psycopg read; a keyed insert's p50 at most 1.6x a plain insert; a replay (same key, same work)
no slower than a direct point read; and isolation: one agent holding all its connections in
long statements slows another agent's point reads by at most 10 % at the median. Also the cost
of analysing (parse + validate) a two-table join with a cold and a warm cache. Run with
``.venv/bin/python -m bench bench_gateway``. Needs a server at ``CORRAL_BENCH_PG`` (default
postgresql://postgres@127.0.0.1:5432/postgres): the benchmark creates its own database there
and drops it afterwards; without a server it prints a note and skips.

Each pair is measured alternately (gateway, direct, direct, gateway, ...) over the same
connection sizes, so drift on the machine affects both sides alike. Direct psycopg runs with
its defaults (an ``AsyncConnectionPool`` of autocommit connections, which prepare a statement
after its fifth execution); the gateway prepares every statement on its connections itself.
The isolation figures alternate rounds of the reader alone and the reader while the hog's
``pool_size`` connections sleep in the server (checked to be still sleeping after each round),
each side first in every other round and measured after a short pause and a few unmeasured
reads, so that opening and closing the hog's connections weighs on neither side.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import os
import random
import statistics
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool
from tests.gateway.corpus import load_shop_postgres

from bench._harness import row
from corral.gateway import Catalog, Gateway
from corral.gateway.postgres._sql import SqlAnalyzer

PG_ADMIN = os.environ.get("CORRAL_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
ORDERS = 10_000
READS = 3_000
INSERTS = 2_000
REPLAYS = 2_000
ANALYSES = 2_000
ISOLATION_READS = 2_000  # per side, over ISOLATION_ROUNDS rounds of each
ISOLATION_ROUNDS = 40
# Before each round's measured reads, both sides alike: a pause (the machine settles after
# the hog's connections open or close), then unmeasured reads.
SETTLE_S = 0.02
PHASE_WARMUP = 10
WARMUP = 200
POOL_SIZE = 2
AGENT = "bench-agent"
HOG = "bench-hog"
READER = "bench-reader"

READ_GW = "SELECT id, customer_id, status, total, created_at, meta FROM orders WHERE id = $1"
READ_PG = "SELECT id, customer_id, status, total, created_at, meta FROM orders WHERE id = %s"
WIDE = "SELECT id, customer_id, status, total, created_at, meta FROM orders WHERE id > {} "
WIDE_ROWS = 1000  # the gateway's default max_rows: the widest read it answers whole
WIDE_READS = 300
INSERT_GW = "INSERT INTO bench_events (id, order_id, amount) VALUES ($1, $2, $3)"
INSERT_PG = "INSERT INTO bench_events (id, order_id, amount) VALUES (%s, %s, %s)"
JOIN_SQL = (
    "SELECT o.id, c.name, o.total FROM orders o JOIN customers c ON c.id = o.customer_id "
    "WHERE o.status = $1 AND c.country = $2 ORDER BY o.created_at DESC LIMIT 20"
)
EXTRA_ROWS = (
    # 10,000 more orders over the six customers of the shop (ids 1..10 are the corpus's).
    f"INSERT INTO orders (id, customer_id, status, total, created_at, meta) "
    f"SELECT g, 1 + g % 6, (ARRAY['paid', 'open', 'shipped', 'refunded'])[1 + g % 4], "
    f"(g % 997) / 10.0, timestamptz '2024-01-01' + g * interval '7 minutes', "
    f"CASE WHEN g % 3 = 0 THEN jsonb_build_object('channel', 'web') END "
    f"FROM generate_series(11, {ORDERS + 10}) AS g",
    "CREATE TABLE bench_events (id bigint PRIMARY KEY, order_id integer NOT NULL, "
    "amount numeric(10, 2) NOT NULL)",
    # The gateway refuses pg_sleep itself, not a function that calls it.
    "CREATE FUNCTION bench_sleep(seconds float8) RETURNS integer LANGUAGE sql VOLATILE "
    "AS 'SELECT 1 FROM pg_sleep(seconds)'",
    "ANALYZE",
)


@asynccontextmanager
async def bench_database() -> AsyncIterator[str]:
    """A fresh database holding the shop plus ORDERS orders; dropped on exit."""
    name = f"corral_bench_gw_{uuid.uuid4().hex[:8]}"
    async with await psycopg.AsyncConnection.connect(PG_ADMIN, autocommit=True) as admin:
        await admin.execute(f'CREATE DATABASE "{name}"')
    dsn = PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"
    try:
        with psycopg.connect(dsn) as conn:
            load_shop_postgres(conn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            for statement in EXTRA_ROWS:
                conn.execute(statement)
        yield dsn
    finally:
        async with await psycopg.AsyncConnection.connect(PG_ADMIN, autocommit=True) as admin:
            await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def _connect_gateway(dsn: str, **options: Any) -> Any:
    # A ``breaker=`` argument may or may not exist yet: pass None only when it does.
    extra: dict[str, Any] = {}
    if "breaker" in inspect.signature(Gateway.connect).parameters:
        extra["breaker"] = None
    return Gateway.connect(dsn, pool_size=POOL_SIZE, **extra, **options)


Call = Callable[[int], Awaitable[object]]


async def paired(a: Call, b: Call, n: int) -> tuple[list[int], list[int]]:
    """Nanoseconds per call of ``a(i)`` and ``b(i)`` for i < n, alternating which goes first."""
    for i in range(WARMUP):
        await a(-1 - i)
        await b(-1 - i)
    gc.collect()
    times_a: list[int] = []
    times_b: list[int] = []
    for i in range(n):
        order = ((a, times_a), (b, times_b)) if i % 2 == 0 else ((b, times_b), (a, times_a))
        for fn, times in order:
            start = time.perf_counter_ns()
            await fn(i)
            times.append(time.perf_counter_ns() - start)
    return times_a, times_b


def pct(times: list[int], q: float) -> float:
    """The ``q`` quantile (0..1) of ``times``, in microseconds."""
    ordered = sorted(times)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] / 1000


def us(value: float) -> str:
    return f"{value:,.0f} µs"


def verdict(ok: bool) -> str:
    return "met" if ok else "**not met**"


async def run_pairs(dsn: str) -> list[str]:
    rng = random.Random(5)
    lines = [
        row(
            "operation",
            "gateway p50",
            "gateway p99",
            "direct p50",
            "direct p99",
            "p50 ratio",
            "p99 ratio",
            "goal",
            "met?",
        ),
        row(*["---"] * 9),
    ]
    pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] = AsyncConnectionPool(
        dsn, min_size=POOL_SIZE, max_size=POOL_SIZE, kwargs={"autocommit": True}, open=False
    )
    await pool.open(wait=True)
    try:
        async with _connect_gateway(dsn) as gw:

            async def gw_read(_: int) -> object:
                order_id = rng.randint(1, ORDERS + 10)
                result = await gw.query(AGENT, {"sql": READ_GW, "params": [order_id]})
                return result

            async def pg_read(_: int) -> object:
                order_id = rng.randint(1, ORDERS + 10)
                async with pool.connection() as conn:
                    cur = await conn.execute(READ_PG, [order_id])
                    return await cur.fetchall()

            gw_times, pg_times = await paired(gw_read, pg_read, READS)
            lines.append(_line("primary-key read", gw_times, pg_times, 1.3))

            wide_gw = WIDE.format("$1") + f"ORDER BY id LIMIT {WIDE_ROWS}"
            wide_pg = WIDE.format("%s") + f"ORDER BY id LIMIT {WIDE_ROWS}"

            async def gw_wide(_: int) -> object:
                start = rng.randint(0, ORDERS - WIDE_ROWS)
                result = await gw.query(AGENT, {"sql": wide_gw, "params": [start]})
                if result.row_count != WIDE_ROWS:
                    raise RuntimeError(f"a wide read gave {result.row_count} rows")
                return result

            async def pg_wide(_: int) -> object:
                start = rng.randint(0, ORDERS - WIDE_ROWS)
                async with pool.connection() as conn:
                    cur = await conn.execute(wide_pg, [start])
                    return await cur.fetchall()

            gw_times, pg_times = await paired(gw_wide, pg_wide, WIDE_READS)
            lines.append(_line(f"{WIDE_ROWS:,}-row read", gw_times, pg_times, 1.5))

            # Disjoint id ranges: gateway ids are even, direct ids odd; warm-up ids negative.
            async def gw_insert(i: int) -> object:
                event_id = 2 * i
                return await gw.query(
                    AGENT,
                    {
                        "sql": INSERT_GW,
                        "params": [event_id, 1 + i % ORDERS if i >= 0 else 1, "9.99"],
                        "idempotency_key": f"insert-{event_id}",
                    },
                )

            async def pg_insert(i: int) -> object:
                async with pool.connection() as conn:
                    await conn.execute(
                        INSERT_PG, [2 * i + 1, 1 + i % ORDERS if i >= 0 else 1, "9.99"]
                    )
                return None

            gw_times, pg_times = await paired(gw_insert, pg_insert, INSERTS)
            lines.append(_line("keyed insert vs plain insert", gw_times, pg_times, 1.6))

            replayed = {
                "sql": INSERT_GW,
                "params": [10**12, 1, "1.00"],
                "idempotency_key": "the-replayed-one",
            }
            first = await gw.query(AGENT, replayed)
            if first.status != "ok":
                raise RuntimeError(f"the first run of the replayed insert was {first.status}")

            async def gw_replay(_: int) -> object:
                result = await gw.query(AGENT, replayed)
                if result.status != "replayed":
                    raise RuntimeError(f"a replay came back {result.status}")
                return result

            gw_times, pg_times = await paired(gw_replay, pg_read, REPLAYS)
            lines.append(_line("replay vs direct point read", gw_times, pg_times, 1.0))
            analysis = analysis_lines(gw.catalog)
    finally:
        await pool.close()
    return [*lines, "", *analysis]


def _line(name: str, gw: list[int], direct: list[int], goal: float) -> str:
    gw50, gw99, pg50, pg99 = pct(gw, 0.5), pct(gw, 0.99), pct(direct, 0.5), pct(direct, 0.99)
    ratio = gw50 / pg50
    goal_text = f"p50 ≤ {goal:g}x" if goal != 1.0 else "p50 ≤ direct read"
    return row(
        name,
        us(gw50),
        us(gw99),
        us(pg50),
        us(pg99),
        f"{ratio:.2f}x",
        f"{gw99 / pg99:.2f}x",
        goal_text,
        verdict(ratio <= goal),
    )


def analysis_lines(catalog: Catalog) -> list[str]:
    """analyze() of a two-table join: a cleared cache before each call, then a warm one."""
    analyzer = SqlAnalyzer(cache_size=16)
    cold: list[int] = []
    warm: list[int] = []
    gc.collect()
    for _ in range(ANALYSES):
        analyzer.clear()
        start = time.perf_counter_ns()
        analyzer.analyze(JOIN_SQL, catalog)
        cold.append(time.perf_counter_ns() - start)
    for _ in range(ANALYSES):
        start = time.perf_counter_ns()
        analyzer.analyze(JOIN_SQL, catalog)
        warm.append(time.perf_counter_ns() - start)
    return [
        row("analyze() of a two-table join", "p50", "p99", "mean"),
        row("---", "---", "---", "---"),
        row(
            "cold cache (cleared each call)",
            us(pct(cold, 0.5)),
            us(pct(cold, 0.99)),
            us(statistics.fmean(cold) / 1000),
        ),
        row(
            "warm cache",
            f"{pct(warm, 0.5):,.2f} µs",
            f"{pct(warm, 0.99):,.2f} µs",
            f"{statistics.fmean(warm) / 1000:,.2f} µs",
        ),
    ]


async def _sleeping(admin: psycopg.AsyncConnection[Any], agent: str) -> int:
    cur = await admin.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
        "AND state = 'active' AND wait_event = 'PgSleep'",
        [f"corral-gateway:{agent}"],
    )
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def _hold(gw: Gateway, admin: psycopg.AsyncConnection[Any]) -> list[asyncio.Task[Any]]:
    """The hog's ``POOL_SIZE`` long reads, once all of them sleep in the server."""
    held = [
        asyncio.create_task(gw.query(HOG, {"sql": "SELECT bench_sleep(60)"}))
        for _ in range(POOL_SIZE)
    ]
    deadline = time.monotonic() + 10
    while await _sleeping(admin, HOG) < POOL_SIZE:
        if time.monotonic() > deadline or any(t.done() for t in held):
            raise RuntimeError("the hog's statements never all ran")
        await asyncio.sleep(0.005)
    return held


async def run_isolation(dsn: str) -> list[str]:
    """The reader's point reads alone, then while the hog holds every connection it may have;
    alternating rounds, the same reader pool throughout."""
    rng = random.Random(7)
    alone: list[int] = []
    beside: list[int] = []
    per_round = ISOLATION_READS // ISOLATION_ROUNDS
    async with (
        _connect_gateway(dsn, statement_timeout_s=120) as gw,
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as admin,
    ):

        async def read_rounds(times: list[int], n: int) -> None:
            for _ in range(n):
                params = [rng.randint(1, ORDERS + 10)]
                start = time.perf_counter_ns()
                await gw.query(READER, {"sql": READ_GW, "params": params})
                times.append(time.perf_counter_ns() - start)

        async def beside_hog() -> None:
            held = await _hold(gw, admin)
            await asyncio.sleep(SETTLE_S)
            gc.collect()
            await read_rounds([], PHASE_WARMUP)
            await read_rounds(beside, per_round)
            if any(t.done() for t in held) or await _sleeping(admin, HOG) < POOL_SIZE:
                raise RuntimeError("the hog let go of a connection during the round")
            await gw.drain(HOG)
            await asyncio.gather(*held, return_exceptions=True)

        await read_rounds([], WARMUP)
        for n in range(ISOLATION_ROUNDS):
            # Alone first in even rounds, beside the hog first in odd ones, so that drift on
            # the machine falls on both sides alike.
            if n % 2:
                await beside_hog()
            await asyncio.sleep(SETTLE_S)
            gc.collect()
            await read_rounds([], PHASE_WARMUP)
            await read_rounds(alone, per_round)
            if not n % 2:
                await beside_hog()
    a50, a99, b50, b99 = pct(alone, 0.5), pct(alone, 0.99), pct(beside, 0.5), pct(beside, 0.99)
    ratio = b50 / a50
    return [
        row(
            f"reader's point read, hog holding all {POOL_SIZE} of its connections",
            "alone p50",
            "alone p99",
            "beside hog p50",
            "beside hog p99",
            "p50 ratio",
            "p99 ratio",
            "goal",
            "met?",
        ),
        row(*["---"] * 9),
        row(
            f"{len(alone):,} reads per side, {ISOLATION_ROUNDS} rounds each",
            us(a50),
            us(a99),
            us(b50),
            us(b99),
            f"{ratio:.2f}x",
            f"{b99 / a99:.2f}x",
            "p50 ≤ 1.1x",
            verdict(ratio <= 1.1),
        ),
    ]


async def run() -> list[str]:
    async with bench_database() as dsn:
        pairs = await run_pairs(dsn)
        isolation = await run_isolation(dsn)
        return [*pairs, "", *isolation]


def main() -> None:
    try:
        with psycopg.connect(PG_ADMIN, connect_timeout=3):
            pass
    except psycopg.OperationalError as exc:
        print(f"PostgreSQL at CORRAL_BENCH_PG is not reachable ({exc}); skipped.")
        return
    print(
        f"PostgreSQL, {ORDERS:,} extra orders, pools of {POOL_SIZE}; sequential calls, "
        f"{READS:,} reads / {INSERTS:,} inserts / {REPLAYS:,} replays per side, alternating.\n"
    )
    for line in asyncio.run(run()):
        print(line)


if __name__ == "__main__":
    main()
