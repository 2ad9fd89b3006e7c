"""LocalApi and HttpApi (against a real daemon on loopback), errors over the wire, SSE."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.daemon import (
    AgentApi,
    AgentNotFoundError,
    AgentNotLiveError,
    DaemonUnreachableError,
    Event,
    HttpApi,
    IdempotencyConflictError,
    InvalidSpecError,
    LocalApi,
    OutOfScopeError,
    RemoteError,
    UnauthorizedError,
    follow_events,
)
from corral.daemon._client import error_from_answer
from corral.kernel import CorralError, InvalidArgumentError
from corral.runtime import FakeClock
from tests.support.front_door import FrontDoor, free_port, running_daemon
from tests.support.harness import ScriptedHarness, fail
from tests.support.polling import settle

SPEC: dict[str, Any] = {"name": "w", "harness": "command", "command": ["true"]}


# --- the same behaviour through both implementations --------------------------------------


async def exercise(api: AgentApi, harness: ScriptedHarness, state: Callable[[str], str]) -> None:
    harness.script("w", fail("no access"))
    agent = await api.spawn({**SPEC, "prompt": "go", "onFailure": "ask"}, idempotency_key="k1")
    agent_id = agent["id"]
    assert agent_id.startswith("a_")
    assert len(agent_id) == 10
    assert agent["state"] == "running"
    await settle(lambda: state(agent_id) == "blocked")

    again = await api.spawn({**SPEC, "prompt": "go", "onFailure": "ask"}, idempotency_key="k1")
    assert again["id"] == agent_id  # the first answer, not a second agent
    assert [a["id"] for a in await api.list_agents()] == [agent_id]
    assert (await api.get(agent_id))["reason"] == "ask"

    (decision,) = await api.decisions()
    assert (decision["agentId"], decision["reason"], decision["error"]) == (
        agent_id,
        "ask",
        "no access",
    )
    assert await api.inbox(agent_id) == []

    answer = await api.prompt(agent_id, "try again", by="ana", why="fixed", idempotency_key="p1")
    assert answer == {"id": agent_id, "accepted": "prompt", "turn": 2}
    await settle(lambda: state(agent_id) == "idle")
    assert harness.prompts(agent_id) == ["go", "try again"]
    assert await api.decisions() == []

    stopped = {"id": agent_id, "accepted": "stop", "stopped": [agent_id]}
    assert await api.stop(agent_id, by="ana", why="done") == stopped
    assert (await api.get(agent_id))["state"] == "stopped"

    with pytest.raises(AgentNotLiveError) as not_live:
        await api.prompt(agent_id, "more")
    assert not_live.value.code == "agent_not_live"
    assert "is stopped" in not_live.value.message
    with pytest.raises(AgentNotFoundError) as missing:
        await api.get("a_00000000")
    assert missing.value.message == "no agent with id 'a_00000000'"
    assert missing.value.agent_id == "a_00000000"
    with pytest.raises(IdempotencyConflictError) as conflict:
        await api.stop(agent_id, idempotency_key="k1")
    assert "first used for spawn" in conflict.value.message
    with pytest.raises(InvalidSpecError) as invalid:
        await api.spawn({"name": "", "harness": "nope", "extra": 1})
    fields = {p["field"] for p in invalid.value.problems}
    assert fields == {"name", "harness", "extra"}
    assert len(await api.list_agents()) == 1  # nothing created by the refusals


async def test_local_api_runs_the_service(front: FrontDoor) -> None:
    api, harness = front.api, front.harness
    assert isinstance(api, AgentApi)
    await exercise(api, harness, lambda agent_id: str(api.service.get(agent_id)["state"]))


async def test_http_api_gives_the_same_answers_and_errors(
    daemon: FrontDoor, http_api: HttpApi
) -> None:
    assert isinstance(http_api, AgentApi)
    await exercise(http_api, daemon.harness, daemon.state)


async def test_http_api_sends_the_token_and_maps_401(tmp_path: Path) -> None:
    async with running_daemon(tmp_path, token="s3cret") as d:
        async with HttpApi(d.url, token="s3cret") as good:
            assert await good.list_agents() == []
        async with HttpApi(d.url, token="wrong") as bad:
            with pytest.raises(UnauthorizedError) as refused:
                await bad.list_agents()
        assert refused.value.code == "unauthorized"
        assert refused.value.message == "a valid bearer token is required"


async def test_http_api_maps_unknown_codes_to_remote_error(
    daemon: FrontDoor, http_api: HttpApi
) -> None:
    agent_id = (await http_api.spawn(SPEC))["id"]
    bad = httpx.AsyncClient(base_url=daemon.url)
    async with bad:
        answer = await bad.post(
            f"/agents/{agent_id}/prompt", content=b"hi", headers={"content-type": "text/plain"}
        )
    error = error_from_answer(answer.status_code, answer.json())
    assert isinstance(error, RemoteError)
    assert (error.code, error.status) == ("unsupported_media_type", 415)
    assert "text/plain" in error.message
    assert error.details["content_type"] == "text/plain"
    # Through HttpApi the same route answers the same way for an unknown agent id.
    with pytest.raises(AgentNotFoundError):
        await http_api.prompt("a_ffffffff", "x")


async def test_http_api_events_pages_the_log(daemon: FrontDoor, http_api: HttpApi) -> None:
    agent_id = (await http_api.spawn({**SPEC, "prompt": "go"}))["id"]
    await daemon.until(agent_id, "idle")
    events = await http_api.events()
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert (events[0].type, events[0].agent_id) == ("agent.created", agent_id)
    assert [e.seq for e in await http_api.events(after=2, limit=1)] == [3]
    assert all(e.agent_id == agent_id for e in await http_api.events(agent=agent_id))
    with pytest.raises(AgentNotFoundError):
        await http_api.events(agent="a_00000000")


async def test_no_daemon_is_a_clear_error() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    async with HttpApi(url) as api:
        with pytest.raises(DaemonUnreachableError) as unreachable:
            await api.list_agents()
    assert unreachable.value.code == "daemon_unreachable"
    assert unreachable.value.retryable is True
    assert unreachable.value.message.startswith(f"no daemon answers at {url} (")
    assert "corral serve" in unreachable.value.message


# --- errors from answers ------------------------------------------------------------------


def test_error_from_answer_rebuilds_the_daemon_class() -> None:
    body = {
        "error": {
            "code": "budget_exhausted",
            "message": "agent 'a_1': tokens budget exhausted",
            "retryable": False,
            "details": {"agent_id": "a_1", "dimension": "tokens", "limit": 10, "used": 12},
        }
    }
    error = error_from_answer(409, body)
    assert type(error).__name__ == "AgentBudgetExhaustedError"
    assert error.message == "agent 'a_1': tokens budget exhausted"
    assert error.details["dimension"] == "tokens"
    assert error.to_dict() == body["error"]


def test_error_from_answer_keeps_unknown_codes_and_non_json() -> None:
    unknown = error_from_answer(
        418, {"error": {"code": "teapot", "message": "short and stout", "retryable": True}}
    )
    assert isinstance(unknown, RemoteError)
    assert (unknown.code, unknown.message, unknown.retryable, unknown.status) == (
        "teapot",
        "short and stout",
        True,
        418,
    )
    proxy = error_from_answer(502, "<html>Bad Gateway</html>")
    assert isinstance(proxy, RemoteError)
    assert (proxy.code, proxy.status) == ("http_502", 502)
    assert proxy.message == "the daemon answered HTTP 502: <html>Bad Gateway</html>"
    odd = error_from_answer(
        404, {"error": {"code": "agent_not_found", "details": {"retryable": 1}}}
    )
    assert isinstance(odd, AgentNotFoundError)
    assert (odd.message, odd.retryable, odd.details) == ("agent_not_found", False, {})
    # Only the errors of corral.daemon are rebuilt; the base family is never faked.
    assert isinstance(error_from_answer(400, {"error": {"code": "corral_error"}}), RemoteError)


# --- an agent's reach ------------------------------------------------------------------------


async def test_local_api_as_an_agent_reaches_its_subtree_only(front: FrontDoor) -> None:
    front.harness.script("w", fail("no key"))
    lead = await front.spawn(name="lead")
    child = await front.spawn(name="w", parent=lead, prompt="go", onFailure="ask")
    other = await front.spawn(name="other")
    await front.settled(child, "blocked")
    api = front.api.as_agent(lead)
    assert isinstance(api, AgentApi)
    assert {a["id"] for a in await api.list_agents()} == {lead, child}
    assert (await api.get(child))["parent"] == lead
    assert [d["agentId"] for d in await api.decisions()] == [child]
    helper = await api.spawn({**SPEC, "name": "helper", "parent": child})
    assert helper["parent"] == child
    before = front.store.state.last_seq
    refusals = [
        api.get(other),
        api.prompt(other, "x"),
        api.stop(other),
        api.inbox(other),
        api.spawn({**SPEC, "name": "root"}),
        api.spawn({**SPEC, "name": "stray", "parent": other}),
        api.events(),
        api.events(agent=other),
        api.db_query(other, {"sql": "SELECT 1"}),
        api.db_status(other),
        api.db_freeze(child, "runaway", by="alice"),
        api.db_reinstate(lead, "alice", "fixed"),
    ]
    for refused in refusals:
        with pytest.raises(OutOfScopeError) as caught:
            await refused
        assert caught.value.details["principal"] == lead
    assert front.store.state.last_seq == before  # nothing applied
    own = await api.events(agent=child)
    assert own
    assert all(e.agent_id == child for e in own)
    # The operator's API is untouched by the agent's.
    assert len(await front.api.list_agents()) == 4


# --- bad arguments ------------------------------------------------------------------------


async def test_bad_arguments_are_refused_up_front(
    front: FrontDoor,
) -> None:
    api = front.api
    with pytest.raises(InvalidArgumentError, match="LocalApi: service must be"):
        LocalApi("service")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="spawn: spec must be a mapping"):
        await api.spawn([("name", "x")])  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="prompt: agent_id must be a non-empty"):
        await api.prompt("")
    with pytest.raises(InvalidArgumentError, match="HttpApi: url must be an http"):
        HttpApi("localhost:4600")
    with pytest.raises(InvalidArgumentError, match="HttpApi: timeout_s must be"):
        HttpApi(timeout_s=0)
    with pytest.raises(InvalidArgumentError, match="HttpApi: token must be"):
        HttpApi(token="")
    with pytest.raises(InvalidArgumentError, match="HttpApi: transport must be"):
        HttpApi(transport="tcp")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="events: limit must be"):
        await api.events(limit=0)
    with pytest.raises(InvalidArgumentError, match="follow_events: after must be"):
        await anext(follow_events("http://127.0.0.1:1", after=-1))
    with pytest.raises(InvalidArgumentError, match="follow_events: url must be"):
        await anext(follow_events("file:///tmp/x"))
    with pytest.raises(InvalidArgumentError, match="follow_events: read_timeout_s must be"):
        await anext(follow_events("http://127.0.0.1:1", read_timeout_s=0))
    with pytest.raises(InvalidArgumentError, match="follow_events: max_reconnects must be"):
        await anext(follow_events("http://127.0.0.1:1", max_reconnects=-1))


# --- following events ---------------------------------------------------------------------


class _Cut(httpx.AsyncByteStream):
    """A response body that breaks off after ``events`` complete server-sent events."""

    def __init__(self, inner: httpx.AsyncByteStream, events: int) -> None:
        self.inner = inner
        self.events = events

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen, tail = 0, b""
        async for chunk in self.inner:
            out = bytearray()
            for byte in chunk:
                out.append(byte)
                tail = (tail + bytes([byte]))[-4:]
                if tail.endswith((b"\n\n", b"\r\n\r\n")):
                    seen += 1
                    if seen == self.events:
                        yield bytes(out)
                        raise httpx.ReadError("connection dropped")
            yield bytes(out)

    async def aclose(self) -> None:
        await self.inner.aclose()


class Flaky(httpx.AsyncBaseTransport):
    """The real network, except: the first stream breaks off after ``cut_after`` events, and
    with ``refuse_later`` every later connection is refused."""

    def __init__(self, cut_after: int, *, refuse_later: bool = False) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.cut_after = cut_after
        self.refuse_later = refuse_later
        self.requests: list[httpx.Request] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.refuse_later and len(self.requests) > 1:
            raise httpx.ConnectError("connection refused", request=request)
        response = await self.inner.handle_async_request(request)
        if len(self.requests) == 1:
            assert isinstance(response.stream, httpx.AsyncByteStream)
            response.stream = _Cut(response.stream, self.cut_after)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


async def take(stream: AsyncIterator[Event], n: int) -> list[Event]:
    got = []
    async for event in stream:
        got.append(event)
        if len(got) == n:
            break
    return got


async def test_follow_events_streams_the_log_then_live_events(
    daemon: FrontDoor, http_api: HttpApi
) -> None:
    first = (await http_api.spawn(SPEC))["id"]
    stream = follow_events(daemon.url)
    try:
        (created,) = await take(stream, 1)
        assert (created.seq, created.type, created.agent_id) == (1, "agent.created", first)
        assert created.data["agent"]["name"] == "w"
        second = (await http_api.spawn({**SPEC, "name": "v"}))["id"]
        (live,) = await take(stream, 1)
        assert (live.seq, live.type, live.agent_id) == (2, "agent.created", second)
    finally:
        await stream.aclose()


async def test_follow_events_filters_by_agent_and_starts_after(
    daemon: FrontDoor, http_api: HttpApi
) -> None:
    a = (await http_api.spawn({**SPEC, "prompt": "go"}))["id"]
    await daemon.until(a, "idle")
    b = (await http_api.spawn({**SPEC, "name": "v", "prompt": "go"}))["id"]
    await daemon.until(b, "idle")
    log = await http_api.events(agent=b)
    stream = follow_events(daemon.url, after=log[0].seq, agent=b)
    try:
        got = await take(stream, len(log) - 1)
    finally:
        await stream.aclose()
    assert [(e.seq, e.type) for e in got] == [(e.seq, e.type) for e in log[1:]]
    assert {e.agent_id for e in got} == {b}


async def test_follow_events_resumes_with_last_event_id(
    daemon: FrontDoor, http_api: HttpApi
) -> None:
    for name in ("a", "b", "c", "d"):
        await http_api.spawn({**SPEC, "name": name})
    transport = Flaky(cut_after=2)
    clock = FakeClock(auto_advance=True)
    stream = follow_events(daemon.url, transport=transport, reconnect_after_s=0.25, clock=clock)
    try:
        got = await take(stream, 4)
    finally:
        await stream.aclose()
    assert [e.seq for e in got] == [1, 2, 3, 4]  # no gap, no repeat across the drop
    assert [e.data["agent"]["name"] for e in got] == ["a", "b", "c", "d"]
    assert len(transport.requests) == 2
    assert "last-event-id" not in transport.requests[0].headers
    assert transport.requests[1].headers["last-event-id"] == "2"
    assert clock.sleeps == [0.25]


async def test_follow_events_reconnects_a_silent_stream(
    daemon: FrontDoor, http_api: HttpApi
) -> None:
    await http_api.spawn(SPEC)
    transport = Flaky(cut_after=10**9)  # never cut: the stream just goes quiet
    clock = FakeClock(auto_advance=True)
    stream = follow_events(daemon.url, transport=transport, read_timeout_s=0.2, clock=clock)
    try:
        (first,) = await take(stream, 1)
        reading = asyncio.create_task(take(stream, 1))
        await settle(lambda: len(transport.requests) >= 2)  # the heartbeat is 60 s away
        second = (await http_api.spawn({**SPEC, "name": "v"}))["id"]
        (live,) = await reading
    finally:
        await stream.aclose()
    assert (first.seq, live.seq, live.agent_id) == (1, 2, second)
    assert transport.requests[1].headers["last-event-id"] == "1"


async def test_follow_events_gives_up_after_max_reconnects(
    daemon: FrontDoor, http_api: HttpApi
) -> None:
    await http_api.spawn(SPEC)
    await http_api.spawn({**SPEC, "name": "v"})
    transport = Flaky(cut_after=1, refuse_later=True)
    clock = FakeClock(auto_advance=True)
    stream = follow_events(daemon.url, transport=transport, max_reconnects=3, clock=clock)
    got: list[Event] = []

    async def drain() -> None:
        async for event in stream:
            got.append(event)

    with pytest.raises(DaemonUnreachableError) as gave_up:
        await drain()
    assert [e.seq for e in got] == [1]
    assert "gave up after 3 reconnects" in gave_up.value.message
    assert len(transport.requests) == 4  # the first connection, then 3 refused reconnects
    assert clock.sleeps == [0.5, 0.5, 0.5]


async def test_follow_events_without_a_daemon_fails_at_once() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(DaemonUnreachableError, match=f"no daemon answers at {url}"):
        await anext(follow_events(url))


async def test_follow_events_raises_the_daemons_refusal(daemon: FrontDoor) -> None:
    with pytest.raises(AgentNotFoundError):
        await anext(follow_events(daemon.url, agent="a_00000000"))
    with pytest.raises(CorralError) as beyond:
        await anext(follow_events(daemon.url, after=99))
    assert beyond.value.code == "invalid_request"
    assert "99 is beyond the last event (0)" in beyond.value.message


async def test_an_sse_client_that_goes_away_leaves_no_subscriber_behind(
    daemon: FrontDoor, http_api: HttpApi
) -> None:
    await http_api.spawn(SPEC)
    async with httpx.AsyncClient(base_url=daemon.url, timeout=10) as client:
        for _ in range(3):
            async with client.stream("GET", "/events") as response:
                async for line in response.aiter_lines():
                    if line.startswith("data:"):
                        break
                assert daemon.service.subscriptions >= 1
    # The server notices each disconnect and closes that stream's subscription.
    await settle(lambda: daemon.service.subscriptions == 0)
