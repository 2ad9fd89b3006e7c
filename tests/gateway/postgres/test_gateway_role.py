"""The gateway as docs/gateway.md recommends deploying it: connected as a role that is not a
superuser and holds only the grants agents need, so that what analysis misses still meets
PostgreSQL's privileges."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from corral.gateway import Gateway, GatewayError
from tests.gateway.gateway_support import shop_dsn

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
