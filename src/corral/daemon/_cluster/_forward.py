"""Commands go to the daemon that owns their agent: an ASGI layer in front of the routes.

Reads are answered by any daemon (each follows the whole log). A command about an agent
that another live daemon owns (prompt, stop, restart, patch, delete, answer a decision, an
external agent's turns, an action check, a run's stop, a breaker's freeze) is sent on to that
daemon with the caller's own token and answered with what it answered, idempotency keys
included; a new top-level agent goes to the least loaded daemon or the one ``?node=`` names,
a child to its parent's. A forwarded request is never forwarded again: a daemon that took it
but does not own the agent answers ``not_owner`` (retryable).
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import httpx
from starlette.datastructures import Headers, QueryParams
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from corral.daemon import _names
from corral.daemon._auth import CALLER_SCOPE_KEY, Caller
from corral.daemon._cluster._naming import FORWARDED_HEADER
from corral.daemon._cluster._node import Node, Owner
from corral.daemon._errors import OwnerUnreachableError
from corral.daemon._http._common import error_response
from corral.daemon._service import AgentService
from corral.kernel import CorralError

__all__ = ["Forwarding"]

logger = logging.getLogger("corral.daemon")

_SAFE = frozenset({"GET", "HEAD", "OPTIONS"})
_AGENT = re.compile(r"^/agents/(?P<ref>[^/]+)(?:/.*)?$")
_DECISION = re.compile(r"^/decisions/(?P<id>[^/]+)$")
_RUN = re.compile(r"^/runs/(?P<run>[^/]+)/stop$")
_BREAKER = re.compile(r"^/gateway/[^/]+/agents/(?P<ref>[^/]+)/(?:freeze|reinstate)$")
# Not sent on: they describe one connection, or the forwarder sets them again.
_HOP = frozenset(
    {"host", "connection", "keep-alive", "transfer-encoding", "content-length", "te", "upgrade"}
)
# Not copied from the owner's answer: httpx has decoded its body, and this daemon's server
# adds its own Date and Server (two Date headers would break the answer).
_ANSWER_OWN = frozenset({"content-encoding", "date", "server"})


class Forwarding:
    """Sends each command to its agent's owner (see the module docstring).

    Behind the daemon's gate: the token is checked and the body bounded before a request
    gets here. ``client`` is the HTTP client to the other daemons (made here when None).
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        node: Node,
        service: AgentService,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.app = app
        self.node = node
        self.service = service
        self.client = client or httpx.AsyncClient(
            timeout=httpx.Timeout(None, connect=2.0), follow_redirects=False
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, self._closing(send))
            return
        if scope["type"] != "http" or scope["method"] in _SAFE:
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        if FORWARDED_HEADER in headers:
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        agent: str | None = None  # a new agent's has no id yet
        if path == "/agents" and scope["method"] == "POST":
            body = await _read(receive)
            owner = await self._placement(scope, body)
        else:
            agent = self._agent_of(scope, path)
            if agent is None or self.node.owns(agent):
                await self.app(scope, receive, send)
                return
            found = await self.node.owner_of(agent)
            if found is None:
                await self.app(scope, receive, send)
                return
            owner = found
            body = await _read(receive)
        await self._send_on(scope, receive, send, headers, body, owner, agent)

    async def _send_on(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        headers: Headers,
        body: bytes,
        owner: Owner,
        agent: str | None,
    ) -> None:
        shown = agent or "(new)"
        for _ in range(2):  # the owner may change once while its lease runs out
            if owner.node == self.node.name:
                await self.app(scope, _replay(body, receive), send)
                return
            if not owner.live:
                break
            try:
                answer = await self._forward(scope, headers, body, owner)
            except httpx.ConnectError:
                found = None if agent is None else await self.node.owner_of(agent)
                if found is None or found == owner:
                    break
                owner = found
                continue
            except httpx.HTTPError as exc:
                # Sent, but the answer was lost: the command may have been applied.
                error = OwnerUnreachableError(shown, owner.node, str(exc) or "no answer", 1.0)
                await error_response(error)(scope, _replay(b""), send)
                return
            await self._answer(send, answer)
            return
        retry = self.node.adoption_within_s(owner)
        error = OwnerUnreachableError(shown, owner.node, "not live", retry)
        extra = {"Retry-After": str(max(1, round(retry)))}
        await error_response(error, extra)(scope, _replay(b""), send)

    async def _forward(
        self, scope: Scope, headers: Headers, body: bytes, owner: Owner
    ) -> httpx.Response:
        raw_path = scope.get("raw_path") or scope["path"].encode()
        url = owner.url.rstrip("/") + raw_path.decode("latin-1")
        query = scope.get("query_string", b"")
        if query:
            url += "?" + query.decode("latin-1")
        sent = {k: v for k, v in headers.items() if k.lower() not in _HOP}
        sent[FORWARDED_HEADER] = self.node.name
        answer = await self.client.request(scope["method"], url, content=body, headers=sent)
        # What the owner wrote is in this daemon's reads before the caller hears back.
        try:
            await self.service.store.refresh()
        except CorralError as exc:
            logger.warning("node %s: could not read the log: %s", self.node.name, exc)
        return answer

    @staticmethod
    async def _answer(send: Send, answer: httpx.Response) -> None:
        raw = [
            (k.encode("latin-1"), v.encode("latin-1"))
            for k, v in answer.headers.items()
            if k.lower() not in _HOP and k.lower() not in _ANSWER_OWN
        ]
        content = answer.content
        raw.append((b"content-length", str(len(content)).encode()))
        await send({"type": "http.response.start", "status": answer.status_code, "headers": raw})
        await send({"type": "http.response.body", "body": content})

    async def _placement(self, scope: Scope, body: bytes) -> Owner:
        """Where a new agent goes: its parent's daemon, ``?node=``, or the least loaded."""
        try:
            data: Any = json.loads(body) if body else None
        except ValueError:
            data = None  # the route refuses it with its own message
        parent = data.get("parent") if isinstance(data, dict) else None
        caller = scope.get(CALLER_SCOPE_KEY)
        if parent is None and isinstance(caller, Caller) and caller.agent is not None:
            parent = caller.agent  # an agent's token spawns under itself
        if isinstance(parent, str):
            agent = self._resolve(parent)
            if agent is not None:
                if self.node.owns(agent):
                    return Owner(self.node.name, self.node.url, True, self.node.lease_s)
                owner = await self.node.owner_of(agent)
                if owner is not None:
                    return owner
        asked = QueryParams(scope.get("query_string", b"")).get("node")
        return await self.node.placement(asked)

    def _agent_of(self, scope: Scope, path: str) -> str | None:
        """The agent a command is about, when it is about one."""
        state = self.service.store.state
        for pattern in (_AGENT, _BREAKER):
            found = pattern.match(path)
            if found is not None:
                return self._resolve(found["ref"])
        found = _DECISION.match(path)
        if found is not None:
            decision = state.decisions.get(found["id"])
            agent = None if decision is None else decision.get("agentId")
            return agent if isinstance(agent, str) else None
        found = _RUN.match(path)
        if found is not None:
            run = found["run"]
            for rec in state.agents.values():
                if rec.get("runId") == run:
                    return rec["id"]
            return None
        if path == "/gateway/query":
            caller = scope.get(CALLER_SCOPE_KEY)
            if isinstance(caller, Caller) and caller.agent is not None:
                return caller.agent
        return None

    def _resolve(self, ref: str) -> str | None:
        try:
            agent = _names.resolve(self.service.store.state.agents, ref)
        except CorralError:
            return None  # ambiguous: the route answers with the candidates
        return agent if agent in self.service.store.state.agents else None

    async def aclose(self) -> None:
        await self.client.aclose()

    def _closing(self, send: Send) -> Send:
        """``send`` that closes the client to the other daemons once the app has shut down
        (its pooled connections would otherwise outlive the app)."""

        async def closing(message: Message) -> None:
            if message["type"] == "lifespan.shutdown.complete":
                await self.aclose()
            await send(message)

        return closing


async def _read(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes, then: Receive | None = None) -> Receive:
    """The body read already, then what the client sends next (its disconnect)."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        if then is not None:
            return await then()
        return {"type": "http.disconnect"}

    return receive
