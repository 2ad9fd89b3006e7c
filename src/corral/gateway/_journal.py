"""The idempotency journal: one row per (agent, key), in the target PostgreSQL database.

Table ``<schema>.<table>`` (default ``corral.gateway_journal``), created by
:func:`ensure_journal` when missing::

    agent_id text, key text          -- primary key (agent_id, key)
    fingerprint text                 -- sha256 hex of the operation (see fingerprint())
    state text                       -- 'running' or 'completed'
    result jsonb                     -- the stored result (see encode_result())
    created_at, completed_at timestamptz

Keys are scoped per agent: two agents may use the same key for different work, and one
agent's key never replays another agent's result. A write's journal row is inserted before the
write, in the write's own transaction, and completed in it: a committed row is therefore always
``completed`` and a crash rolls back the row with the write, so no write's fate is ever
unknown. A committed ``running`` row (which only a journal outside the write's transaction
could leave) is reported ``outcome_unknown``.

The journal's schema belongs to the gateway: nothing in it is shown to agents.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import hashlib
import ipaddress
import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from corral.gateway._ops import quote_identifier
from corral.kernel._errors import InvalidArgumentError

if TYPE_CHECKING:
    from psycopg import AsyncConnection

__all__ = [
    "JournalName",
    "StoredResult",
    "check_identifier",
    "decode_result",
    "encode_result",
    "ensure_journal",
    "fingerprint",
]

_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]{0,62}\Z")


def check_identifier(where: str, argument: str, value: object) -> None:
    """Raise ``InvalidArgumentError`` unless ``value`` is a plain lower-case identifier."""
    if not isinstance(value, str) or not _IDENTIFIER.match(value):
        raise InvalidArgumentError(
            where,
            argument,
            "a lower-case identifier ([a-z_][a-z0-9_]*, at most 63 characters)",
            value,
        )


@dataclass(frozen=True, slots=True)
class JournalName:
    """Where the journal lives: lower-case unquoted identifiers (``[a-z_][a-z0-9_]*``)."""

    schema: str = "corral"
    table: str = "gateway_journal"

    def __post_init__(self) -> None:
        check_identifier("JournalName", "schema", self.schema)
        check_identifier("JournalName", "table", self.table)

    @property
    def qualified(self) -> str:
        """``"schema"."table"``, for SQL run with or without parameters (no ``%`` in names)."""
        return f"{quote_identifier(self.schema, 'sqlite')}.{quote_identifier(self.table, 'sqlite')}"

    @property
    def claim_sql(self) -> str:
        # No ON CONFLICT: a key already journalled must fail this statement, so that the
        # write sent after it in the same pipeline is discarded by the server unexecuted.
        return (
            f"INSERT INTO {self.qualified} (agent_id, key, fingerprint, state, created_at) "
            "VALUES (%s, %s, %s, 'running', %s)"
        )

    @property
    def complete_sql(self) -> str:
        return (
            f"UPDATE {self.qualified} SET state = 'completed', result = %s::jsonb, "
            "completed_at = %s WHERE agent_id = %s AND key = %s"
        )

    @property
    def lookup_sql(self) -> str:
        return (
            f"SELECT fingerprint, state, result, created_at, completed_at FROM {self.qualified} "
            "WHERE agent_id = %s AND key = %s"
        )


async def ensure_journal(conn: AsyncConnection[Any], name: JournalName) -> None:
    """Create the journal's schema and table unless they exist.

    ``conn`` must be in autocommit mode and allowed to create them. Safe when several
    gateways start at once (an advisory lock serialises the creation). Database errors
    propagate.
    """
    async with conn.transaction():
        # Two gateways creating the same table at once would otherwise race in the catalog.
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [name.qualified])
        cur = await conn.execute("SELECT to_regclass(%s) IS NOT NULL", [name.qualified])
        row = await cur.fetchone()
        if row is not None and row[0]:
            return
        await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {quote_identifier(name.schema, 'sqlite')}")
        await conn.execute(
            f"""CREATE TABLE IF NOT EXISTS {name.qualified} (
                agent_id text NOT NULL,
                key text NOT NULL,
                fingerprint text NOT NULL,
                state text NOT NULL CHECK (state IN ('running', 'completed')),
                result jsonb,
                created_at timestamptz NOT NULL,
                completed_at timestamptz,
                PRIMARY KEY (agent_id, key)
            )"""
        )


def fingerprint(normalized: str, params: Sequence[Any], plan_hash: str | None) -> str:
    """SHA-256 (hex) of the normalised statement, its parameters and the agent's plan hash.

    Parameters are compared by value and type (``1`` and ``"1"`` differ; ``Decimal`` and
    dates by their text); ``plan_hash`` None and ``""`` differ.
    """
    payload = json.dumps(
        [normalized, [_encode(p) for p in params], plan_hash],
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class StoredResult:
    columns: tuple[str, ...]
    rows: list[dict[str, Any]]
    row_count: int
    truncated: bool


def encode_result(result: StoredResult) -> str:
    """``result`` as JSON text that :func:`decode_result` turns back into equal values.

    JSON scalars are stored as they are; other values as ``{"t": type, "v": text}``
    (``decimal``, ``datetime``, ``date``, ``time``, ``timedelta``, ``uuid``, ``bytes``,
    ``ip``, ``float`` for NaN and infinities, ``list``, ``object`` for JSON objects). Values
    of any other type are stored as their text (``{"t": "str"}``) and come back as strings.
    """
    payload = {
        "columns": list(result.columns),
        "rows": [[_encode(row[c]) for c in result.columns] for row in result.rows],
        "row_count": result.row_count,
        "truncated": result.truncated,
    }
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def decode_result(payload: Any) -> StoredResult:
    """The inverse of :func:`encode_result` (``payload`` as JSON text or already loaded)."""
    data = json.loads(payload) if isinstance(payload, str | bytes) else payload
    columns = tuple(str(c) for c in data["columns"])
    rows = [dict(zip(columns, (_decode(v) for v in row), strict=True)) for row in data["rows"]]
    return StoredResult(columns, rows, int(data["row_count"]), bool(data["truncated"]))


def _encode(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return (
            value
            if value == value and value not in (float("inf"), float("-inf"))
            else {
                "t": "float",
                "v": repr(value),
            }
        )
    if isinstance(value, decimal.Decimal):
        return {"t": "decimal", "v": str(value)}
    if isinstance(value, dt.datetime):
        return {"t": "datetime", "v": value.isoformat()}
    if isinstance(value, dt.date):
        return {"t": "date", "v": value.isoformat()}
    if isinstance(value, dt.time):
        return {"t": "time", "v": value.isoformat()}
    if isinstance(value, dt.timedelta):
        return {"t": "timedelta", "v": [value.days, value.seconds, value.microseconds]}
    if isinstance(value, uuid.UUID):
        return {"t": "uuid", "v": str(value)}
    if isinstance(value, bytes | bytearray | memoryview):
        return {"t": "bytes", "v": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(
        value,
        ipaddress.IPv4Address
        | ipaddress.IPv6Address
        | ipaddress.IPv4Interface
        | ipaddress.IPv6Interface
        | ipaddress.IPv4Network
        | ipaddress.IPv6Network,
    ):
        kind = type(value).__name__.removeprefix("IPv4").removeprefix("IPv6").lower()
        return {"t": "ip", "v": [kind, str(value)]}
    if isinstance(value, list | tuple):
        return {"t": "list", "v": [_encode(v) for v in value]}
    if isinstance(value, Mapping):
        return {"t": "object", "v": {str(k): _encode(v) for k, v in value.items()}}
    return {"t": "str", "v": str(value)}


_IP_TYPES: dict[str, Any] = {
    "address": ipaddress.ip_address,
    "interface": ipaddress.ip_interface,
    "network": ipaddress.ip_network,
}


def _decode(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    kind, raw = value["t"], value["v"]
    if kind == "float":
        return float(raw)
    if kind == "decimal":
        return decimal.Decimal(raw)
    if kind == "datetime":
        return dt.datetime.fromisoformat(raw)
    if kind == "date":
        return dt.date.fromisoformat(raw)
    if kind == "time":
        return dt.time.fromisoformat(raw)
    if kind == "timedelta":
        return dt.timedelta(days=raw[0], seconds=raw[1], microseconds=raw[2])
    if kind == "uuid":
        return uuid.UUID(raw)
    if kind == "bytes":
        return base64.b64decode(raw)
    if kind == "ip":
        return _IP_TYPES[raw[0]](raw[1])
    if kind == "list":
        return [_decode(v) for v in raw]
    if kind == "object":
        return {k: _decode(v) for k, v in raw.items()}
    return str(raw)
