"""Tables and columns of a parsed statement, resolved scope by scope against a catalog.

Works on libpg_query's JSON parse tree: a node is ``{"TypeName": {fields}}``, fields keep the
names of PostgreSQL's C structs (``targetList``, ``fromClause``, ...), and fields at their
default value are left out.

The checks refuse only what PostgreSQL would refuse too: a column is ``unknown_column`` only
when every relation it could belong to has known columns (catalog tables, CTEs and subqueries
whose output names can be worked out). Relations produced by functions (``generate_series``,
``jsonb_to_record``, ``JSON_TABLE``, ...) may have any column, and names that could be an
output alias (``ORDER BY``, ``GROUP BY``, ``DISTINCT ON``), a whole-row reference or a system
column pass.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

from corral.gateway._catalog import Catalog, Table
from corral.gateway._errors import GatewayError
from corral.gateway._sql_functions import forbidden_function_reason

__all__ = ["Resolver", "char_position", "filtered", "unwrap"]

Node = dict[str, Any]
Columns = tuple[str, ...] | None  # None: not known here, so any column may exist

_SYSTEM_COLUMNS = {
    "postgresql": frozenset({"ctid", "xmin", "xmax", "cmin", "cmax", "tableoid"}),
    "sqlite": frozenset({"rowid", "oid", "_rowid_"}),
}
_EMPTY: frozenset[str] = frozenset()


def unwrap(node: Any) -> tuple[str, Node]:
    """``("TypeName", fields)`` of a node; ``("", node)`` for anything else."""
    if type(node) is dict and len(node) == 1:
        for kind, body in node.items():
            if kind[:1].isupper() and type(body) is dict:
                return kind, body
    return "", node if type(node) is dict else {}


def char_position(sql: str, byte_offset: int) -> int:
    """1-based character position of a 0-based UTF-8 byte offset (a node's ``location``)."""
    if sql.isascii():
        return max(byte_offset, 0) + 1
    head = sql.encode("utf-8")[: max(byte_offset, 0)]
    return len(head.decode("utf-8", errors="ignore")) + 1


def _names(nodes: Any) -> list[str]:
    return [n["String"].get("sval", "") for n in nodes if "String" in n]


def _alias(body: Node) -> tuple[str | None, list[str]]:
    alias = body.get("alias")
    if not alias:
        return None, []
    return alias.get("aliasname") or None, _names(alias.get("colnames", ()))


@dataclass(slots=True)
class _Rel:
    """A relation in scope: what a name in FROM refers to."""

    name: str | None
    columns: Columns
    table: Table | None = None


@dataclass(frozen=True, slots=True)
class _Scope:
    levels: tuple[list[_Rel], ...]
    ctes: dict[str, Columns]

    def push(self, level: list[_Rel]) -> _Scope:
        return _Scope((*self.levels, level), self.ctes)


class Resolver:
    """Resolves one statement; ``tables`` and ``written`` collect catalog keys in order.

    Raises ``GatewayError`` ``unknown_table``, ``unknown_column`` or (for ``q.f`` field
    selection that PostgreSQL would turn into the call ``f(q)``) ``forbidden_function``.
    """

    def __init__(self, sql: str, catalog: Catalog) -> None:
        self.sql = sql
        self.catalog = catalog
        self.system = _SYSTEM_COLUMNS.get(catalog.dialect, _EMPTY)
        self.tables: dict[str, None] = {}
        self.written: dict[str, None] = {}

    def statement(self, kind: str, body: Node) -> None:
        self.any_statement(kind, body, _Scope((), {}))

    def any_statement(self, kind: str, body: Node, scope: _Scope) -> Columns:
        if kind == "SelectStmt":
            return self.select(body, scope)
        if kind == "InsertStmt":
            return self.insert(body, scope)
        if kind == "UpdateStmt":
            return self.update(body, scope)
        if kind == "DeleteStmt":
            return self.delete(body, scope)
        self.exprs([body], scope)
        return None

    # statements

    def with_clause(self, clause: Node, scope: _Scope) -> _Scope:
        ctes = dict(scope.ctes)
        inner = _Scope(scope.levels, ctes)
        for node in clause.get("ctes", ()):
            kind, cte = unwrap(node)
            if kind != "CommonTableExpr":
                continue
            name = cte.get("ctename", "")
            renames = _names(cte.get("aliascolnames", ()))
            if clause.get("recursive"):
                ctes[name] = tuple(renames) if renames else None  # the self-reference
            columns = _rename(self.any_statement(*unwrap(cte.get("ctequery")), inner), renames)
            # SEARCH ... SET col and CYCLE ... SET col USING path add columns to the CTE.
            added = [
                clause_node[key]
                for clause_node, key in (
                    (cte.get("search_clause", {}), "search_seq_column"),
                    (cte.get("cycle_clause", {}), "cycle_mark_column"),
                    (cte.get("cycle_clause", {}), "cycle_path_column"),
                )
                if clause_node.get(key)
            ]
            ctes[name] = (*columns, *added) if columns is not None else None
        return inner

    def select(self, stmt: Node, scope: _Scope) -> Columns:
        if "withClause" in stmt:
            scope = self.with_clause(stmt["withClause"], scope)
        if stmt.get("op", "SETOP_NONE") != "SETOP_NONE":
            left = self.select(stmt.get("larg", {}), scope)
            self.select(stmt.get("rarg", {}), scope)
            outer = scope.push([_Rel(None, left)])
            limits = [stmt[k] for k in ("limitOffset", "limitCount") if k in stmt]
            self.exprs([*stmt.get("sortClause", ()), *limits], outer)
            return left
        if "valuesLists" in stmt:
            rows = stmt["valuesLists"]
            self.exprs(rows, scope)
            kind, first = unwrap(rows[0])
            width = len(first.get("items", ())) if kind == "List" else 0
            return tuple(f"column{i + 1}" for i in range(width))
        level: list[_Rel] = []
        inner = scope.push(level)
        for item in stmt.get("fromClause", ()):
            self.from_item(*unwrap(item), inner, level)
        targets = stmt.get("targetList", [])
        self.exprs(targets, inner)
        outputs = self.outputs(targets, level)
        aliases = frozenset(
            t["ResTarget"]["name"] for t in targets if "name" in t.get("ResTarget", {})
        ) | frozenset(outputs or ())
        plain = ("whereClause", "havingClause", "limitOffset", "limitCount")
        self.exprs([stmt[k] for k in plain if k in stmt], inner)
        self.exprs(stmt.get("windowClause", ()), inner)
        ordering = ("groupClause", "sortClause", "distinctClause")
        self.exprs([n for k in ordering for n in stmt.get(k, ())], inner, aliases)
        return outputs

    def insert(self, stmt: Node, scope: _Scope) -> Columns:
        if "withClause" in stmt:
            scope = self.with_clause(stmt["withClause"], scope)
        target = self.target(stmt.get("relation", {}))
        for node in stmt.get("cols", ()):
            self.target_column(target, node.get("ResTarget", {}))
        if "selectStmt" in stmt:
            self.any_statement(*unwrap(stmt["selectStmt"]), scope)
        clause = stmt.get("onConflictClause")
        if clause:
            conflict = scope.push([target, _Rel("excluded", target.columns, target.table)])
            infer = clause.get("infer", {})
            for node in infer.get("indexElems", ()):
                self.target_column(target, node.get("IndexElem", {}))
            self.exprs([infer], conflict)
            for node in clause.get("targetList", ()):
                res = node.get("ResTarget", {})
                self.target_column(target, res)
                self.exprs([res.get("val", {})], conflict)
            self.exprs([clause.get("whereClause", {})], conflict)
        return self.returning(stmt.get("returningClause"), scope, [target])

    def update(self, stmt: Node, scope: _Scope) -> Columns:
        if "withClause" in stmt:
            scope = self.with_clause(stmt["withClause"], scope)
        target = self.target(stmt.get("relation", {}))
        level = [target]
        inner = scope.push(level)
        for item in stmt.get("fromClause", ()):
            self.from_item(*unwrap(item), inner, level)
        for node in stmt.get("targetList", ()):
            res = node.get("ResTarget", {})
            self.target_column(target, res)
            self.exprs([res.get("val", {})], inner)
        self.exprs([stmt.get("whereClause", {})], inner)
        return self.returning(stmt.get("returningClause"), scope, level)

    def delete(self, stmt: Node, scope: _Scope) -> Columns:
        if "withClause" in stmt:
            scope = self.with_clause(stmt["withClause"], scope)
        target = self.target(stmt.get("relation", {}))
        level = [target]
        inner = scope.push(level)
        for item in stmt.get("usingClause", ()):
            self.from_item(*unwrap(item), inner, level)
        self.exprs([stmt.get("whereClause", {})], inner)
        return self.returning(stmt.get("returningClause"), scope, level)

    def returning(self, clause: Node | None, scope: _Scope, level: list[_Rel]) -> Columns:
        if not clause or not clause.get("exprs"):
            return ()
        target = level[0]
        # RETURNING old.* / new.* (PostgreSQL 18), also under names given in WITH (...).
        names = ["old", "new"] + [
            n["ReturningOption"]["value"]
            for n in clause.get("options", ())
            if n.get("ReturningOption", {}).get("value")
        ]
        extra = [_Rel(name, target.columns, target.table) for name in names]
        self.exprs(clause["exprs"], scope.push([*level, *extra]))
        return self.outputs(clause["exprs"], level)

    def target(self, relation: Node) -> _Rel:
        key, table = self.lookup(relation)
        self.written[key] = None
        alias, _ = _alias(relation)
        return _Rel(alias or relation.get("relname", ""), tuple(table.columns), table)

    def target_column(self, target: _Rel, node: Node) -> None:
        name = node.get("name", "")
        if not name or target.columns is None or target.table is None:
            return
        if name in target.columns or name in self.system:
            return
        location = node.get("location", 0)
        self.unknown_column(name, target.table.name, list(target.columns), location)

    # FROM

    def from_item(self, kind: str, body: Node, scope: _Scope, level: list[_Rel]) -> None:
        if kind == "RangeVar":
            level.append(self.range_var(body, scope))
        elif kind == "RangeSubselect":
            columns = self.any_statement(*unwrap(body.get("subquery")), scope)
            alias, renames = _alias(body)
            level.append(_Rel(alias, _rename(columns, renames)))
        elif kind == "JoinExpr":
            start = len(level)
            self.from_item(*unwrap(body.get("larg")), scope, level)
            self.from_item(*unwrap(body.get("rarg")), scope, level)
            sides = level[start:]
            merged = _merge(sides)
            using = _names(body.get("usingClause", ()))
            for name in using:
                if merged is not None and name not in merged:
                    tables = [r.table.name for r in sides if r.table is not None]
                    single = tables[0] if len(tables) == 1 else None
                    self.unknown_column(name, single, list(merged), 0)
            if "quals" in body:
                self.exprs([body["quals"]], scope)
            alias, _ = _alias(body)
            if alias:
                level.append(_Rel(alias, merged))
            using_alias = body.get("join_using_alias", {}).get("aliasname")
            if using_alias:
                level.append(_Rel(using_alias, tuple(using)))
        elif kind == "RangeTableSample":
            self.from_item(*unwrap(body.get("relation")), scope, level)
            self.exprs([body.get("args", []), body.get("repeatable", {})], scope)
        else:  # functions, ROWS FROM, XMLTABLE, JSON_TABLE: columns not known here
            self.exprs([body], scope)
            alias, _ = _alias(body)
            level.append(_Rel(alias, None))

    def range_var(self, body: Node, scope: _Scope) -> _Rel:
        relname = body.get("relname", "")
        alias, renames = _alias(body)
        if not body.get("schemaname") and relname in scope.ctes:
            return _Rel(alias or relname, _rename(scope.ctes[relname], renames))
        key, table = self.lookup(body)
        self.tables[key] = None
        return _Rel(alias or relname, _rename(tuple(table.columns), renames), table)

    def lookup(self, body: Node) -> tuple[str, Table]:
        name, schema = body.get("relname", ""), body.get("schemaname", "")
        tables = self.catalog.tables
        table: Table | None
        if schema:
            key = f"{schema}.{name}".lower()
            table = tables.get(key)
            if table is None:
                key = name.lower()
                table = tables.get(key)
                in_main = table is not None and table.schema is None and schema == "main"
                if table is not None and table.schema != schema and not in_main:
                    table = None
        else:
            key = name.lower()
            table = tables.get(key)
        if table is not None:
            self.tables[key] = None
            return key, table
        shown = f"{schema}.{name}" if schema else name
        suggestions = self.catalog.close_tables(shown) or self.catalog.close_tables(name)
        hint = f"; did you mean {', '.join(suggestions)}?" if suggestions else ""
        raise GatewayError(
            "unknown_table",
            f"table {shown!r} does not exist in the gateway's catalog{hint}",
            table=shown,
            suggestions=suggestions,
            position=char_position(self.sql, body.get("location", 0)),
        )

    # expressions

    def exprs(self, nodes: Any, scope: _Scope, aliases: frozenset[str] = _EMPTY) -> None:
        """Check every column reference under ``nodes``; subqueries get their own scope."""
        stack: list[Any] = list(nodes)
        while stack:
            node = stack.pop()
            if type(node) is list:
                stack.extend(node)
                continue
            if type(node) is not dict:
                continue
            for key, value in node.items():
                if key == "ColumnRef":
                    self.column(value, scope, aliases)
                elif key == "SelectStmt":
                    self.select(value, scope)
                elif type(value) is dict or type(value) is list:
                    stack.append(value)

    def column(self, ref: Node, scope: _Scope, aliases: frozenset[str]) -> None:
        fields = ref.get("fields", ())
        star = bool(fields) and "A_Star" in fields[-1]
        names = _names(fields)
        location = ref.get("location", 0)
        if len(names) == 1 and not star:
            self.bare_column(names[0], scope, aliases, location)
            return
        if star or len(names) < 2:
            return
        qualifier, column = names[-2], names[-1]
        rel = next(
            (r for level in reversed(scope.levels) for r in level if r.name == qualifier), None
        )
        if rel is None or rel.columns is None:
            # q.f, when q is not a relation with known columns, may be PostgreSQL's
            # field-selection syntax for the call f(q); other than that, the database answers.
            reason = forbidden_function_reason(column, self.catalog.dialect)
            if reason is not None:
                raise GatewayError(
                    "forbidden_function",
                    f"function {column} is not allowed through the gateway: {reason}",
                    function=column,
                    position=char_position(self.sql, location),
                )
            return
        if column in rel.columns or (rel.table is not None and column in self.system):
            return
        table = rel.table.name if rel.table is not None else qualifier
        self.unknown_column(column, table, list(rel.columns), location)

    def bare_column(self, name: str, scope: _Scope, aliases: frozenset[str], at: int) -> None:
        if name in aliases:
            return
        seen: list[_Rel] = []
        for level in reversed(scope.levels):
            for rel in level:
                if rel.columns is None or name in rel.columns or rel.name == name:
                    return
                if rel.table is not None and name in self.system:
                    return
                seen.append(rel)
        if not seen:
            return  # nothing in scope to check against: the database answers
        tables = {r.table.name for r in seen if r.table is not None}
        candidates = [c for r in seen for c in (r.columns or ())]
        self.unknown_column(name, tables.pop() if len(tables) == 1 else None, candidates, at)

    def unknown_column(
        self, name: str, table: str | None, candidates: list[str], location: int
    ) -> None:
        unique = list(dict.fromkeys(candidates))
        suggestions = difflib.get_close_matches(name.lower(), unique, n=3, cutoff=0.6)
        where = f"table {table!r}" if table else "the tables in scope"
        hint = f"; did you mean {', '.join(suggestions)}?" if suggestions else ""
        raise GatewayError(
            "unknown_column",
            f"column {name!r} does not exist in {where}{hint}",
            column=name,
            table=table,
            suggestions=suggestions,
            position=char_position(self.sql, location) if location else None,
        )

    def outputs(self, targets: Any, level: list[_Rel]) -> Columns:
        out: list[str] = []
        for node in targets:
            target = node.get("ResTarget")
            if target is None:
                return None
            if target.get("name"):
                out.append(target["name"])
                continue
            kind, value = unwrap(target.get("val"))
            fields = value.get("fields", ()) if kind == "ColumnRef" else ()
            if fields and "A_Star" in fields[-1]:
                qualifier = _names(fields)
                rels = [r for r in level if not qualifier or r.name == qualifier[-1]]
                expanded = _merge(rels) if rels else None
                if expanded is None:
                    return None
                out.extend(expanded)
                continue
            name, _strength = _figure(kind, value)
            if name is None:
                return None
            out.append(name)
        return tuple(out)


_FIXED_NAMES = {
    "GroupingFunc": "grouping",
    "A_ArrayExpr": "array",
    "RowExpr": "row",
    "CoalesceExpr": "coalesce",
}
_ANONYMOUS = frozenset({"A_Const", "ParamRef", "BoolExpr", "NullTest", "BooleanTest"})


def _figure(kind: str, node: Node) -> tuple[str | None, int]:
    """PostgreSQL's name for an unnamed output column (FigureColname) and its strength.

    ``(None, 0)`` when not worked out here: the caller then treats the columns as unknown.
    """
    if kind in ("ColumnRef", "FuncCall"):
        names = _names(node.get("fields" if kind == "ColumnRef" else "funcname", ()))
        return (names[-1], 2) if names else (None, 0)
    if kind == "A_Indirection":
        strings = _names(node.get("indirection", ()))
        return (strings[-1], 2) if strings else _figure(*unwrap(node.get("arg")))
    if kind == "TypeCast":
        name, strength = _figure(*unwrap(node.get("arg")))
        if name is not None and strength > 1:
            return name, strength
        type_names = _names(node.get("typeName", {}).get("names", ()))
        return (type_names[-1], 1) if type_names else (None, 0)
    if kind == "CollateClause":
        return _figure(*unwrap(node.get("arg")))
    if kind == "CaseExpr":
        if "defresult" in node:
            name, strength = _figure(*unwrap(node["defresult"]))
            if name is not None and strength > 1:
                return name, strength
        return "case", 1
    if kind == "SubLink":
        link = node.get("subLinkType")
        if link == "EXISTS_SUBLINK":
            return "exists", 2
        if link == "ARRAY_SUBLINK":
            return "array", 2
        if link in ("EXPR_SUBLINK", "MULTIEXPR_SUBLINK"):
            sub_kind, sub = unwrap(node.get("subselect"))
            while sub_kind == "SelectStmt" and sub.get("op", "SETOP_NONE") != "SETOP_NONE":
                sub = sub.get("larg", {})
            targets = sub.get("targetList", ())
            first = targets[0].get("ResTarget", {}) if targets else {}
            if first.get("name"):
                return first["name"], 2
            inner_kind, inner = unwrap(first.get("val"))
            if not first or (
                inner_kind == "ColumnRef" and "A_Star" in (inner.get("fields") or [{}])[-1]
            ):
                return None, 0
            name, _ = _figure(inner_kind, inner)
            return name, 2  # the subquery's own column name, whatever its strength there
        return "?column?", 0
    if kind == "A_Expr":
        return ("nullif", 2) if node.get("kind") == "AEXPR_NULLIF" else ("?column?", 0)
    if kind in _FIXED_NAMES:
        return _FIXED_NAMES[kind], 2
    if kind == "MinMaxExpr":
        return ("greatest" if node.get("op") == "IS_GREATEST" else "least"), 2
    if kind == "SQLValueFunction":
        op = str(node.get("op", ""))
        return op.removeprefix("SVFOP_").removesuffix("_N").lower(), 2
    if kind in _ANONYMOUS:
        return "?column?", 0
    return None, 0


def _rename(columns: Columns, names: list[str]) -> Columns:
    if columns is None or not names:
        return columns
    return (*names, *columns[len(names) :])


def _merge(rels: list[_Rel]) -> Columns:
    out: list[str] = []
    for rel in rels:
        if rel.columns is None:
            return None
        out.extend(rel.columns)
    return tuple(out)


# --- could the rows be filtered away? ------------------------------------------------------------


def filtered(kind: str, node: Node, ctes: dict[str, tuple[str, Node]] | None = None) -> bool:
    """Whether a WHERE, HAVING or inner-join condition lies on the path producing the rows.

    That path is the statement, its FROM subqueries, the CTEs it reads from FROM, and every arm
    of a UNION; INTERSECT and EXCEPT filter by construction. Scalar subqueries are off it.
    """
    ctes = {} if ctes is None else ctes
    if kind == "InsertStmt":
        return "selectStmt" in node and filtered(*unwrap(node["selectStmt"]), ctes)
    if kind in ("UpdateStmt", "DeleteStmt"):
        return "whereClause" in node
    if kind != "SelectStmt":
        return False
    return _select_filtered(node, ctes, frozenset())


def _select_filtered(node: Node, ctes: dict[str, tuple[str, Node]], seen: frozenset[str]) -> bool:
    if "withClause" in node:
        ctes = dict(ctes)
        for cte_node in node["withClause"].get("ctes", ()):
            cte = cte_node.get("CommonTableExpr", {})
            ctes[cte.get("ctename", "")] = unwrap(cte.get("ctequery"))
    op = node.get("op", "SETOP_NONE")
    if op == "SETOP_UNION":
        return _select_filtered(node.get("larg", {}), ctes, seen) or _select_filtered(
            node.get("rarg", {}), ctes, seen
        )
    if op != "SETOP_NONE":
        return True
    if "whereClause" in node or "havingClause" in node:
        return True
    return any(_from_filtered(*unwrap(item), ctes, seen) for item in node.get("fromClause", ()))


def _from_filtered(
    kind: str, node: Node, ctes: dict[str, tuple[str, Node]], seen: frozenset[str]
) -> bool:
    if kind == "JoinExpr":
        left = _from_filtered(*unwrap(node.get("larg")), ctes, seen)
        right = _from_filtered(*unwrap(node.get("rarg")), ctes, seen)
        join = node.get("jointype", "JOIN_INNER")
        if join == "JOIN_LEFT":
            return left
        if join == "JOIN_RIGHT":
            return right
        if join == "JOIN_FULL":
            return left and right
        conditioned = "quals" in node or "usingClause" in node or bool(node.get("isNatural"))
        return conditioned or left or right
    if kind == "RangeSubselect":
        sub_kind, sub = unwrap(node.get("subquery"))
        return sub_kind == "SelectStmt" and _select_filtered(sub, ctes, seen)
    if kind == "RangeTableSample":
        return True  # a sample may hold no rows
    name = node.get("relname", "")
    if kind == "RangeVar" and not node.get("schemaname") and name in ctes and name not in seen:
        cte_kind, cte = ctes[name]
        if cte_kind == "SelectStmt":
            return _select_filtered(cte, ctes, seen | {name})
        return filtered(cte_kind, cte, ctes)
    return False
