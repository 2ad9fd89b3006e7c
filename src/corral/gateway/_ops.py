"""Structured operations (find, count, insert, update, delete) compiled to parameterised SQL for
either engine: names come from the catalog, quoted; values are always parameters. The keys and
operators are described in docs/gateway.md."""

# Longer than 500 lines: one compiler whose clauses check a request and write its SQL for both
# dialects side by side; split by clause, each part would need the compiler's state back.

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from corral.gateway._catalog import Catalog, Column, Table
from corral.gateway._errors import GatewayError
from corral.gateway._request import KEY_EXPECTED, key_is_valid, unstorable
from corral.gateway._sql_functions import forbidden_type_reason
from corral.kernel._errors import InvalidArgumentError

__all__ = ["MAX_PARAMS", "CompiledOperation", "compile_operation", "quote_identifier"]

MAX_PARAMS = 32_766  # SQLite's default ceiling on bound parameters (PostgreSQL allows 65_535)
_MAX_DEPTH = 64
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

_READS = ("find", "count")
_OPS = ("find", "count", "insert", "update", "delete")
_PASSTHROUGH = ("idempotency_key", "plan_hash")
_KEYS: dict[str, tuple[str, ...]] = {
    "find": ("where", "columns", "order_by", "limit", "offset"),
    "count": ("where",),
    "insert": ("values", "returning"),
    "update": ("set", "where", "all_rows", "returning"),
    "delete": ("where", "all_rows", "returning"),
}
_OPERATORS = ("eq", "ne", "lt", "lte", "gt", "gte", "in", "like", "is_null")
_COMPARE = {"eq": "=", "ne": "<>", "lt": "<", "lte": "<=", "gt": ">", "gte": ">="}

# PostgreSQL type families, for refusing values the column's type can never accept.
_FAMILIES: dict[str, frozenset[str]] = {
    "integer": frozenset(
        [
            "smallint",
            "integer",
            "bigint",
            "int",
            "int2",
            "int4",
            "int8",
            "smallserial",
            "serial",
            "bigserial",
            "serial2",
            "serial4",
            "serial8",
        ]
    ),
    "numeric": frozenset(["numeric", "decimal", "real", "double precision", "float4", "float8"]),
    "text": frozenset(
        ["text", "character varying", "varchar", "character", "char", "bpchar", "name", "citext"]
    ),
    "boolean": frozenset(["boolean", "bool"]),
    "json": frozenset(["json", "jsonb"]),
}
_REFUSES: dict[str, tuple[type, ...]] = {  # family -> Python value types it never accepts
    "integer": (bool, dict, list),
    "numeric": (bool, dict, list),
    "text": (bool, int, float, dict, list),
    "boolean": (int, float, dict, list),  # bool is an int: checked first
    "array": (bool, int, float, dict),
    "other": (dict, list),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class CompiledOperation:
    """A structured operation as SQL for ``catalog.dialect``.

    Run it as ``execute(sql, params)`` with ``params`` passed even when empty: on PostgreSQL
    the placeholders are psycopg's ``%s`` and a ``%`` inside an identifier is doubled, as
    psycopg expects when parameters are given; on SQLite they are ``?``. ``kind`` is ``read``
    for find/count and ``write`` otherwise. ``table`` is the catalog's name for the table.
    ``filtered`` is true for a read with a non-empty ``where`` or a ``find`` with a non-zero
    ``offset`` (``limit`` is at least 1, so it never empties an answer by itself);
    ``exists_sql`` (run with empty params) then tells whether the table holds any row at all,
    for telling a genuine empty result from a suspicious one. ``normalized`` is canonical
    JSON describing the operation (not its pass-through keys): equal for the same operation
    whatever the order of keys.
    """

    sql: str
    params: tuple[Any, ...]
    kind: Literal["read", "write"]
    op: str
    table: str
    filtered: bool
    normalized: str
    exists_sql: str | None = None
    idempotency_key: str | None = None
    plan_hash: str | None = None


def quote_identifier(name: str, dialect: str) -> str:
    """``name`` as a double-quoted identifier; ``%`` doubled for psycopg on PostgreSQL."""
    quoted = '"' + name.replace('"', '""') + '"'
    return quoted.replace("%", "%%") if dialect == "postgresql" else quoted


def compile_operation(request: Mapping[str, Any], catalog: Catalog) -> CompiledOperation:
    """Compile ``request`` for ``catalog``.

    Raises :class:`GatewayError` (``unknown_table``, ``unknown_column``, ``invalid_operation``)
    listing every problem found, and ``InvalidArgumentError`` when ``catalog`` is not a
    :class:`Catalog` of dialect ``postgresql`` or ``sqlite``. Pure: touches no database.
    """
    if not isinstance(catalog, Catalog) or catalog.dialect not in ("postgresql", "sqlite"):
        raise InvalidArgumentError(
            "compile_operation", "catalog", "a Catalog of dialect postgresql or sqlite", catalog
        )
    return _Compiler(catalog).run(request)


def _shown(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _family(column: Column) -> str:
    base = re.sub(r"\(.*?\)", "", column.type.lower()).strip()
    if base.endswith("[]") or base == "array" or base.startswith("_"):
        return "array"
    base = base.replace(" without time zone", "").replace(" with time zone", "")
    for family, names in _FAMILIES.items():
        if base in names:
            return family
    return "other"


class _Compiler:
    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.pg = catalog.dialect == "postgresql"
        self.mark = "%s" if self.pg else "?"
        self.table: Table | None = None
        self.params: list[Any] = []
        self.problems: list[tuple[str, str, dict[str, Any]]] = []

    # --- problems ---------------------------------------------------------------------------

    def problem(self, code: str, message: str, **details: Any) -> None:
        self.problems.append((code, message, details))

    def invalid(self, key: str, value: Any, expected: str, **details: Any) -> None:
        message = f"{key} must be {expected}, got {_shown(value)}"
        self.problem("invalid_operation", message, key=key, value=_shown(value), **details)

    def error(self) -> GatewayError:
        code, message, details = self.problems[0]
        if len(self.problems) > 1:
            message += f" (and {len(self.problems) - 1} more problem(s) in details.problems)"
        listed = [{"code": c, "message": m, "details": d} for c, m, d in self.problems]
        return GatewayError(code, message, **details, problems=listed)

    # --- identifiers ------------------------------------------------------------------------

    def q(self, name: str) -> str:
        return quote_identifier(name, self.catalog.dialect)

    def qualified(self, table: Table) -> str:
        return (f"{self.q(table.schema)}." if table.schema else "") + self.q(table.name)

    def column(self, name: Any, key: str) -> Column | None:
        if not isinstance(name, str) or not name:
            self.invalid(key, name, "a column name (a non-empty string)")
            return None
        table = self.table
        if table is None:  # already refused as unknown_table
            return None
        found = table.columns.get(name)
        if found is not None:
            return found
        # Case-insensitive, as table names are; only when it picks one column.
        folded = [c for c in table.columns.values() if c.name.lower() == name.lower()]
        if len(folded) == 1:
            return folded[0]
        if folded:
            suggestions = [c.name for c in folded]
            why = f"; names differ only by case: {', '.join(suggestions)}"
        else:
            # Matched on lower case both ways: catalogs key columns by their own spelling.
            lowered = {c.name.lower(): c.name for c in table.columns.values()}
            close = difflib.get_close_matches(name.lower(), list(lowered), n=3, cutoff=0.6)
            suggestions = [lowered[c] for c in close]
            why = f"; did you mean {', '.join(suggestions)}?" if suggestions else ""
        self.problem(
            "unknown_column",
            f"{key}: table {table.name!r} has no column {name!r}{why}",
            table=table.name,
            column=name,
            key=key,
            suggestions=suggestions,
        )
        return None

    def names(self, value: Any, key: str, *, descending: bool = False) -> list[tuple[Column, bool]]:
        """A non-empty list of distinct column names (``-name`` when ``descending``)."""
        if not isinstance(value, list | tuple) or not value:
            self.invalid(key, value, "a non-empty list of column names")
            return []
        found: list[tuple[Column, bool]] = []
        seen: set[str] = set()
        for i, item in enumerate(value):
            desc = descending and isinstance(item, str) and item.startswith("-")
            col = self.column(item[1:] if desc else item, f"{key}[{i}]")
            if col is None:
                continue
            if col.name in seen:
                self.invalid(f"{key}[{i}]", item, f"a column not already named in {key}")
                continue
            seen.add(col.name)
            found.append((col, desc))
        return found

    # --- values -----------------------------------------------------------------------------

    def json_like(self, value: Any, key: str, depth: int = 0) -> bool:
        if depth > _MAX_DEPTH:
            self.invalid(key, value, f"JSON nested at most {_MAX_DEPTH} deep")
            return False
        if value is None or isinstance(value, bool | str):
            if self.pg and isinstance(value, str) and "\x00" in value:
                self.invalid(key, value, "a string without NUL characters (PostgreSQL)")
                return False
            return True
        if isinstance(value, int):
            if not self.pg and not _INT64_MIN <= value <= _INT64_MAX:
                self.invalid(key, value, "an integer within 64 bits (SQLite)")
                return False
            return True
        if isinstance(value, float):
            if not math.isfinite(value):
                self.invalid(key, value, "a JSON value (a finite number)")
                return False
            return True
        if isinstance(value, list):
            return all(self.json_like(v, f"{key}[{i}]", depth + 1) for i, v in enumerate(value))
        if isinstance(value, Mapping):
            for k, v in value.items():
                if not isinstance(k, str):
                    self.invalid(key, k, "a JSON object key (a string)")
                    return False
                if not self.json_like(v, f"{key}.{k}", depth + 1):
                    return False
            return True
        self.invalid(key, value, "a JSON value (str, int, float, bool, None, list or object)")
        return False

    def bind(self, column: Column, value: Any, key: str) -> str | None:
        """Add ``value`` as a parameter for ``column``; the SQL expression that reads it."""
        if not self.json_like(value, key):
            return None
        if value is None:
            self.params.append(None)
            return self.mark
        if not self.pg:
            if isinstance(value, list | Mapping):
                value = _dumps(value)
            self.params.append(value)
            return self.mark
        element = column.type.split("[", 1)[0].strip()
        if forbidden_type_reason(element) is not None:
            # PostgreSQL would look the value up by name or oid: hidden objects included.
            self.problem(
                "forbidden_function",
                f"{key}: column {column.name!r} is of type {column.type}, a catalog object "
                "type; a value for it is looked up in the system catalogs, those of objects "
                "the gateway hides included",
                function=column.type,
                key=key,
            )
            return None
        family = _family(column)
        if family == "json":
            self.params.append(_dumps(value))
            kind = "jsonb" if column.type.lower().startswith("jsonb") else "json"
            return f"CAST({self.mark} AS {kind})"
        refused = _REFUSES.get(family, ())
        if isinstance(value, Mapping):
            refused_now = dict in refused
        elif isinstance(value, bool):
            refused_now = bool in refused
        else:
            refused_now = isinstance(value, refused)
        if refused_now:
            self.invalid(key, value, f"a value column {column.name!r} ({column.type}) accepts")
            return None
        self.params.append(value)
        return self.mark

    # --- clauses ----------------------------------------------------------------------------

    def where(self, where: Any) -> tuple[list[str], dict[str, dict[str, Any]]]:
        if where is None:
            return [], {}
        if not isinstance(where, Mapping):
            self.invalid("where", where, "a mapping of field to value or operators")
            return [], {}
        resolved: dict[str, tuple[Column, str, Any]] = {}
        for field, cond in where.items():
            key = f"where.{field}"
            col = self.column(field, key)
            if col is None:
                continue
            if col.name in resolved:
                self.invalid(key, field, f"a field not already named in where ({col.name!r})")
                continue
            resolved[col.name] = (col, key, cond)
        clauses: list[str] = []
        normal: dict[str, dict[str, Any]] = {}
        for name in sorted(resolved):
            col, key, cond = resolved[name]
            if isinstance(cond, list | tuple):
                self.invalid(key, cond, "a value or a mapping of operators (a list needs 'in')")
                continue
            ops = dict(cond) if isinstance(cond, Mapping) else {"eq": cond}
            if not ops:
                self.invalid(key, cond, f"a mapping naming at least one of {', '.join(_OPERATORS)}")
                continue
            normal[name] = {}
            for op in sorted(ops, key=str):
                if op not in _OPERATORS:
                    self.problem(
                        "invalid_operation",
                        f"{key}.{op}: unknown operator {op!r} (operators: {', '.join(_OPERATORS)})",
                        key=f"{key}.{op}",
                        value=_shown(op),
                        suggestions=difflib.get_close_matches(str(op), _OPERATORS, cutoff=0.5),
                    )
                    continue
                sql = self.condition(col, op, ops[op], f"{key}.{op}")
                if sql is not None:
                    clauses.append(sql)
                    normal[name][op] = ops[op]
        return clauses, normal

    def condition(self, col: Column, op: str, value: Any, key: str) -> str | None:
        c = self.q(col.name)
        family = _family(col) if self.pg else "other"
        if op == "is_null" or (op in ("eq", "ne") and value is None):
            if op == "is_null" and not isinstance(value, bool):
                self.invalid(key, value, "true or false")
                return None
            null = value if op == "is_null" else op == "eq"
            return f"{c} IS NULL" if null else f"{c} IS NOT NULL"
        if self.pg and col.type.lower() == "json":
            self.invalid(key, value, "absent: PostgreSQL json has no comparisons (only is_null)")
            return None
        if op in ("eq", "ne") and isinstance(value, list | Mapping):
            if family not in ("json", "array"):
                self.invalid(key, value, "a string, number or boolean (JSON needs a jsonb column)")
                return None
        elif op == "in":
            if (
                not isinstance(value, list | tuple)
                or not value
                or any(not isinstance(v, str | int | float) for v in value)
            ):
                self.invalid(key, value, "a non-empty list of strings, numbers or booleans")
                return None
            marks = [self.bind(col, v, f"{key}[{i}]") for i, v in enumerate(value)]
            return None if None in marks else f"{c} IN ({', '.join(m or '' for m in marks)})"
        elif op == "like":
            if not isinstance(value, str) or re.search(r"(?<!\\)(\\\\)*\\\Z", value):
                self.invalid(key, value, "a pattern string not ending in a lone backslash")
                return None
            if family not in ("text", "other"):
                self.invalid(
                    key, value, f"absent: column {col.name!r} of type {col.type} is not text"
                )
                return None
            mark = self.bind(col, value, key)
            escape = "E'\\\\'" if self.pg else "'\\'"
            return None if mark is None else f"{c} LIKE {mark} ESCAPE {escape}"
        elif not isinstance(value, str | int | float):
            self.invalid(key, value, "a string, number or boolean")
            return None
        mark = self.bind(col, value, key)
        return None if mark is None else f"{c} {_COMPARE[op]} {mark}"

    def count_limit(self, value: Any, key: str, minimum: int) -> int | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value:
            self.invalid(key, value, "a positive integer" if minimum else "a non-negative integer")
            return None
        if value > _INT64_MAX:
            self.invalid(key, value, f"an integer at most {_INT64_MAX}")
            return None
        return value

    def returning(self, value: Any, normal: dict[str, Any]) -> str:
        if value is None or value is False:
            return ""
        if value is True:
            normal["returning"] = "*"
            return " RETURNING *"
        cols = [col for col, _ in self.names(value, "returning")]
        normal["returning"] = [col.name for col in cols]
        return " RETURNING " + ", ".join(self.q(col.name) for col in cols)

    def rows(self, value: Any) -> tuple[list[Column], list[list[str | None]], list[Any]]:
        rows = [value] if isinstance(value, Mapping) else value
        if not isinstance(rows, list) or not rows:
            self.invalid("values", value, "a mapping of column to value, or a non-empty list")
            return [], [], []
        before = len(self.problems)
        columns: dict[str, Column] = {}
        keyed: list[dict[str, tuple[Any, str]]] = []
        for i, row in enumerate(rows):
            key = "values" if isinstance(value, Mapping) else f"values[{i}]"
            if not isinstance(row, Mapping) or not row:
                self.invalid(key, row, "a non-empty mapping of column to value")
                continue
            resolved: dict[str, tuple[Any, str]] = {}
            for name, v in row.items():
                col = self.column(name, f"{key}.{name}")
                if col is not None:
                    columns[col.name] = col
                    resolved[col.name] = (v, f"{key}.{name}")
            keyed.append(resolved)
        if len(self.problems) > before:
            return [], [], []
        order = sorted(keyed[0])
        marks: list[list[str | None]] = []
        normal: list[Any] = []
        for i, resolved in enumerate(keyed):
            if sorted(resolved) != order:
                self.invalid(f"values[{i}]", sorted(resolved), f"the columns of values[0]: {order}")
                continue
            marks.append([self.bind(columns[n], resolved[n][0], resolved[n][1]) for n in order])
            normal.append({n: resolved[n][0] for n in order})
        return [columns[n] for n in order], marks, normal

    # --- the statement ----------------------------------------------------------------------

    def run(self, request: Any) -> CompiledOperation:
        if not isinstance(request, Mapping):
            self.invalid("request", request, "a mapping with op and table")
            raise self.error()
        op = request.get("op")
        if op not in _OPS:
            self.invalid("op", op, f"one of {', '.join(_OPS)}")
            allowed: tuple[str, ...] = tuple(k for keys in _KEYS.values() for k in keys)
        else:
            allowed = _KEYS[op]
        known = ("op", "table", *_PASSTHROUGH, *allowed)
        for k in request:
            if k not in known:
                self.problem(
                    "invalid_operation",
                    f"{k} is not a key of op {op!r} (keys: {', '.join(known)}),"
                    f" got {_shown(request[k])}",
                    key=str(k),
                    value=_shown(request[k]),
                    suggestions=difflib.get_close_matches(str(k), known, cutoff=0.6),
                )
        passed: dict[str, str | None] = {}
        for k in _PASSTHROUGH:
            v = request.get(k)
            if v is not None and not key_is_valid(v):
                character = unstorable(v) if isinstance(v, str) else None
                extra = {"character": character} if character is not None else {}
                self.invalid(k, v, KEY_EXPECTED, **extra)
            passed[k] = v if isinstance(v, str) else None
        name = request.get("table")
        if not isinstance(name, str) or not name:
            self.invalid("table", name, "a table name (a non-empty string)")
        else:
            self.table = self.catalog.tables.get(name) or self.catalog.table(name)
            if self.table is None:
                suggestions = self.catalog.close_tables(name)
                hint = f"; did you mean {', '.join(suggestions)}?" if suggestions else ""
                self.problem(
                    "unknown_table",
                    f"no table {name!r} in the catalog{hint}",
                    table=name,
                    suggestions=suggestions,
                )
        if op not in _OPS:
            raise self.error()
        table = self.table
        target = self.qualified(table) if table else ""
        label = f"{table.schema}.{table.name}" if table and table.schema else name
        normal: dict[str, Any] = {"op": op, "table": label}
        sql, filtered = self.statement(op, request, target, normal)
        if len(self.params) > MAX_PARAMS:
            self.problem(
                "invalid_operation",
                f"request carries {len(self.params)} values, more than the {MAX_PARAMS} allowed",
                key="request",
                value=len(self.params),
                limit=MAX_PARAMS,
            )
        if self.problems or table is None:
            raise self.error()
        return CompiledOperation(
            sql=sql,
            params=tuple(self.params),
            kind="read" if op in _READS else "write",
            op=op,
            table=table.name,
            filtered=filtered,
            normalized=_dumps(normal),
            exists_sql=f"SELECT EXISTS (SELECT 1 FROM {target})" if filtered else None,
            idempotency_key=passed["idempotency_key"],
            plan_hash=passed["plan_hash"],
        )

    def statement(
        self, op: str, request: Mapping[str, Any], target: str, normal: dict[str, Any]
    ) -> tuple[str, bool]:
        if op == "insert":
            if "values" not in request:
                self.invalid("values", None, "a mapping of column to value, or a non-empty list")
                return "", False
            cols, marks, rows = self.rows(request["values"])
            normal["values"] = rows
            names = ", ".join(self.q(c.name) for c in cols)
            tuples = ", ".join("(" + ", ".join(m or "" for m in row) + ")" for row in marks)
            tail = self.returning(request.get("returning"), normal)
            return f"INSERT INTO {target} ({names}) VALUES {tuples}{tail}", False
        sets = ""
        if op == "update":
            assignments = request.get("set")
            if not isinstance(assignments, Mapping) or not assignments:
                self.invalid("set", assignments, "a non-empty mapping of column to value")
            else:
                chosen: dict[str, tuple[Column, Any, str]] = {}
                for name, v in assignments.items():
                    col = self.column(name, f"set.{name}")
                    if col is not None:
                        chosen[col.name] = (col, v, f"set.{name}")
                assigned = [(n, self.bind(*chosen[n])) for n in sorted(chosen)]
                sets = " SET " + ", ".join(f"{self.q(n)} = {m}" for n, m in assigned)
                normal["set"] = {n: chosen[n][1] for n in sorted(chosen)}
        select = "*"
        if op == "find" and request.get("columns") is not None:
            cols = [col for col, _ in self.names(request["columns"], "columns")]
            select = ", ".join(self.q(c.name) for c in cols)
            normal["columns"] = [c.name for c in cols]
        clauses, conditions = self.where(request.get("where"))
        if conditions:
            normal["where"] = conditions
        where = " WHERE " + " AND ".join(clauses) if clauses else ""
        if op in ("update", "delete"):
            everything = request.get("all_rows")
            if everything is not None and not isinstance(everything, bool):
                self.invalid("all_rows", everything, "true or false")
            elif everything and request.get("where"):
                self.invalid("all_rows", everything, "absent when where is given")
            elif not everything and not request.get("where"):
                self.invalid("where", request.get("where"), 'non-empty (or "all_rows": true)')
            normal["all_rows"] = bool(everything)
            tail = self.returning(request.get("returning"), normal)
            if op == "update":
                return f"UPDATE {target}{sets}{where}{tail}", False
            return f"DELETE FROM {target}{where}{tail}", False
        if op == "count":
            return f'SELECT COUNT(*) AS "count" FROM {target}{where}', bool(clauses)
        order = ""
        if request.get("order_by") is not None:
            if isinstance(request["order_by"], list) and not request["order_by"]:
                pass  # an empty ordering is no ordering
            else:
                keys = self.names(request["order_by"], "order_by", descending=True)
                normal["order_by"] = [("-" if d else "") + c.name for c, d in keys]
                nulls = ("", "") if self.pg else (" NULLS LAST", " NULLS FIRST")
                order = " ORDER BY " + ", ".join(
                    f"{self.q(c.name)} {'DESC' + nulls[1] if d else 'ASC' + nulls[0]}"
                    for c, d in keys
                )
        page = ""
        limit = self.count_limit(request.get("limit"), "limit", 1)
        offset = self.count_limit(request.get("offset"), "offset", 0)
        if limit is not None:
            normal["limit"] = limit
            self.params.append(limit)
            page += f" LIMIT {self.mark}"
        elif offset is not None and not self.pg:
            page += " LIMIT -1"  # SQLite takes OFFSET only after a LIMIT
        if offset is not None:
            normal["offset"] = offset
            self.params.append(offset)
            page += f" OFFSET {self.mark}"
        # An offset leaves rows out as a filter does: past the end, the answer is empty.
        return f"SELECT {select} FROM {target}{where}{order}{page}", bool(clauses) or bool(offset)


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
