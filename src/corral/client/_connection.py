"""``connect``: a connection to the daemon from a process of its own, and ``Connection``,
which registers agents and hands out their handles."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Literal
from urllib.parse import quote

import httpx

from corral.client import _watch
from corral.client._agent import AgentHandle
from corral.client._errors import ClientSettingError
from corral.client._wire import Wire
from corral.kernel import SYSTEM_CLOCK, Clock, ExecutionBudget, InvalidArgumentError
from corral.kernel import _validate as v
from corral.runtime import Cancellation

Json = dict[str, Any]

URL_ENV = "CORRAL_URL"
TOKEN_ENV = "CORRAL_TOKEN"
AGENT_ENV = "CORRAL_AGENT_ID"
_ENDED = frozenset({"stopped", "failed"})


def connect(
    url: str | None = None,
    token: str | None = None,
    *,
    timeout_s: float = 30.0,
    retry_s: float = 30.0,
    clock: Clock = SYSTEM_CLOCK,
    transport: httpx.AsyncBaseTransport | None = None,
) -> Connection:
    """A connection to the daemon at ``url`` with bearer ``token`` (defaults:
    ``$CORRAL_URL`` and ``$CORRAL_TOKEN``, which the daemon gives the agents it runs; a
    person's is a named token, ``corral token create``). Nothing is sent yet: use it as
    ``async with corral.connect() as conn:`` (or call :meth:`Connection.aclose`).

    ``timeout_s`` bounds each request (beyond a wait for a person it asks for);
    ``retry_s`` is how long an idempotent request -- an action check, a turn's end -- is
    tried again while the daemon does not answer or is unavailable (a restart) before it
    gives up (a check then fails closed). ``transport`` replaces httpx's (tests).

    Raises :class:`ClientSettingError` when the URL or the token is neither given nor in the
    environment, ``InvalidArgumentError`` for a bad value.
    """
    where = "connect"
    url = url if url is not None else os.environ.get(URL_ENV) or None
    token = token if token is not None else os.environ.get(TOKEN_ENV) or None
    if url is None:
        raise ClientSettingError(where, "url", URL_ENV)
    if token is None:
        raise ClientSettingError(where, "token", TOKEN_ENV)
    v.non_empty_str(where, "url", url)
    if not url.startswith(("http://", "https://")):
        raise InvalidArgumentError(where, "url", "an http:// or https:// URL", url)
    v.non_empty_str(where, "token", token)
    v.positive_number(where, "timeout_s", timeout_s)
    v.non_negative_number(where, "retry_s", retry_s)
    v.instance_of(where, "clock", clock, Clock)
    if transport is not None:
        v.instance_of(where, "transport", transport, httpx.AsyncBaseTransport)
    wire = Wire(url, token, timeout_s=timeout_s, retry_s=retry_s, clock=clock, transport=transport)
    return Connection(wire)


class Connection:
    """A daemon, as a process of its own talks to it (see :func:`connect`). Use it on one
    event loop; close it once done (``async with``, or :meth:`aclose`)."""

    def __init__(self, wire: Wire) -> None:
        self.wire = wire
        self._watches: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return self.wire.url

    def __repr__(self) -> str:
        return f"Connection(url={self.url!r})"

    async def __aenter__(self) -> Connection:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection (idempotent): watches of agents' ends stop with it."""
        watches, self._watches = list(self._watches), set()
        for task in watches:
            task.cancel()
        await asyncio.gather(*watches, return_exceptions=True)
        await self.wire.aclose()

    def follow(self, agent_ref: str, cancellation: Cancellation) -> None:
        """Cancel ``cancellation`` when the daemon ends agent ``agent_ref`` (see
        :attr:`AgentHandle.cancellation`), watching until then or until :meth:`aclose`."""
        task = _watch.start(self.wire, agent_ref, cancellation)
        self._watches.add(task)
        task.add_done_callback(self._watches.discard)

    def agent(self, id_or_name: str | None = None) -> AgentHandle:
        """The handle of an existing agent, by id or name (default ``$CORRAL_AGENT_ID``: the
        agent this process is, when the daemon runs it). Nothing is sent: a wrong id is
        found out by the first request. Raises :class:`ClientSettingError` when there is
        no id."""
        ref = id_or_name if id_or_name is not None else os.environ.get(AGENT_ENV) or None
        if ref is None:
            raise ClientSettingError("Connection.agent", "id_or_name", AGENT_ENV)
        v.non_empty_str("Connection.agent", "id_or_name", ref)
        return AgentHandle(self, ref)

    async def register(
        self,
        name: str,
        *,
        budget: ExecutionBudget | Mapping[str, Any] | None = None,
        on_failure: Literal["fail", "ask", "retry"] = "fail",
        max_retries: int | None = None,
        max_consecutive_failures: int = 3,
        guardrails: Sequence[Mapping[str, Any]] = (),
        parent: str | None = None,
        notify_on: Sequence[str] = (),
        turn_timeout_s: float | None = None,
        spec: Mapping[str, Any] | None = None,
        reuse: bool = True,
    ) -> AgentHandle:
        """The agent ``name`` of harness ``external`` -- this process's turns, the daemon's
        oversight -- created (``POST /agents``) unless ``reuse`` finds one.

        ``budget``: an ``ExecutionBudget`` or the spec's camelCase ``{"maxTokens",
        "maxCostUsd", "maxTurns", "deadlineS"}``. ``on_failure``, ``max_retries``,
        ``max_consecutive_failures``, ``guardrails`` (rules as JSON: ``{"match", "verdict",
        "reason", ...}``), ``parent`` (an id or name), ``notify_on`` and ``turn_timeout_s``
        are the spec's fields of those names (docs/daemon.md, "An agent spec"); ``spec``
        adds any other field as the spec spells it (``priority``, ``mayAnswer``,
        ``history``...).

        ``reuse`` (the default): a live agent of harness ``external`` named ``name`` under
        the same ``parent`` is taken up instead (the newest, when there are several), so a
        process that starts again goes on as the same agent, its budget spent as far as it
        was; the spec given is then not applied (``PATCH /agents/{id}`` changes a live
        agent). Raises :class:`DaemonRefusedError` for a spec the daemon refuses
        (``invalid_spec``, with every problem), ``InvalidArgumentError`` for bad arguments.
        """
        where = "Connection.register"
        v.non_empty_str(where, "name", name)
        v.non_empty_str(where, "parent", parent, optional=True)
        v.instance_of(where, "reuse", reuse, bool)
        body: Json = {"name": name, "harness": "external", "onFailure": on_failure}
        if budget is not None:
            body["budget"] = _budget_json(where, budget)
        if max_retries is not None:
            body["maxRetries"] = max_retries
        body["maxConsecutiveFailures"] = max_consecutive_failures
        if guardrails:
            body["guardrails"] = [dict(rule) for rule in guardrails]
        if parent is not None:
            body["parent"] = parent
        if notify_on:
            body["notifyOn"] = list(notify_on)
        if turn_timeout_s is not None:
            body["turnTimeoutS"] = turn_timeout_s
        if spec is not None:
            v.instance_of(where, "spec", spec, Mapping)
            taken = sorted({"name", "harness"} & set(spec))
            if taken:
                raise InvalidArgumentError(where, "spec", "no 'name' or 'harness' field", taken)
            body.update(spec)
        if reuse:
            found = await self._live_external(name, parent)
            if found is not None:
                return AgentHandle(self, str(found["id"]), found)
        _, record = await self.wire.call("POST", "/agents", body=body)
        return AgentHandle(self, str(record["id"]), record)

    async def _live_external(self, name: str, parent: str | None) -> Json | None:
        """The newest live ``external`` agent named ``name`` under ``parent`` (None: a root),
        among those the token reaches."""
        parent_id = None
        if parent is not None:
            _, found = await self.wire.call("GET", f"/agents/{quote(parent, safe='')}", retry=True)
            parent_id = found["id"]
        params = {"name": name}
        if parent_id is not None:
            params["parent"] = parent_id
        newest: Json | None = None
        cursor: str | None = None
        while True:
            if cursor is not None:
                params["cursor"] = cursor
            _, page = await self.wire.call("GET", "/agents", params=params, retry=True)
            for summary in page.get("agents", []):
                if (
                    summary.get("harness") == "external"
                    and summary.get("state") not in _ENDED
                    and summary.get("parent") == parent_id
                ):
                    newest = summary  # oldest first: the last one is the newest
            cursor = page.get("nextCursor")
            if not cursor:
                return newest


def _budget_json(where: str, budget: ExecutionBudget | Mapping[str, Any]) -> Json:
    if isinstance(budget, ExecutionBudget):
        shown = {
            "maxTokens": budget.max_tokens,
            "maxCostUsd": budget.max_cost_usd,
            "maxTurns": budget.max_turns,
            "deadlineS": budget.deadline_s,
        }
        return {k: value for k, value in shown.items() if value is not None}
    if isinstance(budget, Mapping):
        return dict(budget)
    raise InvalidArgumentError(where, "budget", "an ExecutionBudget or a mapping", budget)
