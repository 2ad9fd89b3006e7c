"""What a gateway request returns, and what the gateway reports about each request."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

__all__ = ["GatewayResult", "QueryOutcome", "outcome_code", "unique_names"]


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewayResult:
    """The answer to one request.

    ``rows`` are dicts keyed by ``columns`` (in the statement's order; a name the statement
    repeats gets a suffix, ``id`` then ``id_2``, so no value is lost). For a read,
    ``row_count`` is ``len(rows)``; for a write, the number of rows it affected. ``status``
    is ``ok``, or ``replayed`` when the result is the one journalled for the request's
    idempotency key and nothing ran. ``emptiness`` is set on a read that returned no rows:
    ``genuinely_empty`` when the tables it read hold no rows (or it had no filter),
    ``suspiciously_empty`` when they hold rows its filter matched none of (``warnings``
    then says which). ``truncated``: more rows than the gateway's ``max_rows`` existed and
    only the first ``max_rows`` are in ``rows``, or the next row would have passed its
    ``max_bytes`` (``warnings`` then says so) and only the rows before it are.
    """

    rows: list[dict[str, Any]]
    columns: tuple[str, ...]
    row_count: int
    status: Literal["ok", "replayed"] = "ok"
    emptiness: Literal["genuinely_empty", "suspiciously_empty"] | None = None
    warnings: tuple[str, ...] = ()
    truncated: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class QueryOutcome:
    """How one request ended, as given to the gateway's ``observe`` hook (the breakers).

    ``code`` is ``ok``, ``genuinely_empty``, ``suspiciously_empty`` or ``replayed`` for an
    answer, else the ``GatewayError`` code. ``request`` is the request as text: the SQL, or
    the structured operation as canonical JSON. ``message`` is the error's message (None for
    an answer); ``kind`` is ``read`` or ``write`` once analysis decided it (None when refused
    before); ``result`` is the answer, if any.
    """

    agent_id: str
    code: str
    request: str
    at: datetime
    message: str | None = None
    kind: Literal["read", "write"] | None = None
    result: GatewayResult | None = field(default=None, repr=False)


def outcome_code(result: GatewayResult) -> str:
    """The outcome code of an answer."""
    if result.status == "replayed":
        return "replayed"
    return result.emptiness or "ok"


def unique_names(names: Sequence[str]) -> tuple[str, ...]:
    """``names``, each repeat given the first free suffix ``_2``, ``_3``, ..."""
    if len(set(names)) == len(names):
        return tuple(names)
    # A repeated name gets the first free suffix, free of every name the statement gives.
    taken = set(names)
    seen: set[str] = set()
    unique: list[str] = []
    for name in names:
        if name in seen:
            n = 2
            while f"{name}_{n}" in taken:
                n += 1
            name = f"{name}_{n}"
            taken.add(name)
        seen.add(name)
        unique.append(name)
    return tuple(unique)
