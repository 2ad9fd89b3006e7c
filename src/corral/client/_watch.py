"""Watching the daemon end an agent: its event stream (``GET /events?agent=ID``, server-sent
events), read until the agent is stopped or fails, then a ``Cancellation`` cancelled."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any
from urllib.parse import quote

import httpx

from corral.client._errors import DaemonRefusedError, DaemonUnreachableError
from corral.client._wire import Wire, refusal
from corral.runtime import Cancellation

logger = logging.getLogger("corral.client")

ENDED = frozenset({"stopped", "failed"})
READ_S = 90.0
"""A stream silent for longer (the daemon sends a heartbeat every 15 s) is opened again."""
_AGAIN_FIRST_S = 0.5  # then doubling, up to _AGAIN_MAX_S between tries
_AGAIN_MAX_S = 10.0


def reason_of(agent_id: str, record: dict[str, Any]) -> str:
    """Why the agent's cancellation was cancelled: the daemon ended it (``record``: its
    state change, or its record)."""
    state = record.get("to") or record.get("state")
    detail = record.get("why") or record.get("error") or record.get("reason")
    by = record.get("by")
    what = f"was stopped{f' by {by}' if by else ''}" if state == "stopped" else "failed"
    return f"agent {agent_id} {what} in the daemon" + (f": {detail}" if detail else "")


async def watch(wire: Wire, agent_ref: str, cancellation: Cancellation) -> None:
    """Cancel ``cancellation`` once the daemon has ended agent ``agent_ref`` (stopped,
    failed); it ends then, or when cancelled. A daemon away or refusing is asked again (with a
    growing pause) for as long as it runs: the watch never raises."""
    delay_s = _AGAIN_FIRST_S
    path = f"/agents/{quote(agent_ref, safe='')}"
    while not cancellation.is_cancelled:
        try:
            # Where the log is now, then the agent's state: what happens after that seq
            # comes by the stream, what happened before is in the state.
            params = {"format": "json", "limit": "1", "agent": agent_ref}
            _, page = await wire.call("GET", "/events", params=params)
            after = int(page.get("lastSeq", 0))
            _, record = await wire.call("GET", path)
            agent_id = str(record["id"])
            if record.get("state") in ENDED:
                cancellation.cancel(reason_of(agent_id, record))
                return
            ended = await _follow(wire, agent_id, after)
            if ended is not None:
                cancellation.cancel(reason_of(agent_id, ended))
                return
            delay_s = _AGAIN_FIRST_S  # the stream ended cleanly: open it again
        except (DaemonRefusedError, DaemonUnreachableError, httpx.HTTPError, ValueError) as exc:
            if (
                isinstance(exc, DaemonRefusedError)
                and not exc.retryable
                and exc.status in (401, 403, 404)
            ):
                # Nothing to watch with this token: no cancellation will come from here.
                logger.warning("agent %s: cannot watch for its end: %s", agent_ref, exc)
                return
            logger.info("agent %s: watching its end: %s; again in %g s", agent_ref, exc, delay_s)
            await wire.clock.sleep(delay_s)
            delay_s = min(delay_s * 2, _AGAIN_MAX_S)


async def _follow(wire: Wire, agent_id: str, after: int) -> dict[str, Any] | None:
    """The agent's ``agent.state_changed`` event that ends it, read from its stream after
    ``after``; None when the stream ends first."""
    params = {"agent": agent_id, "after": str(after), "type": "agent.state_changed"}
    timeout = httpx.Timeout(wire.timeout_s, read=READ_S)
    async with wire.http.stream("GET", "/events", params=params, timeout=timeout) as answer:
        if answer.status_code >= 400:
            text = (await answer.aread()).decode(errors="replace")
            try:
                data = json.loads(text)
            except ValueError:
                data = None
            raise refusal(answer.status_code, data, text)
        data_lines: list[str] = []
        async for line in answer.aiter_lines():
            if line.startswith("data:"):
                data_lines.append(line[5:].lstrip())
                continue
            if line or not data_lines:
                continue  # event:, id:, comments (heartbeats); or a blank line between them
            event = json.loads("\n".join(data_lines))
            data_lines = []
            data = event.get("data") if isinstance(event, dict) else None
            if isinstance(data, dict) and data.get("to") in ENDED:
                return data
        return None


def start(wire: Wire, agent_ref: str, cancellation: Cancellation) -> asyncio.Task[None]:
    """Run :func:`watch` on a task of its own (the caller cancels it when done)."""
    return asyncio.ensure_future(watch(wire, agent_ref, cancellation))
