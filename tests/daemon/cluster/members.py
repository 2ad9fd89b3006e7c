"""Several nodes in this process over one PostgreSQL database, driven by hand: each a
``PostgresStore``, a ``Node`` joined and started with ``loop=False`` (the test calls
``tick``), and an ``AgentService`` with a scripted harness and a shared fake clock. A lease
runs out when the test says so (:meth:`Cluster.expire`), never by waiting."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from corral.daemon import AgentService
from corral.daemon._cluster._node import Node
from corral.daemon._events import Event
from corral.daemon.stores._postgres import PostgresStore
from corral.runtime import FakeClock
from tests.support.harness import ScriptedHarness

TOKEN = "cluster-token-0123456789"
LEASE_S = 60.0  # never runs out by itself within a test: expire() ends it


@dataclass
class Member:
    """One node: its store, node, service and harness."""

    name: str
    store: PostgresStore
    node: Node
    service: AgentService
    harness: ScriptedHarness
    home: Path

    async def spawn(self, **spec: Any) -> str:
        """A new agent of the ``command`` harness created here; its id."""
        spec.setdefault("harness", "command")
        spec.setdefault("command", ["worker"])
        result = await self.service.spawn(spec)
        return str(result.body["id"])

    def state(self, agent_id: str) -> dict[str, Any]:
        return dict(self.service.get(agent_id))

    async def types(self, agent_id: str | None = None) -> list[str]:
        return [e.type for e in await self.service.events(agent_id=agent_id, limit=100_000)]


class Cluster:
    """Makes :class:`Member` s over ``dsn`` and closes them (see the module docstring)."""

    def __init__(self, dsn: str, root: Path, clock: FakeClock) -> None:
        self.dsn = dsn
        self.root = root
        self.clock = clock
        self._opened: list[PostgresStore] = []
        self._services: list[AgentService] = []
        self._nodes: list[Node] = []

    async def store(self) -> PostgresStore:
        store = PostgresStore(self.dsn, clock=self.clock)
        self._opened.append(store)
        await store.open()
        return store

    async def node(
        self,
        name: str,
        *,
        token: str = TOKEN,
        home: Path | None = None,
        url: str | None = None,
        lease_s: float = LEASE_S,
    ) -> tuple[PostgresStore, Node]:
        """A store and a node joined on it (not started)."""
        store = await self.store()
        node = Node(
            store,
            name=name,
            url=url or f"http://{name}.invalid",
            token=token,
            home=home or self.root / name,
            lease_s=lease_s,
        )
        self._nodes.append(node)
        await node.join()
        return store, node

    async def member(
        self,
        name: str,
        *,
        harness: ScriptedHarness | None = None,
        url: str | None = None,
        loop: bool = False,
        **options: Any,
    ) -> Member:
        """A node joined, its service started, the node started (``loop`` False: the test
        calls ``tick``)."""
        store, node = await self.node(name, url=url)
        harness = harness or ScriptedHarness()
        options.setdefault("token", TOKEN)
        service = AgentService(
            store,
            home=self.root / name,
            harnesses={"command": harness},
            clock=self.clock,
            ownership=node,
            **options,
        )
        self._services.append(service)
        await service.start()
        await node.start(service, loop=loop)
        return Member(name, store, node, service, harness, self.root / name)

    async def sql(self, statement: str, *params: Any) -> list[tuple[Any, ...]]:
        """Run ``statement`` on its own connection (autocommit); the rows it returns."""
        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            cur = await conn.execute(statement, params or None)
            return await cur.fetchall() if cur.description else []

    async def expire(self, name: str) -> None:
        """Node ``name``'s lease ran out (by the database's clock), as if it died."""
        await self.sql(
            "UPDATE nodes SET expires = clock_timestamp() - interval '1 second' WHERE name = %s",
            name,
        )

    async def leases(self) -> dict[str, tuple[str, int]]:
        """Every lease: agent -> (node, epoch)."""
        rows = await self.sql("SELECT agent_id, node, epoch FROM leases")
        return {agent: (node, int(epoch)) for agent, node, epoch in rows}

    async def log(self) -> list[Event]:
        rows = await self.sql("SELECT seq, ts, type, agent_id, data FROM events ORDER BY seq")
        return [Event(*row) for row in rows]

    async def close(self) -> None:
        for service in reversed(self._services):
            await service.close()
        for node in reversed(self._nodes):
            await node.leave()
        for store in reversed(self._opened):
            await store.close()


@contextlib.asynccontextmanager
async def cluster(dsn: str, root: Path, clock: FakeClock | None = None) -> AsyncIterator[Cluster]:
    made = Cluster(dsn, root, clock or FakeClock())
    try:
        yield made
    finally:
        await made.close()
