"""What a PostgreSQL SQL request would do, decided before it reaches the database: parsed with
libpg_query, refused in the order of docs/gateway.md's table, classified read or write, cached
by statement text and catalog version."""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from corral.gateway._catalog import Catalog
from corral.gateway._errors import GatewayError
from corral.gateway._refusal import Refusal
from corral.gateway._rows import Rows, any_of
from corral.gateway._sql_functions import (
    RELATION_ARGUMENTS,
    TEXT_TYPES,
    call_form_reason,
    forbidden_function_reason,
    forbidden_type_reason,
)
from corral.gateway.postgres._filtered import filtered, read_rows
from corral.gateway.postgres._names import Resolver
from corral.gateway.postgres._parse import deparse, parse
from corral.gateway.postgres._tree import (
    Node,
    char_position,
    string_literal,
    string_names,
    unwrap,
)
from corral.kernel._validate import instance_of, positive_int

__all__ = [
    "Analysis",
    "AnalyzerCacheInfo",
    "SqlAnalyzer",
    "analyze",
    "analyze_fully",
    "is_analysed",
]


_STATEMENT_NAMES = {
    "VariableShowStmt": "SHOW",
    "CreateTableAsStmt": "CREATE TABLE AS",
    "RefreshMatViewStmt": "REFRESH MATERIALIZED VIEW",
    "SecLabelStmt": "SECURITY LABEL",
    "CreatedbStmt": "CREATE DATABASE",
    "DropdbStmt": "DROP DATABASE",
    "DeclareCursorStmt": "DECLARE",
    "ClosePortalStmt": "CLOSE",
    "CheckPointStmt": "CHECKPOINT",
    "CreateTrigStmt": "CREATE TRIGGER",
    "CreateSeqStmt": "CREATE SEQUENCE",
    "IndexStmt": "CREATE INDEX",
    "ViewStmt": "CREATE VIEW",
    "CreateStmt": "CREATE TABLE",
    "RuleStmt": "CREATE RULE",
    "ConstraintsSetStmt": "SET CONSTRAINTS",
    "GrantRoleStmt": "GRANT ROLE",
}
_TRANSACTION_NAMES = {
    "START": "START TRANSACTION",
    "ROLLBACK_TO": "ROLLBACK TO SAVEPOINT",
    "PREPARE": "PREPARE TRANSACTION",
}
_STATEMENTS = ("SelectStmt", "InsertStmt", "UpdateStmt", "DeleteStmt")
_WRITE_STATEMENTS = frozenset({"InsertStmt", "UpdateStmt", "DeleteStmt"})
_WRITE_FUNCTIONS = frozenset({"nextval", "setval"})


@dataclass(frozen=True, slots=True, kw_only=True)
class Analysis:
    """What one statement (``sql``) does.

    ``tables`` are the catalog keys (see ``Catalog.tables``) of every table the statement
    reads or writes, in order of appearance; ``written`` those it inserts into, updates or
    deletes from (none for ``EXPLAIN``). ``filtered``: something on the path that produces
    the rows (the statement, its ``FROM`` subqueries and CTEs, set-operation arms; not scalar
    subqueries) may remove rows (a ``WHERE``, ``HAVING`` or inner-join condition, ``LIMIT`` 0
    or a parameter, ``OFFSET``, a function in ``FROM``, a set-returning call; see
    :func:`~corral.gateway.postgres._names.filtered`), so an empty result may be a filter that
    matched nothing. ``param_count`` is the highest ``$n`` placeholder (0 when none).
    ``rows``: whether the statement without its filters has rows, over the catalog keys of
    the tables producing its rows (:func:`~corral.gateway.postgres._filtered.read_rows`; for
    a write, any table it reads); ``only``: a table is named with ``ONLY``.
    """

    kind: Literal["read", "write"]
    statement_type: str
    tables: tuple[str, ...]
    written: tuple[str, ...]
    filtered: bool
    param_count: int
    sql: str
    rows: Rows = True
    only: bool = False
    _normalized: str | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def normalized(self) -> str:
        """The statement as libpg_query deparses it, for idempotency fingerprints.

        Comments, layout and keyword case are gone; constants and ``$n`` placeholders are
        kept, so two texts doing the same work normalise alike and two doing different work
        do not (a constant-stripping normalisation would let different writes share a
        fingerprint). Worked out on first use (reads rarely need it), then kept.
        """
        normalized = self._normalized
        if normalized is None:
            normalized = deparse(self.sql)
            object.__setattr__(self, "_normalized", normalized)
        return normalized


@dataclass(frozen=True, slots=True, kw_only=True)
class AnalyzerCacheInfo:
    hits: int
    misses: int
    size: int
    maxsize: int


class SqlAnalyzer:
    """:func:`analyze` with its own LRU cache of ``cache_size`` entries (refusals included).

    Thread-safe. ``cache_size`` must be a positive integer (``InvalidArgumentError``).
    """

    def __init__(self, *, cache_size: int = 1024) -> None:
        positive_int("SqlAnalyzer", "cache_size", cache_size)
        self._maxsize = cache_size
        self._cache: OrderedDict[tuple[str, str], Analysis | Refusal] = OrderedDict()
        self._lock = threading.Lock()
        self._hits = 0
        self._misses = 0

    def analyze(self, sql: str, catalog: Catalog) -> Analysis:
        """See :func:`analyze`."""
        instance_of("SqlAnalyzer.analyze", "sql", sql, str)
        instance_of("SqlAnalyzer.analyze", "catalog", catalog, Catalog)
        key = (sql, catalog.version)
        with self._lock:
            entry = self._cache.get(key)
            if entry is not None:
                self._cache.move_to_end(key)
                self._hits += 1
            else:
                self._misses += 1
        if entry is None:
            try:
                entry = _analyze(sql, catalog)
            except GatewayError as exc:
                entry = Refusal.of(exc)
            with self._lock:
                self._cache[key] = entry
                while len(self._cache) > self._maxsize:
                    self._cache.popitem(last=False)
        if isinstance(entry, Refusal):
            raise entry.error()
        return entry

    def has(self, sql: str, catalog: Catalog) -> bool:
        """Whether the answer for ``sql`` and ``catalog`` (an analysis or a refusal) is
        cached."""
        return (sql, catalog.version) in self._cache

    def cache_info(self) -> AnalyzerCacheInfo:
        with self._lock:
            return AnalyzerCacheInfo(
                hits=self._hits, misses=self._misses, size=len(self._cache), maxsize=self._maxsize
            )

    def clear(self) -> None:
        """Empty the cache and reset the counters."""
        with self._lock:
            self._cache.clear()
            self._hits = self._misses = 0


_DEFAULT_ANALYZER = SqlAnalyzer()


def analyze(sql: str, catalog: Catalog) -> Analysis:
    """Analyse one PostgreSQL statement against ``catalog`` (docs/gateway.md lists the refusals).

    Raises ``GatewayError`` (codes above) for a refused statement, ``InvalidArgumentError``
    when ``sql`` is not a ``str`` or ``catalog`` not a ``Catalog``. Pure, and cached in one
    process-wide :class:`SqlAnalyzer`: the same text and catalog version give the same answer.
    """
    return _DEFAULT_ANALYZER.analyze(sql, catalog)


def is_analysed(sql: str, catalog: Catalog) -> bool:
    """Whether :func:`analyze` answers ``sql`` for ``catalog`` from its cache."""
    return _DEFAULT_ANALYZER.has(sql, catalog)


def analyze_fully(sql: str, catalog: Catalog) -> Analysis:
    """:func:`analyze`, with a write's ``normalized`` text worked out too (for a caller on
    another thread than the one that uses it)."""
    analysis = analyze(sql, catalog)
    if analysis.kind == "write":
        _ = analysis.normalized
    return analysis


# --- the analysis -----------------------------------------------------------------------------


def _analyze(sql: str, catalog: Catalog) -> Analysis:
    statements = parse(sql)
    if not statements:
        raise GatewayError(
            "parse_error",
            "SQL holds no statement (only whitespace, comments or semicolons)",
            position=None,
            parser_message="empty statement",
        )
    if len(statements) > 1:
        raise GatewayError(
            "multiple_statements",
            f"one statement per request; this SQL holds {len(statements)}",
            count=len(statements),
        )
    kind, stmt = unwrap(statements[0].get("stmt"))
    statement_type = shown = _statement_type(kind, stmt)
    inner_kind, inner = kind, stmt
    explain_analyze = False
    if kind == "ExplainStmt":
        inner_kind, inner = unwrap(stmt.get("query"))
        explain_analyze = _explain_analyzes(stmt)
        shown = f"EXPLAIN {_statement_type(inner_kind, inner)}"
    if inner_kind not in _STATEMENTS:
        raise GatewayError(
            "forbidden_statement",
            f"{shown} statements are not allowed through the gateway; only SELECT, VALUES, "
            "TABLE (with CTEs), INSERT, UPDATE and DELETE are",
            statement=shown,
        )

    scan = _Scan(sql, catalog)
    scan.run({inner_kind: inner})
    kind_of: Literal["read", "write"] = "write" if scan.writes else "read"
    if kind_of == "read" and scan.locking:
        raise GatewayError(
            "forbidden_statement",
            "SELECT ... FOR UPDATE/SHARE takes row locks, which a read (run in a READ ONLY "
            "transaction) cannot take",
            statement="SELECT FOR UPDATE",
        )
    if explain_analyze and kind_of == "write":
        raise GatewayError(
            "forbidden_statement",
            "EXPLAIN ANALYZE executes the statement it explains, and this one writes",
            statement="EXPLAIN ANALYZE",
        )

    resolver = Resolver(sql, catalog)
    resolver.statement(inner_kind, inner)
    written = tuple(resolver.written)
    rows: Rows = any_of(resolver.tables)
    only = False
    if kind == "ExplainStmt":
        # Nothing runs without ANALYZE, and ANALYZE of a write was refused above.
        kind_of, written, is_filtered, rows = "read", (), False, True
    elif inner_kind == "SelectStmt" and kind_of == "read":
        found = read_rows(inner, lambda schema, name: _key(resolver, schema, name))
        rows, is_filtered, only = found.rows, found.filtered, found.only
    else:
        is_filtered = filtered(inner_kind, inner)
    return Analysis(
        kind=kind_of,
        statement_type=statement_type,
        tables=tuple(resolver.tables),
        written=written,
        filtered=is_filtered,
        param_count=scan.param_count,
        sql=sql,
        rows=rows,
        only=only,
    )


def _key(resolver: Resolver, schema: str, name: str) -> str | None:
    found = resolver.find(schema, name)
    return found[0] if found is not None else None


def _statement_type(kind: str, stmt: Node) -> str:
    if kind == "SelectStmt":
        return "VALUES" if "valuesLists" in stmt else "SELECT"
    if kind == "TransactionStmt":
        name = str(stmt.get("kind", "")).removeprefix("TRANS_STMT_")
        return _TRANSACTION_NAMES.get(name, name.replace("_", " "))
    if kind == "VariableSetStmt":
        if stmt.get("kind") in ("VAR_RESET", "VAR_RESET_ALL"):
            return "RESET"
        return "SET TRANSACTION" if stmt.get("name", "").upper() == "TRANSACTION" else "SET"
    if kind == "VacuumStmt":
        return "VACUUM" if stmt.get("is_vacuumcmd") else "ANALYZE"
    if kind == "GrantStmt":
        return "GRANT" if stmt.get("is_grant") else "REVOKE"
    if kind in _STATEMENT_NAMES:
        return _STATEMENT_NAMES[kind]
    return re.sub(r"(?<=[a-z])(?=[A-Z])", " ", kind.removesuffix("Stmt")).upper()


def _explain_analyzes(stmt: Node) -> bool:
    # PostgreSQL applies the last of repeated options: (ANALYZE false, ANALYZE true) analyzes.
    analyzes = False
    for option in stmt.get("options", ()):
        elem = option.get("DefElem", {})
        if elem.get("defname", "").lower() != "analyze":
            continue
        kind, value = unwrap(elem.get("arg"))
        if kind == "String":
            analyzes = str(value.get("sval", "")).lower() not in ("false", "off", "0", "no")
        elif kind == "Boolean":
            analyzes = bool(value.get("boolval", False))
        elif kind == "Integer":
            analyzes = bool(value.get("ival", 0))
        else:
            analyzes = True
    return analyzes


class _Scan:
    """One pass over every node: functions, writes, row locks, SELECT INTO, placeholders."""

    def __init__(self, sql: str, catalog: Catalog) -> None:
        self.sql = sql
        self.dialect = catalog.dialect
        self.writes = False
        self.locking = False
        self.param_count = 0
        self.text_casts: set[int] = set()  # ids of calls cast straight to a text type

    def run(self, root: Node) -> None:
        stack: list[Any] = [root]
        handlers = _SCAN_HANDLERS
        while stack:
            node = stack.pop()
            if type(node) is list:
                stack.extend(node)
                continue
            for key, value in node.items():
                handler = handlers.get(key)
                if handler is not None:
                    handler(self, value)
                if type(value) is dict or type(value) is list:
                    stack.append(value)

    def function_call(self, node: Node) -> None:
        names = [n["String"].get("sval", "") for n in node.get("funcname", ()) if "String" in n]
        args = node.get("args", ())
        literal = string_literal(args[0]) if args else None
        positions = RELATION_ARGUMENTS.get(names[-1].lower(), ()) if names else ()
        literal_args = all(string_literal(args[i]) is not None for i in positions if i < len(args))
        self.check_function(
            names,
            len(args),
            node.get("location", 0),
            literal,
            literal_args=literal_args,
            text_cast=id(node) in self.text_casts,
        )

    def indirection(self, node: Node) -> None:
        _, arg = unwrap(node.get("arg"))
        for item in node.get("indirection", ()):
            if "String" in item:
                name = item["String"].get("sval", "")
                self.check_function([name], 1, arg.get("location", 0), literal_args=False)

    def type_cast(self, node: Node) -> None:
        """Note a call cast straight to a text type: ``pg_typeof(x)::text`` is allowed."""
        kind, arg = unwrap(node.get("arg"))
        names = string_names(node.get("typeName", {}).get("names", ()))
        if kind == "FuncCall" and names and names[-1].lower() in TEXT_TYPES:
            self.text_casts.add(id(arg))

    def check_function(
        self,
        names: list[str],
        arity: int,
        location: int,
        literal: str | None = None,
        *,
        literal_args: bool = True,
        text_cast: bool = False,
    ) -> None:
        if not names:
            return
        reason = forbidden_function_reason(names[-1], self.dialect, arity, literal)
        if reason is None and not text_cast:
            reason = call_form_reason(names[-1], self.dialect, literal_args=literal_args)
        if reason is not None:
            shown = ".".join(names)
            raise GatewayError(
                "forbidden_function",
                f"function {shown} is not allowed through the gateway: {reason}",
                function=shown,
                position=char_position(self.sql, location),
            )
        if names[-1].lower() in _WRITE_FUNCTIONS:
            self.writes = True

    def type_name(self, node: Node) -> None:
        names = [n["String"].get("sval", "") for n in node.get("names", ()) if "String" in n]
        if not names:
            return
        reason = forbidden_type_reason(names[-1], self.dialect)
        if reason is not None:
            shown = ".".join(names)
            raise GatewayError(
                "forbidden_function",
                f"cast to {shown} is not allowed through the gateway: {reason}",
                function=shown,
                position=char_position(self.sql, node.get("location", 0)),
            )

    def param(self, node: Node) -> None:
        self.param_count = max(self.param_count, int(node.get("number", 0)))

    def write(self, node: Node) -> None:
        self.writes = True

    def merge(self, node: Node) -> None:
        raise GatewayError(
            "forbidden_statement",
            "MERGE is not allowed through the gateway; use INSERT ... ON CONFLICT, UPDATE or "
            "DELETE",
            statement="MERGE",
        )

    def into(self, node: Node) -> None:
        raise GatewayError(
            "forbidden_statement",
            "SELECT ... INTO creates a table, which the gateway does not allow",
            statement="SELECT INTO",
        )

    def lock(self, node: Node) -> None:
        self.locking = True


_SCAN_HANDLERS: dict[str, Callable[[_Scan, Any], None]] = {
    "FuncCall": _Scan.function_call,
    "A_Indirection": _Scan.indirection,
    "TypeCast": _Scan.type_cast,
    "typeName": _Scan.type_name,
    "TypeName": _Scan.type_name,
    "ParamRef": _Scan.param,
    **dict.fromkeys(_WRITE_STATEMENTS, _Scan.write),
    "MergeStmt": _Scan.merge,
    "intoClause": _Scan.into,
    "lockingClause": _Scan.lock,
}
