"""Compatibility import for ``_server.py``: moved to ``harnesses._command``."""

from corral.daemon.harnesses._command import CommandHarness

__all__ = ["CommandHarness"]
