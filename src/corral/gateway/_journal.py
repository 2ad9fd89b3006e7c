"""The idempotency journal: one row per (agent, key), in the target PostgreSQL database.

Table ``<schema>.<table>`` (default ``corral.gateway_journal``), created by
:func:`ensure_journal` when missing::

    agent_id text, key text          -- primary key (agent_id, key)
    fingerprint text                 -- sha256 hex of the operation (see fingerprint())
    state text                       -- 'running' or 'completed'
    result jsonb                     -- the stored result (see encode_result())
    created_at, completed_at timestamptz

Keys are scoped per agent: two agents may use the same key for different work, and one
agent's key never replays another agent's result. A write's journal row is inserted,
``completed`` with its result, in the write's own transaction (by the write's own statement
when the server can count its rows, see :mod:`~._execute`): a crash rolls back the row with the
write, so no write's fate is ever unknown. While the write runs, its key is held by a
transaction-scoped advisory lock (:meth:`JournalName.lock_key`), so a second transaction with
the same key waits for it, then finds the row. A committed ``running`` row (which only a journal
outside the write's transaction could leave, such as older versions' claims) is reported
``outcome_unknown``.

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
from collections.abc import Callable, Mapping, Sequence
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

    def lock_key(self, agent_id: str, key: str) -> int:
        """The advisory lock (a signed 64-bit number) that holds ``(agent_id, key)`` of this
        journal while its write runs: the same in every process."""
        # Lengths first, so that no two (agent, key) pairs spell the same text.
        named = f"{self.schema}.{self.table}:{len(agent_id)}:{agent_id}:{key}".encode()
        return int.from_bytes(hashlib.blake2b(named, digest_size=8).digest(), "big", signed=True)

    @property
    def try_lock_sql(self) -> str:
        # Fails (division by zero) when another transaction holds the key, so that the
        # statements sent after it in the same pipeline are discarded unexecuted.
        return "SELECT 1 / pg_try_advisory_xact_lock(%s::bigint)::int"

    @property
    def lock_sql(self) -> str:
        return "SELECT pg_advisory_xact_lock(%s::bigint)"

    @property
    def check_sql(self) -> str:
        # Fails (division by zero) when the key is journalled, so that the write sent after
        # it in the same pipeline is discarded unexecuted. Run after the lock is held, in a
        # snapshot of its own: a holder that committed meanwhile is seen.
        return (
            "SELECT 1 / (octet_length(key) - octet_length(key)) "
            f"FROM {self.qualified} WHERE agent_id = %s AND key = %s"
        )

    @property
    def record_sql(self) -> str:
        return (
            f"INSERT INTO {self.qualified} (agent_id, key, fingerprint, state, result, "
            "created_at, completed_at) VALUES (%s, %s, %s, 'completed', %s::jsonb, %s, %s)"
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
        # Only when missing: CREATE SCHEMA IF NOT EXISTS needs CREATE on the database even
        # when the schema is there (a least-privileged role's schema made by its owner).
        cur = await conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", [name.schema])
        if await cur.fetchone() is None:
            await conn.execute(f"CREATE SCHEMA {quote_identifier(name.schema, 'sqlite')}")
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
    payload = _plain_payload(normalized, params, plan_hash)
    if payload is None:
        encoded = [p if type(p) in _AS_THEY_ARE else _encode(p) for p in params]
        payload = _FINGERPRINT_JSON([normalized, encoded, plan_hash])
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def _plain_payload(normalized: str, params: Sequence[Any], plan_hash: str | None) -> str | None:
    """The text _FINGERPRINT_JSON gives when every parameter is a str, int, bool or None, put
    together piece by piece (the encoder's setup costs more than the encoding); None when a
    parameter is anything else."""
    parts = []
    for p in params:
        kind = type(p)
        if kind is str:
            parts.append(_json_string(p))
        elif kind is int:
            parts.append(int.__repr__(p))
        elif kind is bool:
            parts.append("true" if p else "false")
        elif p is None:
            parts.append("null")
        else:
            return None
    hashed = "null" if plan_hash is None else _json_string(plan_hash)
    return f"[{_json_string(normalized)},[{','.join(parts)}],{hashed}]"


# Values _encode returns unchanged (exact types: a subclass of int or str goes through it).
_AS_THEY_ARE = frozenset({str, int, bool, type(None)})
# A str as JSON with ensure_ascii=False, as the encoder writes it.
_json_string: Callable[[str], str] = json.encoder.encode_basestring
# json.dumps with options builds an encoder per call; one built once encodes the same text.
_FINGERPRINT_JSON = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False
).encode


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
