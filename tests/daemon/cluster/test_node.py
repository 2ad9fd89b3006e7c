"""``Node`` driven by hand (``loop=False``, ``tick``) over one PostgreSQL database, with the
agent services it serves: adoption of a dead node's agents, a lost lease, joining refused,
a restart under the same name, and following the other nodes' writes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from corral.daemon import _events as ev
from corral.daemon._cluster._alone import hold_alone
from corral.daemon._errors import ClusterModeError, NodeTakenError, NotOwnerError
from corral.daemon._events import Event
from tests.daemon.cluster.members import TOKEN, Cluster, Member, cluster
from tests.support.polling import idle, settle

pytestmark = pytest.mark.postgres

RESTARTED = "daemon restarted during turn"


@pytest.fixture
async def nodes(postgres_dsn: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    async with cluster(postgres_dsn, tmp_path) as made:
        yield made


async def _hanging(member: Member, name: str = "w") -> str:
    """An agent of ``member`` whose first turn runs until released or cancelled; a failed
    turn is retried once (onFailure retry)."""
    member.harness.script(name, "hang")
    agent = await member.spawn(name=name, prompt="go", onFailure="retry", maxRetries=1)
    await settle(lambda: agent in member.harness.running)
    return agent


async def _count(nodes: Cluster, type_: str, agent: str) -> int:
    return sum(1 for e in await nodes.log() if (e.type, e.agent_id) == (type_, agent))


# --- adoption ---------------------------------------------------------------------------------


async def test_a_dead_nodes_turn_is_interrupted_once_and_retried_by_its_adopter(
    nodes: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    a, b = await nodes.member("a"), await nodes.member("b")
    w = await _hanging(a)
    assert await b.node.tick() == []  # a is live: nothing to adopt

    await nodes.expire("a")
    assert await b.node.tick() == [w]
    assert (await nodes.leases())[w] == ("b", 2)
    assert b.node.owns(w)
    # The policy applies on b: onFailure retry runs the same prompt again, there.
    await settle(lambda: b.harness.prompts(w) == ["go"])
    await asyncio.wait_for(b.service.settled(w), 10)
    assert await _count(nodes, ev.TURN_INTERRUPTED, w) == 1
    (interrupted,) = [e for e in await nodes.log() if e.type == ev.TURN_INTERRUPTED]
    assert (interrupted.data["turn"], interrupted.data["reason"]) == (1, RESTARTED)
    rec = b.state(w)
    assert (rec["state"], rec["lastOutput"], rec["retriesUsed"]) == ("idle", "ok", 1)

    # a comes back to life and its turn ends: its outcome is refused, nothing is written.
    log = await nodes.log()
    caplog.clear()
    a.harness.release("w")
    await asyncio.wait_for(a.service.settled(w), 10)
    assert await nodes.log() == log
    # Dropped as expected (not a failed turn task).
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert "released" not in [e.data.get("output") for e in log]

    assert await b.node.tick() == []  # adopted once
    assert await nodes.log() == log
    assert (await b.store.replay()).snapshot() == b.store.state.snapshot()


async def test_a_late_command_through_the_dead_node_is_refused(nodes: Cluster) -> None:
    a, b = await nodes.member("a"), await nodes.member("b")
    w = await a.spawn(name="w")
    await nodes.expire("a")
    assert await b.node.tick() == [w]
    log = await nodes.log()
    with pytest.raises(NotOwnerError):
        await a.service.prompt(w, "late")
    assert await nodes.log() == log
    assert a.harness.requests == []
    await b.service.prompt(w, "on time")
    await asyncio.wait_for(b.service.settled(w), 10)
    assert b.harness.prompts(w) == ["on time"]


async def test_whole_runs_move_together_and_adopters_share_them(nodes: Cluster) -> None:
    a, b, c = await nodes.member("a"), await nodes.member("b"), await nodes.member("c")
    # Two runs on a: a parent with two children, and one agent alone.
    parent = await a.spawn(name="p")
    kids = [await a.spawn(name=f"k{i}", parent=parent) for i in range(2)]
    alone = await a.spawn(name="q")
    run = {parent, *kids}
    assert {a.state(k)["runId"] for k in run} == {a.state(parent)["runId"]}

    await nodes.expire("a")
    taken_b = set(await b.node.tick())  # ceil(2 runs / 2 live nodes): one run
    taken_c = set(await c.node.tick())
    assert {frozenset(taken_b), frozenset(taken_c)} == {frozenset(run), frozenset({alone})}
    assert await b.node.tick() == []
    leases = await nodes.leases()
    assert {leases[k] for k in run} in ({("b", 2)}, {("c", 2)})
    assert b.node.held == frozenset(taken_b)
    assert c.node.held == frozenset(taken_c)


async def test_each_of_several_dead_runs_is_adopted_by_one_node_once(nodes: Cluster) -> None:
    a, b, c = await nodes.member("a"), await nodes.member("b"), await nodes.member("c")
    agents = [await a.spawn(name=f"s{i}") for i in range(4)]
    await nodes.expire("a")
    first = await b.node.tick()
    assert len(first) == 2  # a fair share: ceil(4 runs / 2 live nodes)
    rest = await c.node.tick() + await c.node.tick() + await b.node.tick()
    assert sorted(first + rest) == sorted(agents)
    leases = await nodes.leases()
    assert {leases[x][1] for x in agents} == {2}
    assert {x for x in agents if leases[x][0] == "b"} == b.node.held
    assert {x for x in agents if leases[x][0] == "c"} == c.node.held


async def test_a_node_that_left_is_adopted_at_once(nodes: Cluster) -> None:
    a, b = await nodes.member("a"), await nodes.member("b")
    w = await a.spawn(name="w")
    await a.service.close()
    await a.node.leave()
    assert await b.node.tick() == [w]


# --- a lost lease -----------------------------------------------------------------------------


async def test_a_node_whose_lease_ran_out_stops_acting_and_rejoins(nodes: Cluster) -> None:
    a, b = await nodes.member("a"), await nodes.member("b")
    w = await _hanging(a)
    other = await a.spawn(name="o")
    first = a.node.incarnation

    # a is paused past its lease; b adopts its agents; then a resumes and renews.
    await nodes.expire("a")
    assert sorted(await b.node.tick()) == sorted([w, other])
    await settle(lambda: b.harness.prompts(w) == ["go"])
    await asyncio.wait_for(b.service.settled(w), 10)
    log = await nodes.log()
    assert await a.node.tick() == []
    assert sorted(a.harness.reaped) == sorted([w, other])  # disowned: their processes ended
    assert a.harness.cancelled == [w]  # its turn task ended, its outcome never written
    assert a.node.incarnation not in ("", first)
    assert a.node.held == frozenset()
    assert not a.node.owns(w)
    assert await nodes.log() == log
    assert await _count(nodes, ev.TURN_INTERRUPTED, w) == 1
    live = await nodes.sql("SELECT name FROM nodes WHERE expires > clock_timestamp()")
    assert sorted(live) == [("a",), ("b",)]
    # New agents go to it again, and it runs them.
    fresh = await a.spawn(name="n", prompt="hi")
    await asyncio.wait_for(a.service.settled(fresh), 10)
    assert a.node.held == frozenset({fresh})


# --- joining ----------------------------------------------------------------------------------


async def test_a_live_node_of_the_same_name_is_refused(nodes: Cluster) -> None:
    # Its lease runs longer than three of the newcomer's: another live daemon of that name.
    await nodes.node("a")
    with pytest.raises(NodeTakenError) as raised:
        await nodes.node("a", lease_s=1.0, home=nodes.root / "a")
    assert raised.value.code == "node_taken"
    assert "is live" in raised.value.message


async def test_a_node_restarted_at_once_waits_for_its_last_runs_lease(nodes: Cluster) -> None:
    _, first = await nodes.node("a")
    # The last run died with 0.3 s of its lease left: the new one waits, then joins.
    await nodes.sql(
        "UPDATE nodes SET expires = clock_timestamp() + interval '0.3 seconds' WHERE name = 'a'"
    )
    _, second = await nodes.node("a", home=nodes.root / "a")
    assert second.incarnation != first.incarnation
    rows = await nodes.sql("SELECT incarnation FROM nodes WHERE name = 'a'")
    assert rows == [(second.incarnation,)]


async def test_a_node_with_another_token_is_refused(nodes: Cluster) -> None:
    await nodes.node("a")
    with pytest.raises(NodeTakenError) as raised:
        await nodes.node("b", token=TOKEN + "-other")
    assert "another token" in raised.value.message
    await nodes.expire("a")  # no live node left with the first token: b may take over
    await nodes.node("b", token=TOKEN + "-other")


async def test_a_home_of_another_node_is_refused(nodes: Cluster) -> None:
    await nodes.node("a")
    with pytest.raises(NodeTakenError) as raised:
        await nodes.node("b", home=nodes.root / "a")
    assert "belongs to node 'a'" in raised.value.message
    assert await nodes.sql("SELECT name FROM nodes") == [("a",)]


async def test_a_daemon_alone_and_nodes_exclude_each_other(nodes: Cluster) -> None:
    store, a = await nodes.node("a")
    with pytest.raises(ClusterModeError) as raised:
        await hold_alone(store)
    assert raised.value.code == "cluster_mode"
    await a.leave()  # its session's shared hold goes with it
    held = await hold_alone(store)
    try:
        with pytest.raises(ClusterModeError):
            await nodes.node("b")
        with pytest.raises(ClusterModeError):
            await hold_alone(store)  # nor a second daemon alone
    finally:
        await held.close()
    await nodes.node("b")  # the store is free again


# --- a restart --------------------------------------------------------------------------------


async def test_a_node_restarted_before_adoption_claims_its_agents_back(nodes: Cluster) -> None:
    a = await nodes.member("a")
    w = await _hanging(a)
    idle_one = await a.spawn(name="i")
    # a dies (nothing more written by it) and its lease runs out before anyone adopts.
    await a.service.close()
    await nodes.expire("a")

    again = await nodes.member("a")
    assert again.node.held == frozenset({w, idle_one})
    assert (await nodes.leases())[w] == ("a", 2)
    await settle(lambda: again.harness.prompts(w) == ["go"])
    await asyncio.wait_for(again.service.settled(w), 10)
    assert await _count(nodes, ev.TURN_INTERRUPTED, w) == 1
    assert again.state(w)["state"] == "idle"
    log = await nodes.log()
    assert await again.node.tick() == []
    assert await nodes.log() == log


async def test_a_node_restarted_after_adoption_ends_its_leftovers_only(nodes: Cluster) -> None:
    a, b = await nodes.member("a"), await nodes.member("b")
    w = await _hanging(a)
    await a.service.close()
    await nodes.expire("a")
    assert await b.node.tick() == [w]
    await settle(lambda: b.harness.prompts(w) == ["go"])
    await asyncio.wait_for(b.service.settled(w), 10)
    assert (a.home / "agents" / w / "state").is_dir()
    log = await nodes.log()

    again = await nodes.member("a")
    assert again.node.held == frozenset()
    assert again.harness.reaped == [w]  # what the dead daemon left of w on its machine
    assert (await nodes.leases())[w] == ("b", 2)
    assert await nodes.log() == log


# --- following --------------------------------------------------------------------------------


async def test_a_nodes_feed_streams_every_nodes_events_in_order(nodes: Cluster) -> None:
    a, b = await nodes.member("a"), await nodes.member("b")
    await a.spawn(name="first")
    await b.store.refresh()
    start = b.store.state.last_seq
    seen: list[Event] = []

    async def collect() -> None:
        async for event in b.service.subscribe(start):
            seen.append(event)

    task = asyncio.create_task(collect())
    try:
        await settle(lambda: b.service.subscriptions == 1)
        await idle()
        x = await a.spawn(name="x", prompt="one")
        await asyncio.wait_for(a.service.settled(x), 10)
        await idle()
        assert seen == []  # b has not read the log yet
        # b's own commit brings a's events in first (its append catches up), in order.
        await b.spawn(name="y")
        await a.service.prompt(x, "two")
        await asyncio.wait_for(a.service.settled(x), 10)
        await b.node.tick()
        last = (await nodes.log())[-1].seq
        await settle(lambda: bool(seen) and seen[-1].seq == last)
    finally:
        task.cancel()
    log = await nodes.log()
    assert [e.seq for e in seen] == list(range(start + 1, last + 1))
    assert [(e.seq, e.type, e.agent_id) for e in seen] == [
        (e.seq, e.type, e.agent_id) for e in log if e.seq > start
    ]
    assert b.store.state.snapshot() == (await b.store.replay()).snapshot()


async def test_a_node_whose_lease_ran_out_unadopted_takes_its_agents_back(
    nodes: Cluster,
) -> None:
    # Its lease ran out but nobody adopted before it renewed: once it stopped acting and
    # joined again, its agents are nobody's unless it takes them back (epoch + 1), as a
    # restart does; the turn it cancelled is settled once, as interrupted.
    a, b = await nodes.member("a"), await nodes.member("b")
    w = await _hanging(a)
    await nodes.expire("a")
    assert await a.node.tick() == [w]
    assert a.harness.cancelled == [w]
    assert a.node.held == frozenset({w})
    assert (await nodes.leases())[w] == ("a", 2)
    await settle(lambda: a.harness.prompts(w) == ["go", "go"])
    await asyncio.wait_for(a.service.settled(w), 10)
    assert await _count(nodes, ev.TURN_INTERRUPTED, w) == 1
    assert (a.state(w)["state"], a.state(w)["retriesUsed"]) == ("idle", 1)
    assert await b.node.tick() == []
    assert await a.node.tick() == []
    assert await _count(nodes, ev.TURN_INTERRUPTED, w) == 1


async def test_a_node_that_stopped_acting_in_time_takes_its_agents_back(
    nodes: Cluster,
) -> None:
    # The loop's own check: the database did not answer for most of the lease, so the node
    # stopped acting (its clock said the lease may run out), but it renewed in time after
    # all. Its agents are still leased to it: the next round takes them back.
    a = await nodes.member("a")
    w = await _hanging(a)
    incarnation = a.node.incarnation
    await a.node._lost("the test cut it off")  # what _beat does when not renewed in time
    assert a.harness.cancelled == [w]
    assert await a.node.tick() == [w]
    assert a.node.incarnation == incarnation
    assert (await nodes.leases())[w] == ("a", 2)
    await settle(lambda: a.harness.prompts(w) == ["go", "go"])
    await asyncio.wait_for(a.service.settled(w), 10)
    assert await _count(nodes, ev.TURN_INTERRUPTED, w) == 1


async def test_a_notification_wakes_a_following_node(nodes: Cluster) -> None:
    # With its loops running, b reads a's commits when their NOTIFY arrives (its lease,
    # renewed every 15 s here, plays no part).
    a, b = await nodes.member("a"), await nodes.member("b", loop=True)
    seen: list[int] = []
    b.store.watch(lambda events, own: seen.extend(e.seq for e in events if not own))
    x = await a.spawn(name="x")
    await settle(lambda: x in b.store.state.agents, within_s=10)
    await a.service.prompt(x, "hi")
    await asyncio.wait_for(a.service.settled(x), 10)
    last = a.store.state.last_seq
    await settle(lambda: b.store.state.last_seq == last, within_s=10)
    assert seen == list(range(1, last + 1))
    assert b.store.state.agents[x]["lastOutput"] == "ok"
