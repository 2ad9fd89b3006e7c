"""One small connection pool per agent, with fail-fast checkout (``pool_exhausted`` at once,
never a queue), and the draining of an agent's pool."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import pq
from psycopg_pool import AsyncConnectionPool, PoolClosed, PoolTimeout

from corral.gateway._errors import GatewayError

__all__ = ["AgentPools", "Lease"]

_IDLE = pq.TransactionStatus.IDLE


@dataclass(eq=False, slots=True)
class Lease:
    """One checked-out connection of ``agent_id``.

    ``discard``: close the connection instead of returning it (its session state is in
    doubt). ``drained``: the agent's pool was drained while this lease was out, and the
    statement it was running (if any) was cancelled for that reason. ``timed_out``: the
    request passed its deadline and the gateway cut its connection (see :mod:`._deadline`).
    """

    agent_id: str
    conn: psycopg.AsyncConnection[Any]
    discard: bool = False
    drained: bool = False
    timed_out: bool = False


@dataclass(eq=False, slots=True)
class _AgentPool:
    pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]]
    leases: set[Lease] = field(default_factory=set)
    pending: int = 0  # leases counted against the limit, connection not yet in hand


class AgentPools:
    """Per-agent pools over one database.

    ``conninfo`` and ``connect_kwargs`` are what every connection is opened with;
    ``pool_size`` is each agent's connection limit; ``connect_timeout_s`` bounds opening a
    connection. Not thread-safe: one event loop.
    """

    def __init__(
        self,
        conninfo: str,
        *,
        pool_size: int,
        connect_timeout_s: float,
        connect_kwargs: Mapping[str, Any],
        application_name: str = "corral-gateway",
    ) -> None:
        self._conninfo = conninfo
        self.pool_size = pool_size
        self._connect_timeout_s = connect_timeout_s
        self._kwargs = dict(connect_kwargs)
        self._application_name = application_name
        self._agents: dict[str, _AgentPool] = {}
        self._closed = False

    def in_use(self, agent_id: str) -> int:
        """How many of ``agent_id``'s connections are checked out (or being opened)."""
        entry = self._agents.get(agent_id)
        return 0 if entry is None else len(entry.leases) + entry.pending

    @property
    def agents(self) -> tuple[str, ...]:
        """Agents that have a pool open."""
        return tuple(self._agents)

    @contextlib.asynccontextmanager
    async def lease(self, agent_id: str) -> AsyncIterator[Lease]:
        """A connection of ``agent_id``'s pool for the duration of the block.

        Raises ``GatewayError``: ``pool_exhausted`` (at once) when the agent already holds
        ``pool_size`` connections; ``database_unavailable`` when no connection can be opened
        within ``connect_timeout_s``, the pools are closed, or the agent's pool was drained
        while the connection was being opened. A connection left inside a transaction, or
        marked ``discard``, is closed rather than reused.
        """
        if self._closed:
            raise GatewayError("database_unavailable", "the gateway is closed")
        entry = self._agents.get(agent_id)
        if entry is None:
            entry = await self._open(agent_id)
        used = len(entry.leases) + entry.pending
        if used >= self.pool_size:
            raise GatewayError(
                "pool_exhausted",
                f"agent {agent_id!r} already holds all {self.pool_size} of its connections "
                f"(pool_size={self.pool_size}); retry when one of its statements finishes",
                agent_id=agent_id,
                pool_size=self.pool_size,
                in_use=used,
            )
        entry.pending += 1
        try:
            conn = await entry.pool.getconn(timeout=self._connect_timeout_s)
        except PoolTimeout:
            raise GatewayError(
                "database_unavailable",
                f"no database connection could be opened within {self._connect_timeout_s} s",
                timeout_s=self._connect_timeout_s,
            ) from None
        except PoolClosed:
            raise GatewayError(
                "database_unavailable",
                f"agent {agent_id!r}'s connections were drained while one was being opened",
                agent_id=agent_id,
            ) from None
        finally:
            entry.pending -= 1
        lease = Lease(agent_id, conn)
        entry.leases.add(lease)
        try:
            yield lease
        finally:
            entry.leases.discard(lease)
            await self._give_back(entry, lease)

    async def drain(self, agent_id: str) -> bool:
        """Close ``agent_id``'s pool and cancel the statements it is running.

        Returns whether the agent had a pool. Idempotent; the agent's next request opens a
        new pool.
        """
        entry = self._agents.pop(agent_id, None)
        if entry is None:
            return False
        for lease in list(entry.leases):
            lease.drained = True
            lease.discard = True
            # A cancel that cannot reach the server leaves the statement to its timeout.
            with contextlib.suppress(psycopg.Error):
                await lease.conn.cancel_safe(timeout=self._connect_timeout_s)
        await entry.pool.close(timeout=self._connect_timeout_s)
        return True

    async def close(self) -> None:
        """Drain every agent; later leases fail with ``database_unavailable``. Idempotent."""
        self._closed = True
        for agent_id in list(self._agents):
            await self.drain(agent_id)

    async def _open(self, agent_id: str) -> _AgentPool:
        kwargs = dict(self._kwargs)
        # Shows whose connection it is in pg_stat_activity (63 bytes is PostgreSQL's limit).
        name = f"{self._application_name}:{agent_id}".encode("ascii", "replace")[:63]
        kwargs["application_name"] = name.decode("ascii")
        pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] = AsyncConnectionPool(
            self._conninfo,
            kwargs=kwargs,
            min_size=0,
            max_size=self.pool_size,
            open=False,
            name=f"corral-gateway:{agent_id}",
            timeout=self._connect_timeout_s,
        )
        await pool.open()
        # Another request of the same agent may have opened one while this one awaited.
        existing = self._agents.get(agent_id)
        if existing is not None:
            await pool.close(timeout=self._connect_timeout_s)
            return existing
        entry = _AgentPool(pool)
        self._agents[agent_id] = entry
        return entry

    async def _give_back(self, entry: _AgentPool, lease: Lease) -> None:
        conn = lease.conn
        if lease.discard or conn.closed or conn.info.transaction_status != _IDLE:
            with contextlib.suppress(psycopg.Error):
                await conn.close()
        with contextlib.suppress(psycopg.Error):
            await entry.pool.putconn(conn)
