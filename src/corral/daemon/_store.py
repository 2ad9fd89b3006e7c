"""Compatibility import for ``_server.py``: moved to ``stores._base``."""

from corral.daemon.stores._base import Store

__all__ = ["Store"]
