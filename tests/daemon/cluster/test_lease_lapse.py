"""A node whose lease ran out while nobody adopted its agents (a pause, a starved loop, a
database that answered late) takes them back when it is live again: the leases still name
it, and no other node adopts agents from a live node, so without it nobody would act for
them. Driven by hand (``loop=False``) on one PostgreSQL store."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

import psycopg
import pytest

from corral.daemon._cluster._node import Node
from corral.daemon.stores._postgres import PostgresStore

pytestmark = pytest.mark.postgres


def expire(dsn: str) -> None:
    """Every node's lease runs out now, by the database's clock."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE nodes SET expires = clock_timestamp() - interval '1 second'")


class Recorder:
    """The agent service's side of ownership, recording what it is told; ``live``: whether
    its node was live (what it writes is accepted) each time it was told to adopt."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.calls: list[tuple[str, list[str]]] = []
        self.live: list[bool] = []

    async def adopt(self, agent_ids: Collection[str]) -> None:
        self.calls.append(("adopt", sorted(agent_ids)))
        with psycopg.connect(self.dsn) as conn:
            row = conn.execute(
                "SELECT expires > clock_timestamp() AND NOT stopped FROM nodes"
            ).fetchone()
        self.live.append(bool(row and row[0]))

    async def disown(self, agent_ids: Collection[str]) -> None:
        self.calls.append(("disown", sorted(agent_ids)))


async def test_a_lapsed_node_takes_back_the_agents_nobody_adopted(
    tmp_path: Path, postgres_dsn: str
) -> None:
    store = PostgresStore(postgres_dsn)
    await store.open()
    node = Node(store, name="n1", url="http://127.0.0.1:9", token="t" * 24, home=tmp_path)
    try:
        await node.join()
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            # An agent this node held before (as a restart finds it).
            conn.execute("INSERT INTO leases VALUES ('a_1', 'n1', 1, 'r1')")
        service = Recorder(postgres_dsn)
        await node.start(service, loop=False)
        assert node.owns("a_1")
        assert service.calls == [("adopt", ["a_1"])]

        expire(postgres_dsn)  # its lease ran out before it renewed it
        await node.tick()

        # It stopped acting for the agent, joined again, and took its lease back at a new
        # epoch (the last incarnation's writes are refused).
        assert service.calls[1:] == [("disown", ["a_1"]), ("adopt", ["a_1"])]
        assert service.live == [True, True]
        assert node.owns("a_1")
        with psycopg.connect(postgres_dsn) as conn:
            row = conn.execute("SELECT node, epoch FROM leases WHERE agent_id = 'a_1'").fetchone()
        assert row == ("n1", 3)
    finally:
        await node.leave()
        await store.close()


async def test_a_node_whose_lease_ran_out_before_it_started_adopts_once_live(
    tmp_path: Path, postgres_dsn: str
) -> None:
    # The agent service's start, between join and start, outlasted the lease (a busy
    # machine, a short lease): what adopting writes would be refused, so it joins again first.
    store = PostgresStore(postgres_dsn)
    await store.open()
    node = Node(store, name="n1", url="http://127.0.0.1:9", token="t" * 24, home=tmp_path)
    try:
        await node.join()
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO leases VALUES ('a_1', 'n1', 1, 'r1')")
        expire(postgres_dsn)
        service = Recorder(postgres_dsn)
        await node.start(service, loop=False)
        assert service.calls == [("adopt", ["a_1"])]
        assert service.live == [True]
        assert node.owns("a_1")
    finally:
        await node.leave()
        await store.close()
