"""Fixtures shared by the whole suite."""

from tests.support.openai_server import openai_server

__all__ = ["openai_server"]
