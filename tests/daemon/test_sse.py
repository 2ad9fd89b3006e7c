"""GET /events as SSE against a real server (uvicorn on 127.0.0.1, port 0)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.front_door import BOUND_S, running_serve


@pytest.fixture(autouse=True)
def _no_token_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CORRAL_TOKEN", raising=False)


@dataclass
class Frame:
    id: str | None = None
    event: str | None = None
    data: str | None = None
    comments: list[str] = field(default_factory=list)

    def json(self) -> dict[str, Any]:
        assert self.data is not None
        value: dict[str, Any] = json.loads(self.data)
        return value


async def frames(response: httpx.Response) -> AsyncIterator[Frame]:
    """The SSE frames of ``response`` as they arrive."""
    frame = Frame()
    async for line in response.aiter_lines():
        if line == "":
            if frame != Frame():
                yield frame
            frame = Frame()
        elif line.startswith(":"):
            frame.comments.append(line[1:].strip())
        else:
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "data" and frame.data is not None:
                value = frame.data + "\n" + value
            setattr(frame, name, value)


async def take(stream: AsyncIterator[Frame], count: int) -> list[Frame]:
    """The next ``count`` event frames (heartbeats skipped)."""
    got: list[Frame] = []
    async with asyncio.timeout(BOUND_S):
        async for frame in stream:
            if frame.event is not None:
                got.append(frame)
                if len(got) == count:
                    break
    return got


async def until(stream: AsyncIterator[Frame], event: str, **data: Any) -> list[Frame]:
    """Frames up to and including the first ``event`` whose data has the given values."""
    got: list[Frame] = []
    async with asyncio.timeout(BOUND_S):
        async for frame in stream:
            if frame.event is None:
                continue
            got.append(frame)
            payload = frame.json()["data"]
            if frame.event == event and all(payload.get(k) == v for k, v in data.items()):
                return got
    raise AssertionError(f"the stream ended before {event} {data}")


WORKER = {"name": "w", "harness": "command", "command": ["worker"]}


async def test_live_events_arrive_with_seq_as_id_and_type_as_event(tmp_path: Path) -> None:
    async with running_serve(tmp_path) as daemon, daemon.client() as client:
        agent_id = (await client.post("/agents", json=WORKER)).json()["id"]
        async with client.stream("GET", "/events") as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            stream = frames(response)
            (created,) = await take(stream, 1)
            # The stream is past its catch-up read: what follows is delivered live.
            prompted = await client.post(f"/agents/{agent_id}/prompt", json={"text": "go"})
            assert prompted.status_code == 202
            live = await until(stream, "agent.state_changed", to="idle")
    assert (created.id, created.event) == ("1", "agent.created")
    assert [f.event for f in live] == [
        "agent.state_changed",
        "agent.turn_started",
        "agent.turn_completed",
        "agent.state_changed",
    ]
    assert [f.id for f in live] == ["2", "3", "4", "5"]
    event = live[2].json()
    assert set(event) == {"seq", "ts", "type", "agentId", "data"}
    assert (event["seq"], event["type"], event["agentId"]) == (4, "agent.turn_completed", agent_id)
    assert event["data"]["output"] == "ok"


async def test_resume_with_last_event_id_gives_the_events_after_it_then_live_ones(
    tmp_path: Path,
) -> None:
    async with running_serve(tmp_path) as daemon, daemon.client() as client:
        agent_id = (await client.post("/agents", json={**WORKER, "prompt": "one"})).json()["id"]
        async with client.stream("GET", "/events") as response:
            first = await until(frames(response), "agent.state_changed", to="idle")
        assert [f.id for f in first] == ["1", "2", "3", "4"]

        async with client.stream("GET", "/events", headers={"Last-Event-ID": "2"}) as response:
            stream = frames(response)
            resumed = await take(stream, 2)
            await client.post(f"/agents/{agent_id}/prompt", json={"text": "two"})
            live = await until(stream, "agent.state_changed", to="idle")
    assert [f.id for f in resumed] == ["3", "4"]
    assert [f.id for f in live] == ["5", "6", "7", "8"]
    assert live[1].json()["data"]["prompt"] == "two"


async def test_after_query_resumes_too_and_the_header_wins_over_it(tmp_path: Path) -> None:
    async with running_serve(tmp_path) as daemon, daemon.client() as client:
        for name in ("a", "b", "c"):
            await client.post("/agents", json={**WORKER, "name": name})
        async with client.stream("GET", "/events", params={"after": 1}) as response:
            by_query = await take(frames(response), 2)
        async with client.stream(
            "GET", "/events", params={"after": 0}, headers={"Last-Event-ID": "2"}
        ) as response:
            by_header = await take(frames(response), 1)
    assert [f.id for f in by_query] == ["2", "3"]
    assert [f.id for f in by_header] == ["3"]


async def test_agent_filter_streams_only_that_agents_events(tmp_path: Path) -> None:
    async with running_serve(tmp_path) as daemon, daemon.client() as client:
        first = (await client.post("/agents", json={**WORKER, "name": "a"})).json()["id"]
        second = (await client.post("/agents", json={**WORKER, "name": "b"})).json()["id"]
        async with client.stream("GET", "/events", params={"agent": first}) as response:
            stream = frames(response)
            (created,) = await take(stream, 1)
            await client.post(f"/agents/{second}/prompt", json={"text": "for b"})
            await client.post(f"/agents/{first}/prompt", json={"text": "for a"})
            live = await until(stream, "agent.state_changed", to="idle")
    assert created.json()["agentId"] == first
    assert created.id == "1"
    assert {f.json()["agentId"] for f in live} == {first}
    assert [f.event for f in live] == [
        "agent.state_changed",
        "agent.turn_started",
        "agent.turn_completed",
        "agent.state_changed",
    ]
    assert live[1].json()["data"]["prompt"] == "for a"


async def test_heartbeat_comments_keep_an_idle_stream_open(tmp_path: Path) -> None:
    async with (
        running_serve(tmp_path, heartbeat_s=0.05) as daemon,
        daemon.client() as client,
        client.stream("GET", "/events") as response,
        asyncio.timeout(BOUND_S),
    ):
        async for frame in frames(response):
            if frame.comments:
                break
    assert frame.comments == ["heartbeat"]
    assert frame.event is None


async def test_stream_errors_are_json_before_the_stream_starts(tmp_path: Path) -> None:
    async with running_serve(tmp_path) as daemon, daemon.client() as client:
        unknown = await client.get("/events", params={"agent": "a_00000000"})
        bad_cursor = await client.get("/events", headers={"Last-Event-ID": "x"})
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "agent_not_found"
    assert bad_cursor.status_code == 400
    assert bad_cursor.json()["error"]["code"] == "invalid_request"


async def test_an_open_stream_ends_when_the_daemon_stops(tmp_path: Path) -> None:
    async with running_serve(tmp_path) as daemon, daemon.client() as client:
        await client.post("/agents", json=WORKER)
        async with client.stream("GET", "/events") as response:
            stream = frames(response)
            await take(stream, 1)
            daemon.task.cancel()
            async with asyncio.timeout(BOUND_S):
                rest = [f async for f in stream]
        assert [f for f in rest if f.event is not None] == []
        with pytest.raises(asyncio.CancelledError):
            await daemon.task


async def test_with_a_token_the_stream_needs_it(tmp_path: Path) -> None:
    token = "stream-token-0123456789"
    async with running_serve(tmp_path, token=token) as daemon:
        async with httpx.AsyncClient(base_url=daemon.url) as anonymous:
            refused = await anonymous.get("/events")
        async with daemon.client() as client:
            await client.post("/agents", json=WORKER)
            async with client.stream("GET", "/events") as response:
                (created,) = await take(frames(response), 1)
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "unauthorized"
    assert created.event == "agent.created"
