"""The PostgreSQL engine's current catalog, its own connection, and when the catalog is reloaded
(on demand after a sign of schema change, or when it is too old)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping
from typing import Any

import psycopg

from corral.gateway._catalog import Catalog
from corral.gateway._catalog_load import load_postgres_catalog
from corral.gateway._errors import GatewayError
from corral.gateway.postgres._execute import map_error
from corral.gateway.postgres._journal import JournalName, ensure_journal
from corral.kernel import Clock

__all__ = ["CatalogKeeper"]


class CatalogKeeper:
    def __init__(
        self,
        dsn: str,
        *,
        connect_kwargs: Mapping[str, Any],
        journal: JournalName,
        clock: Clock,
        refresh_s: float,
        max_age_s: float | None,
    ) -> None:
        self._dsn = dsn
        self._kwargs = dict(connect_kwargs)
        self._journal = journal
        self._clock = clock
        self._refresh_s = refresh_s
        self._max_age_s = max_age_s
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._lock = asyncio.Lock()
        self._catalog: Catalog | None = None
        self._loaded_at = 0.0
        self._last_demand: dict[str, float] = {}
        self._loading: asyncio.Future[Catalog] | None = None

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            raise GatewayError("database_unavailable", "the gateway is not open")
        return self._catalog

    @property
    def is_open(self) -> bool:
        return self._catalog is not None

    async def open(self) -> None:
        """Create the journal if missing and load the catalog; raises ``GatewayError``."""
        async with self._lock:
            conn = await self._connection()
            try:
                await ensure_journal(conn, self._journal)
            except psycopg.Error as exc:
                raise map_error(exc, None, statement_timeout_s=0) from None
        await self.refresh()

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()

    async def _connection(self) -> psycopg.AsyncConnection[Any]:
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self._dsn, application_name="corral-gateway", **self._kwargs
                )
            except psycopg.Error as exc:
                raise map_error(exc, None, statement_timeout_s=0) from None
            self._conn = conn
        return conn

    async def refresh(self) -> Catalog:
        """Reload now (concurrent calls share one load); raises ``GatewayError``."""
        shared = self._loading
        if shared is None:
            shared = asyncio.ensure_future(self._load())
            self._loading = shared
            shared.add_done_callback(self._loaded)
        return await asyncio.shield(shared)

    def _loaded(self, future: asyncio.Future[Catalog]) -> None:
        self._loading = None
        if not future.cancelled():
            future.exception()  # marks it retrieved; every awaiter still gets it

    async def _load(self) -> Catalog:
        async with self._lock:
            conn = await self._connection()
            try:
                full = await load_postgres_catalog(conn)
            except psycopg.Error as exc:
                raise map_error(exc, None, statement_timeout_s=0) from None
        self._loaded_at = self._clock.monotonic()
        current = self._catalog
        if current is not None and current.version == full.version:
            return current
        hidden = self._journal.schema
        tables = {k: t for k, t in full.tables.items() if t.schema != hidden}
        sequences = {k: t for k, t in full.sequences.items() if t.schema != hidden}
        self._catalog = Catalog(
            tables=tables, version=full.version, dialect=full.dialect, sequences=sequences
        )
        return self._catalog

    async def refresh_on_demand(self, sign: str) -> bool:
        """Reload after a sign of schema change, unless the same ``sign`` (``refused``:
        analysis met an unknown name; ``database``: the database did) caused one within
        ``refresh_s``. Returns whether the catalog changed; a failed reload counts as
        unchanged.
        """
        before = self.catalog.version
        if self._loading is None:
            now = self._clock.monotonic()
            if now - self._last_demand.get(sign, -math.inf) < self._refresh_s:
                return False
            self._last_demand[sign] = now
        try:
            await self.refresh()
        except GatewayError:
            return False
        return self.catalog.version != before

    async def refresh_if_old(self) -> None:
        """Reload when the catalog is older than ``max_age_s``. A failed reload keeps the
        catalog in hand (the request meets the outage itself) and waits another period."""
        max_age = self._max_age_s
        if max_age is None or self._clock.monotonic() - self._loaded_at < max_age:
            return
        try:
            await self.refresh()
        except GatewayError:
            self._loaded_at = self._clock.monotonic()
