"""What bounds a SQLite request: its rows read one at a time against ``max_rows`` and
``max_bytes``, and the :class:`Watch` through which the event loop interrupts a statement
that passed its deadline (SQLite checks its progress handler only between instructions, and
one instruction, hex() of a large blob, can take long)."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from corral.gateway._bounds import bytes_warning, row_bytes, too_large
from corral.gateway._errors import GatewayError
from corral.gateway._result import GatewayResult

__all__ = ["Fetched", "Watch", "answer", "read_rows"]


class Watch:
    """One request's hold on the connection its statement runs on, so that another thread
    (the event loop's timer) can interrupt it, and only it."""

    def __init__(self, timeout_s: float) -> None:
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._interrupted = False

    @contextlib.contextmanager
    def running(self, conn: sqlite3.Connection) -> Iterator[None]:
        """Run the block's statements on ``conn`` interruptibly. Raises
        ``GatewayError("statement_timeout")`` at once when the deadline passed while the
        request waited for a worker thread: nothing runs then."""
        with self._lock:
            if self._interrupted:
                raise GatewayError(
                    "statement_timeout",
                    f"the request waited past its statement timeout of {self._timeout_s} s "
                    "for the database and did not run",
                    timeout_s=self._timeout_s,
                )
            self._conn = conn
        try:
            yield
        finally:
            with self._lock:
                self._conn = None

    def interrupt(self) -> None:
        """Interrupt the statement running now, if any, and any the request would start."""
        with self._lock:
            self._interrupted = True
            if self._conn is not None:
                self._conn.interrupt()


@dataclass(slots=True)
class Fetched:
    """A statement's rows as read: those kept, how many there were (``count``), why reading
    was cut (``rows``: past ``max_rows``; ``bytes``: the next row, of ``over`` bytes, would
    have passed ``max_bytes``) and the bytes of the rows kept."""

    columns: tuple[str, ...]
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    count: int = 0
    cut: Literal["rows", "bytes"] | None = None
    bytes: int = 0
    over: int | None = None


def read_rows(
    cursor: sqlite3.Cursor, columns: tuple[str, ...], *, max_rows: int, max_bytes: int, stop: bool
) -> Fetched:
    """The cursor's rows, one at a time, up to ``max_rows + 1`` and ``max_bytes`` (see
    :func:`~corral.gateway._bounds.row_bytes`); past either, reading stops (``stop``) or
    goes on counting rows without keeping them."""
    fetched = Fetched(columns=columns)
    if cursor.description is None:
        return fetched
    rows = fetched.rows
    total = 0
    for row in cursor:
        fetched.count += 1
        if fetched.cut is not None:
            continue
        size = row_bytes(row)
        if total + size > max_bytes:
            fetched.cut, fetched.over = "bytes", size
        else:
            total += size
            fetched.bytes = total
            rows.append(row)
            if len(rows) > max_rows:
                fetched.cut = "rows"
        if fetched.cut is not None and stop:
            break
    return fetched


def answer(fetched: Fetched, max_rows: int, max_bytes: int, *, empty: bool) -> GatewayResult:
    """A read's answer from its rows as read: cut at ``max_rows`` or at ``max_bytes`` (with a
    warning); ``GatewayError("result_too_large")`` when the first row alone passes
    ``max_bytes``."""
    if fetched.cut == "bytes" and not fetched.rows:
        raise too_large(max_bytes, fetched.over)
    kept = fetched.rows[:max_rows]
    warnings: tuple[str, ...] = ()
    if fetched.cut == "bytes":
        warnings = (bytes_warning(max_bytes, len(kept), fetched.bytes),)
    return GatewayResult(
        rows=[dict(zip(fetched.columns, row, strict=True)) for row in kept],
        columns=fetched.columns,
        row_count=len(kept),
        truncated=fetched.cut is not None,
        emptiness="genuinely_empty" if empty else None,
        warnings=warnings,
    )
