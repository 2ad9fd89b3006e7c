"""Compatibility import for ``_server.py``: moved to ``stores._sqlite``."""

from corral.daemon.stores._sqlite import SQLiteStore

__all__ = ["SQLiteStore"]
