"""The gateway as docs/gateway.md recommends deploying it: connected as a role that is not a
superuser and holds only the grants agents need, so that what analysis misses still meets
PostgreSQL's privileges; and with ``agent_role``, agents' SQL running as a role that has no
rights on the gateway's own objects."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from corral.gateway import Gateway, GatewayError
from corral.kernel import InvalidArgumentError
from tests.gateway.gateway_support import postgres_of, refund, separated_roles, shop_dsn

__all__ = ["shop_dsn"]

pytestmark = pytest.mark.postgres


@pytest.fixture
def agent_role_dsn(shop_dsn: str) -> Iterator[str]:
    role = f"corral_gw_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(shop_dsn, autocommit=True) as conn:
        dbname = conn.info.dbname
        conn.execute(f"CREATE ROLE {role} LOGIN NOSUPERUSER")
        conn.execute(f"GRANT CONNECT ON DATABASE {dbname} TO {role}")
        conn.execute(f"GRANT USAGE ON SCHEMA public TO {role}")
        conn.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}")
        conn.execute(f"GRANT INSERT, UPDATE ON orders, refunds TO {role}")
        # The gateway's own schema (journal and freezes), made by the owner beforehand.
        conn.execute(f"CREATE SCHEMA corral AUTHORIZATION {role}")
    params = conninfo_to_dict(shop_dsn)
    params["user"] = role
    params.pop("password", None)
    try:
        yield make_conninfo("", **params)
    finally:
        with psycopg.connect(shop_dsn, autocommit=True) as conn:
            conn.execute("DROP SCHEMA corral CASCADE")
            conn.execute(f"DROP OWNED BY {role}")
            conn.execute(f"DROP ROLE {role}")


async def test_a_least_privileged_role_reads_writes_and_is_refused_the_rest(
    agent_role_dsn: str,
) -> None:
    async with Gateway.connect(agent_role_dsn) as gw:
        read = await gw.query("a", {"sql": "SELECT id FROM orders WHERE id = $1", "params": [1]})
        assert read.rows == [{"id": 1}]
        write = {
            "op": "update",
            "table": "orders",
            "where": {"id": 1},
            "set": {"status": "checked"},
            "idempotency_key": "k1",
        }
        assert (await gw.query("a", write)).status == "ok"
        assert (await gw.query("a", write)).status == "replayed"
        frozen = await gw.freeze("b", "by hand", by="ops")
        assert [r.id for r in await gw.history("b")] == [frozen.id]
        # A write the role holds no grant for is the database's refusal, not a success.
        with pytest.raises(GatewayError) as refused:
            await gw.query(
                "a",
                {
                    "op": "delete",
                    "table": "orders",
                    "where": {"id": 2},
                    "idempotency_key": "k2",
                },
            )
        assert refused.value.details.get("sqlstate") == "42501"


@pytest.fixture
def roles(shop_dsn: str) -> Iterator[tuple[str, str]]:
    """The owner's DSN and the agent role: the owner logs in and owns the gateway's schema;
    the agent role holds the agents' grants on the shop and nothing of the gateway's."""
    with separated_roles(shop_dsn, writes="INSERT, UPDATE") as made:
        yield made


async def test_agents_sql_runs_as_the_agent_role_and_the_owner_keeps_the_journal(
    roles: tuple[str, str],
) -> None:
    dsn, agent_role = roles
    async with Gateway.connect(dsn, agent_role=agent_role) as gw:
        who = await gw.query("a", {"sql": "SELECT current_user AS u"})
        assert who.rows == [{"u": agent_role}]
        # Both forms of a keyed write: counted (no RETURNING), and with its rows.
        update = {"sql": "UPDATE orders SET status = 'checked' WHERE id = 1"}
        assert (await gw.query("a", {**update, "idempotency_key": "k1"})).row_count == 1
        inserted = await gw.query("a", refund(901, key="k2"))
        assert [r["id"] for r in inserted.rows] == [901]
        nextval = {"sql": "SELECT nextval('invoice_numbers') AS n", "idempotency_key": "k3"}
        assert (await gw.query("a", nextval)).status == "ok"
        await gw.freeze("b", "by hand", by="ops")
        # Even past the analysis, the agents' connections cannot touch the gateway's objects.
        async with postgres_of(gw).pools.lease("a") as lease:
            for sql in (
                "SELECT count(*) FROM corral.gateway_journal",
                "SELECT setval('corral.corral_breaker_records_seq_seq', 1)",
                "DELETE FROM corral.corral_breaker_records",
            ):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    await lease.conn.execute(sql)
    # Replays, from the journal after a restart (read back by the owner).
    async with Gateway.connect(dsn, agent_role=agent_role) as gw:
        again = await gw.query("a", {**update, "idempotency_key": "k1"})
        assert (again.status, again.row_count) == ("replayed", 1)
        assert (await gw.query("a", refund(901, key="k2"))).status == "replayed"
        assert set(gw.frozen_agents()) == {"b"}
    with psycopg.connect(dsn) as conn:
        owners = conn.execute(
            "SELECT DISTINCT tableowner FROM pg_tables WHERE schemaname = 'corral'"
        ).fetchall()
    assert owners == [(conninfo_to_dict(dsn)["user"],)]


def test_agent_role_must_be_an_identifier(shop_dsn: str) -> None:
    with pytest.raises(InvalidArgumentError):
        Gateway.connect(shop_dsn, agent_role="x; DROP")
    with pytest.raises(InvalidArgumentError):
        Gateway.connect("sqlite:///x.db", agent_role="agents")


async def test_gateways_racing_on_one_key_under_the_agent_role_run_it_once(
    roles: tuple[str, str],
) -> None:
    dsn, agent_role = roles
    gateways = [await Gateway.connect(dsn, agent_role=agent_role, key_wait_s=5) for _ in range(5)]
    try:
        outcomes = await asyncio.gather(*(gw.query("a", refund(902, key="k")) for gw in gateways))
    finally:
        for gw in gateways:
            await gw.close()
    assert sorted(o.status for o in outcomes) == ["ok"] + ["replayed"] * 4
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM refunds WHERE id = 902").fetchone() == (1,)
