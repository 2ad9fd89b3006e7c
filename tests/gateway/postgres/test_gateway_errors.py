"""What a statement the database refuses comes back as: the code of its cause, never a lost
connection; and values Python cannot hold."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from corral.daemon import http_status
from corral.gateway import BreakerPolicy, Gateway
from corral.gateway._errors import CODES, database_refusal, sqlstate_code
from corral.gateway.postgres._execute import map_error
from tests.gateway.gateway_support import AGENT, execute, fetch, refused, shop_dsn

__all__ = ["shop_dsn"]

# Raises the SQLSTATE it is given: conflicts and constraint failures on demand.
RAISE = (
    "CREATE FUNCTION gw_raise(state text) RETURNS integer LANGUAGE plpgsql VOLATILE AS "
    "$$ BEGIN RAISE EXCEPTION 'raised %', state USING ERRCODE = state; END $$"
)
PID = {"sql": "SELECT pg_backend_pid() AS pid"}


async def _pid(gw: Gateway) -> int:
    return int((await gw.query(AGENT, PID)).rows[0]["pid"])


# --- errors while a statement is prepared -----------------------------------------------------


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("sql", "params", "code", "sqlstate"),
    [
        ("SELECT * FROM orders WHERE id = 'abc'", [], "invalid_data", "22P02"),
        ("SELECT 'x'::nosuchtype AS x", [], "database_error", "42704"),
        # A JSON object is sent as jsonb: compared with an integer, the server refuses it.
        ("SELECT id FROM orders WHERE id = $1", [{"a": 1}], "database_error", "42883"),
        ("SELECT id FROM orders WHERE id = $1", [[1, 2]], "database_error", "42883"),
        # At run time, not while preparing.
        ("SELECT 1 / 0 AS x", [], "invalid_data", "22012"),
        ("SELECT id / 0 AS x FROM orders", [], "invalid_data", "22012"),
    ],
)
async def test_a_statement_the_server_refuses_gets_its_code_and_keeps_the_connection(
    shop_dsn: str, sql: str, params: list[Any], code: str, sqlstate: str
) -> None:
    async with Gateway.connect(shop_dsn, pool_size=1) as gw:
        before = await _pid(gw)
        for _ in range(2):  # the second time the statement would be prepared already
            error = await refused(gw, {"sql": sql, "params": params})
            assert (error.code, error.details["sqlstate"]) == (code, sqlstate)
            assert error.retryable is False
            assert error.details["database_message"] in error.message
        assert await _pid(gw) == before  # not mistaken for a lost connection


@pytest.mark.postgres
async def test_an_unknown_function_is_never_a_lost_connection(shop_dsn: str) -> None:
    async with Gateway.connect(shop_dsn) as gw:
        error = await refused(gw, {"sql": "SELECT nosuchfunc() AS x"})
    assert error.code != "database_unavailable"
    if error.code == "database_error":  # the analysis may also refuse it first
        assert error.details["sqlstate"] == "42883"
        assert "explicit type casts" in (error.details["database_hint"] or "")


@pytest.mark.postgres
async def test_a_json_object_parameter_is_bound_as_jsonb(shop_dsn: str) -> None:
    async with Gateway.connect(shop_dsn) as gw:
        result = await gw.query(
            AGENT, {"sql": "SELECT $1::jsonb ->> 'a' AS a", "params": [{"a": "x"}]}
        )
    assert result.rows == [{"a": "x"}]


@pytest.mark.postgres
async def test_a_write_refused_while_prepared_leaves_its_key_free(shop_dsn: str) -> None:
    sql = "INSERT INTO refunds (id, order_id, amount) VALUES ($1, 4, 'abc')"
    write: dict[str, Any] = {"sql": sql, "params": [1], "idempotency_key": "k"}
    async with Gateway.connect(shop_dsn) as gw:
        error = await refused(gw, write)
        assert (error.code, error.details["sqlstate"]) == ("invalid_data", "22P02")
        assert fetch(shop_dsn, "SELECT count(*) FROM corral.gateway_journal") == [(0,)]
        fixed = {**write, "sql": sql.replace("'abc'", "'1.50'")}
        assert (await gw.query(AGENT, fixed)).status == "ok"


# --- codes by cause ---------------------------------------------------------------------------


def _customer(id_: int, **values: Any) -> dict[str, Any]:
    row = {"id": id_, "name": "x", "email": f"x{id_}@example.com", "country": "FR"}
    return {
        "op": "insert",
        "table": "customers",
        "values": {**row, "created_at": "2024-01-01", **values},
        "idempotency_key": f"customer-{id_}-{sorted(values)}",
    }


@pytest.mark.postgres
async def test_constraint_violations_name_the_constraint(shop_dsn: str) -> None:
    async with Gateway.connect(shop_dsn) as gw:
        duplicate = await refused(gw, _customer(1))
        missing = await refused(
            gw,
            {
                "sql": "INSERT INTO customers (id, email, country, created_at) "
                "VALUES (900, 'n@example.com', 'FR', now())",
                "idempotency_key": "no-name",
            },
        )
        orphan = await refused(
            gw,
            {
                "sql": "INSERT INTO orders (id, customer_id, status, total, created_at) "
                "VALUES (900, 99999, 'open', 1, now())",
                "idempotency_key": "orphan",
            },
        )
    assert (duplicate.code, duplicate.details["sqlstate"]) == ("constraint_violation", "23505")
    assert duplicate.details["constraint"] == "customers_pkey"
    assert duplicate.details["database_detail"] == "Key (id)=(1) already exists."
    assert (missing.code, missing.details["sqlstate"]) == ("constraint_violation", "23502")
    assert (orphan.code, orphan.details["sqlstate"]) == ("constraint_violation", "23503")
    assert orphan.details["constraint"] == "orders_customer_id_fkey"
    for error in (duplicate, missing, orphan):
        assert (http_status(error), error.retryable) == (409, False)
        assert error.message.startswith("the write breaks a constraint: ")


@pytest.mark.postgres
@pytest.mark.parametrize("sqlstate", ["40001", "40P01"])
async def test_serialization_failures_and_deadlocks_are_retryable_conflicts(
    shop_dsn: str, sqlstate: str
) -> None:
    execute(shop_dsn, RAISE)
    async with Gateway.connect(shop_dsn) as gw:
        read = await refused(gw, {"sql": "SELECT gw_raise($1) AS x", "params": [sqlstate]})
        write = await refused(
            gw,
            {
                "sql": "INSERT INTO refunds (id, order_id, amount) VALUES (gw_raise($1), 4, 1)",
                "params": [sqlstate],
                "idempotency_key": "conflicted",
            },
        )
    for error in (read, write):
        assert (error.code, error.details["sqlstate"]) == ("transaction_conflict", sqlstate)
        assert (http_status(error), error.retryable) == (409, True)
        assert error.details["database_message"] == f"raised {sqlstate}"
    assert fetch(shop_dsn, "SELECT count(*) FROM corral.gateway_journal") == [(0,)]


@pytest.mark.postgres
async def test_other_classes_stay_database_errors(shop_dsn: str) -> None:
    execute(shop_dsn, RAISE)
    async with Gateway.connect(shop_dsn) as gw:
        error = await refused(gw, {"sql": "SELECT gw_raise('P0001') AS x"})
    assert (error.code, error.details["sqlstate"]) == ("database_error", "P0001")
    assert (http_status(error), error.retryable) == (500, False)


@pytest.mark.postgres
async def test_the_breakers_count_every_database_refusal_as_an_error(shop_dsn: str) -> None:
    execute(shop_dsn, RAISE)
    policy = BreakerPolicy(window_s=60, max_errors=3, max_refusals=3, max_suspicious_empties=2)
    async with Gateway.connect(shop_dsn, breaker=policy) as gw:
        codes = [
            (await refused(gw, {"sql": "SELECT 1 / 0 AS x"})).code,
            (await refused(gw, _customer(1))).code,
            (await refused(gw, {"sql": "SELECT gw_raise('40001') AS x"})).code,
        ]
        freeze = gw.status(AGENT).freeze
        assert (await refused(gw, PID)).code == "agent_frozen"
    assert codes == ["invalid_data", "constraint_violation", "transaction_conflict"]
    assert freeze is not None
    assert (freeze.signal, freeze.count) == ("errors", 3)
    assert [e.code for e in freeze.evidence] == codes


def test_sqlstate_classes_map_to_codes() -> None:
    assert sqlstate_code("22012") == sqlstate_code("22003") == "invalid_data"
    assert sqlstate_code("23514") == sqlstate_code("23P01") == "constraint_violation"
    assert sqlstate_code("40001") == sqlstate_code("40P01") == "transaction_conflict"
    for other in ("40003", "42883", "P0001", "XX000", None, ""):
        assert sqlstate_code(other) == "database_error"
    assert {c: CODES[c] for c in ("invalid_data", "constraint_violation")} == {
        "invalid_data": False,
        "constraint_violation": False,
    }
    assert CODES["transaction_conflict"] is True
    with pytest.raises(ValueError, match="not a database refusal code"):
        database_refusal("statement_timeout", "x")


def test_a_value_psycopg_cannot_load_is_invalid_data() -> None:
    error = map_error(psycopg.DataError("year 10000 is out of range"), None, statement_timeout_s=1)
    assert (error.code, error.details["sqlstate"]) == ("invalid_data", None)
    assert "could not be loaded: year 10000 is out of range" in error.message


# --- values Python cannot hold ----------------------------------------------------------------

BEYOND = (
    "SELECT 'infinity'::timestamptz AS t, '-infinity'::timestamp AS ts, "
    "'infinity'::date AS d, '12000-01-01'::date AS far, '2024-05-01'::date AS near"
)
BEYOND_ROW = {"t": "infinity", "ts": "-infinity", "d": "infinity", "far": "12000-01-01"}


@pytest.mark.postgres
async def test_dates_and_times_python_cannot_hold_come_back_as_text(shop_dsn: str) -> None:
    async with Gateway.connect(shop_dsn, pool_size=1) as gw:
        result = await gw.query(AGENT, {"sql": BEYOND})
        # A session whose read-only default changed reads in a snapshot: loaded the same.
        await gw.query(AGENT, {"sql": "SELECT gw_unlock()"})
        snapshot = await gw.query(AGENT, {"sql": BEYOND})
    for answer in (result, snapshot):
        (row,) = answer.rows
        assert {k: row[k] for k in BEYOND_ROW} == BEYOND_ROW
        assert str(row["near"]) == "2024-05-01"  # a date Python holds stays a date


@pytest.mark.postgres
async def test_a_write_returning_an_infinite_timestamp_stores_and_replays_it(
    shop_dsn: str,
) -> None:
    write = {
        "sql": "UPDATE orders SET created_at = 'infinity' WHERE id = 1 RETURNING id, created_at",
        "idempotency_key": "forever",
    }
    async with Gateway.connect(shop_dsn) as gw:
        first = await gw.query(AGENT, write)
        again = await gw.query(AGENT, write)
        read = await gw.query(AGENT, {"sql": "SELECT created_at FROM orders WHERE id = 1"})
    assert first.rows == again.rows == [{"id": 1, "created_at": "infinity"}]
    assert again.status == "replayed"
    assert read.rows == [{"created_at": "infinity"}]
