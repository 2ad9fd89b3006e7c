"""One front for both engines: the DSN picks the engine, each engine's keywords stay its own,
and ``on_freeze`` hears of every freeze recorded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from corral.gateway import BreakerPolicy, Freeze, Gateway, GatewayError, SQLiteGateway
from corral.kernel import InvalidArgumentError
from corral.runtime import FakeClock
from tests.gateway.corpus import shop_sqlite_file
from tests.gateway.gateway_support import shop_dsn

__all__ = ["shop_dsn"]

AGENT = "agent-7"


@pytest.fixture
def shop(tmp_path: Path) -> Path:
    return shop_sqlite_file(tmp_path)


async def test_a_sqlite_dsn_opens_the_sqlite_engine(shop: Path) -> None:
    async with Gateway.connect(f"sqlite:///{shop}", clock=FakeClock()) as gw:
        assert type(gw) is Gateway
        assert gw.catalog.dialect == "sqlite"
        result = await gw.query(AGENT, {"op": "count", "table": "orders"})
    assert result.rows[0]["count"] > 0


async def test_sqlite_gateway_is_a_gateway(shop: Path) -> None:
    async with SQLiteGateway.connect(shop, clock=FakeClock()) as gw:
        assert isinstance(gw, Gateway)
        assert gw.connections_in_use(AGENT) == 0
        assert not await gw.drain(AGENT)


@pytest.mark.parametrize(
    ("argument", "value"),
    [
        ("pool_size", 3),
        ("journal_schema", "x"),
        ("key_wait_s", 1.0),
        ("catalog_max_age_s", None),
        ("replay_cache_size", 0),
    ],
)
def test_postgresql_keywords_are_refused_for_sqlite(argument: str, value: Any) -> None:
    with pytest.raises(InvalidArgumentError, match=rf"Gateway\.connect: {argument} must be left"):
        Gateway.connect("sqlite:///shop.db", **{argument: value})


def test_sqlite_keywords_are_refused_for_postgresql() -> None:
    with pytest.raises(InvalidArgumentError, match=r"Gateway\.connect: journal_path must be left"):
        Gateway.connect("postgresql://127.0.0.1/x", journal_path="freezes.db")


@pytest.mark.parametrize("dsn", ["sqlite://shop.db", "sqlite:///", "SQLITE:///  "])
def test_a_sqlite_dsn_needs_a_path(dsn: str) -> None:
    with pytest.raises(InvalidArgumentError, match=r"Gateway\.connect: dsn must be"):
        Gateway.connect(dsn)


def test_a_bare_path_is_not_taken_for_sqlite() -> None:
    with pytest.raises(InvalidArgumentError, match="a libpq connection string or URI"):
        Gateway.connect("shop.db")


async def test_on_freeze_hears_of_breaker_and_manual_freezes(shop: Path) -> None:
    heard: list[tuple[str, Freeze]] = []

    async def on_freeze(agent_id: str, freeze: Freeze) -> None:
        heard.append((agent_id, freeze))

    policy = BreakerPolicy(max_refusals=2)
    dsn = f"sqlite:///{shop}"
    async with Gateway.connect(dsn, breaker=policy, on_freeze=on_freeze, clock=FakeClock()) as gw:
        for _ in range(2):
            with pytest.raises(GatewayError):
                await gw.query(AGENT, {"op": "find", "table": "nope"})
        assert [(a, f.id) for a, f in heard] == [(AGENT, gw.status(AGENT).freeze.id)]  # type: ignore[union-attr]
        manual = await gw.freeze("agent-8", "by hand", by="ops")
        again = await gw.freeze("agent-8", "twice", by="ops")
    assert again is manual
    assert [a for a, _ in heard] == [AGENT, "agent-8"]
    assert heard[1][1] is manual


async def test_a_plain_on_freeze_hook_and_its_failure(shop: Path) -> None:
    heard: list[str] = []

    def on_freeze(agent_id: str, freeze: Freeze) -> None:
        heard.append(agent_id)
        raise RuntimeError("logged, never raised")

    async with SQLiteGateway.connect(shop, on_freeze=on_freeze, clock=FakeClock()) as gw:
        freeze = await gw.freeze(AGENT, "by hand")
        assert gw.status(AGENT).freeze is freeze
    assert heard == [AGENT]


def test_on_freeze_must_be_callable() -> None:
    with pytest.raises(InvalidArgumentError, match="on_freeze"):
        Gateway.connect("postgresql://127.0.0.1/x", on_freeze="no")  # type: ignore[arg-type]


UNENCODABLE = [
    {"sql": "SELECT $1 AS v", "params": ["half \ud800 pair"]},
    {"sql": "SELECT 'half \ud800 pair' AS v"},
    {"op": "find", "table": "orders", "where": {"status": "\udcff"}},
    {
        "op": "update",
        "table": "orders",
        "set": {"status": "x\ud800"},
        "where": {"id": 1},
        "idempotency_key": "k1",
    },
    {
        "sql": "UPDATE orders SET status = $1 WHERE id = 1",
        "params": ["\ud800"],
        "idempotency_key": "k2",
    },
]


@pytest.mark.parametrize("request_", UNENCODABLE)
async def test_text_no_database_can_take_is_refused_before_anything_runs(
    shop: Path, request_: dict[str, Any]
) -> None:
    # A lone surrogate cannot be encoded: it used to escape query() as a UnicodeEncodeError
    # (and, in SQL text on PostgreSQL, as an analysis_error). It is the request's fault.
    outcomes: list[str] = []
    async with Gateway.connect(
        f"sqlite:///{shop}",
        clock=FakeClock(),
        observe=lambda agent, outcome: outcomes.append(outcome.code),
    ) as gw:
        with pytest.raises(GatewayError) as caught:
            await gw.query("agent-1", request_)
    assert caught.value.code == "invalid_operation"
    assert "lone surrogates" in caught.value.message
    assert outcomes == ["invalid_operation"]  # reported like any refusal


@pytest.mark.postgres
@pytest.mark.parametrize("request_", UNENCODABLE)
async def test_text_no_database_can_take_is_refused_on_postgresql(
    shop_dsn: str, request_: dict[str, Any]
) -> None:
    async with Gateway.connect(shop_dsn) as gw:
        with pytest.raises(GatewayError) as caught:
            await gw.query("agent-1", request_)
        assert caught.value.code == "invalid_operation"
        again = await gw.query("agent-1", {"sql": "SELECT 1 AS one"})
        assert again.rows == [{"one": 1}]
