"""The HTTP API through httpx's ASGI transport: endpoints, errors, bad input, auth, OpenAPI."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from starlette.types import Message

from corral.daemon import (
    AgentNotFoundError,
    RemoteError,
    ServiceClosedError,
    TurnFailedError,
    TurnResult,
    create_app,
    http_status,
)
from corral.daemon._auth import agent_token
from corral.kernel import BudgetExhaustedError, InvalidArgumentError
from tests.support.front_door import DAEMON_TOKEN, FrontDoor
from tests.support.harness import fail
from tests.support.polling import settle


def error_of(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    error: dict[str, Any] = body["error"]
    assert set(error) == {"code", "message", "retryable", "details"}
    assert error["code"] == code, error
    return error


def fields(error: dict[str, Any]) -> set[str]:
    return {p["field"] for p in error["details"]["problems"]}


WORKER = {"name": "w", "harness": "command", "command": ["worker"]}


# --- endpoints ------------------------------------------------------------------------------


async def test_healthz(front: FrontDoor) -> None:
    async with front.client() as client:
        response = await client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


async def test_spawn_answers_201_with_the_agent_then_get_and_list_show_it(front: FrontDoor) -> None:
    front.harness.script("w", "the result")
    async with front.client() as client:
        response = await client.post("/agents", json={**WORKER, "prompt": "go"})
        assert response.status_code == 201
        agent = response.json()
        assert agent["id"].startswith("a_")
        assert agent["state"] == "running"
        assert agent["spec"]["command"] == ["worker"]
        assert response.headers["location"] == f"/agents/{agent['id']}"
        assert "idempotency-replayed" not in response.headers
        await front.settled(agent["id"], "idle")
        shown = (await client.get(f"/agents/{agent['id']}")).json()
        listed = (await client.get("/agents")).json()
    assert shown["state"] == "idle"
    assert shown["lastOutput"] == "the result"
    assert [a["id"] for a in listed["agents"]] == [agent["id"]]
    assert front.harness.prompts(agent["id"]) == ["go"]


async def test_prompt_answers_202_and_runs_a_turn(front: FrontDoor) -> None:
    agent_id = await front.spawn(name="w")
    async with front.client() as client:
        response = await client.post(f"/agents/{agent_id}/prompt", json={"text": "hello"})
    assert response.status_code == 202
    assert response.json() == {"id": agent_id, "accepted": "prompt", "turn": 1}
    await front.settled(agent_id, "idle")
    assert front.harness.prompts(agent_id) == ["hello"]


async def test_prompt_without_a_body_resends_the_last_prompt(front: FrontDoor) -> None:
    agent_id = await front.spawn(name="w", prompt="first")
    await front.settled(agent_id, "idle")
    async with front.client() as client:
        response = await client.post(f"/agents/{agent_id}/prompt")
    assert response.status_code == 202
    await front.settled(agent_id, "idle")
    assert front.harness.prompts(agent_id) == ["first", "first"]


async def test_stop_answers_202_with_or_without_a_body(front: FrontDoor) -> None:
    first = await front.spawn(name="a")
    second = await front.spawn(name="b")
    async with front.client() as client:
        bare = await client.post(f"/agents/{first}/stop")
        with_body = await client.post(f"/agents/{second}/stop", json={"by": "ops", "why": "done"})
    assert (bare.status_code, with_body.status_code) == (202, 202)
    assert bare.json() == {"id": first, "accepted": "stop", "stopped": [first]}
    assert front.state(first) == front.state(second) == "stopped"


async def test_decisions_list_blocked_agents_and_resolutions_on_request(front: FrontDoor) -> None:
    front.harness.script("w", fail("disk full"))
    agent_id = await front.spawn(name="w", prompt="go", onFailure="ask")
    await front.settled(agent_id, "blocked")
    async with front.client() as client:
        pending = (await client.get("/decisions")).json()
        assert [d["agentId"] for d in pending["decisions"]] == [agent_id]
        assert pending["decisions"][0]["reason"] == "ask"
        assert "resolutions" not in pending
        response = await client.post(
            f"/agents/{agent_id}/prompt", json={"text": "retry", "by": "ana", "why": "rotated"}
        )
        assert response.status_code == 202
        await front.settled(agent_id, "idle")
        after = (await client.get("/decisions")).json()
        answered = (await client.get("/decisions", params={"resolved": "true"})).json()
    assert after["decisions"] == []
    (resolution,) = answered["decisions"]
    assert resolution["agentId"] == agent_id
    assert (resolution["answer"], resolution["by"], resolution["why"]) == (
        "retry",
        "ana",
        "rotated",
    )


async def test_inbox_holds_the_notices_to_an_agent(front: FrontDoor) -> None:
    parent = await front.spawn(name="lead")
    child = await front.spawn(name="w", prompt="go", parent=parent, notifyOn=["done"])
    await front.settled(child, "idle")
    async with front.client() as client:
        response = await client.get(f"/agents/{parent}/inbox")
    assert response.status_code == 200
    body = response.json()
    assert body["agentId"] == parent
    (notice,) = body["notices"]
    assert (notice["from"], notice["kind"], notice["state"]) == (child, "done", "pending")


async def test_events_as_json_pages_after_a_seq_filtered_by_agent(front: FrontDoor) -> None:
    first = await front.spawn(name="a")
    second = await front.spawn(name="b", prompt="go")
    await front.settled(second, "idle")
    last = front.store.state.last_seq
    async with front.client() as client:
        everything = (await client.get("/events", params={"format": "json"})).json()
        after_one = (await client.get("/events", params={"format": "json", "after": 1})).json()
        only_b = (await client.get("/events", params={"format": "json", "agent": second})).json()
        limited = (await client.get("/events", params={"format": "json", "limit": 2})).json()
    assert [e["seq"] for e in everything["events"]] == list(range(1, last + 1))
    assert everything["lastSeq"] == last
    assert everything["events"][0]["agentId"] == first
    assert everything["events"][0]["type"] == "agent.created"
    assert [e["seq"] for e in after_one["events"]] == list(range(2, last + 1))
    assert {e["agentId"] for e in only_b["events"]} == {second}
    assert [e["seq"] for e in limited["events"]] == [1, 2]


async def test_command_replayed_by_idempotency_key_has_the_header_and_applies_once(
    front: FrontDoor,
) -> None:
    async with front.client() as client:
        body = {**WORKER, "idempotencyKey": "k-1"}
        first = await client.post("/agents", json=body)
        again = await client.post("/agents", json=body)
        agent_id = first.json()["id"]
        stop = {"idempotencyKey": "k-2"}
        stopped = await client.post(f"/agents/{agent_id}/stop", json=stop)
        stopped_again = await client.post(f"/agents/{agent_id}/stop", json=stop)
    assert (first.status_code, again.status_code) == (201, 201)
    assert again.json() == first.json()
    assert again.headers["idempotency-replayed"] == "true"
    assert "idempotency-replayed" not in first.headers
    assert len(front.service.list_agents()) == 1
    assert (stopped.status_code, stopped_again.status_code) == (202, 202)
    assert stopped_again.headers["idempotency-replayed"] == "true"


async def test_prompt_replay_by_key_does_not_start_a_second_turn(front: FrontDoor) -> None:
    agent_id = await front.spawn(name="w")
    async with front.client() as client:
        body = {"text": "once", "idempotencyKey": "p-1"}
        first = await client.post(f"/agents/{agent_id}/prompt", json=body)
        await front.settled(agent_id, "idle")
        again = await client.post(f"/agents/{agent_id}/prompt", json=body)
    assert (first.status_code, again.status_code) == (202, 202)
    assert again.headers["idempotency-replayed"] == "true"
    assert front.harness.prompts(agent_id) == ["once"]


# --- refusals of the service ------------------------------------------------------------------


async def test_idempotency_conflict_is_422_and_changes_nothing(front: FrontDoor) -> None:
    async with front.client() as client:
        await client.post("/agents", json={**WORKER, "idempotencyKey": "k"})
        before = front.store.state.last_seq
        response = await client.post("/agents", json={**WORKER, "name": "x", "idempotencyKey": "k"})
    error = error_of(response, 422, "idempotency_conflict")
    assert error["details"]["key"] == "k"
    assert front.store.state.last_seq == before


async def test_unknown_agent_is_404_everywhere(front: FrontDoor) -> None:
    before = front.store.state.last_seq
    async with front.client() as client:
        answers = [
            await client.get("/agents/a_00000000"),
            await client.post("/agents/a_00000000/prompt", json={"text": "x"}),
            await client.post("/agents/a_00000000/stop"),
            await client.get("/agents/a_00000000/inbox"),
            await client.get("/events", params={"agent": "a_00000000", "format": "json"}),
            await client.get("/events", params={"agent": "a_00000000"}),
        ]
    for response in answers:
        error = error_of(response, 404, "agent_not_found")
        assert error["details"]["agent_id"] == "a_00000000"
        assert "a_00000000" in error["message"]
    assert front.store.state.last_seq == before


async def test_prompting_a_stopped_agent_is_409_not_live(front: FrontDoor) -> None:
    agent_id = await front.spawn(name="w")
    await front.service.stop(agent_id)
    before = front.store.state.last_seq
    async with front.client() as client:
        prompted = await client.post(f"/agents/{agent_id}/prompt", json={"text": "x"})
        stopped = await client.post(f"/agents/{agent_id}/stop")
    for response in (prompted, stopped):
        error = error_of(response, 409, "agent_not_live")
        assert error["details"]["state"] == "stopped"
        assert "stopped" in error["message"]
    assert front.store.state.last_seq == before


async def test_prompting_a_busy_agent_is_409_and_retryable(front: FrontDoor) -> None:
    front.harness.script("w", "hang")
    agent_id = await front.spawn(name="w", prompt="go")
    await settle(lambda: agent_id in front.harness.running)
    before = front.store.state.last_seq
    async with front.client() as client:
        response = await client.post(f"/agents/{agent_id}/prompt", json={"text": "again"})
    error = error_of(response, 409, "agent_busy")
    assert error["retryable"] is True
    assert front.store.state.last_seq == before
    front.harness.release("w")
    await front.settled(agent_id, "idle")


async def test_nothing_to_send_is_400(front: FrontDoor) -> None:
    agent_id = await front.spawn(name="w")
    async with front.client() as client:
        response = await client.post(f"/agents/{agent_id}/prompt", json={})
    error_of(response, 400, "nothing_to_send")
    assert front.state(agent_id) == "idle"


async def test_spawn_beyond_the_runs_headcount_is_409_retryable(front: FrontDoor) -> None:
    root = await front.spawn(name="lead", spawnBudget={"maxAgents": 1})
    before = front.store.state.last_seq
    async with front.client() as client:
        response = await client.post("/agents", json={**WORKER, "parent": root})
    error = error_of(response, 409, "spawn_budget_exceeded")
    assert error["retryable"] is True
    assert error["details"]["max_agents"] == 1
    assert front.store.state.last_seq == before


# --- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b'{"name": "", "harness": "nope", "bogus": 1}', {"name", "harness", "bogus"}),
        (b'{"name": "w", "harness": "command"}', {"command"}),
        (b'{"name": "w", "harness": "command", "command": "ls"}', {"command"}),
        (
            b'{"name": "w", "harness": "command", "command": ["x"], "maxRetries": -1}',
            {"maxRetries"},
        ),
        (
            b'{"name": "w", "harness": "command", "command": ["x"], "idempotencyKey": 5}',
            {"idempotencyKey"},
        ),
        (
            b'{"harness": "command", "command": ["x"], "idempotencyKey": ""}',
            {
                "name",
                "idempotencyKey",
            },
        ),
        (b"[1, 2]", {"(body)"}),
        (b'"a string"', {"(body)"}),
        (b"{bad json", {"(body)"}),
        (b'{"name": "w", "harness": "command", "command": ["x"], "turnTimeoutS": NaN}', {"(body)"}),
        (b"\xff\xfe\x00garbage", {"(body)"}),
        (b"[" * 100_000, {"(body)"}),
        (b"", {"(body)"}),
        (b'{"name": "w", "harness": "command", "command": ["a\\u0000b"]}', {"command"}),
        (
            b'{"name": "w", "harness": "command", "command": ["x"], "env": {"A=B": "1"}}',
            {"env.A=B"},
        ),
    ],
)
async def test_invalid_spawn_bodies_are_400_invalid_spec_listing_every_problem(
    front: FrontDoor, content: bytes, expected: set[str]
) -> None:
    before = front.store.state.last_seq
    async with front.client() as client:
        response = await client.post(
            "/agents", content=content, headers={"content-type": "application/json"}
        )
    error = error_of(response, 400, "invalid_spec")
    assert fields(error) == expected
    assert f"{len(expected)} problem(s)" in error["message"]
    assert front.store.state.last_seq == before
    assert front.service.list_agents() == []


async def test_malformed_json_problem_says_what_is_wrong(front: FrontDoor) -> None:
    async with front.client() as client:
        response = await client.post(
            "/agents", content=b'{"name": NaN}', headers={"content-type": "application/json"}
        )
    error = error_of(response, 400, "invalid_spec")
    assert "malformed JSON: NaN is not valid JSON" in error["message"]


async def test_unknown_parent_is_400_and_nothing_is_created(front: FrontDoor) -> None:
    async with front.client() as client:
        response = await client.post("/agents", json={**WORKER, "parent": "a_00000000"})
    error = error_of(response, 400, "invalid_spec")
    assert fields(error) == {"parent"}
    assert front.service.list_agents() == []
    assert front.store.state.last_seq == 0


@pytest.mark.parametrize("command", ["prompt", "stop"])
@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"{bad", {"(body)"}),
        (b"[]", {"(body)"}),
        (b"7", {"(body)"}),
        (b'{"by": 5, "why": ["x"]}', {"by", "why"}),
        (b'{"nope": 1}', {"nope"}),
        (b'{"idempotency_key": "k"}', {"idempotency_key"}),
        (b'{"idempotencyKey": ""}', {"idempotencyKey"}),
        (b'{"idempotencyKey": 12}', {"idempotencyKey"}),
        (b"[" * 100_000, {"(body)"}),
    ],
)
async def test_invalid_command_bodies_are_400_invalid_request(
    front: FrontDoor, command: str, content: bytes, expected: set[str]
) -> None:
    agent_id = await front.spawn(name="w", prompt="first")
    await front.settled(agent_id, "idle")
    before = front.store.state.last_seq
    async with front.client() as client:
        response = await client.post(
            f"/agents/{agent_id}/{command}",
            content=content,
            headers={"content-type": "application/json"},
        )
    error = error_of(response, 400, "invalid_request")
    assert fields(error) == expected
    assert f"invalid {command} body" in error["message"]
    assert front.store.state.last_seq == before
    assert front.state(agent_id) == "idle"


async def test_prompt_text_of_the_wrong_type_is_400(front: FrontDoor) -> None:
    agent_id = await front.spawn(name="w")
    async with front.client() as client:
        response = await client.post(f"/agents/{agent_id}/prompt", json={"text": 42})
    error = error_of(response, 400, "invalid_request")
    assert fields(error) == {"text"}
    assert front.harness.requests == []


async def test_a_body_not_declared_json_is_415(front: FrontDoor) -> None:
    async with front.client() as client:
        response = await client.post(
            "/agents", content=b'{"name": "w"}', headers={"content-type": "text/plain"}
        )
        form = await client.post("/agents", data={"name": "w"})
    error = error_of(response, 415, "unsupported_media_type")
    assert "text/plain" in error["message"]
    error_of(form, 415, "unsupported_media_type")
    assert front.store.state.last_seq == 0


async def test_json_with_a_suffix_media_type_is_accepted(front: FrontDoor) -> None:
    async with front.client() as client:
        response = await client.post(
            "/agents",
            json=WORKER,
            headers={"content-type": "application/merge-patch+json; charset=utf-8"},
        )
    assert response.status_code == 201


async def test_a_body_over_the_limit_by_its_length_is_413(front: FrontDoor) -> None:
    app = create_app(front.service, max_body_bytes=100)
    async with front.client(app) as client:
        response = await client.post("/agents", json={**WORKER, "prompt": "x" * 200})
    error = error_of(response, 413, "body_too_large")
    assert error["details"]["limit"] == 100
    assert error["details"]["seen"] > 200
    assert "the limit is 100 bytes" in error["message"]
    assert front.store.state.last_seq == 0


async def test_a_streamed_body_over_the_limit_is_413(front: FrontDoor) -> None:
    agent_id = await front.spawn(name="w")
    before = front.store.state.last_seq

    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"text": "'
        for _ in range(10):
            yield b"x" * 50
        yield b'"}'

    app = create_app(front.service, max_body_bytes=100)
    async with front.client(app) as client:
        response = await client.post(
            f"/agents/{agent_id}/prompt",
            content=chunks(),
            headers={"content-type": "application/json"},
        )
    assert "content-length" not in response.request.headers
    error = error_of(response, 413, "body_too_large")
    assert error["details"]["limit"] == 100
    assert "sent at least" in error["message"]
    assert front.store.state.last_seq == before
    assert front.harness.requests == []


async def test_a_body_at_the_limit_is_accepted(front: FrontDoor) -> None:
    agent_id = await front.spawn(name="w")
    content = b'{"text": "' + b"x" * 80 + b'"}'
    app = create_app(front.service, max_body_bytes=len(content))
    async with front.client(app) as client:
        response = await client.post(
            f"/agents/{agent_id}/prompt",
            content=content,
            headers={"content-type": "application/json"},
        )
    assert response.status_code == 202


async def test_a_content_length_that_is_not_a_number_is_400(front: FrontDoor) -> None:
    app = create_app(front.service)
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/agents",
        "raw_path": b"/agents",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"127.0.0.1"), (b"content-length", b"lots")],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 4600),
    }
    await app(scope, receive, send)
    assert sent[0]["status"] == 400
    assert b"invalid_request" in sent[1]["body"]
    assert b"Content-Length" in sent[1]["body"]


@pytest.mark.parametrize(
    ("params", "headers", "field"),
    [
        ({"after": "x"}, {}, "after"),
        ({"after": "-1"}, {}, "after"),
        ({"limit": "0"}, {}, "limit"),
        ({"format": "xml"}, {}, "format"),
        ({"agent": ""}, {}, "agent"),
        ({}, {"last-event-id": "abc"}, "Last-Event-ID"),
        ({}, {"last-event-id": "-3"}, "Last-Event-ID"),
        ({"after": "99"}, {}, "after"),
        ({}, {"last-event-id": "99"}, "Last-Event-ID"),
        ({}, {"last-event-id": "9" * 5000}, "Last-Event-ID"),
        ({}, {"last-event-id": "1" * 21}, "Last-Event-ID"),
    ],
)
async def test_bad_event_queries_are_400(
    front: FrontDoor, params: dict[str, str], headers: dict[str, str], field: str
) -> None:
    await front.spawn(name="w")
    async with front.client() as client:
        response = await client.get("/events", params={"format": "json", **params}, headers=headers)
    error = error_of(response, 400, "invalid_request")
    assert fields(error) == {field}


async def test_a_cursor_too_long_to_be_a_seq_is_400_on_the_stream_too(front: FrontDoor) -> None:
    await front.spawn(name="w")
    async with front.client() as client:
        response = await client.get("/events", headers={"last-event-id": "7" * 5000})
    error = error_of(response, 400, "invalid_request")
    assert "at most 20 digits" in error["message"]
    assert "(5000 characters)" in error["message"]
    assert len(error["message"]) < 300


async def test_commands_while_the_daemon_shuts_down_are_503_and_retryable(front: FrontDoor) -> None:
    agent_id = await front.spawn(name="w")
    await front.service.close()
    before = front.store.state.last_seq
    async with front.client() as client:
        answers = [
            await client.post("/agents", json=WORKER),
            await client.post(f"/agents/{agent_id}/prompt", json={"text": "x"}),
            await client.post(f"/agents/{agent_id}/stop"),
        ]
        listed = await client.get("/agents")
    for response in answers:
        error = error_of(response, 503, "shutting_down")
        assert error["retryable"] is True
    assert listed.status_code == 200
    assert front.store.state.last_seq == before


async def test_a_cursor_beyond_the_log_names_the_last_seq(front: FrontDoor) -> None:
    await front.spawn(name="w")
    async with front.client() as client:
        response = await client.get("/events", params={"after": 99})
    error = error_of(response, 400, "invalid_request")
    assert "99 is beyond the last event (1)" in error["message"]


async def test_bad_decision_query_is_400(front: FrontDoor) -> None:
    async with front.client() as client:
        response = await client.get("/decisions", params={"resolved": "perhaps"})
    error = error_of(response, 400, "invalid_request")
    assert fields(error) == {"resolved"}


async def test_unknown_route_and_method_are_json_404_and_405(front: FrontDoor) -> None:
    async with front.client() as client:
        missing = await client.get("/nowhere")
        wrong = await client.delete("/agents")
    error = error_of(missing, 404, "not_found")
    assert error["message"] == "no route for GET /nowhere"
    error = error_of(wrong, 405, "method_not_allowed")
    assert "DELETE" in error["message"]
    assert wrong.headers["allow"] == "GET, POST"


async def test_an_unexpected_exception_is_a_bare_500_and_is_logged(
    front: FrontDoor, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(**query: Any) -> dict[str, Any]:
        raise RuntimeError("secret internals at /srv/x")

    monkeypatch.setattr(front.service, "list_page", broken)
    with caplog.at_level(logging.ERROR, logger="corral.daemon.http"):
        async with front.client() as client:
            response = await client.get("/agents")
    error = error_of(response, 500, "internal_error")
    assert "secret" not in response.text
    assert "Traceback" not in response.text
    assert error["details"] == {}
    (record,) = [r for r in caplog.records if r.name == "corral.daemon.http"]
    assert record.exc_info is not None
    assert "GET /agents" in record.getMessage()


# --- auth and origins ----------------------------------------------------------------------------


async def test_with_a_token_every_request_but_healthz_needs_it(front: FrontDoor) -> None:
    app = create_app(front.service, token=DAEMON_TOKEN)
    async with front.client(app) as anonymous:
        health = await anonymous.get("/healthz")
        listing = await anonymous.get("/agents")
        spawn = await anonymous.post("/agents", json=WORKER)
        missing = await anonymous.get("/nowhere")
        openapi = await anonymous.get("/openapi.json")
    assert health.status_code == 200
    for response in (listing, spawn, missing, openapi):
        error = error_of(response, 401, "unauthorized")
        assert "bearer token" in error["message"]
        assert response.headers["www-authenticate"] == "Bearer"
    assert front.store.state.last_seq == 0


@pytest.mark.parametrize(
    "authorization",
    [
        f"Bearer {DAEMON_TOKEN}x",
        "Bearer",
        f"Basic {DAEMON_TOKEN}",
        DAEMON_TOKEN,
        f"Bearer {DAEMON_TOKEN[:-1]}",
    ],
)
async def test_a_wrong_token_is_401(front: FrontDoor, authorization: str) -> None:
    app = create_app(front.service, token=DAEMON_TOKEN)
    async with front.client(app, authorization=authorization) as client:
        response = await client.post("/agents", json=WORKER)
    error_of(response, 401, "unauthorized")
    assert front.store.state.last_seq == 0


async def test_the_right_token_is_let_through(front: FrontDoor) -> None:
    app = create_app(front.service, token=DAEMON_TOKEN)
    async with front.client(app, authorization=f"bearer {DAEMON_TOKEN}") as client:
        spawned = await client.post("/agents", json=WORKER)
        listed = await client.get("/agents")
    assert spawned.status_code == 201
    assert len(listed.json()["agents"]) == 1


async def test_without_a_token_no_authorization_is_needed(front: FrontDoor) -> None:
    async with front.client(authorization="Bearer whatever") as client:
        response = await client.get("/agents")
    assert response.status_code == 200


@pytest.mark.parametrize(
    ("origin", "host", "token", "allowed"),
    [
        ("http://127.0.0.1:4600", "127.0.0.1:4600", None, True),
        ("http://localhost:3000", "127.0.0.1:4600", None, True),
        ("http://[::1]:4600", "[::1]:4600", None, True),
        ("https://evil.example", "127.0.0.1:4600", None, False),
        ("null", "127.0.0.1:4600", None, False),
        # a DNS name rebound to 127.0.0.1: the page and the Host agree, but it is not loopback
        ("http://rebound.example:4600", "rebound.example:4600", None, False),
        ("http://daemon.lan:4600", "daemon.lan:4600", DAEMON_TOKEN, True),
        ("http://evil.example", "daemon.lan:4600", DAEMON_TOKEN, False),
    ],
)
async def test_browser_origins_other_than_loopback_are_refused(
    front: FrontDoor, origin: str, host: str, token: str | None, allowed: bool
) -> None:
    app = create_app(front.service, token=token)
    headers = {"origin": origin, "host": host}
    if token:
        headers["authorization"] = f"Bearer {token}"
    async with front.client(app, **headers) as client:
        response = await client.post("/agents", json=WORKER)
    if allowed:
        assert response.status_code == 201
    else:
        error = error_of(response, 403, "forbidden_origin")
        assert origin in error["message"]
        assert front.store.state.last_seq == 0


# --- OpenAPI and arguments -----------------------------------------------------------------------


async def test_openapi_lists_the_paths_and_describes_the_bodies(front: FrontDoor) -> None:
    async with front.client() as client:
        doc = (await client.get("/openapi.json")).json()
    assert set(doc["paths"]) == {
        "/healthz",
        "/agents",
        "/agents/{agent_id}",
        "/agents/{agent_id}/prompt",
        "/agents/{agent_id}/stop",
        "/agents/{agent_id}/restart",
        "/agents/{agent_id}/inbox",
        "/agents/{agent_id}/session",
        "/agents/{agent_id}/turns",
        "/agents/{agent_id}/turns/{n}",
        "/agents/{agent_id}/turns/{n}/end",
        "/agents/{agent_id}/logs",
        "/agents/{agent_id}/actions",
        "/runs/{run_id}",
        "/runs/{run_id}/stop",
        "/actions/{decision_id}",
        "/decisions",
        "/decisions/{decision_id}",
        "/events",
        "/tokens",
        "/tokens/{name}",
        "/gateway",
        "/gateway/query",
        "/gateway/{target}/schema",
        "/gateway/{target}/agents/{agent_id}",
        "/gateway/{target}/agents/{agent_id}/history",
        "/gateway/{target}/agents/{agent_id}/freeze",
        "/gateway/{target}/agents/{agent_id}/reinstate",
        "/metrics",
        "/nodes",
    }
    schemas = doc["components"]["schemas"]
    query = doc["paths"]["/gateway/query"]["post"]
    query_ref = query["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    assert {"target", "agent", "sql", "params", "op", "idempotencyKey"} <= set(
        schemas[query_ref.rsplit("/", 1)[1]]["properties"]
    )
    assert {"200", "400", "404", "408", "409", "422", "423", "429"} <= set(query["responses"])
    listed = doc["paths"]["/gateway"]["get"]["responses"]["200"]["content"]["application/json"]
    target_ref = schemas[listed["schema"]["$ref"].rsplit("/", 1)[1]]["properties"]["targets"]
    target = schemas[target_ref["items"]["$ref"].rsplit("/", 1)[1]]
    assert set(target["properties"]) == {"name", "dialect", "tables", "frozenAgents", "limits"}
    limits_ref = next(s["$ref"] for s in target["properties"]["limits"]["anyOf"] if "$ref" in s)
    assert set(schemas[limits_ref.rsplit("/", 1)[1]]["properties"]) == {
        "maxRows",
        "maxBytes",
        "maxStatementChars",
        "statementTimeoutS",
        "agentRole",
    }
    spawn = doc["paths"]["/agents"]["post"]
    ref = spawn["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    spawn_body = schemas[ref.rsplit("/", 1)[1]]
    assert {"name", "harness", "onFailure", "maxRetries", "idempotencyKey"} <= set(
        spawn_body["properties"]
    )
    assert set(spawn_body["required"]) == {"name", "harness"}
    assert spawn_body["additionalProperties"] is False
    budget_ref = spawn_body["properties"]["budget"]["$ref"]
    assert budget_ref.rsplit("/", 1)[1] in schemas
    prompt = doc["paths"]["/agents/{agent_id}/prompt"]["post"]
    prompt_ref = prompt["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    prompt_body = schemas[prompt_ref.rsplit("/", 1)[1]]
    assert set(prompt_body["properties"]) == {"text", "by", "why", "idempotencyKey"}
    assert prompt_body["additionalProperties"] is False
    assert prompt["requestBody"]["required"] is False
    assert {"202", "400", "404", "409", "413", "422"} <= set(prompt["responses"])
    assert "HTTPValidationError" not in schemas
    assert "422" not in doc["paths"]["/decisions"]["get"]["responses"]
    assert "securitySchemes" not in doc["components"]


async def test_openapi_declares_the_bearer_scheme_with_a_token(front: FrontDoor) -> None:
    app = create_app(front.service, token=DAEMON_TOKEN)
    async with front.client(app, authorization=f"Bearer {DAEMON_TOKEN}") as client:
        doc = (await client.get("/openapi.json")).json()
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert doc["security"] == [{"bearer": []}]


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"token": ""}, "token"),
        ({"token": 5}, "token"),
        ({"token": "has space"}, "token"),
        ({"max_body_bytes": 0}, "max_body_bytes"),
        ({"max_body_bytes": True}, "max_body_bytes"),
        ({"max_body_bytes": 1.5}, "max_body_bytes"),
        ({"heartbeat_s": 0}, "heartbeat_s"),
        ({"heartbeat_s": float("nan")}, "heartbeat_s"),
    ],
)
async def test_create_app_refuses_bad_arguments(
    front: FrontDoor, kwargs: dict[str, Any], argument: str
) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        create_app(front.service, **kwargs)
    assert caught.value.argument == argument
    assert caught.value.where == "create_app"


async def test_create_app_needs_a_service() -> None:
    with pytest.raises(InvalidArgumentError, match="service must be an AgentService"):
        create_app(object())  # type: ignore[arg-type]


async def test_a_refused_token_is_not_echoed(front: FrontDoor) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        create_app(front.service, token="top secret")
    assert "top secret" not in str(caught.value)


# --- agent tokens ----------------------------------------------------------------------------


async def test_each_agent_is_given_a_token_of_its_own_not_the_daemons(
    scoped_front: FrontDoor,
) -> None:
    agent_id = await scoped_front.spawn(name="w", prompt="go")
    await scoped_front.settled(agent_id, "idle")
    (request,) = scoped_front.harness.requests
    given = request.env["CORRAL_TOKEN"]
    assert given == scoped_front.agent_token(agent_id)
    assert given.startswith(f"corral-agent.{agent_id}.")
    assert DAEMON_TOKEN not in given
    assert request.env["CORRAL_URL"] == "http://127.0.0.1:4600"


async def test_without_a_daemon_token_agents_get_none(front: FrontDoor) -> None:
    agent_id = await front.spawn(name="w", prompt="go")
    await front.settled(agent_id, "idle")
    (request,) = front.harness.requests
    assert "CORRAL_TOKEN" not in request.env


async def test_an_agent_token_reaches_the_agent_and_its_descendants_only(
    scoped_front: FrontDoor,
) -> None:
    lead = await scoped_front.spawn(name="lead")
    child = await scoped_front.spawn(name="child", parent=lead)
    grandchild = await scoped_front.spawn(name="grandchild", parent=child)
    other = await scoped_front.spawn(name="other")
    async with scoped_front.agent_client(lead) as client:
        listed = (await client.get("/agents")).json()["agents"]
        assert {a["id"] for a in listed} == {lead, child, grandchild}
        assert (await client.get(f"/agents/{grandchild}")).status_code == 200
        assert (await client.get(f"/agents/{child}/inbox")).status_code == 200
        prompted = await client.post(f"/agents/{child}/prompt", json={"text": "go"})
        assert prompted.status_code == 202
        await scoped_front.settled(child, "idle")
        assert (await client.post(f"/agents/{grandchild}/stop")).status_code == 202
    assert scoped_front.state(grandchild) == "stopped"

    before = scoped_front.store.state.last_seq
    async with scoped_front.agent_client(child) as client:
        refused = [
            await client.get(f"/agents/{lead}"),
            await client.get(f"/agents/{other}"),
            await client.get(f"/agents/{other}/inbox"),
            await client.get("/agents/a_00000000"),
            await client.post(f"/agents/{lead}/prompt", json={"text": "x"}),
            await client.post(f"/agents/{other}/stop"),
            await client.post("/agents", json={**WORKER, "parent": lead}),
            await client.get("/events", params={"agent": lead, "format": "json"}),
        ]
        for response in refused:
            error = error_of(response, 403, "out_of_scope")
            assert error["details"]["principal"] == child
            assert f"the token of agent '{child}'" in error["message"]
        root = error_of(await client.post("/agents", json=WORKER), 403, "out_of_scope")
        assert "a new root agent" in root["message"]
        log = error_of(await client.get("/events"), 403, "out_of_scope")
        assert "?agent=" in log["message"]
        assert scoped_front.store.state.last_seq == before

        spawned = await client.post("/agents", json={**WORKER, "name": "helper", "parent": child})
        assert spawned.status_code == 201
        own = (await client.get("/events", params={"agent": child, "format": "json"})).json()
        assert {e["agentId"] for e in own["events"]} == {child}
    assert scoped_front.service.get(spawned.json()["id"])["parent"] == child


async def test_an_agent_token_sees_only_its_own_decisions(scoped_front: FrontDoor) -> None:
    scoped_front.harness.script("w", fail("no key"))
    scoped_front.harness.script("v", fail("no key"))
    lead = await scoped_front.spawn(name="lead", mayAnswer=["blocked"])
    mine = await scoped_front.spawn(name="w", prompt="go", parent=lead, onFailure="ask")
    theirs = await scoped_front.spawn(name="v", prompt="go", onFailure="ask")
    await scoped_front.settled(mine, "blocked")
    await scoped_front.settled(theirs, "blocked")
    async with scoped_front.agent_client(lead) as client:
        # An agent's token acts in its own name: by, when given, is its id.
        await client.post(f"/agents/{mine}/prompt", json={"text": "again", "by": lead})
        await scoped_front.settled(mine, "idle")
        pending = (await client.get("/decisions")).json()
        answer = (await client.get("/decisions", params={"resolved": "true"})).json()
    assert pending["decisions"] == []
    assert [r["agentId"] for r in answer["decisions"]] == [mine]
    assert [d["agentId"] for d in scoped_front.service.decisions()] == [theirs]


@pytest.mark.parametrize(
    "token",
    [
        "corral-agent.a_00000000.0000",
        "corral-agent.",
        "corral-agent..x",
        "corral-agent.{id}",
        "{other_daemon}",
        "{id_swapped}",
    ],
)
async def test_forged_agent_tokens_are_401(scoped_front: FrontDoor, token: str) -> None:
    agent_id = await scoped_front.spawn(name="w")
    other_id = await scoped_front.spawn(name="v")
    token = token.format(
        id=agent_id,
        other_daemon=agent_token("another-daemon-token", agent_id),
        id_swapped=scoped_front.agent_token(other_id).replace(other_id, agent_id),
    )
    app = create_app(scoped_front.service, token=DAEMON_TOKEN)
    async with scoped_front.client(app, authorization=f"Bearer {token}") as client:
        response = await client.get(f"/agents/{agent_id}")
    error_of(response, 401, "unauthorized")


def test_every_gateway_code_answers_with_its_status() -> None:
    from corral.gateway import GatewayError
    from corral.gateway._errors import CODES

    statuses = {
        400: "parse_error multiple_statements forbidden_statement forbidden_function "
        "unknown_table unknown_column invalid_operation idempotency_key_required "
        "read_only_violation invalid_data statement_too_complex",
        408: "statement_timeout",
        409: "idempotency_in_progress outcome_unknown constraint_violation transaction_conflict",
        422: "idempotency_conflict result_too_large",
        423: "agent_frozen",
        429: "pool_exhausted analysis_busy",
        500: "database_error analysis_error",
        503: "database_unavailable",
    }
    expected = {code: status for status, codes in statuses.items() for code in codes.split()}
    assert set(expected) == set(CODES)
    for code, status in expected.items():
        assert http_status(GatewayError(code, "x")) == status, code


def test_statuses_of_the_daemons_errors_and_other_errors() -> None:
    assert http_status(AgentNotFoundError("a_1")) == 404
    assert http_status(ServiceClosedError("spawn")) == 503
    assert http_status(InvalidArgumentError("f", "x", "y", 1)) == 400
    # A kernel error that shares a code with one of the daemon's keeps its family's status.
    assert http_status(BudgetExhaustedError("tokens", 1, 2)) == 500
    assert http_status(RemoteError("teapot", "short", status=418)) == 418


@pytest.mark.parametrize(
    "outcome",
    [
        TurnFailedError("x", usage={"tokens": 1, "costUsd": float("nan")}),
        TurnFailedError("x", usage={"tokens": -(10**9), "costUsd": -100.0}),
        TurnFailedError("x", usage={"tokens": "abc"}),
        TurnResult(output="ok", tokens=10**5000),
        TurnResult(output="ok", tokens=1, cost_usd=float("inf")),
    ],
)
async def test_a_usage_that_cannot_be_counted_fails_the_turn_and_poisons_nothing(
    front: FrontDoor, outcome: object
) -> None:
    # An agent reports its own usage. NaN made every read of the record a 500, a negative
    # count refused every later prompt, and a bad type or a 5,000-digit count left the agent
    # running forever: none of it is counted now, and the turn says why.
    front.harness.script("w", outcome)
    agent_id = await front.spawn(name="w", prompt="go", onFailure="ask")
    await front.settled(agent_id, "blocked")
    record = front.service.get(agent_id)
    assert record["usage"]["tokens"] == 0
    assert "cannot be counted" in record["error"] or "was not counted" in record["error"]
    async with front.client() as client:
        assert (await client.get("/agents")).status_code == 200
        assert (await client.get(f"/agents/{agent_id}")).status_code == 200
        again = await client.post(f"/agents/{agent_id}/prompt", json={"text": "again"})
        assert again.status_code == 202


async def test_an_agent_token_acts_in_its_own_name_only(scoped_front: FrontDoor) -> None:
    # A held agent never answers its own decision; its lead, allowed to, answers in its own
    # name, never a person's.
    scoped_front.harness.script("w", fail("held"))
    lead = await scoped_front.spawn(name="lead", mayAnswer=["blocked"])
    agent_id = await scoped_front.spawn(name="w", prompt="go", onFailure="ask", parent=lead)
    await scoped_front.settled(agent_id, "blocked")
    async with scoped_front.agent_client(agent_id) as client:
        own = await client.post(f"/agents/{agent_id}/prompt", json={"text": "again"})
        assert own.status_code == 403
        assert "its own decision" in own.json()["error"]["message"]
        stop = await client.post(f"/agents/{agent_id}/stop", json={})
        assert stop.status_code == 403
    async with scoped_front.agent_client(lead) as client:
        forged = await client.post(
            f"/agents/{agent_id}/prompt", json={"text": "again", "by": "alice", "why": "ok"}
        )
        assert forged.status_code == 403
        assert forged.json()["error"]["code"] == "out_of_scope"
        answered = await client.post(f"/agents/{agent_id}/prompt", json={"text": "again"})
        assert answered.status_code == 202
    (resolution,) = scoped_front.service.resolutions()
    assert resolution["by"] == lead
