"""What identifies a keyed write, the same on PostgreSQL and SQLite: the agent, the key and the
plan_hash, each stored exactly or refused."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from corral.gateway import Gateway, GatewayError
from corral.kernel import InvalidArgumentError
from tests.gateway.corpus import shop_sqlite_file
from tests.gateway.gateway_support import AGENT, shop_dsn

__all__ = ["shop_dsn"]

ENGINES = [pytest.param("postgres", marks=pytest.mark.postgres), "sqlite"]


class Target:
    """A shop behind a gateway, and a way to count its customers without the gateway."""

    def __init__(self, dsn: str, engine: str) -> None:
        self.dsn = dsn
        self.engine = engine

    def count(self, where: str = "true") -> int:
        sql = f"SELECT count(*) FROM customers WHERE {where}"
        if self.engine == "sqlite":
            conn = sqlite3.connect(self.dsn.removeprefix("sqlite:///"))
            try:
                return int(conn.execute(sql.replace("true", "1")).fetchone()[0])
            finally:
                conn.close()
        with psycopg.connect(self.dsn) as pg:
            row = pg.execute(sql).fetchone()
            assert row is not None
            return int(row[0])


@pytest.fixture(params=ENGINES)
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Target:
    if request.param == "postgres":
        return Target(request.getfixturevalue("shop_dsn"), "postgres")
    return Target("sqlite:///" + str(shop_sqlite_file(tmp_path)), "sqlite")


@pytest.fixture
async def gw(target: Target) -> AsyncIterator[Gateway]:
    async with Gateway.connect(target.dsn, breaker=None) as gateway:
        yield gateway


def customer(id_: int, key: str | None, **extra: Any) -> dict[str, Any]:
    request: dict[str, Any] = {
        "op": "insert",
        "table": "customers",
        "values": {
            "id": id_,
            "name": f"c{id_}",
            "email": f"c{id_}@x",
            "country": "FR",
            "created_at": "2026-01-01T00:00:00+00:00",
        },
        "returning": ["id"],
    }
    if key is not None:
        request["idempotency_key"] = key
    return {**request, **extra}


async def refusal(gw: Gateway, request: dict[str, Any], agent: str = AGENT) -> GatewayError:
    with pytest.raises(GatewayError) as info:
        await gw.query(agent, request)
    return info.value


# --- item: keys are stored exactly or refused ------------------------------------------------


@pytest.mark.parametrize("name", ["idempotency_key", "plan_hash"])
@pytest.mark.parametrize(
    "bad", ["nul\x00A", "tab\there", "bell\x07", "del\x7f", "c1\x85", "\ud800"]
)
async def test_a_key_with_a_control_character_is_refused_naming_it(
    gw: Gateway, target: Target, name: str, bad: str
) -> None:
    for request in (
        customer(90, "k", **{name: bad}),
        {
            "sql": "UPDATE orders SET status = 'x' WHERE id = 1",
            "idempotency_key": "k",
            name: bad,
        },
    ):
        error = await refusal(gw, request)
        assert (error.code, error.retryable) == ("invalid_operation", False)
        assert error.details["key"] == name
        assert "control characters" in error.message
    assert target.count("id = 90") == 0


async def test_a_nul_byte_never_makes_two_keys_one(gw: Gateway, target: Target) -> None:
    # On PostgreSQL the key was cut at its NUL: the second write came back replayed, unrun.
    refused = await refusal(gw, customer(91, "nul\x00A"))
    first = await gw.query(AGENT, customer(92, "nul"))
    assert refused.details["character"] == "U+0000"
    assert (first.status, first.rows) == ("ok", [{"id": 92}])
    assert target.count("id IN (91, 92)") == 1


async def test_an_agent_id_with_a_control_character_is_refused(gw: Gateway) -> None:
    for agent in ("agent\x00x", "agent\nx", "agent\ud800"):
        with pytest.raises(InvalidArgumentError, match="agent_id"):
            await gw.query(agent, customer(93, "k"))
        with pytest.raises(InvalidArgumentError, match="agent_id"):
            await gw.query(agent, {"sql": "SELECT 1"})


# --- item: a key's identity is (agent, key, plan_hash) ---------------------------------------


async def test_the_same_key_under_a_new_plan_is_new_work(gw: Gateway, target: Target) -> None:
    first = await gw.query(AGENT, customer(94, "k", plan_hash="p1"))
    new_plan = await gw.query(AGENT, customer(95, "k", plan_hash="p2"))
    no_plan = await gw.query(AGENT, customer(96, "k"))
    assert [r.status for r in (first, new_plan, no_plan)] == ["ok", "ok", "ok"]
    # Under each plan: the same work replays, other work is a conflict.
    for id_, plan in ((94, "p1"), (95, "p2"), (96, None)):
        extra = {"plan_hash": plan} if plan is not None else {}
        again = await gw.query(AGENT, customer(id_, "k", **extra))
        assert (again.status, again.rows) == ("replayed", [{"id": id_}])
        other = await refusal(gw, customer(97, "k", **extra))
        assert other.code == "idempotency_conflict"
        assert "same plan_hash" in other.message
    assert target.count("id BETWEEN 94 AND 97") == 3


async def test_plans_are_told_apart_after_a_restart(target: Target) -> None:
    async with Gateway.connect(target.dsn, breaker=None) as gw:
        await gw.query(AGENT, customer(98, "k", plan_hash="p1"))
    async with Gateway.connect(target.dsn, breaker=None) as gw:
        replayed = await gw.query(AGENT, customer(98, "k", plan_hash="p1"))
        conflict = await refusal(gw, customer(99, "k", plan_hash="p1"))
        new_plan = await gw.query(AGENT, customer(99, "k", plan_hash="p2"))
    assert (replayed.status, conflict.code, new_plan.status) == (
        "replayed",
        "idempotency_conflict",
        "ok",
    )
    assert target.count("id IN (98, 99)") == 2


OLD_JOURNAL = """CREATE TABLE {name} (
    agent_id text NOT NULL, key text NOT NULL, fingerprint text NOT NULL,
    state text NOT NULL, result text, created_at text NOT NULL, completed_at text,
    PRIMARY KEY (agent_id, key))"""


async def test_a_journal_of_the_old_layout_stops_the_gateway_from_opening(target: Target) -> None:
    if target.engine == "sqlite":
        conn = sqlite3.connect(target.dsn.removeprefix("sqlite:///"))
        try:
            conn.execute(OLD_JOURNAL.format(name="corral_gateway_journal"))
            conn.commit()
        finally:
            conn.close()
        shown = "corral_gateway_journal"
    else:
        with psycopg.connect(target.dsn, autocommit=True) as pg:
            pg.execute("CREATE SCHEMA corral")
            pg.execute(OLD_JOURNAL.format(name="corral.gateway_journal"))
        shown = "corral.gateway_journal"
    with pytest.raises(GatewayError) as info:
        async with Gateway.connect(target.dsn, breaker=None):
            pass
    error = info.value
    assert (error.code, error.details["missing_column"]) == ("database_error", "plan_hash")
    assert shown in error.message
    assert "older corral" in error.message


async def test_one_key_under_two_plans_runs_both_at_once(gw: Gateway, target: Target) -> None:
    # Keys in flight (the in-memory map; PostgreSQL's advisory lock) use the same identity;
    # two at once, as many as an agent's default pool holds.
    results = await asyncio.gather(
        *(gw.query(AGENT, customer(100 + i, "k", plan_hash=f"p{i}")) for i in range(2))
    )
    assert [r.status for r in results] == ["ok"] * 2
    assert target.count("id BETWEEN 100 AND 101") == 2
