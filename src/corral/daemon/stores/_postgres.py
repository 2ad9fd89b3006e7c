"""``PostgresStore``: the store that several daemons can share (psycopg 3, async pool).

How it numbers events across processes and what its errors mean: "Seed 001" in
docs/architecture.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool

from corral.daemon._errors import StoreUnavailableError
from corral.daemon._events import Event, NewEvent
from corral.daemon._sessions import row_changes
from corral.daemon._state import PROJECTIONS_VERSION, ReplayError, State, Tx, replay
from corral.daemon.stores._base import MergeHook, Watchers, refuse_unstorable
from corral.daemon.stores._group import CommitStats, GroupCommitter, Pending, Plan, plan
from corral.daemon.stores._sqlite import _dump
from corral.daemon.stores._turns import PostgresTurns, TurnRow, TurnRows, postgres_ddl
from corral.kernel import SYSTEM_CLOCK, Clock, InvalidArgumentError, UsageError
from corral.kernel import _validate as v

__all__ = ["PostgresStore", "StoreUnavailableError"]

_Pool = AsyncConnectionPool[psycopg.AsyncConnection[TupleRow]]

# The projection tables: rebuilt together from the log when the stored projections were
# built by another version of the reducer.
_PROJECTIONS = ("agents", "notices", "decisions", "commands", "tokens", "sessions")
# (``sessions`` is the table ``session_messages``: one row per message.)

# One key for every corral schema: concurrent first opens must not race on CREATE TABLE.
_SCHEMA_LOCK_KEY = 0x636F7272616C  # "corral"


def qualified(schema: str | None, name: str) -> sql.Identifier:
    """Table ``name`` in ``schema`` (None: the first schema of the search path)."""
    return sql.Identifier(schema, name) if schema else sql.Identifier(name)


class _Statements:
    """Every statement, with the table names qualified by the store's schema."""

    def __init__(self, schema: str | None) -> None:
        def table(name: str) -> sql.Identifier:
            return qualified(schema, name)

        self.names = names = {
            "events": table("events"),
            "agents": table("agents"),
            "notices": table("notices"),
            "decisions": table("decisions"),
            "commands": table("commands"),
            "meta": table("meta"),
            "tokens": table("tokens"),
            "sessions": table("session_messages"),
            "counter": table("event_counter"),
        }

        def q(text: str) -> sql.Composed:
            return sql.SQL(text).format(**names)

        self.ddl: list[sql.Composed] = []
        if schema:
            self.ddl.append(
                sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema))
            )
        self.ddl += [
            q(
                "CREATE TABLE IF NOT EXISTS {events} (seq bigint PRIMARY KEY, ts text NOT NULL, "
                "type text NOT NULL, agent_id text, data json NOT NULL)"
            ),
            q("CREATE INDEX IF NOT EXISTS events_agent ON {events} (agent_id, seq)"),
            q("CREATE TABLE IF NOT EXISTS {agents} (id text PRIMARY KEY, data json NOT NULL)"),
            q("CREATE TABLE IF NOT EXISTS {notices} (id bigint PRIMARY KEY, data json NOT NULL)"),
            q("CREATE TABLE IF NOT EXISTS {decisions} (id text PRIMARY KEY, data json NOT NULL)"),
            q("CREATE TABLE IF NOT EXISTS {commands} (key text PRIMARY KEY, data json NOT NULL)"),
            q("CREATE TABLE IF NOT EXISTS {meta} (key text PRIMARY KEY, value text NOT NULL)"),
            q("CREATE TABLE IF NOT EXISTS {tokens} (name text PRIMARY KEY, data json NOT NULL)"),
            q(
                "CREATE TABLE IF NOT EXISTS {sessions} (agent_id text NOT NULL, "
                "n bigint NOT NULL, data json NOT NULL, PRIMARY KEY (agent_id, n))"
            ),
            q(
                "CREATE TABLE IF NOT EXISTS {counter} (id boolean PRIMARY KEY DEFAULT true "
                "CHECK (id), last_seq bigint NOT NULL)"
            ),
            # Only when the row is missing: inserting over it would wait for another daemon's
            # append in flight (it has bumped the row), which waits for this transaction's
            # lock on the events table: a deadlock.
            q(
                "INSERT INTO {counter} (id, last_seq) "
                "SELECT true, (SELECT COALESCE(MAX(seq), 0) FROM {events}) "
                "WHERE NOT EXISTS (SELECT 1 FROM {counter}) ON CONFLICT (id) DO NOTHING"
            ),
        ]
        self.ddl += postgres_ddl(table)  # turn records (see stores._turns)
        self.load_agents = q("SELECT data FROM {agents}")
        self.load_notices = q("SELECT id, data FROM {notices}")
        self.load_decisions = q("SELECT id, data FROM {decisions}")
        self.load_version = q("SELECT value FROM {meta} WHERE key = 'projections'")
        self.set_version = q(
            "INSERT INTO {meta} (key, value) VALUES ('projections', %s) "
            "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value"
        )
        self.clear = {key: q(f"DELETE FROM {{{key}}}") for key in _PROJECTIONS}
        self.load_commands = q("SELECT key, data FROM {commands}")
        self.load_tokens = q("SELECT name, data FROM {tokens}")
        self.load_sessions = q("SELECT agent_id, data FROM {sessions} ORDER BY agent_id, n")
        self.delete_session = q("DELETE FROM {sessions} WHERE agent_id = %s")
        self.delete_agent = q("DELETE FROM {agents} WHERE id = %s")
        self.delete_notices = q("DELETE FROM {notices} WHERE id = ANY(%s)")
        self.drop_messages = q("DELETE FROM {sessions} WHERE agent_id = %s AND n < %s")
        self.insert_messages = q(
            "INSERT INTO {sessions} (agent_id, n, data) "
            "SELECT a, n, d::json FROM unnest(%b::text[], %b::bigint[], %b::text[]) "
            "AS u(a, n, d) ON CONFLICT (agent_id, n) DO UPDATE SET data = EXCLUDED.data"
        )
        self.load_counter = q("SELECT last_seq FROM {counter}")
        self.bump = q("UPDATE {counter} SET last_seq = last_seq + %s RETURNING last_seq")
        self.set_counter = q("UPDATE {counter} SET last_seq = %s")
        # A group's rows of one table go in one statement, as arrays (one parameter each,
        # the JSON already text): a statement per row cost more than the rest of a turn.
        self.insert_events = q(
            "INSERT INTO {events} (seq, ts, type, agent_id, data) "
            "SELECT s, t, y, a, d::json FROM unnest(%b::bigint[], %b::text[], %b::text[], "
            "%b::text[], %b::text[]) AS u(s, t, y, a, d)"
        )
        self.upsert = {
            key: q(
                f"INSERT INTO {{{key}}} ({col}, data) "
                f"SELECT k, d::json FROM unnest(%b::{kind}[], %b::text[]) AS u(k, d) "
                f"ON CONFLICT ({col}) DO UPDATE SET data = EXCLUDED.data"
            )
            for key, col, kind in (
                ("agents", "id", "text"),
                ("notices", "id", "bigint"),
                ("decisions", "id", "text"),
                ("commands", "key", "text"),
                ("tokens", "name", "text"),
            )
        }
        cols = "SELECT seq, ts, type, agent_id, data FROM {events}"
        self.read_all = q(f"{cols} WHERE seq > %s ORDER BY seq LIMIT %s")
        self.read_agent = q(f"{cols} WHERE agent_id = %s AND seq > %s ORDER BY seq LIMIT %s")
        self.read_range = q(f"{cols} WHERE seq > %s AND seq <= %s ORDER BY seq")
        self.read_everything = q(f"{cols} ORDER BY seq")


def _safe_dsn(params: dict[str, Any]) -> str:
    """The connection string without its password (for messages and ``repr``)."""
    return make_conninfo(**{k: v for k, v in params.items() if k != "password"})


class Fence(Protocol):
    """What a store shared by several daemons checks in each group's transaction (the
    leases of ``corral.daemon._cluster``); every method runs inside the transaction, after
    the counter's row lock is taken and the other writers' events are applied."""

    async def refused(
        self, conn: psycopg.AsyncConnection[TupleRow], group: Sequence[Pending]
    ) -> dict[Pending, Exception]:
        """The members that may not be written, each with the error its caller gets."""
        ...

    async def written(
        self, conn: psycopg.AsyncConnection[TupleRow], events: Sequence[Event]
    ) -> None:
        """Write what goes with ``events`` in the same transaction (leases of created and
        deleted agents, the notification that wakes the other daemons)."""
        ...

    def committed(self, events: Sequence[Event]) -> None:
        """``events`` are durable and merged (no ``await`` may come before this)."""
        ...


class PostgresStore(PostgresTurns):
    """A :class:`Store` in a PostgreSQL database, safe to share between daemons.

    ``dsn`` is a libpq connection string or URI; ``schema`` (created if missing) keeps the
    tables apart from others in the same database, default the search path's first schema.
    Connections come from a pool of at most ``pool_size``. Appends within a process are
    committed in groups (see ``stores._group``): those that arrive while a commit is in flight
    go together in the next transaction (:attr:`commit_stats` counts them); across processes
    they are serialised by the counter row. Commits use the server's ``synchronous_commit``
    (on by default): a committed append survives a crash.

    :meth:`open` raises :class:`StoreUnavailableError` when the server does not answer and
    is a no-op on an open store; :meth:`close` waits for an append in flight and is
    idempotent. Once begun, an append runs to its end even if its caller is cancelled, so
    ``state`` always follows what was committed.
    """

    def __init__(
        self,
        dsn: str,
        *,
        clock: Clock = SYSTEM_CLOCK,
        schema: str | None = None,
        pool_size: int = 4,
    ) -> None:
        where = "PostgresStore"
        v.non_empty_str(where, "dsn", dsn)
        try:
            params = conninfo_to_dict(dsn)
        except psycopg.ProgrammingError as exc:
            raise InvalidArgumentError(
                where, "dsn", "a libpq connection string or postgresql:// URI", dsn
            ) from exc
        v.non_empty_str(where, "schema", schema, optional=True)
        v.positive_int(where, "pool_size", pool_size)
        self.dsn = dsn
        self.schema = schema
        self._safe = _safe_dsn(params)
        self._clock = clock
        self._pool_size = pool_size
        self._sql = _Statements(schema)
        self._state = State()
        # Held by a group's commit, a refresh and close: each of them moves ``state``.
        self._lock = asyncio.Lock()
        self._group = GroupCommitter(self._commit_group)
        self._watchers = Watchers()
        self._fence: Fence | None = None
        self._pool: _Pool | None = None

    @property
    def state(self) -> State:
        return self._state

    @property
    def tables(self) -> Mapping[str, sql.Identifier]:
        """The store's tables by role (``agents``, ``counter``, ``events``, ...), qualified
        by its schema: for what shares its database (``corral.daemon._cluster``)."""
        return self._sql.names

    @property
    def dsn_shown(self) -> str:
        """The connection string without its password (for messages)."""
        return self._safe

    def fence_with(self, fence: Fence) -> None:
        """Check every group's members against ``fence`` in their transaction, under the
        counter's row lock (several daemons: ``corral.daemon._cluster``). Call before the
        first append."""
        self._fence = fence

    @property
    def commit_stats(self) -> CommitStats:
        """How the appends were committed so far (appends, commits, the largest group)."""
        return self._group.stats

    def _unavailable(self, exc: psycopg.Error) -> StoreUnavailableError:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return StoreUnavailableError(self._safe, reason, exc.sqlstate)

    async def open(self) -> None:
        if self._pool is not None:
            return
        try:
            async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
                async with conn.transaction():
                    await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK_KEY,))
                    for statement in self._sql.ddl:
                        await conn.execute(statement)
                    await self._upgrade(conn)
                state = await self._load(conn)
            pool: _Pool = AsyncConnectionPool(
                self.dsn,
                min_size=1,
                max_size=self._pool_size,
                open=False,
                kwargs={"autocommit": True},
                # A connection the server dropped while idle is replaced, not handed out.
                check=AsyncConnectionPool.check_connection,
                name=f"corral-store {self._safe}",
            )
            try:
                await pool.open(wait=True)
            except BaseException:
                await pool.close()
                raise
        except psycopg.OperationalError as exc:
            raise self._unavailable(exc) from exc
        self._state = state
        self._pool = pool

    async def _load(self, conn: psycopg.AsyncConnection[TupleRow]) -> State:
        state = State()
        # One snapshot, so the projections and the counter agree while others append.
        async with conn.transaction():
            await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            for (data,) in await (await conn.execute(self._sql.load_agents)).fetchall():
                state.agents[data["id"]] = data
            for row_id, data in await (await conn.execute(self._sql.load_notices)).fetchall():
                state.notices[row_id] = data
            for row_id, data in await (await conn.execute(self._sql.load_decisions)).fetchall():
                state.decisions[row_id] = data
            for key, data in await (await conn.execute(self._sql.load_commands)).fetchall():
                state.commands[key] = data
            for name, data in await (await conn.execute(self._sql.load_tokens)).fetchall():
                state.tokens[name] = data
            for agent_id, data in await (await conn.execute(self._sql.load_sessions)).fetchall():
                state.sessions.setdefault(agent_id, []).append(data)
            row = await (await conn.execute(self._sql.load_counter)).fetchone()
            state.last_seq = row[0] if row else 0
        return state

    async def _upgrade(self, conn: psycopg.AsyncConnection[TupleRow]) -> None:
        """Rebuild the projections from the log when another reducer version wrote them
        (inside the caller's transaction, under the schema lock)."""
        row = await (await conn.execute(self._sql.load_version)).fetchone()
        if row is not None and int(row[0]) == PROJECTIONS_VERSION:
            return
        cur = await conn.execute(self._sql.read_everything)
        state = replay(Event(*r) for r in await cur.fetchall())
        for key in _PROJECTIONS:
            await conn.execute(self._sql.clear[key])
        tx = Tx(State())
        tx.agents, tx.notices = dict(state.agents), dict(state.notices)
        tx.decisions, tx.commands = dict(state.decisions), dict(state.commands)
        tx.tokens = dict(state.tokens)
        tx.sessions = dict(state.sessions)  # written whole: ``tx.state`` has none
        await self._write(conn, [], tx)
        await conn.execute(self._sql.set_version, (str(PROJECTIONS_VERSION),))

    async def append(
        self, events: Sequence[NewEvent], *, turns: TurnRows | None = None
    ) -> list[Event]:
        if not events:
            return []
        refuse_unstorable(events)
        self._require()
        # Queued at once; the commit runs in the committer's task, which the caller's
        # cancellation does not reach: ``state`` must not fall behind the log.
        return await self._group.append(list(events), turns)

    async def _commit_group(self, group: list[Pending]) -> Plan:
        """Commit ``group`` in one transaction (see ``stores._group``).

        The counter is bumped by every event of the group first (its row lock orders the
        writers of all processes); once the other writers' events are applied and the group
        planned, it is set to the last number actually written when the reducer refused or
        deferred some members, and nothing is committed when it refused them all."""
        pool = self._require()
        total = sum(len(member.events) for member in group)
        async with self._lock:
            try:
                async with pool.connection() as conn:
                    async with conn.transaction():
                        row = await (await conn.execute(self._sql.bump, (total,))).fetchone()
                        if row is None:
                            raise ReplayError(f"the counter row of {self._safe} is missing")
                        base = row[0] - total
                        if base != self._state.last_seq:
                            await self._catch_up(conn, base)
                        # Under the counter's row lock, so no lease changes hands meanwhile.
                        fenced = (
                            {} if self._fence is None else await self._fence.refused(conn, group)
                        )
                        done = plan(
                            self._state, group, self._clock.now().isoformat(), fenced=fenced
                        )
                        if not done.written:
                            raise psycopg.Rollback()  # every member refused: nothing to write
                        if len(done.written) != total:
                            await conn.execute(self._sql.set_counter, (done.tx.last_seq,))
                        # Sent in one go, not a round trip per statement: every writer of
                        # every daemon waits for the counter's row while this runs.
                        async with conn.pipeline():
                            await self._write(conn, done.written, done.tx, done.turn_rows)
                            if self._fence is not None:
                                await self._fence.written(conn, done.written)
                    # Committed (or rolled back with nothing planned): no await before the merge.
                    if done.written:
                        done.tx.merge()
                        if self._fence is not None:
                            self._fence.committed(done.written)
                        self._watchers.merged(done.written, True)
            except psycopg.OperationalError as exc:
                raise self._unavailable(exc) from exc
            return done

    async def refresh(self) -> None:
        pool = self._require()
        async with self._lock:
            try:
                async with pool.connection() as conn, conn.transaction():
                    row = await (await conn.execute(self._sql.load_counter)).fetchone()
                    last = int(row[0]) if row is not None else 0
                    if last != self._state.last_seq:
                        await self._catch_up(conn, last)
            except psycopg.OperationalError as exc:
                raise self._unavailable(exc) from exc

    async def _catch_up(self, conn: psycopg.AsyncConnection[TupleRow], upto: int) -> None:
        """Apply the events other writers committed up to ``upto`` (they are durable)."""
        have = self._state.last_seq
        if upto < have:
            raise ReplayError(
                f"the counter of {self._safe} is at {upto} but this store has applied {have}: "
                "the database was changed behind the store"
            )
        cur = await conn.execute(self._sql.read_range, (have, upto))
        tx = Tx(self._state)
        events = [Event(*row) for row in await cur.fetchall()]
        for event in events:
            tx.apply(event)
        if tx.last_seq != upto:
            raise ReplayError(f"the log of {self._safe} ends at {tx.last_seq}, not {upto}")
        tx.merge()
        self._watchers.merged(events, False)

    async def _write(
        self,
        conn: psycopg.AsyncConnection[TupleRow],
        events: list[Event],
        tx: Tx,
        turn_rows: Sequence[TurnRow] = (),
    ) -> None:
        async with conn.cursor() as cur:
            if events:
                await cur.execute(
                    self._sql.insert_events,
                    (
                        [e.seq for e in events],
                        [e.ts for e in events],
                        [e.type for e in events],
                        [e.agent_id for e in events],
                        [_dump(e.data) for e in events],
                    ),
                )
            changes: dict[str, dict[Any, Any]] = {
                "agents": tx.agents,
                "notices": tx.notices,
                "decisions": tx.decisions,
                "commands": tx.commands,
                "tokens": tx.tokens,
            }
            for key, rows in changes.items():
                if rows:
                    await cur.execute(
                        self._sql.upsert[key], (list(rows), [_dump(r) for r in rows.values()])
                    )
            # Sessions: one row per message, so only the new messages are written.
            inserts = []
            for agent_id, session in tx.sessions.items():
                change = row_changes(tx.state.sessions.get(agent_id, []), session)
                if change.clear:
                    await cur.execute(self._sql.delete_session, (agent_id,))
                elif change.drop_below is not None:
                    await cur.execute(self._sql.drop_messages, (agent_id, change.drop_below))
                inserts += [(agent_id, m["n"], _dump(m)) for m in change.insert]
            if inserts:
                await cur.execute(
                    self._sql.insert_messages,
                    (
                        [a for a, _, _ in inserts],
                        [n for _, n, _ in inserts],
                        [d for *_, d in inserts],
                    ),
                )
            for agent_id, notices in tx.deleted.items():
                await self.delete_agent_data(cur, agent_id, notices)
            await self.write_turns(cur, turn_rows)

    async def delete_agent_data(
        self, cur: psycopg.AsyncCursor[TupleRow], agent_id: str, notices: Sequence[int]
    ) -> None:
        """Delete what is stored of a deleted agent (``agent.deleted``), in the caller's
        transaction: its record, its session, its turn records and logs and the ``notices``
        to it. Its events stay."""
        await cur.execute(self._sql.delete_agent, (agent_id,))
        await cur.execute(self._sql.delete_session, (agent_id,))
        for table in self._tables():  # turn_logs and turns (see _turns.PostgresTurns)
            await cur.execute(
                sql.SQL("DELETE FROM {} WHERE agent_id = %s").format(table), (agent_id,)
            )
        if notices:
            await cur.execute(self._sql.delete_notices, (list(notices),))

    async def read(
        self, after: int = 0, *, agent_id: str | None = None, limit: int = 1000
    ) -> list[Event]:
        if agent_id is None:
            return await self._select(self._sql.read_all, (after, limit))
        return await self._select(self._sql.read_agent, (agent_id, after, limit))

    async def _select(self, query: sql.Composed, params: tuple[Any, ...]) -> list[Event]:
        pool = self._require()
        try:
            async with pool.connection() as conn:
                rows = await (await conn.execute(query, params)).fetchall()
        except psycopg.OperationalError as exc:
            raise self._unavailable(exc) from exc
        return [Event(seq, ts, t, a, data) for seq, ts, t, a, data in rows]

    def watch(self, hook: MergeHook) -> None:
        self._watchers.add(hook)

    async def replay(self) -> State:
        return replay(await self._select(self._sql.read_everything, ()))

    async def close(self) -> None:
        await self._group.wait_idle()  # what was accepted is committed first
        async with self._lock:
            pool, self._pool = self._pool, None
            if pool is not None:
                await pool.close()

    def _require(self) -> _Pool:
        if self._pool is None:
            raise UsageError(f"the store at {self._safe!r} is not open")
        return self._pool

    def __repr__(self) -> str:
        schema = f", schema={self.schema!r}" if self.schema else ""
        return f"PostgresStore({self._safe!r}{schema})"
