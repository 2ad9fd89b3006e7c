"""Turn records commit in the transaction of the events that open or close them: both are
written, or neither (a record is never lost behind its events, nor written without them), on
both stores, alone or in a group; and a turn of the service costs the commits of its events,
no more."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Sequence
from typing import Any

import psycopg
import pytest

from corral.daemon import AgentService, Event, NewEvent, SQLiteStore
from corral.daemon import _events as ev
from corral.daemon._state import ReplayError
from corral.daemon.stores import PostgresStore
from corral.daemon.stores._turns import TurnRow, TurnRows
from tests.daemon.conftest import MakeService
from tests.daemon.test_store import PARENT, created, notice
from tests.support.harness import ScriptedHarness
from tests.support.store_backends import Backend

AnyStore = SQLiteStore | PostgresStore


@pytest.fixture
async def store(backend: Backend) -> AnyStore:
    opened = await backend.open()
    assert isinstance(opened, SQLiteStore | PostgresStore)
    return opened


def rows_for(turn: int, output: str, seen: list[list[Event]] | None = None) -> TurnRows:
    """Turn ``turn``'s row of PARENT, stamped with the ts of the append's last event."""

    def rows(written: Sequence[Event]) -> list[TurnRow]:
        if seen is not None:
            seen.append(list(written))
        record = {"agentId": PARENT, "turn": turn, "outcome": "running", "at": written[-1].ts}
        return [(record, {"output": output, "logs": []})]

    return rows


def started(turn: int) -> NewEvent:
    return ev.turn_started(PARENT, turn, f"prompt {turn}", retry=False, notices=[])


def refuse_turn_rows(store: AnyStore, turn: int) -> None:
    """Make the database refuse the row of PARENT's turn ``turn`` (a trigger): what any
    failure of the transaction after the events were written looks like."""
    if isinstance(store, SQLiteStore):
        with sqlite3.connect(store.path) as conn:
            conn.execute(
                "CREATE TRIGGER refuse_turn BEFORE INSERT ON turns "
                f"WHEN NEW.n = {turn} BEGIN SELECT RAISE(ABORT, 'turn row refused'); END"
            )
        conn.close()
        return
    with psycopg.connect(store.dsn, autocommit=True) as pg:
        pg.execute(
            "CREATE OR REPLACE FUNCTION refuse_turn() RETURNS trigger LANGUAGE plpgsql "
            "AS $$ BEGIN RAISE EXCEPTION 'turn row refused'; END $$"
        )
        pg.execute(
            "CREATE TRIGGER refuse_turn BEFORE INSERT OR UPDATE ON turns FOR EACH ROW "
            f"WHEN (NEW.n = {turn}) EXECUTE FUNCTION refuse_turn()"
        )


async def test_turn_rows_commit_with_their_events(store: AnyStore) -> None:
    seen: list[list[Event]] = []
    written = await store.append([created(PARENT), started(1)], turns=rows_for(1, "x", seen))

    # The rows were made of the append's own events, numbered.
    assert seen[-1] == written
    found = await store.get_turn(PARENT, 1)
    assert found == (
        {"agentId": PARENT, "turn": 1, "outcome": "running", "at": written[-1].ts},
        {"output": "x", "logs": []},
    )
    assert store.commit_stats.commits == 1  # one transaction for both


async def test_a_turn_row_refused_leaves_neither_it_nor_its_events(store: AnyStore) -> None:
    await store.append([created(PARENT)])
    before = store.state.snapshot()
    refuse_turn_rows(store, 1)

    with pytest.raises(Exception, match="turn row refused"):
        await store.append([started(1)], turns=rows_for(1, "x"))

    assert store.state.snapshot() == before
    assert [e.seq for e in await store.read()] == [1]
    assert await store.get_turn(PARENT, 1) is None
    # The log goes on without a gap, and a later turn's row commits with its events.
    written = await store.append([started(2)], turns=rows_for(2, "y"))
    assert [e.seq for e in written] == [2]
    assert await store.get_turn(PARENT, 2) is not None


async def test_in_a_group_each_member_gets_its_own_turn_rows_or_none(store: AnyStore) -> None:
    await store.append([created(PARENT), created("a_other")])
    refuse_turn_rows(store, 3)

    results = await asyncio.gather(
        store.append([started(1)], turns=rows_for(1, "one")),
        # The reducer refuses this member (no such agent): its row is not written either.
        store.append(
            [ev.turn_started("a_ghost", 9, "p", retry=False, notices=[])],
            turns=rows_for(2, "ghost"),
        ),
        # The database refuses this member's turn row: its events go too, alone.
        store.append(
            [ev.turn_started("a_other", 1, "p", retry=False, notices=[])],
            turns=rows_for(3, "refused"),
        ),
        store.append([notice(PARENT, "a_other", "done")], turns=rows_for(4, "four")),
        return_exceptions=True,
    )

    assert isinstance(results[1], ReplayError)
    assert "turn row refused" in str(results[2])
    assert isinstance(results[0], list)
    assert isinstance(results[3], list)
    assert [e.seq for e in results[0] + results[3]] == [3, 4]
    assert (await store.get_turn(PARENT, 1) or ({}, {}))[1]["output"] == "one"
    assert (await store.get_turn(PARENT, 4) or ({}, {}))[1]["output"] == "four"
    assert await store.get_turn(PARENT, 2) is None
    assert await store.get_turn(PARENT, 3) is None
    assert store.state.agents["a_other"]["state"] != "running"
    assert (await store.replay()).snapshot() == store.state.snapshot()


# --- the service --------------------------------------------------------------------------------


async def test_a_turn_costs_the_commits_of_its_events_only(
    make_service: MakeService, sqlite_store: SQLiteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def no_separate_write(*args: Any) -> None:
        raise AssertionError("a turn record was written apart from its events")

    monkeypatch.setattr(sqlite_store, "save_turn", no_separate_write)
    service: AgentService = await make_service(sqlite_store, harness=ScriptedHarness())
    agent = (await service.spawn({"name": "w", "harness": "command", "command": ["x"]})).body["id"]
    before = sqlite_store.commit_stats
    await service.prompt(agent, "go")
    await service.settled(agent)

    after = sqlite_store.commit_stats
    assert after.commits - before.commits == 2  # the turn's start, then its outcome
    assert [t["outcome"] for t in await service.turn_book.list(agent)] == ["succeeded"]


async def test_an_outcome_that_fails_to_commit_leaves_its_record_running(
    make_service: MakeService, sqlite_store: SQLiteStore
) -> None:
    service: AgentService = await make_service(sqlite_store, harness=ScriptedHarness())
    agent = (await service.spawn({"name": "w", "harness": "command", "command": ["x"]})).body["id"]
    with sqlite3.connect(sqlite_store.path) as conn:
        conn.execute(
            "CREATE TRIGGER refuse_end BEFORE INSERT ON turns WHEN NEW.data LIKE "
            "'%\"outcome\":\"succeeded\"%' BEGIN SELECT RAISE(ABORT, 'turn row refused'); END"
        )
    conn.close()

    await service.prompt(agent, "go")
    await service.settled(agent)

    # The outcome's transaction failed: neither its events nor the closed record are there.
    kinds = [e.type for e in await sqlite_store.read(agent_id=agent)]
    assert ev.TURN_STARTED in kinds
    assert ev.TURN_COMPLETED not in kinds
    assert [t["outcome"] for t in await service.turn_book.list(agent)] == ["running"]
    assert sqlite_store.state.agents[agent]["turnInFlight"] == 1
