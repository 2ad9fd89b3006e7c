"""Argument checks with one message shape: ``<where>: <name> must be <what>, got <value>``."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from corral.kernel._errors import InvalidArgumentError


def non_negative_int(where: str, name: str, value: Any, *, optional: bool = False) -> None:
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        expected = "a non-negative integer" + (" or None" if optional else "")
        raise InvalidArgumentError(where, name, expected, value)


def positive_int(where: str, name: str, value: Any, *, optional: bool = False) -> None:
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        expected = "a positive integer" + (" or None" if optional else "")
        raise InvalidArgumentError(where, name, expected, value)


def non_negative_number(where: str, name: str, value: Any, *, optional: bool = False) -> None:
    """A finite number >= 0 (NaN and infinity are refused: None means unlimited)."""
    if optional and value is None:
        return
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
    ):
        expected = "a finite number >= 0" + (" or None" if optional else "")
        raise InvalidArgumentError(where, name, expected, value)


def positive_number(where: str, name: str, value: Any, *, optional: bool = False) -> None:
    """A finite number > 0."""
    if optional and value is None:
        return
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        expected = "a finite number > 0" + (" or None" if optional else "")
        raise InvalidArgumentError(where, name, expected, value)


def non_empty_str(where: str, name: str, value: Any, *, optional: bool = False) -> None:
    if optional and value is None:
        return
    if not isinstance(value, str) or not value.strip():
        expected = "a non-empty string" + (" or None" if optional else "")
        raise InvalidArgumentError(where, name, expected, value)


def aware_datetime(where: str, name: str, value: Any, *, optional: bool = False) -> None:
    if optional and value is None:
        return
    if not isinstance(value, datetime) or value.utcoffset() is None:
        expected = "a timezone-aware datetime" + (" or None" if optional else "")
        raise InvalidArgumentError(where, name, expected, value)


def instance_of(where: str, name: str, value: Any, kind: type | tuple[type, ...]) -> None:
    if not isinstance(value, kind):
        names = " or ".join(k.__name__ for k in kind) if isinstance(kind, tuple) else kind.__name__
        article = "an" if names[:1].lower() in "aeiou" else "a"
        raise InvalidArgumentError(where, name, f"{article} {names}", value)


def callable_(where: str, name: str, value: Any) -> None:
    if not callable(value):
        raise InvalidArgumentError(where, name, "callable", value)
