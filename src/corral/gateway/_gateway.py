"""The gateway on PostgreSQL: analysed, read-only reads and journalled, idempotent writes.

::

    async with Gateway.connect("postgresql://127.0.0.1/shop", pool_size=2) as gw:
        result = await gw.query("agent-7", {"sql": "SELECT id FROM orders WHERE status = $1",
                                            "params": ["open"]})

What a request goes through, in order: the ``frozen`` hook (``agent_frozen``), analysis
against the catalog (refusals of :mod:`~._sql` / :mod:`~._ops`, ``invalid_operation``), for a
write the idempotency key (``idempotency_key_required``, ``idempotency_conflict``,
``idempotency_in_progress``, or ``replayed``), the agent's pool (``pool_exhausted``), then the
database (see :mod:`~._execute`: ``read_only_violation``, ``statement_timeout``,
``invalid_data``, ``constraint_violation``, ``transaction_conflict``, ``database_error``,
``database_unavailable``). Every outcome but ``agent_frozen`` is reported
to the ``observe`` hook. Nothing but ``GatewayError`` (and ``InvalidArgumentError`` for a bad
``agent_id``) leaves :meth:`Gateway.query`.

Catalog (see :mod:`~._catalog_keeper`). Loaded at connect, without the journal's schema.
Reloaded when analysis refuses an unknown table or column (the schema may have grown: the
request is analysed again and runs if it now passes), when the database answers undefined
table or column (it may have shrunk: the request gets the new catalog's refusal, with close
matches, instead of the database's error), each at most once per ``catalog_refresh_s``, and
by the first request after ``catalog_max_age_s``. Analyses are cached by statement text and
catalog version; an unchanged schema keeps its version.

Idempotency (see :mod:`~._keys` and :mod:`~._journal`). Keys are per agent; the fingerprint
is the SHA-256 of the normalised statement, its parameters and ``plan_hash``. A completed
key's result is kept in memory (LRU of ``replay_cache_size``) and in the journal, so a replay
reads the journal at most once per gateway process and never runs the write (a journalled key
fails the check that precedes the write in its pipeline, and the server discards the write
unexecuted). The same key arriving while this gateway runs it waits up to ``key_wait_s`` for
the outcome (then ``replayed``, else ``idempotency_in_progress``); a key held by another
process's uncommitted write is waited for as long, in the database. A different fingerprint
is ``idempotency_conflict`` wherever the holder's fingerprint is known: a completed key, or a
key in flight in this gateway (another process's uncommitted key shows no fingerprint, so
any write on it is ``idempotency_in_progress`` until it commits).

Breakers (see :mod:`~._breaker`). With a ``breaker`` policy (the default) the gateway owns
a :class:`~._breaker.Breakers` whose freezes and reinstatements are kept in the target
database, table ``corral_breaker_records`` in the journal's schema (hidden from agents),
opened at :meth:`Gateway.open` and closed at :meth:`Gateway.close`. A frozen agent's every
request is refused with ``agent_frozen`` before analysis; every other outcome is counted once
the request has given its connection back; a freeze drains the agent's pool (its running
statements are cancelled). :meth:`Gateway.freeze`, :meth:`Gateway.reinstate`,
:meth:`Gateway.status` and :meth:`Gateway.history` act on it, and raise ``UsageError`` on a
gateway connected with ``breaker=None``. Freezes survive restarts; the rolling counts do not.

Hooks: ``frozen(agent_id)`` is called before anything else (after the breakers' own check)
and refuses the request when it returns a truthy value (a string is given as the reason);
``observe(agent_id, outcome)`` receives a :class:`~._result.QueryOutcome` for every request
that got past the checks (after the breakers counted it). Caller hooks are chained with the
breakers, never instead of them: a caller's ``frozen`` can refuse more agents, not fewer. Both
hooks may be plain functions or coroutines; what they raise propagates to the caller
(``frozen`` may raise ``agent_frozen`` itself).
"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from corral.gateway._breaker import Breakers
from corral.gateway._breaker_journal import PostgresFreezeJournal
from corral.gateway._breaker_records import (
    BreakerPolicy,
    BreakerStatus,
    Freeze,
    Reinstatement,
    RequestOutcome,
)
from corral.gateway._catalog import Catalog
from corral.gateway._connector import Connector
from corral.gateway._errors import GatewayError
from corral.gateway._journal import JournalName, check_identifier, fingerprint
from corral.gateway._result import GatewayResult, QueryOutcome, outcome_code
from corral.gateway.postgres._catalog import CatalogKeeper
from corral.gateway.postgres._execute import map_error, run_read
from corral.gateway.postgres._keys import KeyedWrites
from corral.gateway.postgres._plan import Planned, plan_request
from corral.gateway.postgres._pools import AgentPools
from corral.kernel import SYSTEM_CLOCK, Clock, UsageError
from corral.kernel import _validate as v
from corral.kernel._errors import InvalidArgumentError

__all__ = ["FrozenHook", "Gateway", "ObserveHook"]

ObserveHook = Callable[[str, QueryOutcome], "Awaitable[object] | object"]
"""``observe(agent_id, outcome)``: a plain function or a coroutine function."""
FrozenHook = Callable[[str], "Awaitable[object] | object"]
"""``frozen(agent_id)``: truthy (a string is the reason) refuses the request; it may also
raise ``GatewayError("agent_frozen")`` itself."""

_SCHEMA_SQLSTATES = frozenset({"42P01", "42703"})  # undefined table / column
_DEFAULT_BREAKER = BreakerPolicy()


@dataclass(frozen=True, slots=True, kw_only=True)
class _Config:
    dsn: str
    pool_size: int
    statement_timeout_s: float
    max_rows: int
    clock: Clock
    journal: JournalName
    key_wait_s: float
    connect_timeout_s: float
    catalog_refresh_s: float
    catalog_max_age_s: float | None
    replay_cache_size: int
    observe: ObserveHook | None
    frozen: FrozenHook | None
    breaker: BreakerPolicy | None


class Gateway:
    """Agents' access to one PostgreSQL database. Create with :meth:`connect`."""

    def __init__(self, config: _Config) -> None:
        self._config = config
        self._clock = config.clock
        self._closed = False
        ms = max(1, math.ceil(config.statement_timeout_s * 1000))
        dsn_options = str(conninfo_to_dict(config.dsn).get("options") or "")
        # Reads rely on the session default being READ ONLY (checked before each read).
        options = f"{dsn_options} -c default_transaction_read_only=on -c statement_timeout={ms}"
        connect_kwargs: dict[str, Any] = {
            "autocommit": True,
            # psycopg's own preparing stays off: requests are sent by _execute, which prepares
            # them itself (and keeps track of statements an aborted pipeline never created).
            "prepare_threshold": None,
            "connect_timeout": max(2, math.ceil(config.connect_timeout_s)),
        }
        self._keeper = CatalogKeeper(
            config.dsn,
            connect_kwargs=connect_kwargs,
            journal=config.journal,
            clock=config.clock,
            refresh_s=config.catalog_refresh_s,
            max_age_s=config.catalog_max_age_s,
        )
        self._pools = AgentPools(
            config.dsn,
            pool_size=config.pool_size,
            connect_timeout_s=config.connect_timeout_s,
            connect_kwargs={**connect_kwargs, "options": options.strip()},
        )
        self._writes = KeyedWrites(
            self._pools,
            journal=config.journal,
            clock=config.clock,
            key_wait_s=config.key_wait_s,
            max_rows=config.max_rows,
            statement_timeout_s=config.statement_timeout_s,
            replay_cache_size=config.replay_cache_size,
        )
        self._breakers: Breakers | None = None
        if config.breaker is not None:
            self._breakers = Breakers(
                config.breaker,
                journal=PostgresFreezeJournal(config.dsn, schema=config.journal.schema),
                clock=config.clock,
                on_freeze=self._drain_frozen,
            )

    @classmethod
    def connect(
        cls,
        dsn: str,
        *,
        pool_size: int = 2,
        statement_timeout_s: float = 5,
        max_rows: int = 1000,
        clock: Clock = SYSTEM_CLOCK,
        journal_schema: str = "corral",
        journal_table: str = "gateway_journal",
        key_wait_s: float = 0.1,
        connect_timeout_s: float = 5.0,
        catalog_refresh_s: float = 1.0,
        catalog_max_age_s: float | None = 60.0,
        replay_cache_size: int = 4096,
        observe: ObserveHook | None = None,
        frozen: FrozenHook | None = None,
        breaker: BreakerPolicy | None = _DEFAULT_BREAKER,
    ) -> Connector[Gateway]:
        """A gateway to the PostgreSQL database at ``dsn``, opened when awaited or entered.

        ``pool_size``: connections per agent. ``statement_timeout_s``: per statement, set by
        the engine. ``max_rows``: rows returned per request at most. ``journal_schema`` /
        ``journal_table``: where the idempotency journal lives (created when missing; the
        schema is hidden from agents). ``key_wait_s``: how long a duplicate of a key in
        flight waits for its outcome. ``connect_timeout_s``: opening a connection.
        ``catalog_refresh_s`` / ``catalog_max_age_s``: see the module docstring.
        ``breaker``: the per-agent breakers' policy, None for no breakers (then
        ``freeze``/``reinstate``/``status``/``history`` raise ``UsageError``).
        ``observe`` / ``frozen``: hooks chained after the breakers (see the module docstring).

        Arguments are checked here (``InvalidArgumentError``); opening raises
        ``GatewayError("database_unavailable")`` when the database cannot be reached, and
        ``GatewayError("database_error")`` when the journal cannot be created.
        """
        where = "Gateway.connect"
        v.non_empty_str(where, "dsn", dsn)
        try:
            conninfo_to_dict(dsn)
        except psycopg.Error:
            raise InvalidArgumentError(
                where, "dsn", "a libpq connection string or URI", "<dsn>"
            ) from None
        check_identifier(where, "journal_schema", journal_schema)
        check_identifier(where, "journal_table", journal_table)
        v.positive_int(where, "pool_size", pool_size)
        v.positive_number(where, "statement_timeout_s", statement_timeout_s)
        v.positive_int(where, "max_rows", max_rows)
        v.instance_of(where, "clock", clock, Clock)
        v.non_negative_number(where, "key_wait_s", key_wait_s)
        v.positive_number(where, "connect_timeout_s", connect_timeout_s)
        v.non_negative_number(where, "catalog_refresh_s", catalog_refresh_s)
        v.positive_number(where, "catalog_max_age_s", catalog_max_age_s, optional=True)
        v.non_negative_int(where, "replay_cache_size", replay_cache_size)
        for name, hook in (("observe", observe), ("frozen", frozen)):
            if hook is not None:
                v.callable_(where, name, hook)
        if breaker is not None:
            v.instance_of(where, "breaker", breaker, BreakerPolicy)
        config = _Config(
            dsn=dsn,
            pool_size=pool_size,
            statement_timeout_s=statement_timeout_s,
            max_rows=max_rows,
            clock=clock,
            journal=JournalName(journal_schema, journal_table),
            key_wait_s=key_wait_s,
            connect_timeout_s=connect_timeout_s,
            catalog_refresh_s=catalog_refresh_s,
            catalog_max_age_s=catalog_max_age_s,
            replay_cache_size=replay_cache_size,
            observe=observe,
            frozen=frozen,
            breaker=breaker,
        )
        return Connector(cls(config))

    # --- lifecycle --------------------------------------------------------------------------

    async def open(self) -> None:
        """Create the journals when missing, load the agents frozen now and the catalog.
        Idempotent; raises ``GatewayError`` (``database_unavailable``, ``database_error``),
        closing what it opened."""
        if self._keeper.is_open:
            return
        try:
            # The freeze journal's table exists before the catalog is first loaded, so its
            # creation never changes the catalog's version.
            if self._breakers is not None:
                await self._breakers.open()
            await self._keeper.open()
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Finish the freezes in flight, then close every pool and the gateway's own
        connections. Idempotent."""
        self._closed = True
        try:
            if self._breakers is not None:
                await self._breakers.close()
        finally:
            await self._pools.close()
            await self._keeper.close()

    async def __aenter__(self) -> Gateway:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # --- catalog and pools ------------------------------------------------------------------

    @property
    def catalog(self) -> Catalog:
        """The catalog requests are analysed against (the journal's schema left out)."""
        return self._keeper.catalog

    async def refresh_catalog(self) -> Catalog:
        """Reload the catalog now and return it; raises ``GatewayError``."""
        return await self._keeper.refresh()

    def connections_in_use(self, agent_id: str) -> int:
        """How many of ``agent_id``'s connections are checked out right now."""
        return self._pools.in_use(agent_id)

    async def drain(self, agent_id: str) -> bool:
        """Close ``agent_id``'s pool and cancel its running statements (they fail with
        ``database_unavailable``). Returns whether it had a pool; its next request opens a
        new one. Idempotent."""
        v.non_empty_str("Gateway.drain", "agent_id", agent_id)
        return await self._pools.drain(agent_id)

    async def _drain_frozen(self, agent_id: str, freeze: Freeze) -> None:
        await self._pools.drain(agent_id)

    # --- breakers ---------------------------------------------------------------------------

    def _require_breakers(self, what: str) -> Breakers:
        if self._breakers is None:
            raise UsageError(
                f"Gateway.{what} needs breakers, and this gateway was connected with "
                "breaker=None: pass a BreakerPolicy to Gateway.connect",
                method=what,
            )
        return self._breakers

    @property
    def breaker_policy(self) -> BreakerPolicy | None:
        """The breakers' policy, None when the gateway has no breakers."""
        return self._config.breaker

    async def freeze(self, agent_id: str, reason: str, *, by: str | None = None) -> Freeze:
        """Freeze ``agent_id`` by hand (recorded with ``reason`` and ``by``), draining its
        pool. Idempotent: an agent already frozen keeps (and gets back) its freeze. Raises
        ``InvalidArgumentError``, ``UsageError`` (no breakers, or the gateway is not open) and
        the journal's ``GatewayError`` (the freeze is in effect all the same)."""
        where = "Gateway.freeze"
        v.non_empty_str(where, "agent_id", agent_id)
        v.non_empty_str(where, "reason", reason)
        v.non_empty_str(where, "by", by, optional=True)
        return await self._require_breakers("freeze").freeze(agent_id, reason=reason, by=by)

    async def reinstate(self, agent_id: str, *, by: str, reason: str) -> Reinstatement:
        """Lift ``agent_id``'s freeze, recording who (``by``) and why (``reason``); its counts
        start from zero. Raises ``InvalidArgumentError`` (either empty), ``UsageError`` (not
        frozen, no breakers, not open) and the journal's ``GatewayError`` (it stays frozen)."""
        where = "Gateway.reinstate"
        v.non_empty_str(where, "agent_id", agent_id)
        v.non_empty_str(where, "by", by)
        v.non_empty_str(where, "reason", reason)
        return await self._require_breakers("reinstate").reinstate(agent_id, by=by, reason=reason)

    def status(self, agent_id: str) -> BreakerStatus:
        """``agent_id``'s breakers now: frozen or not, counts within the window, thresholds.
        Reads memory only."""
        v.non_empty_str("Gateway.status", "agent_id", agent_id)
        return self._require_breakers("status").status(agent_id)

    def frozen_agents(self) -> dict[str, Freeze]:
        """Every agent frozen now, with its freeze."""
        return self._require_breakers("frozen_agents").frozen_agents()

    async def history(self, agent_id: str) -> list[Freeze | Reinstatement]:
        """``agent_id``'s freezes and reinstatements, oldest first, from the journal."""
        v.non_empty_str("Gateway.history", "agent_id", agent_id)
        return await self._require_breakers("history").history(agent_id)

    # --- requests ---------------------------------------------------------------------------

    async def query(self, agent_id: str, request: Mapping[str, Any]) -> GatewayResult:
        """Run ``request`` for ``agent_id``: a SQL request or a structured operation.

        Returns a :class:`GatewayResult`; raises ``GatewayError`` (see the module docstring)
        and ``InvalidArgumentError`` when ``agent_id`` is not a non-empty string.
        """
        v.non_empty_str("Gateway.query", "agent_id", agent_id)
        if self._closed or not self._keeper.is_open:
            raise GatewayError("database_unavailable", "the gateway is closed or not open")
        config = self._config
        if self._breakers is not None or config.frozen is not None:
            await self._check_frozen(agent_id)
        planned: Planned | None = None
        try:
            await self._keeper.refresh_if_old()
            planned = await self._plan(request)
            result = await self._run(request, agent_id, planned)
        except GatewayError as exc:
            await self._report(agent_id, request, planned, exc.code, exc.message, None)
            raise
        if self._breakers is not None or config.observe is not None:
            await self._report(agent_id, request, planned, outcome_code(result), None, result)
        return result

    async def _check_frozen(self, agent_id: str) -> None:
        if self._breakers is not None:
            self._breakers.check(agent_id)
        hook = self._config.frozen
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

    async def _plan(self, request: Any) -> Planned:
        try:
            return plan_request(request, self.catalog)
        except GatewayError as exc:
            schema_may_have_grown = exc.code in ("unknown_table", "unknown_column")
            if schema_may_have_grown and await self._keeper.refresh_on_demand("refused"):
                return plan_request(request, self.catalog)
            raise

    async def _run(self, request: Any, agent_id: str, planned: Planned) -> GatewayResult:
        plan = planned.plan
        try:
            if plan.kind == "read":
                async with self._pools.lease(agent_id) as lease:
                    try:
                        return await run_read(lease, plan, max_rows=self._config.max_rows)
                    except psycopg.Error as exc:
                        timeout_s = self._config.statement_timeout_s
                        raise map_error(exc, lease, statement_timeout_s=timeout_s) from None
            if planned.key is None:
                raise GatewayError(
                    "idempotency_key_required",
                    "this statement writes, and a write needs an idempotency_key (the same "
                    "key to retry the same work, a new key for new work)",
                    kind="write",
                )
            fp = fingerprint(planned.normalized(), planned.params, planned.plan_hash)
            return await self._writes.run(agent_id, planned.key, fp, plan)
        except GatewayError as exc:
            # The schema changed under the analysis: the new catalog's refusal (with close
            # matches) says more than the database's error.
            shrunk = exc.details.get("sqlstate") in _SCHEMA_SQLSTATES
            if shrunk and await self._keeper.refresh_on_demand("database"):
                plan_request(request, self.catalog)
            raise

    async def _report(
        self,
        agent_id: str,
        request: Any,
        planned: Planned | None,
        code: str,
        message: str | None,
        result: GatewayResult | None,
    ) -> None:
        hook = self._config.observe
        breakers = self._breakers
        if hook is None and breakers is None:
            return
        outcome = QueryOutcome(
            agent_id=agent_id,
            code=code,
            request=_request_text(request),
            at=self._clock.now(),
            message=message,
            kind=planned.plan.kind if planned is not None else None,
            result=result,
        )
        # The request's connection is back in its pool by now: a freeze may drain it. A
        # gateway closed meanwhile has closed its breakers, so the outcome goes uncounted.
        if breakers is not None and not self._closed:
            counted = RequestOutcome(
                request=outcome.request, code=code, at=outcome.at, message=message
            )
            await breakers.observe(agent_id, counted)
        if hook is None:
            return
        done = hook(agent_id, outcome)
        if inspect.isawaitable(done):
            await done


def _request_text(request: Any) -> str:
    if isinstance(request, Mapping):
        sql = request.get("sql")
        if isinstance(sql, str) and "op" not in request:
            return sql
        try:
            return json.dumps(request, sort_keys=True, default=repr, ensure_ascii=False)
        except (TypeError, ValueError):
            pass
    return repr(request)
