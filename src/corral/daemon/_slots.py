"""The daemon's concurrent turns (``corral serve --max-concurrent-turns N``), shared by priority.

At most ``limit`` turns run at once. A turn that finds them all taken waits for a slot (its
agent stays ``running``, shown with ``queued: true``); the wait is not part of the turn's
timeout, which starts when the turn does. Freed slots go to the waiting turns by priority,
as weighted shares so that no priority is starved: stride scheduling over the four
priorities with weights 8/4/2/1 (critical/high/normal/low, the kernel's Priority values).
Each priority has a *pass*; a slot goes to the waiting priority with the lowest pass (the
higher priority on a tie, then the turn that waited longest within it), whose pass then
grows by 8 / its weight. A priority that had nobody waiting starts from the pass of the last
grant, so it neither saves up turns while absent nor falls behind: a critical turn that
arrives is granted the next slot; while critical, high, normal and low turns all wait, they
are granted about 8:4:2:1. Without a limit, turns start at once and nothing is tracked.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable

from corral.kernel import Priority
from corral.kernel import _validate as v

__all__ = ["TurnSlots"]

_SCALE = int(Priority.CRITICAL)  # strides are whole numbers: 8 // weight


class TurnSlots:
    """At most ``limit`` turns at once (None: no limit), granted by priority share."""

    __slots__ = ("_last_pass", "_limit", "_passes", "_queues", "_running", "_waiting")

    def __init__(self, limit: int | None = None) -> None:
        v.positive_int("TurnSlots", "limit", limit, optional=True)
        self._limit = limit
        self._running = 0
        self._queues: dict[Priority, deque[tuple[str, asyncio.Future[None]]]] = {}
        self._passes: dict[Priority, int] = {}
        self._last_pass = 0
        # Waiting turns per agent: ``waiting(agent_id)`` is asked for every agent a listing
        # shows, so it must not walk the queues (that made GET /agents quadratic).
        self._waiting: dict[str, int] = {}

    @property
    def limit(self) -> int | None:
        return self._limit

    @property
    def running(self) -> int:
        """Turns holding a slot now."""
        return self._running

    def waiting(self, agent_id: str | None = None) -> int:
        """How many turns wait for a slot (of ``agent_id`` only, when given), those granted
        one but not yet started included (they have not started either)."""
        if agent_id is not None:
            return self._waiting.get(agent_id, 0)
        return sum(self._waiting.values())

    async def run(
        self,
        agent_id: str,
        priority: Priority,
        work: Callable[[], Awaitable[None]],
        on_wait: Callable[[bool], Awaitable[None]] | None = None,
    ) -> None:
        """Run ``work()`` (a turn, started only then) once it has a slot; the slot is given
        back when it ends, however it ends. Cancelled while waiting, the turn never starts.

        ``on_wait(True)`` is awaited when the turn has to wait for a slot, and
        ``on_wait(False)`` once it has one after waiting (a turn that gets one at once hears
        nothing)."""
        if self._limit is None:
            await work()
            return
        waited = await self._acquire(agent_id, priority, on_wait)
        try:
            if waited and on_wait is not None:
                await on_wait(False)
            await work()
        finally:
            self._release()

    async def _acquire(
        self,
        agent_id: str,
        priority: Priority,
        on_wait: Callable[[bool], Awaitable[None]] | None,
    ) -> bool:
        """Take a slot, waiting for one if need be; whether it waited."""
        assert self._limit is not None
        if self._running < self._limit and not any(self._queues.values()):
            self._running += 1
            return False
        queue = self._queues.setdefault(priority, deque())
        if not queue:
            # Back from nobody waiting: it starts at the current pass, no credit saved up.
            self._passes[priority] = max(self._passes.get(priority, 0), self._last_pass)
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (agent_id, granted)
        queue.append(entry)
        self._waiting[agent_id] = self._waiting.get(agent_id, 0) + 1
        try:
            if on_wait is not None:
                await on_wait(True)
            await granted
        except BaseException:
            if granted.done() and not granted.cancelled():
                self._release()  # granted as it was cancelled: the slot goes on to the next
            elif entry in queue:
                queue.remove(entry)
            raise
        finally:
            # Counted until its task runs again: a granted turn has not started before that.
            self._left(agent_id)
        return True

    def _release(self) -> None:
        self._running -= 1
        self._grant()

    def _grant(self) -> None:
        assert self._limit is not None
        while self._running < self._limit:
            waiting = [p for p, q in self._queues.items() if q]
            if not waiting:
                return
            best = min(waiting, key=lambda p: (self._passes.get(p, 0), -p))
            _, granted = self._queues[best].popleft()
            if granted.done():
                continue  # cancelled, its task not yet told: it takes no slot
            self._last_pass = self._passes.get(best, 0)
            self._passes[best] = self._last_pass + _SCALE // max(1, int(best))
            self._running += 1
            granted.set_result(None)

    def _left(self, agent_id: str) -> None:
        """A turn of ``agent_id`` is out of the queues."""
        left = self._waiting.pop(agent_id, 0) - 1
        if left > 0:
            self._waiting[agent_id] = left
