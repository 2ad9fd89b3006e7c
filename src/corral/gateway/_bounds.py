"""The bounds every request keeps on both engines: its time (the statement timeout plus the
gateway's margin, on the gateway's own clock) and the bytes of its result (``max_bytes``),
with the errors and warnings that say which bound was met."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from corral.gateway._errors import GatewayError

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_REPLAY_CACHE_BYTES",
    "bytes_warning",
    "row_bytes",
    "rows_bytes",
    "timed_out",
    "timeout_margin_s",
    "too_large",
    "value_bytes",
]

# 16 MiB: a thousand rows (the default max_rows) of 16 KiB each, more than an agent reads in
# one answer, and small enough that a few agents' answers at once stay well within memory.
DEFAULT_MAX_BYTES = 16 * 1024 * 1024
# 64 MiB: four results at the byte cap, or thousands of the usual few-row results.
DEFAULT_REPLAY_CACHE_BYTES = 64 * 1024 * 1024
_MARGIN_MIN_S = 0.5
_MARGIN_SHARE = 0.2
_NUMBER_BYTES = 8


def timeout_margin_s(timeout_s: float) -> float:
    """How long past its statement timeout a request may take before the gateway gives up on
    it: 0.5 s or a fifth of the timeout, whichever is larger (time for the database's own
    timeout to be answered, and for a cancel to reach it)."""
    return max(_MARGIN_MIN_S, _MARGIN_SHARE * timeout_s)


def timed_out(timeout_s: float, *, writing: bool = False, key: str | None = None) -> GatewayError:
    """``statement_timeout`` for a request the gateway stopped waiting for, past its timeout
    and the margin (the database had not stopped it)."""
    margin = timeout_margin_s(timeout_s)
    message = (
        f"the request ran longer than the statement timeout of {timeout_s} s (and the "
        f"gateway's margin of {margin} s) and was abandoned"
    )
    details: dict[str, Any] = {"timeout_s": timeout_s, "margin_s": margin}
    if writing:
        message += (
            "; the write may still have been applied: retry with the same idempotency key"
            + (f" {key!r}" if key is not None else "")
        )
        if key is not None:
            details["key"] = key
    return GatewayError("statement_timeout", message, **details)


def value_bytes(value: Any) -> int:
    """The bytes a value counts for against ``max_bytes``: a string's UTF-8 length, a byte
    string's length, 8 for any other scalar, and for a list or JSON object the sum of what
    it holds (None counts 0)."""
    if value is None:
        return 0
    if isinstance(value, str):
        # isascii is O(1): only other text pays for an encoding.
        return len(value) if value.isascii() else len(value.encode("utf-8", "surrogatepass"))
    if isinstance(value, bytes | bytearray | memoryview):
        return len(value)
    if isinstance(value, list | tuple):
        return sum(value_bytes(v) for v in value)
    if isinstance(value, dict):
        return sum(value_bytes(k) + value_bytes(v) for k, v in value.items())
    return _NUMBER_BYTES


def row_bytes(values: Iterable[Any]) -> int:
    """The bytes of one row's values (see :func:`value_bytes`)."""
    return sum(value_bytes(v) for v in values)


def rows_bytes(rows: Iterable[dict[str, Any]]) -> int:
    """The bytes of rows given as dicts (see :func:`value_bytes`)."""
    return sum(row_bytes(row.values()) for row in rows)


def too_large(max_bytes: int, seen: int | None) -> GatewayError:
    """``result_too_large``: the result's first row alone passes ``max_bytes`` (``seen``
    bytes), or (``seen`` None) the read made or read a string or blob longer than that."""
    what = (
        f"the result's first row alone ({seen} bytes)"
        if seen is not None
        else "a string or blob the read made or read"
    )
    return GatewayError(
        "result_too_large",
        f"{what} passes the gateway's byte cap of max_bytes={max_bytes}; select less of it "
        "(a substring, a length, a hash) instead",
        max_bytes=max_bytes,
        seen_bytes=seen,
    )


def bytes_warning(max_bytes: int, kept_rows: int, kept_bytes: int) -> str:
    """The warning of a result cut at ``max_bytes``."""
    return (
        f"truncated: the next row would have passed the byte cap of max_bytes={max_bytes}; "
        f"the first {kept_rows} row(s), {kept_bytes} bytes, are returned"
    )
