"""The gateway on a SQLite file: SQL and structured operations, read-only reads, journalled
writes.

::

    async with SQLiteGateway.connect("shop.db") as gw:
        result = await gw.query("agent-7", {"sql": "SELECT id FROM orders WHERE status = $1",
                                            "params": ["open"]})

The same ``query(agent_id, request) -> GatewayResult`` contract as :class:`~._gateway.Gateway`.
A request is SQL (``{"sql", "params", "idempotency_key", "plan_hash"}``, only ``sql``
required) or a structured operation (``op``; see :mod:`~._ops`), never both. In order: the
breakers (``agent_frozen``); the request's shape (``invalid_operation``); analysis against the
catalog (SQL: see :mod:`~._sqlite_sql`; structured: ``unknown_table``, ``unknown_column``,
``invalid_operation``; an unknown name reloads the catalog when the schema changed and tries
once more); for SQL, ``params`` must hold exactly ``param_count`` values
(``invalid_operation``, ``details["expected"]``); for a write, the idempotency key
(``idempotency_key_required``); then the database (see :mod:`~._sqlite_engine`). SQL
placeholders are ``$1 .. $n`` (as on PostgreSQL; run as SQLite's ``?1 .. ?n``), ``?1 .. ?n``
or bare ``?``; parameters are bound by SQLite, never spliced into the text. Every SQLite call
runs on a worker thread, never on the event loop; a cached SQL analysis is answered without
one.

Idempotency. Keys are journalled in the target itself (table ``corral_gateway_journal``,
hidden from agents), in the write's own transaction: a crash never leaves a write's fate
unknown. Keys are per agent; the fingerprint is :func:`~._journal.fingerprint` over the
normalised statement (SQL) or the operation's canonical JSON (structured), the parameters as
the agent gave them, and ``plan_hash``. Same key and fingerprint: ``replayed`` with the stored
result, nothing run. Different fingerprint: ``idempotency_conflict``. The key running in this
gateway now: ``idempotency_in_progress`` (retryable); in another process, the write waits for
that one's transaction and is then ``replayed``. A key journalled ``in_flight`` (only
journals of earlier versions, kept outside the target, could leave one):
``outcome_unknown`` -- the agent must check the data and use a new key.

Freezes are kept in the SQLite file ``journal_path`` (default: the target's path with
``.corral-journal`` appended), which earlier versions also used for keys; those keys are moved
into the target when the gateway opens.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from corral.gateway._breaker import Breakers
from corral.gateway._breaker_journal import SQLiteFreezeJournal
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
from corral.gateway._gateway import _request_text
from corral.gateway._journal import fingerprint
from corral.gateway._ops import CompiledOperation, compile_operation
from corral.gateway._result import GatewayResult, outcome_code
from corral.gateway.postgres._plan import _key
from corral.gateway.sqlite._file import Journalled, ReadPlan, SQLiteEngine, WritePlan
from corral.gateway.sqlite._sql import SqliteAnalysis, bind_params
from corral.kernel import SYSTEM_CLOCK, Clock, UsageError
from corral.kernel import _validate as v
from corral.kernel._errors import InvalidArgumentError

__all__ = ["SQLiteGateway"]

T = TypeVar("T")
_DEFAULT_BREAKER = BreakerPolicy()
_WORKERS = 4
_SQL_KEYS = ("sql", "params", "idempotency_key", "plan_hash")
_UNKNOWN = ("unknown_table", "unknown_column")


class SQLiteGateway:
    """Agents' access to one SQLite database file. Create with :meth:`connect`."""

    def __init__(
        self,
        path: Path,
        journal_path: Path,
        *,
        statement_timeout_s: float,
        max_rows: int,
        breaker: BreakerPolicy | None,
        clock: Clock,
    ) -> None:
        self._clock = clock
        self._policy = breaker
        self._engine = SQLiteEngine(
            path,
            journal_path,
            statement_timeout_s=statement_timeout_s,
            max_rows=max_rows,
            monotonic=clock.monotonic,
        )
        self._executor: ThreadPoolExecutor | None = None
        self._catalog: Catalog | None = None
        self._running: dict[tuple[str, str], str] = {}  # (agent, key) -> fingerprint
        self._keys_lock = asyncio.Lock()
        self._in_flight_at_open = 0
        self._breakers: Breakers | None = None
        if breaker is not None:
            self._breakers = Breakers(
                breaker, journal=SQLiteFreezeJournal(journal_path), clock=clock
            )

    @classmethod
    def connect(
        cls,
        path: str | Path,
        *,
        journal_path: str | Path | None = None,
        statement_timeout_s: float = 5,
        max_rows: int = 1000,
        breaker: BreakerPolicy | None = _DEFAULT_BREAKER,
        clock: Clock = SYSTEM_CLOCK,
    ) -> Connector[SQLiteGateway]:
        """A gateway to the existing SQLite file ``path``, opened when awaited or entered.

        ``journal_path``: the breakers' freeze journal (created when missing; never the
        target itself); idempotency keys live in the target. ``statement_timeout_s``: per
        statement, by interrupting it. ``max_rows``: rows returned per request at most.
        ``breaker``: the per-agent breakers' policy, None for none. Arguments are checked
        here (``InvalidArgumentError``); opening raises ``GatewayError("database_unavailable")``
        when the file cannot be opened.
        """
        where = "SQLiteGateway.connect"
        v.instance_of(where, "path", path, (str, Path))
        if not str(path).strip():
            raise InvalidArgumentError(where, "path", "a file path", path)
        v.instance_of(where, "journal_path", journal_path, (str, Path, type(None)))
        v.positive_number(where, "statement_timeout_s", statement_timeout_s)
        v.positive_int(where, "max_rows", max_rows)
        if breaker is not None:
            v.instance_of(where, "breaker", breaker, BreakerPolicy)
        v.instance_of(where, "clock", clock, Clock)
        target = Path(path)
        journal = Path(journal_path) if journal_path is not None else None
        if journal is None:
            journal = target.with_name(target.name + ".corral-journal")
        if journal.resolve() == target.resolve():
            raise InvalidArgumentError(
                where, "journal_path", "a file other than the target", journal_path
            )
        gateway = cls(
            target,
            journal,
            statement_timeout_s=statement_timeout_s,
            max_rows=max_rows,
            breaker=breaker,
            clock=clock,
        )
        return Connector(gateway)

    # --- lifecycle --------------------------------------------------------------------------

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if self._executor is None:
            raise GatewayError("database_unavailable", "the gateway is closed or not open")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    async def open(self) -> None:
        """Open the target, the journal and the breakers; idempotent. Raises
        ``GatewayError("database_unavailable")``, closing what it opened."""
        if self._executor is not None:
            return
        self._executor = ThreadPoolExecutor(_WORKERS, thread_name_prefix="corral-sqlite")
        try:
            self._catalog, self._in_flight_at_open = await self._call(self._engine.open)
            if self._breakers is not None:
                await self._breakers.open()
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Finish the freezes in flight, close every connection. Idempotent."""
        executor = self._executor
        if executor is None:
            return
        try:
            if self._breakers is not None:
                await self._breakers.close()
        finally:
            await asyncio.get_running_loop().run_in_executor(executor, self._engine.close)
            self._executor = None
            executor.shutdown(wait=True)

    async def __aenter__(self) -> SQLiteGateway:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def catalog(self) -> Catalog:
        """The catalog requests are checked against (the gateway's journal table hidden)."""
        if self._catalog is None:
            raise UsageError("the SQLite gateway is not open")
        return self._catalog

    @property
    def keys_in_flight_at_open(self) -> int:
        """How many keys were journalled ``in_flight`` when the gateway opened: writes that a
        crash under an earlier version's separate journal left with an unknown outcome (each
        reported ``outcome_unknown`` on use). Always 0 for keys journalled in the target."""
        return self._in_flight_at_open

    # --- breakers ---------------------------------------------------------------------------

    def _require_breakers(self, what: str) -> Breakers:
        if self._breakers is None:
            raise UsageError(
                f"SQLiteGateway.{what} needs breakers, and this gateway was connected with "
                "breaker=None: pass a BreakerPolicy to SQLiteGateway.connect",
                method=what,
            )
        return self._breakers

    @property
    def breaker_policy(self) -> BreakerPolicy | None:
        """The breakers' policy, None when the gateway has no breakers."""
        return self._policy

    def frozen_agents(self) -> dict[str, Freeze]:
        """Every agent frozen now, with its freeze."""
        return self._require_breakers("frozen_agents").frozen_agents()

    async def freeze(self, agent_id: str, reason: str, *, by: str | None = None) -> Freeze:
        """Freeze ``agent_id`` by hand; see :meth:`Gateway.freeze`."""
        where = "SQLiteGateway.freeze"
        v.non_empty_str(where, "agent_id", agent_id)
        v.non_empty_str(where, "reason", reason)
        v.non_empty_str(where, "by", by, optional=True)
        return await self._require_breakers("freeze").freeze(agent_id, reason=reason, by=by)

    async def reinstate(self, agent_id: str, *, by: str, reason: str) -> Reinstatement:
        """Lift ``agent_id``'s freeze; see :meth:`Gateway.reinstate`."""
        where = "SQLiteGateway.reinstate"
        v.non_empty_str(where, "agent_id", agent_id)
        v.non_empty_str(where, "by", by)
        v.non_empty_str(where, "reason", reason)
        return await self._require_breakers("reinstate").reinstate(agent_id, by=by, reason=reason)

    def status(self, agent_id: str) -> BreakerStatus:
        """``agent_id``'s breakers now. Reads memory only."""
        v.non_empty_str("SQLiteGateway.status", "agent_id", agent_id)
        return self._require_breakers("status").status(agent_id)

    async def history(self, agent_id: str) -> list[Freeze | Reinstatement]:
        """``agent_id``'s freezes and reinstatements, oldest first, from the journal."""
        v.non_empty_str("SQLiteGateway.history", "agent_id", agent_id)
        return await self._require_breakers("history").history(agent_id)

    # --- requests ---------------------------------------------------------------------------

    async def query(self, agent_id: str, request: Mapping[str, Any]) -> GatewayResult:
        """Run the request (SQL or a structured operation) for ``agent_id``.

        Returns a :class:`GatewayResult`; raises ``GatewayError`` (see the module docstring)
        and ``InvalidArgumentError`` when ``agent_id`` is not a non-empty string.
        """
        v.non_empty_str("SQLiteGateway.query", "agent_id", agent_id)
        if self._executor is None:
            raise GatewayError("database_unavailable", "the gateway is closed or not open")
        if self._breakers is not None:
            self._breakers.check(agent_id)
        try:
            result = await self._run(agent_id, request)
        except GatewayError as exc:
            await self._report(agent_id, request, exc.code, exc.message)
            raise
        await self._report(agent_id, request, outcome_code(result), None)
        return result

    async def _reloaded(self) -> Catalog | None:
        # The schema may have changed since the catalog was loaded.
        catalog = await self._call(self._engine.refresh_catalog)
        if catalog is None or catalog.version == self.catalog.version:
            return None
        self._catalog = catalog
        return catalog

    async def _compile(self, request: Mapping[str, Any]) -> CompiledOperation:
        try:
            return compile_operation(request, self.catalog)
        except GatewayError as exc:
            if exc.code not in _UNKNOWN or (catalog := await self._reloaded()) is None:
                raise
            return compile_operation(request, catalog)

    async def _analyze(self, sql: str) -> SqliteAnalysis:
        try:
            return await self._analysis(sql, self.catalog)
        except GatewayError as exc:
            if exc.code not in _UNKNOWN or (catalog := await self._reloaded()) is None:
                raise
            return await self._analysis(sql, catalog)

    async def _analysis(self, sql: str, catalog: Catalog) -> SqliteAnalysis:
        # A cached analysis is answered on the event loop; only a miss compiles on a thread.
        found = self._engine.analyzer.cached(sql, catalog)
        if found is not None:
            return found
        return await self._call(self._engine.analyze, sql, catalog)

    async def _run(self, agent_id: str, request: Any) -> GatewayResult:
        if not isinstance(request, Mapping) or ("sql" in request) == ("op" in request):
            shown = repr(request if not isinstance(request, Mapping) else sorted(map(str, request)))
            shown = shown if len(shown) <= 80 else shown[:77] + "..."
            raise GatewayError(
                "invalid_operation",
                f"request must be a mapping with sql or op (not both), got {shown}",
                key="request",
                value=shown,
            )
        if "sql" in request:
            return await self._run_sql(agent_id, request)
        compiled = await self._compile(request)
        key, plan_hash = _key(request, "idempotency_key"), _key(request, "plan_hash")
        if compiled.kind == "read":
            return await self._call(self._engine.read, ReadPlan.of(compiled))
        fp = fingerprint(compiled.normalized, compiled.params, plan_hash)
        return await self._keyed(WritePlan.of(compiled), agent_id, _required(key), fp)

    async def _run_sql(self, agent_id: str, request: Mapping[str, Any]) -> GatewayResult:
        for name in request:
            if name not in _SQL_KEYS:
                raise GatewayError(
                    "invalid_operation",
                    f"{name} must be absent: a SQL request has only {', '.join(_SQL_KEYS)}",
                    key=str(name),
                    value=repr(request[name])[:80],
                )
        sql = request["sql"]
        if not isinstance(sql, str) or not sql.strip():
            shown = repr(sql)[:80]
            raise GatewayError(
                "invalid_operation",
                f"sql must be a non-empty string, got {shown}",
                key="sql",
                value=shown,
            )
        params = bind_params(request.get("params"))
        key, plan_hash = _key(request, "idempotency_key"), _key(request, "plan_hash")
        analysis = await self._analyze(sql)
        if analysis.param_count != len(params):
            raise GatewayError(
                "invalid_operation",
                f"the statement's highest placeholder is ${analysis.param_count}, so params "
                f"must hold {analysis.param_count} value(s); it holds {len(params)}",
                key="params",
                value=len(params),
                expected=analysis.param_count,
            )
        if analysis.kind == "read":
            plan = ReadPlan.of_sql(analysis, params, self.catalog)
            return await self._call(self._engine.read, plan)
        raw = request.get("params") or ()
        fp = fingerprint(analysis.normalized, tuple(raw), plan_hash)
        write = WritePlan.of_sql(analysis, params)
        return await self._keyed(write, agent_id, _required(key), fp)

    async def _keyed(self, plan: WritePlan, agent_id: str, key: str, fp: str) -> GatewayResult:
        slot = (agent_id, key)
        async with self._keys_lock:
            running = self._running.get(slot)
            if running is not None:
                if running != fp:
                    raise _conflict(key)
                raise GatewayError(
                    "idempotency_in_progress",
                    f"idempotency key {key!r} is running in this gateway now; retry with the "
                    "same key",
                    key=key,
                )
            self._running[slot] = fp
        # Shielded: a cancelled caller leaves the worker thread running, so the key stays
        # taken until the thread has finished with it.
        task = asyncio.ensure_future(self._write(plan, agent_id, key, fp))
        task.add_done_callback(lambda _: self._running.pop(slot, None))
        return await asyncio.shield(task)

    async def _write(self, plan: WritePlan, agent_id: str, key: str, fp: str) -> GatewayResult:
        now = self._clock.now().isoformat()
        outcome = await self._call(
            self._engine.write, plan, agent_id=agent_id, key=key, fingerprint=fp, now=now
        )
        if isinstance(outcome, Journalled):
            return _journalled(key, fp, outcome)
        return GatewayResult(
            rows=outcome.rows,
            columns=outcome.columns,
            row_count=outcome.row_count,
            truncated=outcome.truncated,
        )

    async def _report(self, agent_id: str, request: Any, code: str, message: str | None) -> None:
        breakers = self._breakers
        if breakers is None or self._executor is None:
            return
        outcome = RequestOutcome(
            request=_request_text(request), code=code, at=self._clock.now(), message=message
        )
        done = breakers.observe(agent_id, outcome)
        if inspect.isawaitable(done):
            await done


def _conflict(key: str) -> GatewayError:
    return GatewayError(
        "idempotency_conflict",
        f"idempotency key {key!r} was used for a different operation (another statement, "
        "other parameters or another plan_hash); use a new key for new work",
        key=key,
    )


def _required(key: str | None) -> str:
    if key is None:
        raise GatewayError(
            "idempotency_key_required",
            "this operation writes, and a write needs an idempotency_key (the same key "
            "to retry the same work, a new key for new work)",
            kind="write",
        )
    return key


def _journalled(key: str, fp: str, found: Journalled) -> GatewayResult:
    if found.fingerprint != fp:
        raise _conflict(key)
    stored = found.result
    if found.state != "completed" or stored is None:
        raise GatewayError(
            "outcome_unknown",
            f"idempotency key {key!r} was in flight when a gateway stopped: the write may or "
            "may not have been applied; check the data, then use a new key",
            key=key,
        )
    return GatewayResult(
        rows=stored.rows,
        columns=stored.columns,
        row_count=stored.row_count,
        status="replayed",
        truncated=stored.truncated,
    )
