"""What a statement SQLite refuses comes back as: the code of its cause."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from corral.daemon import http_status
from corral.gateway import BreakerPolicy, GatewayError, SQLiteGateway
from corral.gateway.sqlite._file import _refusal_code
from corral.runtime import FakeClock
from tests.gateway.corpus import shop_sqlite_file
from tests.gateway.gateway_support import on_thread

AGENT = "agent-7"


@pytest.fixture
def shop(tmp_path: Path) -> Path:
    path = shop_sqlite_file(tmp_path)
    conn = sqlite3.connect(path)
    try:
        conn.execute(
            "CREATE TABLE refunds (id INTEGER PRIMARY KEY, amount INTEGER CHECK (amount > 0))"
        )
        conn.execute("CREATE TABLE strict_refunds (id INTEGER PRIMARY KEY, amount INTEGER) STRICT")
        conn.commit()
    finally:
        conn.close()
    return path


async def _refused(gw: SQLiteGateway, request: dict[str, Any]) -> GatewayError:
    with pytest.raises(GatewayError) as info:
        await gw.query(AGENT, request)
    return info.value


def _write(sql: str, key: str = "k") -> dict[str, Any]:
    return {"sql": sql, "idempotency_key": key}


CUSTOMER = "INSERT INTO customers (id, name, email, country, created_at) VALUES "


@pytest.mark.parametrize(
    ("request_", "code", "constraint"),
    [
        (_write(CUSTOMER + "(1, 'D', 'd@x', 'FR', 't')"), "constraint_violation", "customers.id"),
        (
            _write(CUSTOMER + "(90, NULL, 'd@x', 'FR', 't')"),
            "constraint_violation",
            "customers.name",
        ),
        (_write("INSERT INTO refunds VALUES (1, -5)"), "constraint_violation", "amount > 0"),
        (
            {
                "op": "insert",
                "table": "customers",
                "values": {
                    "id": 1,
                    "name": "D",
                    "email": "d@x",
                    "country": "FR",
                    "created_at": "t",
                },
                "idempotency_key": "k",
            },
            "constraint_violation",
            "customers.id",
        ),
        # An INTEGER PRIMARY KEY holds integers only.
        (_write(CUSTOMER + "('abc', 'D', 'd@x', 'FR', 't')"), "invalid_data", None),
        # A STRICT table refuses a value of another type.
        (_write("INSERT INTO strict_refunds VALUES (1, 'abc')"), "invalid_data", None),
        ({"sql": "SELECT json_extract('{', '$') AS j"}, "invalid_data", None),
        ({"sql": "SELECT abs(-9223372036854775807 - 1) AS n"}, "invalid_data", None),
    ],
)
async def test_refusals_are_classified_by_cause(
    shop: Path, request_: dict[str, Any], code: str, constraint: str | None
) -> None:
    async with SQLiteGateway.connect(shop, clock=FakeClock()) as gw:
        error = await _refused(gw, request_)
        if "idempotency_key" in request_:
            assert await on_thread(gw, "lookup", AGENT, "k") is None  # the key stays free
    assert error.code == code
    assert (http_status(error), error.retryable) == (
        (409 if code == "constraint_violation" else 400),
        False,
    )
    assert error.details["constraint"] == constraint
    assert error.details["database_message"] in error.message


def test_other_failures_stay_database_errors() -> None:
    busy = sqlite3.OperationalError("too many levels of trigger recursion")
    assert _refusal_code(busy, "SQLITE_ERROR", str(busy)) == "database_error"
    raised = sqlite3.IntegrityError("no refunds today")  # a trigger's RAISE(ABORT, ...)
    assert _refusal_code(raised, "SQLITE_CONSTRAINT_TRIGGER", str(raised)) == (
        "constraint_violation"
    )


async def test_the_breakers_count_them_as_errors(shop: Path) -> None:
    policy = BreakerPolicy(max_errors=2)
    async with SQLiteGateway.connect(shop, clock=FakeClock(), breaker=policy) as gw:
        first = await _refused(gw, _write(CUSTOMER + "(1, 'D', 'd@x', 'FR', 't')"))
        second = await _refused(gw, {"sql": "SELECT json_extract('{', '$') AS j"})
        frozen = await _refused(gw, {"sql": "SELECT 1 AS one"})
        freeze = gw.status(AGENT).freeze
    assert (first.code, second.code, frozen.code) == (
        "constraint_violation",
        "invalid_data",
        "agent_frozen",
    )
    assert freeze is not None
    assert (freeze.signal, freeze.count) == ("errors", 2)
