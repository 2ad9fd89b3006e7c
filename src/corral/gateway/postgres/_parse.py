"""libpg_query's parse and deparse, made safe for any text: a statement too long or nesting
too deep is refused (``statement_too_complex``) before it can overflow a stack, a long one is
parsed on a deep-stack thread (docs/architecture.md, "Parse safety")."""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Callable
from itertools import accumulate
from typing import Any

from corral.gateway._errors import GatewayError, statement_too_long
from corral.gateway._parse_threads import INLINE_CHARS, MAX_STATEMENT_CHARS, on_deep_stack
from corral.gateway.postgres._tree import Node

__all__ = ["MAX_TREE_DEPTH", "deparse", "parse"]

# postgast's generated protobuf stub does not parse under mypy, so its modules are loaded
# untyped. The analysis walks libpg_query's JSON tree (plain dicts walk several times faster
# than protobuf objects); the canonical text comes from libpg_query's deparser, in C.
_native: Any = importlib.import_module("postgast.native")
_errors: Any = importlib.import_module("postgast.errors")
_LIB = _native.lib
_check_error: Callable[[Any], None] = _errors.check_error
PgQueryError: Any = _errors.PgQueryError

# The deepest parse tree analysed, in levels of libpg_query's JSON (each one a level of
# recursion for json.loads, which shares Python's limit of 1,000 with the caller's frames):
# about 240 chained operators, 95 nested CASE or 160 nested function calls, 65 nested
# subqueries. Long lists (IN, VALUES, AND/OR chains, select lists) are flat: not limited.
MAX_TREE_DEPTH = 500
_PARSER_STACK_FULL = ("memory exhausted", "stack depth limit exceeded")
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"{}[]")
_DEPTH_STEP = [0] * 256
_DEPTH_STEP[ord("{")] = _DEPTH_STEP[ord("[")] = 1
_DEPTH_STEP[ord("}")] = _DEPTH_STEP[ord("]")] = -1


def _tree_depth(tree: bytes) -> int:
    """How deeply ``tree`` (JSON text) nests objects and arrays, in one linear pass."""
    brackets = _JSON_STRING.sub(b"", tree).translate(None, _NOT_BRACKET)
    return max(accumulate(map(_DEPTH_STEP.__getitem__, brackets)), default=0)


def _parse_text(sql: str) -> bytes:
    """libpg_query's JSON tree of ``sql``; raises ``PgQueryError``."""
    result = _LIB.pg_query_parse(sql.encode("utf-8"))
    try:
        _check_error(result)
        tree: bytes = result.parse_tree
        return tree
    finally:
        _LIB.pg_query_free_parse_result(result)


def parse(sql: str) -> list[Node]:
    """The statements of ``sql`` as libpg_query's JSON tree. Raises ``GatewayError``:
    ``statement_too_complex`` past :data:`MAX_STATEMENT_CHARS` or :data:`MAX_TREE_DEPTH`, or
    past the parser's own stack; ``parse_error`` for what does not parse."""
    if len(sql) > MAX_STATEMENT_CHARS:
        raise statement_too_long(len(sql), MAX_STATEMENT_CHARS)
    try:
        # A long statement may nest deeper than the caller's stack holds: parsed on a thread
        # whose stack holds the deepest parse of the longest statement taken.
        text = on_deep_stack(_parse_text, sql) if len(sql) > INLINE_CHARS else _parse_text(sql)
        # Fewer brackets than the limit cannot nest deeper: the exact count only past it.
        if text.count(b"{") + text.count(b"[") > MAX_TREE_DEPTH:
            depth = _tree_depth(text)
            if depth > MAX_TREE_DEPTH:
                raise GatewayError(
                    "statement_too_complex",
                    f"the statement nests {depth} levels deep (its parse tree); the gateway "
                    f"analyses at most {MAX_TREE_DEPTH}, about 240 chained operators or 65 "
                    "nested subqueries: flatten it (a long list, IN (...), or a CTE)",
                    limit=MAX_TREE_DEPTH,
                    depth=depth,
                )
        tree = json.loads(text)
    except PgQueryError as exc:
        # libpg_query reports this position in characters already (node locations are bytes).
        position = exc.cursorpos if exc.cursorpos > 0 else None
        where = f" at position {position}" if position is not None else ""
        if str(exc.message).startswith(_PARSER_STACK_FULL):
            # Bison's own stack (10,000 entries) filled: nested deeper than it parses.
            raise GatewayError(
                "statement_too_complex",
                f"the statement nests deeper than the SQL parser's limit of 10000 levels "
                f"({exc.message}{where})",
                limit=10000,
                position=position,
                parser_message=exc.message,
            ) from None
        raise GatewayError(
            "parse_error",
            f"SQL does not parse: {exc.message}{where}",
            position=position,
            parser_message=exc.message,
        ) from None
    statements: list[Node] = tree.get("stmts", [])
    return statements


def deparse(sql: str) -> str:
    """``sql`` as libpg_query deparses it (``sql`` parses, and is within the limits)."""
    try:
        parsed = _LIB.pg_query_parse_protobuf(sql.encode("utf-8"))
        try:
            _check_error(parsed)
            result = _LIB.pg_query_deparse_protobuf(parsed.parse_tree)
            try:
                _check_error(result)
                text: bytes = result.query
                return text.decode("utf-8")
            finally:
                _LIB.pg_query_free_deparse_result(result)
        finally:
            _LIB.pg_query_free_protobuf_parse_result(parsed)
    except PgQueryError:  # pragma: no cover - what parses also deparses
        return " ".join(sql.split())
