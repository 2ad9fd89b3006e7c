"""The SQLite engine behind :class:`~corral.gateway.Gateway`: the request's shape and plan,
the worker threads every SQLite call runs on, and the keys in flight in this process."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from corral.gateway._bounds import timed_out, timeout_margin_s
from corral.gateway._breaker_journal import FreezeJournal, SQLiteFreezeJournal
from corral.gateway._catalog import Catalog
from corral.gateway._errors import GatewayError
from corral.gateway._journal import fingerprint, stored_plan
from corral.gateway._ops import compile_operation
from corral.gateway._request import check_param_count, request_key
from corral.gateway._result import GatewayResult
from corral.gateway.sqlite._analysis import SqliteAnalysis
from corral.gateway.sqlite._bounded import Watch
from corral.gateway.sqlite._file import SQLiteFile
from corral.gateway.sqlite._params import bind_params
from corral.gateway.sqlite._plan import Journalled, ReadPlan, WritePlan
from corral.kernel import Clock, UsageError
from corral.kernel import _validate as v
from corral.kernel._errors import InvalidArgumentError

__all__ = ["SQLiteEngine", "SQLitePlanned", "sqlite_engine"]

T = TypeVar("T")
_WORKERS = 4
_SQL_KEYS = ("sql", "params", "idempotency_key", "plan_hash")


@dataclass(frozen=True, slots=True)
class SQLitePlanned:
    """A planned SQLite request; ``params`` are the agent's, as fingerprinted."""

    plan: ReadPlan | WritePlan
    kind: Literal["read", "write"]
    normalized: str
    params: tuple[Any, ...]
    key: str | None
    plan_hash: str | None

    def fingerprint(self) -> str:
        return fingerprint(self.normalized, self.params, self.plan_hash)


def sqlite_engine(
    where: str,
    path: object,
    *,
    journal_path: object,
    statement_timeout_s: float,
    max_rows: int,
    max_bytes: int,
    clock: Clock,
) -> SQLiteEngine:
    """The engine for the existing SQLite file ``path``, its arguments checked
    (``InvalidArgumentError``). ``journal_path`` None: the target's path with
    ``.corral-journal`` appended."""
    v.instance_of(where, "path", path, (str, Path))
    if not str(path).strip():
        raise InvalidArgumentError(where, "path", "a file path", path)
    v.instance_of(where, "journal_path", journal_path, (str, Path, type(None)))
    v.positive_number(where, "statement_timeout_s", statement_timeout_s)
    v.positive_int(where, "max_rows", max_rows)
    v.positive_int(where, "max_bytes", max_bytes)
    v.instance_of(where, "clock", clock, Clock)
    target = Path(str(path))
    journal = Path(str(journal_path)) if journal_path is not None else None
    if journal is None:
        journal = target.with_name(target.name + ".corral-journal")
    if journal.resolve() == target.resolve():
        raise InvalidArgumentError(
            where, "journal_path", "a file other than the target", journal_path
        )
    file = SQLiteFile(
        target,
        statement_timeout_s=statement_timeout_s,
        max_rows=max_rows,
        max_bytes=max_bytes,
        monotonic=clock.monotonic,
    )
    return SQLiteEngine(file, journal, clock, statement_timeout_s)


class SQLiteEngine:
    """One SQLite file: every blocking call on a worker thread, never on the event loop (a
    cached SQL analysis is answered without one)."""

    write_noun = "operation"

    def __init__(
        self, file: SQLiteFile, journal_path: Path, clock: Clock, statement_timeout_s: float
    ) -> None:
        self.file = file
        self._timeout_s = statement_timeout_s
        self._margin_s = timeout_margin_s(statement_timeout_s)
        self._journal_path = journal_path
        self._clock = clock
        self._executor: ThreadPoolExecutor | None = None
        self._catalog: Catalog | None = None
        # (agent, key, stored plan_hash), a key's identity -> fingerprint
        self._running: dict[tuple[str, str, str], str] = {}
        self._keys_lock = asyncio.Lock()
        self.keys_in_flight_at_open = 0
        # Statements a request stopped waiting for, still running on their worker threads.
        self._abandoned: set[asyncio.Future[Any]] = set()

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if self._executor is None:
            raise GatewayError("database_unavailable", "the gateway is closed or not open")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    def _submit(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> asyncio.Future[T]:
        if self._executor is None:
            raise GatewayError("database_unavailable", "the gateway is closed or not open")
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    async def _bounded(
        self, future: asyncio.Future[T], watch: Watch, *, key: str | None = None
    ) -> T:
        """``future``'s result, within the statement timeout plus the margin (on the event
        loop's clock): at the timeout ``watch`` interrupts the statement; past the margin
        the request answers ``statement_timeout`` and leaves its worker thread to finish
        (SQLite cannot be stopped inside one instruction). A cancelled caller leaves the
        thread running too."""
        loop = asyncio.get_running_loop()
        timer = loop.call_later(self._timeout_s, watch.interrupt)
        try:
            await asyncio.wait({future}, timeout=self._timeout_s + self._margin_s)
        except asyncio.CancelledError:
            # The caller is gone, its statement is not: the timer stays armed, so the statement
            # is still interrupted at its deadline (or never starts, if it is still queued);
            # otherwise cancelled requests would hold the worker threads for as long as they
            # like, and every agent behind them would wait.
            if future.done():
                timer.cancel()
                _retrieved(future)
            else:
                self._abandon(future)
                future.add_done_callback(lambda _: timer.cancel())
            raise
        timer.cancel()
        if future.done():
            return future.result()
        self._abandon(future)
        raise timed_out(self._timeout_s, writing=key is not None, key=key)

    def _abandon(self, future: asyncio.Future[Any]) -> None:
        # Its thread finishes on its own; closing waits for it, and what it raises is dropped.
        self._abandoned.add(future)
        future.add_done_callback(self._abandoned.discard)
        future.add_done_callback(_retrieved)

    # --- lifecycle ----------------------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        return self._executor is not None

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            raise UsageError("the SQLite gateway is not open")
        return self._catalog

    def freeze_journal(self) -> FreezeJournal:
        # Never in the target: an agent's write cannot touch a freeze.
        return SQLiteFreezeJournal(self._journal_path)

    async def open(self) -> None:
        self._executor = ThreadPoolExecutor(_WORKERS, thread_name_prefix="corral-sqlite")
        self.keys_in_flight_at_open = await self.call(self.file.open)

    async def load_catalog(self) -> None:
        self._catalog = await self.call(self.file.first_catalog)

    def closing(self) -> None:
        return None

    async def close(self) -> None:
        executor = self._executor
        if executor is None:
            return
        try:
            if self._abandoned:
                # A connection is closed only once no thread runs a statement on it.
                await asyncio.wait(set(self._abandoned))
            await asyncio.get_running_loop().run_in_executor(executor, self.file.close)
        finally:
            self._executor = None
            executor.shutdown(wait=True)

    # --- catalog ------------------------------------------------------------------------------

    async def refresh_catalog(self) -> Catalog:
        self._catalog = await self.call(self.file.load_catalog)
        return self._catalog

    async def refresh_if_old(self) -> None:
        # The schema version is read whenever a name is unknown; nothing else goes stale.
        return None

    async def reload_catalog(self, sign: Literal["refused", "database"]) -> bool:
        catalog = await self.call(self.file.refresh_catalog)
        if catalog is None or catalog.version == self.catalog.version:
            return False
        self._catalog = catalog
        return True

    def schema_shrunk(self, error: GatewayError) -> bool:
        # A table dropped under a statement is refused when SQLite compiles it, as unknown.
        return False

    # --- requests -----------------------------------------------------------------------------

    async def plan(self, request: Any, catalog: Catalog) -> SQLitePlanned:
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
            return await self._plan_sql(request, catalog)
        compiled = compile_operation(request, catalog)
        key, plan_hash = request_key(request, "idempotency_key"), request_key(request, "plan_hash")
        if compiled.kind == "read":
            plan: ReadPlan | WritePlan = ReadPlan.of(compiled)
        else:
            plan = WritePlan.of(compiled)
        return SQLitePlanned(
            plan, compiled.kind, compiled.normalized, compiled.params, key, plan_hash
        )

    async def _plan_sql(self, request: Mapping[str, Any], catalog: Catalog) -> SQLitePlanned:
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
        key, plan_hash = request_key(request, "idempotency_key"), request_key(request, "plan_hash")
        analysis = await self._analysis(sql, catalog)
        check_param_count(analysis.param_count, len(params))
        raw = tuple(request.get("params") or ())
        if analysis.kind == "read":
            plan: ReadPlan | WritePlan = ReadPlan.of_sql(analysis, params, catalog)
        else:
            plan = WritePlan.of_sql(analysis, params)
        return SQLitePlanned(plan, analysis.kind, analysis.normalized, raw, key, plan_hash)

    async def _analysis(self, sql: str, catalog: Catalog) -> SqliteAnalysis:
        # A cached analysis is answered on the event loop; only a miss compiles on a thread.
        found = self.file.analyzer.cached(sql, catalog)
        if found is not None:
            return found
        return await self.call(self.file.analyze, sql, catalog)

    async def read(self, agent_id: str, planned: SQLitePlanned) -> GatewayResult:
        assert isinstance(planned.plan, ReadPlan)
        watch = Watch(self._timeout_s)
        return await self._bounded(self._submit(self.file.read, planned.plan, watch), watch)

    async def write(self, agent_id: str, key: str, planned: SQLitePlanned) -> GatewayResult:
        assert isinstance(planned.plan, WritePlan)
        fp = planned.fingerprint()
        slot = (agent_id, key, stored_plan(planned.plan_hash))
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
        watch = Watch(self._timeout_s)
        now = self._clock.now().isoformat()
        try:
            future = self._submit(
                self.file.write,
                planned.plan,
                agent_id=agent_id,
                key=key,
                plan_hash=slot[2],
                fingerprint=fp,
                now=now,
                watch=watch,
            )
        except BaseException:
            self._running.pop(slot, None)
            raise
        # The key stays taken until the worker thread has finished with it, whether the
        # caller was cancelled or the request answered statement_timeout before.
        future.add_done_callback(lambda _: self._running.pop(slot, None))
        outcome = await self._bounded(future, watch, key=key)
        if isinstance(outcome, Journalled):
            return _journalled(key, fp, outcome)
        return GatewayResult(
            rows=outcome.rows,
            columns=outcome.columns,
            row_count=outcome.row_count,
            truncated=outcome.truncated,
            warnings=outcome.warnings,
        )

    async def drain(self, agent_id: str) -> bool:
        # Reads and writes share the engine's connections: there is no pool of the agent's.
        return False

    def connections_in_use(self, agent_id: str) -> int:
        return 0


def _retrieved(future: asyncio.Future[Any]) -> None:
    # The request answered before its thread finished: what the thread raises is not news.
    if not future.cancelled():
        future.exception()


def _conflict(key: str) -> GatewayError:
    return GatewayError(
        "idempotency_conflict",
        f"idempotency key {key!r} was used for a different operation under the same "
        "plan_hash (another statement or other parameters); use a new key, or a new "
        "plan_hash for a new plan",
        key=key,
    )


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
        warnings=stored.warnings,
    )
