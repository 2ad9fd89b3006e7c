"""What the target database holds: tables and their columns, with a version for caches."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type: str  # the database's own type name, lower case (integer, text, jsonb, ...)
    nullable: bool = True
    primary_key: bool = False


@dataclass(frozen=True, slots=True)
class Table:
    name: str  # unqualified name
    schema: str | None  # None for SQLite
    columns: Mapping[str, Column] = field(default_factory=dict)

    @property
    def primary_key(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns.values() if c.primary_key)


@dataclass(frozen=True, slots=True)
class Catalog:
    """Tables by name. ``version`` changes whenever the schema does (caches key on it).

    ``sequences`` (PostgreSQL) are keyed like ``tables``: not tables, but named by the
    sequence functions (``nextval('invoice_numbers')``), which are checked against them.
    """

    tables: Mapping[str, Table]
    version: str
    dialect: str  # "postgresql" or "sqlite"
    sequences: Mapping[str, Table] = field(default_factory=dict)

    def table(self, name: str) -> Table | None:
        return self.tables.get(name.lower())

    def close_tables(self, name: str, limit: int = 3) -> list[str]:
        return difflib.get_close_matches(name.lower(), list(self.tables), n=limit, cutoff=0.6)

    @staticmethod
    def close_columns(table: Table, name: str, limit: int = 3) -> list[str]:
        return difflib.get_close_matches(name.lower(), list(table.columns), n=limit, cutoff=0.6)
