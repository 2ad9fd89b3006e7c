"""The databases the daemon fronts through the gateway, by name (``corral serve --db NAME=DSN``):
each a :class:`corral.gateway.Gateway`, answered in the HTTP API's JSON, its freezes and
reinstatements told to the event log (see "Through the daemon" in docs/architecture.md)."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import functools
import inspect
import ipaddress
import logging
import math
import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from corral.daemon._errors import GatewayNotInstalledError, NotFrozenError, UnknownTargetError
from corral.daemon._events import gateway_decision_id
from corral.daemon._service import AgentService
from corral.daemon._targets import (
    TargetOptions,
    check_target_name,
    check_target_options,
    target_kind,
)
from corral.kernel import SYSTEM_CLOCK, Clock, CorralError, InvalidArgumentError
from corral.kernel import _validate as v
from corral.runtime._tracing import run_context

if TYPE_CHECKING:
    from corral.gateway import BreakerPolicy, Freeze, Gateway

Json = dict[str, Any]
logger = logging.getLogger("corral.daemon.gateway")

_AGENT_MAX = 200


@dataclass(frozen=True, slots=True, kw_only=True)
class TargetLimits:
    """What a database's gateway enforces on every request, as opened: shown in
    ``GET /gateway`` (whether an agent role is set, never which, nor anything of the DSN)."""

    max_rows: int
    max_bytes: int
    max_statement_chars: int
    statement_timeout_s: float
    agent_role: bool

    def to_json(self) -> Json:
        return {
            "maxRows": self.max_rows,
            "maxBytes": self.max_bytes,
            "maxStatementChars": self.max_statement_chars,
            "statementTimeoutS": self.statement_timeout_s,
            "agentRole": self.agent_role,
        }


class Databases:
    """Named gateways, answering in JSON.

    ``gateways`` maps names to open gateways. ``service``, when given, is told of freezes and
    reinstatements (see the module docstring). Methods raise :class:`UnknownTargetError`
    for a target that does not exist, ``InvalidArgumentError`` for bad arguments, and the
    gateway's own ``GatewayError`` for a refused request.
    """

    def __init__(
        self,
        gateways: Mapping[str, Gateway],
        *,
        service: AgentService | None = None,
        limits: Mapping[str, TargetLimits] | None = None,
    ) -> None:
        v.instance_of("Databases", "gateways", gateways, Mapping)
        for name in gateways:
            check_target_name("Databases", name, argument="gateways")
        v.instance_of("Databases", "service", service, (AgentService, type(None)))
        v.instance_of("Databases", "limits", limits, (Mapping, type(None)))
        for limit in (limits or {}).values():
            v.instance_of("Databases", "limits", limit, TargetLimits)
        self._gateways = dict(gateways)
        self._service = service
        self._limits = dict(limits or {})
        self._told: set[str] = set()  # freezes the event log has (or has been sent)
        self._observers: list[Callable[[str, str], None]] = []

    @classmethod
    async def open(
        cls,
        targets: Mapping[str, str],
        *,
        service: AgentService | None = None,
        pool_size: int = 2,
        statement_timeout_s: float = 5,
        max_rows: int = 1000,
        breaker: BreakerPolicy | None = None,
        clock: Clock = SYSTEM_CLOCK,
        options: Mapping[str, TargetOptions] | None = None,
    ) -> Databases:
        """Open a gateway for each ``name -> dsn`` of ``targets`` (all or none: a target
        that cannot be opened closes the others and raises its ``GatewayError``).
        ``breaker`` None means the gateway's default policy. ``options`` maps some of the
        names to their own :class:`TargetOptions` (an option of the other engine, or a name
        that is not a target, raises ``InvalidArgumentError`` before anything opens; the
        gateway's own checks of the values raise it too)."""
        v.instance_of("Databases.open", "targets", targets, Mapping)
        options = {} if options is None else options
        check_target_options("Databases.open", targets, options)
        try:
            from corral.gateway import BreakerPolicy, Gateway
        except ModuleNotFoundError as exc:
            raise GatewayNotInstalledError(exc.name or "corral.gateway") from None
        policy = breaker if breaker is not None else BreakerPolicy()
        defaults = _defaults(Gateway, "max_bytes", "max_statement_chars")
        opened: dict[str, Gateway] = {}
        # Made first, so that each gateway's on_freeze hook has it to tell.
        databases = cls({}, service=service)
        try:
            for name, dsn in targets.items():
                check_target_name("Databases.open", name, argument="targets")
                kind, where = target_kind(dsn)
                given = options.get(name, TargetOptions())
                on_freeze = functools.partial(databases._on_freeze, name)
                common: dict[str, Any] = {
                    "statement_timeout_s": statement_timeout_s,
                    "max_rows": max_rows,
                    "breaker": policy,
                    "clock": clock,
                    "on_freeze": on_freeze,
                    **given.given(),
                }
                if kind == "postgresql":
                    opened[name] = await Gateway.connect(where, pool_size=pool_size, **common)
                else:
                    opened[name] = await Gateway.connect("sqlite:///" + where, **common)
                databases._limits[name] = TargetLimits(
                    max_rows=max_rows,
                    max_bytes=_or(given.max_bytes, defaults["max_bytes"]),
                    max_statement_chars=_or(
                        given.max_statement_chars, defaults["max_statement_chars"]
                    ),
                    statement_timeout_s=statement_timeout_s,
                    agent_role=given.agent_role is not None,
                )
            databases._gateways = dict(opened)
            await databases.log_unlogged_freezes()
        except BaseException:
            await _close_all(opened.values())
            raise
        return databases

    async def close(self) -> None:
        """Close every gateway (each one, even when another fails to). Idempotent."""
        gateways, self._gateways = self._gateways, {}
        await _close_all(gateways.values())

    async def log_unlogged_freezes(self) -> None:
        """Log each freeze in effect that the event log does not hold yet: one made just
        before a crash, or while the daemon was not running (a gateway used from Python on
        the same database)."""
        if self._service is None:
            return
        for name in self.names:
            gw = self._gateways[name]
            if gw.breaker_policy is None:
                continue
            for agent_id, freeze in gw.frozen_agents().items():
                logged = await self._service.logged_gateway_freezes(agent_id)
                if freeze.id in logged:
                    self._told.add(freeze.id)
                else:
                    await self._told_of(name, freeze)

    # --- reading ----------------------------------------------------------------------------

    @property
    def names(self) -> list[str]:
        return sorted(self._gateways)

    def target(self, name: str | None) -> tuple[str, Gateway]:
        """The gateway named ``name``; None names the only one there is."""
        if name is None:
            if len(self._gateways) == 1:
                return next(iter(self._gateways.items()))
            raise UnknownTargetError(None, self.names)
        v.non_empty_str("target", "target", name)
        gw = self._gateways.get(name)
        if gw is None:
            raise UnknownTargetError(name, self.names)
        return name, gw

    def targets(self) -> list[Json]:
        """Each database: name, dialect, number of tables and agents frozen there, and the
        limits its gateway enforces (None for a gateway not opened by :meth:`open`)."""
        answer = []
        for name in self.names:
            gw = self._gateways[name]
            catalog = gw.catalog
            answer.append(
                {
                    "name": name,
                    "dialect": catalog.dialect,
                    "tables": len(catalog.tables),
                    "frozenAgents": len(gw.frozen_agents()) if gw.breaker_policy else 0,
                    "limits": limit.to_json() if (limit := self._limits.get(name)) else None,
                }
            )
        return answer

    def schema(self, target: str | None) -> Json:
        """The tables an agent may use in ``target``, with their columns."""
        name, gw = self.target(target)
        catalog = gw.catalog
        tables = [
            {
                "name": t.name,
                "schema": t.schema,
                "primaryKey": list(t.primary_key),
                "columns": [
                    {"name": c.name, "type": c.type, "nullable": c.nullable}
                    for c in t.columns.values()
                ],
            }
            for _, t in sorted(catalog.tables.items())
        ]
        return {"target": name, "dialect": catalog.dialect, "tables": tables}

    def decisions(self) -> list[Json]:
        """Every agent frozen in any database, waiting on a person to reinstate it."""
        waiting = []
        for name in self.names:
            gw = self._gateways[name]
            if gw.breaker_policy is None:
                continue
            for agent_id, freeze in gw.frozen_agents().items():
                waiting.append(
                    {
                        "id": gateway_decision_id(freeze.id, name, agent_id),
                        "kind": "gateway_frozen",
                        "state": "pending",
                        "agentId": agent_id,
                        "target": name,
                        "freezeId": freeze.id,
                        "reason": freeze.reason,
                        "since": freeze.at.isoformat(),
                        "answers": ["reinstate"],
                        "freeze": _record(freeze.to_dict()),
                        "resolve": {
                            "reinstate": f"POST /gateway/{name}/agents/{agent_id}/reinstate"
                        },
                    }
                )
        return waiting

    # --- requests and breakers --------------------------------------------------------------

    async def query(self, target: str | None, agent_id: str, request: Any) -> Json:
        """Run ``request`` (the gateway's SQL or structured form) for ``agent_id``."""
        _agent("query", agent_id)
        if not isinstance(request, Mapping):
            raise InvalidArgumentError(
                "query", "request", "an object: {sql, params} or {op, table, ...}", request
            )
        request = snake_request(request)
        name, gw = self.target(target)
        # The query's span joins the trace of the agent's run (see _tracing).
        with run_context(self._run_of(agent_id)):
            try:
                result = await gw.query(agent_id, request)
            except CorralError as exc:
                self._answered(name, exc.code)
                raise
        outcome = "replayed" if result.status == "replayed" else result.emptiness or "ok"
        self._answered(name, outcome)
        return {
            "target": name,
            "status": result.status,
            "columns": list(result.columns),
            "rows": [{k: to_json(val) for k, val in row.items()} for row in result.rows],
            "rowCount": result.row_count,
            "emptiness": result.emptiness,
            "warnings": list(result.warnings),
            "truncated": result.truncated,
        }

    def observe_requests(self, observer: Callable[[str, str], None]) -> None:
        """Call ``observer(target, outcome)`` as each request is answered: ``ok``,
        ``genuinely_empty``, ``suspiciously_empty``, ``replayed`` or the refusal's code (the
        daemon's metrics). It must be quick; what it raises is logged, never raised."""
        self._observers.append(observer)

    def _answered(self, name: str, outcome: str) -> None:
        for observer in self._observers:
            try:
                observer(name, outcome)
            except Exception:
                logger.exception("an observer of the gateway's requests failed")

    def _run_of(self, agent_id: str) -> str | None:
        rec = None if self._service is None else self._service.store.state.agents.get(agent_id)
        return None if rec is None else rec["runId"]

    def status(self, target: str | None, agent_id: str) -> Json:
        _agent("status", agent_id)
        name, gw = self.target(target)
        return {"target": name, **_record(gw.status(agent_id).to_dict())}

    async def history(self, target: str | None, agent_id: str) -> list[Json]:
        _agent("history", agent_id)
        name, gw = self.target(target)
        return [{"target": name, **_record(r.to_dict())} for r in await gw.history(agent_id)]

    async def freeze(
        self, target: str | None, agent_id: str, *, reason: str, by: str | None = None
    ) -> Json:
        """Freeze ``agent_id`` by hand in ``target``; idempotent (an agent already frozen
        keeps its freeze, which is answered)."""
        _agent("freeze", agent_id)
        _words("freeze", "reason", reason)
        _words("freeze", "by", by, optional=True)
        name, gw = self.target(target)
        freeze = await gw.freeze(agent_id, reason, by=by)
        await self._told_of(name, freeze)
        return {"target": name, **_record(freeze.to_dict())}

    async def reinstate(
        self,
        target: str | None,
        agent_id: str,
        *,
        by: str,
        reason: str,
        note: str | None = None,
    ) -> Json:
        """Lift ``agent_id``'s freeze in ``target``, recorded with ``by`` and ``reason``
        (in the gateway's journal, and as a resolved decision in the event log, with
        ``note``: a name the caller typed)."""
        _agent("reinstate", agent_id)
        _words("reinstate", "by", by)
        _words("reinstate", "reason", reason)
        name, gw = self.target(target)
        freeze = gw.status(agent_id).freeze if gw.breaker_policy is not None else None
        if freeze is None:
            raise NotFrozenError(name, agent_id)
        done = await gw.reinstate(agent_id, by=by, reason=reason)
        answer = {"target": name, **_record(done.to_dict())}
        if self._service is not None:
            try:
                await self._service.record_gateway_resolution(
                    name, agent_id, _freeze_json(freeze), _record(done.to_dict()), note
                )
            except Exception:
                # Done is done (the gateway's journal has it); a retry would only be told
                # "not frozen". The event log misses the resolution, and the log says so.
                logger.exception("could not log the reinstatement of %s in %s", agent_id, name)
        return answer

    async def _on_freeze(self, name: str, agent_id: str, freeze: Freeze) -> None:
        # The gateway calls this once a freeze is recorded, by a breaker or by hand.
        await self._told_of(name, freeze)

    async def _told_of(self, name: str, freeze: Freeze) -> None:
        """Log ``freeze`` once (from the hook, a freeze by hand, a freeze found at start);
        never raises."""
        if freeze.id in self._told:
            return
        self._told.add(freeze.id)
        if self._service is None:
            return
        try:
            await self._service.record_gateway_freeze(name, _record(freeze.to_dict()))
        except Exception:
            # The freeze holds (it is in the gateway's journal, and in GET /decisions); only
            # the event is missing, and the request's own answer must not be replaced by this.
            logger.exception("could not log the freeze of %s in %s", freeze.agent_id, name)


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


def _defaults(gateway: type[Gateway], *names: str) -> dict[str, int]:
    """``Gateway.connect``'s defaults for ``names``: the limits a target enforces when the
    daemon leaves them to the gateway, read where the gateway states them (its signature),
    so that ``GET /gateway`` says what is enforced whatever they become."""
    parameters = inspect.signature(gateway.connect).parameters
    return {name: int(parameters[name].default) for name in names}


def waiting_decisions(service: AgentService, databases: Databases | None) -> list[Json]:
    """Everything waiting on a person, oldest first: blocked agents and, with
    ``databases``, agents frozen in a database."""
    waiting = service.decisions()
    if databases is not None:
        waiting = sorted([*waiting, *databases.decisions()], key=lambda d: d["since"])
    return waiting


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_CAMEL_KEYS = {
    "idempotencyKey": "idempotency_key",
    "planHash": "plan_hash",
    "orderBy": "order_by",
    "allRows": "all_rows",
}


def snake_request(request: Mapping[str, Any]) -> dict[str, Any]:
    """``request`` with the camelCase spellings the daemon accepts (``idempotencyKey``,
    ``planHash``, ``orderBy``, ``allRows``) in the gateway's snake_case. Raises
    ``InvalidArgumentError`` when both spellings of one key are given."""
    data = dict(request)
    for camel, snake in _CAMEL_KEYS.items():
        if camel in data:
            if snake in data:
                raise InvalidArgumentError("query", camel, f"given once (or as {snake})", camel)
            data[snake] = data.pop(camel)
    return data


def _agent(where: str, agent_id: Any) -> None:
    v.non_empty_str(where, "agent", agent_id)
    if len(agent_id) > _AGENT_MAX:
        raise InvalidArgumentError(
            where, "agent", f"at most {_AGENT_MAX} characters", f"{len(agent_id)} characters"
        )
    _words(where, "agent", agent_id)


def _words(where: str, name: str, value: Any, *, optional: bool = False) -> None:
    """A name or a sentence for people: non-empty, without control characters (which
    terminals, logs and PostgreSQL text do not all take)."""
    v.non_empty_str(where, name, value, optional=optional)
    if value is not None and _CONTROL.search(value):
        raise InvalidArgumentError(where, name, "text without control characters", value)


async def _close_all(gateways: Iterable[Gateway]) -> None:
    for gw in list(gateways):
        try:
            await gw.close()
        except Exception:
            logger.exception("could not close a gateway")


def _freeze_json(freeze: Freeze | None) -> Json | None:
    return None if freeze is None else _record(freeze.to_dict())


def _record(data: Mapping[str, Any]) -> Json:
    """A gateway record (snake_case) in the daemon's camelCase, values made JSON."""
    return {_camel(k): _record_value(val) for k, val in data.items()}


def _record_value(value: Any) -> Any:
    if isinstance(value, Mapping):
        return _record(value)
    if isinstance(value, list | tuple):
        return [_record_value(x) for x in value]
    return to_json(value)


def _camel(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(part.title() for part in rest)


def to_json(value: Any) -> Any:
    """A database value as JSON: numbers, strings, booleans and null as they are; decimals
    (exact) and NaN or infinite floats as strings; dates and times as ISO 8601; intervals
    as seconds; UUIDs and IP addresses as text; bytes as base64; arrays and JSON documents
    element by element; anything else as its text."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        # The names decimal.Decimal uses, so a float and a numeric say the same.
        return value if math.isfinite(value) else str(decimal.Decimal(value))
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, Mapping):
        return {str(k): to_json(x) for k, x in value.items()}
    if isinstance(value, list | tuple):
        return [to_json(x) for x in value]
    if isinstance(value, uuid.UUID | ipaddress.IPv4Address | ipaddress.IPv6Address):
        return str(value)
    return str(value)
