"""What every engine checks the same way in a request: its keys, and its text for records."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from corral.gateway._errors import GatewayError

__all__ = ["MAX_KEY_LENGTH", "check_param_count", "invalid", "request_key", "request_text"]

MAX_KEY_LENGTH = 256


def invalid(key: str, value: Any, expected: str) -> GatewayError:
    """``invalid_operation``: ``key`` must be ``expected`` (the value shown in 80 characters)."""
    shown = repr(value)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    return GatewayError(
        "invalid_operation", f"{key} must be {expected}, got {shown}", key=key, value=shown
    )


def request_key(request: Mapping[str, Any], name: str) -> str | None:
    """``request[name]`` (``idempotency_key``, ``plan_hash``): None when absent, else a
    non-empty string of at most :data:`MAX_KEY_LENGTH` characters (``invalid_operation``)."""
    value = request.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > MAX_KEY_LENGTH:
        raise invalid(name, value, f"a non-empty string of at most {MAX_KEY_LENGTH} characters")
    return value


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
