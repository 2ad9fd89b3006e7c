"""Turn records: each turn of an agent as a record, with its output and log, kept in the store.

:class:`TurnBook` follows the committed events (:meth:`TurnBook.observe`, called by the
service after each commit): ``agent.turn_started`` opens a record (written at once, outcome
``running``), ``agent.turn_completed`` / ``turn_failed`` / ``turn_interrupted`` close it
(outcome ``succeeded``, ``failed`` or ``interrupted``; a turn cut short by a daemon restart is
``interrupted``, though the events also count it as failed). While the turn runs its harness
writes to the open record's :class:`~._turn_log.TurnLog` (:meth:`TurnBook.sink`); the log
and the output are written with the closed record.

A record (``GET /agents/{id}/turns``)::

    {"agentId", "turn", "prompt", "promptChars", "startedAt", "endedAt", "outcome", "error",
     "usage": {"tokens", "costUsd"} | None, "outputBytes", "logBytes", "droppedBytes",
     "retry", "restart", "woken"}

``prompt`` is the turn's prompt up to :data:`PROMPT_CHARS` characters (``promptChars`` is its
length); ``outputBytes`` the size of the output kept, ``logBytes`` of the log kept and
``droppedBytes`` what the cap dropped of it. One turn (``GET /agents/{id}/turns/{n}``) adds
``output`` (up to the cap, then a marker) and ``logs`` (entries ``{"stream", "text"}``).

The log of a turn that was running when the daemon died is lost (it is kept in memory until
the turn ends); its record says ``interrupted``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from corral.daemon import _events as ev
from corral.daemon._events import Event
from corral.daemon._state import ENDED_STATES
from corral.daemon._turn_log import DEFAULT_TURN_LOG_BYTES, LogFanout, TurnLog
from corral.daemon.stores._turns import TurnStore, turns_of

__all__ = ["DEFAULT_TURN_LOG_BYTES", "OUTCOMES", "PROMPT_CHARS", "TurnBook", "clip_output"]

logger = logging.getLogger("corral.daemon")

Json = dict[str, Any]

PROMPT_CHARS = 4096
"""A turn record keeps this many characters of its prompt."""

OUTCOMES = ("running", "succeeded", "failed", "interrupted")


def clip_output(text: str, cap: int) -> str:
    """``text`` up to ``cap`` bytes of UTF-8, then a line saying how many more were dropped."""
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) <= cap:
        return text
    kept = raw[:cap].decode("utf-8", errors="ignore")
    dropped = len(raw) - len(kept.encode("utf-8", "surrogatepass"))
    return kept + f"\n[corral: output capped at {cap} bytes: dropped {dropped} more bytes]\n"


@dataclass(slots=True)
class _Open:
    record: Json
    log: TurnLog
    loaded: bool  # the record came from a turn_started this process saw


class TurnBook:
    """The turn records of every agent (see the module docstring)."""

    def __init__(
        self,
        store: object,
        *,
        cap: int = DEFAULT_TURN_LOG_BYTES,
        fanout: LogFanout | None = None,
    ) -> None:
        self.table: TurnStore = turns_of(store)
        self.cap = cap
        self.fanout = fanout if fanout is not None else LogFanout()
        self._open: dict[str, _Open] = {}

    # --- writing ------------------------------------------------------------------------------

    def sink(self, agent_id: str, turn: int) -> TurnLog:
        """The log turn ``turn`` of the agent writes to (its harness's output goes there)."""
        found = self._open.get(agent_id)
        if found is None or found.record["turn"] != turn:
            # A turn this process did not see start (taken up after a restart).
            record = {"agentId": agent_id, "turn": turn, "outcome": "running"}
            found = _Open(record, self._new_log(agent_id, turn), loaded=False)
            self._open[agent_id] = found
        return found.log

    async def observe(self, written: Sequence[Event]) -> None:
        """Follow committed events: open, close and write turn records. Never raises: a
        record that cannot be written is logged (the events are what counts)."""
        closed: dict[tuple[str, int], tuple[Json, TurnLog, str | None]] = {}
        for event in written:
            agent_id = event.agent_id
            if agent_id is None:
                continue
            kind = event.type
            if kind == ev.TURN_STARTED:
                await self._started(agent_id, event)
            elif kind in (ev.TURN_COMPLETED, ev.TURN_FAILED, ev.TURN_INTERRUPTED):
                turn = event.data.get("turn")
                if not isinstance(turn, int):
                    continue
                key = (agent_id, turn)
                if key in closed:
                    # Interrupted, then counted as failed (a restart): interrupted it stays.
                    continue
                record, log = await self._close(agent_id, turn)
                output = self._end(record, log, event)
                closed[key] = (record, log, output)
                await self._save(record, log, output)
                self.fanout.publish(
                    agent_id, {"turn": turn, "event": "ended", "outcome": record["outcome"]}
                )
            elif kind == ev.STATE_CHANGED and event.data.get("to") in ENDED_STATES:
                self.fanout.end(agent_id)

    async def _started(self, agent_id: str, event: Event) -> None:
        data = event.data
        turn = data.get("turn")
        if not isinstance(turn, int):
            return
        prompt = str(data.get("text") or data.get("prompt") or "")
        record: Json = {
            "agentId": agent_id,
            "turn": turn,
            "prompt": prompt[:PROMPT_CHARS],
            "promptChars": len(prompt),
            "startedAt": event.ts,
            "endedAt": None,
            "outcome": "running",
            "error": None,
            "usage": None,
            "outputBytes": 0,
            "logBytes": 0,
            "droppedBytes": 0,
        }
        for flag in ("retry", "restart", "woken"):
            record[flag] = bool(data.get(flag, False))
        previous = self._open.get(agent_id)
        if previous is not None:
            previous.log.close()  # a turn never closed (it should not happen): let it go
        self._open[agent_id] = _Open(record, self._new_log(agent_id, turn), loaded=True)
        self.fanout.publish(agent_id, {"turn": turn, "event": "started"})
        await self._save(record, None, None)

    async def _close(self, agent_id: str, turn: int) -> tuple[Json, TurnLog]:
        found = self._open.get(agent_id)
        if found is None or found.record["turn"] != turn:
            # Started before this process (a restart): the record is the stored one.
            return await self._stored(agent_id, turn), self._new_log(agent_id, turn)
        del self._open[agent_id]
        if not found.loaded:
            return await self._stored(agent_id, turn), found.log
        return found.record, found.log

    async def _stored(self, agent_id: str, turn: int) -> Json:
        try:
            found = await self.table.get_turn(agent_id, turn)
        except Exception:
            found = None
        if found is not None:
            return found[0]
        return {"agentId": agent_id, "turn": turn, "startedAt": None, "outcome": "running"}

    def _end(self, record: Json, log: TurnLog, event: Event) -> str | None:
        data = event.data
        log.close()
        output: str | None = None
        if event.type == ev.TURN_COMPLETED:
            record["outcome"] = "succeeded"
            output = clip_output(str(data.get("output") or ""), self.cap)
        elif event.type == ev.TURN_FAILED:
            record["outcome"] = "failed"
            record["error"] = data.get("error")
        else:
            record["outcome"] = "interrupted"
            record["error"] = data.get("reason")
        usage = data.get("usage")
        record["usage"] = dict(usage) if isinstance(usage, dict) else None
        record["endedAt"] = event.ts
        record["outputBytes"] = 0 if output is None else len(output.encode("utf-8", "replace"))
        record["logBytes"] = log.kept
        record["droppedBytes"] = log.dropped
        return output

    async def _save(self, record: Json, log: TurnLog | None, output: str | None) -> None:
        detail = {"output": output, "logs": [] if log is None else log.snapshot()}
        try:
            await self.table.save_turn(record, detail)
        except Exception as exc:
            logger.warning(
                "agent %s: turn %s's record not written: %s", record["agentId"], record["turn"], exc
            )

    def _new_log(self, agent_id: str, turn: int) -> TurnLog:
        return TurnLog(agent_id, turn, self.cap, self.fanout)

    def close(self) -> None:
        """End every follower (the daemon shuts down)."""
        self.fanout.close()

    # --- reading ------------------------------------------------------------------------------

    def live(self, agent_id: str) -> tuple[Json, TurnLog] | None:
        """The agent's running turn, as this process sees it."""
        found = self._open.get(agent_id)
        return None if found is None else (found.record, found.log)

    async def list(
        self, agent_id: str, *, before: int | None = None, limit: int = 50
    ) -> list[Json]:
        """The agent's turn records, newest first (the running one as it is now)."""
        records = await self.table.list_turns(agent_id, before=before, limit=limit)
        live = self.live(agent_id)
        if live is not None:
            record, log = live
            for i, found in enumerate(records):
                if found.get("turn") == record["turn"]:
                    records[i] = {
                        **found,
                        **record,
                        "logBytes": log.kept,
                        "droppedBytes": log.dropped,
                    }
        return records

    async def get(self, agent_id: str, turn: int) -> Json | None:
        """Turn ``turn`` with its ``output`` and ``logs`` (a running turn's log so far)."""
        live = self.live(agent_id)
        if live is not None and live[0]["turn"] == turn:
            record, log = live
            stored = await self.table.get_turn(agent_id, turn)
            base = {} if stored is None else stored[0]
            return {
                **base,
                **record,
                "logBytes": log.kept,
                "droppedBytes": log.dropped,
                "output": None,
                "logs": log.snapshot(),
            }
        found = await self.table.get_turn(agent_id, turn)
        if found is None:
            return None
        record, detail = found
        return {**record, "output": detail.get("output"), "logs": detail.get("logs") or []}

    async def delete(self, agent_id: str) -> int:
        """Forget the agent's turns: its records and logs in the store, its followers."""
        found = self._open.pop(agent_id, None)
        if found is not None:
            found.log.close()
        self.fanout.end(agent_id)
        return await self.table.delete_turns(agent_id)
