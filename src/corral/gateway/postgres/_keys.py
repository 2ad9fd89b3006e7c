"""Keyed writes on PostgreSQL: each (agent, idempotency key, plan_hash) runs its work once,
whatever the retries, in this process or another."""

from __future__ import annotations

import asyncio
import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import psycopg

from corral.gateway._bounds import rows_bytes
from corral.gateway._errors import GatewayError
from corral.gateway._journal import StoredResult, decode_result, stored_plan
from corral.gateway._result import GatewayResult
from corral.gateway.postgres._deadline import Watchdog
from corral.gateway.postgres._execute import Plan, map_error
from corral.gateway.postgres._journal import JournalName
from corral.gateway.postgres._pools import AgentPools, Lease
from corral.gateway.postgres._write import KeyTaken, run_write
from corral.kernel import Clock

__all__ = ["KeyedWrites", "ReplayCache"]

_Slot = tuple[str, str, str]  # agent_id, key, stored plan_hash: a key's identity


@dataclass(eq=False, slots=True)
class _InFlight:
    fingerprint: str
    done: asyncio.Future[None]


class KeyedWrites:
    """The idempotency side of the PostgreSQL engine (docs/architecture.md, seed 003, gives the
    order of checks). One event loop."""

    def __init__(
        self,
        pools: AgentPools,
        *,
        watchdog: Watchdog,
        journal: JournalName,
        clock: Clock,
        key_wait_s: float,
        max_rows: int,
        max_bytes: int,
        statement_timeout_s: float,
        replay_cache_size: int,
        replay_cache_bytes: int,
        agent_role: str | None = None,
    ) -> None:
        self._pools = pools
        self._watchdog = watchdog
        self._agent_role = agent_role
        self._journal = journal
        self._clock = clock
        self._key_wait_s = key_wait_s
        self._key_wait_ms = max(1, math.ceil(key_wait_s * 1000))
        self._max_rows = max_rows
        self._max_bytes = max_bytes
        self._statement_timeout_s = statement_timeout_s
        self._inflight: dict[_Slot, _InFlight] = {}
        self.replays = ReplayCache(replay_cache_size, replay_cache_bytes)

    async def run(
        self, agent_id: str, key: str, plan_hash: str | None, fingerprint: str, plan: Plan
    ) -> GatewayResult:
        """Run the write ``plan`` under ``(agent_id, key, plan_hash)`` once; raises
        ``GatewayError``."""
        slot = (agent_id, key, stored_plan(plan_hash))
        while True:
            cached = self.replays.get(slot)
            if cached is not None:
                return _replay(key, fingerprint, *cached)
            running = self._inflight.get(slot)
            if running is None:
                break
            if running.fingerprint != fingerprint:
                raise _conflict(key, "is running")
            if not await self._wait(running.done, self._key_wait_s):
                raise GatewayError(
                    "idempotency_in_progress",
                    f"idempotency key {key!r} is already running for this agent (waited "
                    f"{self._key_wait_s} s); retry with the same key",
                    key=key,
                    waited_s=self._key_wait_s,
                )
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._inflight[slot] = _InFlight(fingerprint, done)
        try:
            async with self._pools.lease(agent_id) as lease:
                self._watchdog.watch(lease)
                try:
                    return await self._claim_and_run(lease, slot, fingerprint, plan)
                finally:
                    self._watchdog.release(lease)
        finally:
            del self._inflight[slot]
            done.set_result(None)

    async def _claim_and_run(
        self, lease: Lease, slot: _Slot, fingerprint: str, plan: Plan
    ) -> GatewayResult:
        agent_id, key, plan_hash = slot
        for _ in range(2):
            try:
                result, stored = await run_write(
                    lease,
                    plan,
                    journal=self._journal,
                    agent_id=agent_id,
                    key=key,
                    plan_hash=plan_hash,
                    fingerprint=fingerprint,
                    now=self._clock.now(),
                    key_wait_ms=self._key_wait_ms,
                    max_rows=self._max_rows,
                    agent_role=self._agent_role,
                    max_bytes=self._max_bytes,
                )
            except KeyTaken:
                entry = await self._lookup(lease, slot)
                if entry is None:
                    continue  # the holder's row is gone (deleted by hand): claim it afresh
                return self._journalled(slot, fingerprint, entry)
            except psycopg.Error as exc:
                timeout_s = self._statement_timeout_s
                raise map_error(exc, lease, statement_timeout_s=timeout_s, reading=False) from None
            self.replays.put(slot, fingerprint, stored)
            return result
        raise GatewayError(
            "idempotency_in_progress",
            f"idempotency key {key!r} changed hands while being claimed; retry with it",
            key=key,
        )

    async def _lookup(self, lease: Lease, slot: _Slot) -> tuple[Any, ...] | None:
        conn = lease.conn
        try:
            if self._agent_role is None:
                cur = await conn.execute(self._journal.lookup_sql, list(slot))
                row = await cur.fetchone()
            else:
                # The agent role may not read the journal: the session user reads it.
                async with conn.transaction():
                    await conn.execute("SET LOCAL ROLE NONE")
                    cur = await conn.execute(self._journal.lookup_sql, list(slot))
                    row = await cur.fetchone()
        except psycopg.Error as exc:
            raise map_error(exc, lease, statement_timeout_s=self._statement_timeout_s) from None
        return tuple(row) if row is not None else None

    def _journalled(self, slot: _Slot, fingerprint: str, entry: tuple[Any, ...]) -> GatewayResult:
        stored_fp, state, payload, created_at, _ = entry
        key = slot[1]
        if stored_fp != fingerprint:
            raise _conflict(key, "was used")
        if state != "completed":
            raise GatewayError(
                "outcome_unknown",
                f"idempotency key {key!r} was journalled at {created_at.isoformat()} but its "
                "outcome was never recorded: check the data, then use a new key",
                key=key,
            )
        stored = decode_result(payload)
        self.replays.put(slot, stored_fp, stored)
        return _replay(key, fingerprint, stored_fp, stored)

    async def _wait(self, future: asyncio.Future[None], seconds: float) -> bool:
        """Wait for ``future`` at most ``seconds`` of the clock; whether it is done."""
        if future.done():
            return True
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def wake(*_: object) -> None:
            if not waiter.done():
                waiter.set_result(None)

        future.add_done_callback(wake)
        timer = self._clock.call_later(seconds, wake)
        try:
            await waiter
        finally:
            timer.cancel()
            future.remove_done_callback(wake)
        return future.done()


class ReplayCache:
    """Completed keys' results, least recently used first, bounded both in entries
    (``size``) and in the bytes of their values (``max_bytes``, see
    :func:`~corral.gateway._bounds.rows_bytes`). A result larger than ``max_bytes`` is not
    kept: its replay reads the journal."""

    def __init__(self, size: int, max_bytes: int) -> None:
        self.size = size
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[_Slot, tuple[str, StoredResult, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, slot: _Slot) -> tuple[str, StoredResult] | None:
        entry = self._entries.get(slot)
        if entry is None:
            return None
        self._entries.move_to_end(slot)
        return entry[0], entry[1]

    def put(self, slot: _Slot, fingerprint: str, stored: StoredResult) -> None:
        if self.size == 0:
            return
        size = rows_bytes(stored.rows)
        old = self._entries.pop(slot, None)
        if old is not None:
            self.bytes -= old[2]
        if size > self.max_bytes:
            return
        self._entries[slot] = (fingerprint, stored, size)
        self.bytes += size
        while len(self._entries) > self.size or self.bytes > self.max_bytes:
            self.bytes -= self._entries.popitem(last=False)[1][2]


def _replay(key: str, fingerprint: str, stored_fp: str, stored: StoredResult) -> GatewayResult:
    if stored_fp != fingerprint:
        raise _conflict(key, "was used")
    return GatewayResult(
        rows=[dict(row) for row in stored.rows],
        columns=stored.columns,
        row_count=stored.row_count,
        status="replayed",
        truncated=stored.truncated,
        warnings=stored.warnings,
    )


def _conflict(key: str, state: str) -> GatewayError:
    return GatewayError(
        "idempotency_conflict",
        f"idempotency key {key!r} {state} for different work under the same plan_hash "
        "(another statement or other parameters); use a new key, or a new plan_hash for a "
        "new plan",
        key=key,
    )
