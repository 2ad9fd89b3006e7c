"""The Store contract, run against SQLite and PostgreSQL; then what only PostgreSQL promises."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, cast

import psycopg
import pytest

from corral.daemon import (
    Event,
    NewEvent,
    SQLiteStore,
    State,
    Store,
    StoreUnavailableError,
    http_status,
)
from corral.daemon import _events as ev
from corral.daemon._records import AgentRecord, TurnUsage
from corral.daemon._state import ReplayError, preview
from corral.daemon.stores import PostgresStore
from corral.daemon.stores._turns import TurnStore
from corral.kernel import InvalidArgumentError, UsageError
from corral.runtime import FakeClock
from tests.support.store_backends import Backend

# --- realistic events (the shapes AgentService writes) ------------------------------------


def agent_record(agent_id: str, *, parent: str | None = None) -> dict[str, Any]:
    return {
        "id": agent_id,
        "name": f"worker-{agent_id}",
        "spec": {"name": f"worker-{agent_id}", "harness": "command", "command": ["true"]},
        "state": "idle",
        "reason": "spawned",
        "error": None,
        "parent": parent,
        "runId": "r_1",
        "rootId": parent or agent_id,
        "children": [],
        "turns": 0,
        "turnInFlight": None,
        "consecutiveFailures": 0,
        "retriesUsed": 0,
        "lastPrompt": None,
        "lastOutput": None,
        "lastError": None,
        "usage": {"tokens": 0, "costUsd": 0.0, "turns": 0},
        "workdir": f"/tmp/agents/{agent_id}/work",
    }


def created(agent_id: str, *, parent: str | None = None) -> NewEvent:
    return NewEvent(ev.AGENT_CREATED, agent_id, {"agent": agent_record(agent_id, parent=parent)})


def changed(agent_id: str, frm: str, to: str, reason: str, error: str | None = None) -> NewEvent:
    data = {"from": frm, "to": to, "reason": reason, "error": error}
    return NewEvent(ev.STATE_CHANGED, agent_id, data)


def started(
    agent_id: str, turn: int, prompt: str, *, retry: bool = False, notices: Sequence[int] = ()
) -> NewEvent:
    data = {"turn": turn, "prompt": prompt, "retry": retry, "notices": list(notices)}
    return NewEvent(ev.TURN_STARTED, agent_id, data)


def completed(agent_id: str, turn: int, output: str, tokens: int, cost: float) -> NewEvent:
    data = {"turn": turn, "output": output, "usage": {"tokens": tokens, "costUsd": cost}}
    return NewEvent(ev.TURN_COMPLETED, agent_id, data)


def failed(agent_id: str, turn: int, error: str, failures: int) -> NewEvent:
    data = {"turn": turn, "error": error, "consecutiveFailures": failures, "usage": None}
    return NewEvent(ev.TURN_FAILED, agent_id, data)


def notice(to: str, frm: str, kind: str) -> NewEvent:
    data = {"to": to, "from": frm, "fromName": f"worker-{frm}", "kind": kind, "state": "pending"}
    return NewEvent(ev.NOTICE, to, data)


def command(key: str, agent_id: str, status: int = 202) -> NewEvent:
    cmd = {"command": "prompt", "agent": agent_id}
    data = {
        "key": key,
        "fingerprint": f"fp-{key}",
        "command": cmd,
        "status": status,
        "response": {"id": agent_id, "accepted": "prompt"},
    }
    return NewEvent(ev.COMMAND_RECORDED, None, data)


PARENT, CHILD = "a_parent", "a_child"


async def mixed_history(store: Store, clock: FakeClock) -> list[Event]:
    """Spawn, turns that complete and fail, a hold and its decision, notices, a stop."""
    batches = [
        [
            created(PARENT),
            changed(PARENT, "idle", "running", "prompted"),
            started(PARENT, 1, "plan"),
        ],
        [created(CHILD, parent=PARENT), started(CHILD, 1, "migrate"), command("k-spawn", CHILD)],
        [
            completed(CHILD, 1, "migrated", 120, 0.25),
            changed(CHILD, "running", "idle", "turn-done"),
            notice(PARENT, CHILD, "done"),
        ],
        [changed(CHILD, "idle", "running", "prompted"), started(CHILD, 2, "verify")],
        [
            failed(CHILD, 2, "exit status 1", 1),
            changed(CHILD, "running", "blocked", "turn-failed", "exit status 1"),
            NewEvent(ev.SUPERVISION_NEEDED, CHILD, {"reason": "turn-failed", "error": "x"}),
            notice(PARENT, CHILD, "blocked"),
        ],
        [
            NewEvent(
                ev.DECISION_RESOLVED,
                CHILD,
                {"kind": "agent_blocked", "agentId": CHILD, "action": "stop", "by": "ann"},
            ),
            changed(CHILD, "blocked", "stopped", "stopped"),
            command("k-stop", CHILD),
        ],
        [completed(PARENT, 1, "planned", 30, 0.5), changed(PARENT, "running", "idle", "done")],
    ]
    written: list[Event] = []
    for batch in batches:
        clock.advance(1.5)
        written += await store.append(batch)
    # The notices' ids are their seqs: deliver the first, drop the second.
    first, second = (e.seq for e in written if e.type == ev.NOTICE)
    clock.advance(1.5)
    written += await store.append(
        [
            changed(PARENT, "idle", "running", "prompted"),
            started(PARENT, 2, "next", notices=[first]),
            NewEvent(ev.NOTICES_DROPPED, PARENT, {"ids": [second]}),
            NewEvent(ev.TURN_INTERRUPTED, PARENT, {"turn": 2, "reason": "agent stopped"}),
        ]
    )
    return written


# --- the two backends -----------------------------------------------------------------------


@pytest.fixture
async def store(backend: Backend) -> Store:
    return await backend.open()


def seqs(events: list[Event]) -> list[int]:
    return [e.seq for e in events]


# --- the contract ---------------------------------------------------------------------------


async def test_append_assigns_gapless_seq_from_one_and_the_clocks_ts(
    backend: Backend, store: Store
) -> None:
    assert isinstance(store, Store)
    assert await store.append([]) == []
    first = await store.append([created(PARENT), notice(PARENT, CHILD, "done")])
    backend.clock.advance(7)
    second = await store.append([changed(PARENT, "idle", "running", "prompted")])

    assert seqs(first + second) == [1, 2, 3]
    assert {e.ts for e in first} == {"2026-01-01T00:00:00+00:00"}
    assert second[0].ts == "2026-01-01T00:00:07+00:00"
    assert await store.read() == first + second
    assert store.state.last_seq == 3


async def test_projections_follow_the_reducer(backend: Backend, store: Store) -> None:
    written = await mixed_history(store, backend.clock)
    state = store.state
    parent, child = state.agents[PARENT], state.agents[CHILD]

    assert parent["children"] == [CHILD]
    assert parent["createdAt"] == written[0].ts
    assert (parent["state"], parent["turns"], parent["turnInFlight"]) == ("running", 2, None)
    assert parent["usage"] == {"tokens": 30, "costUsd": 0.5, "turns": 1, "unpricedTurns": 0}
    assert child["usage"] == {"tokens": 120, "costUsd": 0.25, "turns": 2, "unpricedTurns": 0}
    assert (child["state"], child["lastError"], child["consecutiveFailures"]) == (
        "stopped",
        "exit status 1",
        1,
    )
    assert child["endedAt"] == next(e.ts for e in written if e.data.get("to") == "stopped")
    delivered, dropped = sorted(state.notices)
    assert state.notices[delivered]["state"] == "delivered"
    assert state.notices[dropped]["state"] == "dropped"
    (resolution,) = [d for d in state.decisions.values() if d["state"] == "resolved"]
    assert (resolution["answer"], resolution["by"]) == ("stop", "ann")
    assert state.commands["k-stop"]["response"] == {"id": CHILD, "accepted": "prompt"}
    assert sorted(state.commands) == ["k-spawn", "k-stop"]
    assert state.last_seq == len(written) == written[-1].seq


async def test_replay_rebuilds_the_projections(backend: Backend, store: Store) -> None:
    await mixed_history(store, backend.clock)
    rebuilt = await store.replay()
    assert rebuilt.snapshot() == store.state.snapshot()
    assert rebuilt is not store.state


async def test_reopen_restores_the_state_and_continues_the_seq(
    backend: Backend, store: Store
) -> None:
    written = await mixed_history(store, backend.clock)
    before = store.state.snapshot()
    await store.close()

    again = await backend.open()
    assert again.state.snapshot() == before
    more = await again.append([changed(PARENT, "running", "idle", "done")])
    assert seqs(more) == [len(written) + 1]
    assert seqs(await again.read()) == list(range(1, len(written) + 2))
    assert (await again.replay()).snapshot() == again.state.snapshot()


async def test_tokens_are_a_projection_kept_across_a_reopen(backend: Backend, store: Store) -> None:
    await store.append([ev.token_created("alice", "a" * 64, None)])
    backend.clock.advance(5)
    await store.append([ev.token_created("bob", "b" * 64, "alice")])
    await store.append([ev.token_revoked("alice", "bob")])
    tokens = store.state.tokens
    assert tokens["alice"] == {
        "name": "alice",
        "sha256": "a" * 64,
        "by": None,
        "createdAt": "2026-01-01T00:00:00+00:00",
        "revokedAt": "2026-01-01T00:00:05+00:00",
        "revokedBy": "bob",
    }
    assert (tokens["bob"]["by"], tokens["bob"]["revokedAt"]) == ("alice", None)
    before = store.state.snapshot()
    assert (await store.replay()).snapshot() == before
    await store.close()
    again = await backend.open()
    assert again.state.snapshot() == before


async def test_revoking_a_token_never_made_writes_nothing(store: Store) -> None:
    with pytest.raises(ReplayError):
        await store.append([ev.token_revoked("nobody", None)])
    assert store.state.last_seq == 0
    assert await store.read() == []


def test_the_event_constructors_write_the_shapes_the_log_has_always_held() -> None:
    rec = agent_record(CHILD, parent=PARENT)
    assert ev.agent_created(cast(AgentRecord, rec)) == created(CHILD, parent=PARENT)
    assert ev.turn_started(CHILD, 2, "go", retry=True, notices=[4]) == started(
        CHILD, 2, "go", retry=True, notices=[4]
    )
    usage: TurnUsage = {"tokens": 7, "costUsd": 0.5}
    assert ev.turn_completed(CHILD, 1, "out", usage) == completed(CHILD, 1, "out", 7, 0.5)
    assert ev.turn_failed(CHILD, 1, "exit 1", 2, None) == failed(CHILD, 1, "exit 1", 2)
    assert ev.failed(CHILD, "exit 1") == changed(
        CHILD, "running", "failed", "turn-failed", "exit 1"
    )
    sender = cast(AgentRecord, agent_record(CHILD))
    assert ev.notice(PARENT, sender, "done", "pending") == notice(PARENT, CHILD, "done")


def test_preview_shows_what_events_would_make_and_leaves_the_state_alone() -> None:
    state = State()
    ts = "2026-01-01T00:00:05+00:00"
    tx = preview(state, [created(PARENT), started(PARENT, 1, "go")], ts)
    rec = tx.get_agent(PARENT)
    assert rec is not None
    assert (rec["turnInFlight"], rec["lastPrompt"], rec["updatedAt"]) == (1, "go", ts)
    assert tx.last_seq == 2
    assert (state.agents, state.last_seq) == ({}, 0)


async def test_an_event_the_reducer_rejects_writes_nothing(backend: Backend, store: Store) -> None:
    await store.append([created(PARENT)])
    before = store.state.snapshot()

    with pytest.raises(ReplayError, match="unknown agent 'a_ghost'"):
        await store.append([notice(PARENT, CHILD, "done"), changed("a_ghost", "idle", "x", "y")])

    assert store.state.snapshot() == before
    assert seqs(await store.read()) == [1]
    # The numbers the failed append took are given back: no gap.
    assert seqs(await store.append([notice(PARENT, CHILD, "done")])) == [2]


async def test_a_database_error_mid_transaction_writes_nothing(
    backend: Backend, store: Store
) -> None:
    await store.append([created(PARENT)])
    before = store.state.snapshot()
    backend.inject_failure("boom")

    # The events row goes in before the commands row the database refuses.
    with pytest.raises(backend.db_error, match="injected failure"):
        await store.append([notice(PARENT, CHILD, "done"), command("boom", PARENT)])

    assert store.state.snapshot() == before
    assert seqs(await store.read()) == [1]
    await store.close()
    reopened = await backend.open()
    assert reopened.state.snapshot() == before
    assert seqs(await reopened.append([command("fine", PARENT)])) == [2]


async def test_sqlite_refusing_a_write_is_store_unavailable_and_writes_nothing(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(tmp_path / "corral.db")
    await store.open()
    try:
        await store.append([created(PARENT)])
        before = store.state.snapshot()
        conn = store._require()
        # What a full disk or a lock held past the busy timeout looks like to the store.
        await store._run(lambda: conn.execute("PRAGMA query_only=1"))
        with pytest.raises(StoreUnavailableError) as info:
            await store.append([notice(PARENT, CHILD, "done")])
        assert info.value.retryable is True
        assert http_status(info.value) == 503
        assert "readonly" in info.value.message
        assert store.state.snapshot() == before
        await store._run(lambda: conn.execute("PRAGMA query_only=0"))
        assert seqs(await store.append([notice(PARENT, CHILD, "done")])) == [2]
        assert (await store.replay()).snapshot() == store.state.snapshot()
    finally:
        await store.close()


async def test_a_cancelled_caller_leaves_the_state_in_step_with_the_log(
    backend: Backend, store: Store
) -> None:
    await store.append([created(PARENT)])
    caller = asyncio.create_task(store.append([notice(PARENT, CHILD, "done")]))
    await asyncio.sleep(0)  # the append is under way
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller

    # Once begun, the append completes; the next one follows it without a clash or a gap.
    assert seqs(await store.append([notice(PARENT, CHILD, "blocked")])) == [3]
    assert seqs(await store.read()) == [1, 2, 3]
    assert (await store.replay()).snapshot() == store.state.snapshot()


async def test_fifty_concurrent_appenders_get_a_gapless_log(backend: Backend, store: Store) -> None:
    await store.append([created(PARENT)])

    async def one(i: int) -> list[Event]:
        return await store.append([notice(PARENT, f"a_{i}", "done"), command(f"k{i}", PARENT)])

    results = await asyncio.gather(*(one(i) for i in range(50)))

    for batch in results:  # each append's events are consecutive
        assert seqs(batch) == [batch[0].seq, batch[0].seq + 1]
    assert sorted(s for batch in results for s in seqs(batch)) == list(range(2, 102))
    assert seqs(await store.read(limit=500)) == list(range(1, 102))
    assert len(store.state.notices) == 50
    assert sorted(store.state.commands) == sorted(f"k{i}" for i in range(50))
    assert (await store.replay()).snapshot() == store.state.snapshot()
    before = store.state.snapshot()
    await store.close()
    assert (await backend.open()).state.snapshot() == before


async def test_read_filters_by_agent_after_and_limit(backend: Backend, store: Store) -> None:
    written = await mixed_history(store, backend.clock)
    child = [e for e in written if e.agent_id == CHILD]

    assert await store.read(agent_id=CHILD) == child
    assert await store.read(child[2].seq, agent_id=CHILD) == child[3:]
    assert await store.read(agent_id=CHILD, limit=2) == child[:2]
    assert await store.read(5, limit=3) == written[5:8]
    assert await store.read(written[-1].seq) == []
    assert await store.read(agent_id="a_nobody") == []
    # Events that name no agent (recorded commands) are left out of an agent's stream.
    assert all(e.agent_id == CHILD for e in await store.read(agent_id=CHILD))
    assert any(e.agent_id is None for e in written)


async def test_reading_or_appending_before_open_is_a_usage_error(backend: Backend) -> None:
    store = backend.factory()
    backend.opened.append(store)
    with pytest.raises(UsageError, match="is not open") as info:
        await store.read()
    assert info.value.code == "usage_error"
    with pytest.raises(UsageError, match="is not open"):
        await store.append([created(PARENT)])
    assert store.state.last_seq == 0


async def test_commits_are_durable(backend: Backend, store: Store) -> None:
    if isinstance(store, SQLiteStore):
        conn = store._conn
        assert conn is not None
        assert await store._run(lambda: conn.execute("PRAGMA journal_mode").fetchone()) == ("wal",)
        # synchronous is per connection: read it from the store's own (2 is FULL).
        assert await store._run(lambda: conn.execute("PRAGMA synchronous").fetchone()) == (2,)
    else:
        assert isinstance(store, PostgresStore)
        async with store._require().connection() as conn_pg:
            row = await (await conn_pg.execute("SHOW synchronous_commit")).fetchone()
            assert row == ("on",)
            assert await (await conn_pg.execute("SHOW fsync")).fetchone() == ("on",)


# --- PostgreSQL only: several writers, one database -------------------------------------------


@pytest.fixture
async def pg_pair(postgres_dsn: str) -> AsyncIterator[tuple[PostgresStore, PostgresStore]]:
    clock = FakeClock()
    a = PostgresStore(postgres_dsn, clock=clock)
    b = PostgresStore(postgres_dsn, clock=clock)
    await a.open()
    await b.open()
    yield a, b
    await a.close()
    await b.close()


@pytest.mark.postgres
async def test_a_writer_applies_what_another_appended_before_its_own(
    pg_pair: tuple[PostgresStore, PostgresStore],
) -> None:
    a, b = pg_pair
    assert seqs(await a.append([created(PARENT)])) == [1]
    # b has never seen PARENT: its reducer can only accept this after catching up.
    assert seqs(await b.append([changed(PARENT, "idle", "running", "prompted")])) == [2]
    assert b.state.agents[PARENT]["state"] == "running"
    assert seqs(await a.append([started(PARENT, 1, "go")])) == [3]
    assert a.state.agents[PARENT]["state"] == "running"

    # A failed append still keeps the other writer's committed events it caught up with.
    await a.append([completed(PARENT, 1, "ok", 5, 0.0)])
    with pytest.raises(ReplayError):
        await b.append([changed("a_ghost", "idle", "running", "x")])
    assert b.state.last_seq == 4
    assert b.state.snapshot() == a.state.snapshot() == (await a.replay()).snapshot()


@pytest.mark.postgres
async def test_refresh_brings_in_what_another_writer_committed(
    pg_pair: tuple[PostgresStore, PostgresStore],
) -> None:
    a, b = pg_pair
    await a.append([created(PARENT)])
    await a.append([started(PARENT, 1, "go")])
    assert b.state.last_seq == 0
    await b.refresh()
    assert b.state.last_seq == 2
    assert b.state.snapshot() == a.state.snapshot()
    await b.refresh()  # nothing new: nothing changes
    assert b.state.snapshot() == a.state.snapshot()


@pytest.mark.postgres
async def test_two_writers_appending_at_once_share_one_gapless_log(
    pg_pair: tuple[PostgresStore, PostgresStore], postgres_dsn: str
) -> None:
    a, b = pg_pair
    await a.append([created(PARENT)])

    async def one(store: PostgresStore, i: int) -> list[Event]:
        return await store.append([notice(PARENT, f"a_{i}", "done"), command(f"k{i}", PARENT)])

    results = await asyncio.gather(*(one(a if i % 2 else b, i) for i in range(50)))

    for batch in results:
        assert seqs(batch) == [batch[0].seq, batch[0].seq + 1]
    assert seqs(await a.read(limit=500)) == list(range(1, 102))
    # Each catches up with the other on its next append.
    await a.append([notice(PARENT, "a_x", "done")])
    await b.append([notice(PARENT, "a_y", "done")])
    assert b.state.snapshot() == (await b.replay()).snapshot()
    await a.append([notice(PARENT, "a_z", "done")])
    assert a.state.snapshot() == (await a.replay()).snapshot()
    assert len(a.state.notices) == 53
    # The projection rows both wrote agree with the log too.
    third = PostgresStore(postgres_dsn)
    await third.open()
    try:
        assert third.state.snapshot() == a.state.snapshot()
    finally:
        await third.close()


@pytest.mark.postgres
async def test_schemas_keep_stores_apart(postgres_dsn: str) -> None:
    one = PostgresStore(postgres_dsn, schema="team one")
    two = PostgresStore(postgres_dsn, schema="two")
    await one.open()
    await two.open()
    try:
        await one.append([created(PARENT), created(CHILD)])
        assert seqs(await two.append([created(CHILD)])) == [1]
        assert list(two.state.agents) == [CHILD]
        assert "schema='team one'" in repr(one)
    finally:
        await one.close()
        await two.close()
    with psycopg.connect(postgres_dsn) as conn:
        rows = conn.execute(
            "SELECT table_schema, count(*) FROM information_schema.tables "
            "WHERE table_name = 'events' GROUP BY 1 ORDER BY 1"
        ).fetchall()
    assert rows == [("team one", 1), ("two", 1)]


@pytest.mark.postgres
async def test_a_connection_dropped_mid_append_is_retryable_and_writes_nothing(
    postgres_dsn: str,
) -> None:
    store = PostgresStore(postgres_dsn)
    await store.open()
    try:
        await store.append([created(PARENT)])
        before = store.state.snapshot()
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            conn.execute(
                "CREATE FUNCTION die() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN PERFORM pg_terminate_backend(pg_backend_pid()); RETURN NEW; END $$"
            )
            conn.execute(
                "CREATE TRIGGER die BEFORE INSERT ON notices FOR EACH ROW EXECUTE FUNCTION die()"
            )

        with pytest.raises(StoreUnavailableError, match="is unavailable") as info:
            await store.append([notice(PARENT, CHILD, "done")])

        error = info.value
        assert (error.code, error.retryable, http_status(error)) == ("store_unavailable", True, 503)
        assert isinstance(error.__cause__, psycopg.OperationalError)
        assert store.state.snapshot() == before
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            conn.execute("DROP TRIGGER die ON notices")
        # The retry gets the next number: the dropped transaction took none.
        assert seqs(await store.append([notice(PARENT, CHILD, "done")])) == [2]
        assert seqs(await store.read()) == [1, 2]
    finally:
        await store.close()


@pytest.mark.postgres
async def test_connections_the_server_closed_while_idle_are_replaced(postgres_dsn: str) -> None:
    store = PostgresStore(postgres_dsn)
    await store.open()
    try:
        await store.append([created(PARENT)])
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            killed = conn.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchone()
        assert killed is not None
        assert killed[0] >= 1
        assert seqs(await store.append([notice(PARENT, CHILD, "done")])) == [2]
    finally:
        await store.close()


async def test_an_unreachable_server_is_store_unavailable() -> None:
    store = PostgresStore("postgresql://corral:secret@127.0.0.1:1/nowhere?connect_timeout=2")
    with pytest.raises(StoreUnavailableError, match="port=1") as info:
        await store.open()
    assert info.value.retryable
    assert "secret" not in info.value.message
    assert "secret" not in repr(store)
    with pytest.raises(UsageError, match="is not open"):
        await store.read()


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"dsn": ""}, "dsn"),
        ({"dsn": 5}, "dsn"),
        ({"dsn": "host"}, "dsn"),
        ({"dsn": "postgresql://x/db", "schema": ""}, "schema"),
        ({"dsn": "postgresql://x/db", "schema": 3}, "schema"),
        ({"dsn": "postgresql://x/db", "pool_size": 0}, "pool_size"),
        ({"dsn": "postgresql://x/db", "pool_size": True}, "pool_size"),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict[str, Any], argument: str) -> None:
    with pytest.raises(InvalidArgumentError, match=f"PostgresStore: {argument} must be") as info:
        PostgresStore(**kwargs)
    assert info.value.argument == argument


# --- deleting an agent (see corral.daemon._lifecycle) ---------------------------------------


async def test_a_deleted_agent_leaves_no_rows_in_either_store(
    backend: Backend, store: Store
) -> None:
    await store.append([created("a_parent"), created("a_child", parent="a_parent")])
    await store.append([started("a_child", 1, "hello")])
    notice = ev.notice("a_child", store.state.agents["a_parent"], "done", "pending")
    await store.append([notice])
    turns = cast(TurnStore, store)
    for agent in ("a_child", "a_parent"):
        record = {"agentId": agent, "turn": 1, "outcome": "succeeded"}
        await turns.save_turn(record, {"output": "hello", "logs": []})
    await store.append([ev.deleted("a_child", "ops", None, with_=None)])
    assert await turns.list_turns("a_child") == []
    assert await turns.get_turn("a_child", 1) is None
    assert [r["turn"] for r in await turns.list_turns("a_parent")] == [1]
    assert "a_child" not in store.state.agents
    assert store.state.agents["a_parent"]["children"] == []
    assert "a_child" not in store.state.sessions
    assert not [n for n in store.state.notices.values() if n["to"] == "a_child"]
    snapshot = store.state.snapshot()
    await store.close()
    again = await backend.open()
    assert again.state.snapshot() == snapshot
    assert (await again.replay()).snapshot() == snapshot
    assert [e.type for e in await again.read(agent_id="a_child")][-1] == ev.AGENT_DELETED
