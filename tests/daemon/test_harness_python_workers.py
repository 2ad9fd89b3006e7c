"""PythonHarness's kept workers: one per agent, reused by its turns, replaced when it dies,
ended when idle, over the cap, at release, stop and shutdown."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from corral.daemon import AgentService, TurnFailedError, WarmHarness, open_store
from corral.runtime import FakeClock
from tests.daemon.test_harness_python import (  # the autouse fixture ends every made harness
    MODULE,
    _alive,
    _pid,
    _workers_end,  # noqa: F401
    make,
    request,
)
from tests.support.polling import settle

MOODS = "moods"


async def turn(harness: object, tmp_path: Path, prompt: str, agent_id: str = "a_1") -> str:
    assert isinstance(harness, WarmHarness)
    req = request(tmp_path, MOODS, prompt=prompt, agent_id=agent_id)
    req.workdir.mkdir(exist_ok=True)
    return (await harness.run_turn(req)).output  # type: ignore[attr-defined,no-any-return]


def pid_of(output: str) -> int:
    return int(output.split()[0])


async def test_an_agents_turns_share_its_worker_and_its_module_state(tmp_path: Path) -> None:
    harness = make()
    assert await turn(harness, tmp_path, "pid") == f"{harness.workers['a_1']} 1"
    assert await turn(harness, tmp_path, "pid") == f"{harness.workers['a_1']} 2"
    # Another agent never shares it: a worker of its own, its module state fresh.
    other = await turn(harness, tmp_path, "pid", agent_id="a_2")
    assert other == f"{harness.workers['a_2']} 1"
    assert harness.workers["a_1"] != harness.workers["a_2"]


async def test_a_crash_fails_the_turn_and_the_next_turn_gets_a_fresh_worker(
    tmp_path: Path,
) -> None:
    harness = make()
    first = pid_of(await turn(harness, tmp_path, "pid"))
    with pytest.raises(TurnFailedError, match="exited with code 3 before the turn ended"):
        await turn(harness, tmp_path, "exit")
    assert harness.workers == {}
    assert not _alive(first)
    assert await turn(harness, tmp_path, "pid") == f"{harness.workers['a_1']} 1"
    assert harness.workers["a_1"] != first


async def test_a_timeout_kills_the_worker_and_the_next_turn_works(tmp_path: Path) -> None:
    harness = make()
    req = request(tmp_path, MOODS, prompt="sleep", agent_id="a_1", timeout_s=0.5)
    req.workdir.mkdir()
    with pytest.raises(TurnFailedError, match=r"turn timed out after 0.5 s"):
        await harness.run_turn(req)
    killed = _pid(req.workdir)
    assert killed is not None
    assert not _alive(killed)
    assert harness.workers == {}
    assert pid_of(await turn(harness, tmp_path, "pid")) != killed


async def test_the_memory_limit_ends_the_worker_and_the_next_turn_works(tmp_path: Path) -> None:
    harness = make(max_memory_bytes=512 * 1024 * 1024)
    first = pid_of(await turn(harness, tmp_path, "pid"))
    with pytest.raises(TurnFailedError, match="over its memory limit of 536870912 bytes"):
        await turn(harness, tmp_path, "hog")
    assert not _alive(first)
    assert await turn(harness, tmp_path, "pid") == f"{harness.workers['a_1']} 1"


async def test_idle_workers_are_ended_after_idle_s(tmp_path: Path) -> None:
    clock = FakeClock()
    harness = make(clock=clock, idle_s=10.0)
    a = pid_of(await turn(harness, tmp_path, "pid", agent_id="a_1"))
    clock.advance(6.0)
    b = pid_of(await turn(harness, tmp_path, "pid", agent_id="a_2"))
    assert await harness.end_idle() == 0
    clock.advance(5.0)  # a_1 idle 11 s, a_2 5 s: the sweep (every 5 s) ends a_1 only
    await settle(lambda: not _alive(a))
    assert list(harness.workers) == ["a_2"]
    assert _alive(b)
    await settle(lambda: len(clock.sleeps) == 3)  # the sweep sleeps again, from 11 s
    clock.advance(5.0)
    await settle(lambda: not _alive(b))
    assert harness.workers == {}


async def test_at_most_max_workers_are_kept_least_recently_used_ended_first(
    tmp_path: Path,
) -> None:
    harness = make(max_workers=2)
    a = pid_of(await turn(harness, tmp_path, "pid", agent_id="a_1"))
    b = pid_of(await turn(harness, tmp_path, "pid", agent_id="a_2"))
    await turn(harness, tmp_path, "pid", agent_id="a_1")  # a_2 is now the least recent
    await turn(harness, tmp_path, "pid", agent_id="a_3")
    assert list(harness.workers) == ["a_1", "a_3"]
    assert harness.workers["a_1"] == a
    assert not _alive(b)


async def test_release_ends_the_agents_worker(tmp_path: Path) -> None:
    harness = make()
    a = pid_of(await turn(harness, tmp_path, "pid", agent_id="a_1"))
    b = pid_of(await turn(harness, tmp_path, "pid", agent_id="a_2"))
    await harness.release("a_1")
    await harness.release("a_1")  # nothing kept: nothing to do
    assert not _alive(a)
    assert list(harness.workers) == ["a_2"]
    await harness.aclose()
    assert harness.workers == {}
    assert not _alive(b)


async def test_the_service_ends_a_stopped_agents_worker_and_all_at_close(
    tmp_path: Path,
) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'corral.db'}")
    await store.open()
    harness = make()
    service = AgentService(store, home=tmp_path / "home", harnesses={"python": harness})
    await service.start()
    try:
        spec = {"harness": "python", "function": f"{MODULE}:{MOODS}", "prompt": "pid"}
        ids = [(await service.spawn({**spec, "name": f"m{i}"})).body["id"] for i in range(3)]
        await service.settled()
        pids = {a: pid for a, pid in harness.workers.items() if pid is not None}
        assert sorted(pids) == sorted(ids)
        await service.stop(ids[0])
        assert ids[0] not in harness.workers
        assert not _alive(pids[ids[0]])
        await service.close()
        assert harness.workers == {}
        assert [p for p in pids.values() if _alive(p)] == []
    finally:
        await service.close()
        await store.close()


async def test_a_failed_agents_worker_is_released(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'corral.db'}")
    await store.open()
    harness = make()
    service = AgentService(store, home=tmp_path / "home", harnesses={"python": harness})
    await service.start()
    try:
        spec = {"harness": "python", "function": f"{MODULE}:raises", "prompt": "x"}
        agent = (await service.spawn({**spec, "name": "r"})).body["id"]
        await service.settled()
        assert service.get(agent)["state"] == "failed"
        # The release runs on its own task once the failure is written.
        await settle(lambda: agent not in harness.workers)
    finally:
        await service.close()
        await store.close()


async def test_turns_of_one_agent_wait_for_each_other(tmp_path: Path) -> None:
    # The service never runs two turns of one agent at once; the harness holds to it anyway.
    harness = make()
    outputs = await asyncio.gather(*(turn(harness, tmp_path, "pid") for _ in range(3)))
    assert sorted(o.split()[1] for o in outputs) == ["1", "2", "3"]
    assert len(harness.workers) == 1
