"""Whether a read's empty answer may come from a filter (an over-estimate, which only costs an
exact ``EXISTS`` check), and whether the read without its filters has rows, as a formula over
the tables that produce its rows."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from corral.gateway._rows import Rows, all_of, any_of
from corral.gateway.postgres._tree import Node, string_names, unwrap

__all__ = ["Find", "ReadRows", "filtered", "read_rows"]


# Functions that return one row per call: aggregates, and scalars agents commonly call. Any
# other call in a select list may be set-returning (unnest, jsonb_array_elements, a function of
# the database's own), and one that returns no rows removes the row it was called for.
_ONE_ROW_FUNCTIONS = frozenset(
    {
        # aggregates (those with ORDER BY, FILTER, DISTINCT, * or OVER are recognised anyway)
        *("count", "sum", "avg", "min", "max", "array_agg", "string_agg", "json_agg"),
        *("jsonb_agg", "json_object_agg", "jsonb_object_agg", "bool_and", "bool_or", "every"),
        *("bit_and", "bit_or", "stddev", "stddev_pop", "stddev_samp", "variance", "var_pop"),
        *("var_samp", "corr", "covar_pop", "covar_samp", "xmlagg", "range_agg"),
        # strings
        *("lower", "upper", "initcap", "length", "char_length", "character_length"),
        *("octet_length", "substr", "substring", "left", "right", "lpad", "rpad", "btrim"),
        *("ltrim", "rtrim", "replace", "translate", "concat", "concat_ws", "format"),
        *("split_part", "strpos", "position", "reverse", "repeat", "md5", "encode", "decode"),
        *("quote_ident", "quote_literal", "quote_nullable", "starts_with", "regexp_replace"),
        *("regexp_match", "regexp_like", "regexp_count", "regexp_substr", "to_hex", "ascii"),
        *("chr", "string_to_array", "array_to_string", "overlay", "normalize", "similarity"),
        *("word_similarity", "unaccent"),
        # numbers
        *("abs", "ceil", "ceiling", "floor", "round", "trunc", "sign", "sqrt", "power", "exp"),
        *("ln", "log", "log10", "mod", "div", "random", "width_bucket"),
        # dates and times
        *("now", "date_trunc", "date_part", "extract", "age", "make_date", "make_time"),
        *("make_timestamp", "make_timestamptz", "make_interval", "to_char", "to_date"),
        *("to_timestamp", "to_number", "justify_days", "justify_hours", "justify_interval"),
        *("isfinite", "clock_timestamp", "statement_timestamp", "transaction_timestamp"),
        *("timezone", "date_bin"),
        # JSON and arrays
        *("to_json", "to_jsonb", "row_to_json", "array_to_json", "json_build_object"),
        *("jsonb_build_object", "json_build_array", "jsonb_build_array", "json_object"),
        *("jsonb_object", "jsonb_set", "jsonb_insert", "jsonb_strip_nulls", "jsonb_pretty"),
        *("jsonb_typeof", "json_typeof", "jsonb_array_length", "json_array_length"),
        *("jsonb_extract_path", "jsonb_extract_path_text", "json_extract_path"),
        *("json_extract_path_text", "jsonb_path_exists", "jsonb_path_match"),
        *("jsonb_path_query_array", "jsonb_path_query_first", "array_length", "cardinality"),
        *("array_append", "array_prepend", "array_cat", "array_remove", "array_replace"),
        *("array_position", "array_positions", "array_lower", "array_upper"),
        # the rest
        *("gen_random_uuid", "pg_typeof", "num_nonnulls", "num_nulls", "currval", "version"),
        *("current_setting", "current_database", "current_schema"),
    }
)
_AGGREGATE_SYNTAX = (
    "over",
    "agg_star",
    "agg_distinct",
    "agg_order",
    "agg_filter",
    "agg_within_group",
)
_ROW_SOURCES = frozenset({"withClause", "larg", "rarg", "fromClause"})
# Aggregates a SELECT without GROUP BY may call (any call with an aggregate's syntax counts
# too): such a SELECT returns one row whatever its FROM holds.
_AGGREGATES = frozenset(
    {
        *("count", "sum", "avg", "min", "max", "array_agg", "string_agg", "json_agg"),
        *("jsonb_agg", "json_object_agg", "jsonb_object_agg", "bool_and", "bool_or", "every"),
        *("bit_and", "bit_or", "bit_xor", "stddev", "stddev_pop", "stddev_samp", "variance"),
        *("var_pop", "var_samp", "corr", "covar_pop", "covar_samp", "xmlagg", "range_agg"),
        *("range_intersect_agg", "any_value", "regr_count", "regr_avgx", "regr_avgy"),
    }
)
_ONE_ROW = (True, False)
_UNKNOWN = (True, True)

Find = Callable[[str, str], "str | None"]
"""``find(schema, name)``: the catalog key of the relation a ``RangeVar`` names, or None."""


@dataclass(frozen=True, slots=True)
class ReadRows:
    """What decides a read's empty answer: ``rows``, whether the read without its filters has
    rows (:mod:`corral.gateway._rows`); ``filtered``, whether a filter may have emptied it
    (when not, an empty answer is genuinely empty without a check); ``only``, whether it
    names a table with ``ONLY``."""

    rows: Rows
    filtered: bool
    only: bool


def read_rows(node: Node, find: Find) -> ReadRows:
    """:class:`ReadRows` of the SELECT ``node`` (docs/gateway.md, "Loud empties", defines the
    read without its filters: no WHERE, HAVING or join condition, inner joins as cross joins,
    outer joins keeping their preserved side, no LIMIT, OFFSET or FETCH, INTERSECT and EXCEPT
    as their left arm, TABLESAMPLE and ONLY left out, a function in FROM as one row).
    Subqueries outside FROM (scalar, EXISTS, IN) are part of the filters that hold them."""
    walk = _Walk(find)
    rows, is_filtered = walk.select(node, {}, frozenset())
    return ReadRows(rows, is_filtered, walk.only)


def filtered(kind: str, node: Node) -> bool:
    """Whether something on the path producing the rows of a statement may have removed rows
    (for a SELECT, :func:`read_rows`' ``filtered``; an UPDATE or DELETE with a WHERE, FROM or
    USING; an INSERT whose SELECT is filtered). When in doubt, true."""
    if kind == "InsertStmt":
        inner_kind, inner = unwrap(node.get("selectStmt"))
        return inner_kind == "SelectStmt" and read_rows(inner, _nowhere).filtered
    if kind in ("UpdateStmt", "DeleteStmt"):
        return any(k in node for k in ("whereClause", "fromClause", "usingClause"))
    if kind != "SelectStmt":
        return False
    return read_rows(node, _nowhere).filtered


def _nowhere(schema: str, name: str) -> str | None:
    return None


_Ctes = dict[str, tuple[str, Node]]


@dataclass(slots=True)
class _Walk:
    find: Find
    only: bool = False

    def select(self, node: Node, ctes: _Ctes, seen: frozenset[str]) -> tuple[Rows, bool]:
        if "withClause" in node:
            ctes = dict(ctes)
            for cte_node in node["withClause"].get("ctes", ()):
                cte = cte_node.get("CommonTableExpr", {})
                ctes[cte.get("ctename", "")] = unwrap(cte.get("ctequery"))
        limited = _limited(node)
        op = node.get("op", "SETOP_NONE")
        if op == "SETOP_UNION":
            left, left_filtered = self.select(node.get("larg", {}), ctes, seen)
            right, right_filtered = self.select(node.get("rarg", {}), ctes, seen)
            return any_of((left, right)), limited or left_filtered or right_filtered
        if op != "SETOP_NONE":
            # INTERSECT and EXCEPT filter their left arm by the right one.
            return self.select(node.get("larg", {}), ctes, seen)[0], True
        if "valuesLists" in node:
            return True, limited
        sources = [self.from_item(*unwrap(item), ctes, seen) for item in node.get("fromClause", ())]
        rows = all_of(r for r, _ in sources)
        is_filtered = (
            limited
            or "whereClause" in node
            or "havingClause" in node
            or _may_return_sets(node)
            or any(f for _, f in sources)
        )
        if "groupClause" not in node and ("havingClause" in node or _aggregates(node)):
            rows = True  # one group, whatever FROM holds
        return rows, is_filtered

    def from_item(
        self, kind: str, node: Node, ctes: _Ctes, seen: frozenset[str]
    ) -> tuple[Rows, bool]:
        if kind == "JoinExpr":
            left, left_filtered = self.from_item(*unwrap(node.get("larg")), ctes, seen)
            right, right_filtered = self.from_item(*unwrap(node.get("rarg")), ctes, seen)
            join = node.get("jointype", "JOIN_INNER")
            if join == "JOIN_LEFT":
                return left, left_filtered
            if join == "JOIN_RIGHT":
                return right, right_filtered
            if join == "JOIN_FULL":
                return any_of((left, right)), left_filtered or right_filtered
            conditioned = "quals" in node or "usingClause" in node or bool(node.get("isNatural"))
            return all_of((left, right)), conditioned or left_filtered or right_filtered
        if kind == "RangeSubselect":
            sub_kind, sub = unwrap(node.get("subquery"))
            return self.select(sub, ctes, seen) if sub_kind == "SelectStmt" else _UNKNOWN
        if kind == "RangeTableSample":
            return self.from_item(*unwrap(node.get("relation")), ctes, seen)[0], True
        if kind != "RangeVar":
            # Functions, ROWS FROM, XMLTABLE, JSON_TABLE: filters that stand for one row (they
            # may give none, or none for a row of a table before them).
            return _UNKNOWN
        name = node.get("relname", "")
        schema = node.get("schemaname", "")
        if not schema and name in ctes:
            if name in seen:
                return False, False  # a recursive CTE's reference to itself
            cte_kind, cte = ctes[name]
            if cte_kind == "SelectStmt":
                return self.select(cte, ctes, seen | {name})
            return _UNKNOWN
        key = self.find(schema, name)
        only = not node.get("inh", False)
        self.only = self.only or only
        return (key if key is not None else True), only


def _aggregates(node: Node) -> bool:
    """Whether the select list or ORDER BY calls an aggregate (outside subqueries)."""
    stack: list[Any] = [node.get("targetList", ()), node.get("sortClause", ())]
    while stack:
        item = stack.pop()
        if type(item) is list:
            stack.extend(item)
            continue
        if type(item) is not dict:
            continue
        for key, value in item.items():
            if key == "SelectStmt":
                continue
            if key == "FuncCall" and "over" not in value:
                names = string_names(value.get("funcname", ()))
                syntax = any(k in value for k in _AGGREGATE_SYNTAX)
                if syntax or (names and names[-1].lower() in _AGGREGATES):
                    return True
            if type(value) is dict or type(value) is list:
                stack.append(value)
    return False


def _limited(node: Node) -> bool:
    """A LIMIT/FETCH that may keep no row (0, a parameter, an expression) or any OFFSET but 0."""
    if "limitCount" in node and not _constant(node["limitCount"], lambda n: n > 0):
        return True
    return "limitOffset" in node and not _constant(node["limitOffset"], lambda n: n == 0)


def _constant(node: Any, keeps: Callable[[int], bool]) -> bool:
    """Whether ``node`` is NULL (LIMIT ALL, OFFSET NULL) or an integer constant that ``keeps``."""
    kind, body = unwrap(node)
    if kind != "A_Const":
        return False
    if body.get("isnull"):
        return True
    # A field at its default is left out: LIMIT 0 is {"ival": {}}.
    return "ival" in body and keeps(int(body["ival"].get("ival", 0)))


def _may_return_sets(node: Node) -> bool:
    """A call outside FROM and subqueries that may be set-returning (see _ONE_ROW_FUNCTIONS).

    Field selection by name (``(expr).f``) counts as a call: whether it is one depends on
    types not known here.
    """
    stack: list[Any] = [value for key, value in node.items() if key not in _ROW_SOURCES]
    while stack:
        item = stack.pop()
        if type(item) is list:
            stack.extend(item)
            continue
        if type(item) is not dict:
            continue
        for key, value in item.items():
            if key == "SelectStmt":
                continue  # a subquery: its rows are not this statement's
            if key == "FuncCall" and not any(k in value for k in _AGGREGATE_SYNTAX):
                names = string_names(value.get("funcname", ()))
                qualified_elsewhere = len(names) > 1 and names[0] != "pg_catalog"
                if qualified_elsewhere or not names or names[-1] not in _ONE_ROW_FUNCTIONS:
                    return True
            if key == "A_Indirection" and string_names(value.get("indirection", ())):
                # (expr).f may be the call f(expr), which PostgreSQL resolves as one when expr
                # has no field f: (meta -> 'k').jsonb_array_elements is set-returning.
                return True
            if type(value) is dict or type(value) is list:
                stack.append(value)
    return False
