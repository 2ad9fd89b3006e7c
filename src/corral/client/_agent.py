"""``AgentHandle``: one agent of the daemon, as its own process uses it -- asking before it
acts (``check_action``, a ``Supervisor``'s shape) and reporting its turns."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from corral.client._errors import DaemonRefusedError, DaemonUnreachableError, TurnRefusedError
from corral.client._turn import CANCELLED, Turn, TurnScope
from corral.guard import GuardrailResult, GuardrailWarning, Severity
from corral.kernel import InvalidArgumentError
from corral.kernel import _validate as v
from corral.runtime import Cancellation

if TYPE_CHECKING:
    from corral.client._connection import Connection

logger = logging.getLogger("corral.client")

Json = dict[str, Any]

MAX_CONTEXT_BYTES = 16_000
"""A context bigger than this as JSON is sent cut short (the daemon takes 16 KiB)."""
ROUND_S = 60.0
"""How long one request waits for a person's answer; a longer wait asks again."""
_MAX_DEPTH = 32


class AgentHandle:
    """An agent of the daemon, as seen by the process that is that agent (see
    :meth:`Connection.register` and :meth:`Connection.agent`).

    ``id`` is how it is addressed: its id, or the name it was given by (the daemon resolves
    a name among the agents the token reaches). Every method raises
    :class:`DaemonRefusedError` for a refusal and :class:`DaemonUnreachableError` when no
    daemon answers -- except :meth:`check_action`, which never raises for either: it fails
    closed.
    """

    def __init__(self, connection: Connection, ref: str, record: Json | None = None) -> None:
        self.connection = connection
        self.id = str(record["id"]) if record is not None else ref
        self.name: str | None = None if record is None else record.get("name")
        self._path = f"/agents/{quote(self.id, safe='')}"
        self._cancellation: Cancellation | None = None
        # The agent's id as the daemon knows it (a handle made by name learns it from the
        # first record read): the gateway keys its breakers and freezes by it.
        self._agent_id: str | None = None if record is None else self.id

    @property
    def cancellation(self) -> Cancellation:
        """A ``corral.runtime.Cancellation`` cancelled when the daemon ends the agent
        (stopped -- by a person, its parent, a run's stop -- or failed), its reason saying
        so: hand it to what runs the agent (an adapter, ``Cancellation.wait``) so that a
        ``corral stop`` stops the work too. The agent's event stream is followed from the
        first access on (inside a running event loop) until then, or until the connection
        closes; a daemon away is asked again meanwhile."""
        if self._cancellation is None:
            self._cancellation = Cancellation(clock=self.connection.wire.clock)
            self.connection.follow(self.id, self._cancellation)
        return self._cancellation

    def __repr__(self) -> str:
        return f"AgentHandle(id={self.id!r}, url={self.connection.url!r})"

    # --- the agent ----------------------------------------------------------------------------

    async def get(self) -> Json:
        """The agent's record (``GET /agents/{id}``): state, reason, usage, spec, ..."""
        _, record = await self.connection.wire.call("GET", self._path, retry=True)
        self.name = record.get("name", self.name)
        self._agent_id = str(record.get("id") or self._agent_id or self.id)
        return record

    # --- asking before acting -------------------------------------------------------------------

    async def check_action(
        self, agent_id: str, action: str, context: Mapping[str, object] | None = None
    ) -> GuardrailResult:
        """Whether this agent may do ``action``: the daemon's rules for it answer (its own
        guardrails, its ancestors', the daemon's), or a person when one asks. The shape and
        meaning of ``corral.guard.Supervisor.check_action``, so it plugs in wherever one
        does (``corral.runtime.ToolGuard(handle.check_action)``, the framework adapters).

        A rule that asks a person opens a decision (``corral decisions``, the console) and
        this waits for the answer -- asking again every :data:`ROUND_S` seconds -- until it
        comes or the rule's ``timeoutS`` passes (the daemon then answers as its
        ``onTimeout`` says). Fails closed: a refusal or a daemon that does not answer (for
        the connection's ``retry_s``) answers blocked, the reason saying why; it never
        raises for them. A cancellation propagates.

        The check is always this agent's; ``agent_id`` (whoever the caller acts as) goes
        into the decision's context as ``caller`` when it names someone else. ``context``
        goes to the person as JSON (values that are not JSON as their ``repr``; cut short
        past 16 KB). Raises ``InvalidArgumentError`` for an empty ``agent_id``, a
        non-string ``action`` or a ``context`` that is not a mapping, as a Supervisor does.
        """
        where = "AgentHandle.check_action"
        v.non_empty_str(where, "agent_id", agent_id)
        v.instance_of(where, "action", action, str)
        if context is not None and not isinstance(context, Mapping):
            raise InvalidArgumentError(where, "context", "a mapping or None", context)
        body = {"action": action, "context": self._context(agent_id, context), "waitS": 0}
        wire = self.connection.wire
        try:
            _, verdict = await wire.call("POST", f"{self._path}/actions", body=body, retry=True)
            while verdict.get("verdict") == "pending":
                decision = verdict.get("decision")
                if not isinstance(decision, str) or not decision:
                    break
                _, verdict = await wire.call(
                    "GET",
                    f"/actions/{quote(decision, safe='')}",
                    params={"waitS": f"{ROUND_S:g}"},
                    waits_s=ROUND_S,
                    retry=True,
                )
        except DaemonRefusedError as exc:
            return GuardrailResult.blocked(f"the daemon refused the check ({exc.code}): {exc}")
        except DaemonUnreachableError as exc:
            return GuardrailResult.blocked(f"no daemon to check with, so refused: {exc.reason}")
        return _result(verdict)

    def _context(self, agent_id: str, context: Mapping[str, object] | None) -> Json:
        found = _plain(dict(context or {}), 0)
        assert isinstance(found, dict)
        if agent_id not in (self.id, self.name) and "caller" not in found:
            found["caller"] = agent_id
        text = json.dumps(found, separators=(",", ":"), ensure_ascii=False)
        if len(text.encode()) > MAX_CONTEXT_BYTES:
            cut = text.encode()[: MAX_CONTEXT_BYTES // 2].decode(errors="ignore")
            found = {"truncated": True, "json": cut}
            if agent_id not in (self.id, self.name):
                found["caller"] = agent_id
        return found

    # --- the daemon's gateway -------------------------------------------------------------------

    async def query(
        self, agent_id: str, request: Mapping[str, Any], *, target: str | None = None
    ) -> Json:
        """Run one gateway request as this agent (``POST /gateway/query``) on the database
        ``target`` (``--db NAME=...``; None: the only one): ``{"sql": ..., "params": [...]}``
        or a structured operation (``{"op": "find", "table": ...}``), as docs/gateway.md says.
        Answers the daemon's JSON (``rows``, ``status``, ``emptiness``, ...). The shape of
        ``corral.gateway.Gateway.query``, so the handle is an adapter's ``gateway``
        (``Oversight.connected(handle, gateway=handle)``).

        Raises :class:`DaemonRefusedError` with the gateway's code for what it refuses
        (``unknown_column`` with its close matches in ``details``, ``agent_frozen``,
        ``idempotency_key_required``, ...) and :class:`DaemonUnreachableError` when no
        daemon answers; a request that could not be told is sent again while the daemon is
        away (a write carries its ``idempotency_key``, so it is replayed, never applied
        twice). ``InvalidArgumentError`` for an ``agent_id`` other than this agent's id or
        name (the handle queries as its own agent only), a ``request`` that is not a mapping
        or that names ``agent`` or ``target``.
        """
        where = "AgentHandle.query"
        v.non_empty_str(where, "agent_id", agent_id)
        if agent_id not in (self.id, self.name, self._agent_id):
            raise InvalidArgumentError(where, "agent_id", f"this agent ({self.id})", agent_id)
        if not isinstance(request, Mapping):
            raise InvalidArgumentError(
                where, "request", "a mapping: {sql, params} or {op, table, ...}", request
            )
        taken = sorted({"agent", "target"} & set(request))
        if taken:
            raise InvalidArgumentError(where, "request", "no 'agent' or 'target' field", taken)
        v.non_empty_str(where, "target", target, optional=True)
        if self._agent_id is None:
            await self.get()
        body: Json = {**request, "agent": self._agent_id}
        if target is not None:
            body["target"] = target
        _, answer = await self.connection.wire.call("POST", "/gateway/query", body=body, retry=True)
        return answer

    # --- turns ----------------------------------------------------------------------------------

    def turn(self, prompt: str) -> TurnScope:
        """``async with handle.turn(prompt) as turn:`` -- a turn begun on entry (as
        :meth:`begin`) and ended on exit: done when the block ends normally (with
        ``turn.output`` and what ``turn.record`` counted), failed when it raises (the
        exception's code and message; it then propagates as it was) or is cancelled (code
        ``cancelled``; ``CancelledError`` propagates untouched). See :class:`TurnScope`."""
        v.non_empty_str("AgentHandle.turn", "prompt", prompt)
        return TurnScope(lambda: self.begin(prompt))

    async def begin(self, prompt: str) -> Turn:
        """Begin a turn with ``prompt`` (``POST /agents/{id}/turns``) and answer it; end it
        with :meth:`Turn.end` or :meth:`Turn.fail`. Raises :class:`TurnRefusedError` when
        the daemon refuses (``agent_busy``, ``agent_held``, ``agent_not_live``,
        ``agent_paused``, ``budget_exhausted``, ``not_external``), with its code."""
        v.non_empty_str("AgentHandle.begin", "prompt", prompt)
        try:
            _, begun = await self.connection.wire.call(
                "POST", f"{self._path}/turns", body={"prompt": prompt}
            )
        except DaemonRefusedError as exc:
            raise TurnRefusedError(
                exc.code,
                exc.message,
                status=exc.status,
                retryable=exc.retryable,
                details=exc.details,
            ) from None
        return Turn(self.id, prompt, begun, self._end)

    async def _end(self, turn: int, body: Json) -> Json:
        # An end is idempotent (the daemon answers how the turn was settled): sent again
        # while the daemon is away or still settling it -- not when cancelled, which must
        # be quick.
        cancelled = body.get("error", {}).get("code") == CANCELLED
        _, ended = await self.connection.wire.call(
            "POST",
            f"{self._path}/turns/{turn}/end",
            body=body,
            retry=not cancelled,
            retry_codes=frozenset({"turn_not_open"}),
        )
        return ended


def _result(verdict: Json) -> GuardrailResult:
    """The daemon's verdict as a guardrail result (an unknown one blocks)."""
    reason = verdict.get("reason") if isinstance(verdict.get("reason"), str) else None
    warnings = tuple(
        GuardrailWarning(str(w.get("rule") or "daemon"), str(w["reason"]))
        for w in verdict.get("warnings") or ()
        if isinstance(w, dict) and w.get("reason")
    )
    outcome = verdict.get("verdict")
    if outcome == "allowed":
        if warnings:
            return GuardrailResult(True, reason or warnings[-1].reason, Severity.WARNING, warnings)
        return GuardrailResult(True, reason) if reason else GuardrailResult.allow()
    if outcome == "blocked":
        return GuardrailResult(False, reason or "blocked by the daemon's rules", warnings=warnings)
    shown = json.dumps(verdict, default=str)[:200]
    return GuardrailResult.blocked(f"the daemon answered no verdict ({shown}), so refused")


def _plain(value: Any, depth: int) -> Any:
    """``value`` as plain JSON: what is not JSON (or nested too deep) as its ``repr``."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if depth >= _MAX_DEPTH:
        return repr(value)[:1000]
    if isinstance(value, Mapping):
        return {str(k): _plain(item, depth + 1) for k, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_plain(item, depth + 1) for item in value]
    return repr(value)[:1000]
