"""The gateway's front: one request pipeline (closed and frozen checks, planning with catalog
reloads, the idempotency key, hooks, breakers) over a PostgreSQL or SQLite engine."""

# A little past 500 lines: `connect` checks every option of both engines in one place (so the
# messages read alike), and the pipeline's steps stay in the order a request meets them.

from __future__ import annotations

import asyncio
import enum
import inspect
import logging
import sys
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from corral.gateway._bounds import DEFAULT_MAX_BYTES, DEFAULT_REPLAY_CACHE_BYTES
from corral.gateway._breaker import Breakers
from corral.gateway._breaker_records import (
    BreakerPolicy,
    BreakerStatus,
    Freeze,
    Reinstatement,
    RequestOutcome,
)
from corral.gateway._catalog import Catalog
from corral.gateway._connector import Connector
from corral.gateway._dsn import engine_of
from corral.gateway._engine import Engine
from corral.gateway._errors import GatewayError, statement_too_long
from corral.gateway._parse_threads import INLINE_CHARS, MAX_STATEMENT_CHARS
from corral.gateway._request import request_text, unencodable, unstorable
from corral.gateway._result import GatewayResult, QueryOutcome, outcome_code
from corral.gateway.postgres._engine import PostgresEngine, PostgresOptions
from corral.gateway.sqlite._engine import sqlite_engine
from corral.kernel import SYSTEM_CLOCK, Clock, UsageError
from corral.kernel import _validate as v
from corral.kernel._errors import InvalidArgumentError
from corral.runtime import _tracing

__all__ = ["FrozenHook", "Gateway", "ObserveHook", "OnFreezeHook"]

ObserveHook = Callable[[str, QueryOutcome], "Awaitable[object] | object"]
"""``observe(agent_id, outcome)``: a plain function or a coroutine function."""
FrozenHook = Callable[[str], "Awaitable[object] | object"]
"""``frozen(agent_id)``: truthy (a string is the reason) refuses the request; it may also
raise ``GatewayError("agent_frozen")`` itself."""
OnFreezeHook = Callable[[str, Freeze], "Awaitable[object] | object"]
"""``on_freeze(agent_id, freeze)``: called once per freeze recorded, a plain function or a
coroutine function; what it raises is logged, never raised."""


class _Unset(enum.Enum):
    UNSET = "unset"


_UNSET: Final = _Unset.UNSET
_UNKNOWN = ("unknown_table", "unknown_column")
_DEFAULT_BREAKER = BreakerPolicy()
# Ten times a long hand-written or generated statement (an IN list of 10,000 ids is ~70,000
# characters), a tenth of the daemon's body limit; analysed in ~0.1 s (docs/gateway.md).
DEFAULT_MAX_STATEMENT_CHARS: Final = 100_000
_log = logging.getLogger("corral.gateway")


@dataclass(frozen=True, slots=True, kw_only=True)
class _Hooks:
    clock: Clock
    breaker: BreakerPolicy | None
    observe: ObserveHook | None
    frozen: FrozenHook | None
    on_freeze: OnFreezeHook | None
    max_statement_chars: int = DEFAULT_MAX_STATEMENT_CHARS


def _release(analysing: set[str], agent_id: str, done: asyncio.Future[Any]) -> None:
    analysing.discard(agent_id)
    if not done.cancelled():
        done.exception()  # retrieved: the caller may be gone


def _agent_id(where: str, agent_id: object) -> None:
    """Refuse an agent id that is not a non-empty string a journal stores exactly (keys and
    freezes are journalled under it; see :func:`~._request.unstorable`)."""
    if type(agent_id) is str and agent_id in _ACCEPTED:
        return  # every request names its agent: a few ids, each checked once
    v.non_empty_str(where, "agent_id", agent_id)
    if isinstance(agent_id, str) and unstorable(agent_id) is not None:
        raise InvalidArgumentError(
            where, "agent_id", "text without control characters or lone surrogates", agent_id
        )
    if type(agent_id) is str and len(_ACCEPTED) < _ACCEPTED_MAX:
        _ACCEPTED.add(agent_id)


_ACCEPTED: set[str] = set()
_ACCEPTED_MAX = 4096


def _absent(where: str, engine: str, **given: object) -> None:
    """Refuse the options of another engine (given, not left at their default)."""
    for name, value in given.items():
        if value is not _UNSET:
            raise InvalidArgumentError(
                where, name, f"left out: a {engine} database does not take it", value
            )


class Gateway:
    """Agents' access to one database, PostgreSQL or SQLite. Create with :meth:`connect`."""

    def __init__(self, engine: Engine[Any], hooks: _Hooks) -> None:
        self._engine = engine
        self._hooks = hooks
        self._clock = hooks.clock
        name = type(self).__name__
        self._name = name
        self._where_query = f"{name}.query"
        self._breakers: Breakers | None = None
        if hooks.breaker is not None:
            self._breakers = Breakers(
                hooks.breaker,
                journal=engine.freeze_journal(),
                clock=hooks.clock,
                on_freeze=self._frozen_now,
            )
        self._checks_frozen = self._breakers is not None or hooks.frozen is not None
        self._reports = self._breakers is not None or hooks.observe is not None
        self._max_chars = hooks.max_statement_chars
        # A statement longer than this is checked before analysis (length, the agent's
        # analyses in flight); a shorter one is analysed inline, on the fast path.
        self._watched_chars = min(INLINE_CHARS, self._max_chars)
        self._analysing: set[str] = set()  # agents with a long statement in analysis

    @classmethod
    def connect(
        cls,
        dsn: str,
        *,
        statement_timeout_s: float = 5,
        max_rows: int = 1000,
        max_bytes: int = DEFAULT_MAX_BYTES,
        clock: Clock = SYSTEM_CLOCK,
        breaker: BreakerPolicy | None = _DEFAULT_BREAKER,
        observe: ObserveHook | None = None,
        frozen: FrozenHook | None = None,
        on_freeze: OnFreezeHook | None = None,
        max_statement_chars: int = DEFAULT_MAX_STATEMENT_CHARS,
        pool_size: int | _Unset = _UNSET,
        journal_schema: str | _Unset = _UNSET,
        journal_table: str | _Unset = _UNSET,
        key_wait_s: float | _Unset = _UNSET,
        connect_timeout_s: float | _Unset = _UNSET,
        catalog_refresh_s: float | _Unset = _UNSET,
        catalog_max_age_s: float | _Unset | None = _UNSET,
        replay_cache_size: int | _Unset = _UNSET,
        agent_role: str | _Unset | None = _UNSET,
        replay_cache_bytes: int | _Unset = _UNSET,
        journal_path: str | Path | _Unset | None = _UNSET,
    ) -> Connector[Gateway]:
        """A gateway to the database ``dsn`` names, opened when awaited or entered.

        ``dsn``: ``postgresql://...`` (or ``postgres://``) or a libpq keyword string for
        PostgreSQL, ``sqlite:///PATH`` for an existing SQLite file. The options, hooks and
        engine-specific keywords are described in docs/gateway.md; a keyword of the other
        engine raises ``InvalidArgumentError``, as does any bad argument. Opening raises
        ``GatewayError("database_unavailable")`` when the database cannot be reached, and
        ``GatewayError("database_error")`` when a journal cannot be created.
        """
        where = f"{cls.__name__}.connect"
        v.non_empty_str(where, "dsn", dsn)
        kind, target = engine_of(where, dsn)
        engine: Engine[Any]
        if kind == "sqlite":
            _absent(
                where,
                "SQLite",
                pool_size=pool_size,
                journal_schema=journal_schema,
                journal_table=journal_table,
                key_wait_s=key_wait_s,
                connect_timeout_s=connect_timeout_s,
                catalog_refresh_s=catalog_refresh_s,
                catalog_max_age_s=catalog_max_age_s,
                replay_cache_size=replay_cache_size,
                agent_role=agent_role,
                replay_cache_bytes=replay_cache_bytes,
            )
            engine = sqlite_engine(
                where,
                target,
                journal_path=None if journal_path is _UNSET else journal_path,
                statement_timeout_s=statement_timeout_s,
                max_rows=max_rows,
                max_bytes=max_bytes,
                clock=clock,
            )
        else:
            _absent(where, "PostgreSQL", journal_path=journal_path)
            options = PostgresOptions(
                dsn=target,
                pool_size=2 if pool_size is _UNSET else pool_size,
                statement_timeout_s=statement_timeout_s,
                max_rows=max_rows,
                clock=clock,
                journal_schema="corral" if journal_schema is _UNSET else journal_schema,
                journal_table="gateway_journal" if journal_table is _UNSET else journal_table,
                key_wait_s=0.1 if key_wait_s is _UNSET else key_wait_s,
                connect_timeout_s=5.0 if connect_timeout_s is _UNSET else connect_timeout_s,
                catalog_refresh_s=1.0 if catalog_refresh_s is _UNSET else catalog_refresh_s,
                catalog_max_age_s=60.0 if catalog_max_age_s is _UNSET else catalog_max_age_s,
                replay_cache_size=4096 if replay_cache_size is _UNSET else replay_cache_size,
                agent_role=None if agent_role is _UNSET else agent_role,
                max_bytes=max_bytes,
                replay_cache_bytes=(
                    DEFAULT_REPLAY_CACHE_BYTES
                    if replay_cache_bytes is _UNSET
                    else replay_cache_bytes
                ),
            )
            options.check(where)
            engine = PostgresEngine(options)
        hooks = cls._hooks_of(
            where, clock, breaker, observe, frozen, on_freeze, max_statement_chars
        )
        return Connector(cls(engine, hooks))

    @staticmethod
    def _hooks_of(
        where: str,
        clock: Clock,
        breaker: BreakerPolicy | None,
        observe: ObserveHook | None,
        frozen: FrozenHook | None,
        on_freeze: OnFreezeHook | None,
        max_statement_chars: int = DEFAULT_MAX_STATEMENT_CHARS,
    ) -> _Hooks:
        for name, hook in (("observe", observe), ("frozen", frozen), ("on_freeze", on_freeze)):
            if hook is not None:
                v.callable_(where, name, hook)
        if breaker is not None:
            v.instance_of(where, "breaker", breaker, BreakerPolicy)
        v.positive_int(where, "max_statement_chars", max_statement_chars)
        if max_statement_chars > MAX_STATEMENT_CHARS:
            raise InvalidArgumentError(
                where,
                "max_statement_chars",
                f"a positive integer of at most {MAX_STATEMENT_CHARS}",
                max_statement_chars,
            )
        return _Hooks(
            clock=clock,
            breaker=breaker,
            observe=observe,
            frozen=frozen,
            on_freeze=on_freeze,
            max_statement_chars=max_statement_chars,
        )

    # --- lifecycle --------------------------------------------------------------------------

    async def open(self) -> None:
        """Reach the database, open the breakers' journal (loading the agents frozen now),
        load the catalog. Idempotent; raises ``GatewayError`` (``database_unavailable``,
        ``database_error``), closing what it opened."""
        engine = self._engine
        if engine.is_open:
            return
        try:
            await engine.open()
            if self._breakers is not None:
                await self._breakers.open()
            await engine.load_catalog()
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Finish the freezes in flight, then close every connection. Idempotent."""
        self._engine.closing()
        try:
            if self._breakers is not None:
                await self._breakers.close()
        finally:
            await self._engine.close()

    async def __aenter__(self) -> Gateway:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # --- catalog and connections ------------------------------------------------------------

    @property
    def catalog(self) -> Catalog:
        """The catalog requests are analysed against (the gateway's journals left out)."""
        return self._engine.catalog

    async def refresh_catalog(self) -> Catalog:
        """Reload the catalog now and return it; raises ``GatewayError``."""
        return await self._engine.refresh_catalog()

    def connections_in_use(self, agent_id: str) -> int:
        """How many of ``agent_id``'s connections are checked out right now."""
        return self._engine.connections_in_use(agent_id)

    async def drain(self, agent_id: str) -> bool:
        """Close ``agent_id``'s pool and cancel its running statements (they fail with
        ``database_unavailable``). Returns whether it had a pool; its next request opens a
        new one. Idempotent."""
        v.non_empty_str(f"{self._name}.drain", "agent_id", agent_id)
        return await self._engine.drain(agent_id)

    async def _frozen_now(self, agent_id: str, freeze: Freeze) -> None:
        try:
            await self._engine.drain(agent_id)
        finally:
            hook = self._hooks.on_freeze
            if hook is not None:
                done = hook(agent_id, freeze)
                if inspect.isawaitable(done):
                    await done

    # --- breakers ---------------------------------------------------------------------------

    def _require_breakers(self, what: str) -> Breakers:
        if self._breakers is None:
            raise UsageError(
                f"{self._name}.{what} needs breakers, and this gateway was connected with "
                f"breaker=None: pass a BreakerPolicy to {self._name}.connect",
                method=what,
            )
        return self._breakers

    @property
    def breaker_policy(self) -> BreakerPolicy | None:
        """The breakers' policy, None when the gateway has no breakers."""
        return self._hooks.breaker

    async def freeze(self, agent_id: str, reason: str, *, by: str | None = None) -> Freeze:
        """Freeze ``agent_id`` by hand (recorded with ``reason`` and ``by``), draining its
        pool. Idempotent: an agent already frozen keeps (and gets back) its freeze. Raises
        ``InvalidArgumentError``, ``UsageError`` (no breakers, or the gateway is not open) and
        the journal's ``GatewayError`` (the freeze is in effect all the same)."""
        where = f"{self._name}.freeze"
        _agent_id(where, agent_id)
        v.non_empty_str(where, "reason", reason)
        v.non_empty_str(where, "by", by, optional=True)
        return await self._require_breakers("freeze").freeze(agent_id, reason=reason, by=by)

    async def reinstate(self, agent_id: str, *, by: str, reason: str) -> Reinstatement:
        """Lift ``agent_id``'s freeze, recording who (``by``) and why (``reason``); its counts
        start from zero. Raises ``InvalidArgumentError`` (either empty), ``UsageError`` (not
        frozen, no breakers, not open) and the journal's ``GatewayError`` (it stays frozen)."""
        where = f"{self._name}.reinstate"
        _agent_id(where, agent_id)
        v.non_empty_str(where, "by", by)
        v.non_empty_str(where, "reason", reason)
        return await self._require_breakers("reinstate").reinstate(agent_id, by=by, reason=reason)

    def status(self, agent_id: str) -> BreakerStatus:
        """``agent_id``'s breakers now: frozen or not, counts within the window, thresholds.
        Reads memory only."""
        v.non_empty_str(f"{self._name}.status", "agent_id", agent_id)
        return self._require_breakers("status").status(agent_id)

    def frozen_agents(self) -> dict[str, Freeze]:
        """Every agent frozen now, with its freeze."""
        return self._require_breakers("frozen_agents").frozen_agents()

    async def history(self, agent_id: str) -> list[Freeze | Reinstatement]:
        """``agent_id``'s freezes and reinstatements, oldest first, from the journal."""
        v.non_empty_str(f"{self._name}.history", "agent_id", agent_id)
        return await self._require_breakers("history").history(agent_id)

    # --- requests ---------------------------------------------------------------------------

    async def query(self, agent_id: str, request: Mapping[str, Any]) -> GatewayResult:
        """Run ``request`` for ``agent_id``: a SQL request or a structured operation.

        Returns a :class:`GatewayResult`; raises ``GatewayError`` (docs/gateway.md lists the
        codes) and ``InvalidArgumentError`` when ``agent_id`` is not a non-empty string.

        With OpenTelemetry set up, the request is a ``corral.gateway.query`` span (under the
        current span: the daemon puts it in the trace of the agent's run), with the agent,
        the database's system, the request's kind and its outcome code; never the statement
        or its parameters.
        """
        if not _tracing.enabled():
            return await self._query(agent_id, request)
        system = "postgresql" if isinstance(self._engine, PostgresEngine) else "sqlite"
        attributes = {
            "corral.agent.id": agent_id if isinstance(agent_id, str) else None,
            "db.system.name": system,
        }
        # Quiet: an error's message may quote the statement.
        with _tracing.span("corral.gateway.query", attributes, kind="client", quiet=True) as span:
            try:
                result = await self._query(agent_id, request)
            except GatewayError as exc:
                span.set("corral.gateway.outcome", exc.code)
                raise
            span.set_all(
                {
                    "corral.gateway.outcome": outcome_code(result),
                    "db.response.returned_rows": result.row_count,
                }
            )
            return result

    async def _query(self, agent_id: str, request: Mapping[str, Any]) -> GatewayResult:
        _agent_id(self._where_query, agent_id)
        engine = self._engine
        if not engine.is_open:
            raise GatewayError("database_unavailable", "the gateway is closed or not open")
        if self._checks_frozen:
            await self._check_frozen(agent_id)
        planned = None
        try:
            await engine.refresh_if_old()
            is_mapping = type(request) is dict or isinstance(request, Mapping)
            if is_mapping:
                bad = unencodable(request)
                if bad is not None:
                    raise bad
            sql = request.get("sql") if is_mapping else None
            if isinstance(sql, str) and type(sql) is not str:
                # A str subclass gets the same length limit and the same thread as a str.
                sql = str(sql)
                request = {**request, "sql": sql}
            if type(sql) is str and len(sql) > self._watched_chars:
                planned = await self._plan_long(agent_id, request, sql)
            else:
                planned = await self._plan(request)
            try:
                if planned.kind == "read":
                    result = await engine.read(agent_id, planned)
                else:
                    key = planned.key
                    if key is None:
                        raise GatewayError(
                            "idempotency_key_required",
                            f"this {engine.write_noun} writes, and a write needs an "
                            "idempotency_key (the same key to retry the same work, a new key "
                            "for new work)",
                            kind="write",
                        )
                    result = await engine.write(agent_id, key, planned)
            except GatewayError as exc:
                # The schema shrank under the analysis: the new catalog's refusal (with close
                # matches) says more than the database's error.
                if engine.schema_shrunk(exc) and await engine.reload_catalog("database"):
                    await engine.plan(request, engine.catalog)
                raise
        except GatewayError as exc:
            await self._report(agent_id, request, planned, exc.code, exc.message, None)
            raise
        if self._reports:
            await self._report(agent_id, request, planned, outcome_code(result), None, result)
        return result

    async def _plan(self, request: Any) -> Any:
        engine = self._engine
        try:
            try:
                return await engine.plan(request, engine.catalog)
            except GatewayError as exc:
                # The schema may have grown: analyse again against a reloaded catalog.
                if exc.code not in _UNKNOWN or not await engine.reload_catalog("refused"):
                    raise
                return await engine.plan(request, engine.catalog)
        except GatewayError:
            raise
        except RecursionError:
            _log.warning("analysis of a request recursed too deeply", exc_info=True)
            raise GatewayError(
                "statement_too_complex",
                "the statement nests too deeply for the gateway's analysis (Python's recursion "
                f"limit, {sys.getrecursionlimit()}, was reached): flatten it",
                limit=sys.getrecursionlimit(),
            ) from None
        except Exception as exc:
            # Last resort: nothing but GatewayError leaves query(), and the cause is logged.
            _log.error("analysis of a request failed unexpectedly", exc_info=True)
            raise GatewayError(
                "analysis_error",
                f"the gateway failed to analyse the request ({type(exc).__name__}); this is "
                "the gateway's fault, logged with its cause: retrying will not help",
                exception=type(exc).__name__,
            ) from None

    async def _plan_long(self, agent_id: str, request: Any, sql: str) -> Any:
        """Plan a statement past the inline length: refused when too long, or when the agent
        already has one in analysis (so one agent takes at most one analysis thread)."""
        if len(sql) > self._max_chars:
            raise statement_too_long(len(sql), self._max_chars)
        analysing = self._analysing
        if agent_id in analysing:
            raise GatewayError(
                "analysis_busy",
                f"agent {agent_id!r} already has a long statement (over {INLINE_CHARS} "
                "characters) in analysis; retry when it is answered",
                limit=1,
                agent_id=agent_id,
            )
        analysing.add(agent_id)
        # Shielded: a caller that gives up leaves its analysis running on its thread, and the
        # agent's slot taken until it ends, so giving up and sending again piles up nothing.
        task = asyncio.ensure_future(self._plan(request))
        task.add_done_callback(lambda done: _release(analysing, agent_id, done))
        return await asyncio.shield(task)

    async def _check_frozen(self, agent_id: str) -> None:
        if self._breakers is not None:
            self._breakers.check(agent_id)
        hook = self._hooks.frozen
        if hook is None:
            return
        verdict = hook(agent_id)
        if inspect.isawaitable(verdict):
            verdict = await verdict
        if verdict:
            reason = verdict if isinstance(verdict, str) else "frozen by its breaker"
            raise GatewayError(
                "agent_frozen",
                f"agent {agent_id!r} is frozen ({reason}); a person must reinstate it",
                agent_id=agent_id,
                reason=reason,
            )

    async def _report(
        self,
        agent_id: str,
        request: Any,
        planned: Any,
        code: str,
        message: str | None,
        result: GatewayResult | None,
    ) -> None:
        hook = self._hooks.observe
        breakers = self._breakers
        if hook is None and breakers is None:
            return
        outcome = QueryOutcome(
            agent_id=agent_id,
            code=code,
            request=request_text(request),
            at=self._clock.now(),
            message=message,
            kind=planned.kind if planned is not None else None,
            result=result,
        )
        # The request's connection is back in its pool by now: a freeze may drain it. A
        # gateway closed meanwhile has closed its breakers, so the outcome goes uncounted.
        if breakers is not None and self._engine.is_open:
            counted = RequestOutcome(
                request=outcome.request, code=code, at=outcome.at, message=message
            )
            await breakers.observe(agent_id, counted)
        if hook is None:
            return
        done = hook(agent_id, outcome)
        if inspect.isawaitable(done):
            await done
