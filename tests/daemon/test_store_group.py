"""Group commit in both stores: appends that arrive while a commit is in flight go together in
the next transaction, each caller answered with its own events (or its own error) once they
are durable, the log gapless and in the order the appends were accepted, and the projections
exactly what one transaction per append would have made of them.

Concurrency here is ``asyncio.gather`` of appends: they all join the queue before the
committer's task first runs, so the groups they form do not depend on timing; the tests
assert on :attr:`commit_stats`, never on time.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.daemon import (
    Event,
    NewEvent,
    SQLiteStore,
    StoreUnavailableError,
    UnstorableValueError,
)
from corral.daemon import _events as ev
from corral.daemon._state import ReplayError, State, Tx
from corral.daemon.stores import CommitStats, PostgresStore
from corral.runtime import FakeClock
from tests.daemon.test_store import (
    PARENT,
    changed,
    command,
    created,
    notice,
    seqs,
)
from tests.support.store_backends import Backend

GroupStore = SQLiteStore | PostgresStore


@pytest.fixture
async def store(backend: Backend) -> GroupStore:
    opened = await backend.open()
    assert isinstance(opened, SQLiteStore | PostgresStore)
    return opened


def since(before: CommitStats, after: CommitStats) -> CommitStats:
    """What happened between two readings (``largest`` is the later one's)."""
    return CommitStats(
        after.appends - before.appends,
        after.events - before.events,
        after.commits - before.commits,
        after.largest,
        after.refused - before.refused,
    )


async def check_consistent(store: GroupStore) -> None:
    log = await store.read(limit=10_000)
    assert seqs(log) == list(range(1, len(log) + 1))
    assert store.state.last_seq == len(log)
    assert (await store.replay()).snapshot() == store.state.snapshot()


# --- many at once ----------------------------------------------------------------------------


async def test_concurrent_appends_commit_together_gapless_and_in_order(
    backend: Backend, store: GroupStore
) -> None:
    await store.append([created(PARENT)])
    before = store.commit_stats

    def batch(i: int) -> list[NewEvent]:
        events = [notice(PARENT, f"a_{i}", "done")]
        events += [command(f"k{i}-{j}", PARENT) for j in range(i % 3)]
        return events

    results = await asyncio.gather(*(store.append(batch(i)) for i in range(200)))

    seen: list[int] = []
    for i, written in enumerate(results):
        # Each caller gets exactly its own events, numbered one after the other...
        assert [(e.type, e.agent_id, e.data) for e in written] == [
            (n.type, n.agent_id, n.data) for n in batch(i)
        ]
        assert seqs(written) == list(range(written[0].seq, written[0].seq + len(written)))
        seen += seqs(written)
    # ...in the order the appends were accepted, with no gap.
    assert seen == list(range(2, 2 + len(seen)))
    assert await store.read(1, limit=10_000) == [e for written in results for e in written]
    assert len(store.state.notices) == 200
    await check_consistent(store)
    stats = since(before, store.commit_stats)
    assert (stats.appends, stats.events, stats.refused) == (200, len(seen), 0)
    # They went in groups: far fewer transactions than appends.
    assert stats.commits < stats.appends
    assert stats.largest > 1

    snapshot = store.state.snapshot()
    await store.close()
    assert (await backend.open()).state.snapshot() == snapshot


async def test_appends_one_after_another_are_a_commit_each(store: GroupStore) -> None:
    for i in range(5):
        assert seqs(await store.append([created(f"a_{i}")])) == [i + 1]
    assert store.commit_stats == CommitStats(appends=5, events=5, commits=5, largest=1)


async def test_a_long_queue_is_committed_in_bounded_transactions(store: GroupStore) -> None:
    await store.append([created(PARENT)])
    before = store.commit_stats
    many = [[notice(PARENT, f"a_{i}", "done")] * 10 for i in range(250)]  # 2,500 events

    results = await asyncio.gather(*(store.append(events) for events in many))

    assert [e.seq for written in results for e in written] == list(range(2, 2502))
    stats = since(before, store.commit_stats)
    assert stats.appends == 250
    assert stats.commits >= 3  # at most 1,000 events per transaction
    await check_consistent(store)


# --- a member's own refusal --------------------------------------------------------------------


async def test_a_member_the_reducer_refuses_fails_alone(store: GroupStore) -> None:
    await store.append([created(PARENT)])
    before = store.commit_stats

    results = await asyncio.gather(
        store.append([notice(PARENT, "a_1", "done")]),
        # Its first event applies; its second names an agent nobody made.
        store.append([notice(PARENT, "a_2", "done"), changed("a_ghost", "idle", "x", "y")]),
        store.append([changed(PARENT, "idle", "running", "prompted")]),
        store.append([ev.token_revoked("nobody", None)]),
        store.append([command("k-last", PARENT)]),
        return_exceptions=True,
    )

    first, ghost, running, token, last = results
    assert isinstance(ghost, ReplayError)
    assert "a_ghost" in str(ghost)
    assert isinstance(token, ReplayError)
    # The others committed together, numbered as if the refused ones had never been asked.
    assert [seqs(r) for r in (first, running, last) if isinstance(r, list)] == [[2], [3], [4]]
    assert store.state.agents[PARENT]["state"] == "running"
    assert "k-last" in store.state.commands
    assert [n["from"] for n in store.state.notices.values()] == ["a_1"]
    stats = since(before, store.commit_stats)
    assert (stats.appends, stats.commits, stats.refused) == (3, 1, 2)
    await check_consistent(store)


async def test_unstorable_events_are_refused_before_joining_the_group(store: GroupStore) -> None:
    await store.append([created(PARENT)])

    results = await asyncio.gather(
        store.append([notice(PARENT, "a_1", "done")]),
        store.append([NewEvent(ev.NOTICE, PARENT, {"to": PARENT, "text": "nul\x00"})]),
        store.append([notice(PARENT, "a_3", "done")]),
        return_exceptions=True,
    )

    assert isinstance(results[1], UnstorableValueError)
    assert [seqs(r) for r in results if isinstance(r, list)] == [[2], [3]]
    await check_consistent(store)


async def test_a_row_the_database_refuses_fails_only_its_append(
    backend: Backend, store: GroupStore
) -> None:
    await store.append([created(PARENT)])
    backend.inject_failure("boom")
    before = store.commit_stats

    results = await asyncio.gather(
        store.append([notice(PARENT, "a_1", "done")]),
        store.append([notice(PARENT, "a_2", "done"), command("boom", PARENT)]),
        store.append([command("fine", PARENT)]),
        return_exceptions=True,
    )

    assert isinstance(results[1], backend.db_error)
    assert "injected failure" in str(results[1])
    assert not isinstance(results[1], StoreUnavailableError)
    # The group's transaction failed: its members were committed one by one.
    assert [seqs(r) for r in results if isinstance(r, list)] == [[2], [3]]
    stats = since(before, store.commit_stats)
    assert (stats.appends, stats.commits, stats.refused) == (2, 2, 1)
    assert sorted(store.state.commands) == ["fine"]
    await check_consistent(store)


async def test_a_member_after_a_deletion_sees_the_agent_gone(store: GroupStore) -> None:
    await store.append([created(PARENT), created("a_other")])
    before = store.commit_stats

    results = await asyncio.gather(
        store.append([notice("a_other", PARENT, "done")]),
        store.append([ev.deleted(PARENT, "ops", None, with_=None)]),
        # One transaction per append would refuse this: the agent is deleted before it.
        store.append([changed(PARENT, "idle", "running", "prompted")]),
        store.append([changed("a_other", "idle", "running", "prompted")]),
        return_exceptions=True,
    )

    assert isinstance(results[2], ReplayError)
    assert [seqs(r) for r in results if isinstance(r, list)] == [[3], [4], [5]]
    assert PARENT not in store.state.agents
    assert store.state.agents["a_other"]["state"] == "running"
    stats = since(before, store.commit_stats)
    # The deletion ended its group; the two after it went in the next one.
    assert (stats.appends, stats.commits, stats.refused) == (3, 2, 1)
    await check_consistent(store)


# --- the store failing ------------------------------------------------------------------------


async def test_the_store_failing_fails_the_whole_group_and_leaves_the_state(
    backend: Backend, store: GroupStore, request: pytest.FixtureRequest
) -> None:
    await store.append([created(PARENT)])
    before = store.state.snapshot()
    stats_before = store.commit_stats
    heal = await _break(store, request)

    results = await asyncio.gather(
        *(store.append([notice(PARENT, f"a_{i}", "done")]) for i in range(5)),
        return_exceptions=True,
    )

    assert all(isinstance(r, StoreUnavailableError) for r in results), results
    assert all(r.retryable for r in results if isinstance(r, StoreUnavailableError))
    assert store.state.snapshot() == before
    assert store.commit_stats == stats_before
    await heal()
    # Nothing was taken: the next append continues the log without a gap.
    assert seqs(await store.append([notice(PARENT, "a_x", "done")])) == [2]
    await check_consistent(store)
    snapshot = store.state.snapshot()
    await store.close()
    assert (await backend.open()).state.snapshot() == snapshot


async def _break(store: GroupStore, request: pytest.FixtureRequest) -> Callable[[], Any]:
    """Make ``store`` unable to commit (what a full disk, or a connection the server dropped,
    looks like to it); returns what heals it."""
    if isinstance(store, SQLiteStore):
        conn = store._require()
        await store._run(lambda: conn.execute("PRAGMA query_only=1"))

        async def heal_sqlite() -> None:
            await store._run(lambda: conn.execute("PRAGMA query_only=0"))

        return heal_sqlite
    dsn = request.getfixturevalue("postgres_dsn")
    with psycopg.connect(dsn, autocommit=True) as conn_pg:
        conn_pg.execute(
            "CREATE FUNCTION die() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN PERFORM pg_terminate_backend(pg_backend_pid()); RETURN NEW; END $$"
        )
        conn_pg.execute(
            "CREATE TRIGGER die BEFORE INSERT ON notices FOR EACH ROW EXECUTE FUNCTION die()"
        )

    async def heal_pg() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn_pg:
            conn_pg.execute("DROP TRIGGER die ON notices")

    return heal_pg


# --- cancelled callers ------------------------------------------------------------------------


async def test_a_caller_cancelled_in_a_group_still_has_its_events_committed(
    backend: Backend, store: GroupStore
) -> None:
    await store.append([created(PARENT)])
    first = asyncio.create_task(store.append([notice(PARENT, "a_0", "done")]))
    await asyncio.sleep(0)  # a_0 has joined the queue and its commit is about to start
    callers = [first] + [
        asyncio.create_task(store.append([notice(PARENT, f"a_{i}", "done")])) for i in (1, 2, 3)
    ]
    await asyncio.sleep(0)  # a_1..a_3 have joined the queue behind a_0's commit
    callers[2].cancel()  # cancelled while queued
    await wait_for(lambda: not store._group._queue)  # their group is taken, its commit begun
    callers[3].cancel()  # cancelled while its group's commit is (or was just) in flight

    done = await asyncio.gather(*callers, return_exceptions=True)

    assert [type(r) for r in done[2:]] == [asyncio.CancelledError] * 2
    assert [seqs(r) for r in done if isinstance(r, list)] == [[2], [3]]
    log = await store.read(1)
    assert [e.data["from"] for e in log] == ["a_0", "a_1", "a_2", "a_3"]
    assert sorted(n["from"] for n in store.state.notices.values()) == ["a_0", "a_1", "a_2", "a_3"]
    await check_consistent(store)
    assert store.commit_stats.largest == 3  # a_1..a_3 went together
    snapshot = store.state.snapshot()
    await store.close()
    assert (await backend.open()).state.snapshot() == snapshot


async def wait_for(condition: Callable[[], bool]) -> None:
    for _ in range(10_000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition did not come true")


async def test_close_commits_what_was_accepted_first(backend: Backend, store: GroupStore) -> None:
    await store.append([created(PARENT)])
    callers = [
        asyncio.create_task(store.append([notice(PARENT, f"a_{i}", "done")])) for i in range(3)
    ]
    await asyncio.sleep(0)
    await store.close()
    assert [seqs(await c) for c in callers] == [[2], [3], [4]]
    again = await backend.open()
    assert again.state.last_seq == 4


# --- the same projections as one transaction per append (property; `make fuzz-stores`: more) -

EXAMPLES = int(os.environ.get("CORRAL_FUZZ_EXAMPLES", "10"))
SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
AGENTS = ["a_0", "a_1", "a_2"]
AGENT = st.sampled_from(AGENTS)
# Events the reducer takes or refuses depending on what came before them.
EVENT = st.one_of(
    AGENT.map(created),
    AGENT.map(lambda a: changed(a, "idle", "running", "prompted")),
    st.tuples(AGENT, AGENT).map(lambda p: notice(p[0], p[1], "done")),
    st.tuples(AGENT, st.integers(1, 12)).map(lambda p: ev.notices_dropped(p[0], [p[1]])),
    AGENT.map(lambda a: ev.deleted(a, "ops", None, with_=None)),
    st.sampled_from(["k1", "k2"]).map(lambda k: command(k, "a_0")),
)


def up_to_a_deletion(events: list[NewEvent]) -> list[NewEvent]:
    """``events`` up to the first ``agent.deleted``. Within ONE append, events after a
    deletion meet a reducer that still finds the deleted agent (one ``Tx`` does not hide it),
    so a replay, one event at a time, can differ: no store promises more there, and the
    daemon writes a deletion last. Across appends the group committer keeps it exact."""
    for i, new in enumerate(events):
        if new.type == ev.AGENT_DELETED:
            return events[: i + 1]
    return events


APPENDS = st.lists(
    st.lists(EVENT, min_size=1, max_size=3).map(up_to_a_deletion), min_size=1, max_size=12
)


def one_tx_per_append(appends: list[list[NewEvent]], ts: str) -> tuple[State, list[bool]]:
    """The reference: each append in its own transaction, in order; which ones took."""
    state = State()
    took = []
    for events in appends:
        tx = Tx(state)
        try:
            for new in events:
                tx.apply(Event(tx.last_seq + 1, ts, new.type, new.agent_id, new.data))
        except Exception:
            took.append(False)
            continue
        tx.merge()
        took.append(True)
    return state, took


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ]
)
def new_store(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], GroupStore]:
    """Makes a fresh store (a new file, or a new schema) at each call, not yet open."""
    dsn = request.getfixturevalue("postgres_dsn") if request.param == "postgres" else None

    def fresh() -> GroupStore:
        name = uuid.uuid4().hex[:12]
        if dsn is None:
            return SQLiteStore(tmp_path / f"{name}.db", clock=FakeClock())
        return PostgresStore(dsn, schema=f"g_{name}", clock=FakeClock())

    return fresh


async def _grouped(store: GroupStore, appends: list[list[NewEvent]]) -> None:
    await store.open()
    try:
        ts = FakeClock().now().isoformat()
        expected, took = one_tx_per_append(appends, ts)
        # The first append alone, the rest queued behind it: groups of every size.
        results = await asyncio.gather(
            *(store.append(events) for events in appends), return_exceptions=True
        )
        assert [isinstance(r, list) for r in results] == took
        for r in results:
            if not isinstance(r, list):
                assert isinstance(r, ReplayError | KeyError), r
        assert store.state.snapshot() == expected.snapshot()
        await check_consistent(store)
    finally:
        await store.close()


@SETTINGS
@given(appends=APPENDS)
def test_groups_make_the_projections_one_transaction_per_append_makes(
    new_store: Callable[[], GroupStore], appends: list[list[NewEvent]]
) -> None:
    asyncio.run(_grouped(new_store(), appends))


def test_sqlite_errors_other_than_operational_are_not_store_unavailable() -> None:
    # What the committer relies on to tell a member's failure from the store's.
    assert not issubclass(sqlite3.IntegrityError, sqlite3.OperationalError)
    assert not issubclass(psycopg.errors.RaiseException, psycopg.OperationalError)
