"""What every engine checks the same way in a request: its keys, and its text for records."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from corral.gateway._errors import GatewayError

__all__ = [
    "KEY_EXPECTED",
    "MAX_KEY_LENGTH",
    "check_param_count",
    "invalid",
    "key_is_valid",
    "request_key",
    "request_text",
    "unencodable",
    "unstorable",
]

MAX_KEY_LENGTH = 256
KEY_EXPECTED = (
    f"a non-empty string of at most {MAX_KEY_LENGTH} characters, without control characters "
    "(NUL included) or lone surrogates"
)
# Characters a journal cannot store as they are: libpq sends text parameters as C strings,
# so PostgreSQL would keep a key only up to its first NUL (and two keys would become one);
# control characters in general (C0, DEL, C1) are refused alike on both engines, and a lone
# surrogate cannot be encoded at all.
_UNSTORABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


_SURROGATE = re.compile(r"[\ud800-\udfff]")
_MAX_WALK = 64  # nesting the walk follows; deeper values are refused by the planners


_OWN_CHECKS = frozenset({"idempotency_key", "plan_hash"})  # request_key names them better


def unencodable(value: Any, key: str = "request", depth: int = 0) -> GatewayError | None:
    """``invalid_operation`` for the first string in ``value`` (a request: its text, its
    parameters, its values and conditions, object keys included) that cannot be encoded
    (a lone surrogate: no database can take it, and encoding it would raise far from here);
    None when every string can be. ASCII strings cost one call. The request's own keys
    (``idempotency_key``, ``plan_hash``) are left to :func:`request_key`."""
    kind = type(value)
    if kind is str:
        if value.isascii():
            return None
        found = _SURROGATE.search(value)
        if found is None:
            return None
        return invalid(
            key, value, f"text without lone surrogates (U+{ord(found.group()):04X} found)"
        )
    if kind is int or kind is float or kind is bool or value is None or depth > _MAX_WALK:
        return None
    if kind is list or kind is tuple:
        for index, item in enumerate(value):
            bad = unencodable(item, f"{key}[{index}]", depth + 1)
            if bad is not None:
                return bad
        return None
    if isinstance(value, Mapping):
        for name, item in value.items():
            if depth == 0 and name in _OWN_CHECKS:
                continue
            where = key if not (type(name) is str and name.isascii()) else name
            if depth > 0 and where is name:
                where = f"{key}.{name}"
            bad = unencodable(name, key, depth + 1) or unencodable(item, where, depth + 1)
            if bad is not None:
                return bad
        return None
    if isinstance(value, str):  # a str subclass
        return unencodable(str(value), key, depth)
    return None


def unstorable(text: str) -> str | None:
    """The first character of ``text`` a journal would not keep exactly, as ``U+XXXX``;
    None when there is none."""
    found = _UNSTORABLE.search(text)
    return None if found is None else f"U+{ord(found.group()):04X}"


def key_is_valid(value: object) -> bool:
    """Whether ``value`` may be an ``idempotency_key`` or ``plan_hash``: a string of 1 to
    :data:`MAX_KEY_LENGTH` characters that a journal stores exactly (see :func:`unstorable`)."""
    return (
        isinstance(value, str)
        and 0 < len(value) <= MAX_KEY_LENGTH
        and _UNSTORABLE.search(value) is None
    )


def invalid(key: str, value: Any, expected: str) -> GatewayError:
    """``invalid_operation``: ``key`` must be ``expected`` (the value shown in 80 characters)."""
    shown = repr(value)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    return GatewayError(
        "invalid_operation", f"{key} must be {expected}, got {shown}", key=key, value=shown
    )


def request_key(request: Mapping[str, Any], name: str) -> str | None:
    """``request[name]`` (``idempotency_key``, ``plan_hash``): None when absent, else a
    string :func:`key_is_valid` accepts (``invalid_operation`` otherwise, naming the first
    character refused in ``details["character"]``)."""
    value = request.get(name)
    if value is None:
        return None
    if isinstance(value, str) and key_is_valid(value):
        return value
    error = invalid(name, value, KEY_EXPECTED)
    character = unstorable(value) if isinstance(value, str) else None
    if character is not None:
        error.details["character"] = character
    raise error


def check_param_count(expected: int, given: int) -> None:
    """``invalid_operation`` unless a statement whose highest placeholder is ``$expected``
    gets ``given`` parameters, as many."""
    if expected != given:
        raise GatewayError(
            "invalid_operation",
            f"the statement's highest placeholder is ${expected}, so params must hold "
            f"{expected} value(s); it holds {given}",
            key="params",
            value=given,
            expected=expected,
        )


def request_text(request: Any) -> str:
    """The request as breakers and hooks record it: the SQL, else canonical JSON."""
    if isinstance(request, Mapping):
        sql = request.get("sql")
        if isinstance(sql, str) and "op" not in request:
            return sql
        try:
            return json.dumps(request, sort_keys=True, default=repr, ensure_ascii=False)
        except (TypeError, ValueError):
            pass
    return repr(request)
