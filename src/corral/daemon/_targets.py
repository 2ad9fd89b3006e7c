"""The databases ``corral serve`` is given, before any is opened: their names and DSNs
(``--db NAME=DSN``), and each one's gateway settings (``--db-option NAME.OPTION=VALUE``),
typed and checked against the target's engine so that a mistake stops the daemon at once."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Final

from corral.daemon._dsn import parse_dsn
from corral.kernel import InvalidArgumentError
from corral.kernel import _validate as v

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,62}$")
_NAME_RULE = "a letter, then up to 62 letters, digits, '_' or '-'"
_BOTH = ("postgresql", "sqlite")
# The options --db-option takes, with the engines each applies to (Gateway.connect's own).
ENGINES: Final[Mapping[str, tuple[str, ...]]] = {
    "agent_role": ("postgresql",),
    "max_bytes": _BOTH,
    "max_statement_chars": _BOTH,
    "replay_cache_bytes": ("postgresql",),
}
_OPTION_RULE = "one of " + ", ".join(ENGINES)


def check_target_name(where: str, name: Any, *, argument: str = "target") -> None:
    """A database's name as ``--db`` takes it; ``InvalidArgumentError`` otherwise."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidArgumentError(where, argument, _NAME_RULE, name)


def parse_db_option(text: Any) -> tuple[str, str]:
    """``NAME=DSN`` as ``(name, dsn)``. The DSN is ``postgresql://...``, a libpq keyword
    string (``host=... dbname=...``), ``sqlite:///PATH`` or a file path. Raises
    ``InvalidArgumentError`` naming what is wrong."""
    where = "--db"
    v.non_empty_str(where, "value", text)
    name, sep, dsn = text.partition("=")
    if not sep or not dsn.strip():
        raise InvalidArgumentError(where, "value", "NAME=DSN, like shop=postgresql://...", text)
    check_target_name(where, name, argument="NAME")
    return name, dsn.strip()


def target_kind(dsn: str) -> tuple[str, str]:
    """``("postgresql", dsn)`` or ``("sqlite", path)`` for a target's DSN."""
    return parse_dsn(dsn, where="--db", name="DSN")


@dataclass(frozen=True, slots=True, kw_only=True)
class TargetOptions:
    """One database's gateway settings beyond the daemon-wide ones (``Gateway.connect``'s
    options of the same names, see docs/gateway.md "Connecting"); None leaves the gateway's
    default. ``agent_role`` and ``replay_cache_bytes`` apply to PostgreSQL targets only.
    Raises ``InvalidArgumentError`` for a value of the wrong type or out of range; the
    gateway checks the values again (an identifier for ``agent_role``, a ceiling for
    ``max_statement_chars``) when the target is opened."""

    agent_role: str | None = None
    max_bytes: int | None = None
    max_statement_chars: int | None = None
    replay_cache_bytes: int | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            _check("TargetOptions", f.name, getattr(self, f.name))

    def given(self) -> dict[str, Any]:
        """The options set (not None), as ``Gateway.connect`` keywords."""
        found = {f.name: getattr(self, f.name) for f in fields(self)}
        return {name: value for name, value in found.items() if value is not None}


def parse_db_setting(text: Any) -> tuple[str, str, Any]:
    """``NAME.OPTION=VALUE`` (``--db-option``) as ``(name, option, value)``, the value typed:
    a string for ``agent_role``, an integer for the others. Raises ``InvalidArgumentError``
    for a malformed setting, an unknown option or a bad value; whether ``NAME`` is a target,
    and of the option's engine, is :func:`target_options`'s to say."""
    where = "--db-option"
    v.non_empty_str(where, "value", text)
    key, sep, raw = text.partition("=")
    name, dot, option = key.partition(".")
    if not sep or not dot:
        raise InvalidArgumentError(
            where, "value", "NAME.OPTION=VALUE, like shop.max_bytes=8388608", text
        )
    check_target_name(where, name, argument="NAME")
    if option not in ENGINES:
        raise InvalidArgumentError(where, "OPTION", _OPTION_RULE, option)
    value: Any = raw.strip() if option == "agent_role" else _integer(where, option, raw)
    _check(where, option, value)
    return name, option, value


def target_options(
    targets: Mapping[str, str], settings: Iterable[tuple[str, str, Any]]
) -> dict[str, TargetOptions]:
    """``--db-option`` settings gathered per target of ``targets`` (name -> DSN). Raises
    ``InvalidArgumentError`` for a setting of an unknown target, one given twice, and an
    option of the other engine."""
    where = "--db-option"
    found: dict[str, dict[str, Any]] = {}
    for name, option, value in settings:
        if name not in targets:
            raise InvalidArgumentError(
                where, "NAME", "a database given with --db (" + _known(targets) + ")", name
            )
        if option in found.setdefault(name, {}):
            raise InvalidArgumentError(where, "OPTION", "given once per database", option)
        found[name][option] = value
    options = {name: TargetOptions(**given) for name, given in found.items()}
    check_target_options(where, targets, options)
    return options


def check_target_options(
    where: str, targets: Mapping[str, str], options: Mapping[str, Any]
) -> None:
    """``options`` (name -> :class:`TargetOptions`) name targets of ``targets`` and hold
    only options of their engines; ``InvalidArgumentError`` otherwise."""
    v.instance_of(where, "options", options, Mapping)
    for name, given in options.items():
        if name not in targets:
            raise InvalidArgumentError(
                where, "options", "keyed by a database's name (" + _known(targets) + ")", name
            )
        v.instance_of(where, f"options[{name!r}]", given, TargetOptions)
        kind, _ = target_kind(targets[name])
        for option in given.given():
            if kind not in ENGINES[option]:
                raise InvalidArgumentError(
                    where,
                    option,
                    f"left out for {name}, a {_ENGINE_NAMES[kind]} database "
                    f"({option} is for {_ENGINE_NAMES[ENGINES[option][0]]} only)",
                    f"{name}.{option}",
                )


_ENGINE_NAMES = {"postgresql": "PostgreSQL", "sqlite": "SQLite"}


def _known(targets: Mapping[str, str]) -> str:
    return ", ".join(sorted(targets)) or "none given"


def _check(where: str, option: str, value: Any) -> None:
    """One option's value, None allowed (the gateway's default)."""
    if option == "agent_role":
        v.non_empty_str(where, option, value, optional=True)
    elif option == "replay_cache_bytes":
        v.non_negative_int(where, option, value, optional=True)
    else:
        v.positive_int(where, option, value, optional=True)


def _integer(where: str, option: str, raw: str) -> int:
    text = raw.strip().replace("_", "")
    if not text.isascii() or not text.isdigit():
        raise InvalidArgumentError(where, option, "a whole number", raw)
    return int(text)
