"""Compatibility import for ``_server.py``: moved to ``harnesses._python``."""

from corral.daemon.harnesses._python import PythonHarness

__all__ = ["PythonHarness"]
