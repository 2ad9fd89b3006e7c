"""``AgentHandle.cancellation``: cancelled when the daemon ends the agent, from its event
stream, against a daemon served on loopback (a stream needs a real server)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from corral.client import Connection, connect
from tests.support.front_door import DAEMON_TOKEN, FrontDoor, running_daemon
from tests.support.polling import settle

BOUND_S = 10.0


@pytest.fixture
async def door(tmp_path: Path) -> AsyncIterator[FrontDoor]:
    async with running_daemon(tmp_path, token=DAEMON_TOKEN) as opened:
        yield opened


@pytest.fixture
async def conn(door: FrontDoor) -> AsyncIterator[Connection]:
    async with connect(door.url, DAEMON_TOKEN, retry_s=0) as opened:
        yield opened


async def test_a_stop_cancels_the_agents_cancellation_saying_who_and_why(
    conn: Connection, door: FrontDoor
) -> None:
    agent = await conn.register("worker")
    following = door.service.subscriptions
    cancellation = agent.cancellation
    assert agent.cancellation is cancellation
    async with agent.turn("long work") as turn:
        assert not cancellation.is_cancelled
        # The stop comes once the handle follows the agent's events: a stop it finds done
        # already is read from the agent's record, which does not say who stopped it.
        await settle(lambda: door.service.subscriptions > following)
        await door.service.stop(agent.id, by="alice", why="enough")
        await asyncio.wait_for(cancellation.wait(), BOUND_S)
        assert cancellation.reason == f"agent {agent.id} was stopped by alice in the daemon: enough"
    assert turn.report is not None
    assert turn.report.outcome == "interrupted"


async def test_an_agent_that_fails_or_has_ended_is_cancelled(conn: Connection) -> None:
    agent = await conn.register("worker")  # onFailure fail
    cancellation = agent.cancellation
    await (await agent.begin("x")).fail("it broke", code="broken")
    await asyncio.wait_for(cancellation.wait(), BOUND_S)
    assert cancellation.reason == f"agent {agent.id} failed in the daemon: broken: it broke"
    again = conn.agent(agent.id)  # a handle of an ended agent: cancelled once it looks
    await asyncio.wait_for(again.cancellation.wait(), BOUND_S)


async def test_watches_end_with_the_connection_and_an_unknown_agent_is_not_watched(
    door: FrontDoor, caplog: pytest.LogCaptureFixture
) -> None:
    async with connect(door.url, DAEMON_TOKEN, retry_s=0) as conn:
        agent = await conn.register("worker")
        watched = agent.cancellation
        nobody = conn.agent("a_nobody").cancellation
        await settle(lambda: "cannot watch for its end" in caplog.text)
    assert not watched.is_cancelled
    assert not nobody.is_cancelled
