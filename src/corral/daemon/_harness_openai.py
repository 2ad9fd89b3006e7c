"""Compatibility import for ``_server.py``: moved to ``harnesses._openai``."""

from corral.daemon.harnesses._openai import OpenAIHarness

__all__ = ["OpenAIHarness"]
