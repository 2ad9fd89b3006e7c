"""The gateway's own deadline on a leased PostgreSQL connection: the server's statement timeout
is checked only between steps of its work (one long expression can run far past it), so a
request still running past its timeout is cancelled, and past the margin its connection is cut."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Callable

import psycopg

from corral.gateway._bounds import timeout_margin_s
from corral.gateway.postgres._pools import Lease

__all__ = ["Watchdog"]


class Watchdog:
    """Keeps every lease out within ``timeout_s`` plus the margin
    (:func:`~corral.gateway._bounds.timeout_margin_s`), on the event loop's clock.

    A lease past its timeout by half the margin gets a cancel request (a request of several
    statements can pass its timeout while none of them does); by the end of the margin its
    connection's socket is shut down, so whatever awaits the server fails at once with a
    psycopg error, and the lease is marked ``timed_out`` (:func:`~._execute.map_error`
    answers ``statement_timeout``) and ``discard``. A lease a cancel was sent for is
    discarded too: the cancel could otherwise reach the connection's next statement.

    One task watches every lease, waking every quarter of the margin while any is out: a
    timer per request would cost every read. One event loop.
    """

    def __init__(self, timeout_s: float) -> None:
        self._timeout_s = timeout_s
        self._margin = timeout_margin_s(timeout_s)
        self._tick = self._margin / 4
        self._leases: dict[Lease, float] = {}  # lease -> when its clock started
        self._cancelled: set[Lease] = set()  # leases a cancel was sent for, still out
        # The event loop's clock, taken when the watching task starts (before any lease).
        self._time: Callable[[], float] = time.monotonic
        self._task: asyncio.Task[None] | None = None
        self._cancels: set[asyncio.Task[None]] = set()

    def watch(self, lease: Lease) -> None:
        """Start ``lease``'s clock; :meth:`release` it when its request is done. Called by
        every request: one dict entry, nothing allocated."""
        if self._task is None:
            loop = asyncio.get_running_loop()
            self._time = loop.time
            self._task = loop.create_task(self._run())
        self._leases[lease] = self._time()

    def release(self, lease: Lease) -> None:
        self._leases.pop(lease, None)

    def close(self) -> None:
        """Stop watching (the pools are closed: no lease is out)."""
        self._leases.clear()
        self._cancelled.clear()
        if self._task is not None:
            self._task.cancel()
            self._task = None
        for task in self._cancels:
            task.cancel()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        # Checked every tick: a cancel between half and three quarters of the margin past
        # the timeout, the cut between three quarters and the whole of it.
        cancel_at = self._timeout_s + self._margin / 2
        cut_at = self._timeout_s + self._margin - self._tick
        try:
            while self._leases:
                await asyncio.sleep(self._tick)
                now = loop.time()
                cancelled = self._cancelled
                cancelled.intersection_update(self._leases)  # forget the leases released
                for lease, started in list(self._leases.items()):
                    late = now - started
                    if late >= cut_at:
                        del self._leases[lease]
                        cancelled.discard(lease)
                        lease.timed_out = lease.discard = True
                        _shut_down(lease.conn)
                    elif late >= cancel_at and lease not in cancelled:
                        cancelled.add(lease)
                        lease.discard = True
                        task = loop.create_task(_cancel(lease, self._margin))
                        self._cancels.add(task)
                        task.add_done_callback(self._cancels.discard)
        finally:
            if self._task is asyncio.current_task():
                self._task = None


async def _cancel(lease: Lease, timeout_s: float) -> None:
    # A cancel that cannot reach the server leaves the statement to the cut.
    with contextlib.suppress(psycopg.Error):
        await lease.conn.cancel_safe(timeout=timeout_s)


def _shut_down(conn: psycopg.AsyncConnection[object]) -> None:
    """Shut the connection's socket down, both ways: the server sees the client gone, and
    libpq's next read fails. The descriptor stays libpq's, closed with the connection."""
    if conn.closed:
        return
    try:
        fd = conn.pgconn.socket
    except psycopg.OperationalError:
        return
    with (
        contextlib.suppress(OSError),
        socket.socket(fileno=os.dup(fd)) as sock,
    ):
        sock.shutdown(socket.SHUT_RDWR)
