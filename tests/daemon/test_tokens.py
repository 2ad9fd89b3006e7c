"""Who is calling: the gate names every caller by its token (the daemon's, a person's named
operator token, an agent's), and named tokens are made, listed and revoked over HTTP with only
their digest kept."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from corral.daemon import (
    AgentApi,
    Caller,
    LocalApi,
    SQLiteStore,
    TokenExistsError,
    TokenNotFoundError,
    mcp_asgi_app,
    replay,
)
from corral.daemon._api import ScopedService
from corral.daemon._auth import CALLER_SCOPE_KEY, OPERATOR
from corral.kernel import InvalidArgumentError
from tests.support.front_door import DAEMON_TOKEN, FrontDoor, serving

SPEC: dict[str, Any] = {"name": "w", "harness": "command", "command": ["true"]}


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def error_of(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == code, error
    return error


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> list[ScopedService]:
    """Every ScopedService the routes serve a request with (``api_of``), in order."""
    made: list[ScopedService] = []
    original = ScopedService.as_caller

    def spy(self: ScopedService, caller: Caller | None) -> ScopedService:
        scoped = original(self, caller)
        made.append(scoped)
        return scoped

    monkeypatch.setattr(ScopedService, "as_caller", spy)
    return made


async def make(client: httpx.AsyncClient, name: str) -> str:
    made = await client.post("/tokens", json={"name": name})
    assert made.status_code == 201, made.text
    assert made.headers["cache-control"] == "no-store"
    body = made.json()
    assert set(body) == {"name", "token", "createdAt", "by"}
    assert body["name"] == name
    token = str(body["token"])
    assert token.startswith(f"corral-op.{name}.")
    assert len(token) >= len(f"corral-op.{name}.") + 43  # 32 random bytes, URL-safe
    return token


# --- the gate names the caller ---------------------------------------------------------------


async def test_each_token_is_served_in_its_own_name(
    scoped_front: FrontDoor, seen: list[ScopedService]
) -> None:
    agent = await scoped_front.spawn(name="w")
    async with scoped_front.client(scoped_front.app(), **bearer(DAEMON_TOKEN)) as operator:
        alice = await make(operator, "alice")
    for token, name, principal in [
        (DAEMON_TOKEN, OPERATOR, None),
        (alice, "alice", None),
        (scoped_front.agent_token(agent), agent, agent),
    ]:
        seen.clear()
        async with scoped_front.client(scoped_front.app(), **bearer(token)) as client:
            assert (await client.get("/agents")).status_code == 200
        assert [(s.caller_name, s.principal) for s in seen] == [(name, principal)]


async def test_without_a_token_the_app_trusts_its_in_process_caller(
    front: FrontDoor, seen: list[ScopedService]
) -> None:
    async with front.client() as client:
        assert (await client.get("/agents")).status_code == 200
    assert [(s.caller_name, s.principal) for s in seen] == [(None, None)]


def smuggling(app: ASGIApp, caller: object) -> ASGIApp:
    """``app`` behind something that puts ``caller`` in every request's scope, as a client
    (or a careless proxy in front) might."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope = {**scope, CALLER_SCOPE_KEY: caller}
        await app(scope, receive, send)

    return wrapped


async def test_only_the_gate_says_who_is_calling(
    scoped_front: FrontDoor, seen: list[ScopedService]
) -> None:
    agent = await scoped_front.spawn(name="w")
    forged = Caller("mallory")
    app = smuggling(scoped_front.app(), forged)
    async with scoped_front.client(app) as anonymous:
        error_of(await anonymous.get("/agents"), 401, "unauthorized")
    async with scoped_front.client(app, **bearer(scoped_front.agent_token(agent))) as client:
        assert (await client.get("/agents")).status_code == 200
    assert [(s.caller_name, s.principal) for s in seen] == [(agent, agent)]
    seen.clear()
    # Without a token nothing is asked, but a smuggled caller is dropped all the same.
    async with scoped_front.client(smuggling(scoped_front.app(token=None), forged)) as client:
        assert (await client.get("/agents")).status_code == 200
    assert [(s.caller_name, s.principal) for s in seen] == [(None, None)]


# --- named tokens over HTTP ------------------------------------------------------------------


async def test_make_list_use_and_revoke_a_named_token(scoped_front: FrontDoor) -> None:
    app = scoped_front.app()
    async with scoped_front.client(app, **bearer(DAEMON_TOKEN)) as operator:
        alice = await make(operator, "alice")
        async with scoped_front.client(app, **bearer(alice)) as as_alice:
            bob = await make(as_alice, "bob.smith@example-1")
            assert (await as_alice.get("/agents")).status_code == 200
        listed = (await operator.get("/tokens")).json()["tokens"]
        assert [(t["name"], t["by"]) for t in listed] == [
            ("alice", OPERATOR),
            ("bob.smith@example-1", "alice"),
        ]
        assert all(set(t) == {"name", "createdAt", "by"} for t in listed)
        assert alice not in json.dumps(listed)

        revoked = await operator.delete("/tokens/alice")
        assert revoked.status_code == 200, revoked.text
        assert revoked.json()["revokedBy"] == OPERATOR
        # At once: the next request with it is refused; the others' are not.
        async with scoped_front.client(app, **bearer(alice)) as as_alice:
            error_of(await as_alice.get("/agents"), 401, "unauthorized")
        async with scoped_front.client(app, **bearer(bob)) as as_bob:
            assert (await as_bob.get("/agents")).status_code == 200
        names = [t["name"] for t in (await operator.get("/tokens")).json()["tokens"]]
        assert names == ["bob.smith@example-1"]
        error_of(await operator.delete("/tokens/alice"), 404, "token_not_found")
        # The name is free again; the new token is not the old one, which stays refused.
        alice_again = await make(operator, "alice")
        assert alice_again != alice
        async with scoped_front.client(app, **bearer(alice)) as as_alice:
            error_of(await as_alice.get("/agents"), 401, "unauthorized")
        async with scoped_front.client(app, **bearer(alice_again)) as as_alice:
            assert (await as_alice.get("/agents")).status_code == 200


async def test_a_live_name_or_the_daemons_own_is_refused(scoped_front: FrontDoor) -> None:
    async with scoped_front.client(scoped_front.app(), **bearer(DAEMON_TOKEN)) as operator:
        await make(operator, "alice")
        taken = error_of(
            await operator.post("/tokens", json={"name": "alice"}), 409, "token_exists"
        )
        assert "'alice' is live since" in taken["message"]
        folded = error_of(
            await operator.post("/tokens", json={"name": "ALICE"}), 409, "token_exists"
        )
        assert "differs from it only in case" in folded["message"]
        for reserved in ("operator", "Operator"):
            error = error_of(
                await operator.post("/tokens", json={"name": reserved}), 409, "token_exists"
            )
            assert "daemon's own token" in error["message"]
    assert [t["name"] for t in scoped_front.service.tokens()] == ["alice"]


@pytest.mark.parametrize(
    "name",
    ["", "9lives", "_x", "-x", "a b", "a/b", "a:b", "é", "a\u202eb", "a\x00", "a" * 65, "a\n"],
)
async def test_bad_names_are_refused(scoped_front: FrontDoor, name: str) -> None:
    async with scoped_front.client(scoped_front.app(), **bearer(DAEMON_TOKEN)) as operator:
        answer = await operator.post("/tokens", json={"name": name})
        error_of(answer, 400, "invalid_request")
        wrong_type = await operator.post("/tokens", json={"name": 7})
        error_of(wrong_type, 400, "invalid_request")
        error_of(await operator.post("/tokens", json={}), 400, "invalid_request")
    assert scoped_front.store.state.last_seq == 0


async def test_the_longest_name_is_taken(scoped_front: FrontDoor) -> None:
    async with scoped_front.client(scoped_front.app(), **bearer(DAEMON_TOKEN)) as operator:
        await make(operator, "a" + "b" * 63)


async def test_an_agent_token_is_refused_on_every_token_route(scoped_front: FrontDoor) -> None:
    agent = await scoped_front.spawn(name="w")
    await scoped_front.service.create_token("alice", by="test")
    async with scoped_front.agent_client(agent) as as_agent:
        for answer in (
            await as_agent.post("/tokens", json={"name": "sneaky"}),
            await as_agent.get("/tokens"),
            await as_agent.delete("/tokens/alice"),
        ):
            error_of(answer, 403, "out_of_scope")
    assert [t["name"] for t in scoped_front.service.tokens()] == ["alice"]


async def test_the_log_and_the_store_hold_digests_never_secrets(
    scoped_front: FrontDoor, tmp_path: Any
) -> None:
    async with scoped_front.client(scoped_front.app(), **bearer(DAEMON_TOKEN)) as operator:
        alice = await make(operator, "alice")
        assert (await operator.delete("/tokens/alice")).status_code == 200
        bob = await make(operator, "bob")
        page = (await operator.get("/events", params={"format": "json"})).json()["events"]
    assert [e["type"] for e in page] == ["token.created", "token.revoked", "token.created"]
    assert page[0]["data"] == {
        "name": "alice",
        "sha256": hashlib.sha256(alice.encode()).hexdigest(),
        "by": OPERATOR,
    }
    assert page[1]["data"] == {"name": "alice", "by": OPERATOR}
    everything = json.dumps(page) + json.dumps(scoped_front.store.state.snapshot())
    for secret in (alice, bob):
        assert secret not in everything
        assert secret.rsplit(".", 1)[1] not in everything
    # Nor anywhere in the database's files (its log and its projections, the WAL too).
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("scoped.db*"))
    assert hashlib.sha256(bob.encode()).hexdigest().encode() in raw
    for secret in (alice, bob):
        assert secret.rsplit(".", 1)[1].encode() not in raw


async def test_tokens_survive_a_restart_and_replay_to_the_same_state(
    scoped_front: FrontDoor, tmp_path: Any
) -> None:
    alice = (await scoped_front.service.create_token("alice", by="test"))["token"]
    await scoped_front.service.create_token("bob", by="test")
    await scoped_front.service.revoke_token("bob", by="test")
    with pytest.raises(TokenExistsError):
        await scoped_front.service.create_token("alice", by="test")
    with pytest.raises(TokenNotFoundError):
        await scoped_front.service.revoke_token("bob", by="test")
    store = scoped_front.store
    assert (await store.replay()).snapshot() == store.state.snapshot()
    assert replay(await store.read(0)).tokens == store.state.tokens
    reopened = SQLiteStore(tmp_path / "scoped.db")
    await reopened.open()
    try:
        assert reopened.state.tokens == store.state.tokens
        assert reopened.state.tokens["bob"]["revokedBy"] == "test"
        assert (
            reopened.state.tokens["alice"]["sha256"] == hashlib.sha256(alice.encode()).hexdigest()
        )
    finally:
        await reopened.close()


# --- MCP over HTTP ---------------------------------------------------------------------------


async def test_an_operator_is_served_over_mcp_in_its_tokens_name(scoped_front: FrontDoor) -> None:
    alice = (await scoped_front.service.create_token("alice", by="test"))["token"]
    agent = await scoped_front.spawn(name="w")
    callers: list[tuple[Caller, str | None]] = []

    def scoped(caller: Caller) -> AgentApi:
        api = scoped_front.api.as_caller(caller)
        callers.append((caller, api.caller_name))
        return api

    app = scoped_front.app()
    mcp = mcp_asgi_app(scoped_front.api, scoped=scoped)
    app.router.routes.append(Route("/mcp", endpoint=mcp.app))
    async with mcp.lifespan(), serving(app) as url:
        for token in (alice, DAEMON_TOKEN, scoped_front.agent_token(agent)):
            async with (
                httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as http,
                Client(streamable_http_client(url + "/mcp", http_client=http)) as client,
            ):
                listed = await client.call_tool("agent_list")
                assert not listed.is_error
    assert callers == [
        (Caller("alice"), "alice"),
        (Caller(OPERATOR), OPERATOR),
        (Caller(agent, agent), agent),
    ]


async def test_local_api_as_caller(scoped_front: FrontDoor) -> None:
    api = LocalApi(scoped_front.service)
    assert api.caller_name is None
    assert api.as_caller(None).caller_name is None
    assert api.as_caller(Caller("alice")).caller_name == "alice"
    assert api.as_agent("a_1").caller_name == "a_1"
    with pytest.raises(InvalidArgumentError) as caught:
        api.as_caller("alice")  # type: ignore[arg-type]
    assert caught.value.argument == "caller"
