"""Conversation history keyed by session id, and the agent context built on it."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from corral.kernel import ChatMessage, CompactionStrategy, HistoryRetention
from corral.kernel import _validate as v
from corral.runtime._compaction import sequence_of


@runtime_checkable
class HistoryStore(Protocol):
    """Where conversation history lives, keyed by session id across runs.

    - ``append`` adds messages to a session, tagged with the run that wrote them and their
      retention: ``NONE`` stores nothing, ``RUN`` keeps them until ``end_run(run_id)``,
      ``PERMANENT`` keeps them.
    - ``load`` returns a session's stored messages in append order (empty for an unknown
      session).
    - ``end_run`` deletes every ``RUN`` message written by that run, in every session;
      idempotent.
    """

    async def append(
        self,
        session_id: str,
        messages: Sequence[ChatMessage],
        *,
        run_id: str,
        retention: HistoryRetention,
    ) -> None: ...

    async def load(self, session_id: str) -> list[ChatMessage]: ...

    async def end_run(self, run_id: str) -> None: ...


@dataclass(frozen=True, slots=True)
class _Entry:
    message: ChatMessage
    run_id: str
    retention: HistoryRetention


class InMemoryHistoryStore:
    """A :class:`HistoryStore` in process memory; thread-safe; lost when the process ends.

    Raises :class:`InvalidArgumentError` for an empty session or run id, a retention that is
    not a :class:`HistoryRetention`, or messages that are not ChatMessages.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sessions: dict[str, list[_Entry]] = {}
        self._run_sessions: dict[str, set[str]] = {}

    async def append(
        self,
        session_id: str,
        messages: Sequence[ChatMessage],
        *,
        run_id: str,
        retention: HistoryRetention,
    ) -> None:
        where = "InMemoryHistoryStore.append"
        v.non_empty_str(where, "session_id", session_id)
        v.non_empty_str(where, "run_id", run_id)
        v.instance_of(where, "retention", retention, HistoryRetention)
        checked = sequence_of(where, "messages", messages, ChatMessage)
        if retention is HistoryRetention.NONE or not checked:
            return
        entries = [_Entry(m, run_id, retention) for m in checked]
        with self._lock:
            self._sessions.setdefault(session_id, []).extend(entries)
            if retention is HistoryRetention.RUN:
                self._run_sessions.setdefault(run_id, set()).add(session_id)

    async def load(self, session_id: str) -> list[ChatMessage]:
        v.non_empty_str("InMemoryHistoryStore.load", "session_id", session_id)
        with self._lock:
            return [entry.message for entry in self._sessions.get(session_id, ())]

    async def end_run(self, run_id: str) -> None:
        v.non_empty_str("InMemoryHistoryStore.end_run", "run_id", run_id)
        with self._lock:
            for session_id in self._run_sessions.pop(run_id, set()):
                kept = [
                    e
                    for e in self._sessions.get(session_id, ())
                    if not (e.run_id == run_id and e.retention is HistoryRetention.RUN)
                ]
                if kept:
                    self._sessions[session_id] = kept
                else:
                    self._sessions.pop(session_id, None)

    def sessions(self) -> list[str]:
        """The ids of the sessions that hold messages."""
        with self._lock:
            return sorted(self._sessions)


class AgentContext:
    """An agent's view of its history (implements :class:`corral.kernel.AgentContextProtocol`).

    :meth:`get_prompt_window` loads the session from ``store`` and returns it through
    ``compaction`` (the whole history when there is none). Store and compaction errors
    propagate.
    """

    def __init__(
        self,
        agent_id: str,
        store: HistoryStore,
        compaction: CompactionStrategy | None = None,
    ) -> None:
        v.non_empty_str("AgentContext", "agent_id", agent_id)
        v.instance_of("AgentContext", "store", store, HistoryStore)
        if compaction is not None:
            v.instance_of(
                "AgentContext",
                "compaction",
                compaction,
                CompactionStrategy,
            )
        self._agent_id = agent_id
        self.store = store
        self.compaction = compaction

    @property
    def agent_id(self) -> str:
        return self._agent_id

    def __repr__(self) -> str:
        return f"AgentContext(agent_id={self._agent_id!r}, compaction={self.compaction!r})"

    async def get_prompt_window(self, session_id: str) -> list[ChatMessage]:
        v.non_empty_str("AgentContext.get_prompt_window", "session_id", session_id)
        history = list(await self.store.load(session_id))
        if self.compaction is None:
            return history
        return list(await self.compaction.compact(history))
