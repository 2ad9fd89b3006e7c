"""Whether a read's empty answer may come from a filter: anything that can leave out rows of the
tables it reads (an over-estimate, which only costs an exact ``EXISTS`` check)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from corral.gateway.postgres._tree import Node, string_names, unwrap

__all__ = ["filtered"]


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


def filtered(kind: str, node: Node, ctes: dict[str, tuple[str, Node]] | None = None) -> bool:
    """Whether something on the path producing the rows may have removed rows.

    That path is the statement, its FROM subqueries, the CTEs it reads from FROM, and every arm
    of a UNION; scalar subqueries are off it. What may remove rows: a WHERE, HAVING or
    inner-join condition; INTERSECT and EXCEPT; a LIMIT or FETCH other than a positive
    constant (or ALL) and an OFFSET other than 0; a function or TABLESAMPLE in FROM; a call in
    the select list that may be set-returning (any but aggregates and common scalars, and any
    field selection ``(expr).f``, which may be the call ``f(expr)``). When in
    doubt, true: an empty answer then has its tables checked for rows.
    """
    ctes = {} if ctes is None else ctes
    if kind == "InsertStmt":
        return "selectStmt" in node and filtered(*unwrap(node["selectStmt"]), ctes)
    if kind in ("UpdateStmt", "DeleteStmt"):
        return any(k in node for k in ("whereClause", "fromClause", "usingClause"))
    if kind != "SelectStmt":
        return False
    return _select_filtered(node, ctes, frozenset())


def _select_filtered(node: Node, ctes: dict[str, tuple[str, Node]], seen: frozenset[str]) -> bool:
    if "withClause" in node:
        ctes = dict(ctes)
        for cte_node in node["withClause"].get("ctes", ()):
            cte = cte_node.get("CommonTableExpr", {})
            ctes[cte.get("ctename", "")] = unwrap(cte.get("ctequery"))
    if _limited(node):
        return True
    op = node.get("op", "SETOP_NONE")
    if op == "SETOP_UNION":
        return _select_filtered(node.get("larg", {}), ctes, seen) or _select_filtered(
            node.get("rarg", {}), ctes, seen
        )
    if op != "SETOP_NONE":
        return True
    if "whereClause" in node or "havingClause" in node or _may_return_sets(node):
        return True
    return any(_from_filtered(*unwrap(item), ctes, seen) for item in node.get("fromClause", ()))


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
    if kind != "RangeVar":
        # TABLESAMPLE, functions, ROWS FROM, XMLTABLE, JSON_TABLE: may give no row at all, or
        # none for a row of a table before them (jsonb_array_elements(o.meta->'items')).
        return True
    name = node.get("relname", "")
    if not node.get("schemaname") and name in ctes and name not in seen:
        cte_kind, cte = ctes[name]
        if cte_kind == "SelectStmt":
            return _select_filtered(cte, ctes, seen | {name})
        return filtered(cte_kind, cte, ctes)
    return False
