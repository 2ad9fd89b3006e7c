"""Compatibility import for ``_server.py`` and its tests: moved to ``stores._postgres``."""

from corral.daemon.stores._postgres import PostgresStore

__all__ = ["PostgresStore"]
