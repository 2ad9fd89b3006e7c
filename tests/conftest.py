"""Fixtures shared by the whole suite, and the property-based tests' profiles."""

import logging
import os
from collections.abc import Iterator

import pytest
from hypothesis import settings

from tests.support.openai_server import openai_server
from tests.support.postgres import postgres_admin_dsn, postgres_dsn

__all__ = ["openai_server", "postgres_admin_dsn", "postgres_dsn"]

# `make test`: few examples, the same every run; `make fuzz` (HYPOTHESIS_PROFILE=long): many,
# random. Deadlines are off: a database round trip's time is not what is under test.
settings.register_profile("default", max_examples=100, deadline=None, derandomize=True)
settings.register_profile("long", max_examples=5000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture(autouse=True)
def _corral_logging_restored() -> Iterator[None]:
    """Leave the ``corral`` logger as each test found it: a test that runs ``corral serve``
    in this process adds the daemon's stderr handler, whose lines would otherwise land in a
    later test's captured stderr."""
    logger = logging.getLogger("corral")
    handlers, level = list(logger.handlers), logger.level
    yield
    logger.handlers[:] = handlers
    logger.setLevel(level)
