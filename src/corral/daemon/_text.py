"""Text the daemon takes in and keeps: what is refused at the door (lone surrogates and NUL
anywhere, control characters in identifiers) and how text from a harness is escaped before it
is stored, so that no stored value can make a read fail (docs/daemon.md, "Text")."""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Any

REPLACEMENT = "\ufffd"

# UTF-8 cannot encode a surrogate code point (a str holds one only when it is lone: JSON's
# "\ud800", or bytes decoded with surrogateescape), and PostgreSQL text cannot hold U+0000.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
# What an identifier (a name, who decided, a key) may not hold: C0 and C1 controls, DEL, the
# line and paragraph separators, and the bidirectional overrides and isolates, which would
# move or hide text where it is printed.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")

# The fields that name something or someone, checked as identifiers wherever they are taken
# (HTTP bodies and query parameters, MCP arguments, the spec).
IDENTIFIERS = frozenset(
    {"name", "parent", "by", "idempotencyKey", "agent", "agentId", "target", "agent_id"}
)


def _describe(char: str) -> str:
    code = ord(char)
    if code == 0:
        return "NUL characters (U+0000)"
    if 0xD800 <= code <= 0xDFFF:
        return f"lone surrogates (U+{code:04X}), which no UTF-8 text can hold"
    return f"control characters (U+{code:04X})"


def text_problem(value: str, *, identifier: bool = False) -> str | None:
    """Why ``value`` cannot be taken, or None: it holds a lone surrogate or NUL, or (as an
    ``identifier``) a control character."""
    found = (_CONTROL if identifier else _UNSTORABLE).search(value)
    if found is None and identifier:
        found = _UNSTORABLE.search(value)
    if found is None:
        return None
    return f"must not contain {_describe(found.group())}, found at index {found.start()}"


def json_problems(
    value: Any,
    path: str = "",
    *,
    identifiers: Collection[str] = IDENTIFIERS,
    skip: Collection[str] = (),
    surrogates_only: bool = False,
) -> list[dict[str, Any]]:
    """Every string in the JSON ``value`` (keys included) that cannot be taken, as
    ``{"field", "message"}`` with dotted paths like pydantic's; top-level fields named in
    ``identifiers`` are checked as identifiers, those in ``skip`` (or all, with
    ``surrogates_only``) only for lone surrogates (text that some other part checks, like a
    gateway request)."""
    problems: list[dict[str, Any]] = []

    def walk(item: Any, where: str, identifier: bool, surrogates_only: bool) -> None:
        if isinstance(item, str):
            if surrogates_only:
                message = _surrogate_problem(item)
            else:
                message = text_problem(item, identifier=identifier)
            if message is not None:
                problems.append({"field": where or "(body)", "message": message})
        elif isinstance(item, dict):
            for key, inner in item.items():
                child = f"{where}.{key}" if where else str(key)
                top = not where
                only = surrogates_only or (top and key in skip)
                if isinstance(key, str):
                    message = _surrogate_problem(key) if only else text_problem(key)
                    if message is not None:
                        problems.append({"field": child, "message": f"its name {message}"})
                walk(inner, child, top and key in identifiers, only)
        elif isinstance(item, list | tuple):
            for i, inner in enumerate(item):
                walk(inner, f"{where}.{i}" if where else str(i), False, surrogates_only)

    walk(value, path, False, surrogates_only)
    return problems


def _surrogate_problem(value: str) -> str | None:
    found = re.search("[\ud800-\udfff]", value)
    return None if found is None else f"must not contain {_describe(found.group())}"


# What a terminal (or a page) would act on rather than show: C0 and C1 controls (escape
# sequences, bells, carriage returns, newlines), DEL, line separators and bidirectional
# overrides, and lone surrogates (no encoding can print them). Text from an agent or a person is
# shown with these escaped, so it cannot rewrite the screen, forge a line or reorder what is
# around it.
_SHOWN_ESCAPED = re.compile(
    "[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)
_SHOWN_ESCAPED_IN_LINES = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(found: re.Match[str]) -> str:
    char = found.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: str, *, lines: bool = False) -> str:
    """``text`` with control characters shown as escapes (``\\x1b``, ``\\n``, ``\\u202e``):
    for everything shown that came from an agent or a person (the command line prints it,
    the console renders it). With ``lines``, newlines and tabs are kept as they are (text
    for a ``<pre>``); a carriage return is still escaped (it would hide what it returns
    over)."""
    return (_SHOWN_ESCAPED_IN_LINES if lines else _SHOWN_ESCAPED).sub(_escaped, text)


def escape(text: str) -> str:
    """``text`` as it is stored: every lone surrogate and NUL replaced by U+FFFD."""
    return _UNSTORABLE.sub(REPLACEMENT, text)


def escape_json(value: Any) -> Any:
    """``value`` with :func:`escape` applied to every string in it (keys included)."""
    if isinstance(value, str):
        return escape(value)
    if isinstance(value, dict):
        return {escape_json(k): escape_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [escape_json(v) for v in value]
    return value


def unstorable(value: Any, path: str = "") -> tuple[str, str] | None:
    """The first ``(path, message)`` of a string in ``value`` that no store can hold
    (a lone surrogate or NUL), or None."""
    if _storable(value):
        return None  # the common case, without building a path for every value
    return _first_unstorable(value, path)


def _storable(value: Any) -> bool:
    """Whether every string in ``value`` (keys included, as :func:`unstorable` walks it)
    can be stored. Strings and plain scalars are looked at in place rather than through a
    call each, and ASCII text is checked for NUL alone (``str.isascii`` is a flag in CPython,
    ``in`` a memchr): it holds no surrogate."""
    if isinstance(value, str):
        return _storable_text(value)
    if isinstance(value, dict):
        for key, inner in value.items():
            if type(key) is str:
                if not (key.isascii() and "\x00" not in key) and not _storable_text(key):
                    return False
            elif not _storable(key):
                return False
            kind = type(inner)
            if kind is str:
                if not (inner.isascii() and "\x00" not in inner) and not _storable_text(inner):
                    return False
            elif kind not in _SCALARS and not _storable(inner):
                return False
    elif isinstance(value, list | tuple):
        for inner in value:
            if not _storable(inner):
                return False
    return True


_SCALARS = frozenset({int, float, bool, type(None)})


def _storable_text(value: str) -> bool:
    if value.isascii():
        return "\x00" not in value
    return _UNSTORABLE.search(value) is None


def _first_unstorable(value: Any, path: str) -> tuple[str, str] | None:
    if isinstance(value, str):
        message = text_problem(value)
        return None if message is None else (path or "(value)", message)
    if isinstance(value, dict):
        for key, inner in value.items():
            child = f"{path}.{key}" if path else str(key)
            found = _first_unstorable(key, child) or _first_unstorable(inner, child)
            if found is not None:
                return found
    elif isinstance(value, list | tuple):
        for i, inner in enumerate(value):
            found = _first_unstorable(inner, f"{path}.{i}" if path else str(i))
            if found is not None:
                return found
    return None
