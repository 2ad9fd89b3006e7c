"""The agent service's locks (``_run_locks``): a command holds everything, a turn's steps hold
their run; and through the service, the turns of different runs commit together."""

from __future__ import annotations

import asyncio
from typing import Any

from corral.daemon import AgentService, SQLiteStore
from corral.daemon._run_locks import RunLocks
from tests.support.polling import idle, settle


class _Probe:
    """Tasks that enter a lock, say so, and stay until let go."""

    def __init__(self) -> None:
        self.inside: list[str] = []
        self.release: dict[str, asyncio.Event] = {}

    def hold(self, name: str, lock: Any) -> asyncio.Task[None]:
        self.release[name] = asyncio.Event()

        async def body() -> None:
            async with lock:
                self.inside.append(name)
                await self.release[name].wait()
                self.inside.remove(name)

        return asyncio.create_task(body(), name=name)


async def test_steps_of_different_runs_hold_their_locks_at_once() -> None:
    locks, probe = RunLocks(), _Probe()
    a = probe.hold("a", locks.run("run-1"))
    b = probe.hold("b", locks.run("run-2"))
    await settle(lambda: sorted(probe.inside) == ["a", "b"])
    probe.release["a"].set()
    probe.release["b"].set()
    await asyncio.gather(a, b)
    assert not locks.held()


async def test_steps_of_one_run_wait_for_each_other() -> None:
    locks, probe = RunLocks(), _Probe()
    a = probe.hold("a", locks.run("run-1"))
    await settle(lambda: probe.inside == ["a"])
    b = probe.hold("b", locks.run("run-1"))
    await idle()
    assert probe.inside == ["a"]
    probe.release["a"].set()
    await settle(lambda: probe.inside == ["b"])
    probe.release["b"].set()
    await asyncio.gather(a, b)


async def test_one_idempotency_key_is_answered_one_step_after_the_other_across_runs() -> None:
    locks, probe = RunLocks(), _Probe()
    a = probe.hold("a", locks.run("run-1", key="k"))
    await settle(lambda: probe.inside == ["a"])
    b = probe.hold("b", locks.run("run-2", key="k"))
    c = probe.hold("c", locks.run("run-3", key="other"))
    await settle(lambda: "c" in probe.inside)
    assert "b" not in probe.inside
    probe.release["a"].set()
    await settle(lambda: "b" in probe.inside)
    probe.release["b"].set()
    probe.release["c"].set()
    await asyncio.gather(a, b, c)


async def test_exclusive_waits_for_run_steps_and_keeps_new_ones_out() -> None:
    locks, probe = RunLocks(), _Probe()
    a = probe.hold("a", locks.run("run-1"))
    await settle(lambda: probe.inside == ["a"])
    x = probe.hold("x", locks.exclusive())
    await asyncio.sleep(0)
    # A step that comes after the exclusive holder began to wait waits behind it: a stream
    # of turns cannot hold a command off.
    b = probe.hold("b", locks.run("run-2"))
    await idle()
    assert probe.inside == ["a"]
    probe.release["a"].set()
    await settle(lambda: probe.inside == ["x"])
    probe.release["x"].set()
    await settle(lambda: probe.inside == ["b"])
    probe.release["b"].set()
    await asyncio.gather(a, x, b)
    assert not locks.held()


async def test_exclusive_holders_exclude_each_other() -> None:
    locks, probe = RunLocks(), _Probe()
    x = probe.hold("x", locks.exclusive())
    await settle(lambda: probe.inside == ["x"])
    y = probe.hold("y", locks.exclusive())
    await idle()
    assert probe.inside == ["x"]
    probe.release["x"].set()
    await settle(lambda: probe.inside == ["y"])
    probe.release["y"].set()
    await asyncio.gather(x, y)


async def test_a_waiter_cancelled_leaves_the_locks_usable() -> None:
    locks, probe = RunLocks(), _Probe()
    a = probe.hold("a", locks.run("run-1", key="k"))
    await settle(lambda: probe.inside == ["a"])
    x = probe.hold("x", locks.exclusive())
    b = probe.hold("b", locks.run("run-1", key="k"))
    await idle(5)
    x.cancel()
    b.cancel()
    await asyncio.gather(x, b, return_exceptions=True)
    probe.release["a"].set()
    await a
    assert not locks.held()
    # Nothing was left claimed: a new step of the run and key, and a command, go in.
    c = probe.hold("c", locks.run("run-1", key="k"))
    await settle(lambda: probe.inside == ["c"])
    probe.release["c"].set()
    await c
    y = probe.hold("y", locks.exclusive())
    await settle(lambda: probe.inside == ["y"])
    probe.release["y"].set()
    await y


async def test_prompts_of_different_runs_commit_together(
    make_service: Any, sqlite_store: SQLiteStore
) -> None:
    agents = 10
    service: AgentService = await make_service(sqlite_store)
    ids = []
    for i in range(agents):
        spec = {"name": f"solo-{i}", "harness": "command", "command": ["true"]}
        created = await service.spawn(spec)
        ids.append(created.body["id"])
    before = sqlite_store.commit_stats
    results = await asyncio.gather(*(service.prompt(agent_id, "go") for agent_id in ids))
    assert [r.status for r in results] == [202] * agents
    after = sqlite_store.commit_stats
    # Each agent is a run of its own: no prompt waited for another's commit, so the first
    # commit held them all (under one service-wide lock each would have committed alone).
    assert after.largest == agents
    assert after.commits - before.commits < agents
    await service.settled()
