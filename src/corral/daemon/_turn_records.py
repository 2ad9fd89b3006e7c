"""Turn records: each turn of an agent as a record, with its output and log, kept in the store.

:class:`TurnBook` drafts the records of the events the service is about to append
(:meth:`TurnBook.draft`), which the store writes in the same transaction as the events
(``Store.append(..., turns=)``: a record never commits without its events, nor they without
it), and follows them once committed (:meth:`TurnBook.committed`): ``agent.turn_started``
opens a record (outcome ``running``), ``agent.turn_completed`` / ``turn_failed`` /
``turn_interrupted`` close it (outcome ``succeeded``, ``failed`` or ``interrupted``; a turn
cut short by a daemon restart is ``interrupted``, though the events also count it as
failed). While the turn runs its harness
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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from corral.daemon import _events as ev
from corral.daemon._events import Event, NewEvent
from corral.daemon._state import ENDED_STATES
from corral.daemon._turn_log import DEFAULT_TURN_LOG_BYTES, LogFanout, TurnLog
from corral.daemon.stores._turns import TurnRow, TurnStore, turns_of

__all__ = [
    "DEFAULT_TURN_LOG_BYTES",
    "OUTCOMES",
    "PROMPT_CHARS",
    "TurnBook",
    "TurnDraft",
    "clip_output",
]

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


@dataclass(frozen=True, slots=True)
class _Step:
    """One thing a drafted append does to turn records: the event at ``index`` opens
    (``started``) or closes (``ended``) ``record`` (``log`` its log, ``detail`` the row's
    ``{"output", "logs"}``), or ends the agent (``gone``: its followers end)."""

    index: int
    kind: str
    record: Json
    log: TurnLog | None
    detail: Json | None


@dataclass(frozen=True, slots=True)
class TurnDraft:
    """The turn records an append makes (:meth:`TurnBook.draft`)."""

    steps: list[_Step]

    def rows(self, written: Sequence[Event]) -> list[TurnRow]:
        """The rows ``(record, detail)`` to write with ``written`` (the drafted events, now
        numbered, in order): each record takes its event's ``ts``. Pure: a store may call it
        again when it plans the append again."""
        rows: list[TurnRow] = []
        for step in self.steps:
            if step.detail is None:
                continue
            field = "startedAt" if step.kind == "started" else "endedAt"
            rows.append(({**step.record, field: written[step.index].ts}, step.detail))
        return rows


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
        self._store = store
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

    @property
    def in_store(self) -> bool:
        """Whether the records go to the store's turn tables, in the transaction of the
        events that make them (``Store.append(..., turns=)``); otherwise to memory."""
        return self.table is self._store

    async def draft(self, events: Sequence[NewEvent]) -> TurnDraft | None:
        """What ``events``, about to be appended, do to turn records: None when nothing.

        The rows are made from the events once numbered (:meth:`TurnDraft.rows`, the
        ``turns`` of ``Store.append``), so they commit with the events or not at all; the
        book itself changes only when they have committed (:meth:`committed`). A closed
        turn's log is closed and taken here: the turn is over."""
        steps: list[_Step] = []
        opened: dict[str, tuple[Json, TurnLog]] = {}
        closed: set[tuple[str, int]] = set()
        for i, event in enumerate(events):
            agent_id = event.agent_id
            if agent_id is None:
                continue
            kind = event.type
            turn = event.data.get("turn")
            if kind == ev.TURN_STARTED:
                if not isinstance(turn, int):
                    continue
                record = self._started(agent_id, turn, event.data)
                log = self._new_log(agent_id, turn)
                opened[agent_id] = (record, log)
                steps.append(_Step(i, "started", record, log, {"output": None, "logs": []}))
            elif kind in (ev.TURN_COMPLETED, ev.TURN_FAILED, ev.TURN_INTERRUPTED):
                if not isinstance(turn, int) or (agent_id, turn) in closed:
                    # Interrupted, then counted as failed (a restart): interrupted it stays.
                    continue
                closed.add((agent_id, turn))
                found = opened.get(agent_id)
                if found is not None and found[0]["turn"] == turn:
                    record, log = dict(found[0]), found[1]
                else:
                    record, log = await self._open_record(agent_id, turn)
                output = self._end(record, log, event)
                detail = {"output": output, "logs": log.snapshot()}
                steps.append(_Step(i, "ended", record, log, detail))
            elif kind == ev.STATE_CHANGED and event.data.get("to") in ENDED_STATES:
                steps.append(_Step(i, "gone", {"agentId": agent_id}, None, None))
        return TurnDraft(steps) if steps else None

    async def committed(self, draft: TurnDraft | None, written: Sequence[Event]) -> None:
        """The events ``draft`` was made of have committed (as ``written``): open and close
        the book's records, tell the log followers, and write the records to memory when the
        store keeps none. Never raises for a record (the events are what counts)."""
        if draft is None:
            return
        rows = draft.rows(written) if not self.in_store else []
        for step in draft.steps:
            agent_id = str(step.record["agentId"])
            if step.kind == "started":
                record = {**step.record, "startedAt": written[step.index].ts}
                previous = self._open.get(agent_id)
                if previous is not None and previous.log is not step.log:
                    previous.log.close()  # a turn never closed (it should not happen)
                assert step.log is not None  # a started step has its log
                self._open[agent_id] = _Open(record, step.log, loaded=True)
                self.fanout.publish(agent_id, {"turn": record["turn"], "event": "started"})
            elif step.kind == "ended":
                turn = step.record["turn"]
                found = self._open.get(agent_id)
                if found is not None and found.record["turn"] == turn:
                    del self._open[agent_id]
                outcome = step.record["outcome"]
                self.fanout.publish(agent_id, {"turn": turn, "event": "ended", "outcome": outcome})
            else:
                self.fanout.end(agent_id)
        for record, detail in rows:  # a store without turn tables: kept in memory
            try:
                await self.table.save_turn(record, detail)
            except Exception as exc:
                logger.warning(
                    "agent %s: turn %s's record not written: %s",
                    record["agentId"],
                    record["turn"],
                    exc,
                )

    @staticmethod
    def _started(agent_id: str, turn: int, data: Mapping[str, Any]) -> Json:
        prompt = str(data.get("text") or data.get("prompt") or "")
        record: Json = {
            "agentId": agent_id,
            "turn": turn,
            "prompt": prompt[:PROMPT_CHARS],
            "promptChars": len(prompt),
            "startedAt": None,  # the event's ts, once numbered
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
        return record

    async def _open_record(self, agent_id: str, turn: int) -> tuple[Json, TurnLog]:
        """The record and log of the agent's turn ``turn``, as the book has them (a copy), or
        the stored record for a turn started before this process (a restart)."""
        found = self._open.get(agent_id)
        if found is None or found.record["turn"] != turn:
            return await self._stored(agent_id, turn), self._new_log(agent_id, turn)
        if not found.loaded:
            return await self._stored(agent_id, turn), found.log
        return dict(found.record), found.log

    async def _stored(self, agent_id: str, turn: int) -> Json:
        try:
            found = await self.table.get_turn(agent_id, turn)
        except Exception:
            found = None
        if found is not None:
            return found[0]
        return {"agentId": agent_id, "turn": turn, "startedAt": None, "outcome": "running"}

    def _end(self, record: Json, log: TurnLog, event: NewEvent) -> str | None:
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
        record["outputBytes"] = 0 if output is None else len(output.encode("utf-8", "replace"))
        record["logBytes"] = log.kept
        record["droppedBytes"] = log.dropped
        return output

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
