"""The gateway's own deadline on a leased PostgreSQL connection: the server's statement timeout
is checked only between steps of its work (one long expression can run far past it), so a
request still running past its timeout is cancelled, and past the margin its connection is cut."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket

import psycopg

from corral.gateway._bounds import timeout_margin_s
from corral.gateway.postgres._pools import Lease

__all__ = ["Deadline"]


class Deadline:
    """Bound the block's work on ``lease`` to ``timeout_s`` plus the margin
    (:func:`~corral.gateway._bounds.timeout_margin_s`), on the event loop's clock.

    Halfway into the margin a cancel request is sent (a request of several statements can
    pass its timeout while none of them does); at its end the connection's socket is shut
    down, so whatever awaits the server fails at once with a psycopg error, and the lease is
    marked ``timed_out`` (:func:`~._execute.map_error` answers ``statement_timeout``) and
    ``discard``. A lease a cancel was sent for is discarded too: the cancel could otherwise
    reach the connection's next statement. A class, not a generator: every read enters one.
    """

    __slots__ = ("_cancels", "_lease", "_loop", "_margin", "_timeout_s", "_timer")

    def __init__(self, lease: Lease, timeout_s: float) -> None:
        self._lease = lease
        self._timeout_s = timeout_s
        self._margin = timeout_margin_s(timeout_s)
        self._cancels: list[asyncio.Task[None]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def __aenter__(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        # One timer per request: the cut is armed by the cancel.
        self._timer = loop.call_later(self._timeout_s + self._margin / 2, self._cancel)

    async def __aexit__(self, *exc_info: object) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for task in self._cancels:
            task.cancel()

    def _cancel(self) -> None:
        lease, loop = self._lease, self._loop
        assert loop is not None
        lease.discard = True
        self._cancels.append(loop.create_task(_cancel(lease, self._margin)))
        self._timer = loop.call_later(self._margin / 2, self._cut)

    def _cut(self) -> None:
        lease = self._lease
        lease.timed_out = lease.discard = True
        _shut_down(lease.conn)


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
