"""The PostgreSQL engine behind :class:`~corral.gateway.Gateway`: its options, its pools, its
catalog keeper and its keyed writes, and the one-round-trip read."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import psycopg
from psycopg.conninfo import conninfo_to_dict

from corral.gateway._breaker_journal import FreezeJournal, PostgresFreezeJournal
from corral.gateway._catalog import Catalog
from corral.gateway._errors import GatewayError
from corral.gateway._parse_threads import INLINE_CHARS, off_loop
from corral.gateway._result import GatewayResult
from corral.gateway.postgres._catalog import CatalogKeeper
from corral.gateway.postgres._deadline import Watchdog
from corral.gateway.postgres._execute import map_error, run_read
from corral.gateway.postgres._journal import JournalName, check_identifier
from corral.gateway.postgres._keys import KeyedWrites
from corral.gateway.postgres._plan import Planned, plan_request
from corral.gateway.postgres._pools import AgentPools
from corral.gateway.postgres._sql import analyze_fully, is_analysed
from corral.kernel import Clock
from corral.kernel import _validate as v
from corral.kernel._errors import InvalidArgumentError

__all__ = ["PostgresEngine", "PostgresOptions"]

_SCHEMA_SQLSTATES = frozenset({"42P01", "42703"})  # undefined table / column


@dataclass(frozen=True, slots=True, kw_only=True)
class PostgresOptions:
    """What ``Gateway.connect`` takes for a PostgreSQL database (defaults: its signature)."""

    dsn: str
    pool_size: int
    statement_timeout_s: float
    max_rows: int
    clock: Clock
    journal_schema: str
    journal_table: str
    key_wait_s: float
    connect_timeout_s: float
    catalog_refresh_s: float
    catalog_max_age_s: float | None
    replay_cache_size: int
    max_bytes: int
    replay_cache_bytes: int
    agent_role: str | None = None

    def check(self, where: str) -> None:
        """Raise ``InvalidArgumentError`` naming the first bad option."""
        try:
            conninfo_to_dict(self.dsn)
        except psycopg.Error:
            raise InvalidArgumentError(
                where, "dsn", "a libpq connection string or URI", "<dsn>"
            ) from None
        check_identifier(where, "journal_schema", self.journal_schema)
        check_identifier(where, "journal_table", self.journal_table)
        v.positive_int(where, "pool_size", self.pool_size)
        v.positive_number(where, "statement_timeout_s", self.statement_timeout_s)
        v.positive_int(where, "max_rows", self.max_rows)
        v.instance_of(where, "clock", self.clock, Clock)
        v.non_negative_number(where, "key_wait_s", self.key_wait_s)
        v.positive_number(where, "connect_timeout_s", self.connect_timeout_s)
        v.non_negative_number(where, "catalog_refresh_s", self.catalog_refresh_s)
        v.positive_number(where, "catalog_max_age_s", self.catalog_max_age_s, optional=True)
        v.non_negative_int(where, "replay_cache_size", self.replay_cache_size)
        if self.agent_role is not None:
            check_identifier(where, "agent_role", self.agent_role)
        v.positive_int(where, "max_bytes", self.max_bytes)
        v.non_negative_int(where, "replay_cache_bytes", self.replay_cache_bytes)


class PostgresEngine:
    """One PostgreSQL database: per-agent pools, the catalog keeper, keyed writes."""

    write_noun = "statement"

    def __init__(self, options: PostgresOptions) -> None:
        self._options = options
        self._closed = False
        journal = JournalName(options.journal_schema, options.journal_table)
        self._journal = journal
        ms = max(1, math.ceil(options.statement_timeout_s * 1000))
        dsn_options = str(conninfo_to_dict(options.dsn).get("options") or "")
        # Reads rely on the session default being READ ONLY (checked before each read).
        session = f"{dsn_options} -c default_transaction_read_only=on -c statement_timeout={ms}"
        if options.agent_role is not None:
            # Agents' SQL runs as this role, which has no rights on the journal; the session
            # user (the owner) writes the journal rows (postgres/_write.py).
            session += f" -c role={options.agent_role}"
        connect_kwargs: dict[str, Any] = {
            "autocommit": True,
            # psycopg's own preparing stays off: requests are sent by _execute, which prepares
            # them itself (and keeps track of statements an aborted pipeline never created).
            "prepare_threshold": None,
            "connect_timeout": max(2, math.ceil(options.connect_timeout_s)),
        }
        self._keeper = CatalogKeeper(
            options.dsn,
            connect_kwargs=connect_kwargs,
            journal=journal,
            clock=options.clock,
            refresh_s=options.catalog_refresh_s,
            max_age_s=options.catalog_max_age_s,
        )
        self.pools = AgentPools(
            options.dsn,
            pool_size=options.pool_size,
            connect_timeout_s=options.connect_timeout_s,
            connect_kwargs={**connect_kwargs, "options": session.strip()},
        )
        self._watchdog = Watchdog(options.statement_timeout_s)
        self._writes = KeyedWrites(
            self.pools,
            watchdog=self._watchdog,
            journal=journal,
            clock=options.clock,
            key_wait_s=options.key_wait_s,
            max_rows=options.max_rows,
            max_bytes=options.max_bytes,
            statement_timeout_s=options.statement_timeout_s,
            replay_cache_size=options.replay_cache_size,
            agent_role=options.agent_role,
            replay_cache_bytes=options.replay_cache_bytes,
        )
        # Bound once: called by every request.
        self.refresh_if_old = self._keeper.refresh_if_old

    # --- lifecycle ----------------------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        return not self._closed and self._keeper.is_open

    @property
    def catalog(self) -> Catalog:
        return self._keeper.catalog

    def freeze_journal(self) -> FreezeJournal:
        # Freezes live in the journal's schema, hidden from agents with it.
        return PostgresFreezeJournal(self._options.dsn, schema=self._journal.schema)

    async def open(self) -> None:
        # The database is first reached by the freeze journal, opened next, so its table
        # exists before the catalog is first loaded and never changes the catalog's version.
        return None

    async def load_catalog(self) -> None:
        await self._keeper.open()

    def closing(self) -> None:
        self._closed = True

    async def close(self) -> None:
        try:
            await self.pools.close()
            self._watchdog.close()
        finally:
            await self._keeper.close()

    # --- catalog ------------------------------------------------------------------------------

    async def refresh_catalog(self) -> Catalog:
        return await self._keeper.refresh()

    async def reload_catalog(self, sign: Literal["refused", "database"]) -> bool:
        return await self._keeper.refresh_on_demand(sign)

    def schema_shrunk(self, error: GatewayError) -> bool:
        return error.details.get("sqlstate") in _SCHEMA_SQLSTATES

    # --- requests -----------------------------------------------------------------------------

    async def plan(self, request: Any, catalog: Catalog) -> Planned:
        sql = request.get("sql") if isinstance(request, Mapping) else None
        if type(sql) is str and len(sql) > INLINE_CHARS and not is_analysed(sql, catalog):
            # A long statement is analysed off the event loop (a short one inline: the read
            # path stays as fast); its answer, refusals included, is cached for the plan.
            with contextlib.suppress(GatewayError):
                await off_loop(analyze_fully, sql, catalog)
        return plan_request(request, catalog)

    async def read(self, agent_id: str, planned: Planned) -> GatewayResult:
        options = self._options
        timeout_s = options.statement_timeout_s
        watchdog = self._watchdog
        async with self.pools.lease(agent_id) as lease:
            watchdog.watch(lease)
            try:
                return await run_read(
                    lease, planned.plan, max_rows=options.max_rows, max_bytes=options.max_bytes
                )
            except psycopg.Error as exc:
                raise map_error(exc, lease, statement_timeout_s=timeout_s) from None
            finally:
                watchdog.release(lease)

    async def write(self, agent_id: str, key: str, planned: Planned) -> GatewayResult:
        return await self._writes.run(
            agent_id, key, planned.plan_hash, planned.fingerprint(), planned.plan
        )

    async def drain(self, agent_id: str) -> bool:
        return await self.pools.drain(agent_id)

    def connections_in_use(self, agent_id: str) -> int:
        return self.pools.in_use(agent_id)
