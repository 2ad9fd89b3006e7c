"""The gateway's Python surface: its hooks for breakers, and what it does with bad input."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from corral.gateway import Gateway, GatewayError, GatewayResult, QueryOutcome
from corral.kernel import InvalidArgumentError
from corral.runtime import FakeClock
from tests.gateway.gateway_support import AGENT, refused, shop_dsn

__all__ = ["shop_dsn"]

pytestmark = pytest.mark.postgres


# --- hooks ------------------------------------------------------------------------------------


async def test_observe_gets_every_outcome_with_its_code(shop_dsn: str) -> None:
    seen: list[tuple[str, QueryOutcome]] = []

    async def observe(agent_id: str, outcome: QueryOutcome) -> None:
        seen.append((agent_id, outcome))

    clock = FakeClock()
    async with Gateway.connect(shop_dsn, observe=observe, clock=clock) as gw:
        await gw.query(AGENT, {"sql": "SELECT id FROM orders WHERE id = $1", "params": [1]})
        await gw.query(AGENT, {"sql": "SELECT id FROM orders WHERE id = $1", "params": [99]})
        await gw.query(AGENT, {"sql": "SELECT * FROM refunds"})
        write = {"op": "delete", "table": "refunds", "where": {"id": 5}, "idempotency_key": "k"}
        await gw.query(AGENT, write)
        await gw.query(AGENT, write)
        for request in ({"sql": "SELECT * FROM ordres"}, {"sql": "SELECT 1/0"}):
            with pytest.raises(GatewayError):
                await gw.query(AGENT, request)
    codes = [o.code for _, o in seen]
    assert codes == [
        "ok",
        "suspiciously_empty",
        "genuinely_empty",
        "ok",
        "replayed",
        "unknown_table",
        "invalid_data",
    ]
    assert {a for a, _ in seen} == {AGENT}
    assert seen[0][1].request == "SELECT id FROM orders WHERE id = $1"
    assert seen[0][1].kind == "read"
    assert seen[3][1].kind == "write"
    assert seen[5][1].kind is None
    assert "ordres" in (seen[5][1].message or "")
    assert '"op": "delete"' in seen[3][1].request
    assert all(o.at == clock.now() for _, o in seen)
    assert isinstance(seen[1][1].result, GatewayResult)


@pytest.mark.parametrize("asynchronous", [False, True])
async def test_a_frozen_agent_is_refused_before_analysis(shop_dsn: str, asynchronous: bool) -> None:
    frozen = {"bad": "3 refusals in 60 s"}
    observed: list[str] = []

    def verdict(agent_id: str) -> str | None:
        return frozen.get(agent_id)

    async def averdict(agent_id: str) -> str | None:
        return frozen.get(agent_id)

    hook: Callable[[str], Any] = averdict if asynchronous else verdict
    async with Gateway.connect(
        shop_dsn, frozen=hook, observe=lambda a, o: observed.append(o.code)
    ) as gw:
        error = await refused(gw, {"sql": "THIS IS NOT SQL"}, agent="bad")
        assert error.code == "agent_frozen"
        assert error.details == {"agent_id": "bad", "reason": "3 refusals in 60 s"}
        assert "3 refusals in 60 s" in error.message
        ok = await gw.query("good", {"sql": "SELECT 1 AS one"})
        assert ok.rows == [{"one": 1}]
    assert observed == ["ok"]


async def test_a_hook_that_raises_agent_frozen_itself_is_obeyed(shop_dsn: str) -> None:
    def check(agent_id: str) -> None:
        raise GatewayError("agent_frozen", f"{agent_id} is frozen (freeze f-1)", freeze="f-1")

    async with Gateway.connect(shop_dsn, frozen=check) as gw:
        error = await refused(gw, {"sql": "SELECT 1"})
    assert (error.code, error.details) == ("agent_frozen", {"freeze": "f-1"})


# --- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_", "key"),
    [
        (["SELECT 1"], "request"),
        ({"sql": "SELECT 1", "op": "find"}, "request"),
        ({"table": "orders"}, "request"),
        ({"sql": 42}, "sql"),
        ({"sql": "   "}, "sql"),
        ({"sql": "SELECT $1", "params": "x"}, "params"),
        ({"sql": "SELECT $1", "params": []}, "params"),
        ({"sql": "SELECT 1", "params": [1]}, "params"),
        ({"sql": "SELECT $1", "params": [float("nan")]}, "params[0]"),
        ({"sql": "SELECT $1", "params": [[{"a": 1}]]}, "params[0][0]"),
        ({"sql": "SELECT $1", "params": [object()]}, "params[0]"),
        ({"sql": "SELECT 1", "parmas": []}, "parmas"),
        ({"sql": "SELECT 1", "idempotency_key": ""}, "idempotency_key"),
        ({"sql": "SELECT 1", "idempotency_key": "k" * 257}, "idempotency_key"),
        ({"sql": "SELECT 1", "plan_hash": 7}, "plan_hash"),
        ({"op": "find", "table": "orders", "idempotency_key": "k" * 257}, "idempotency_key"),
    ],
)
async def test_malformed_requests_are_invalid_operations(
    shop_dsn: str, request_: Any, key: str
) -> None:
    async with Gateway.connect(shop_dsn) as gw:
        error = await refused(gw, request_)
    assert error.code == "invalid_operation"
    assert error.details["key"] == key


async def test_bad_agent_ids_and_a_closed_gateway(shop_dsn: str) -> None:
    gw = await Gateway.connect(shop_dsn)
    for agent in ("", "  ", None, 7):
        with pytest.raises(InvalidArgumentError, match="agent_id"):
            await gw.query(agent, {"sql": "SELECT 1"})  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError, match="agent_id"):
            await gw.drain(agent)  # type: ignore[arg-type]
    await gw.close()
    await gw.close()
    error = await refused(gw, {"sql": "SELECT 1"})
    assert error.code == "database_unavailable"


@pytest.mark.parametrize(
    ("argument", "value"),
    [
        ("pool_size", 0),
        ("pool_size", 1.5),
        ("statement_timeout_s", 0),
        ("statement_timeout_s", float("inf")),
        ("max_rows", 0),
        ("max_rows", True),
        ("clock", "now"),
        ("key_wait_s", -1),
        ("connect_timeout_s", 0),
        ("catalog_refresh_s", -1),
        ("catalog_max_age_s", 0),
        ("replay_cache_size", -1),
        ("observe", "print"),
        ("frozen", 3),
        ("journal_schema", "Bad-Name"),
        ("journal_table", ""),
    ],
)
def test_connect_checks_its_arguments(argument: str, value: Any) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        Gateway.connect("postgresql://127.0.0.1/x", **{argument: value})
    assert info.value.argument == argument


@pytest.mark.parametrize("dsn", ["", 5, "host=127.0.0.1 port"])
def test_connect_checks_the_dsn(dsn: Any) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        Gateway.connect(dsn)
    assert info.value.argument == "dsn"
