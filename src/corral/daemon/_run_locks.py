"""The agent service's locks: every decision is taken under one, but the turns of different
runs need not wait for each other's commits.

A command that may touch any agent (spawn, stop, delete, an answer, a token...) holds the
service :meth:`RunLocks.exclusive`: nothing else is decided meanwhile, as with one mutex. The
steps of a turn -- a prompt starting it, its outcome settled, its wait for a slot -- hold
:meth:`RunLocks.run` for their agent's run: they exclude the exclusive commands and the other
steps of the same run, not those of other runs. Everything such a step reads and writes
belongs to its run (the agent, its ancestors' budgets, the run's headcount, notices to its
parent), so steps of two runs decide on what is theirs, and their appends may be committed
together (see ``stores._group``): the commits of a hundred runs then overlap instead of
following one another.

An idempotency key is claimed for the whole step (:meth:`RunLocks.run` with ``key``), so two
requests with one key are answered one after the other (the second replays the first), even
from two runs.

Exclusive holders are preferred: once one waits, no new run step starts, so a steady stream of
turns cannot hold a command off. Not reentrant: a holder must not ask again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

__all__ = ["RunLocks"]


class RunLocks:
    """One exclusive lock over per-run locks (see the module docstring). One event loop."""

    def __init__(self) -> None:
        self._shared = 0  # run steps holding the gate
        self._exclusive = False
        self._waiting = 0  # exclusive holders waiting for the gate
        self._changed: asyncio.Future[None] | None = None  # done at the gate's next change
        self._runs: dict[str, _Counted] = {}
        self._keys: dict[str, _Counted] = {}

    @contextlib.asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        """Hold everything: no run step and no other exclusive holder meanwhile."""
        self._waiting += 1
        try:
            while self._exclusive or self._shared:
                await self._change()
        finally:
            self._waiting -= 1
            if not self._waiting:
                self._wake()  # run steps held back by this one may go (it got in or left)
        self._exclusive = True
        try:
            yield
        finally:
            self._exclusive = False
            self._wake()

    @contextlib.asynccontextmanager
    async def run(self, run_id: str, *, key: str | None = None) -> AsyncIterator[None]:
        """Hold run ``run_id`` (and idempotency key ``key``): excludes the exclusive holders,
        the other steps of the run and the other holders of the key."""
        async with _claimed(self._keys, key), _claimed(self._runs, run_id):
            # No await when nothing exclusive holds or waits: the common case costs nothing.
            while self._exclusive or self._waiting:
                await self._change()
            self._shared += 1
            try:
                yield
            finally:
                self._shared -= 1
                if not self._shared:
                    self._wake()

    def held(self) -> bool:
        """Whether anything is held (for checks and tests)."""
        return self._exclusive or self._shared > 0

    def _change(self) -> asyncio.Future[None]:
        if self._changed is None:
            self._changed = asyncio.get_running_loop().create_future()
        # Shielded: one waiter cancelled must not cancel the others' wait.
        return asyncio.shield(self._changed)

    def _wake(self) -> None:
        changed, self._changed = self._changed, None
        if changed is not None and not changed.done():
            changed.set_result(None)


class _Counted:
    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0


@contextlib.asynccontextmanager
async def _claimed(locks: dict[str, _Counted], name: str | None) -> AsyncIterator[None]:
    """Hold ``locks[name]`` (made on first use, dropped when its last user leaves, so the
    table holds only names in use); nothing for None."""
    if name is None:
        yield
        return
    found = locks.get(name)
    if found is None:
        found = locks[name] = _Counted()
    found.users += 1
    try:
        async with found.lock:
            yield
    finally:
        found.users -= 1
        if found.users == 0:
            del locks[name]
