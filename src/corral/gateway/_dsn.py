"""Which engine a ``Gateway.connect`` DSN names, the forms the daemon's ``--db`` also takes."""

from __future__ import annotations

from typing import Literal

from corral.kernel._errors import InvalidArgumentError

__all__ = ["engine_of"]

_FORMS = "'postgresql://...', a libpq connection string, or 'sqlite:///PATH'"


def engine_of(where: str, dsn: str) -> tuple[Literal["postgresql", "sqlite"], str]:
    """``("postgresql", dsn)`` or ``("sqlite", path)``; ``InvalidArgumentError`` otherwise.

    ``postgresql://`` / ``postgres://`` URIs and libpq keyword strings are PostgreSQL;
    ``sqlite:///relative/path`` and ``sqlite:////absolute/path`` are SQLite.
    """
    # A bare file path is not taken for SQLite here (the daemon's --db does take one): "shop"
    # may as well be a mistyped keyword string, and a caller in Python names the engine with
    # sqlite:/// or SQLiteGateway.connect. What is not sqlite:// goes to libpq, which refuses
    # anything but a keyword string or a postgresql:// / postgres:// URI.
    if dsn[:9].lower() != "sqlite://":
        return "postgresql", dsn
    path = dsn[len("sqlite:///") :]
    if dsn[len("sqlite://") :].startswith("/") and path.strip():
        return "sqlite", path
    raise InvalidArgumentError(where, "dsn", _FORMS, dsn)
