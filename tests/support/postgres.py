"""PostgreSQL for tests: a fresh database per test, dropped afterwards.

The server is found through ``CORRAL_TEST_PG``, an admin connection string (default
``postgresql://postgres@127.0.0.1:5432/postgres``) whose user may create databases. When the
server does not answer the test is skipped with the reason, except under ``CI=true``, where it
fails: CI must not pass by skipping the PostgreSQL half of the suite.

Tests that use :func:`postgres_dsn` must carry the ``postgres`` marker (``-m "not postgres"``
then deselects them); the fixture fails a test that lacks it. A ``conftest.py`` re-exports
the fixtures with ``from tests.support.postgres import postgres_admin_dsn, postgres_dsn``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

__all__ = ["DEFAULT_ADMIN_DSN", "postgres_admin_dsn", "postgres_dsn"]

DEFAULT_ADMIN_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"


def _admin_dsn() -> str:
    return os.environ.get("CORRAL_TEST_PG") or DEFAULT_ADMIN_DSN


def _shown(dsn: str) -> str:
    params = conninfo_to_dict(dsn)
    params.pop("password", None)
    return make_conninfo("", **params)


@pytest.fixture(scope="session")
def postgres_admin_dsn() -> str:
    """The admin DSN, once the server has answered (skips, or fails under ``CI=true``)."""
    dsn = _admin_dsn()
    try:
        with psycopg.connect(dsn, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        message = f"PostgreSQL at {_shown(dsn)!r} (CORRAL_TEST_PG) does not answer: {reason}"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message}; CI=true requires it", pytrace=False)
        pytest.skip(message)
    return dsn


@pytest.fixture
def postgres_dsn(request: pytest.FixtureRequest, postgres_admin_dsn: str) -> Iterator[str]:
    """The DSN of a database created for this test and dropped (forcibly) after it."""
    if request.node.get_closest_marker("postgres") is None:
        pytest.fail(
            f"{request.node.nodeid} uses postgres_dsn without the postgres marker",
            pytrace=False,
        )
    name = f"corral_test_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(postgres_admin_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield make_conninfo(postgres_admin_dsn, dbname=name)
    finally:
        with psycopg.connect(postgres_admin_dsn, autocommit=True) as admin:
            # FORCE: a connection a failed test left open must not keep the database alive.
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
