"""Statements too long or too deep for analysis are refused with ``statement_too_complex``
before any parser can crash; long statements are analysed off the event loop, one per agent at
a time; nothing but ``GatewayError`` leaves ``query()``. Both engines."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from corral.daemon import http_status
from corral.gateway import Gateway, GatewayError
from corral.kernel import InvalidArgumentError
from tests.gateway.corpus import shop_sqlite_file
from tests.gateway.gateway_support import AGENT, refused, shop_dsn
from tests.support.polling import idle, settle

__all__ = ["shop_dsn"]

REPO = Path(__file__).resolve().parents[2]
CHAIN_200KB = "SELECT 1" + "+1" * 100_000
CHAIN_2000 = "SELECT 1" + "+1" * 2_000


@pytest.fixture(params=[pytest.param("postgresql", marks=pytest.mark.postgres), "sqlite"])
def dsn(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{shop_sqlite_file(tmp_path)}"
    return str(request.getfixturevalue("shop_dsn"))


@pytest.fixture
async def gw(dsn: str) -> AsyncIterator[Gateway]:
    # Analysis alone is under test: no breakers to freeze the agent on refusals.
    async with Gateway.connect(dsn, breaker=None) as gateway:
        yield gateway


def _engine(gw: Gateway) -> str:
    return "sqlite" if type(gw._engine).__name__.startswith("SQLite") else "postgresql"


# --- one request cannot kill the process ------------------------------------------------------

_CHILD = """
import asyncio, sys
from corral.gateway import Gateway, GatewayError

async def main(dsn):
    sql = "SELECT 1" + "+1" * 100_000
    for limit in (100_000, 1_000_000):
        async with Gateway.connect(dsn, breaker=None, max_statement_chars=limit) as gw:
            try:
                await gw.query("a", {"sql": sql})
            except GatewayError as exc:
                print(exc.code, sorted(exc.details), flush=True)
            print("alive", (await gw.query("a", {"sql": "SELECT 1 AS one"})).rows, flush=True)

asyncio.run(main(sys.argv[1]))
"""


@pytest.mark.postgres
def test_a_200kb_operator_chain_is_refused_and_the_process_survives(shop_dsn: str) -> None:
    # Parsed on the test's own thread, libpg_query overflowed the C stack: SIGSEGV.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "src")])}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, shop_dsn],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=REPO,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == [
        # refused by length at the default limit, by depth under a limit that takes it
        "statement_too_complex ['chars', 'limit']",
        "alive [{'one': 1}]",
        "statement_too_complex ['depth', 'limit']",
        "alive [{'one': 1}]",
    ]


async def test_a_2000_term_chain_is_too_complex_not_an_internal_error(gw: Gateway) -> None:
    error = await refused(gw, {"sql": CHAIN_2000})
    assert error.code == "statement_too_complex"
    assert error.retryable is False
    assert http_status(error) == 400
    assert str(error.details["limit"]) in error.message
    if _engine(gw) == "postgresql":
        assert error.details["depth"] == 4011
        assert "4011" in error.message


# The line between big legal statements and refused ones, per engine: (legal, refused).
_LINES: dict[str, list[tuple[str, str, str]]] = {
    "postgresql": [
        # libpg_query's tree: 2 levels per chained operator, 5 per CASE, 7 per subquery
        ("chain", "SELECT 1" + "+1" * 240, "SELECT 1" + "+1" * 250),
        ("case", _c := "SELECT " + "CASE WHEN true THEN " * 95 + "1" + " END" * 95, _c + "+1" * 20),
        (
            "subquery",
            "SELECT " + "(SELECT " * 65 + "1" + ")" * 65,
            "SELECT " + "(SELECT " * 75 + "1" + ")" * 75,
        ),
        # parentheses add no level to the tree; bison's own stack holds 10,000
        (
            "parens",
            "SELECT " + "(" * 5000 + "1" + ")" * 5000,
            "SELECT " + "(" * 12000 + "1" + ")" * 12000,
        ),
    ],
    "sqlite": [
        # SQLITE_MAX_EXPR_DEPTH (1000) and the parser's stack (100 entries)
        ("chain", "SELECT 1" + "+1" * 990, "SELECT 1" + "+1" * 1010),
        ("parens", "SELECT " + "(" * 90 + "1" + ")" * 90, "SELECT " + "(" * 100 + "1" + ")" * 100),
        (
            "subquery",
            "SELECT " + "(SELECT " * 15 + "1" + ")" * 15,
            "SELECT " + "(SELECT " * 25 + "1" + ")" * 25,
        ),
    ],
}


async def test_big_legal_statements_pass_and_the_next_step_is_refused(gw: Gateway) -> None:
    for name, legal, deeper in _LINES[_engine(gw)]:
        result = await gw.query(AGENT, {"sql": legal + " AS x"})
        assert len(result.rows) == 1, name
        error = await refused(gw, {"sql": deeper + " AS x"})
        assert error.code == "statement_too_complex", (name, error.message)


async def test_long_lists_are_flat_and_pass(gw: Gateway) -> None:
    ids = ",".join(str(n) for n in range(10_000))  # ~50,000 characters: analysed off the loop
    result = await gw.query(AGENT, {"sql": f"SELECT count(*) AS n FROM orders WHERE id IN ({ids})"})
    assert result.rows[0]["n"] > 0
    # SQLite nests OR chains (at most 1000 deep): 900 terms pass on both engines
    where = " OR ".join(f"id = {n}" for n in range(900))
    result = await gw.query(AGENT, {"sql": f"SELECT count(*) AS n FROM orders WHERE {where}"})
    assert result.rows[0]["n"] > 0


# --- the length limit -------------------------------------------------------------------------


async def test_statements_past_max_statement_chars_are_refused_with_the_length(dsn: str) -> None:
    async with Gateway.connect(dsn, breaker=None, max_statement_chars=1_000) as gw:
        sql = "SELECT 1 AS x" + " " * (1_000 - 13)
        assert (await gw.query(AGENT, {"sql": sql})).rows == [{"x": 1}]
        error = await refused(gw, {"sql": sql + " "})
    assert error.code == "statement_too_complex"
    assert error.details == {"limit": 1_000, "chars": 1_001}
    assert "1001" in error.message
    assert "1000" in error.message


async def test_the_default_limit_refuses_a_long_statement(gw: Gateway) -> None:
    error = await refused(gw, {"sql": "SELECT 1" + " " * 100_000})
    assert error.details == {"limit": 100_000, "chars": 100_008}


@pytest.mark.parametrize("bad", [0, -1, 1_000_001, "10"])
def test_max_statement_chars_is_checked(bad: Any) -> None:
    with pytest.raises(InvalidArgumentError):
        Gateway.connect("sqlite:///x.db", max_statement_chars=bad)


# --- nothing but GatewayError leaves query() --------------------------------------------------


async def test_an_unexpected_failure_of_analysis_is_a_gateway_error_and_logged(
    gw: Gateway, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def broken(request: Any, catalog: Any) -> Any:
        raise KeyError("a bug in analysis")

    monkeypatch.setattr(gw._engine, "plan", broken)
    with caplog.at_level(logging.ERROR, logger="corral.gateway"):
        error = await refused(gw, {"sql": "SELECT 1"})
    assert error.code == "analysis_error"
    assert error.retryable is False
    assert http_status(error) == 500
    assert "KeyError" in error.message
    assert any(r.exc_info and r.exc_info[0] is KeyError for r in caplog.records)

    async def too_deep(request: Any, catalog: Any) -> Any:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(gw._engine, "plan", too_deep)
    assert (await refused(gw, {"sql": "SELECT 1"})).code == "statement_too_complex"


# --- one agent cannot stall the others --------------------------------------------------------


def _long_read(n: int, chars: int) -> dict[str, Any]:
    """A valid read of about ``chars`` characters, different for every ``n``."""
    first = n * 1_000_000
    ids = ",".join(str(first + i) for i in range(chars // (len(str(first + chars)) + 1)))
    return {"sql": f"SELECT count(*) AS n FROM orders WHERE id IN ({ids})"}


async def test_an_agent_with_a_long_statement_in_analysis_is_refused_another_at_once(
    gw: Gateway,
) -> None:
    first, second = _long_read(1, 60_000), _long_read(2, 60_000)
    answers = await asyncio.gather(
        gw.query("flood", first), gw.query("flood", second), return_exceptions=True
    )
    assert not isinstance(answers[0], BaseException)
    busy = answers[1]
    assert isinstance(busy, GatewayError)
    assert busy.code == "analysis_busy"
    assert busy.retryable is True
    assert http_status(busy) == 429
    # Another agent, and the same agent's short statements, are not held back.
    after = await asyncio.gather(
        gw.query("flood", _long_read(3, 60_000)),
        gw.query("other", _long_read(4, 60_000)),
        gw.query("flood", {"sql": "SELECT 1 AS one"}),
    )
    assert [len(a.rows) for a in after] == [1, 1, 1]


async def test_a_bystander_reads_while_another_agent_floods_with_long_statements(
    dsn: str,
) -> None:
    # Before: analysis ran on the event loop, and six 880 KB statements held a bystander's
    # SELECT 1 for 15-22 s. The bound is generous (machines and CI vary): the bystander's
    # median stays under 0.5 s while each statement takes ~0.5 s of analysis; only its
    # parse tree's json.loads (one C call, ~0.1 s) still holds the GIL against the loop.
    async with Gateway.connect(dsn, breaker=None, max_statement_chars=500_000) as gw:
        stop = asyncio.Event()
        analysed = 0
        codes: set[str] = set()

        async def flood(task: int) -> None:
            nonlocal analysed
            n = task * 1000
            while not stop.is_set():
                n += 1
                try:
                    await gw.query("flood", _long_read(n, 300_000))
                    analysed += 1
                except GatewayError as exc:
                    codes.add(exc.code)
                    await asyncio.sleep(0.005)  # pacing the retries, not waiting on a state

        # On SQLite the flood's statements also run on the engine's four worker threads, and
        # nothing yet caps one agent's share of them (PostgreSQL's per-agent pools do): six
        # flooding tasks can hold all four. Two leave room, so this measures the analysis.
        tasks = 2 if dsn.startswith("sqlite:") else 6
        floods = [asyncio.create_task(flood(t)) for t in range(tasks)]
        latencies = []
        try:
            for _ in range(10):
                started = time.perf_counter()
                await gw.query("bystander", {"sql": "SELECT 1 AS one"})
                latencies.append(time.perf_counter() - started)
                await asyncio.sleep(0.02)
        finally:
            stop.set()
            await asyncio.gather(*floods)
    assert analysed >= 1
    assert codes <= {"analysis_busy", "pool_exhausted"}  # the flood agent's own, retryable
    assert statistics.median(latencies) < 0.5, latencies


async def test_a_caller_that_gives_up_keeps_its_slot_until_its_analysis_ends(gw: Gateway) -> None:
    task = asyncio.ensure_future(gw.query("flood", _long_read(5, 60_000)))
    await idle(2)  # in analysis now
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    # Sending again at once does not start a second analysis beside the first.
    assert (await refused(gw, _long_read(6, 60_000), agent="flood")).code == "analysis_busy"
    await settle(lambda: "flood" not in gw._analysing)
    assert len((await gw.query("flood", _long_read(6, 60_000))).rows) == 1
