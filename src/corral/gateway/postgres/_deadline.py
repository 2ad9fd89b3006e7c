"""The gateway's own deadline on a leased PostgreSQL connection: the server's statement timeout
is checked only between steps of its work (one long expression can run far past it), so a
request still running past its timeout is cancelled, and past the margin its connection is cut."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator

import psycopg

from corral.gateway._bounds import timeout_margin_s
from corral.gateway.postgres._pools import Lease

__all__ = ["deadline"]


@contextlib.asynccontextmanager
async def deadline(lease: Lease, timeout_s: float) -> AsyncIterator[None]:
    """Bound the block's work on ``lease`` to ``timeout_s`` plus the margin
    (:func:`~corral.gateway._bounds.timeout_margin_s`), on the event loop's clock.

    Halfway into the margin a cancel request is sent (a request of several statements can
    pass its timeout while none of them does); at its end the connection's socket is shut
    down, so whatever awaits the server fails at once with a psycopg error, and the lease is
    marked ``timed_out`` (:func:`~._execute.map_error` answers ``statement_timeout``) and
    ``discard``. A lease a cancel was sent for is discarded too: the cancel could otherwise
    reach the connection's next statement.
    """
    loop = asyncio.get_running_loop()
    margin = timeout_margin_s(timeout_s)
    cancels: list[asyncio.Task[None]] = []
    # One timer per request (the read path pays for it): the cut is armed by the cancel.
    timer: asyncio.TimerHandle | None = None

    def cut() -> None:
        lease.timed_out = lease.discard = True
        _shut_down(lease.conn)

    def cancel() -> None:
        nonlocal timer
        lease.discard = True
        cancels.append(loop.create_task(_cancel(lease, margin)))
        timer = loop.call_later(margin / 2, cut)

    timer = loop.call_later(timeout_s + margin / 2, cancel)
    try:
        yield
    finally:
        timer.cancel()
        for task in cancels:
            task.cancel()


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
