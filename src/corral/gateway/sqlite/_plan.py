"""What the SQLite engine runs: a read or a write as planned from a request, and what the journal
holds for a key."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from corral.gateway._catalog import Catalog
from corral.gateway._journal import StoredResult
from corral.gateway._ops import CompiledOperation
from corral.gateway._rows import Rows, renamed, tables
from corral.gateway.sqlite._analysis import (
    SqliteAnalysis,
)

__all__ = ["Journalled", "ReadPlan", "WritePlan", "quote_name"]


def quote_name(name: str) -> str:
    """``name`` as a double-quoted SQLite identifier (for a name the catalog holds: SQLite
    reads an unknown ``"name"`` as a string)."""
    return '"' + name.replace('"', '""') + '"'


@dataclass(frozen=True, slots=True)
class ReadPlan:
    """A read as the engine runs it.

    ``tables``: the catalog names ``exists_sql`` checks, one ``EXISTS`` column each;
    ``exists_sql`` is None when an empty answer needs no check (no filter, or a verdict
    ``rows`` gives without tables). ``filtered``: whether a filter may have emptied the read;
    ``rows``: whether the read without its filters has rows, over ``tables``.
    ``count_op``: a structured ``count``, whose zero counts as empty. ``agent_sql``: the
    statement is an agent's SQL, run with the connection's wall armed.
    """

    sql: str
    params: tuple[Any, ...]
    tables: tuple[str, ...] = ()
    exists_sql: str | None = None
    count_op: bool = False
    agent_sql: bool = False
    ctes: frozenset[str] = frozenset()
    filtered: bool = False
    rows: Rows = True

    @classmethod
    def of(cls, compiled: CompiledOperation) -> ReadPlan:
        return cls(
            compiled.sql,
            compiled.params,
            (compiled.table,),
            compiled.exists_sql if compiled.filtered else None,
            compiled.op == "count",
            filtered=compiled.filtered,
            rows=compiled.table,
        )

    @classmethod
    def of_sql(
        cls, analysis: SqliteAnalysis, params: tuple[Any, ...], catalog: Catalog
    ) -> ReadPlan:
        # Only the tables producing the rows decide an empty answer (not those of a scalar
        # subquery or a WHERE), so only theirs are checked.
        spelled = {key: catalog.tables[key].name for key in tables(analysis.rows)}
        names = tuple(spelled.values())
        exists = None
        if analysis.filtered and names:
            checks = ", ".join(f"EXISTS (SELECT 1 FROM {quote_name(name)})" for name in names)
            exists = f"SELECT {checks}"
        return cls(
            analysis.executable,
            params,
            names,
            exists,
            False,
            True,
            analysis.ctes,
            filtered=analysis.filtered,
            rows=renamed(analysis.rows, spelled),
        )


@dataclass(frozen=True, slots=True)
class WritePlan:
    """A write as the engine runs it; ``agent_sql`` as for :class:`ReadPlan`."""

    sql: str
    params: tuple[Any, ...]
    agent_sql: bool = False
    ctes: frozenset[str] = frozenset()

    @classmethod
    def of(cls, compiled: CompiledOperation) -> WritePlan:
        return cls(compiled.sql, compiled.params)

    @classmethod
    def of_sql(cls, analysis: SqliteAnalysis, params: tuple[Any, ...]) -> WritePlan:
        return cls(analysis.executable, params, True, analysis.ctes)


@dataclass(frozen=True, slots=True)
class Journalled:
    """What the journal holds for a key: nothing ran."""

    fingerprint: str
    state: str
    result: StoredResult | None
