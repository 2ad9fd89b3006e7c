"""The fence in ``PostgresStore``'s group commit: an append about an agent whose lease this
node does not hold (another node's, a stale epoch, this node's own lease run out) is refused
with ``NotOwnerError`` and writes nothing; the rest of its group commits; leases are written
with the agents they belong to."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from corral.daemon import _events as ev
from corral.daemon._errors import NotOwnerError
from corral.daemon._events import NewEvent
from tests.daemon.cluster.members import Cluster, Member, cluster

pytestmark = pytest.mark.postgres


@pytest.fixture
async def nodes(postgres_dsn: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    async with cluster(postgres_dsn, tmp_path) as made:
        yield made


async def _two(nodes: Cluster) -> tuple[Member, Member, str, str]:
    """Nodes a and b, each with an idle agent of its own (a1 on a, b1 on b), and each node's
    store has read the other's writes."""
    a, b = await nodes.member("a"), await nodes.member("b")
    a1, b1 = await a.spawn(name="a1"), await b.spawn(name="b1")
    await a.store.refresh()
    await b.store.refresh()
    return a, b, a1, b1


def _recreated(agent_id: str) -> NewEvent:
    """An event about ``agent_id`` that needs its lease and changes no projection."""
    return ev.workdir_recreated(agent_id, 1, "/nowhere")


async def _refused_and_nothing_written(nodes: Cluster, writer: Member, *others: Member) -> None:
    """``writer`` stopping b1 (not its own) is refused and nothing is written anywhere."""
    log = await nodes.log()
    snapshots = [m.store.state.snapshot() for m in (writer, *others)]
    agent = next(a for a, r in writer.store.state.agents.items() if r["name"] == "b1")
    with pytest.raises(NotOwnerError) as raised:
        await writer.service.stop(agent)
    assert (raised.value.code, raised.value.retryable) == ("not_owner", True)
    assert raised.value.agent_id == agent
    assert await nodes.log() == log
    for member in others:
        await member.store.refresh()
    assert [m.store.state.snapshot() for m in (writer, *others)] == snapshots
    assert (await writer.store.replay()).snapshot() == writer.store.state.snapshot()


async def test_created_agents_are_leased_to_their_node_at_epoch_1(nodes: Cluster) -> None:
    a, b, a1, b1 = await _two(nodes)
    assert await nodes.leases() == {a1: ("a", 1), b1: ("b", 1)}
    assert (a.node.held, b.node.held) == (frozenset({a1}), frozenset({b1}))
    assert a.node.owns(a1)
    assert not a.node.owns(b1)


async def test_a_deleted_agents_lease_goes_with_it(nodes: Cluster) -> None:
    a, _, a1, b1 = await _two(nodes)
    await a.service.stop(a1)
    await a.service.delete(a1)
    assert await nodes.leases() == {b1: ("b", 1)}
    assert a.node.held == frozenset()


async def test_an_append_about_another_nodes_agent_is_refused(nodes: Cluster) -> None:
    a, b, _, _ = await _two(nodes)
    await _refused_and_nothing_written(nodes, a, b)


async def test_an_append_at_a_stale_epoch_is_refused(nodes: Cluster) -> None:
    # b1's lease moved on behind b's back (another node adopted it and gave it back):
    # b's epoch is stale, so even b may not write about b1.
    _, b, _, b1 = await _two(nodes)
    await nodes.sql("UPDATE leases SET epoch = epoch + 1 WHERE agent_id = %s", b1)
    await _refused_and_nothing_written(nodes, b)


async def test_an_append_after_this_nodes_lease_ran_out_is_refused(nodes: Cluster) -> None:
    a, b, a1, _ = await _two(nodes)
    await nodes.expire("b")
    assert b.node.owns(next(iter(b.node.held)))  # its own clock has not noticed yet
    await _refused_and_nothing_written(nodes, b, a)
    # a's lease runs: a writes about its own agent as before.
    await a.store.append([_recreated(a1)])


async def test_the_other_members_of_a_refused_members_group_commit(nodes: Cluster) -> None:
    a, _, a1, b1 = await _two(nodes)
    before = a.store.commit_stats
    # Queued together before the first commit starts: one group of three.
    mine, theirs, again = await asyncio.gather(
        a.store.append([_recreated(a1)]),
        a.store.append([_recreated(b1)]),
        a.store.append([_recreated(a1)]),
        return_exceptions=True,
    )
    after = a.store.commit_stats
    assert (after.commits - before.commits, after.appends - before.appends) == (1, 2)
    assert after.refused - before.refused == 1
    assert isinstance(theirs, NotOwnerError)
    assert not isinstance(mine, BaseException)
    assert not isinstance(again, BaseException)
    # Gapless: the refused member took no number.
    assert [e.seq for e in mine + again] == [mine[0].seq, mine[0].seq + 1]
    log = await nodes.log()
    assert [(e.type, e.agent_id) for e in log[-2:]] == [(ev.WORKDIR_RECREATED, a1)] * 2
    assert [e.seq for e in log] == list(range(1, len(log) + 1))


async def test_a_notice_to_another_nodes_agent_is_not_fenced(nodes: Cluster) -> None:
    a, b, a1, b1 = await _two(nodes)
    sender = a.store.state.agents[a1]
    (written,) = await a.store.append([ev.notice(b1, sender, "done", "idle")])
    await b.store.refresh()
    assert [n["to"] for n in b.store.state.notices.values()] == [b1]
    assert (await nodes.log())[-1].seq == written.seq
