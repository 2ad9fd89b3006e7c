"""The stores: the seam that keeps the event log and its projections, on SQLite or PostgreSQL."""

from typing import TYPE_CHECKING

from corral.daemon.stores._base import Store
from corral.daemon.stores._group import CommitStats
from corral.daemon.stores._sqlite import SQLiteStore

if TYPE_CHECKING:
    from corral.daemon.stores._postgres import PostgresStore

__all__ = ["CommitStats", "PostgresStore", "SQLiteStore", "Store"]


def __getattr__(name: str) -> object:
    # PostgreSQL support needs the ``postgres`` extra (psycopg): import it only when asked.
    if name == "PostgresStore":
        from corral.daemon.stores import _postgres

        return _postgres.PostgresStore
    raise AttributeError(f"module 'corral.daemon.stores' has no attribute {name!r}")
