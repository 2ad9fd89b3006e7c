"""Agents' SQL on SQLite, decided before it runs: SQLite's own compiler is the parser, under
the :class:`~._wall.Wall`; analyses and refusals cached by statement text and catalog version."""

from __future__ import annotations

import difflib
import re
import sqlite3
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Literal

from corral.gateway._catalog import Catalog
from corral.gateway._errors import GatewayError
from corral.gateway._refusal import Refusal
from corral.gateway._rows import Rows, any_of
from corral.gateway._sql_functions import forbidden_function_reason
from corral.gateway.sqlite._rows import Unfollowed, sqlite_rows
from corral.gateway.sqlite._tokens import (
    ASCII_LOWER,
    OTHER,
    PARAM,
    QUOTED,
    WORD,
    Token,
    cte_names,
    split_statements,
    tokenize,
)
from corral.gateway.sqlite._wall import (
    DELETE,
    EPONYMOUS,
    INSERT,
    UPDATE,
    Wall,
    forbidden_function,
    forbidden_statement,
    unknown_table,
)
from corral.kernel._validate import instance_of, positive_int

__all__ = ["SqliteAnalysis", "SqliteSqlAnalyzer", "analyze_sqlite", "compile_error", "located"]

_READ_KEYWORDS = frozenset({"SELECT", "VALUES", "WITH"})
_WRITE_KEYWORDS = frozenset({"INSERT", "REPLACE", "UPDATE", "DELETE"})
# Every other statement SQLite knows; VACUUM, for one, reaches no authorizer callback.
_FORBIDDEN_KEYWORDS = (
    frozenset({"CREATE", "DROP", "ALTER", "VACUUM", "ANALYZE", "REINDEX", "PRAGMA"})
    | frozenset({"ATTACH", "DETACH", "BEGIN", "COMMIT", "END", "ROLLBACK"})
    | frozenset({"SAVEPOINT", "RELEASE"})
)
_CREATE_MODIFIERS = frozenset({"TEMP", "TEMPORARY", "UNIQUE", "VIRTUAL"})
_OBJECTS = frozenset({"TABLE", "INDEX", "VIEW", "TRIGGER"})
_FILTERS = frozenset(
    {"WHERE", "HAVING", "ON", "USING", "NATURAL", "INTERSECT", "EXCEPT", "LIMIT", "OFFSET"}
)

_CACHED_CODES = frozenset(
    {
        "parse_error",
        "statement_too_complex",
        "multiple_statements",
        "forbidden_statement",
        "forbidden_function",
        "unknown_table",
        "unknown_column",
        "invalid_operation",
    }
)
_NO_SUCH_COLUMN = re.compile(r"no such column: (.+)\Z", re.DOTALL)
_NO_SUCH_TABLE = re.compile(r"no such table: (?:main\.)?(.+)\Z", re.DOTALL)
_TOO_DEEP = re.compile(r"Expression tree is too large \(maximum depth (\d+)\)")
_NO_SUCH_FUNCTION = re.compile(r"no such function: (.+)\Z", re.DOTALL)


@dataclass(frozen=True, slots=True, kw_only=True)
class SqliteAnalysis:
    """What one SQLite statement (``sql``, as the agent sent it) does.

    ``executable`` is the text SQLite runs (``$n`` as ``?n``, double-quoted names
    back-quoted). ``tables``: the catalog keys it reads, in order of first use; ``written``:
    those it writes (none for ``EXPLAIN``). ``param_count``: the highest ``$n``/``?n``, or
    the number of bare ``?``.
    ``ctes``: the names its ``WITH`` clauses define, for the :class:`Wall` that runs it.
    ``rows``: whether a read without its filters has rows, over catalog keys
    (:func:`~corral.gateway.sqlite._rows.sqlite_rows`; when it cannot follow the statement,
    any table read holding rows counts).
    ``normalized``: the statement without comments or layout, unquoted words in lower case,
    ``"x"``/``[x]`` as `` `x` ``, placeholders as ``?n``; constants kept, so two texts doing
    the same work normalise alike and two doing different work do not.
    """

    kind: Literal["read", "write"]
    statement_type: str
    tables: tuple[str, ...]
    written: tuple[str, ...]
    filtered: bool
    param_count: int
    sql: str
    executable: str
    normalized: str
    explain: bool
    ctes: frozenset[str] = frozenset()
    rows: Rows = True


class SqliteSqlAnalyzer:
    """:func:`analyze_sqlite` with an LRU cache of ``cache_size`` entries (refusals too).

    Thread-safe; :meth:`cached` answers from the cache alone (no database), for the event
    loop. ``cache_size`` must be a positive integer (``InvalidArgumentError``).
    """

    def __init__(self, *, cache_size: int = 1024) -> None:
        positive_int("SqliteSqlAnalyzer", "cache_size", cache_size)
        self._maxsize = cache_size
        self._cache: OrderedDict[tuple[str, str], SqliteAnalysis | Refusal] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def cached(self, sql: str, catalog: Catalog) -> SqliteAnalysis | None:
        """The cached analysis of ``sql`` for ``catalog``, None when not cached; a cached
        refusal is raised again."""
        key = (sql, catalog.version)
        with self._lock:
            entry = self._cache.get(key)
            if entry is None:
                return None
            self._cache.move_to_end(key)
            self.hits += 1
        if isinstance(entry, Refusal):
            raise entry.error()
        return entry

    def analyze(
        self, sql: str, catalog: Catalog, conn: sqlite3.Connection, wall: Wall
    ) -> SqliteAnalysis:
        """:func:`analyze_sqlite`, cached. Runs on the caller's thread; ``conn`` and ``wall``
        must not be used by another thread meanwhile."""
        found = self.cached(sql, catalog)
        if found is not None:
            return found
        with self._lock:
            self.misses += 1
        try:
            entry: SqliteAnalysis | Refusal = analyze_sqlite(sql, catalog, conn, wall)
        except GatewayError as exc:
            if exc.code not in _CACHED_CODES:
                raise  # the database was busy or gone: not a property of the text
            entry = Refusal.of(exc)
        with self._lock:
            self._cache[(sql, catalog.version)] = entry
            while len(self._cache) > self._maxsize:
                self._cache.popitem(last=False)
        if isinstance(entry, Refusal):
            raise entry.error()
        return entry


def analyze_sqlite(
    sql: str, catalog: Catalog, conn: sqlite3.Connection, wall: Wall
) -> SqliteAnalysis:
    """Analyse one SQLite statement against ``catalog`` (docs/gateway.md lists the refusals).

    ``conn`` is a read-only connection to the target whose authorizer is ``wall`` and whose
    statement cache is off (``cached_statements=0``: a statement taken from the cache would
    not be authorised again); the statement is compiled there, never run. Raises
    ``GatewayError`` (codes above; ``database_unavailable`` when the file is locked or gone)
    and ``InvalidArgumentError`` for a ``sql`` that is not a ``str``.
    """
    instance_of("analyze_sqlite", "sql", sql, str)
    instance_of("analyze_sqlite", "catalog", catalog, Catalog)
    if "\x00" in sql:
        raise _parse_error("SQL holds a NUL character", "NUL character")
    statements = split_statements(tokenize(sql))
    if not statements:
        raise _parse_error(
            "SQL holds no statement (only whitespace, comments or semicolons)", "empty statement"
        )
    if len(statements) > 1:
        raise GatewayError(
            "multiple_statements",
            f"one statement per request; this SQL holds {len(statements)}",
            count=len(statements),
        )
    tokens = statements[0]
    explain, body = _explain(tokens)
    statement_type = _statement_type(body)
    first = body[0].upper if body else ""
    if first in _FORBIDDEN_KEYWORDS:
        raise forbidden_statement(("EXPLAIN " if explain else "") + statement_type)
    param_count, executable = _rewrite(sql, tokens)
    text = executable if explain else "EXPLAIN " + executable
    visible = frozenset(catalog.tables)
    ctes = cte_names(tokens)
    wall.arm(visible, ctes)
    try:
        conn.execute(text, (None,) * param_count).close()
    except sqlite3.Error as exc:
        if wall.refusal is not None:
            raise located(wall.refusal, sql, tokens) from None
        if "one statement at a time" in str(exc):
            raise GatewayError(
                "multiple_statements",
                "one statement per request; this SQL holds more than one",
                count=None,
            ) from None
        raise compile_error(exc, sql, catalog) from None
    except UnicodeError:
        raise _parse_error("SQL is not valid Unicode text", "encoding") from None
    finally:
        wall.disarm()
    if first not in _READ_KEYWORDS and first not in _WRITE_KEYWORDS:
        # SQLite compiled a statement whose first word the gateway does not know.
        raise forbidden_statement(statement_type or "this kind of")
    if wall.refusal is not None:  # pragma: no cover - a denial always fails the compilation
        raise wall.refusal
    writes = bool(wall.write_actions) or first in _WRITE_KEYWORDS
    if first == "WITH" and writes:
        statement_type = _dml_name(wall.write_actions)
    rows: Rows = any_of(wall.reads)
    is_filtered = _filtered(body)
    if explain:
        rows = True
    elif not writes:
        try:
            found = sqlite_rows(body, lambda name: _key(catalog, name))
            rows, is_filtered = found.rows, found.filtered
        except Unfollowed:
            pass  # the over-estimates above: any table read, any filtering keyword
    return SqliteAnalysis(
        kind="write" if writes and not explain else "read",
        statement_type=("EXPLAIN " if explain else "") + statement_type,
        tables=tuple(wall.reads),
        written=() if explain else tuple(wall.writes),
        filtered=is_filtered,
        param_count=param_count,
        sql=sql,
        executable=executable,
        ctes=ctes,
        normalized=_normalized(tokens),
        explain=explain,
        rows=rows,
    )


def _key(catalog: Catalog, name: str) -> str | None:
    """The catalog key of the table or view ``name`` (``main.`` allowed) names."""
    lowered = name.lower()
    if lowered.startswith("main."):
        lowered = lowered[5:]
    return lowered if lowered in catalog.tables else None


def _filtered(tokens: list[Token]) -> bool:
    """Whether anything in ``tokens`` can leave out rows of the tables read (see the module
    docstring): a filtering keyword, or a table-valued function named anywhere."""
    return any(
        t.upper in _FILTERS or (t.kind in (WORD, QUOTED) and t.name.lower() in EPONYMOUS)
        for t in tokens
    )


def _explain(tokens: list[Token]) -> tuple[bool, list[Token]]:
    if not tokens or tokens[0].upper != "EXPLAIN":
        return False, tokens
    rest = tokens[1:]
    if len(rest) >= 2 and rest[0].upper == "QUERY" and rest[1].upper == "PLAN":
        rest = rest[2:]
    return True, rest


def _statement_type(tokens: list[Token]) -> str:
    words = [t.upper for t in tokens[:4]]
    if not words or not words[0]:
        return ""
    first = words[0]
    if first in ("CREATE", "DROP"):
        name = [first]
        for word in words[1:]:
            if word in _CREATE_MODIFIERS:
                name.append(word)
                continue
            if word in _OBJECTS:
                name.append(word)
            break
        return " ".join(name)
    if first == "ALTER":
        return "ALTER TABLE"
    if first == "WITH":
        return "SELECT"
    return first


def _dml_name(actions: set[int]) -> str:
    for action, name in ((INSERT, "INSERT"), (UPDATE, "UPDATE"), (DELETE, "DELETE")):
        if action in actions:
            return name
    return "SELECT"  # pragma: no cover - only called with a write action


def _rewrite(sql: str, tokens: list[Token]) -> tuple[int, str]:
    bare = 0
    numbered = 0
    parts: list[str] = []
    at = tokens[0].start
    for token in tokens:
        parts.append(sql[at : token.start])
        at = token.end
        text = token.text
        if token.kind == PARAM:
            digits = text[1:]
            if text == "?":
                bare += 1
            elif text[0] in "?$" and digits.isascii() and digits.isdigit():
                numbered = max(numbered, int(digits))
                text = "?" + digits
            else:
                raise GatewayError(
                    "invalid_operation",
                    f"named placeholder {text} is not supported; use $1, $2, ... (or ?1, ?2, "
                    "...) and pass params as a list",
                    key="sql",
                    value=text,
                )
        elif token.kind == QUOTED and text.startswith('"'):
            text = _backquoted(token.name)
        parts.append(text)
    if bare and numbered:
        raise GatewayError(
            "invalid_operation",
            "placeholders mix bare ? with numbered ones ($n or ?n); use one style",
            key="sql",
            value="?",
        )
    return (bare or numbered), "".join(parts)


def _backquoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _normalized(tokens: list[Token]) -> str:
    out: list[str] = []
    bare = 0
    for token in tokens:
        if token.kind == WORD:
            out.append(token.text.translate(ASCII_LOWER))
        elif token.kind == QUOTED:
            out.append(_backquoted(token.name))
        elif token.kind == PARAM:
            if token.text == "?":
                bare += 1
                out.append(f"?{bare}")
            else:
                out.append("?" + token.text[1:])
        else:
            out.append(token.text)
    return " ".join(out)


def _parse_error(message: str, parser_message: str) -> GatewayError:
    return GatewayError("parse_error", message, position=None, parser_message=parser_message)


def compile_error(exc: BaseException, sql: str, catalog: Catalog) -> GatewayError:
    """A SQLite compilation failure of ``sql`` as the ``GatewayError`` the agent is given:
    ``unknown_table`` / ``unknown_column`` with close matches from ``catalog``,
    ``forbidden_function`` for a missing function on the forbidden list,
    ``database_unavailable`` for a locked or missing file, ``statement_too_complex`` past
    SQLite's depth limits, else ``parse_error``."""
    text = str(exc).strip()
    lowered = text.lower()
    if isinstance(exc, sqlite3.OperationalError) and (
        "locked" in lowered or "unable to open" in lowered or "disk i/o" in lowered
    ):
        return GatewayError(
            "database_unavailable",
            f"the SQLite database is unavailable: {text}",
            database_message=text,
        )
    tokens = tokenize(sql)
    match = _NO_SUCH_TABLE.match(text)
    if match:
        name = match.group(1)
        return unknown_table(name, frozenset(catalog.tables), _position(sql, tokens, name))
    match = _NO_SUCH_COLUMN.match(text)
    if match:
        return _unknown_column(match.group(1), sql, tokens, catalog)
    match = _NO_SUCH_FUNCTION.match(text)
    if match:
        reason = forbidden_function_reason(match.group(1), "sqlite")
        if reason is not None:
            return forbidden_function(match.group(1), reason)
    too_deep = _TOO_DEEP.match(text)
    if too_deep is not None or text == "parser stack overflow":
        # SQLite's own limits: SQLITE_MAX_EXPR_DEPTH, and its parser's stack of 100 entries.
        limit = int(too_deep.group(1)) if too_deep is not None else 100
        return GatewayError(
            "statement_too_complex",
            f"the statement nests deeper than SQLite compiles ({text}; at most {limit} "
            "levels): flatten it",
            limit=limit,
            database_message=text,
        )
    return _parse_error(f"SQL does not compile: {text}", text)


def located(error: GatewayError, sql: str, tokens: list[Token] | None = None) -> GatewayError:
    """``error`` (a refusal of the authorizer, which knows no positions) with the 1-based
    position of the table or function it names in ``sql``, when found."""
    if error.details.get("position") is not None:
        return error
    name = error.details.get("table") or error.details.get("function")
    if not isinstance(name, str):
        return error
    position = _position(sql, tokens if tokens is not None else tokenize(sql), name)
    if position is None:
        return error
    return GatewayError(error.code, error.message, **{**error.details, "position": position})


def _position(sql: str, tokens: list[Token], name: str) -> int | None:
    wanted = name.lower()
    for token in tokens:
        if token.kind in (WORD, QUOTED) and token.name.lower() == wanted:
            return token.start + 1
    return None


def _unknown_column(shown: str, sql: str, tokens: list[Token], catalog: Catalog) -> GatewayError:
    qualifier, _, column = shown.rpartition(".")
    table = _resolve(qualifier, tokens, catalog) if qualifier else None
    if table is not None:
        pool = list(catalog.tables[table].columns)
    else:
        named = [
            key for key in dict.fromkeys(t.name.lower() for t in tokens) if key in catalog.tables
        ]
        pool = [c for key in (named or catalog.tables) for c in catalog.tables[key].columns]
    suggestions = difflib.get_close_matches(
        column.lower(), list(dict.fromkeys(pool)), n=3, cutoff=0.6
    )
    shown_table = catalog.tables[table].name if table is not None else None
    where = f"table {shown_table!r}" if shown_table else "the tables in scope"
    hint = f"; did you mean {', '.join(suggestions)}?" if suggestions else ""
    if any(t.kind == QUOTED and t.text.startswith('"') and t.name == column for t in tokens):
        hint += " (double quotes name a column on SQLite targets; write text in single quotes)"
    return GatewayError(
        "unknown_column",
        f"column {column!r} does not exist in {where}{hint}",
        column=column,
        table=shown_table,
        suggestions=suggestions,
        position=_position(sql, tokens, column),
    )


def _resolve(qualifier: str, tokens: list[Token], catalog: Catalog) -> str | None:
    wanted = qualifier.lower()
    if wanted in catalog.tables:
        return wanted
    # "<table> [AS] <alias>": the table an alias stands for.
    names = [t for t in tokens if t.kind != OTHER or t.text == "."]
    for i, token in enumerate(names):
        key = token.name.lower()
        if token.kind not in (WORD, QUOTED) or key not in catalog.tables:
            continue
        following = names[i + 1 : i + 3]
        if following and following[0].upper == "AS":
            following = following[1:]
        if (
            following
            and following[0].kind in (WORD, QUOTED)
            and following[0].name.lower() == wanted
        ):
            return key
    return None
