"""Compatibility import for ``_server.py``: moved to ``harnesses._base``."""

from corral.daemon.harnesses._base import Harness

__all__ = ["Harness"]
