"""Whether a read without its filters has rows, as a formula over its tables: what decides an
empty answer's verdict on both engines (docs/gateway.md, "Loud empties", defines it)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = [
    "AllOf",
    "AnyOf",
    "Rows",
    "all_of",
    "any_of",
    "empty_warning",
    "holds",
    "renamed",
    "tables",
]


@dataclass(frozen=True, slots=True)
class AllOf:
    """Rows when every part has rows (a cross or inner join, an INTERSECT's arms)."""

    parts: tuple[Rows, ...]


@dataclass(frozen=True, slots=True)
class AnyOf:
    """Rows when any part has rows (a UNION, a FULL join)."""

    parts: tuple[Rows, ...]


Rows = bool | str | AllOf | AnyOf
"""``True``: rows whatever the tables hold (``VALUES``, no ``FROM``, an aggregate without
``GROUP BY``); ``False``: never; a ``str``: a catalog key, whose rows an ``EXISTS`` checks."""


def all_of(parts: Iterable[Rows]) -> Rows:
    """The conjunction of ``parts``, constants folded."""
    kept: list[Rows] = []
    for part in parts:
        if part is False:
            return False
        if part is True:
            continue
        kept.extend(part.parts if isinstance(part, AllOf) else (part,))
    if not kept:
        return True
    return kept[0] if len(kept) == 1 else AllOf(tuple(kept))


def any_of(parts: Iterable[Rows]) -> Rows:
    """The disjunction of ``parts``, constants folded."""
    kept: list[Rows] = []
    for part in parts:
        if part is True:
            return True
        if part is False:
            continue
        kept.extend(part.parts if isinstance(part, AnyOf) else (part,))
    if not kept:
        return False
    return kept[0] if len(kept) == 1 else AnyOf(tuple(kept))


def renamed(rows: Rows, names: Mapping[str, str]) -> Rows:
    """``rows`` with each table ``t`` named ``names[t]`` (``t`` itself when absent)."""
    if isinstance(rows, bool):
        return rows
    if isinstance(rows, str):
        return names.get(rows, rows)
    parts = tuple(renamed(part, names) for part in rows.parts)
    return AllOf(parts) if isinstance(rows, AllOf) else AnyOf(parts)


def tables(rows: Rows) -> tuple[str, ...]:
    """The catalog keys ``rows`` depends on, in order of first appearance."""
    found: dict[str, None] = {}
    stack: list[Rows] = [rows]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            found[item] = None
        elif isinstance(item, AllOf | AnyOf):
            stack.extend(reversed(item.parts))
    return tuple(found)


def holds(rows: Rows, has: Mapping[str, bool]) -> tuple[bool, tuple[str, ...]]:
    """Whether ``rows`` holds when the tables that hold rows are those ``has`` maps to True,
    and the tables that make it hold (those of every part an ``AllOf`` needs, and of the
    parts of an ``AnyOf`` that hold), in order."""
    if isinstance(rows, bool):
        return rows, ()
    if isinstance(rows, str):
        held = bool(has.get(rows))
        return held, ((rows,) if held else ())
    witnesses: list[str] = []
    if isinstance(rows, AllOf):
        for part in rows.parts:
            held, named = holds(part, has)
            if not held:
                return False, ()
            witnesses.extend(named)
        return True, tuple(dict.fromkeys(witnesses))
    any_held = False
    for part in rows.parts:
        held, named = holds(part, has)
        if held:
            any_held = True
            witnesses.extend(named)
    return any_held, tuple(dict.fromkeys(witnesses))


def empty_warning(holding: tuple[str, ...], *, counted: bool, only: bool = False) -> str:
    """The warning of a suspiciously empty answer: ``holding`` are the tables named (none
    when the rows the filters removed come from no table: ``VALUES``, a function, no
    ``FROM``); ``counted``: a structured ``count`` that counted none; ``only``: the read
    named a table with ``ONLY``, which leaves its child tables' rows out."""
    what = "counted none" if counted else "returned no rows"
    if not holding:
        return (
            f"suspiciously empty: the read {what}, but without its filters it returns rows; "
            "a wrong value or column in the filter is more likely than a true absence"
        )
    named = ", ".join(holding)
    verb = "holds" if len(holding) == 1 else "hold"
    note = (
        " (counting child tables: ONLY leaves their rows out, and counts as a filter)"
        if only
        else ""
    )
    return (
        f"suspiciously empty: the read {what}, but {named} {verb} rows{note} that its filter "
        "matched none of; a wrong value or column in the filter is more likely than a true "
        "absence"
    )
