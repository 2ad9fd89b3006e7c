"""Structured operations compiled to SQL: the text, the refusals, and the rows on real engines."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

import psycopg
import pytest

from corral.daemon import http_status
from corral.gateway import GatewayError, compile_operation
from corral.gateway._catalog import Catalog, Column, Table
from corral.gateway._catalog_load import load_postgres_catalog, load_sqlite_catalog
from corral.gateway._ops import MAX_PARAMS, CompiledOperation, quote_identifier
from corral.kernel import InvalidArgumentError

ODD = 'Order "Items" %x'  # spaces, a double quote, upper case and a psycopg placeholder sign
DIALECTS = ("postgresql", "sqlite")
MARK = {"postgresql": "%s", "sqlite": "?"}
Q_ORDERS = {"postgresql": '"public"."orders"', "sqlite": '"orders"'}
Q_ODD = {"postgresql": '"public"."Order ""Items"" %%x"', "sqlite": '"Order ""Items"" %x"'}
ESCAPE = {"postgresql": "E'\\\\'", "sqlite": "'\\'"}

PG_DDL = [
    "CREATE TABLE orders (id integer PRIMARY KEY, status text, total double precision,"
    " note text, meta jsonb, doc json, tags text[], paid boolean)",
    'CREATE TABLE "Order ""Items"" %x" ("Item Name" text, "QTY" integer, "pct%" real, "a""b" text)',
]
SQLITE_DDL = [
    "CREATE TABLE orders (id INTEGER PRIMARY KEY, status TEXT, total REAL, note TEXT,"
    " meta TEXT, paid INTEGER)",
    'CREATE TABLE "Order ""Items"" %x" ("Item Name" TEXT, "QTY" INTEGER, "pct%" REAL, "a""b" TEXT)',
]


def make_catalog(dialect: str) -> Catalog:
    """The tables the DDL above creates, keyed as the loaders key them (tables lower case,
    columns by their own spelling), plus a table whose column names differ only by case."""
    pg = dialect == "postgresql"
    orders = [
        Column("id", "integer", nullable=False, primary_key=True),
        Column("status", "text"),
        Column("total", "double precision" if pg else "real"),
        Column("note", "text"),
        Column("meta", "jsonb" if pg else "text"),
        Column("paid", "boolean" if pg else "integer"),
    ]
    if pg:
        orders += [Column("doc", "json"), Column("tags", "text[]")]
    odd = [Column("Item Name", "text"), Column("QTY", "integer"), Column("pct%", "real")]
    odd.append(Column('a"b', "text"))
    schema = "public" if pg else None
    mixed = [Column("Code", "text"), Column("code", "text")]
    tables = {
        "orders": Table("orders", schema, {c.name: c for c in orders}),
        ODD.lower(): Table(ODD, schema, {c.name: c for c in odd}),
        "mixed": Table("mixed", schema, {c.name: c for c in mixed}),
    }
    return Catalog(tables, version="v1", dialect=dialect)


CATALOGS = {d: make_catalog(d) for d in DIALECTS}


def comp(request: Mapping[str, Any], dialect: str = "sqlite") -> CompiledOperation:
    return compile_operation(request, CATALOGS[dialect])


def refusal(request: Any, dialect: str = "sqlite") -> GatewayError:
    with pytest.raises(GatewayError) as info:
        compile_operation(request, CATALOGS[dialect])
    return info.value


def find(where: Any, **extra: Any) -> dict[str, Any]:
    return {"op": "find", "table": "orders", "where": where, **extra}


# --- SQL text, per op and per operator ----------------------------------------------------


@pytest.mark.parametrize("dialect", DIALECTS)
def test_each_op_compiles_to_quoted_parameterised_sql(dialect: str) -> None:
    m, t = MARK[dialect], Q_ORDERS[dialect]
    nulls = ("", "") if dialect == "postgresql" else (" NULLS LAST", " NULLS FIRST")
    got = comp(
        {
            "op": "find",
            "table": "orders",
            "columns": ["id", "status"],
            "where": {"status": "open"},
            "order_by": ["-total", "id"],
            "limit": 50,
            "offset": 10,
        },
        dialect,
    )
    assert got.sql == (
        f'SELECT "id", "status" FROM {t} WHERE "status" = {m} ORDER BY "total" DESC{nulls[1]},'
        f' "id" ASC{nulls[0]} LIMIT {m} OFFSET {m}'
    )
    assert got.params == ("open", 50, 10)
    assert (got.kind, got.op, got.table, got.filtered) == ("read", "find", "orders", True)
    assert got.exists_sql == f"SELECT EXISTS (SELECT 1 FROM {t})"

    got = comp({"op": "count", "table": "orders", "where": {"id": {"gt": 3}}}, dialect)
    assert got.sql == f'SELECT COUNT(*) AS "count" FROM {t} WHERE "id" > {m}'
    assert (got.params, got.kind, got.filtered) == ((3,), "read", True)

    got = comp(
        {
            "op": "insert",
            "table": "orders",
            "values": {"status": "new", "id": 9},
            "returning": ["id"],
        },
        dialect,
    )
    assert got.sql == f'INSERT INTO {t} ("id", "status") VALUES ({m}, {m}) RETURNING "id"'
    assert (got.params, got.kind, got.filtered, got.exists_sql) == (
        (9, "new"),
        "write",
        False,
        None,
    )

    rows = [{"id": 1, "status": "a"}, {"status": "b", "id": 2}]
    got = comp({"op": "insert", "table": "orders", "values": rows, "returning": True}, dialect)
    assert got.sql == f'INSERT INTO {t} ("id", "status") VALUES ({m}, {m}), ({m}, {m}) RETURNING *'
    assert got.params == (1, "a", 2, "b")

    got = comp(
        {
            "op": "update",
            "table": "orders",
            "where": {"id": 7},
            "set": {"status": "paid", "note": "x"},
        },
        dialect,
    )
    assert got.sql == f'UPDATE {t} SET "note" = {m}, "status" = {m} WHERE "id" = {m}'
    assert (got.params, got.kind, got.filtered) == (("x", "paid", 7), "write", False)

    got = comp(
        {"op": "update", "table": "orders", "all_rows": True, "set": {"note": None}}, dialect
    )
    assert (got.sql, got.params) == (f'UPDATE {t} SET "note" = {m}', (None,))

    got = comp(
        {"op": "delete", "table": "orders", "where": {"id": 7}, "returning": ["id"]}, dialect
    )
    assert got.sql == f'DELETE FROM {t} WHERE "id" = {m} RETURNING "id"'
    got = comp({"op": "delete", "table": "orders", "all_rows": True}, dialect)
    assert (got.sql, got.params, got.kind) == (f"DELETE FROM {t}", (), "write")

    got = comp({"op": "find", "table": "orders"}, dialect)
    assert (got.sql, got.params, got.filtered, got.exists_sql) == (
        f"SELECT * FROM {t}",
        (),
        False,
        None,
    )


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize(
    ("condition", "clause", "params"),
    [
        ("open", '"status" = {m}', ("open",)),
        (None, '"status" IS NULL', ()),
        ({"eq": "open"}, '"status" = {m}', ("open",)),
        ({"eq": None}, '"status" IS NULL', ()),
        ({"ne": "open"}, '"status" <> {m}', ("open",)),
        ({"ne": None}, '"status" IS NOT NULL', ()),
        ({"lt": "m"}, '"status" < {m}', ("m",)),
        ({"lte": "m"}, '"status" <= {m}', ("m",)),
        ({"gt": "m"}, '"status" > {m}', ("m",)),
        ({"gte": "m"}, '"status" >= {m}', ("m",)),
        ({"in": ["a", "b"]}, '"status" IN ({m}, {m})', ("a", "b")),
        ({"like": "op%"}, '"status" LIKE {m} ESCAPE {e}', ("op%",)),
        ({"is_null": True}, '"status" IS NULL', ()),
        ({"is_null": False}, '"status" IS NOT NULL', ()),
        ({"gte": "a", "lt": "n"}, '"status" >= {m} AND "status" < {m}', ("a", "n")),
    ],
)
def test_every_operator(dialect: str, condition: Any, clause: str, params: tuple[Any, ...]) -> None:
    got = comp(find({"status": condition}), dialect)
    expected = clause.format(m=MARK[dialect], e=ESCAPE[dialect])
    assert got.sql == f"SELECT * FROM {Q_ORDERS[dialect]} WHERE {expected}"
    assert got.params == params
    assert got.filtered


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize(
    ("paging", "filtered"),
    [
        ({"offset": 100}, True),  # past the last row, the answer is empty
        ({"limit": 5, "offset": 1}, True),
        ({"offset": 0}, False),
        ({"limit": 1}, False),  # at least one row of a table that has any
        ({}, False),
    ],
)
def test_an_offset_counts_as_a_filter(dialect: str, paging: dict[str, Any], filtered: bool) -> None:
    got = comp({"op": "find", "table": "orders", **paging}, dialect)
    assert got.filtered is filtered
    expected = f"SELECT EXISTS (SELECT 1 FROM {Q_ORDERS[dialect]})" if filtered else None
    assert got.exists_sql == expected


@pytest.mark.parametrize("dialect", DIALECTS)
def test_fields_are_anded_in_column_order(dialect: str) -> None:
    got = comp(find({"total": {"gt": 1}, "status": "open", "ID": 3}), dialect)
    m = MARK[dialect]
    assert got.sql.endswith(f'WHERE "id" = {m} AND "status" = {m} AND "total" > {m}')
    assert got.params == (3, "open", 1)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_odd_identifiers_are_quoted(dialect: str) -> None:
    m = MARK[dialect]
    pct = '"pct%%"' if dialect == "postgresql" else '"pct%"'
    got = comp(
        {
            "op": "find",
            "table": ODD,
            "columns": ["Item Name", 'a"b', "pct%"],
            "where": {"qty": {"gte": 2}, 'A"B': "x"},
            "order_by": ["-QTY"],
        },
        dialect,
    )
    order = ' ORDER BY "QTY" DESC' + ("" if dialect == "postgresql" else " NULLS FIRST")
    assert got.sql == (
        f'SELECT "Item Name", "a""b", {pct} FROM {Q_ODD[dialect]} WHERE "QTY" >= {m}'
        f' AND "a""b" = {m}{order}'
    )
    assert got.table == ODD
    assert quote_identifier('x"y%', "postgresql") == '"x""y%%"'
    assert quote_identifier('x"y%', "sqlite") == '"x""y%"'


def test_lookups_ignore_case_and_use_the_catalog_spelling() -> None:
    got = comp({"op": "find", "table": "ORDERS", "columns": ["Status"]})
    assert got.sql == 'SELECT "status" FROM "orders"'
    assert got.table == "orders"
    got = comp({"op": "find", "table": ODD, "where": {"qty": 1, "ITEM NAME": "x"}}, "postgresql")
    assert got.sql.endswith('WHERE "Item Name" = %s AND "QTY" = %s')
    assert comp(find({"status": "x"})).normalized == comp(find({"STATUS": "x"})).normalized


def test_columns_differing_only_by_case_need_the_exact_name() -> None:
    got = comp({"op": "find", "table": "mixed", "where": {"Code": 1, "code": 2}})
    assert got.sql == 'SELECT * FROM "mixed" WHERE "Code" = ? AND "code" = ?'
    err = refusal({"op": "find", "table": "mixed", "where": {"CODE": 1}})
    assert err.code == "unknown_column"
    assert err.details["suggestions"] == ["Code", "code"]
    assert "differ only by case" in err.message


def test_suggestions_keep_the_catalog_spelling() -> None:
    err = refusal({"op": "find", "table": ODD, "columns": ["qyt", "item nme"]})
    assert [p["details"]["suggestions"] for p in err.details["problems"]] == [
        ["QTY"],
        ["Item Name"],
    ]


# --- values --------------------------------------------------------------------------------


def test_postgresql_json_array_and_typed_values() -> None:
    got = comp(
        {
            "op": "insert",
            "table": "orders",
            "values": {"id": "5", "meta": {"b": [1, {"c": None}], "a": "x"}, "tags": ["a", "b"]},
        },
        "postgresql",
    )
    assert got.sql.endswith('("id", "meta", "tags") VALUES (%s, CAST(%s AS jsonb), %s)')
    assert got.params == ("5", '{"a":"x","b":[1,{"c":null}]}', ["a", "b"])
    got = comp(find({"meta": {"eq": {"a": 1}}, "tags": {"eq": ["a"]}}), "postgresql")
    assert got.sql.endswith('"meta" = CAST(%s AS jsonb) AND "tags" = %s')
    assert got.params == ('{"a":1}', ["a"])
    got = comp(
        {"op": "update", "table": "orders", "where": {"id": 1}, "set": {"doc": "s"}}, "postgresql"
    )
    assert got.sql.endswith('SET "doc" = CAST(%s AS json) WHERE "id" = %s')
    assert got.params == ('"s"', 1)  # a string for a JSON column is a JSON string


def test_sqlite_stores_json_as_text() -> None:
    got = comp(
        {"op": "insert", "table": "orders", "values": {"id": 1, "meta": {"b": 1, "a": [True]}}}
    )
    assert got.params == (1, '{"a":[true],"b":1}')


@pytest.mark.parametrize("dialect", DIALECTS)
def test_injection_in_values_only_reaches_params(dialect: str) -> None:
    evil = ["'; DROP TABLE orders; --", '" OR 1=1 --', "%s", "?", "\\'; SELECT 1"]
    got = comp(find({"status": {"in": evil}, "note": {"like": "%'--%"}}), dialect)
    plain = comp(find({"status": {"in": ["a"] * len(evil)}, "note": {"like": "b"}}), dialect)
    assert got.sql == plain.sql  # the text does not depend on the values
    assert got.params == ("%'--%", *evil)
    for text in ["DROP", "--", "1=1", "SELECT 1"]:
        assert text not in got.sql
    got = comp({"op": "insert", "table": "orders", "values": {"note": evil[0]}}, dialect)
    assert "DROP" not in got.sql
    assert got.params == (evil[0],)


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize(
    ("request_", "code", "key"),
    [
        (find({'status" = 1 OR 1=1 --': "x"}), "unknown_column", 'where.status" = 1 OR 1=1 --'),
        (find({"status": {"eq) OR (1=1": "x"}}), "invalid_operation", "where.status.eq) OR (1=1"),
        ({"op": "find", "table": "orders; DROP TABLE orders"}, "unknown_table", None),
        ({"op": "find; DROP TABLE orders", "table": "orders"}, "invalid_operation", "op"),
        ({"op": "find", "table": "orders", "columns": ["*"]}, "unknown_column", "columns[0]"),
        (
            {"op": "find", "table": "orders", "order_by": ["id; DROP"]},
            "unknown_column",
            "order_by[0]",
        ),
        ({"op": "find", "table": "orders", "limit": "1; DROP"}, "invalid_operation", "limit"),
        ({"op": "find", "table": "orders", "1=1; --": 1}, "invalid_operation", "1=1; --"),
    ],
)
def test_injection_in_keys_operators_and_names_is_refused(
    dialect: str, request_: dict[str, Any], code: str, key: str | None
) -> None:
    err = refusal(request_, dialect)
    assert err.code == code
    if key is not None:
        assert err.details["key"] == key


# --- refusals ------------------------------------------------------------------------------


def test_unknown_table_suggests_close_names() -> None:
    err = refusal({"op": "find", "table": "ordrs"})
    assert (err.code, http_status(err), err.retryable) == ("unknown_table", 400, False)
    assert err.details["table"] == "ordrs"
    assert err.details["suggestions"] == ["orders"]
    assert "ordrs" in err.message
    assert "orders" in err.message


@pytest.mark.parametrize(
    ("request_", "key"),
    [
        (find({"stauts": "open"}), "where.stauts"),
        ({"op": "find", "table": "orders", "columns": ["stauts"]}, "columns[0]"),
        ({"op": "find", "table": "orders", "order_by": ["-stauts"]}, "order_by[0]"),
        ({"op": "insert", "table": "orders", "values": {"stauts": "x"}}, "values.stauts"),
        ({"op": "insert", "table": "orders", "values": [{"stauts": "x"}]}, "values[0].stauts"),
        ({"op": "update", "table": "orders", "all_rows": True, "set": {"stauts": 1}}, "set.stauts"),
        (
            {"op": "delete", "table": "orders", "all_rows": True, "returning": ["stauts"]},
            "returning[0]",
        ),
    ],
)
def test_unknown_column_anywhere_suggests_close_names(request_: dict[str, Any], key: str) -> None:
    err = refusal(request_)
    assert err.code == "unknown_column"
    assert err.details["table"] == "orders"
    assert err.details["column"] == "stauts"
    assert err.details["key"] == key
    assert err.details["suggestions"] == ["status"]
    assert "stauts" in err.message
    assert key in err.message


INVALID: list[tuple[Any, str, str]] = [
    # (request, key, value as shown)
    ({"op": "frobnicate", "table": "orders"}, "op", "'frobnicate'"),
    ({"table": "orders"}, "op", "None"),
    ({"op": "find"}, "table", "None"),
    ({"op": "find", "table": 3}, "table", "3"),
    (find({"status": {"equals": "x"}}), "where.status.equals", "'equals'"),
    (find({"status": {}}), "where.status", "{}"),
    (find({"status": ["a", "b"]}), "where.status", "['a', 'b']"),
    (find({"status": {"in": "abc"}}), "where.status.in", "'abc'"),
    (find({"status": {"in": []}}), "where.status.in", "[]"),
    (find({"status": {"in": ["a", None]}}), "where.status.in", "['a', None]"),
    (find({"status": {"lt": None}}), "where.status.lt", "None"),
    (find({"status": {"gt": {"a": 1}}}), "where.status.gt", "{'a': 1}"),
    (find({"status": {"like": 5}}), "where.status.like", "5"),
    (find({"status": {"like": "ab\\"}}), "where.status.like", "'ab\\\\'"),
    (find({"status": {"is_null": "yes"}}), "where.status.is_null", "'yes'"),
    (find({"status": {"eq": {"a": 1}}}), "where.status.eq", "{'a': 1}"),
    (find({"status": "a", "STATUS": "b"}), "where.STATUS", "'STATUS'"),
    (find("status = 1"), "where", "'status = 1'"),
    ({"op": "find", "table": "orders", "limit": 0}, "limit", "0"),
    ({"op": "find", "table": "orders", "limit": -1}, "limit", "-1"),
    ({"op": "find", "table": "orders", "limit": 1.5}, "limit", "1.5"),
    ({"op": "find", "table": "orders", "limit": True}, "limit", "True"),
    ({"op": "find", "table": "orders", "limit": 2**63}, "limit", str(2**63)),
    ({"op": "find", "table": "orders", "offset": -1}, "offset", "-1"),
    ({"op": "find", "table": "orders", "columns": []}, "columns", "[]"),
    ({"op": "find", "table": "orders", "columns": "id"}, "columns", "'id'"),
    ({"op": "find", "table": "orders", "columns": ["id", "ID"]}, "columns[1]", "'ID'"),
    ({"op": "find", "table": "orders", "order_by": "id"}, "order_by", "'id'"),
    ({"op": "find", "table": "orders", "wehre": {}}, "wehre", "{}"),
    ({"op": "count", "table": "orders", "limit": 5}, "limit", "5"),
    (
        {"op": "insert", "table": "orders", "where": {"id": 1}, "values": {"id": 1}},
        "where",
        "{'id': 1}",
    ),
    ({"op": "insert", "table": "orders"}, "values", "None"),
    ({"op": "insert", "table": "orders", "values": {}}, "values", "{}"),
    ({"op": "insert", "table": "orders", "values": []}, "values", "[]"),
    ({"op": "insert", "table": "orders", "values": [{"id": 1}, 2]}, "values[1]", "2"),
    (
        {"op": "insert", "table": "orders", "values": [{"id": 1}, {"id": 2, "note": "x"}]},
        "values[1]",
        "['id', 'note']",
    ),
    ({"op": "insert", "table": "orders", "values": {"note": b"x"}}, "values.note", "b'x'"),
    ({"op": "insert", "table": "orders", "values": {"note": float("nan")}}, "values.note", "nan"),
    ({"op": "insert", "table": "orders", "values": {"id": 2**63}}, "values.id", str(2**63)),
    ({"op": "insert", "table": "orders", "values": {"meta": {1: "x"}}}, "values.meta", "1"),
    ({"op": "insert", "table": "orders", "values": {"id": 1}, "returning": []}, "returning", "[]"),
    ({"op": "update", "table": "orders", "set": {"note": "x"}}, "where", "None"),
    ({"op": "update", "table": "orders", "where": {}, "set": {"note": "x"}}, "where", "{}"),
    ({"op": "update", "table": "orders", "where": {"id": 1}}, "set", "None"),
    ({"op": "update", "table": "orders", "where": {"id": 1}, "set": {}}, "set", "{}"),
    ({"op": "update", "table": "orders", "all_rows": 1, "set": {"note": "x"}}, "all_rows", "1"),
    ({"op": "delete", "table": "orders"}, "where", "None"),
    ({"op": "delete", "table": "orders", "all_rows": False}, "where", "None"),
    ({"op": "delete", "table": "orders", "all_rows": True, "where": {"id": 1}}, "all_rows", "True"),
    ({"op": "delete", "table": "orders", "where": {"id": 1}, "limit": 1}, "limit", "1"),
    ({"op": "find", "table": "orders", "idempotency_key": 5}, "idempotency_key", "5"),
    ({"op": "find", "table": "orders", "plan_hash": ""}, "plan_hash", "''"),
]


@pytest.mark.parametrize(("request_", "key", "shown"), INVALID)
def test_malformed_requests_are_refused_naming_key_and_value(
    request_: dict[str, Any], key: str, shown: str
) -> None:
    err = refusal(request_)
    assert (err.code, http_status(err), err.retryable) == ("invalid_operation", 400, False)
    assert err.details["key"] == key
    assert err.details["value"] == shown
    assert key in err.message
    assert shown in err.message
    assert err.to_dict()["details"]["problems"][0]["details"]["key"] == key


def test_misspelt_keys_and_operators_get_suggestions() -> None:
    assert refusal({"op": "find", "table": "orders", "wehre": {}}).details["suggestions"] == [
        "where"
    ]
    err = refusal(find({"status": {"gtee": 1}}))
    assert err.details["suggestions"][0] == "gte"


def test_a_request_that_is_not_a_mapping_is_refused() -> None:
    err = refusal(["find", "orders"])
    assert err.code == "invalid_operation"
    assert err.details["key"] == "request"


@pytest.mark.parametrize("catalog", [None, "orders", Catalog({}, "v", "mysql")])
def test_a_bad_catalog_is_an_invalid_argument(catalog: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="catalog must be a Catalog"):
        compile_operation({"op": "find", "table": "orders"}, catalog)


@pytest.mark.parametrize(
    ("request_", "key"),
    [
        (find({"id": {"eq": True}}), "where.id.eq"),  # integer = boolean: no such operator
        (find({"status": {"eq": 5}}), "where.status.eq"),  # text = integer
        (find({"paid": {"eq": 1}}), "where.paid.eq"),
        (find({"total": {"lt": False}}), "where.total.lt"),
        (find({"tags": {"eq": {"a": 1}}}), "where.tags.eq"),
        (find({"doc": {"eq": {"a": 1}}}), "where.doc.eq"),  # json has no equality
        (find({"id": {"like": "1%"}}), "where.id.like"),
        (find({"meta": {"like": "x"}}), "where.meta.like"),
        ({"op": "insert", "table": "orders", "values": {"status": 5}}, "values.status"),
        ({"op": "insert", "table": "orders", "values": {"note": {"a": 1}}}, "values.note"),
        ({"op": "insert", "table": "orders", "values": {"note": "a\x00b"}}, "values.note"),
    ],
)
def test_postgresql_refuses_values_the_column_type_never_accepts(
    request_: dict[str, Any], key: str
) -> None:
    err = refusal(request_, "postgresql")
    assert err.code == "invalid_operation"
    assert err.details["key"] == key


def test_postgresql_accepts_what_the_column_type_can_read() -> None:
    got = comp(
        find({"id": {"eq": "7"}, "total": {"gt": 1}, "paid": True, "doc": None}), "postgresql"
    )
    assert got.params == ("7", True, 1)
    assert '"doc" IS NULL' in got.sql
    assert comp(find({"meta": {"in": ["a", 1]}}), "postgresql").params == ('"a"', "1")


def test_sqlite_refuses_json_comparisons() -> None:
    err = refusal(find({"meta": {"eq": {"a": 1}}}))
    assert err.code == "invalid_operation"
    assert err.details["key"] == "where.meta.eq"


def test_too_many_values_are_refused() -> None:
    err = refusal(find({"id": {"in": list(range(MAX_PARAMS + 1))}}))
    assert err.code == "invalid_operation"
    assert err.details["limit"] == MAX_PARAMS
    assert str(MAX_PARAMS + 1) in err.message
    assert len(comp(find({"id": {"in": list(range(MAX_PARAMS))}})).params) == MAX_PARAMS


def test_deeply_nested_json_is_refused() -> None:
    value: Any = 1
    for _ in range(100):
        value = [value]
    err = refusal({"op": "insert", "table": "orders", "values": {"meta": value}})
    assert err.code == "invalid_operation"
    assert "64" in err.message


def test_every_problem_is_reported_the_first_leading() -> None:
    err = refusal(
        {
            "op": "find",
            "table": "orders",
            "colour": "red",
            "where": {"stauts": "open", "id": {"in": []}},
            "limit": 0,
        }
    )
    problems = err.details["problems"]
    assert [(p["code"], p["details"]["key"]) for p in problems] == [
        ("invalid_operation", "colour"),
        ("unknown_column", "where.stauts"),
        ("invalid_operation", "where.id.in"),
        ("invalid_operation", "limit"),
    ]
    assert err.code == "invalid_operation"
    assert err.details["key"] == "colour"
    assert "3 more problem" in err.message
    json.dumps(err.to_dict())  # serialisable as it stands


def test_an_unknown_table_stops_column_checks_but_not_the_rest() -> None:
    err = refusal({"op": "find", "table": "nope", "where": {"x": 1}, "limit": 0})
    assert [p["code"] for p in err.details["problems"]] == ["unknown_table", "invalid_operation"]


# --- normalized and pass-through -----------------------------------------------------------


def test_normalized_ignores_key_order_and_pass_through_keys() -> None:
    a = comp(
        {
            "op": "update",
            "table": "orders",
            "where": {"id": {"gte": 1, "lt": 9}, "status": "open"},
            "set": {"note": "x", "meta": {"a": 1, "b": 2}},
            "idempotency_key": "k1",
            "plan_hash": "p1",
        },
        "postgresql",
    )
    b = comp(
        {
            "plan_hash": "p2",
            "set": {"meta": {"b": 2, "a": 1}, "note": "x"},
            "where": {"status": {"eq": "open"}, "ID": {"lt": 9, "gte": 1}},
            "table": "ORDERS",
            "op": "update",
        },
        "postgresql",
    )
    assert a.normalized == b.normalized
    assert (a.sql, a.params) == (b.sql, b.params)
    assert (a.idempotency_key, a.plan_hash, b.idempotency_key, b.plan_hash) == (
        "k1",
        "p1",
        None,
        "p2",
    )
    assert json.loads(a.normalized) == {
        "op": "update",
        "table": "public.orders",
        "all_rows": False,
        "set": {"meta": {"a": 1, "b": 2}, "note": "x"},
        "where": {"id": {"gte": 1, "lt": 9}, "status": {"eq": "open"}},
    }
    c = comp(
        {
            "op": "insert",
            "table": "orders",
            "values": [{"id": 1, "note": "a"}, {"note": "b", "id": 2}],
        }
    )
    d = comp(
        {
            "table": "orders",
            "values": [{"note": "a", "id": 1}, {"id": 2, "note": "b"}],
            "op": "insert",
        }
    )
    assert c.normalized == d.normalized


@pytest.mark.parametrize(
    "other",
    [
        {"op": "find", "table": "orders", "where": {"id": 2}},
        {"op": "count", "table": "orders", "where": {"id": 1}},
        {"op": "find", "table": "orders", "where": {"id": 1}, "limit": 1},
        {"op": "find", "table": "orders", "where": {"id": "1"}},
        {"op": "find", "table": "orders", "where": {"id": {"gte": 1}}},
        {"op": "find", "table": "orders", "where": {"id": 1}, "columns": ["id"]},
    ],
)
def test_normalized_differs_for_different_work(other: dict[str, Any]) -> None:
    assert comp(other).normalized != comp(find({"id": 1})).normalized


# --- end to end: the compiled SQL on real engines --------------------------------------------


class Runner(Protocol):
    dialect: str

    def __call__(self, request: Mapping[str, Any]) -> list[tuple[Any, ...]]: ...


class _Run:
    """Compiles against the catalog the loaders read from the live database, then executes."""

    def __init__(self, conn: Any, catalog: Catalog) -> None:
        self.conn, self.catalog, self.dialect = conn, catalog, catalog.dialect

    def __call__(self, request: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        compiled = compile_operation(request, self.catalog)
        cur = self.conn.execute(compiled.sql, compiled.params)
        return [tuple(row) for row in cur.fetchall()] if cur.description else []

    def exists(self, request: Mapping[str, Any]) -> bool:
        compiled = compile_operation(request, self.catalog)
        assert compiled.exists_sql is not None
        return bool(self.conn.execute(compiled.exists_sql, ()).fetchone()[0])


@pytest.fixture
def sqlite_run(tmp_path: Path) -> Iterator[_Run]:
    conn = sqlite3.connect(tmp_path / "shop.db", isolation_level=None)
    try:
        for ddl in SQLITE_DDL:
            conn.execute(ddl)
        yield _Run(conn, load_sqlite_catalog(conn))
    finally:
        conn.close()


@pytest.fixture
def pg_run(postgres_dsn: str) -> Iterator[_Run]:
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        for ddl in PG_DDL:
            conn.execute(ddl)
        yield _Run(conn, asyncio.run(_pg_catalog(postgres_dsn)))


async def _pg_catalog(dsn: str) -> Catalog:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        return await load_postgres_catalog(conn)


ROWS: list[dict[str, Any]] = [
    {"id": 1, "status": "open", "total": 10.0, "note": None},
    {"id": 2, "status": "paid", "total": 20.5, "note": "gift"},
    {"id": 3, "status": "open", "total": 30.0, "note": "Rush 50%"},
    {"id": 4, "status": "Closed", "total": None, "note": "'; DROP TABLE orders; --"},
]


def ids(run: _Run, where: Any, **extra: Any) -> list[int]:
    return [row[0] for row in run(find(where, columns=["id"], order_by=["id"], **extra))]


def scenario(run: _Run) -> None:
    inserted = run({"op": "insert", "table": "orders", "values": ROWS, "returning": ["id"]})
    assert sorted(inserted) == [(1,), (2,), (3,), (4,)]
    assert ids(run, {"status": "open"}) == [1, 3]
    assert ids(run, {"note": None}) == [1]
    assert ids(run, {"note": {"is_null": False}}) == [2, 3, 4]
    assert ids(run, {"note": {"ne": None}}) == [2, 3, 4]
    assert ids(run, {"status": {"ne": "open"}}) == [2, 4]
    assert ids(run, {"note": {"ne": "gift"}}) == [3, 4]  # NULL matches neither eq nor ne
    assert ids(run, {"total": {"gt": 10, "lte": 30}}) == [2, 3]
    assert ids(run, {"total": {"lt": 20.5}}) == [1]
    assert ids(run, {"total": {"gte": 20.5}}) == [2, 3]
    assert ids(run, {"id": {"in": [1, 4, 99]}}) == [1, 4]
    assert ids(run, {"status": "open", "total": {"gt": 15}}) == [3]
    assert ids(run, {"note": {"like": "%50\\%"}}) == [3]  # an escaped % is literal
    assert ids(run, {"note": {"like": "%5_\\%"}}) == [3]
    assert ids(run, {"note": {"like": "g_ft"}}) == [2]
    assert ids(run, {"note": {"like": "50\\%"}}) == []
    # LIKE and case: PostgreSQL is case-sensitive, SQLite folds ASCII case
    assert ids(run, {"status": {"like": "closed"}}) == ([] if run.dialect == "postgresql" else [4])
    # injection attempts are plain values
    assert ids(run, {"status": "open' OR '1'='1"}) == []
    assert ids(run, {"note": "'; DROP TABLE orders; --"}) == [4]
    assert ids(run, {"status": {"in": ["x') OR ('1'='1"]}}) == []
    # ordering, NULLs last ascending and first descending on both engines, and paging
    order = {"op": "find", "table": "orders", "columns": ["id"]}
    assert run({**order, "order_by": ["total"]}) == [(1,), (2,), (3,), (4,)]
    assert run({**order, "order_by": ["-total"]}) == [(4,), (3,), (2,), (1,)]
    assert run({**order, "order_by": ["status", "-id"]}) == [(4,), (3,), (1,), (2,)]
    assert run({**order, "order_by": ["id"], "limit": 2, "offset": 1}) == [(2,), (3,)]
    assert run({**order, "order_by": ["id"], "offset": 3}) == [(4,)]
    assert run({**order, "order_by": ["id"], "limit": 1}) == [(1,)]
    assert run({"op": "find", "table": "orders", "where": {"id": 2}}) == [
        (2, "paid", 20.5, "gift", None, None)
        + ((None, None) if run.dialect == "postgresql" else ())
    ]
    assert run({"op": "count", "table": "orders", "where": {"status": "open"}}) == [(2,)]
    assert run({"op": "count", "table": "orders", "where": {"status": "nope"}}) == [(0,)]
    assert run.exists({"op": "count", "table": "orders", "where": {"status": "nope"}})
    # writes
    changed = run(
        {
            "op": "update",
            "table": "orders",
            "where": {"status": "paid"},
            "set": {"note": "refunded", "paid": True},
            "returning": ["id", "note"],
        }
    )
    assert changed == [(2, "refunded")]
    assert ids(run, {"note": "refunded"}) == [2]
    run(
        {
            "op": "update",
            "table": "orders",
            "where": {"id": 3},
            "set": {"meta": {"b": [1, 2], "a": "é"}},
        }
    )
    stored = run({"op": "find", "table": "orders", "columns": ["meta"], "where": {"id": 3}})[0][0]
    assert (json.loads(stored) if isinstance(stored, str) else stored) == {"a": "é", "b": [1, 2]}
    deleted = run(
        {"op": "delete", "table": "orders", "where": {"id": {"in": [4]}}, "returning": True}
    )
    assert [row[0] for row in deleted] == [4]
    assert run({"op": "count", "table": "orders"}) == [(3,)]
    assert run({"op": "update", "table": "orders", "all_rows": True, "set": {"status": "z"}}) == []
    assert ids(run, {"status": "z"}) == [1, 2, 3]
    run({"op": "delete", "table": "orders", "all_rows": True})
    assert run({"op": "count", "table": "orders"}) == [(0,)]
    assert not run.exists({"op": "find", "table": "orders", "where": {"id": 1}})


def odd_scenario(run: _Run) -> None:
    items = [
        {"Item Name": "bolt", "QTY": 3, "pct%": 0.5, 'a"b': "x"},
        {"Item Name": "nut", "QTY": 1, "pct%": 1.5, 'a"b': "y"},
    ]
    run({"op": "insert", "table": ODD, "values": items})
    # no where: no parameters, so a doubled % must still be read back as one by psycopg
    assert sorted(run({"op": "find", "table": ODD, "columns": ["pct%", "Item Name"]})) == [
        (0.5, "bolt"),
        (1.5, "nut"),
    ]
    got = run(
        {
            "op": "find",
            "table": ODD,
            "columns": ["Item Name"],
            "where": {"QTY": {"gt": 1}, 'a"b': "x"},
        }
    )
    assert got == [("bolt",)]
    run({"op": "update", "table": ODD, "where": {"Item Name": "nut"}, "set": {"pct%": 9.0}})
    assert run({"op": "find", "table": ODD, "columns": ["pct%"], "order_by": ["-pct%"]}) == [
        (9.0,),
        (0.5,),
    ]
    run({"op": "delete", "table": ODD, "where": {"pct%": {"gt": 5}}})
    assert run({"op": "count", "table": ODD}) == [(1,)]


def test_sqlite_end_to_end(sqlite_run: _Run, tmp_path: Path) -> None:
    scenario(sqlite_run)
    odd_scenario(sqlite_run)
    names = sqlite_run.conn.execute("SELECT name FROM sqlite_master ORDER BY name").fetchall()
    assert names == [(ODD,), ("orders",)]  # nothing dropped by the injection attempts


@pytest.mark.postgres
def test_postgresql_end_to_end(pg_run: _Run) -> None:
    scenario(pg_run)
    odd_scenario(pg_run)
    names = pg_run.conn.execute(
        "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename"
    ).fetchall()
    assert names == [(ODD,), ("orders",)]


@pytest.mark.postgres
def test_postgresql_json_and_arrays_end_to_end(pg_run: _Run) -> None:
    rows = [
        {"id": 1, "meta": {"a": 1}, "tags": ["x", "y"], "doc": {"k": [1]}},
        {"id": 2, "meta": "text", "tags": [], "doc": None},
        {"id": 3, "meta": None, "tags": None, "doc": None},
    ]
    pg_run({"op": "insert", "table": "orders", "values": rows})
    assert ids(pg_run, {"meta": {"eq": {"a": 1}}}) == [1]
    assert ids(pg_run, {"meta": {"eq": "text"}}) == [2]
    assert ids(pg_run, {"meta": {"in": ["text", 5]}}) == [2]
    assert ids(pg_run, {"tags": {"eq": ["x", "y"]}}) == [1]
    assert ids(pg_run, {"doc": {"is_null": False}}) == [1]
    got = pg_run(
        {"op": "find", "table": "orders", "columns": ["meta", "doc", "tags"], "where": {"id": 2}}
    )
    assert got == [("text", None, [])]
    assert ids(pg_run, {"id": {"eq": "3"}}) == [3]  # a string read as the column's type
