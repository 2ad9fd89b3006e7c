"""The row sources of a SQLite read, followed through its tokens (SQLite gives no parse tree):
whether the read without its filters has rows, as a formula over its tables, and whether a
filter may have emptied it. Shapes it cannot follow raise :class:`Unfollowed`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from corral.gateway._rows import Rows, all_of, any_of
from corral.gateway.sqlite._tokens import NUMBER, QUOTED, WORD, Token

__all__ = ["SqliteRows", "Unfollowed", "sqlite_rows"]

# Words that end an expression or a FROM item at parenthesis depth 0.
_CLAUSES = frozenset(
    {"FROM", "WHERE", "GROUP", "HAVING", "WINDOW", "ORDER", "LIMIT", "UNION", "INTERSECT"}
    | {"EXCEPT", "ON", "USING", "NATURAL", "LEFT", "RIGHT", "FULL", "INNER", "CROSS", "JOIN"}
    | {"OFFSET", "INDEXED", "NOT", "RETURNING"}
)
_COMPOUND_END = frozenset({"ORDER", "LIMIT", "UNION", "INTERSECT", "EXCEPT"})
_CORE_CLAUSES = frozenset({"WHERE", "GROUP", "HAVING", "WINDOW"})
_JOIN_WORDS = frozenset({"NATURAL", "LEFT", "RIGHT", "FULL", "INNER", "CROSS", "JOIN", "OUTER"})
# Aggregates (min and max only with one argument: with more they are scalar).
_AGGREGATES = frozenset(
    {"count", "sum", "total", "avg", "min", "max", "group_concat", "string_agg"}
    | {"json_group_array", "json_group_object", "jsonb_group_array", "jsonb_group_object"}
)


class Unfollowed(Exception):
    """The statement has a shape this module does not follow."""


@dataclass(frozen=True, slots=True)
class SqliteRows:
    """``rows`` and ``filtered`` as for PostgreSQL's
    :class:`~corral.gateway.postgres._filtered.ReadRows` (SQLite has no ``ONLY``)."""

    rows: Rows
    filtered: bool


def sqlite_rows(tokens: list[Token], key_of: Callable[[str], str | None]) -> SqliteRows:
    """Follow the read ``tokens`` (one statement, no ``EXPLAIN``); ``key_of(name)`` is the
    catalog key of a table or view named in FROM (``schema.name`` or ``name``), None when the
    catalog has none. Raises :class:`Unfollowed`."""
    parser = _Parser(tokens, key_of)
    try:
        rows, is_filtered = parser.statement(0, len(tokens), {})
    except (IndexError, RecursionError) as exc:
        # Text SQLite compiled but this module misread, or nested past Python's stack: the
        # caller's over-estimates answer instead.
        raise Unfollowed(type(exc).__name__) from None
    return SqliteRows(rows, is_filtered)


_Ctes = dict[str, tuple[int, int] | None]  # name -> its body's token span; None: being defined


@dataclass(slots=True)
class _Parser:
    tokens: list[Token]
    key_of: Callable[[str], str | None]

    # --- helpers ------------------------------------------------------------------------------

    def word(self, i: int, end: int) -> str:
        return self.tokens[i].upper if i < end else ""

    def closing(self, i: int, end: int) -> int:
        """The index of the ``)`` matching the ``(`` at ``i``."""
        depth = 0
        for j in range(i, end):
            text = self.tokens[j].text
            if text == "(" and self.tokens[j].kind not in (QUOTED,):
                depth += 1
            elif text == ")":
                depth -= 1
                if depth == 0:
                    return j
        raise Unfollowed("unbalanced parentheses")

    def skip(self, i: int, end: int, stops: frozenset[str]) -> int:
        """The first index from ``i`` at depth 0 whose word is in ``stops`` (or a ``,`` when
        ``","`` is), else ``end``."""
        while i < end:
            token = self.tokens[i]
            if token.text == "(" and token.kind != QUOTED:
                i = self.closing(i, end) + 1
                continue
            if token.upper in stops or ("," in stops and token.text == ","):
                return i
            i += 1
        return end

    # --- statements ---------------------------------------------------------------------------

    def statement(self, i: int, end: int, ctes: _Ctes) -> tuple[Rows, bool]:
        if self.word(i, end) == "WITH":
            ctes = dict(ctes)
            i = self.with_clause(i + 1, end, ctes)
        rows, is_filtered, i = self.compound(i, end, ctes)
        if self.word(i, end) == "ORDER":
            i = self.skip(i, end, frozenset({"LIMIT"}))
        if self.word(i, end) == "LIMIT":
            is_filtered = is_filtered or not self.keeps_rows(i + 1, end)
            i = end
        if i != end:
            raise Unfollowed(f"unexpected {self.tokens[i].text!r}")
        return rows, is_filtered

    def with_clause(self, i: int, end: int, ctes: _Ctes) -> int:
        recursive = self.word(i, end) == "RECURSIVE"
        i += recursive
        while True:
            if i >= end or self.tokens[i].kind not in (WORD, QUOTED):
                raise Unfollowed("a CTE without a name")
            name = self.tokens[i].name.lower()
            i += 1
            if i < end and self.tokens[i].text == "(":
                i = self.closing(i, end) + 1
            if self.word(i, end) != "AS":
                raise Unfollowed("a CTE without AS")
            i += 1
            while self.word(i, end) in ("NOT", "MATERIALIZED"):
                i += 1
            if i >= end or self.tokens[i].text != "(":
                raise Unfollowed("a CTE without a body")
            close = self.closing(i, end)
            ctes[name] = (i + 1, close)
            i = close + 1
            if i < end and self.tokens[i].text == ",":
                i += 1
                continue
            return i

    def compound(self, i: int, end: int, ctes: _Ctes) -> tuple[Rows, bool, int]:
        # SQLite's compound operators share one precedence, left to right.
        rows, is_filtered, i = self.core(i, end, ctes)
        while self.word(i, end) in ("UNION", "INTERSECT", "EXCEPT"):
            op = self.word(i, end)
            i += 1
            if op == "UNION" and self.word(i, end) == "ALL":
                i += 1
            right, right_filtered, i = self.core(i, end, ctes)
            if op == "UNION":
                rows, is_filtered = any_of((rows, right)), is_filtered or right_filtered
            else:
                is_filtered = True  # INTERSECT and EXCEPT filter the left arm by the right
        return rows, is_filtered, i

    def core(self, i: int, end: int, ctes: _Ctes) -> tuple[Rows, bool, int]:
        first = self.word(i, end)
        if first == "VALUES":
            return True, False, self.skip(i + 1, end, _COMPOUND_END)
        if first != "SELECT":
            raise Unfollowed(f"a select core starting with {first or self.tokens[i].text!r}")
        targets = i + 1
        i = self.skip(targets, end, _CLAUSES - {"NOT"})
        aggregated = self.aggregates(targets, i)
        rows: Rows = True
        is_filtered = False
        grouped = False
        if self.word(i, end) == "FROM":
            rows, is_filtered, i = self.join_clause(i + 1, end, ctes)
        while self.word(i, end) in ("WHERE", "GROUP", "HAVING", "WINDOW"):
            clause = self.word(i, end)
            is_filtered = is_filtered or clause in ("WHERE", "HAVING")
            grouped = grouped or clause == "GROUP"
            aggregated = aggregated or clause == "HAVING"
            i = self.skip(i + 1, end, _CORE_CLAUSES | _COMPOUND_END)
        if aggregated and not grouped:
            rows = True  # one group, whatever FROM holds
        return rows, is_filtered, i

    def aggregates(self, i: int, end: int) -> bool:
        """Whether an aggregate is called in ``[i, end)`` outside subqueries."""
        while i < end:
            token = self.tokens[i]
            if token.text == "(" and token.kind != QUOTED:
                close = self.closing(i, end)
                if self.word(i + 1, close) in ("SELECT", "WITH", "VALUES"):
                    i = close + 1
                    continue
                if i > 0 and self.tokens[i - 1].kind == WORD:
                    name = self.tokens[i - 1].text.lower()
                    after = close + 1
                    if self.word(after, end) == "FILTER" and after + 1 < end:
                        after = self.closing(after + 1, end) + 1
                    windowed = self.word(after, end) == "OVER"
                    commas = self.skip(i + 1, close, frozenset({","})) != close
                    one_argument = name not in ("min", "max") or not commas
                    if name in _AGGREGATES and one_argument and not windowed:
                        return True
            i += 1
        return False

    # --- FROM ---------------------------------------------------------------------------------

    def join_clause(self, i: int, end: int, ctes: _Ctes) -> tuple[Rows, bool, int]:
        rows, is_filtered, i = self.item(i, end, ctes)
        while i < end:
            token = self.tokens[i]
            if token.text == ",":
                kind, natural = "CROSS", False
                i += 1
            elif token.upper in _JOIN_WORDS:
                natural = token.upper == "NATURAL"
                kind = "INNER"
                while self.word(i, end) in _JOIN_WORDS:
                    word = self.word(i, end)
                    if word in ("LEFT", "RIGHT", "FULL", "CROSS"):
                        kind = word
                    i += 1
                    if word == "JOIN":
                        break
            else:
                break
            right, right_filtered, i = self.item(i, end, ctes)
            conditioned = natural
            if self.word(i, end) == "ON":
                conditioned = True
                i = self.skip(i + 1, end, _CLAUSES - {"NOT"} | frozenset({","}))
            elif self.word(i, end) == "USING":
                conditioned = True
                i += 1
                if i >= end or self.tokens[i].text != "(":
                    raise Unfollowed("USING without columns")
                i = self.closing(i, end) + 1
            if kind == "LEFT":
                continue
            if kind == "RIGHT":
                rows, is_filtered = right, right_filtered
            elif kind == "FULL":
                rows, is_filtered = any_of((rows, right)), is_filtered or right_filtered
            else:
                rows = all_of((rows, right))
                is_filtered = is_filtered or right_filtered or conditioned
        return rows, is_filtered, i

    def item(self, i: int, end: int, ctes: _Ctes) -> tuple[Rows, bool, int]:
        if i >= end:
            raise Unfollowed("FROM without a table")
        token = self.tokens[i]
        if token.text == "(":
            close = self.closing(i, end)
            if self.word(i + 1, close) in ("SELECT", "WITH", "VALUES"):
                rows, is_filtered = self.statement(i + 1, close, ctes)
            else:
                rows, is_filtered, at = self.join_clause(i + 1, close, ctes)
                if at != close:
                    raise Unfollowed("a parenthesised join not followed to its end")
            return rows, is_filtered, self.alias(close + 1, end)
        if token.kind not in (WORD, QUOTED):
            raise Unfollowed(f"a FROM item starting with {token.text!r}")
        name = token.name
        i += 1
        if i + 1 < end and self.tokens[i].text == "." and self.tokens[i + 1].kind in (WORD, QUOTED):
            name = f"{name}.{self.tokens[i + 1].name}"
            i += 2
        if i < end and self.tokens[i].text == "(":
            # A table-valued function: a filter that stands for one row.
            return True, True, self.alias(self.closing(i, end) + 1, end)
        i = self.alias(i, end)
        if self.word(i, end) == "INDEXED":
            i += 3  # INDEXED BY name
        elif self.word(i, end) == "NOT" and self.word(i + 1, end) == "INDEXED":
            i += 2
        lowered = name.lower()
        if "." not in lowered and lowered in ctes:
            span = ctes[lowered]
            if span is None:
                return False, False, i  # a recursive CTE's reference to itself
            inner = dict(ctes)
            inner[lowered] = None
            rows, is_filtered = self.statement(*span, inner)
            return rows, is_filtered, i
        key = self.key_of(name)
        if key is None:
            raise Unfollowed(f"{name!r} is not in the catalog")
        return key, False, i

    def alias(self, i: int, end: int) -> int:
        if self.word(i, end) == "AS":
            return i + 2
        if (
            i < end
            and self.tokens[i].kind in (WORD, QUOTED)
            and self.tokens[i].upper not in (_CLAUSES | _JOIN_WORDS)
        ):
            return i + 1
        return i

    def keeps_rows(self, i: int, end: int) -> bool:
        """Whether ``LIMIT <i...>`` keeps every row there is: a positive integer (or -1, no
        limit) and no OFFSET other than 0."""
        rest = self.tokens[i:end]
        if len(rest) == 2 and rest[0].text == "-" and rest[1].text == "1":
            return True
        if len(rest) == 1 and rest[0].kind == NUMBER and rest[0].text.isdigit():
            return int(rest[0].text) > 0
        if (
            len(rest) == 3
            and rest[0].kind == NUMBER
            and rest[0].text.isdigit()
            and int(rest[0].text) > 0
            and rest[1].upper == "OFFSET"
        ):
            return rest[2].text == "0"
        return False
