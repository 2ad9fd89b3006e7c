"""SQL text on SQLite targets, decided before it runs: SQLite's own compiler is the parser.

:func:`analyze_sqlite` returns a :class:`SqliteAnalysis` or raises
:class:`~corral.gateway._errors.GatewayError`, checking in this order (the first failure wins):

``parse_error``
    No statement (only whitespace, comments or semicolons), a NUL character or text that is
    not UTF-8, or SQLite cannot compile the statement (syntax, ``no such function``,
    ``ambiguous column name``, a placeholder number out of range, ...). ``details``:
    ``position`` (None: SQLite does not report one) and ``parser_message``. A call of a
    function that does not exist but is on the forbidden list is ``forbidden_function``.
``multiple_statements``
    More than one statement, however hidden (comments, quoting). ``details``: ``count``.
``forbidden_statement``
    Anything but ``SELECT``/``VALUES``/``WITH`` reads and ``INSERT``/``REPLACE``/``UPDATE``/
    ``DELETE`` writes (with ``WITH``, ``ON CONFLICT``, ``RETURNING``), or ``EXPLAIN [QUERY
    PLAN]`` of one of them: DDL, transaction control and savepoints, ``ATTACH``/``DETACH``,
    ``PRAGMA``, ``VACUUM`` (``INTO`` a file too), ``ANALYZE``, ``REINDEX``. ``details``:
    ``statement``.
``invalid_operation``
    Named placeholders (``:name``, ``@name``, ``$name``) or bare ``?`` mixed with numbered
    ones. ``details``: ``key`` (``sql``), ``value``.
``forbidden_function``
    A function of :func:`~._sql_functions.forbidden_function_reason` (``load_extension``,
    ``readfile``, ``writefile``, ``edit``, ``fts3_tokenizer``, ...), anywhere, in a view or
    trigger the statement uses too. ``details``: ``function``, ``position`` (1-based, of
    the name in the text; None when it is not there, as for a call inside a view).
``unknown_table``
    A table neither in the catalog nor ``json_each``/``json_tree``: SQLite's own schema
    tables (``sqlite_master``, ``sqlite_sequence``, ...), table-valued pragmas, ``dbstat``,
    the gateway's journal, another schema (``temp``). ``details``: ``table``,
    ``suggestions``, ``position``.
``unknown_column``
    SQLite's ``no such column``. ``details``: ``column``, ``table`` (when the qualifier
    names one), ``suggestions``, ``position``.

How. A tokenizer that follows SQLite's own (comments, the four quotings, blob literals,
placeholders) splits statements, reads the first keyword and rewrites the text SQLite will
run (:attr:`SqliteAnalysis.executable`): ``$n`` becomes ``?n``, a double-quoted name becomes
a back-quoted one (SQLite reads ``"name"`` as a string when no column has that name, so a
misspelt quoted column would silently compare two strings; back-quotes are always a name),
and trailing semicolons and comments go. SQLite then compiles ``EXPLAIN <statement>``
(compiles, never runs it) on a read-only connection whose authorizer is a :class:`Wall`,
which refuses at the first callback that is not a read or write of a catalog table, a
``SELECT`` or an allowed function. Refusing in the authorizer, not after compilation, matters:
some statements act while they compile. The same :class:`Wall` guards every connection agents'
SQL runs on, so a statement the analysis got wrong is still refused by SQLite at run time.

Classification: ``write`` when the statement inserts, updates or deletes (the authorizer
says which tables); ``EXPLAIN`` is a read. ``filtered``: anything that can leave out rows of
the tables read appears anywhere: ``WHERE``, ``HAVING``, ``ON``, ``USING``, ``NATURAL``,
``INTERSECT``, ``EXCEPT``, ``LIMIT``, ``OFFSET``, or a table-valued function (``json_each``,
``json_tree``: joined to a table, a row with an empty array yields nothing). An
over-estimate, which only costs an exact ``EXISTS`` check on an empty answer.

Results and refusals are cached (LRU) by ``(sql, catalog.version)``.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import math
import re
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from corral.gateway._catalog import Catalog
from corral.gateway._errors import GatewayError
from corral.gateway._sql_functions import forbidden_function_reason
from corral.gateway.postgres._sql import _Refusal
from corral.kernel._validate import instance_of, positive_int

__all__ = [
    "SqliteAnalysis",
    "SqliteSqlAnalyzer",
    "Token",
    "Wall",
    "analyze_sqlite",
    "bind_params",
    "compile_error",
    "cte_names",
    "located",
    "prewarm",
    "tokenize",
]

# --- the tokenizer ------------------------------------------------------------------------------

WORD, QUOTED, STRING, BLOB, NUMBER, PARAM, SEMI, OTHER = (
    "word",
    "quoted",
    "string",
    "blob",
    "number",
    "param",
    "semi",
    "other",
)
_SPACE = frozenset(" \t\n\v\f\r")  # sqlite3Isspace
_BOM = "\ufeff"  # SQLite skips a byte-order mark wherever a token may start
_OPERATORS = ("->>", "->", "||", "<=", ">=", "<>", "!=", "==", "<<", ">>")
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


@dataclass(frozen=True, slots=True)
class Token:
    """One token of SQL text: ``kind`` (``word``, ``quoted`` identifier, ``string``,
    ``blob``, ``number``, ``param``, ``semi``, ``other``), its text and ``[start, end)``."""

    kind: str
    text: str
    start: int
    end: int

    @property
    def upper(self) -> str:
        return self.text.upper() if self.kind == WORD else ""

    @property
    def name(self) -> str:
        """An identifier's name: a word as written, a quoted one without its quotes."""
        if self.kind != QUOTED:
            return self.text
        body = self.text[1:-1] if len(self.text) >= 2 else ""
        if self.text[0] == "[":
            return body
        quote = self.text[0]
        return body.replace(quote * 2, quote)


def _id_char(c: str) -> bool:
    # SQLite's IdChar: ASCII letters and digits, "_", "$", and every byte of a multi-byte
    # UTF-8 character.
    return not c.isascii() or c.isalnum() or c in "_$"


def _quoted_end(sql: str, i: int, quote: str) -> int:
    j = i + 1
    while True:
        k = sql.find(quote, j)
        if k < 0:
            return len(sql)  # unterminated: SQLite refuses it, the tokenizer only reports it
        if sql.startswith(quote, k + 1):
            j = k + 2
            continue
        return k + 1


def _number_end(sql: str, i: int) -> int:
    n = len(sql)
    if sql.startswith(("0x", "0X"), i) and i + 2 < n and sql[i + 2] in "0123456789abcdefABCDEF":
        i += 2
    else:
        while i < n and sql[i].isascii() and sql[i].isdigit():
            i += 1
        if i < n and sql[i] == ".":
            i += 1
            while i < n and sql[i].isascii() and sql[i].isdigit():
                i += 1
        if i < n and sql[i] in "eE":
            j = i + 1
            if j < n and sql[j] in "+-":
                j += 1
            if j < n and sql[j].isascii() and sql[j].isdigit():
                i = j
    while i < n and _id_char(sql[i]):  # "12abc" is one (illegal) token for SQLite too
        i += 1
    return i


def _variable_end(sql: str, i: int) -> int:
    # "$", "@", ":" or "#" then identifier characters, with TCL's "::" and "(...)" forms.
    n, j, chars = len(sql), i + 1, 0
    while j < n:
        c = sql[j]
        if _id_char(c):
            chars += 1
            j += 1
        elif c == "(" and chars:
            while j < n and sql[j] not in _SPACE and sql[j] != ")":
                j += 1
            return min(j + 1, n)
        elif c == ":" and sql.startswith("::", j):
            j += 2
        else:
            break
    return j if chars else i + 1


def tokenize(sql: str) -> list[Token]:
    """``sql`` as SQLite's tokenizer splits it, without whitespace and comments.

    Never raises: text SQLite would refuse (an unterminated string, an illegal character)
    still becomes tokens, and SQLite's own compilation refuses it later.
    """
    out: list[Token] = []
    i, n = 0, len(sql)
    while i < n:
        c = sql[i]
        if c in _SPACE or c == _BOM:
            i += 1
            continue
        if c == "-" and sql.startswith("--", i):
            j = sql.find("\n", i)
            i = n if j < 0 else j + 1
            continue
        if c == "/" and sql.startswith("/*", i):
            j = sql.find("*/", i + 2)
            i = n if j < 0 else j + 2
            continue
        start = i
        if c == "'":
            kind, i = STRING, _quoted_end(sql, i, "'")
        elif c in '"`':
            kind, i = QUOTED, _quoted_end(sql, i, c)
        elif c == "[":
            j = sql.find("]", i + 1)
            kind, i = QUOTED, (n if j < 0 else j + 1)
        elif c in "xX" and sql.startswith("'", i + 1):
            kind, i = BLOB, _quoted_end(sql, i + 1, "'")
        elif (c.isascii() and c.isdigit()) or (
            c == "." and i + 1 < n and sql[i + 1].isascii() and sql[i + 1].isdigit()
        ):
            kind, i = NUMBER, _number_end(sql, i)
        elif c == "?":
            i += 1
            while i < n and sql[i].isascii() and sql[i].isdigit():
                i += 1
            kind = PARAM
        elif c in "$@:#":
            i = _variable_end(sql, i)
            kind = PARAM if i > start + 1 else OTHER
        elif _id_char(c):
            while i < n and _id_char(sql[i]):
                i += 1
            kind = WORD
        elif c == ";":
            kind, i = SEMI, i + 1
        else:
            kind = OTHER
            i += next((len(op) for op in _OPERATORS if sql.startswith(op, i)), 1)
        out.append(Token(kind, sql[start:i], start, i))
    return out


def cte_names(tokens: list[Token]) -> frozenset[str]:
    """The names (lower case) every ``WITH`` clause of the statement defines."""
    names: set[str] = set()
    for i, token in enumerate(tokens):
        if token.upper == "WITH":
            names.update(_with_clause(tokens, i + 1))
    return frozenset(names)


def _with_clause(tokens: list[Token], i: int) -> list[str]:
    # WITH [RECURSIVE] name [(columns)] AS [NOT] [MATERIALIZED] (body) [, ...]
    names: list[str] = []
    if i < len(tokens) and tokens[i].upper == "RECURSIVE":
        i += 1
    while i < len(tokens) and tokens[i].kind in (WORD, QUOTED):
        name = tokens[i].name.lower()
        i += 1
        if i < len(tokens) and tokens[i].text == "(":
            i = _after_parens(tokens, i)
        if i >= len(tokens) or tokens[i].upper != "AS":
            break
        i += 1
        while i < len(tokens) and tokens[i].upper in ("NOT", "MATERIALIZED"):
            i += 1
        if i >= len(tokens) or tokens[i].text != "(":
            break
        names.append(name)
        i = _after_parens(tokens, i)
        if i >= len(tokens) or tokens[i].text != ",":
            break
        i += 1
    return names


def _after_parens(tokens: list[Token], i: int) -> int:
    depth = 0
    for j in range(i, len(tokens)):
        if tokens[j].text == "(":
            depth += 1
        elif tokens[j].text == ")":
            depth -= 1
            if depth == 0:
                return j + 1
    return len(tokens)


def _statements(tokens: list[Token]) -> list[list[Token]]:
    statements: list[list[Token]] = [[]]
    for token in tokens:
        if token.kind == SEMI:
            statements.append([])
        else:
            statements[-1].append(token)
    return [s for s in statements if s]


# --- the authorizer ---------------------------------------------------------------------------

_OK, _DENY = sqlite3.SQLITE_OK, sqlite3.SQLITE_DENY
_READ, _SELECT, _FUNCTION, _RECURSIVE = (
    sqlite3.SQLITE_READ,
    sqlite3.SQLITE_SELECT,
    sqlite3.SQLITE_FUNCTION,
    sqlite3.SQLITE_RECURSIVE,
)
_INSERT, _UPDATE, _DELETE = sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE, sqlite3.SQLITE_DELETE
_ACTION_NAMES: dict[int, str] = {
    sqlite3.SQLITE_CREATE_INDEX: "CREATE INDEX",
    sqlite3.SQLITE_CREATE_TABLE: "CREATE TABLE",
    sqlite3.SQLITE_CREATE_TEMP_INDEX: "CREATE TEMP INDEX",
    sqlite3.SQLITE_CREATE_TEMP_TABLE: "CREATE TEMP TABLE",
    sqlite3.SQLITE_CREATE_TEMP_TRIGGER: "CREATE TEMP TRIGGER",
    sqlite3.SQLITE_CREATE_TEMP_VIEW: "CREATE TEMP VIEW",
    sqlite3.SQLITE_CREATE_TRIGGER: "CREATE TRIGGER",
    sqlite3.SQLITE_CREATE_VIEW: "CREATE VIEW",
    sqlite3.SQLITE_DROP_INDEX: "DROP INDEX",
    sqlite3.SQLITE_DROP_TABLE: "DROP TABLE",
    sqlite3.SQLITE_DROP_TEMP_INDEX: "DROP TEMP INDEX",
    sqlite3.SQLITE_DROP_TEMP_TABLE: "DROP TEMP TABLE",
    sqlite3.SQLITE_DROP_TEMP_TRIGGER: "DROP TEMP TRIGGER",
    sqlite3.SQLITE_DROP_TEMP_VIEW: "DROP TEMP VIEW",
    sqlite3.SQLITE_DROP_TRIGGER: "DROP TRIGGER",
    sqlite3.SQLITE_DROP_VIEW: "DROP VIEW",
    sqlite3.SQLITE_PRAGMA: "PRAGMA",
    sqlite3.SQLITE_TRANSACTION: "transaction control",
    sqlite3.SQLITE_ATTACH: "ATTACH",
    sqlite3.SQLITE_DETACH: "DETACH",
    sqlite3.SQLITE_ALTER_TABLE: "ALTER TABLE",
    sqlite3.SQLITE_REINDEX: "REINDEX",
    sqlite3.SQLITE_ANALYZE: "ANALYZE",
    sqlite3.SQLITE_CREATE_VTABLE: "CREATE VIRTUAL TABLE",
    sqlite3.SQLITE_DROP_VTABLE: "DROP VIRTUAL TABLE",
    sqlite3.SQLITE_SAVEPOINT: "SAVEPOINT",
}
# Table-valued functions agents may read: they read nothing but their arguments.
_EPONYMOUS = frozenset({"json_each", "json_tree"})
_SCHEMA_TABLES = frozenset({"sqlite_master", "sqlite_temp_master"})
_SCHEMA_COLUMNS = frozenset({"type", "name", "tbl_name", "rootpage", "sql"})


def prewarm(conn: sqlite3.Connection) -> None:
    """Use the allowed table-valued functions once on ``conn``, before its :class:`Wall` is
    armed: SQLite registers them in the schema on first use, which the authorizer would see
    as an update of ``sqlite_master``."""
    for name in sorted(_EPONYMOUS):
        with contextlib.suppress(sqlite3.Error):  # a SQLite built without JSON
            conn.execute(f"SELECT 1 FROM {name}('[]')").close()


def _unknown_table(name: str, catalog_keys: frozenset[str], position: int | None) -> GatewayError:
    suggestions = difflib.get_close_matches(name.lower(), sorted(catalog_keys), n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(suggestions)}?" if suggestions else ""
    return GatewayError(
        "unknown_table",
        f"table {name!r} does not exist in the gateway's catalog{hint}",
        table=name,
        suggestions=suggestions,
        position=position,
    )


class Wall:
    """The authorizer of every connection agents' SQL is compiled or run on.

    Disarmed (the default), it allows everything: the gateway's own statements (the
    journal, ``BEGIN``, the ``EXISTS`` checks, the catalog) run unchecked. Armed with the
    catalog's table keys, it allows ``SELECT``, recursive CTEs, functions not on the
    forbidden list, and reads and writes of catalog tables (and reads of ``json_each`` /
    ``json_tree``), wherever they appear (CTEs, subqueries, views, triggers); it denies
    anything else, keeping the first refusal as a ``GatewayError`` in :attr:`refusal` (SQLite
    then fails the statement with ``not authorized``). :attr:`reads` and :attr:`writes` collect
    the catalog keys read and written. Never raises into SQLite. One wall per connection,
    used by one thread at a time.
    """

    def __init__(self) -> None:
        self._armed = False
        self._visible: frozenset[str] = frozenset()
        self._ctes: frozenset[str] = frozenset()
        self.hidden: frozenset[str] = frozenset()  # real tables a CTE may not stand in for
        self.refusal: GatewayError | None = None
        self.reads: dict[str, None] = {}
        self.writes: dict[str, None] = {}
        self.write_actions: set[int] = set()

    def arm(self, visible: frozenset[str], ctes: frozenset[str] = frozenset()) -> None:
        """Check from now on against the catalog keys ``visible`` and the statement's CTE
        names ``ctes``; forget what was seen."""
        self._visible = visible
        self._ctes = ctes
        self.refusal = None
        self.reads, self.writes, self.write_actions = {}, {}, set()
        self._armed = True

    def disarm(self) -> None:
        self._armed = False

    @property
    def armed(self) -> bool:
        return self._armed

    def __call__(
        self,
        action: int,
        arg1: str | None,
        arg2: str | None,
        db: str | None,
        source: str | None,
    ) -> int:
        if not self._armed:
            return _OK
        try:
            return self._decide(action, arg1, arg2, db, source)
        except Exception:  # pragma: no cover - an exception here would be lost in SQLite
            return _DENY

    def _real(self, table: str) -> bool:
        return table.startswith(("sqlite_", "pragma_")) or table in self.hidden

    def _deny(self, error: GatewayError) -> int:
        if self.refusal is None:
            self.refusal = error
        return _DENY

    def _decide(
        self, action: int, arg1: str | None, arg2: str | None, db: str | None, source: str | None
    ) -> int:
        if action in (_SELECT, _RECURSIVE):
            return _OK
        if action == _FUNCTION:
            name = arg2 or ""
            reason = forbidden_function_reason(name, "sqlite")
            if reason is None:
                return _OK
            return self._deny(_forbidden_function(name, reason))
        table = (arg1 or "").lower()
        if action == _READ:
            if db in (None, "main") and table in self._visible:
                if source is None or source.lower() not in self._visible:
                    self.reads[table] = None  # not a view's own reads: those are the view's
                return _OK
            if db in (None, "main") and table in _EPONYMOUS:
                return _OK
            if arg2 == "" and db is None and table in self._ctes and not self._real(table):
                # A CTE none of whose columns is used (count(*) FROM cte). A CTE may not
                # share a hidden table's name: this callback could be that table's.
                return _OK
            return self._deny(_unknown_table(arg1 or "", self._visible, None))
        if action in (_INSERT, _UPDATE, _DELETE):
            if action == _UPDATE and table in _SCHEMA_TABLES and arg2 in _SCHEMA_COLUMNS:
                # A table-valued function registering itself. SQLite itself refuses any
                # statement that really updates its schema table.
                return _OK
            if db in (None, "main") and table in self._visible:
                self.writes[table] = None
                self.write_actions.add(action)
                return _OK
            return self._deny(_unknown_table(arg1 or "", self._visible, None))
        name = _ACTION_NAMES.get(action, f"action {action}")
        return self._deny(_forbidden_statement(name))


def _forbidden_function(name: str, reason: str) -> GatewayError:
    return GatewayError(
        "forbidden_function",
        f"function {name} is not allowed through the gateway: {reason}",
        function=name,
        position=None,
    )


_ALLOWED_NAMES = (
    "only SELECT, VALUES, WITH, INSERT, REPLACE, UPDATE and DELETE (and EXPLAIN of one)"
)


def _forbidden_statement(name: str) -> GatewayError:
    return GatewayError(
        "forbidden_statement",
        f"{name} statements are not allowed through the gateway; {_ALLOWED_NAMES} are",
        statement=name,
    )


# --- the analysis -----------------------------------------------------------------------------

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
_NO_SUCH_FUNCTION = re.compile(r"no such function: (.+)\Z", re.DOTALL)
_MAX_INT = 2**63 - 1
_MAX_DEPTH = 64


@dataclass(frozen=True, slots=True, kw_only=True)
class SqliteAnalysis:
    """What one SQLite statement (``sql``, as the agent sent it) does.

    ``executable`` is the text SQLite runs (see the module docstring). ``tables``: the catalog
    keys it reads, in order of first use; ``written``: those it writes (none for
    ``EXPLAIN``). ``param_count``: the highest ``$n``/``?n``, or the number of bare ``?``.
    ``ctes``: the names its ``WITH`` clauses define, for the :class:`Wall` that runs it.
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


class SqliteSqlAnalyzer:
    """:func:`analyze_sqlite` with an LRU cache of ``cache_size`` entries (refusals too).

    Thread-safe; :meth:`cached` answers from the cache alone (no database), for the event
    loop. ``cache_size`` must be a positive integer (``InvalidArgumentError``).
    """

    def __init__(self, *, cache_size: int = 1024) -> None:
        positive_int("SqliteSqlAnalyzer", "cache_size", cache_size)
        self._maxsize = cache_size
        self._cache: OrderedDict[tuple[str, str], SqliteAnalysis | _Refusal] = OrderedDict()
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
        if isinstance(entry, _Refusal):
            raise GatewayError(entry.code, entry.message, **entry.details)
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
            entry: SqliteAnalysis | _Refusal = analyze_sqlite(sql, catalog, conn, wall)
        except GatewayError as exc:
            if exc.code not in _CACHED_CODES:
                raise  # the database was busy or gone: not a property of the text
            entry = _Refusal(exc.code, exc.message, dict(exc.details))
        with self._lock:
            self._cache[(sql, catalog.version)] = entry
            while len(self._cache) > self._maxsize:
                self._cache.popitem(last=False)
        if isinstance(entry, _Refusal):
            raise GatewayError(entry.code, entry.message, **entry.details)
        return entry


def analyze_sqlite(
    sql: str, catalog: Catalog, conn: sqlite3.Connection, wall: Wall
) -> SqliteAnalysis:
    """Analyse one SQLite statement against ``catalog`` (see the module docstring).

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
    statements = _statements(tokenize(sql))
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
        raise _forbidden_statement(("EXPLAIN " if explain else "") + statement_type)
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
        raise _forbidden_statement(statement_type or "this kind of")
    if wall.refusal is not None:  # pragma: no cover - a denial always fails the compilation
        raise wall.refusal
    writes = bool(wall.write_actions) or first in _WRITE_KEYWORDS
    if first == "WITH" and writes:
        statement_type = _dml_name(wall.write_actions)
    return SqliteAnalysis(
        kind="write" if writes and not explain else "read",
        statement_type=("EXPLAIN " if explain else "") + statement_type,
        tables=tuple(wall.reads),
        written=() if explain else tuple(wall.writes),
        filtered=_filtered(body),
        param_count=param_count,
        sql=sql,
        executable=executable,
        ctes=ctes,
        normalized=_normalized(tokens),
        explain=explain,
    )


def _filtered(tokens: list[Token]) -> bool:
    """Whether anything in ``tokens`` can leave out rows of the tables read (see the module
    docstring): a filtering keyword, or a table-valued function named anywhere."""
    return any(
        t.upper in _FILTERS or (t.kind in (WORD, QUOTED) and t.name.lower() in _EPONYMOUS)
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
    for action, name in ((_INSERT, "INSERT"), (_UPDATE, "UPDATE"), (_DELETE, "DELETE")):
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
            out.append(token.text.translate(_ASCII_LOWER))
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
    ``database_unavailable`` for a locked or missing file, else ``parse_error``."""
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
        return _unknown_table(name, frozenset(catalog.tables), _position(sql, tokens, name))
    match = _NO_SUCH_COLUMN.match(text)
    if match:
        return _unknown_column(match.group(1), sql, tokens, catalog)
    match = _NO_SUCH_FUNCTION.match(text)
    if match:
        reason = forbidden_function_reason(match.group(1), "sqlite")
        if reason is not None:
            return _forbidden_function(match.group(1), reason)
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


# --- parameters -------------------------------------------------------------------------------


def _invalid(key: str, value: Any, expected: str) -> GatewayError:
    shown = repr(value)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    return GatewayError(
        "invalid_operation", f"{key} must be {expected}, got {shown}", key=key, value=shown
    )


def bind_params(raw: Any) -> tuple[Any, ...]:
    """The request's ``params`` as SQLite binds them.

    ``None``, ``bool`` (bound as 1/0), ``int`` (64-bit), finite ``float`` and ``str`` pass
    as they are; a list or a string-keyed object becomes its JSON text (SQLite's JSON
    functions read it). Anything else is ``invalid_operation`` naming the parameter.
    """
    if raw is None:
        return ()
    if not isinstance(raw, list | tuple):
        raise _invalid("params", raw, "a list of values")
    return tuple(_bound(v, f"params[{i}]") for i, v in enumerate(raw))


def _bound(value: Any, key: str) -> Any:
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        if not -_MAX_INT - 1 <= value <= _MAX_INT:
            raise _invalid(key, value, "an integer between -2**63 and 2**63 - 1")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _invalid(key, value, "a finite number")
        return value
    if isinstance(value, list | tuple | Mapping):
        _check_json(value, key, 0)
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    raise _invalid(key, value, "a JSON value (None, bool, int, float, str, list or object)")


def _check_json(value: Any, key: str, depth: int) -> None:
    if depth > _MAX_DEPTH:
        raise _invalid(key, value, f"a JSON value nested at most {_MAX_DEPTH} deep")
    if value is None or isinstance(value, bool | int | str):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _invalid(key, value, "a finite number")
        return
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _check_json(item, f"{key}[{i}]", depth + 1)
        return
    if isinstance(value, Mapping):
        for k, item in value.items():
            if not isinstance(k, str):
                raise _invalid(key, k, "a JSON object key (a string)")
            _check_json(item, f"{key}.{k}", depth + 1)
        return
    raise _invalid(key, value, "a JSON value (None, bool, int, float, str, list or object)")
