"""Parameters of agents' SQL on SQLite: JSON values bound by SQLite, never spliced."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from corral.gateway._request import invalid

__all__ = ["bind_params"]

_MAX_INT = 2**63 - 1
_MAX_DEPTH = 64


def bind_params(raw: Any) -> tuple[Any, ...]:
    """The request's ``params`` as SQLite binds them.

    ``None``, ``bool`` (bound as 1/0), ``int`` (64-bit), finite ``float`` and ``str`` pass
    as they are; a list or a string-keyed object becomes its JSON text (SQLite's JSON
    functions read it). Anything else is ``invalid_operation`` naming the parameter.
    """
    if raw is None:
        return ()
    if not isinstance(raw, list | tuple):
        raise invalid("params", raw, "a list of values")
    return tuple(_bound(v, f"params[{i}]") for i, v in enumerate(raw))


def _bound(value: Any, key: str) -> Any:
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        if not -_MAX_INT - 1 <= value <= _MAX_INT:
            raise invalid(key, value, "an integer between -2**63 and 2**63 - 1")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise invalid(key, value, "a finite number")
        return value
    if isinstance(value, list | tuple | Mapping):
        _check_json(value, key, 0)
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    raise invalid(key, value, "a JSON value (None, bool, int, float, str, list or object)")


def _check_json(value: Any, key: str, depth: int) -> None:
    if depth > _MAX_DEPTH:
        raise invalid(key, value, f"a JSON value nested at most {_MAX_DEPTH} deep")
    if value is None or isinstance(value, bool | int | str):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise invalid(key, value, "a finite number")
        return
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _check_json(item, f"{key}[{i}]", depth + 1)
        return
    if isinstance(value, Mapping):
        for k, item in value.items():
            if not isinstance(k, str):
                raise invalid(key, k, "a JSON object key (a string)")
            _check_json(item, f"{key}.{k}", depth + 1)
        return
    raise invalid(key, value, "a JSON value (None, bool, int, float, str, list or object)")
