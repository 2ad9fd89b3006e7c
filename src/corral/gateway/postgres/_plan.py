"""Turning a request (SQL or a structured operation) into a PostgreSQL :class:`~._execute.Plan`:
the request's shape, its parameters, its analysis, the tables an empty answer is checked on."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from psycopg.types.json import Jsonb

from corral.gateway._catalog import Catalog, Table
from corral.gateway._journal import fingerprint
from corral.gateway._ops import compile_operation
from corral.gateway._request import check_param_count, invalid, request_key
from corral.gateway._rows import tables
from corral.gateway.postgres._execute import Plan
from corral.gateway.postgres._journal import quote_name
from corral.gateway.postgres._sql import Analysis, analyze

__all__ = ["Planned", "plan_request"]

_SQL_KEYS = ("sql", "params", "idempotency_key", "plan_hash")
_SQL_KEY_SET = frozenset(_SQL_KEYS)
_MAX_DEPTH = 64
# Parameter types passed as they are without a closer look (exact types: subclasses, floats
# and containers go through _param).
_PLAIN = frozenset({str, int, bool, type(None)})


@dataclass(frozen=True, slots=True)
class Planned:
    """A plan and what identifies it as work: ``normalized()`` (the canonical statement),
    ``params`` (as the agent gave them), ``key`` and ``plan_hash``."""

    plan: Plan
    analysis: Analysis | None
    normalized_op: str | None
    params: tuple[Any, ...]
    key: str | None
    plan_hash: str | None

    @property
    def kind(self) -> Literal["read", "write"]:
        return self.plan.kind

    def normalized(self) -> str:
        if self.analysis is not None:
            return self.analysis.normalized
        return self.normalized_op or ""

    def fingerprint(self) -> str:
        return fingerprint(self.normalized(), self.params, self.plan_hash)


def plan_request(request: Any, catalog: Catalog) -> Planned:
    """The plan for ``request`` against ``catalog``; raises ``GatewayError`` (see module)."""
    if type(request) is not dict and not isinstance(request, Mapping):
        raise invalid("request", request, "a mapping with sql or op")
    has_sql, has_op = "sql" in request, "op" in request
    if has_sql and has_op:
        raise invalid("request", sorted(map(str, request)), "a mapping with sql or op, not both")
    if has_op:
        return _plan_op(request, catalog)
    if has_sql:
        return _plan_sql(request, catalog)
    raise invalid("request", sorted(map(str, request)), "a mapping with sql or op")


def _param(value: Any, key: str, depth: int = 0, *, in_array: bool = False) -> Any:
    if depth > _MAX_DEPTH:
        raise invalid(key, value, f"a JSON value nested at most {_MAX_DEPTH} deep")
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise invalid(key, value, "a finite number")
        return value
    if isinstance(value, list | tuple):
        # A list is a PostgreSQL array, unless it lies inside a JSON object.
        items = [
            _param(v, f"{key}[{i}]", depth + 1, in_array=in_array or depth == 0)
            for i, v in enumerate(value)
        ]
        return items
    if isinstance(value, Mapping):
        if in_array:
            raise invalid(
                key, value, "an array element (objects are only allowed as a whole parameter)"
            )
        for k, v in value.items():
            if not isinstance(k, str):
                raise invalid(key, k, "a JSON object key (a string)")
            _param(v, f"{key}.{k}", depth + 1)
        return Jsonb(dict(value)) if depth == 0 else value
    raise invalid(key, value, "a JSON value (None, bool, int, float, str, list or object)")


def _qualified(table: Table) -> str:
    # Run without parameters (psycopg never formats it), so a % stays as it is.
    name = quote_name(table.name)
    return f"{quote_name(table.schema)}.{name}" if table.schema else name


@dataclass(frozen=True, slots=True)
class _SqlShape:
    """What a SQL text's analysis under one catalog version gives every request using it."""

    analysis: Analysis
    exists: tuple[tuple[str, str], ...]
    explain: bool


# Analyses by (text, catalog version): the analyzer's own cache answers the same, this one
# also keeps what the plan derives from it. Plain dict, oldest dropped first; one event loop.
_SHAPES: dict[tuple[str, str], _SqlShape] = {}
_SHAPES_SIZE = 1024


def _shape(sql: str, catalog: Catalog) -> _SqlShape:
    cache_key = (sql, catalog.version)
    shape = _SHAPES.get(cache_key)
    if shape is not None:
        return shape
    analysis = analyze(sql, catalog)
    # Only the tables producing the rows decide an empty answer (not those of a scalar
    # subquery or a WHERE), so only theirs are checked.
    exists = tuple(
        (key_, _qualified(catalog.tables[key_]))
        for key_ in tables(analysis.rows)
        if key_ in catalog.tables
    )
    shape = _SqlShape(analysis, exists, analysis.statement_type == "EXPLAIN")
    if len(_SHAPES) >= _SHAPES_SIZE:
        del _SHAPES[next(iter(_SHAPES))]
    _SHAPES[cache_key] = shape
    return shape


def _plan_sql(request: Mapping[str, Any], catalog: Catalog) -> Planned:
    if not _SQL_KEY_SET.issuperset(request):
        for k in request:
            if k not in _SQL_KEY_SET:
                raise invalid(
                    str(k), request[k], f"absent: a SQL request has only {', '.join(_SQL_KEYS)}"
                )
    sql = request["sql"]
    if not isinstance(sql, str) or not sql or sql.isspace():
        raise invalid("sql", sql, "a non-empty string")
    raw_params = request.get("params")
    if raw_params is None:
        raw_params = ()
    if not isinstance(raw_params, list | tuple):
        raise invalid("params", raw_params, "a list of values")
    if all(type(v) in _PLAIN for v in raw_params):
        params = tuple(raw_params)
    else:
        params = tuple(_param(v, f"params[{i}]") for i, v in enumerate(raw_params))
    key, plan_hash = request_key(request, "idempotency_key"), request_key(request, "plan_hash")
    shape = _shape(sql, catalog)
    analysis = shape.analysis
    check_param_count(analysis.param_count, len(params))
    plan = Plan(
        kind=analysis.kind,
        sql=sql,
        params=params,
        raw=True,
        filtered=analysis.filtered,
        exists=shape.exists,
        explain=shape.explain,
        rows=analysis.rows,
        only=analysis.only,
    )
    return Planned(plan, analysis, None, tuple(raw_params), key, plan_hash)


def _plan_op(request: Mapping[str, Any], catalog: Catalog) -> Planned:
    compiled = compile_operation(request, catalog)
    key, plan_hash = request_key(request, "idempotency_key"), request_key(request, "plan_hash")
    name = str(request["table"])
    table = catalog.tables.get(name) or catalog.table(name)
    exists = ((compiled.table, _qualified(table)),) if table is not None else ()
    plan = Plan(
        kind=compiled.kind,
        sql=compiled.sql,
        params=compiled.params,
        raw=False,
        filtered=compiled.filtered,
        exists=exists,
        count_op=compiled.op == "count",
        rows=compiled.table if table is not None else True,
    )
    return Planned(plan, None, compiled.normalized, compiled.params, key, plan_hash)
