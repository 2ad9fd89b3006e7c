"""The authorizer (:class:`Wall`) on every connection agents' SQL is compiled or run on."""

from __future__ import annotations

import contextlib
import difflib
import sqlite3

from corral.gateway._errors import GatewayError
from corral.gateway._sql_functions import forbidden_function_reason

__all__ = [
    "DELETE",
    "EPONYMOUS",
    "INSERT",
    "UPDATE",
    "Wall",
    "forbidden_function",
    "forbidden_statement",
    "prewarm",
    "unknown_table",
]

_OK, _DENY = sqlite3.SQLITE_OK, sqlite3.SQLITE_DENY
_READ, _SELECT, _FUNCTION, _RECURSIVE = (
    sqlite3.SQLITE_READ,
    sqlite3.SQLITE_SELECT,
    sqlite3.SQLITE_FUNCTION,
    sqlite3.SQLITE_RECURSIVE,
)

INSERT, UPDATE, DELETE = sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE, sqlite3.SQLITE_DELETE
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
EPONYMOUS = frozenset({"json_each", "json_tree"})
_SCHEMA_TABLES = frozenset({"sqlite_master", "sqlite_temp_master"})
_SCHEMA_COLUMNS = frozenset({"type", "name", "tbl_name", "rootpage", "sql"})


def prewarm(conn: sqlite3.Connection) -> None:
    """Use the allowed table-valued functions once on ``conn``, before its :class:`Wall` is
    armed: SQLite registers them in the schema on first use, which the authorizer would see
    as an update of ``sqlite_master``."""
    for name in sorted(EPONYMOUS):
        with contextlib.suppress(sqlite3.Error):  # a SQLite built without JSON
            conn.execute(f"SELECT 1 FROM {name}('[]')").close()


def unknown_table(name: str, catalog_keys: frozenset[str], position: int | None) -> GatewayError:
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
            return self._deny(forbidden_function(name, reason))
        table = (arg1 or "").lower()
        if action == _READ:
            if db in (None, "main") and table in self._visible:
                if source is None or source.lower() not in self._visible:
                    self.reads[table] = None  # not a view's own reads: those are the view's
                return _OK
            if db in (None, "main") and table in EPONYMOUS:
                return _OK
            if arg2 == "" and db is None and table in self._ctes and not self._real(table):
                # A CTE none of whose columns is used (count(*) FROM cte). A CTE may not
                # share a hidden table's name: this callback could be that table's.
                return _OK
            return self._deny(unknown_table(arg1 or "", self._visible, None))
        if action in (INSERT, UPDATE, DELETE):
            if action == UPDATE and table in _SCHEMA_TABLES and arg2 in _SCHEMA_COLUMNS:
                # A table-valued function registering itself. SQLite itself refuses any
                # statement that really updates its schema table.
                return _OK
            if db in (None, "main") and table in self._visible:
                self.writes[table] = None
                self.write_actions.add(action)
                return _OK
            return self._deny(unknown_table(arg1 or "", self._visible, None))
        name = _ACTION_NAMES.get(action, f"action {action}")
        return self._deny(forbidden_statement(name))


def forbidden_function(name: str, reason: str) -> GatewayError:
    return GatewayError(
        "forbidden_function",
        f"function {name} is not allowed through the gateway: {reason}",
        function=name,
        position=None,
    )


_ALLOWED_NAMES = (
    "only SELECT, VALUES, WITH, INSERT, REPLACE, UPDATE and DELETE (and EXPLAIN of one)"
)


def forbidden_statement(name: str) -> GatewayError:
    return GatewayError(
        "forbidden_statement",
        f"{name} statements are not allowed through the gateway; {_ALLOWED_NAMES} are",
        statement=name,
    )
