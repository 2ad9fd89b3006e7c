"""Tables and columns of a parsed PostgreSQL statement, resolved scope by scope against a
catalog: refuses only what PostgreSQL would refuse too, except relations outside the catalog,
which are unknown wherever they are named."""

# Longer than 500 lines: one class, the scope-by-scope walk, with a method per kind of node;
# its methods call one another, so it stays whole.

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from corral.gateway._catalog import Catalog, Table
from corral.gateway._errors import GatewayError
from corral.gateway._sql_functions import (
    RELATION_ARGUMENTS,
    TEXT_TYPES,
    call_form_reason,
    forbidden_function_reason,
    forbidden_type_reason,
)
from corral.gateway.postgres._tree import Node, char_position, string_literal, string_names, unwrap

__all__ = ["Resolver"]

Columns = tuple[str, ...] | None  # None: not known here, so any column may exist

_SYSTEM_COLUMNS = {
    "postgresql": frozenset({"ctid", "xmin", "xmax", "cmin", "cmax", "tableoid"}),
    "sqlite": frozenset({"rowid", "oid", "_rowid_"}),
}
_EMPTY: frozenset[str] = frozenset()

# pg_catalog's base types whose names start like its relations' (every system catalog and
# view is pg_*): the row type of any other pg_* name is a system relation's.
_PG_BASE_TYPES = frozenset(
    {
        "pg_lsn",
        "pg_snapshot",
        "pg_node_tree",
        "pg_ndistinct",
        "pg_dependencies",
        "pg_mcv_list",
        "pg_ddl_command",
        "pg_brin_bloom_summary",
        "pg_brin_minmax_multi_summary",
    }
)

# Fields the statement handlers below resolve themselves; every other field is walked as
# expressions (Resolver.rest). lockingClause names FROM items (FOR UPDATE OF o), not tables;
# intoClause (SELECT INTO) is refused before resolution.
_SELECT_OWN = frozenset(
    {
        "withClause",
        "op",
        "larg",
        "rarg",
        "valuesLists",
        "fromClause",
        "targetList",
        "groupClause",
        "sortClause",
        "distinctClause",
        "lockingClause",
        "intoClause",
    }
)
_INSERT_OWN = frozenset(
    {"withClause", "relation", "cols", "selectStmt", "onConflictClause", "returningClause"}
)
_CONFLICT_OWN = frozenset({"infer", "targetList"})
_UPDATE_OWN = frozenset({"withClause", "relation", "fromClause", "targetList", "returningClause"})
_DELETE_OWN = frozenset({"withClause", "relation", "usingClause", "returningClause"})
_CTE_OWN = frozenset({"ctename", "aliascolnames", "ctequery"})
_RETURNING_OWN = frozenset({"exprs"})
_SUBSELECT_OWN = frozenset({"subquery", "alias"})
_JOIN_OWN = frozenset({"larg", "rarg", "usingClause", "alias", "join_using_alias"})
_SAMPLE_OWN = frozenset({"relation"})
_STATEMENT_KINDS = frozenset({"SelectStmt", "InsertStmt", "UpdateStmt", "DeleteStmt"})


def _alias(body: Node) -> tuple[str | None, list[str]]:
    alias = body.get("alias")
    if not alias:
        return None, []
    return alias.get("aliasname") or None, string_names(alias.get("colnames", ()))


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
        self.exact = catalog.dialect == "postgresql"
        self.tables: dict[str, None] = {}
        self.written: dict[str, None] = {}
        self._schemas: frozenset[str] | None = None
        self._text_casts: set[int] = set()  # ids of column references cast straight to text

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
            renames = string_names(cte.get("aliascolnames", ()))
            if clause.get("recursive"):
                ctes[name] = tuple(renames) if renames else None  # the self-reference
            columns = _rename(self.any_statement(*unwrap(cte.get("ctequery")), inner), renames)
            self.rest(cte, _CTE_OWN, inner)
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
            self.exprs(stmt.get("sortClause", ()), outer)
            self.rest(stmt, _SELECT_OWN, outer)  # LIMIT, OFFSET, FETCH
            return left
        if "valuesLists" in stmt:
            rows = stmt["valuesLists"]
            self.exprs(rows, scope)
            kind, first = unwrap(rows[0])
            width = len(first.get("items", ())) if kind == "List" else 0
            columns = tuple(f"column{i + 1}" for i in range(width))
            outer = scope.push([_Rel(None, columns)])
            self.exprs(stmt.get("sortClause", ()), outer)
            self.rest(stmt, _SELECT_OWN, outer)  # LIMIT, OFFSET, FETCH
            return columns
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
        ordering = ("groupClause", "sortClause", "distinctClause")
        self.exprs([n for k in ordering for n in stmt.get(k, ())], inner, aliases)
        # WHERE, HAVING, WINDOW, LIMIT, OFFSET, FETCH and whatever else the node holds.
        self.rest(stmt, _SELECT_OWN, inner)
        return outputs

    def insert(self, stmt: Node, scope: _Scope) -> Columns:
        if "withClause" in stmt:
            scope = self.with_clause(stmt["withClause"], scope)
        target = self.target(stmt.get("relation", {}))
        if not stmt.get("cols"):
            self.catalog_typed(target, None, 0)  # every column, in order
        for node in stmt.get("cols", ()):
            self.assignment(target, node.get("ResTarget", {}), scope)  # cols[subscript]
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
                self.assignment(target, node.get("ResTarget", {}), conflict)
            self.rest(clause, _CONFLICT_OWN, conflict)  # DO UPDATE ... WHERE
        self.rest(stmt, _INSERT_OWN, scope)
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
            self.assignment(target, node.get("ResTarget", {}), inner)
        self.rest(stmt, _UPDATE_OWN, inner)  # WHERE, WHERE CURRENT OF, ...
        return self.returning(stmt.get("returningClause"), scope, level)

    def delete(self, stmt: Node, scope: _Scope) -> Columns:
        if "withClause" in stmt:
            scope = self.with_clause(stmt["withClause"], scope)
        target = self.target(stmt.get("relation", {}))
        level = [target]
        inner = scope.push(level)
        for item in stmt.get("usingClause", ()):
            self.from_item(*unwrap(item), inner, level)
        self.rest(stmt, _DELETE_OWN, inner)  # WHERE, WHERE CURRENT OF, ...
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
        inner = scope.push([*level, *extra])
        self.exprs(clause["exprs"], inner)
        self.rest(clause, _RETURNING_OWN, inner)
        return self.outputs(clause["exprs"], level)

    def target(self, relation: Node) -> _Rel:
        key, table = self.lookup(relation)
        self.written[key] = None
        alias, _ = _alias(relation)
        return _Rel(alias or relation.get("relname", ""), tuple(table.columns), table)

    def assignment(self, target: _Rel, res: Node, scope: _Scope) -> None:
        """``SET col[i].f = val`` or an INSERT column: the name, then subscripts and value."""
        self.target_column(target, res)
        self.rest(res, _EMPTY, scope)

    def target_column(self, target: _Rel, node: Node) -> None:
        name = node.get("name", "")
        if not name or target.columns is None or target.table is None:
            return
        if name in target.columns or name in self.system:
            # A value assigned to it would be looked up by name: refused as a read of it is.
            self.catalog_typed(target, name, node.get("location", 0))
            return
        location = node.get("location", 0)
        self.unknown_column(name, target.table.name, list(target.columns), location)

    # FROM

    def from_item(self, kind: str, body: Node, scope: _Scope, level: list[_Rel]) -> None:
        if kind == "RangeVar":
            level.append(self.range_var(body, scope))
        elif kind == "RangeSubselect":
            columns = self.any_statement(*unwrap(body.get("subquery")), scope)
            self.rest(body, _SUBSELECT_OWN, scope)
            alias, renames = _alias(body)
            level.append(_Rel(alias, _rename(columns, renames)))
        elif kind == "JoinExpr":
            start = len(level)
            self.from_item(*unwrap(body.get("larg")), scope, level)
            self.from_item(*unwrap(body.get("rarg")), scope, level)
            sides = level[start:]
            merged = _merge(sides)
            using = string_names(body.get("usingClause", ()))
            for name in using:
                if merged is not None and name not in merged:
                    tables = [r.table.name for r in sides if r.table is not None]
                    single = tables[0] if len(tables) == 1 else None
                    self.unknown_column(name, single, list(merged), 0)
            self.rest(body, _JOIN_OWN, scope)  # ON
            alias, _ = _alias(body)
            if alias:
                level.append(_Rel(alias, merged))
            using_alias = body.get("join_using_alias", {}).get("aliasname")
            if using_alias:
                level.append(_Rel(using_alias, tuple(using)))
        elif kind == "RangeTableSample":
            self.from_item(*unwrap(body.get("relation")), scope, level)
            self.rest(body, _SAMPLE_OWN, scope)  # the method's arguments, REPEATABLE
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
        database = body.get("catalogname", "")
        found = None if database else self.find(schema, name)
        if found is not None:
            self.tables[found[0]] = None
            return found
        shown = ".".join(part for part in (database, schema, name) if part)
        self.unknown_table(shown, name, body.get("location", 0), database=bool(database))

    def find(
        self, schema: str, name: str, tables: Mapping[str, Table] | None = None
    ) -> tuple[str, Table] | None:
        """The catalog key and table ``schema.name`` (``name`` alone when no schema) names,
        among ``tables`` (the catalog's tables when None).

        On PostgreSQL names match exactly: the parser has already folded unquoted names to
        lower case, and a quoted name keeps its case (``"ORDERS"`` is not ``orders``).
        Catalog keys are lower case, so the table's own name is compared too.
        """
        if tables is None:
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
        if table is None:
            return None
        if self.exact and (table.name != name or (schema and table.schema != schema)):
            return None
        return key, table

    def unknown_table(
        self,
        shown: str,
        name: str,
        location: int,
        *,
        database: bool = False,
        type_: bool = False,
        sequences: bool = False,
    ) -> NoReturn:
        """Raise ``unknown_table`` with close matches among the tables (and the sequences, for
        a relation named by a function's argument: ``sequences``)."""
        pool = list(self.catalog.tables)
        if sequences:
            pool += list(self.catalog.sequences)
        suggestions = difflib.get_close_matches(
            shown.lower(), pool, n=3, cutoff=0.6
        ) or difflib.get_close_matches(name.lower(), pool, n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(suggestions)}?" if suggestions else ""
        why = " (names with a database part are not resolved)" if database else ""
        if type_:
            what = (
                f"type {shown!r} may be the row type of a table outside the gateway's catalog, "
                f"which agents cannot name{why}{hint}"
            )
        else:
            what = f"table {shown!r} does not exist in the gateway's catalog{why}{hint}"
        raise GatewayError(
            "unknown_table",
            what,
            table=shown,
            suggestions=suggestions,
            position=char_position(self.sql, location),
        )

    def type_name(self, node: Node) -> None:
        """Refuse a type that is the row type of a relation outside the catalog.

        Every relation has a row type of its name, so ``NULL::corral.gateway_journal`` would
        reveal a hidden table's columns. Unqualified, the relations outside the catalog that
        PostgreSQL can find are pg_catalog's, all named ``pg_*`` (also as arrays, ``_pg_*``);
        qualified, a name in ``pg_catalog`` is checked the same way, one in a schema that holds
        catalog tables is a table there or a type (every relation of those schemas is in the
        catalog), and one in any other schema (the gateway's own, ``information_schema``,
        ``pg_toast``, a schema of extension types) is refused.
        """
        names = string_names(node.get("names", ()))
        if not names:
            return
        *qualifiers, name = names
        bare = name[1:] if name.startswith("_") else name  # _t is the array type of t
        if not qualifiers or qualifiers == ["pg_catalog"]:
            if not bare.startswith("pg_") or bare in _PG_BASE_TYPES:
                return
            if not qualifiers and self.find("", bare) is not None:
                # The catalog keys by bare name only the tables the search path finds, so
                # this one is not shadowed by a pg_catalog relation.
                return
        elif len(qualifiers) == 1:
            schema = qualifiers[0]
            if self.find(schema, bare) is not None or schema in self.schemas():
                return
        shown = ".".join(names)
        self.unknown_table(
            shown, name, node.get("location", 0), database=len(qualifiers) > 1, type_=True
        )

    def relation_arguments(self, call: Node) -> None:
        """Resolve the relations a call names by string (``nextval('invoice_numbers')``)
        like tables in FROM: one outside the catalog is ``unknown_table``. The analysis has
        already refused such a call whose relation is not a string literal."""
        names = string_names(call.get("funcname", ()))
        positions = RELATION_ARGUMENTS.get(names[-1].lower(), ()) if names else ()
        args = call.get("args", ())
        for index in positions:
            if index >= len(args):
                continue
            text = string_literal(args[index])
            if text is None:
                continue
            location = unwrap(args[index])[1].get("location", 0)
            parts = regclass_name(text)
            if parts is not None and len(parts) <= 2:
                schema, name = (parts[0], parts[1]) if len(parts) == 2 else ("", parts[0])
                if self.find(schema, name) or self.find(schema, name, self.catalog.sequences):
                    continue
            shown = ".".join(parts) if parts else text
            last = parts[-1] if parts else text
            database = parts is not None and len(parts) > 2
            self.unknown_table(shown, last, location, database=database, sequences=True)

    def schemas(self) -> frozenset[str]:
        if self._schemas is None:
            self._schemas = frozenset(
                t.schema for t in self.catalog.tables.values() if t.schema is not None
            )
        return self._schemas

    # expressions

    def rest(self, body: Node, own: frozenset[str], scope: _Scope) -> None:
        """Walk, as expressions, every field of ``body`` not in ``own`` (handled by the caller)."""
        self.exprs([value for key, value in body.items() if key not in own], scope)

    def exprs(self, nodes: Any, scope: _Scope, aliases: frozenset[str] = _EMPTY) -> None:
        """Resolve everything under ``nodes``: column references, subqueries (in their own
        scope), relations and type names, wherever they are; every other node is descended."""
        stack: list[Any] = list(nodes)
        while stack:
            node = stack.pop()
            if type(node) is list:
                stack.extend(node)
                continue
            if type(node) is not dict:
                continue
            for key, value in node.items():
                if type(value) is list:
                    stack.append(value)
                elif type(value) is not dict:
                    continue
                elif key == "ColumnRef":
                    self.column(value, scope, aliases)
                elif key in _STATEMENT_KINDS:
                    self.any_statement(key, value, scope)
                elif key == "typeName" or key == "TypeName":
                    self.type_name(value)
                    stack.append(value)  # its modifiers: varchar(n)
                elif key == "RangeVar":
                    # A relation outside the FROM clauses handled above: resolved all the same.
                    self.range_var(value, scope)
                elif key == "FuncCall":
                    self.relation_arguments(value)
                    stack.append(value)
                elif key == "TypeCast":
                    kind, arg = unwrap(value.get("arg"))
                    names = string_names(value.get("typeName", {}).get("names", ()))
                    if kind == "ColumnRef" and names and names[-1].lower() in TEXT_TYPES:
                        self._text_casts.add(id(arg))
                    stack.append(value)
                else:
                    stack.append(value)

    def column(self, ref: Node, scope: _Scope, aliases: frozenset[str]) -> None:
        fields = ref.get("fields", ())
        star = bool(fields) and "A_Star" in fields[-1]
        names = string_names(fields)
        location = ref.get("location", 0)
        if len(names) == 1 and not star:
            self.bare_column(names[0], scope, aliases, location, id(ref) in self._text_casts)
            return
        if star:
            qualifier = names[-1] if names else None
            for level in scope.levels[-1:]:
                for starred in level:
                    if qualifier is None or starred.name == qualifier:
                        self.catalog_typed(starred, None, location)
            return
        if len(names) < 2:
            return
        qualifier, column = names[-2], names[-1]
        rel = next(
            (r for level in reversed(scope.levels) for r in level if r.name == qualifier), None
        )
        if rel is None or rel.columns is None:
            # q.f, when q is not a relation with known columns, may be PostgreSQL's
            # field-selection syntax for the call f(q); other than that, the database answers.
            dialect = self.catalog.dialect
            reason = forbidden_function_reason(column, dialect) or call_form_reason(
                column, dialect, literal_args=False
            )
            if reason is not None:
                raise GatewayError(
                    "forbidden_function",
                    f"function {column} is not allowed through the gateway: {reason}",
                    function=column,
                    position=char_position(self.sql, location),
                )
            return
        if column in rel.columns or (rel.table is not None and column in self.system):
            if id(ref) not in self._text_casts:
                self.catalog_typed(rel, column, location)
            return
        table = rel.table.name if rel.table is not None else qualifier
        self.unknown_column(column, table, list(rel.columns), location)

    def bare_column(
        self, name: str, scope: _Scope, aliases: frozenset[str], at: int, as_text: bool = False
    ) -> None:
        if name in aliases:
            return
        seen: list[_Rel] = []
        for level in reversed(scope.levels):
            for rel in level:
                if rel.columns is None or name in rel.columns or rel.name == name:
                    if not as_text and rel.columns is not None and name in rel.columns:
                        self.catalog_typed(rel, name, at)
                    return
                if rel.table is not None and name in self.system:
                    return
                seen.append(rel)
        if not seen:
            return  # nothing in scope to check against: the database answers
        tables = {r.table.name for r in seen if r.table is not None}
        candidates = [c for r in seen for c in (r.columns or ())]
        self.unknown_column(name, tables.pop() if len(tables) == 1 else None, candidates, at)

    def catalog_typed(self, rel: _Rel, column: str | None, location: int) -> None:
        """Refuse a column of a catalog object type (``column``, or any of ``rel``'s for a
        ``*``) used other than cast straight to text: PostgreSQL casts integers and strings to
        its type implicitly (a UNION arm, a comparison), naming any object, hidden ones
        included."""
        table = rel.table
        if table is None:
            return
        for col in table.columns.values() if column is None else [table.columns.get(column)]:
            if col is None:
                continue
            element = col.type.split("[", 1)[0].strip()
            if forbidden_type_reason(element, self.catalog.dialect) is None:
                continue
            how = "name the columns, casting it" if column is None else "cast it straight"
            raise GatewayError(
                "forbidden_function",
                f"column {col.name!r} of table {table.name!r} is of type {col.type}, a catalog "
                "object type, to which PostgreSQL casts integers and strings implicitly "
                "(naming any object, those the gateway hides included); "
                f"{how} to text: {col.name}::text",
                function=col.type,
                position=char_position(self.sql, location) if location else None,
            )

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
                qualifier = string_names(fields)
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
        names = string_names(node.get("fields" if kind == "ColumnRef" else "funcname", ()))
        return (names[-1], 2) if names else (None, 0)
    if kind == "A_Indirection":
        strings = string_names(node.get("indirection", ()))
        return (strings[-1], 2) if strings else _figure(*unwrap(node.get("arg")))
    if kind == "TypeCast":
        name, strength = _figure(*unwrap(node.get("arg")))
        if name is not None and strength > 1:
            return name, strength
        type_names = string_names(node.get("typeName", {}).get("names", ()))
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


def regclass_name(text: str) -> list[str] | None:
    """The parts of a relation's name as PostgreSQL reads it from text (``regclass``): split at
    dots, double-quoted parts kept as they are (``""`` is a quote), others folded to lower
    case. None for text that is not a name: empty parts, or digits alone, which PostgreSQL
    reads as an oid (any relation's, hidden ones included)."""
    if text.strip().isdigit():
        return None
    parts: list[str] = []
    i, n = 0, len(text)
    while True:
        while i < n and text[i].isspace():
            i += 1
        if i < n and text[i] == '"':
            part, i = [], i + 1
            while i < n:
                if text[i] == '"':
                    if i + 1 < n and text[i + 1] == '"':
                        part.append('"')
                        i += 2
                        continue
                    break
                part.append(text[i])
                i += 1
            if i >= n:
                return None  # unterminated quote
            i += 1
            name = "".join(part)
        else:
            start = i
            while i < n and text[i] != "." and not text[i].isspace():
                i += 1
            # PostgreSQL folds only ASCII letters of an unquoted name.
            name = "".join(c.lower() if c.isascii() else c for c in text[start:i])
        if not name:
            return None
        parts.append(name)
        while i < n and text[i].isspace():
            i += 1
        if i == n:
            return parts
        if text[i] != ".":
            return None
        i += 1


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
