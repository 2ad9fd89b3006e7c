"""Fixtures shared by the whole suite."""

from tests.support.openai_server import openai_server
from tests.support.postgres import postgres_admin_dsn, postgres_dsn

__all__ = ["openai_server", "postgres_admin_dsn", "postgres_dsn"]
