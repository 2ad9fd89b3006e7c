"""The verdict on an empty answer, the same on PostgreSQL and SQLite: ``genuinely_empty`` when
the read without its filters is empty too, ``suspiciously_empty`` when that read has rows
(docs/gateway.md, "Loud empties"), checked by hand and against random reads."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import given, reject, settings
from hypothesis import strategies as st

from corral.gateway import BreakerPolicy, Gateway, GatewayError, GatewayResult

ENGINES = [pytest.param("postgres", marks=pytest.mark.postgres), "sqlite"]
# Its own name: other suites on the same server end "agent-7"'s connections by name.
AGENT = "emptiness-agent"

# a and b hold rows, c one; e and f are empty.
SCHEMA = (
    "CREATE TABLE a (id integer, v text)",
    "CREATE TABLE b (id integer, v text)",
    "CREATE TABLE c (id integer, v text)",
    "CREATE TABLE e (id integer, v text)",
    "CREATE TABLE f (id integer, v text)",
    "INSERT INTO a VALUES (1, 'x'), (2, 'y')",
    "INSERT INTO b VALUES (2, 'y'), (3, 'z')",
    "INSERT INTO c VALUES (4, 'x')",
)
TABLES = ("a", "b", "c", "e", "f")
INHERITANCE = (
    "CREATE TABLE parent_t (id integer)",
    "CREATE TABLE child_t () INHERITS (parent_t)",
    "CREATE TABLE lone_parent (id integer)",
    "CREATE TABLE lone_child () INHERITS (lone_parent)",
    "INSERT INTO child_t VALUES (1)",
)


class Target:
    """A small schema behind a gateway DSN, and the truth of a read: whether it has rows,
    asked of the database directly (on one connection kept open)."""

    def __init__(self, dsn: str, engine: str) -> None:
        self.dsn = dsn
        self.engine = engine
        self._sqlite: sqlite3.Connection | None = None
        self._pg: psycopg.Connection[Any] | None = None
        if engine == "sqlite":
            self._sqlite = sqlite3.connect(dsn.removeprefix("sqlite:///"))
        else:
            self._pg = psycopg.connect(dsn, autocommit=True)

    def has_rows(self, sql: str) -> bool:
        probe = f"SELECT 1 FROM ({sql}) q LIMIT 1"
        if self._sqlite is not None:
            return self._sqlite.execute(probe).fetchone() is not None
        assert self._pg is not None
        return self._pg.execute(probe).fetchone() is not None

    def close(self) -> None:
        if self._sqlite is not None:
            self._sqlite.close()
        if self._pg is not None:
            self._pg.close()


@pytest.fixture(params=ENGINES)
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    if request.param == "postgres":
        dsn = request.getfixturevalue("postgres_dsn")
        with psycopg.connect(dsn, autocommit=True) as pg:
            for statement in (*SCHEMA, *INHERITANCE):
                pg.execute(statement)
        found = Target(dsn, "postgres")
    else:
        path = tmp_path / "small.db"
        conn = sqlite3.connect(path)
        try:
            for statement in SCHEMA:
                conn.execute(statement)
            conn.commit()
        finally:
            conn.close()
        found = Target(f"sqlite:///{path}", "sqlite")
    try:
        yield found
    finally:
        found.close()


async def verdict(gw: Gateway, sql: str) -> tuple[str | None, tuple[str, ...]]:
    result = await gw.query(AGENT, {"sql": sql})
    return result.emptiness, result.warnings


# --- the cases that were wrong -----------------------------------------------------------------


async def test_a_full_join_of_a_filtered_side_is_suspicious(target: Target) -> None:
    # The filter emptied o; without it, o holds a's rows: FULL JOIN keeps them.
    sql = "SELECT * FROM (SELECT * FROM a WHERE v = 'opne') o FULL JOIN e ON 1 = 1"
    async with Gateway.connect(target.dsn, breaker=None) as gw:
        emptiness, warnings = await verdict(gw, sql)
    assert emptiness == "suspiciously_empty"
    assert "a holds rows" in warnings[0]


async def test_a_scalar_subquery_neither_decides_nor_freezes(target: Target) -> None:
    # e produces the rows; a only feeds the filter's value. Five honest reads froze the agent.
    sql = "SELECT * FROM e WHERE id = (SELECT max(id) FROM a)"
    policy = BreakerPolicy(max_suspicious_empties=5)
    async with Gateway.connect(target.dsn, breaker=policy) as gw:
        for _ in range(6):
            assert await verdict(gw, sql) == ("genuinely_empty", ())
        assert not gw.status(AGENT).frozen
        in_where = "SELECT * FROM a WHERE id IN (SELECT id FROM e)"
        emptiness, warnings = await verdict(gw, in_where)
    assert emptiness == "suspiciously_empty"
    assert "a holds rows" in warnings[0]
    assert " e " not in warnings[0]


@pytest.mark.postgres
async def test_only_counts_as_a_filter_that_leaves_out_child_tables(
    target: Target,
) -> None:
    if target.engine != "postgres":
        pytest.skip("ONLY is PostgreSQL's")
    async with Gateway.connect(target.dsn, breaker=None) as gw:
        only, only_warnings = await verdict(gw, "SELECT * FROM ONLY parent_t")
        whole, _ = await verdict(gw, "SELECT * FROM parent_t WHERE id = 1")
        empty, _ = await verdict(gw, "SELECT * FROM ONLY lone_parent")
    assert only == "suspiciously_empty"
    assert "parent_t holds rows (counting child tables: ONLY leaves" in only_warnings[0]
    assert whole is None  # the rows are there
    assert empty == "genuinely_empty"  # no child holds rows either


# --- random reads against the truth ------------------------------------------------------------


@dataclass(frozen=True)
class Read:
    """A random read, as sent (with its filters) and as the truth runs it (without)."""

    filtered: str
    unfiltered: str


class _Names:
    def __init__(self) -> None:
        self.n = 0

    def alias(self) -> str:
        self.n += 1
        return f"t{self.n}"


_Draw = Callable[[st.SearchStrategy[Any]], Any]


def _predicate(draw: _Draw, names: _Names, columns: list[str], depth: int) -> str:
    """A filter over ``columns`` (integer columns in scope); it may hold subqueries."""
    table = draw(st.sampled_from(TABLES))
    inner = names.alias()
    options = ["subquery"]
    if columns:
        options += ["compare", "compare", "null", "in", "scalar", "exists"]
    if depth > 0:
        options += ["not", "and", "or"]
    kind = draw(st.sampled_from(options))
    column = draw(st.sampled_from(columns)) if columns else "1"
    value = draw(st.sampled_from([1, 2, 3, 4, 9]))
    if kind == "compare":
        return f"{column} {draw(st.sampled_from(['=', '>', '<>']))} {value}"
    if kind == "null":
        return f"{column} IS NULL"
    if kind == "in":
        return f"{column} IN (SELECT {inner}.id FROM {table} {inner})"
    if kind == "scalar":
        return f"{column} = (SELECT max({inner}.id) FROM {table} {inner})"
    if kind == "exists":
        return f"EXISTS (SELECT 1 FROM {table} {inner} WHERE {inner}.id = {column})"
    if kind == "subquery":
        return f"EXISTS (SELECT 1 FROM {table} {inner})"
    if kind == "not":
        return f"NOT ({_predicate(draw, names, columns, depth - 1)})"
    left = _predicate(draw, names, columns, depth - 1)
    right = _predicate(draw, names, columns, depth - 1)
    return f"({left} {kind.upper()} {right})"


def _item(draw: _Draw, names: _Names, depth: int) -> tuple[str, str, list[str]]:
    """A FROM item that is no join: (filtered, unfiltered, its integer columns)."""
    alias = names.alias()
    if depth > 0 and draw(st.booleans()):
        sub = _query(draw, names, depth - 1)
        return f"({sub.filtered}) {alias}", f"({sub.unfiltered}) {alias}", [f"{alias}.x"]
    table = draw(st.sampled_from(TABLES))
    return f"{table} {alias}", f"{table} {alias}", [f"{alias}.id"]


def _from(draw: _Draw, names: _Names, depth: int) -> tuple[str, str, list[str]]:
    """Items joined left to right, each join of any kind."""
    filtered, unfiltered, columns = _item(draw, names, depth)
    # What an ON may name: on PostgreSQL a join binds tighter than a comma before it.
    scope = list(columns)
    for _ in range(draw(st.integers(0, 2))):
        kind = draw(st.sampled_from(["INNER", "LEFT", "RIGHT", "FULL", "CROSS", "COMMA"]))
        right, right_bare, right_columns = _item(draw, names, depth)
        if kind == "COMMA":
            filtered, unfiltered = f"{filtered}, {right}", f"{unfiltered}, {right_bare}"
            scope = []
        elif kind == "CROSS":
            filtered = f"{filtered} CROSS JOIN {right}"
            unfiltered = f"{unfiltered} CROSS JOIN {right_bare}"
        else:
            if kind == "FULL":
                # PostgreSQL takes a FULL JOIN only on conditions it can merge or hash.
                on = (
                    f"{draw(st.sampled_from(scope))} = {draw(st.sampled_from(right_columns))}"
                    if scope and draw(st.booleans())
                    else "1 = 1"
                )
            else:
                on = _predicate(draw, names, scope + right_columns, 1)
            filtered = f"{filtered} {kind} JOIN {right} ON {on}"
            if kind == "INNER":
                unfiltered = f"{unfiltered} CROSS JOIN {right_bare}"
            else:
                unfiltered = f"{unfiltered} {kind} JOIN {right_bare} ON 1 = 1"
        columns = columns + right_columns
        scope = scope + right_columns
    return filtered, unfiltered, columns


def _core(draw: _Draw, names: _Names, depth: int) -> tuple[str, str]:
    """SELECT x [FROM ...] [WHERE ...], with and without its filters."""
    columns: list[str] = []
    if draw(st.integers(0, 5)) == 0:
        head, from_, bare = "SELECT 1 AS x", "", ""
    else:
        from_, bare, columns = _from(draw, names, depth)
        head = f"SELECT {columns[0]} AS x"
        from_, bare = f" FROM {from_}", f" FROM {bare}"
    where = ""
    if draw(st.booleans()):
        where = f" WHERE {_predicate(draw, names, columns, 1)}"
    return f"{head}{from_}{where}", f"{head}{bare}"


@st.composite
def reads(draw: _Draw) -> Read:
    return _query(draw, _Names(), 2)


def _query(draw: _Draw, names: _Names, depth: int) -> Read:
    filtered, unfiltered = _core(draw, names, depth)
    if draw(st.integers(0, 3)) == 0:
        op = draw(st.sampled_from(["UNION", "UNION ALL", "INTERSECT", "EXCEPT"]))
        right, right_bare = _core(draw, names, depth)
        filtered = f"{filtered} {op} {right}"
        if op.startswith("UNION"):
            unfiltered = f"{unfiltered} {op} {right_bare}"
    if draw(st.integers(0, 3)) == 0:
        limit = draw(st.sampled_from([0, 1, 5]))
        offset = draw(st.sampled_from([0, 1, 3]))
        filtered = f"{filtered} LIMIT {limit} OFFSET {offset}"
    return Read(filtered, unfiltered)


def _retrying(loop: asyncio.AbstractEventLoop, gw: Gateway, sql: str) -> GatewayResult:
    """``gw.query``, tried again on ``database_unavailable`` (retryable by contract: a server
    shared with other suites may end connections) as many times as the agent's pool holds
    connections that may have been ended, plus one."""
    for _ in range(2):
        try:
            return loop.run_until_complete(gw.query(AGENT, {"sql": sql}))
        except GatewayError as exc:
            if exc.code != "database_unavailable":
                raise
    return loop.run_until_complete(gw.query(AGENT, {"sql": sql}))


def test_random_reads_get_the_verdict_the_unfiltered_read_gives(target: Target) -> None:
    loop = asyncio.new_event_loop()

    async def connect() -> Gateway:
        return await Gateway.connect(target.dsn, breaker=None)

    gw = loop.run_until_complete(connect())
    seen = {"genuinely_empty": 0, "suspiciously_empty": 0, None: 0}

    # The loaded profile's examples; half on PostgreSQL, where each is round trips to a server.
    examples = settings().max_examples
    if target.engine == "postgres":
        examples = max(1, examples // 2)

    @settings(max_examples=examples)
    @given(reads())
    def check(read: Read) -> None:
        try:
            result = _retrying(loop, gw, read.filtered)
        except GatewayError as exc:
            # SQLite refuses some mixes of RIGHT or FULL joins and ON clauses ("ON clause
            # references tables to its right"): not a read either engine runs.
            if (target.engine, exc.code) != ("sqlite", "parse_error"):
                raise
            reject()
        if result.rows:
            assert result.emptiness is None
            seen[None] += 1
            return
        truth = target.has_rows(read.unfiltered)
        expected = "suspiciously_empty" if truth else "genuinely_empty"
        assert result.emptiness == expected, (read, result.warnings)
        seen[expected] += 1

    try:
        check()
    finally:
        loop.run_until_complete(gw.close())
        loop.close()
    # The reads reach every verdict (a generator that never did would prove nothing).
    assert all(seen.values()), seen
