"""What both engines' idempotency journals store: the fingerprint of a write and its result,
encoded as JSON."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import hashlib
import ipaddress
import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "StoredResult",
    "decode_result",
    "encode_result",
    "fingerprint",
    "stored_plan",
]


def stored_plan(plan_hash: str | None) -> str:
    """``plan_hash`` as journals store it, part of a key's identity (agent, key, plan_hash):
    ``""`` when absent (a given plan_hash is never empty)."""
    return "" if plan_hash is None else plan_hash


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
    """A write's result as journalled; ``warnings`` say why it was ``truncated`` (the byte
    cap), so a replay says it too."""

    columns: tuple[str, ...]
    rows: list[dict[str, Any]]
    row_count: int
    truncated: bool
    warnings: tuple[str, ...] = ()


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
    if result.warnings:
        payload["warnings"] = list(result.warnings)
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def decode_result(payload: Any) -> StoredResult:
    """The inverse of :func:`encode_result` (``payload`` as JSON text or already loaded)."""
    data = json.loads(payload) if isinstance(payload, str | bytes) else payload
    columns = tuple(str(c) for c in data["columns"])
    rows = [dict(zip(columns, (_decode(v) for v in row), strict=True)) for row in data["rows"]]
    warnings = tuple(str(w) for w in data.get("warnings") or ())
    return StoredResult(columns, rows, int(data["row_count"]), bool(data["truncated"]), warnings)


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
