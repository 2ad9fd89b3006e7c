"""Reading a :class:`~corral.gateway._catalog.Catalog` out of a live PostgreSQL or SQLite
database, with a version that is the same for the same schema anywhere."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from typing import TYPE_CHECKING, Any

from corral.gateway._catalog import Catalog, Column, Table
from corral.kernel._validate import instance_of

if TYPE_CHECKING:
    from psycopg import AsyncConnection

__all__ = ["load_postgres_catalog", "load_sqlite_catalog"]

# One row per column (relations without columns still give one row, with NULL attname);
# sequences ('S') are kept apart from the tables.
_PG_QUERY = """
SELECT n.nspname, c.relname, c.relkind::text, pg_catalog.pg_table_is_visible(c.oid),
       a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod), a.attnotnull,
       COALESCE(a.attnum = ANY (i.indkey), false)
FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_catalog.pg_attribute a
       ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
LEFT JOIN pg_catalog.pg_index i ON i.indrelid = c.oid AND i.indisprimary
WHERE c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')
  AND n.nspname <> 'information_schema'
  AND n.nspname NOT LIKE 'pg\\_%'
ORDER BY n.nspname, c.relname, a.attnum
"""

_SQLITE_RELATIONS = (
    "SELECT type, name FROM sqlite_master "
    "WHERE type IN ('table', 'view') AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' "
    "ORDER BY name"
)
_SQLITE_COLUMNS = 'SELECT name, type, "notnull", pk FROM pragma_table_info(?) ORDER BY cid'


async def load_postgres_catalog(conn: AsyncConnection[Any]) -> Catalog:
    """The user schemas of the database ``conn`` is connected to, as a ``Catalog``.

    ``conn`` is a psycopg 3 ``AsyncConnection``; one catalog query runs on it (inside the
    connection's current transaction if one is open; nothing is written). Column types are
    PostgreSQL's own names from ``format_type`` (``integer``, ``numeric(10,2)``, ``text[]``).
    Raises ``InvalidArgumentError`` for another kind of ``conn``; database errors propagate.
    """
    from psycopg import AsyncConnection

    instance_of("load_postgres_catalog", "conn", conn, AsyncConnection)
    async with conn.cursor() as cur:
        await cur.execute(_PG_QUERY)
        rows = await cur.fetchall()
    relations: dict[tuple[str, str], dict[str, Any]] = {}
    for schema, name, kind, visible, column, type_, notnull, primary in rows:
        rel = relations.setdefault(
            (schema, name), {"kind": kind, "visible": bool(visible), "columns": []}
        )
        if column is not None:
            rel["columns"].append(
                {
                    "name": column,
                    "type": str(type_).lower(),
                    "nullable": not notnull,
                    "primary_key": bool(primary),
                }
            )
    return _build("postgresql", relations)


def load_sqlite_catalog(conn: sqlite3.Connection) -> Catalog:
    """The tables and views of the ``main`` database of ``conn``, as a ``Catalog``.

    Types are the declared types, lower case (``""`` when a column has none, as in most
    views). An ``INTEGER PRIMARY KEY`` column (the rowid) is reported not nullable. Only reads
    ``sqlite_master`` and ``pragma_table_info``; works on a read-only connection. Raises
    ``InvalidArgumentError`` for another kind of ``conn``; ``sqlite3`` errors propagate.
    """
    instance_of("load_sqlite_catalog", "conn", conn, sqlite3.Connection)
    relations: dict[tuple[str, str], dict[str, Any]] = {}
    for kind, name in conn.execute(_SQLITE_RELATIONS).fetchall():
        columns = []
        for column, type_, notnull, pk in conn.execute(_SQLITE_COLUMNS, (name,)).fetchall():
            type_name = str(type_ or "").lower()
            columns.append(
                {
                    "name": column,
                    "type": type_name,
                    "nullable": not (notnull or (pk and type_name == "integer")),
                    "primary_key": bool(pk),
                }
            )
        relations[("", name)] = {"kind": kind, "visible": True, "columns": columns}
    return _build("sqlite", relations)


def _build(dialect: str, relations: dict[tuple[str, str], dict[str, Any]]) -> Catalog:
    description = {
        "dialect": dialect,
        "relations": [
            {"schema": schema, "name": name, **rel} for (schema, name), rel in relations.items()
        ],
    }
    canonical = json.dumps(description, sort_keys=True, separators=(",", ":"))
    version = hashlib.sha256(canonical.encode("utf-8")).hexdigest()
    tables: dict[str, Table] = {}
    sequences: dict[str, Table] = {}
    ambiguous: set[tuple[str, str]] = set()
    for (schema, name), rel in relations.items():
        key = name.lower() if rel["visible"] else f"{schema}.{name}".lower()
        kind = "S" if rel["kind"] == "S" else "T"
        into = sequences if kind == "S" else tables
        columns = {
            c["name"]: Column(c["name"], c["type"], c["nullable"], c["primary_key"])
            for c in rel["columns"]
        }
        table = Table(name=name, schema=schema or None, columns=columns)
        held = into.get(key)
        if held is None and (kind, key) not in ambiguous:
            into[key] = table
            continue
        # Names that differ only by case (quoted identifiers, "Orders" beside orders) share a
        # key. The one an unquoted name reaches (all lower case) keeps it; when neither is
        # that one, neither is offered: a request must never reach the other table.
        if held is not None and held.name == held.name.lower():
            continue
        if name == name.lower():
            into[key] = table
            ambiguous.discard((kind, key))
            continue
        into.pop(key, None)
        ambiguous.add((kind, key))
    return Catalog(tables=tables, version=version, dialect=dialect, sequences=sequences)
