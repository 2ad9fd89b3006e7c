"""The idempotency journal: fingerprints, the result codec, replays, conflicts, its table."""

from __future__ import annotations

import asyncio
import datetime as dt
import decimal
import hashlib
import ipaddress
import json
import uuid
from typing import Any

import pytest

from corral.gateway import Gateway
from corral.gateway._journal import StoredResult, decode_result, encode_result, fingerprint
from corral.gateway.postgres import _write
from corral.gateway.postgres._journal import JournalName
from corral.gateway.postgres._plan import plan_request
from corral.kernel import InvalidArgumentError
from tests.gateway.gateway_support import AGENT, execute, fetch, refund, refused, shop_dsn

__all__ = ["shop_dsn"]


def _refund_count(dsn: str) -> int:
    return int(fetch(dsn, "SELECT count(*) FROM refunds")[0][0])


# --- pure parts -------------------------------------------------------------------------------


def test_fingerprint_covers_statement_parameters_and_plan_hash() -> None:
    base = fingerprint("INSERT INTO t VALUES ($1)", [1], "p1")
    assert base == fingerprint("INSERT INTO t VALUES ($1)", (1,), "p1")
    assert len(base) == 64
    assert int(base, 16) >= 0
    different = [
        fingerprint("INSERT INTO t VALUES ($1) ", [1], "p1"),
        fingerprint("INSERT INTO t VALUES ($1)", [2], "p1"),
        fingerprint("INSERT INTO t VALUES ($1)", ["1"], "p1"),
        fingerprint("INSERT INTO t VALUES ($1)", [True], "p1"),
        fingerprint("INSERT INTO t VALUES ($1)", [1.0], "p1"),
        fingerprint("INSERT INTO t VALUES ($1)", [1], "p2"),
        fingerprint("INSERT INTO t VALUES ($1)", [1], None),
        fingerprint("INSERT INTO t VALUES ($1)", [1], ""),
    ]
    assert len({base, *different}) == len(different) + 1


def test_fingerprints_are_the_sha256_of_the_work_as_json() -> None:
    # Journals outlive gateway versions: the text hashed must never change. Plain parameters
    # take a shortcut, which must give the same text as the general encoding.
    cases: list[tuple[str, tuple[Any, ...], str | None]] = [
        ("INSERT INTO t VALUES ($1, $2, $3)", (1, 'é " \\ \n \u2028 𝄞', None), None),
        ("UPDATE t SET a = $1", (True, False, -(10**30), ""), "plan"),
        ("DELETE FROM t", (), ""),
    ]
    for normalized, params, plan_hash in cases:
        text = json.dumps(
            [normalized, list(params), plan_hash],
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
        )
        expected = hashlib.sha256(text.encode("utf-8")).hexdigest()
        assert fingerprint(normalized, params, plan_hash) == expected
    # An object's keys are sorted.
    assert fingerprint("x", ({"b": 1, "a": 2},), None) == fingerprint(
        "x", ({"a": 2, "b": 1},), None
    )


def test_results_come_back_from_the_journal_with_their_types() -> None:
    row = {
        "n": 1,
        "f": 1.5,
        "nan": float("nan"),
        "inf": float("-inf"),
        "s": "x",
        "b": True,
        "none": None,
        "d": decimal.Decimal("12.50"),
        "ts": dt.datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=dt.UTC),
        "naive": dt.datetime(2024, 1, 2, 3, 4, 5),
        "day": dt.date(2024, 1, 2),
        "t": dt.time(3, 4, 5),
        "span": dt.timedelta(days=-1, seconds=5, microseconds=7),
        "u": uuid.UUID("12345678-1234-5678-1234-567812345678"),
        "bytes": b"\x00\xff",
        "ip": ipaddress.ip_address("10.0.0.1"),
        "net": ipaddress.ip_network("10.0.0.0/8"),
        "iface": ipaddress.ip_interface("::1/128"),
        "array": [1, [decimal.Decimal("2.5"), None]],
        "json": {"t": "decimal", "v": "not a tag", "nested": [{"a": 1}]},
        "other": complex(1, 2),
    }
    stored = StoredResult(tuple(row), [row], 1, False)
    back = decode_result(encode_result(stored))
    got = back.rows[0]
    assert back.columns == tuple(row)
    assert back.row_count == 1
    assert back.truncated is False
    for name, value in row.items():
        if name == "nan":
            assert got[name] != got[name]
        elif name == "other":
            assert got[name] == "(1+2j)"  # an unknown type comes back as its text
        else:
            assert (got[name], type(got[name])) == (value, type(value)), name


@pytest.mark.parametrize(
    ("argument", "value"),
    [("schema", "Corral"), ("table", "a-b"), ("table", 3), ("schema", "x" * 64)],
)
def test_journal_names_are_plain_identifiers(argument: str, value: Any) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        JournalName(**{argument: value})
    assert info.value.argument == argument


# --- replays and conflicts --------------------------------------------------------------------


@pytest.mark.postgres
async def test_a_write_needs_a_key(shop_dsn: str) -> None:
    async with Gateway.connect(shop_dsn) as gw:
        for request in (
            refund(1, key=None),
            {"sql": "UPDATE orders SET status = 'x' WHERE id = 1"},
            {"sql": "SELECT nextval('invoice_numbers')"},
        ):
            error = await refused(gw, request)
            assert error.code == "idempotency_key_required"
            assert "idempotency_key" in error.message
    assert _refund_count(shop_dsn) == 0


@pytest.mark.postgres
async def test_the_same_key_and_work_is_replayed_without_running_again(shop_dsn: str) -> None:
    async with Gateway.connect(shop_dsn) as gw:
        first = await gw.query(AGENT, refund(1))
        again = await gw.query(AGENT, refund(1))
    assert first.status == "ok"
    assert first.row_count == 1
    assert first.rows == [{"id": 1, "order_id": 4, "amount": decimal.Decimal("5.00")}]
    assert again.status == "replayed"
    assert (again.rows, again.columns, again.row_count) == (first.rows, first.columns, 1)
    assert _refund_count(shop_dsn) == 1

    # After a restart the journal answers and the write is not run: had it run, the row
    # deleted here would be back.
    execute(shop_dsn, "DELETE FROM refunds")
    async with Gateway.connect(shop_dsn) as gw:
        replayed = await gw.query(AGENT, refund(1))
    assert replayed.status == "replayed"
    assert replayed.rows == first.rows
    assert type(replayed.rows[0]["amount"]) is decimal.Decimal
    assert _refund_count(shop_dsn) == 0
    journal = fetch(shop_dsn, "SELECT agent_id, key, state FROM corral.gateway_journal")
    assert journal == [(AGENT, "refund-1", "completed")]


@pytest.mark.postgres
async def test_the_same_key_for_other_work_is_a_conflict_before_and_after_restart(
    shop_dsn: str,
) -> None:
    async with Gateway.connect(shop_dsn) as gw:
        await gw.query(AGENT, refund(1, plan_hash="p1"))
        for other in (refund(1, "6.00", plan_hash="p1"), refund(2, plan_hash="p1")):
            error = await refused(gw, other)
            assert error.code == "idempotency_conflict"
            assert error.retryable is False
            assert error.details["key"] == "refund-1"
            assert "new key" in error.message
        sql = await refused(
            gw,
            {
                "sql": "DELETE FROM refunds WHERE id = $1",
                "params": [1],
                "idempotency_key": "refund-1",
                "plan_hash": "p1",
            },
        )
        assert sql.code == "idempotency_conflict"
    async with Gateway.connect(shop_dsn) as gw:
        error = await refused(gw, refund(1, "7.00", plan_hash="p1"))
        assert error.code == "idempotency_conflict"
        assert (await gw.query(AGENT, refund(1, plan_hash="p1"))).status == "replayed"
    assert _refund_count(shop_dsn) == 1


@pytest.mark.postgres
async def test_sql_writes_with_the_same_normalised_text_are_the_same_work(shop_dsn: str) -> None:
    async with Gateway.connect(shop_dsn) as gw:
        first = await gw.query(
            AGENT,
            {
                "sql": "UPDATE orders SET status = $1 WHERE id = $2 RETURNING id, status",
                "params": ["paid", 5],
                "idempotency_key": "pay-5",
            },
        )
        second = await gw.query(
            AGENT,
            {
                "sql": "update orders /* retry */ set status = $1\n where id = $2 "
                "returning id, status",
                "params": ["paid", 5],
                "idempotency_key": "pay-5",
            },
        )
    assert first.status == "ok"
    assert second.status == "replayed"
    assert second.rows == [{"id": 5, "status": "paid"}]


@pytest.mark.postgres
async def test_keys_belong_to_their_agent(shop_dsn: str) -> None:
    async with Gateway.connect(shop_dsn) as gw:
        mine = await gw.query("agent-a", refund(1))
        theirs = await gw.query("agent-b", refund(2))
    assert (mine.status, theirs.status) == ("ok", "ok")
    assert _refund_count(shop_dsn) == 2


@pytest.mark.postgres
async def test_a_failed_write_leaves_its_key_free(shop_dsn: str) -> None:
    execute(shop_dsn, "INSERT INTO refunds VALUES (1, 4, 1)")
    async with Gateway.connect(shop_dsn) as gw:
        error = await refused(gw, refund(1))
        assert (error.code, error.details["sqlstate"]) == ("constraint_violation", "23505")
        assert fetch(shop_dsn, "SELECT count(*) FROM corral.gateway_journal") == [(0,)]
        execute(shop_dsn, "DELETE FROM refunds")
        retried = await gw.query(AGENT, refund(1))
    assert retried.status == "ok"
    assert _refund_count(shop_dsn) == 1


@pytest.mark.postgres
async def test_a_journal_row_without_an_outcome_is_outcome_unknown(shop_dsn: str) -> None:
    async with Gateway.connect(shop_dsn) as gw:
        planned = plan_request(refund(1), gw.catalog)
        fp = fingerprint(planned.normalized(), planned.params, planned.plan_hash)
        execute(
            shop_dsn,
            "INSERT INTO corral.gateway_journal "
            "(agent_id, key, plan_hash, fingerprint, state, created_at) "
            f"VALUES ('{AGENT}', 'refund-1', '', '{fp}', 'running', now())",
        )
        error = await refused(gw, refund(1))
        assert error.code == "outcome_unknown"
        assert error.retryable is False
        assert "new key" in error.message
        other = await refused(gw, refund(2))
        assert other.code == "idempotency_conflict"
    assert _refund_count(shop_dsn) == 0


@pytest.mark.postgres
async def test_write_results_over_max_rows_are_cut_in_the_answer_and_the_journal(
    shop_dsn: str,
) -> None:
    request = {
        "sql": "UPDATE orders SET status = status RETURNING id",
        "idempotency_key": "all",
    }
    async with Gateway.connect(shop_dsn, max_rows=2) as gw:
        first = await gw.query(AGENT, request)
    async with Gateway.connect(shop_dsn, max_rows=2) as gw:
        replayed = await gw.query(AGENT, request)
    assert first.row_count == 10
    assert len(first.rows) == 2
    assert first.truncated
    assert (replayed.status, replayed.row_count, replayed.rows, replayed.truncated) == (
        "replayed",
        10,
        first.rows,
        True,
    )


@pytest.mark.postgres
async def test_gateways_starting_together_create_one_journal(shop_dsn: str) -> None:
    gateways = await asyncio.gather(*(Gateway.connect(shop_dsn) for _ in range(5)))
    for gw in gateways:
        await gw.close()
    assert fetch(shop_dsn, "SELECT to_regclass('corral.gateway_journal') IS NOT NULL") == [(True,)]


@pytest.mark.postgres
async def test_the_journal_can_live_elsewhere(shop_dsn: str) -> None:
    async with Gateway.connect(shop_dsn, journal_schema="ops", journal_table="keys") as gw:
        await gw.query(AGENT, refund(1))
        assert gw.catalog.table("ops.keys") is None
    assert fetch(shop_dsn, "SELECT key FROM ops.keys") == [("refund-1",)]


# --- the wire: one round trip for writes without RETURNING ------------------------------------


@pytest.mark.postgres
async def test_a_write_without_returning_completes_its_journal_row_in_its_own_statement(
    shop_dsn: str,
) -> None:
    request = {
        # A trailing semicolon and comment: the write is wrapped, so both must be left out.
        "sql": "UPDATE orders SET status = $1 WHERE status = $2; -- settle them",
        "params": ["settled", "paid"],
        "idempotency_key": "settle",
    }
    paid = int(fetch(shop_dsn, "SELECT count(*) FROM orders WHERE status = 'paid'")[0][0])
    assert paid > 1
    async with Gateway.connect(shop_dsn) as gw:
        first = await gw.query(AGENT, request)
    assert (first.status, first.row_count, first.rows, first.columns) == ("ok", paid, [], ())
    journal = fetch(shop_dsn, "SELECT state, result FROM corral.gateway_journal")
    assert journal == [
        ("completed", {"columns": [], "rows": [], "row_count": paid, "truncated": False})
    ]
    assert decode_result(journal[0][1]) == StoredResult((), [], paid, False)
    # After a restart the journal answers; had the write run again it would match nothing.
    execute(shop_dsn, "UPDATE orders SET status = 'paid' WHERE status = 'settled'")
    async with Gateway.connect(shop_dsn) as gw:
        replayed = await gw.query(AGENT, request)
    assert (replayed.status, replayed.row_count) == ("replayed", paid)
    assert fetch(shop_dsn, "SELECT count(*) FROM orders WHERE status = 'settled'") == [(0,)]


@pytest.mark.postgres
async def test_writes_of_every_shape_are_journalled_with_their_write(shop_dsn: str) -> None:
    requests: list[dict[str, Any]] = [
        # Its own WITH: runs as it is, its rows stored in a second round trip.
        {
            "sql": "WITH moved AS (UPDATE orders SET status = 'held' WHERE id = $1 "
            "RETURNING id) SELECT count(*) AS n FROM moved",
            "params": [2],
            "idempotency_key": "with",
        },
        {"op": "insert", "table": "refunds", "values": [{"id": 7, "order_id": 1, "amount": 1}]},
        {"op": "delete", "table": "refunds", "where": {"id": 7}},
        {"sql": "INSERT INTO notes DEFAULT VALUES", "idempotency_key": "defaults"},
    ]
    expected = [([{"n": 1}], 1), ([], 1), ([], 1), ([], 1)]
    for n, request in enumerate(requests):
        request.setdefault("idempotency_key", f"op-{n}")
    execute(shop_dsn, "CREATE TABLE notes (id serial PRIMARY KEY, body text)")
    async with Gateway.connect(shop_dsn) as gw:
        for request, (rows, count) in zip(requests, expected, strict=True):
            result = await gw.query(AGENT, request)
            assert (result.status, result.rows, result.row_count) == ("ok", rows, count)
    async with Gateway.connect(shop_dsn) as gw:
        for request, (rows, count) in zip(requests, expected, strict=True):
            result = await gw.query(AGENT, request)
            assert (result.status, result.rows, result.row_count) == ("replayed", rows, count)
    states = fetch(shop_dsn, "SELECT DISTINCT state FROM corral.gateway_journal")
    assert states == [("completed",)]
    assert fetch(shop_dsn, "SELECT id FROM notes") == [(1,)]


@pytest.mark.postgres
async def test_a_write_postgres_refuses_inside_with_runs_unwrapped(shop_dsn: str) -> None:
    # DO INSTEAD rules are not supported in data-modifying WITH: the wrapped form fails and
    # the write runs as it is, still with its journal row in its transaction.
    execute(
        shop_dsn,
        "CREATE TABLE ruled (n integer)",
        "CREATE TABLE ruled_log (n integer)",
        "CREATE RULE ruled_redirect AS ON INSERT TO ruled DO INSTEAD "
        "INSERT INTO ruled_log VALUES (NEW.n)",
    )

    def ruled(n: int) -> dict[str, Any]:
        sql = "INSERT INTO ruled (n) VALUES ($1)"
        return {"sql": sql, "params": [n], "idempotency_key": f"ruled-{n}"}

    async with Gateway.connect(shop_dsn) as gw:
        for n in range(3):
            request = ruled(n)
            result = await gw.query(AGENT, request)
            assert (result.status, result.row_count) == ("ok", 1)
            assert (await gw.query(AGENT, request)).status == "replayed"
    async with Gateway.connect(shop_dsn) as gw:
        again = await gw.query(AGENT, ruled(0))
        assert (again.status, again.row_count) == ("replayed", 1)
    assert fetch(shop_dsn, "SELECT n FROM ruled_log ORDER BY n") == [(0,), (1,), (2,)]
    assert b"INSERT INTO ruled (n) VALUES ($1)" in _write._UNWRAPPED  # tried wrapped once
    assert fetch(shop_dsn, "SELECT count(*) FROM corral.gateway_journal") == [(3,)]


@pytest.mark.postgres
async def test_a_write_refused_at_commit_leaves_its_key_free(shop_dsn: str) -> None:
    # A deferred constraint is checked by COMMIT, sent in the write's round trip: the journal
    # row goes with the write.
    execute(
        shop_dsn,
        "CREATE TABLE claims (refund_id integer REFERENCES refunds (id) "
        "DEFERRABLE INITIALLY DEFERRED)",
    )
    request = {
        "sql": "INSERT INTO claims (refund_id) VALUES ($1)",
        "params": [42],
        "idempotency_key": "claim-42",
    }
    async with Gateway.connect(shop_dsn) as gw:
        error = await refused(gw, request)
        assert (error.code, error.details["sqlstate"]) == ("constraint_violation", "23503")
        assert fetch(shop_dsn, "SELECT count(*) FROM corral.gateway_journal") == [(0,)]
        execute(shop_dsn, "INSERT INTO refunds VALUES (42, 4, 1)")
        assert (await gw.query(AGENT, request)).status == "ok"
        assert (await gw.query(AGENT, request)).status == "replayed"
    assert fetch(shop_dsn, "SELECT count(*) FROM claims") == [(1,)]
