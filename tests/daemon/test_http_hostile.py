"""Hostile clients against the turn, log, name, PATCH, lifecycle and metrics routes: every
answer is a typed refusal (never a 500), nothing out of scope is seen or done."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.front_door import FrontDoor

HUGE = str(10**30)


async def test_huge_turn_numbers_are_refused_not_500(scoped_front: FrontDoor) -> None:
    door = scoped_front
    agent = await door.spawn(name="p", prompt="go")
    await door.settled(agent, "idle")
    async with door.client() as api:
        for path, params in [
            (f"/agents/{agent}/turns/{HUGE}", {}),
            (f"/agents/{agent}/turns/-{HUGE}", {}),
            (f"/agents/{agent}/turns/-1", {}),
            (f"/agents/{agent}/turns", {"before": HUGE}),
            (f"/agents/{agent}/turns", {"before": "x"}),
            (f"/agents/{agent}/turns", {"limit": HUGE}),
            (f"/agents/{agent}/logs", {"turn": HUGE}),
            (f"/agents/{agent}/logs", {"tail": HUGE}),
            (f"/agents/{agent}/logs", {"turn": HUGE, "follow": "true"}),
            ("/agents", {"limit": HUGE}),
            ("/events", {"after": HUGE}),
        ]:
            got = await api.get(path, params=params)
            assert got.status_code in (400, 422), (path, params, got.status_code, got.text)


async def test_names_a_url_path_cannot_carry_are_refused(scoped_front: FrontDoor) -> None:
    # "a/b" could never be addressed; "." and ".." vanish in path normalisation, so a
    # command meant for them would reach another route or agent (POST /agents/./stop is
    # POST /agents/stop: the agent named "stop").
    async with scoped_front.client() as api:
        for name in ("a/b", ".", "..", "   "):
            got = await api.post(
                "/agents", json={"name": name, "harness": "command", "command": ["w"]}
            )
            assert got.status_code == 400, (name, got.text)
            assert got.json()["error"]["code"] == "invalid_spec"
        # Dots and spaces inside a name are fine.
        for name in ("a.b", "...", "a b"):
            got = await api.post(
                "/agents", json={"name": name, "harness": "command", "command": ["w"]}
            )
            assert got.status_code == 201, (name, got.text)


async def test_a_follow_of_an_agent_deleted_meanwhile_is_not_a_500(
    scoped_front: FrontDoor, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The follow reads the ended agent's backlog from the store; a DELETE lands meanwhile.
    door = scoped_front
    agent = await door.spawn(name="p", prompt="go")
    await door.settled(agent, "idle")
    await door.service.stop(agent)
    book = door.service.turn_book
    real = book.list

    async def deleted_meanwhile(agent_id: str, **kwargs: Any) -> list[dict[str, Any]]:
        found = await real(agent_id, **kwargs)
        await door.service.delete(agent_id)
        return found

    monkeypatch.setattr(book, "list", deleted_meanwhile)
    async with door.client() as api:
        got = await api.get(f"/agents/{agent}/logs", params={"follow": "true"})
    assert got.status_code < 500, got.text
    assert book.fanout.followers == 0
