"""Talking to the daemon over HTTP: ``HttpApi`` (an ``AgentApi``, like the in-process
``LocalApi``: the same JSON dicts and the same ``CorralError`` subclasses), ``follow_events``
for its event stream, and the errors its answers stand for."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from corral.daemon import _errors
from corral.daemon._errors import DaemonError, UnknownTargetError
from corral.daemon._wire import (
    BlockingWire,
    HttpxWire,
    Wire,
    WireError,
    headers_for,
    httpx_reason,
    tls_for,
)
from corral.kernel import SYSTEM_CLOCK, Clock, CorralError, InvalidArgumentError
from corral.kernel import _validate as v

if TYPE_CHECKING:
    import httpx

    from corral.daemon._events import Event

Json = dict[str, Any]

DEFAULT_URL = "http://127.0.0.1:4600"


# --- errors over the wire ---------------------------------------------------------------------


class RemoteError(DaemonError):
    """The daemon refused with a code this client does not know (or answered no JSON error).

    ``code``, ``message``, ``retryable`` and ``details`` are the daemon's; ``status`` is the
    HTTP status of the answer.
    """

    code = "remote_error"

    def __init__(
        self,
        code: str,
        message: str,
        *,
        status: int,
        retryable: bool = False,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message, retryable=retryable, **dict(details or {}))
        # The code is the daemon's, per instance; the class default only names the family.
        object.__setattr__(self, "code", code)
        self.status = status


class DaemonUnreachableError(DaemonError):
    """No daemon answers at the URL (refused, unresolvable, timed out or dropped)."""

    code = "daemon_unreachable"
    default_retryable = True

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(
            f"no daemon answers at {url} ({reason}); start one with `corral serve` "
            "or point --url / CORRAL_URL at it",
            url=url,
            reason=reason,
        )
        self.url = url
        self.reason = reason


def _known_errors() -> dict[str, type[CorralError]]:
    known: dict[str, type[CorralError]] = {InvalidArgumentError.code: InvalidArgumentError}
    pending: list[type[CorralError]] = [DaemonError]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if cls.__module__ == _errors.__name__:
            known.setdefault(cls.code, cls)
    return known


_KNOWN = _known_errors()


def error_from_answer(status: int, body: Any) -> CorralError:
    """The ``CorralError`` an HTTP error answer stands for.

    A body ``{"error": {code, message, retryable, details}}`` with a code of the
    ``corral.daemon`` errors becomes that class, carrying the daemon's message and details
    (also as attributes, as the class itself sets them); any other answer becomes a
    :class:`RemoteError` with the HTTP ``status``.
    """
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict) or not isinstance(err.get("code"), str):
        shown = body if isinstance(body, str) else json.dumps(body, default=str)
        return RemoteError(
            f"http_{status}", f"the daemon answered HTTP {status}: {shown[-300:]}", status=status
        )
    code: str = err["code"]
    message = str(err.get("message") or code)
    retryable = bool(err.get("retryable", False))
    given = err.get("details")
    # ``message`` and ``retryable`` are the error's own; a detail may not shadow them.
    details = {
        k: v
        for k, v in (given if isinstance(given, dict) else {}).items()
        if k not in ("message", "retryable")
    }
    cls = _KNOWN.get(code)
    if cls is None:
        return RemoteError(code, message, status=status, retryable=retryable, details=details)
    # The class's own constructor takes typed fields; the daemon already wrote the message.
    error = cls.__new__(cls)
    CorralError.__init__(error, message, retryable=retryable, **details)
    for name, value in details.items():
        if name.isidentifier() and not hasattr(cls, name):
            setattr(error, name, value)
    return error


def page_args(after: Any, agent: Any, limit: Any) -> None:
    """Check the arguments of a page of the event log (``InvalidArgumentError``)."""
    v.non_negative_int("events", "after", after)
    v.non_empty_str("events", "agent", agent, optional=True)
    v.positive_int("events", "limit", limit)


def _event_of(item: Mapping[str, Any]) -> Event:
    from corral.daemon._events import Event  # not on a command line's start: only events need it

    return Event(
        seq=int(item["seq"]),
        ts=str(item.get("ts", "")),
        type=str(item["type"]),
        agent_id=item.get("agentId"),
        data=dict(item.get("data") or {}),
    )


def spec_mapping(where: str, name: str, value: Any) -> None:
    if not isinstance(value, Mapping):
        raise InvalidArgumentError(where, name, "a mapping (the agent spec as JSON)", value)


def _base_url(url: Any, where: str) -> str:
    v.non_empty_str(where, "url", url)
    if not url.startswith(("http://", "https://")):
        raise InvalidArgumentError(where, "url", "an http:// or https:// URL", url)
    return str(url).rstrip("/")


def _command(fields: Mapping[str, Any]) -> Json:
    return {k: v for k, v in fields.items() if v is not None}


def _items(body: Any, key: str) -> list[Json]:
    """A list answer: a bare JSON list, or an object holding it under ``key``."""
    if isinstance(body, dict) and isinstance(body.get(key), list):
        body = body[key]
    if not isinstance(body, list):
        raise RemoteError("bad_answer", f"expected a list of {key}, got {body!r:.200}", status=200)
    return body


class HttpApi:
    """:class:`AgentApi` over the daemon's HTTP API at ``url``.

    ``token`` is sent as a bearer token. ``transport`` replaces the network (an
    ``httpx.ASGITransport`` runs an app in process). Refusals raise the daemon's error
    classes (see :func:`error_from_answer`); no answer at all raises
    :class:`DaemonUnreachableError`. Close with :meth:`aclose` or ``async with``.
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        token: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout_s: float = 30.0,
        blocking: bool = False,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.url = _base_url(url, "HttpApi")
        v.non_empty_str("HttpApi", "token", token, optional=True)
        v.positive_number("HttpApi", "timeout_s", timeout_s)
        v.instance_of("HttpApi", "blocking", blocking, bool)
        self._wire: Wire
        if blocking:
            if transport is not None:
                wanted = "None when blocking (http.client is the wire)"
                raise InvalidArgumentError("HttpApi", "transport", wanted, transport)
            if headers:
                raise InvalidArgumentError("HttpApi", "headers", "None when blocking", headers)
            self._wire = BlockingWire(self.url, token, timeout_s)
        else:
            if transport is not None:
                import httpx

                v.instance_of("HttpApi", "transport", transport, httpx.AsyncBaseTransport)
            self._wire = HttpxWire(self.url, token, timeout_s, transport, headers)

    async def aclose(self) -> None:
        await self._wire.aclose()

    async def __aenter__(self) -> HttpApi:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _call(
        self,
        method: str,
        path: str,
        body: Json | None = None,
        *,
        params: Mapping[str, Any] | None = None,
        wait_s: float = 0.0,
    ) -> Any:
        # A request that waits on the daemon's side (``waitS``) gets that much longer.
        try:
            status, content = await self._wire.request(
                method, path, body, params=params, extra_s=wait_s
            )
        except WireError as exc:
            raise DaemonUnreachableError(self.url, exc.reason) from exc
        try:
            answer = json.loads(content) if content else None
        except ValueError:
            answer = content.decode("utf-8", "replace")
        if status >= 400:
            raise error_from_answer(status, answer)
        return answer

    async def spawn(
        self,
        spec: Mapping[str, Any],
        idempotency_key: str | None = None,
        *,
        node: str | None = None,
    ) -> Json:
        """Create an agent; ``node`` names the daemon it runs on when several share the
        store (``node_not_found`` when none of that name is live, or the daemon is alone)."""
        spec_mapping("spawn", "spec", spec)
        v.non_empty_str("spawn", "node", node, optional=True)
        body = dict(spec)
        if idempotency_key is not None:
            body["idempotencyKey"] = idempotency_key
        params = None if node is None else {"node": node}
        return dict(await self._call("POST", "/agents", body, params=params))

    async def prompt(
        self,
        agent_id: str,
        text: str | None = None,
        by: str | None = None,
        why: str | None = None,
        idempotency_key: str | None = None,
    ) -> Json:
        v.non_empty_str("prompt", "agent_id", agent_id)
        body = _command({"text": text, "by": by, "why": why, "idempotencyKey": idempotency_key})
        return dict(await self._call("POST", f"/agents/{path_segment(agent_id)}/prompt", body))

    async def stop(
        self,
        agent_id: str,
        by: str | None = None,
        why: str | None = None,
        idempotency_key: str | None = None,
        now: bool = False,
        keep_children: bool = False,
    ) -> Json:
        v.non_empty_str("stop", "agent_id", agent_id)
        body = _command({"by": by, "why": why, "idempotencyKey": idempotency_key})
        if now:
            body["now"] = True
        if keep_children:
            body["keepChildren"] = True
        return dict(await self._call("POST", f"/agents/{path_segment(agent_id)}/stop", body))

    async def restart(
        self,
        agent_id: str,
        by: str | None = None,
        why: str | None = None,
        idempotency_key: str | None = None,
    ) -> Json:
        v.non_empty_str("restart", "agent_id", agent_id)
        body = _command({"by": by, "why": why, "idempotencyKey": idempotency_key})
        return dict(await self._call("POST", f"/agents/{path_segment(agent_id)}/restart", body))

    async def delete(
        self,
        agent_id: str,
        by: str | None = None,
        why: str | None = None,
        idempotency_key: str | None = None,
    ) -> Json:
        v.non_empty_str("delete", "agent_id", agent_id)
        body = _command({"by": by, "why": why, "idempotencyKey": idempotency_key})
        return dict(await self._call("DELETE", f"/agents/{path_segment(agent_id)}", body))

    async def budget(
        self,
        agent_id: str,
        budget: Mapping[str, Any],
        by: str | None = None,
        why: str | None = None,
        idempotency_key: str | None = None,
    ) -> Json:
        v.non_empty_str("budget", "agent_id", agent_id)
        if not isinstance(budget, Mapping):
            raise InvalidArgumentError("budget", "budget", "a mapping of budget dimensions", budget)
        body = {
            "budget": dict(budget),
            **_command({"by": by, "why": why, "idempotencyKey": idempotency_key}),
        }
        return dict(await self._call("PATCH", f"/agents/{path_segment(agent_id)}", body))

    async def patch(
        self,
        agent_id: str,
        changes: Mapping[str, Any],
        by: str | None = None,
        why: str | None = None,
        idempotency_key: str | None = None,
    ) -> Json:
        v.non_empty_str("patch", "agent_id", agent_id)
        if not isinstance(changes, Mapping):
            raise InvalidArgumentError("patch", "changes", "a mapping of fields to change", changes)
        body = {
            **dict(changes),
            **_command({"by": by, "why": why, "idempotencyKey": idempotency_key}),
        }
        return dict(await self._call("PATCH", f"/agents/{path_segment(agent_id)}", body))

    async def get(self, agent_id: str) -> Json:
        v.non_empty_str("get", "agent_id", agent_id)
        return dict(await self._call("GET", f"/agents/{path_segment(agent_id)}"))

    async def list_agents(self, **filters: str | None) -> list[Json]:
        found: list[Json] = []
        cursor = None
        while True:
            page = await self.list_page(1000, cursor, **filters)
            found += _items(page, "agents")
            cursor = page.get("nextCursor")
            if not cursor:
                return found

    async def list_page(
        self, limit: int | None = None, cursor: str | None = None, **filters: str | None
    ) -> Json:
        query = _command({"limit": limit, "cursor": cursor, **filters})
        answer = await self._call("GET", "/agents", params=query)
        if not isinstance(answer, dict):
            raise RemoteError(
                "bad_answer", f"expected a page of agents, got {answer!r:.200}", status=200
            )
        return answer

    async def run(self, run_id: str) -> Json:
        v.non_empty_str("run", "run_id", run_id)
        return dict(await self._call("GET", f"/runs/{path_segment(run_id)}"))

    async def stop_run(
        self,
        run_id: str,
        by: str | None = None,
        why: str | None = None,
        idempotency_key: str | None = None,
    ) -> Json:
        v.non_empty_str("stop_run", "run_id", run_id)
        body = _command({"by": by, "why": why, "idempotencyKey": idempotency_key})
        return dict(await self._call("POST", f"/runs/{path_segment(run_id)}/stop", body))

    async def inbox(self, agent_id: str) -> list[Json]:
        v.non_empty_str("inbox", "agent_id", agent_id)
        return _items(await self._call("GET", f"/agents/{path_segment(agent_id)}/inbox"), "notices")

    async def session(self, agent_id: str) -> Json:
        v.non_empty_str("session", "agent_id", agent_id)
        return dict(await self._call("GET", f"/agents/{path_segment(agent_id)}/session"))

    async def turn(self, agent_id: str, turn: int) -> Json:
        """``GET /agents/{id}/turns/{n}``: one turn's record with its output and log."""
        v.non_empty_str("turn", "agent_id", agent_id)
        v.positive_int("turn", "turn", turn)
        return dict(await self._call("GET", f"/agents/{path_segment(agent_id)}/turns/{turn}"))

    async def logs(self, agent_id: str, **params: Any) -> Json:
        """``GET /agents/{id}/logs`` with its query (``turn``, ``turns``, ``tail``,
        ``format``) as keywords: the last turns' log lines."""
        v.non_empty_str("logs", "agent_id", agent_id)
        query = {k: value for k, value in params.items() if value is not None}
        return dict(await self._call("GET", f"/agents/{path_segment(agent_id)}/logs", params=query))

    async def decisions(self, resolved: bool = False) -> list[Json]:
        params = {"resolved": "true"} if resolved else None
        return _items(await self._call("GET", "/decisions", params=params), "decisions")

    async def decision(self, decision_id: str) -> Json:
        v.non_empty_str("decision", "decision_id", decision_id)
        return dict(await self._call("GET", f"/decisions/{path_segment(decision_id)}"))

    async def answer(
        self,
        decision_id: str,
        answer: str,
        why: str | None = None,
        by: str | None = None,
        text: str | None = None,
        budget: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> Json:
        """Answer a decision: ``{"decision", "answer", "agentId"}``."""
        v.non_empty_str("answer", "decision_id", decision_id)
        body = _command(
            {
                "answer": answer,
                "why": why,
                "by": by,
                "text": text,
                "budget": None if budget is None else dict(budget),
                "idempotencyKey": idempotency_key,
            }
        )
        return dict(await self._call("POST", f"/decisions/{path_segment(decision_id)}", body))

    async def check_action(
        self,
        agent_id: str,
        action: str,
        context: Mapping[str, Any] | None = None,
        wait_s: float = 0.0,
    ) -> Json:
        """May ``agent_id`` do ``action``: ``{"verdict", "reason", "warnings", "decision"}``
        (verdict ``pending`` when a person has not answered within ``wait_s``)."""
        v.non_empty_str("check_action", "agent_id", agent_id)
        body = _command({"action": action, "context": context, "waitS": wait_s})
        path = f"/agents/{path_segment(agent_id)}/actions"
        return dict(await self._call("POST", path, body, wait_s=wait_s))

    async def action_verdict(self, decision_id: str, wait_s: float = 0.0) -> Json:
        """The verdict of the check that opened ``decision_id``, waiting up to ``wait_s``."""
        v.non_empty_str("action_verdict", "decision_id", decision_id)
        path = f"/actions/{path_segment(decision_id)}"
        return dict(await self._call("GET", path, params={"waitS": wait_s}, wait_s=wait_s))

    async def db_targets(self) -> list[Json]:
        return _items(await self._call("GET", "/gateway"), "targets")

    async def _target(self, target: str | None) -> str:
        if target is not None:
            from corral.daemon._targets import check_target_name

            check_target_name("gateway", target)
            return target
        names = [str(t["name"]) for t in await self.db_targets()]
        if len(names) != 1:
            raise UnknownTargetError(None, names)
        return names[0]

    async def _agent_path(self, agent_id: str, target: str | None, tail: str = "") -> str:
        v.non_empty_str("gateway", "agent_id", agent_id)
        name = await self._target(target)
        return f"/gateway/{path_segment(name)}/agents/{path_segment(agent_id)}{tail}"

    async def db_schema(self, target: str | None = None) -> Json:
        name = await self._target(target)
        return dict(await self._call("GET", f"/gateway/{path_segment(name)}/schema"))

    async def db_query(
        self, agent_id: str, request: Mapping[str, Any], target: str | None = None
    ) -> Json:
        v.non_empty_str("db_query", "agent_id", agent_id)
        if not isinstance(request, Mapping):
            raise InvalidArgumentError(
                "db_query", "request", "a mapping: {sql, params} or {op, table, ...}", request
            )
        body = {**request, "agent": agent_id}
        if target is not None:
            body["target"] = target
        return dict(await self._call("POST", "/gateway/query", body))

    async def db_status(self, agent_id: str, target: str | None = None) -> Json:
        return dict(await self._call("GET", await self._agent_path(agent_id, target)))

    async def db_history(self, agent_id: str, target: str | None = None) -> list[Json]:
        path = await self._agent_path(agent_id, target, "/history")
        return _items(await self._call("GET", path), "history")

    async def db_freeze(
        self, agent_id: str, reason: str, by: str | None = None, target: str | None = None
    ) -> Json:
        path = await self._agent_path(agent_id, target, "/freeze")
        return dict(await self._call("POST", path, _command({"reason": reason, "by": by})))

    async def db_reinstate(
        self, agent_id: str, by: str | None, reason: str, target: str | None = None
    ) -> Json:
        path = await self._agent_path(agent_id, target, "/reinstate")
        return dict(await self._call("POST", path, _command({"by": by, "reason": reason})))

    # Named operator tokens (an operator's token only; not part of AgentApi).

    async def create_token(self, name: str) -> Json:
        """A new named operator token: ``{name, token, createdAt, by}`` (the secret is in
        this answer only)."""
        v.non_empty_str("create_token", "name", name)
        return dict(await self._call("POST", "/tokens", {"name": name}))

    async def nodes(self) -> Json:
        """The daemons sharing the store (``GET /nodes``): ``{node, leaseS, nodes}``, with
        ``node`` None and no nodes for a daemon alone on its store."""
        answer: Json = await self._call("GET", "/nodes")
        return answer

    async def list_tokens(self) -> list[Json]:
        """The live named operator tokens: ``{name, createdAt, by}`` each."""
        return _items(await self._call("GET", "/tokens"), "tokens")

    async def revoke_token(self, name: str) -> Json:
        """Revoke the live token ``name``; its record, with ``revokedAt`` and ``revokedBy``."""
        v.non_empty_str("revoke_token", "name", name)
        return dict(await self._call("DELETE", f"/tokens/{path_segment(name)}"))

    async def events(
        self, after: int = 0, agent: str | None = None, limit: int = 1000
    ) -> list[Event]:
        """One page of the event log: up to ``limit`` events with ``seq > after``."""
        page_args(after, agent, limit)
        query = _command({"format": "json", "after": after, "agent": agent, "limit": limit})
        answer = await self._call("GET", "/events?" + urlencode(query))
        return [_event_of(item) for item in _items(answer, "events")]

    async def events_page(
        self,
        after: int = 0,
        agent: str | None = None,
        limit: int = 1000,
        *,
        types: Sequence[str] = (),
        run: str | None = None,
    ) -> tuple[list[Event], int]:
        """One page of the events of ``types`` (all: empty) and ``run``: up to ``limit``
        with ``seq > after``, and the seq the daemon read up to (the next page's ``after``;
        a filtered page may hold fewer than ``limit`` events and not be the last)."""
        page_args(after, agent, limit)
        query = _command(
            {"format": "json", "after": after, "agent": agent, "limit": limit, "run": run}
        )
        if types:
            query["type"] = ",".join(types)
        answer = await self._call("GET", "/events?" + urlencode(query))
        events = [_event_of(item) for item in _items(answer, "events")]
        scanned = answer.get("scannedTo") if isinstance(answer, dict) else None
        if not isinstance(scanned, int):  # a daemon before ?type=: its last event
            scanned = events[-1].seq if events else after
        return events, scanned


def path_segment(agent_id: str) -> str:
    # Agent ids are a_ + hex; anything else is quoted so it cannot change the route (dots
    # too: a client would resolve a "." or ".." segment before sending).
    return quote(agent_id, safe="").replace(".", "%2E")


# --- server-sent events -----------------------------------------------------------------------


async def follow_events(
    url: str = DEFAULT_URL,
    after: int | None = None,
    agent: str | None = None,
    *,
    token: str | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    reconnect_after_s: float = 0.5,
    max_reconnects: int | None = 20,
    read_timeout_s: float | None = 60.0,
    clock: Clock = SYSTEM_CLOCK,
) -> AsyncGenerator[Event, None]:
    """The daemon's events from ``GET /events`` as :class:`Event` objects, without end.

    ``after`` starts after that sequence number (None: from the start of the log);
    ``agent`` keeps one agent's events. When the stream drops or the daemon goes away, it
    reconnects after ``reconnect_after_s`` seconds (or the server's ``retry:`` hint) with
    ``Last-Event-ID`` set to the last ``seq`` seen, so nothing is missed or repeated.
    After ``max_reconnects`` reconnects in a row that the daemon does not answer (None: no
    limit) it raises :class:`DaemonUnreachableError`; a first connection that fails raises
    it at once. An error answer raises the daemon's error class. A stream silent for
    ``read_timeout_s`` seconds (the daemon sends heartbeats far more often) counts as
    dropped; None waits forever.
    """
    base = _base_url(url, "follow_events")
    v.non_negative_int("follow_events", "after", after, optional=True)
    v.non_empty_str("follow_events", "agent", agent, optional=True)
    v.non_empty_str("follow_events", "token", token, optional=True)
    v.non_negative_number("follow_events", "reconnect_after_s", reconnect_after_s)
    v.non_negative_int("follow_events", "max_reconnects", max_reconnects, optional=True)
    v.positive_number("follow_events", "read_timeout_s", read_timeout_s, optional=True)
    import httpx

    params = {"agent": agent} if agent else {}
    last = after
    delay_s = reconnect_after_s
    tries = 0  # reconnect attempts since the last connection the daemon answered
    connected_once = False
    async with _stream_client(base, token, transport, read_timeout_s) as client:
        while True:
            headers = {"Last-Event-ID": str(last)} if last is not None else {}
            answered = False
            reason = "the daemon ended the stream"
            try:
                async with client.stream(
                    "GET", "/events", params=params, headers=headers
                ) as response:
                    if response.is_error:
                        raise await _stream_refusal(response)
                    connected_once = answered = True
                    async for item in _sse(response.aiter_lines()):
                        if isinstance(item, int):
                            delay_s = item / 1000
                            continue
                        if last is not None and item.seq <= last:
                            continue  # a server that ignores Last-Event-ID repeats itself
                        last = item.seq
                        yield item
            except httpx.TransportError as exc:
                if not connected_once:
                    raise DaemonUnreachableError(base, httpx_reason(exc)) from exc
                reason = httpx_reason(exc)
            if answered:
                tries = 0
            if max_reconnects is not None and tries >= max_reconnects:
                raise DaemonUnreachableError(
                    base, f"{reason}; gave up after {max_reconnects} reconnects"
                )
            tries += 1
            await clock.sleep(delay_s)


async def read_stream(
    url: str,
    path: str,
    *,
    token: str | None = None,
    params: Mapping[str, Any] | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    read_timeout_s: float | None = 120.0,
) -> AsyncGenerator[tuple[str, Json], None]:
    """One server-sent event stream of the daemon (``GET path``, no reconnecting), as
    ``(event type, data)`` for each message whose data is a JSON object (others are
    skipped), until the daemon ends it. An error answer raises the daemon's error class;
    no answer, or a dropped stream, :class:`DaemonUnreachableError`."""
    import httpx

    base = _base_url(url, "read_stream")
    async with _stream_client(base, token, transport, read_timeout_s) as client:
        try:
            async with client.stream("GET", path, params=params) as response:
                if response.is_error:
                    raise await _stream_refusal(response)
                async for frame in _frames(response.aiter_lines()):
                    if isinstance(frame, int):
                        continue
                    try:
                        found = json.loads(frame[2])
                    except ValueError:
                        continue
                    if isinstance(found, dict):
                        yield frame[1], found
        except httpx.TransportError as exc:
            raise DaemonUnreachableError(base, httpx_reason(exc)) from exc


def _stream_client(
    base: str,
    token: str | None,
    transport: httpx.AsyncBaseTransport | None,
    read_timeout_s: float | None,
) -> httpx.AsyncClient:
    """A client for the daemon's server-sent event streams at ``base``; a stream silent
    for ``read_timeout_s`` seconds (None: never) is a dropped one."""
    import httpx

    return httpx.AsyncClient(
        base_url=base,
        headers={**headers_for(token), "Accept": "text/event-stream"},
        transport=transport,
        timeout=httpx.Timeout(30.0, read=read_timeout_s),
        verify=tls_for(base),
    )


async def _stream_refusal(response: httpx.Response) -> CorralError:
    """The error a stream's error answer stands for (its body read first)."""
    await response.aread()
    try:
        answer: Any = response.json()
    except ValueError:
        answer = response.text
    return error_from_answer(response.status_code, answer)


async def _sse(lines: AsyncIterator[str]) -> AsyncIterator[Event | int]:
    """Events of ``GET /events`` (and ``retry:`` hints in ms, as ints)."""
    async for frame in _frames(lines):
        yield frame if isinstance(frame, int) else _event(*frame)


async def _frames(lines: AsyncIterator[str]) -> AsyncIterator[tuple[str | None, str, str] | int]:
    """The messages of a ``text/event-stream`` as ``(id, event type, data)``, and its
    ``retry:`` hints in ms, as ints; comments (the daemon's heartbeats) are skipped."""
    data: list[str] = []
    event_type = "message"
    event_id: str | None = None
    async for line in lines:
        if not line:
            if data:
                yield event_id, event_type, "\n".join(data)
            data, event_type, event_id = [], "message", None
            continue
        if line.startswith(":"):
            continue  # a comment: the daemon's heartbeat
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            data.append(value)
        elif name == "event":
            event_type = value
        elif name == "id" and "\0" not in value:
            event_id = value
        elif name == "retry" and value.isdigit():
            yield int(value)


def _event(event_id: str | None, event_type: str, data: str) -> Event:
    try:
        payload = json.loads(data)
    except ValueError as exc:
        raise RemoteError(
            "bad_event", f"an event's data is not JSON: {data[:200]!r}", status=200
        ) from exc
    if isinstance(payload, dict) and isinstance(payload.get("seq"), int) and "type" in payload:
        return _event_of(payload)
    if event_id is None or not event_id.isdigit():
        raise RemoteError("bad_event", f"an event has no numeric id: {event_id!r}", status=200)
    return Event(
        seq=int(event_id),
        ts="",
        type=event_type,
        agent_id=payload.get("agentId") if isinstance(payload, dict) else None,
        data=payload if isinstance(payload, dict) else {"value": payload},
    )
