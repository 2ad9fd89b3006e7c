"""The gateway with its breakers: freezes at the threshold, refusals before analysis, drained
pools, evidence, reinstatement, persistence across gateways, and the public package."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

import corral.gateway
from corral.gateway import (
    BreakerPolicy,
    Freeze,
    Gateway,
    GatewayError,
    QueryOutcome,
    Reinstatement,
)
from corral.kernel import InvalidArgumentError, UsageError
from corral.runtime import FakeClock
from tests.gateway.gateway_support import AGENT, fetch, refused, shop_dsn
from tests.support.polling import settle

__all__ = ["shop_dsn"]

pytestmark = pytest.mark.postgres

OTHER = "agent-8"
POINT_READ = {"sql": "SELECT id, status FROM orders WHERE id = $1", "params": [3]}
POINT_ROWS = [{"id": 3, "status": "paid"}]
MISSPELT = ("SELECT statuss FROM orders", "SELECT totl FROM orders", "SELECT nme FROM customers")
SLOW = {"sql": "SELECT gw_sleep(15)"}
STRICT = BreakerPolicy(window_s=60, max_errors=3, max_refusals=3, max_suspicious_empties=2)


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


async def _freeze_by_refusals(gw: Gateway, agent: str = AGENT) -> None:
    for sql in MISSPELT:
        error = await refused(gw, {"sql": sql}, agent)
        assert error.code == "unknown_column"


async def _settled(call: Callable[[], Any]) -> Any:
    """``call()``, awaited when it returns a coroutine (methods both sync and async)."""
    result = call()
    return await result if asyncio.iscoroutine(result) else result


# --- freezing ---------------------------------------------------------------------------------


async def test_refusals_freeze_the_agent_at_the_threshold_with_the_requests_as_evidence(
    shop_dsn: str,
) -> None:
    clock = FakeClock()
    async with Gateway.connect(shop_dsn, breaker=STRICT, clock=clock) as gw:
        for sql in MISSPELT[:2]:
            assert (await refused(gw, {"sql": sql})).code == "unknown_column"
        assert gw.status(AGENT).frozen is False
        assert gw.status(AGENT).counts["refusals"] == 2
        # The third refusal is answered as itself, and freezes.
        assert (await refused(gw, {"sql": MISSPELT[2]})).code == "unknown_column"
        status = gw.status(AGENT)
        assert status.frozen is True
        freeze = status.freeze
        assert freeze is not None
        assert (freeze.signal, freeze.count, freeze.threshold, freeze.window_s) == (
            "refusals",
            3,
            3,
            60,
        )
        assert freeze.by is None
        assert [e.request for e in freeze.evidence] == list(MISSPELT)
        assert {e.code for e in freeze.evidence} == {"unknown_column"}
        assert "statuss" in (freeze.evidence[0].message or "")
        assert all(e.at == clock.now() for e in freeze.evidence)
        assert gw.frozen_agents() == {AGENT: freeze}
        assert await gw.history(AGENT) == [freeze]


async def test_a_frozen_agent_is_refused_before_analysis_and_another_agent_is_not(
    shop_dsn: str,
) -> None:
    observed: list[tuple[str, str]] = []
    async with Gateway.connect(
        shop_dsn, breaker=STRICT, observe=lambda a, o: observed.append((a, o.code))
    ) as gw:
        await _freeze_by_refusals(gw)
        freeze = gw.status(AGENT).freeze
        assert freeze is not None
        observed.clear()
        # A valid read, an unknown table and a malformed operation: all refused the same way,
        # so none of them was analysed.
        for request in (POINT_READ, {"sql": "SELECT * FROM nowhere"}, {"op": "explode"}):
            error = await refused(gw, request)
            assert error.code == "agent_frozen"
            assert error.retryable is False
            assert error.details["freeze_id"] == freeze.id
            assert error.details["signal"] == "refusals"
            assert freeze.id in error.message
            assert "3 refusals within 60 s reached the threshold of 3" in error.message
        assert observed == []
        assert gw.status(AGENT).counts["refusals"] == 0  # not counted while frozen
        # Another agent queries as before and has its own counts.
        assert (await gw.query(OTHER, POINT_READ)).rows == POINT_ROWS
        assert gw.status(OTHER).frozen is False
        assert observed == [(OTHER, "ok")]


async def test_the_freeze_drains_the_agents_pool_cancelling_its_running_statement(
    shop_dsn: str,
) -> None:
    async with Gateway.connect(shop_dsn, breaker=STRICT, pool_size=2, statement_timeout_s=20) as gw:
        other = asyncio.create_task(gw.query(OTHER, SLOW))
        held = asyncio.create_task(gw.query(AGENT, SLOW))
        await settle(lambda: _sleeping(shop_dsn, AGENT) == 1 and _sleeping(shop_dsn, OTHER) == 1)
        await _freeze_by_refusals(gw)
        with pytest.raises(GatewayError) as info:
            await asyncio.wait_for(held, 5)  # cancelled on the server, not after 15 s
        assert info.value.code == "database_unavailable"
        assert "drained" in info.value.message
        assert gw.connections_in_use(AGENT) == 0
        assert await gw.drain(AGENT) is False  # the freeze closed its pool already
        # The other agent's statement is still running.
        assert not other.done()
        assert _sleeping(shop_dsn, OTHER) == 1
        await gw.drain(OTHER)
        with pytest.raises(GatewayError):
            await asyncio.wait_for(other, 5)


async def test_outcomes_are_counted_after_the_connection_is_back(shop_dsn: str) -> None:
    in_use: list[int] = []
    async with Gateway.connect(
        shop_dsn,
        breaker=STRICT,
        pool_size=1,
        observe=lambda a, o: in_use.append(gw.connections_in_use(a)),
    ) as gw:
        empty = {"sql": "SELECT id FROM orders WHERE id = $1", "params": [99]}
        first = await gw.query(AGENT, empty)
        # The freezing request still gets its answer: draining came after it let go.
        second = await gw.query(AGENT, empty)
    assert (first.emptiness, second.emptiness) == ("suspiciously_empty", "suspiciously_empty")
    assert in_use == [0, 0]


async def test_suspicious_empties_count_and_genuine_ones_do_not(shop_dsn: str) -> None:
    async with Gateway.connect(shop_dsn, breaker=STRICT) as gw:
        for _ in range(3):
            genuine = await gw.query(AGENT, {"sql": "SELECT * FROM refunds WHERE id = 1"})
            assert genuine.emptiness == "genuinely_empty"
        assert gw.status(AGENT).counts["suspicious_empties"] == 0
        empty = {"sql": "SELECT id FROM orders WHERE status = $1", "params": ["lost"]}
        assert (await gw.query(AGENT, empty)).emptiness == "suspiciously_empty"
        assert gw.status(AGENT).counts["suspicious_empties"] == 1
        assert (await gw.query(AGENT, empty)).emptiness == "suspiciously_empty"
        freeze = gw.status(AGENT).freeze
        assert freeze is not None
        assert (freeze.signal, freeze.count, freeze.threshold) == ("suspicious_empties", 2, 2)
        assert [e.code for e in freeze.evidence] == ["suspiciously_empty"] * 2
        assert freeze.evidence[0].request == empty["sql"]
        assert (await refused(gw, POINT_READ)).code == "agent_frozen"


async def test_database_errors_count_as_errors(shop_dsn: str) -> None:
    async with Gateway.connect(shop_dsn, breaker=STRICT) as gw:
        for _ in range(3):
            assert (await refused(gw, {"sql": "SELECT 1/0"})).code == "invalid_data"
        freeze = gw.status(AGENT).freeze
        assert freeze is not None
        assert (freeze.signal, freeze.count) == ("errors", 3)


async def test_counts_roll_off_after_the_window(shop_dsn: str) -> None:
    clock = FakeClock()
    async with Gateway.connect(shop_dsn, breaker=STRICT, clock=clock) as gw:
        for sql in MISSPELT[:2]:
            await refused(gw, {"sql": sql})
        clock.advance(60)
        assert gw.status(AGENT).counts["refusals"] == 0
        await refused(gw, {"sql": MISSPELT[2]})
        assert gw.status(AGENT).frozen is False


async def test_the_default_policy_freezes_at_ten_refusals(shop_dsn: str) -> None:
    async with Gateway.connect(shop_dsn) as gw:
        assert gw.breaker_policy == BreakerPolicy()
        for n in range(10):
            assert (await refused(gw, {"sql": f"SELECT col{n} FROM orders"})).code == (
                "unknown_column"
            )
        assert (await refused(gw, POINT_READ)).code == "agent_frozen"


# --- manual freezes and reinstatement ---------------------------------------------------------


async def test_a_manual_freeze_is_recorded_drains_and_refuses(shop_dsn: str) -> None:
    async with Gateway.connect(shop_dsn, breaker=STRICT, statement_timeout_s=20) as gw:
        await refused(gw, {"sql": MISSPELT[0]})
        held = asyncio.create_task(gw.query(AGENT, SLOW))
        await settle(lambda: _sleeping(shop_dsn, AGENT) == 1)
        freeze = await gw.freeze(AGENT, "deleting the wrong rows", by="oncall")
        with pytest.raises(GatewayError) as info:
            await asyncio.wait_for(held, 5)
        assert info.value.code == "database_unavailable"
        assert (freeze.reason, freeze.by, freeze.signal, freeze.automatic) == (
            "deleting the wrong rows",
            "oncall",
            None,
            False,
        )
        assert [e.request for e in freeze.evidence] == [MISSPELT[0]]
        # Idempotent: the freeze in effect is given back.
        assert await gw.freeze(AGENT, "again") == freeze
        error = await refused(gw, POINT_READ)
        assert error.code == "agent_frozen"
        assert "frozen by oncall: deleting the wrong rows" in error.message
        assert await gw.history(AGENT) == [freeze]
        unnamed = await gw.freeze(OTHER, "audit")
        assert unnamed.by is None


async def test_reinstate_needs_by_and_reason_and_lets_the_agent_query_again(
    shop_dsn: str,
) -> None:
    async with Gateway.connect(shop_dsn, breaker=STRICT) as gw:
        await _freeze_by_refusals(gw)
        for by, reason, argument in (("", "fixed", "by"), ("ops", "", "reason")):
            with pytest.raises(InvalidArgumentError) as bad:
                await gw.reinstate(AGENT, by=by, reason=reason)
            assert (bad.value.where, bad.value.argument) == ("Gateway.reinstate", argument)
        with pytest.raises(TypeError):
            await gw.reinstate(AGENT, by="ops")  # type: ignore[call-arg]
        with pytest.raises(TypeError):
            await gw.reinstate(AGENT, reason="fixed")  # type: ignore[call-arg]
        assert gw.status(AGENT).frozen is True
        record = await gw.reinstate(AGENT, by="ops", reason="prompt fixed")
        assert (record.by, record.reason, record.agent_id) == ("ops", "prompt fixed", AGENT)
        assert (await gw.query(AGENT, POINT_READ)).rows == POINT_ROWS
        status = gw.status(AGENT)
        assert status.frozen is False
        assert status.counts == {"errors": 0, "refusals": 0, "suspicious_empties": 0}
        with pytest.raises(UsageError) as not_frozen:
            await gw.reinstate(AGENT, by="ops", reason="again")
        assert "not frozen" in str(not_frozen.value)


async def test_freezes_and_history_survive_a_new_gateway(shop_dsn: str) -> None:
    async with Gateway.connect(shop_dsn, breaker=STRICT) as gw:
        await _freeze_by_refusals(gw)
        freeze = gw.status(AGENT).freeze
        assert freeze is not None
    async with Gateway.connect(shop_dsn, breaker=STRICT) as gw:
        assert gw.status(AGENT).freeze == freeze
        assert (await refused(gw, POINT_READ)).code == "agent_frozen"
        record = await gw.reinstate(AGENT, by="ops", reason="reviewed")
    async with Gateway.connect(shop_dsn, breaker=STRICT) as gw:
        assert gw.status(AGENT).frozen is False
        assert (await gw.query(AGENT, POINT_READ)).rows == POINT_ROWS
        history = await gw.history(AGENT)
        assert history == [freeze, record]
        assert isinstance(history[0], Freeze)
        assert isinstance(history[1], Reinstatement)
        assert history[1].freeze_id == freeze.id
    rows = fetch(shop_dsn, "SELECT kind FROM corral.corral_breaker_records ORDER BY seq")
    assert rows == [("freeze",), ("reinstatement",)]


async def test_the_freeze_journal_is_invisible_to_agents(shop_dsn: str) -> None:
    async with Gateway.connect(shop_dsn, breaker=STRICT) as gw:
        assert not any(t.name == "corral_breaker_records" for t in gw.catalog.tables.values())
        error = await refused(gw, {"sql": "SELECT * FROM corral.corral_breaker_records"})
        assert error.code == "unknown_table"


# --- hooks alongside the breakers, and no breakers --------------------------------------------


async def test_caller_hooks_are_chained_after_the_breakers(shop_dsn: str) -> None:
    asked: list[str] = []
    seen: list[tuple[str, str]] = []

    def frozen(agent_id: str) -> str | None:
        asked.append(agent_id)
        return "held by the caller" if agent_id == OTHER else None

    async def observe(agent_id: str, outcome: QueryOutcome) -> None:
        seen.append((agent_id, outcome.code))

    async with Gateway.connect(shop_dsn, breaker=STRICT, frozen=frozen, observe=observe) as gw:
        error = await refused(gw, POINT_READ, OTHER)
        assert error.code == "agent_frozen"
        assert "held by the caller" in error.message
        await _freeze_by_refusals(gw)
        assert seen == [(AGENT, "unknown_column")] * 3  # both saw every outcome
        asked.clear()
        error = await refused(gw, POINT_READ)
        assert error.details["signal"] == "refusals"  # the breakers' refusal, first
        assert asked == []


async def test_without_a_breaker_policy_nothing_freezes_and_the_methods_say_why(
    shop_dsn: str,
) -> None:
    async with Gateway.connect(shop_dsn, breaker=None) as gw:
        assert gw.breaker_policy is None
        for n in range(12):
            await refused(gw, {"sql": f"SELECT col{n} FROM orders"})
        assert (await gw.query(AGENT, POINT_READ)).rows == POINT_ROWS
        calls: list[tuple[str, Any]] = [
            ("freeze", lambda: gw.freeze(AGENT, "r")),
            ("reinstate", lambda: gw.reinstate(AGENT, by="ops", reason="r")),
            ("status", lambda: gw.status(AGENT)),
            ("history", lambda: gw.history(AGENT)),
            ("frozen_agents", gw.frozen_agents),
        ]
        for name, call in calls:
            with pytest.raises(UsageError) as info:
                await _settled(call)
            assert f"Gateway.{name} needs breakers" in str(info.value)
            assert "breaker=None" in str(info.value)


# --- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["strict", {"max_errors": 3}, 5])
def test_connect_checks_the_breaker_policy(value: Any) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        Gateway.connect("postgresql://127.0.0.1/x", breaker=value)
    assert info.value.argument == "breaker"


async def test_freeze_and_status_check_their_arguments(shop_dsn: str) -> None:
    async with Gateway.connect(shop_dsn, breaker=STRICT) as gw:
        bad: list[tuple[str, Any]] = [
            ("agent_id", lambda: gw.freeze("", "r")),
            ("reason", lambda: gw.freeze(AGENT, "")),
            ("by", lambda: gw.freeze(AGENT, "r", by="")),
            ("agent_id", lambda: gw.reinstate(3, by="o", reason="r")),  # type: ignore[arg-type]
            ("agent_id", lambda: gw.status("")),
            ("agent_id", lambda: gw.history(None)),  # type: ignore[arg-type]
        ]
        for argument, call in bad:
            with pytest.raises(InvalidArgumentError) as info:
                await _settled(call)
            assert info.value.argument == argument
        assert gw.frozen_agents() == {}


async def test_a_closed_gateway_refuses_breaker_calls(shop_dsn: str) -> None:
    gw = await Gateway.connect(shop_dsn, breaker=STRICT)
    await gw.close()
    with pytest.raises(UsageError) as info:
        gw.status(AGENT)
    assert "not open" in str(info.value)


# --- the package ------------------------------------------------------------------------------


def test_the_package_exports_its_public_names() -> None:
    expected = {
        "Gateway",
        "SQLiteGateway",
        "GatewayResult",
        "GatewayError",
        "BreakerPolicy",
        "Freeze",
        "Reinstatement",
        "BreakerStatus",
        "RequestOutcome",
        "QueryOutcome",
        "Catalog",
        "analyze",
        "compile_operation",
        "FreezeJournal",
        "SQLiteFreezeJournal",
        "PostgresFreezeJournal",
    }
    assert set(corral.gateway.__all__) == expected
    assert all(getattr(corral.gateway, name) is not None for name in expected)
    assert corral.gateway.Gateway is Gateway
    assert issubclass(corral.gateway.GatewayError, corral.kernel.CorralError)
    assert "PostgreSQL" in (corral.gateway.__doc__ or "")
