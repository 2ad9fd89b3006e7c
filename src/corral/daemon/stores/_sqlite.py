"""``SQLiteStore``: the embedded default store (WAL, synchronous FULL)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from corral.daemon._errors import StoreUnavailableError
from corral.daemon._events import Event, NewEvent
from corral.daemon._sessions import row_changes
from corral.daemon._state import PROJECTIONS_VERSION, State, Tx, replay
from corral.daemon.stores._base import MergeHook, Watchers, refuse_unstorable
from corral.daemon.stores._group import CommitStats, GroupCommitter, Pending, Plan, plan
from corral.daemon.stores._turns import SQLITE_SCHEMA as _TURNS_SCHEMA
from corral.daemon.stores._turns import SQLiteTurns, Statement, TurnRow, TurnRows, execute
from corral.kernel import SYSTEM_CLOCK, Clock, UsageError

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY,
    ts TEXT NOT NULL,
    type TEXT NOT NULL,
    agent_id TEXT,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_agent ON events (agent_id, seq);
CREATE TABLE IF NOT EXISTS agents (id TEXT PRIMARY KEY, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS notices (id INTEGER PRIMARY KEY, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS decisions (id TEXT PRIMARY KEY, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS commands (key TEXT PRIMARY KEY, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tokens (name TEXT PRIMARY KEY, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS session_messages (
    agent_id TEXT NOT NULL,
    n INTEGER NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (agent_id, n)
) WITHOUT ROWID;
"""
# The projection tables, with their key column: rebuilt together from the log when the
# stored projections were built by another version of the reducer.
_PROJECTIONS = ("agents", "notices", "decisions", "commands", "tokens", "session_messages")


def _dump(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


class SQLiteStore(SQLiteTurns):
    """A :class:`Store` in one SQLite file.

    The connection lives on one worker thread, so SQLite calls never block the event loop.
    Appends are committed in groups (see ``stores._group``): those that arrive while a commit
    is in flight go together in the next transaction; :attr:`commit_stats` counts them.
    Journal mode WAL with ``synchronous=FULL``: a committed append survives a crash of the
    process or the machine.

    :meth:`open` raises :class:`StoreUnavailableError` (not retryable) when the file cannot be
    opened as a database; an append that SQLite refuses for operational reasons (disk full,
    the file locked past the busy timeout) raises it retryable, having written nothing.
    """

    def __init__(self, path: str | Path, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.path = Path(path)
        self._clock = clock
        self._state = State()
        self._group = GroupCommitter(self._commit_group)
        self._watchers = Watchers()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="corral-sqlite")
        self._conn: sqlite3.Connection | None = None

    @property
    def state(self) -> State:
        return self._state

    @property
    def commit_stats(self) -> CommitStats:
        """How the appends were committed so far (appends, commits, the largest group)."""
        return self._group.stats

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def open(self) -> None:
        try:
            await self._run(self._open)
        except (OSError, sqlite3.Error) as exc:
            raise StoreUnavailableError(
                f"sqlite:{self.path}", f"{type(exc).__name__}: {exc}", retryable=False
            ) from exc

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("PRAGMA busy_timeout=5000")
            conn.executescript(_SCHEMA)
            conn.executescript(_TURNS_SCHEMA)  # turn records (see stores._turns)
            state = self._load(conn)
            if self._version(conn) != PROJECTIONS_VERSION:
                state = self._rebuild(conn)
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        self._state = state

    def _load(self, conn: sqlite3.Connection) -> State:
        state = State()
        for (data,) in conn.execute("SELECT data FROM agents"):
            rec = json.loads(data)
            state.agents[rec["id"]] = rec
        for row_id, data in conn.execute("SELECT id, data FROM notices"):
            state.notices[row_id] = json.loads(data)
        for row_id, data in conn.execute("SELECT id, data FROM decisions"):
            state.decisions[row_id] = json.loads(data)
        for key, data in conn.execute("SELECT key, data FROM commands"):
            state.commands[key] = json.loads(data)
        for name, data in conn.execute("SELECT name, data FROM tokens"):
            state.tokens[name] = json.loads(data)
        rows = conn.execute("SELECT agent_id, data FROM session_messages ORDER BY agent_id, n")
        for agent_id, data in rows:
            state.sessions.setdefault(agent_id, []).append(json.loads(data))
        (last,) = conn.execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchone()
        state.last_seq = last
        return state

    @staticmethod
    def _version(conn: sqlite3.Connection) -> int | None:
        row = conn.execute("SELECT value FROM meta WHERE key = 'projections'").fetchone()
        return None if row is None else int(row[0])

    def _rebuild(self, conn: sqlite3.Connection) -> State:
        """Replace the stored projections by what the log builds (one transaction)."""
        state = replay(self._read_with(conn, 0, None, 2**62))
        conn.execute("BEGIN IMMEDIATE")
        try:
            for table in _PROJECTIONS:
                conn.execute(f"DELETE FROM {table}")
            execute(
                conn,
                [
                    *self._projection_statements(state.agents, state.notices, state.decisions),
                    *_keyed_statements(state.commands, state.tokens),
                    *self._session_statements({}, dict(state.sessions)),
                ],
            )
            conn.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES ('projections', ?)",
                (str(PROJECTIONS_VERSION),),
            )
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return state

    @staticmethod
    def _projection_statements(agents: Any, notices: Any, decisions: Any) -> list[Statement]:
        return [
            _upsert("agents", "id", agents),
            _upsert("notices", "id", notices),
            _upsert("decisions", "id", decisions),
        ]

    @staticmethod
    def _session_statements(old: Mapping[str, Any], changed: Mapping[str, Any]) -> list[Statement]:
        """What writes the sessions ``changed`` (None: deleted) from what they were
        (``old``): one row per message, so only new messages are written."""
        statements: list[Statement] = []
        for agent_id, session in changed.items():
            rows = row_changes(old.get(agent_id, []), session)
            if rows.clear:
                statements.append(
                    ("DELETE FROM session_messages WHERE agent_id = ?", [(agent_id,)])
                )
            elif rows.drop_below is not None:
                statements.append(
                    (
                        "DELETE FROM session_messages WHERE agent_id = ? AND n < ?",
                        [(agent_id, rows.drop_below)],
                    )
                )
            statements.append(
                (
                    "INSERT OR REPLACE INTO session_messages (agent_id, n, data) VALUES (?, ?, ?)",
                    [(agent_id, m["n"], _dump(m)) for m in rows.insert],
                )
            )
        return statements

    async def append(
        self, events: Sequence[NewEvent], *, turns: TurnRows | None = None
    ) -> list[Event]:
        if not events:
            return []
        refuse_unstorable(events)
        self._require()
        # Queued at once; the commit runs in the committer's task, which the caller's
        # cancellation does not reach: ``state`` must follow what was committed.
        return await self._group.append(list(events), turns)

    async def _commit_group(self, group: list[Pending]) -> Plan:
        """Commit ``group`` in one transaction (see ``stores._group``)."""
        done = plan(self._state, group, self._clock.now().isoformat())
        if not done.written:
            return done  # every member refused: nothing to write
        # Every row is made here, on the loop: the worker thread then only runs SQLite, which
        # lets go of the GIL, instead of serialising JSON against the loop for the GIL.
        statements = self._statements(done.written, done.tx, done.turn_rows)
        try:
            await self._run(self._write, statements)
        except sqlite3.OperationalError as exc:
            raise StoreUnavailableError(
                f"sqlite:{self.path}", f"{type(exc).__name__}: {exc}"
            ) from exc
        done.tx.merge()
        self._watchers.merged(done.written, True)
        return done

    def _statements(
        self, events: list[Event], tx: Tx, turn_rows: Sequence[TurnRow] = ()
    ) -> list[Statement]:
        """What writes ``events`` and what they change (``tx``, ``turn_rows``)."""
        statements: list[Statement] = [
            (
                "INSERT INTO events (seq, ts, type, agent_id, data) VALUES (?, ?, ?, ?, ?)",
                [(e.seq, e.ts, e.type, e.agent_id, _dump(e.data)) for e in events],
            ),
            *self._projection_statements(tx.agents, tx.notices, tx.decisions),
            *_keyed_statements(tx.commands, tx.tokens),
            *self._session_statements(self._state.sessions, tx.sessions),
        ]
        for agent_id, notices in tx.deleted.items():
            statements += self.agent_data_statements(agent_id, notices)
        return statements + self.turn_statements(turn_rows)

    def _write(self, statements: list[Statement]) -> None:
        conn = self._require()
        conn.execute("BEGIN IMMEDIATE")
        try:
            execute(conn, statements)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:  # SQLite may have rolled back by itself already
                conn.execute("ROLLBACK")
            raise

    @staticmethod
    def agent_data_statements(agent_id: str, notices: Sequence[int]) -> list[Statement]:
        """What deletes what is stored of a deleted agent (``agent.deleted``): its record,
        its session, its turn records and logs and the ``notices`` to it. Its events stay."""
        return [
            ("DELETE FROM agents WHERE id = ?", [(agent_id,)]),
            ("DELETE FROM session_messages WHERE agent_id = ?", [(agent_id,)]),
            ("DELETE FROM turn_logs WHERE agent_id = ?", [(agent_id,)]),
            ("DELETE FROM turns WHERE agent_id = ?", [(agent_id,)]),
            ("DELETE FROM notices WHERE id = ?", [(n,) for n in notices]),
        ]

    async def read(
        self, after: int = 0, *, agent_id: str | None = None, limit: int = 1000
    ) -> list[Event]:
        result: list[Event] = await self._run(self._read, after, agent_id, limit)
        return result

    def _read(self, after: int, agent_id: str | None, limit: int) -> list[Event]:
        return self._read_with(self._require(), after, agent_id, limit)

    @staticmethod
    def _read_with(
        conn: sqlite3.Connection, after: int, agent_id: str | None, limit: int
    ) -> list[Event]:
        if agent_id is None:
            rows = conn.execute(
                "SELECT seq, ts, type, agent_id, data FROM events WHERE seq > ? "
                "ORDER BY seq LIMIT ?",
                (after, limit),
            )
        else:
            rows = conn.execute(
                "SELECT seq, ts, type, agent_id, data FROM events "
                "WHERE agent_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                (agent_id, after, limit),
            )
        return [Event(s, ts, t, a, json.loads(d)) for s, ts, t, a, d in rows]

    async def refresh(self) -> None:
        """Nothing to do: this process is the file's only writer, and a commit that fails
        here did not happen."""

    def watch(self, hook: MergeHook) -> None:
        self._watchers.add(hook)

    async def replay(self) -> State:
        events: list[Event] = await self._run(self._read, 0, None, 2**62)
        return replay(events)

    async def close(self) -> None:
        await self._group.wait_idle()  # what was accepted is committed first
        if self._conn is not None:
            await self._run(self._require().close)
            self._conn = None
        self._executor.shutdown(wait=True)

    def _require(self) -> sqlite3.Connection:
        if self._conn is None:
            raise UsageError(f"the store at {str(self.path)!r} is not open")
        return self._conn

    def __repr__(self) -> str:
        return f"SQLiteStore({str(self.path)!r})"


def _keyed_statements(commands: Mapping[str, Any], tokens: Mapping[str, Any]) -> list[Statement]:
    return [_upsert("commands", "key", commands), _upsert("tokens", "name", tokens)]


def _upsert(table: str, key: str, rows: Mapping[Any, Any]) -> Statement:
    """Rows of a projection table (``key``, ``data``) written over what was there."""
    return (
        f"INSERT OR REPLACE INTO {table} ({key}, data) VALUES (?, ?)",
        [(k, _dump(v)) for k, v in rows.items()],
    )
