"""``EpisodicMemory``: a bounded log of what agents did, queried newest first."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Any

from corral.kernel import SYSTEM_CLOCK, Clock, InvalidArgumentError
from corral.kernel import _validate as v


@dataclass(frozen=True, slots=True, kw_only=True)
class Episode:
    """One thing an agent did: which task, what kind, how it ended, when.

    ``metadata`` is copied into a read-only mapping with string keys; ``timestamp`` is an aware
    datetime. The identifying strings must be non-empty.
    """

    task_id: str
    agent_id: str
    task_type: str
    outcome: str
    metadata: Mapping[str, Any] = field(default_factory=dict, hash=False)
    timestamp: datetime

    def __post_init__(self) -> None:
        for name in ("task_id", "agent_id", "task_type", "outcome"):
            v.non_empty_str("Episode", name, getattr(self, name))
        v.instance_of("Episode", "metadata", self.metadata, Mapping)
        for key in self.metadata:
            if not isinstance(key, str):
                raise InvalidArgumentError(
                    "Episode", "metadata", "a mapping with string keys", self.metadata
                )
        v.aware_datetime("Episode", "timestamp", self.timestamp)
        object.__setattr__(self, "metadata", MappingProxyType(dict(self.metadata)))

    @classmethod
    def of(
        cls,
        task_id: str,
        agent_id: str,
        task_type: str,
        outcome: str,
        metadata: Mapping[str, Any] | None = None,
        *,
        clock: Clock = SYSTEM_CLOCK,
    ) -> Episode:
        """An episode stamped with ``clock.now()``."""
        return cls(
            task_id=task_id,
            agent_id=agent_id,
            task_type=task_type,
            outcome=outcome,
            metadata={} if metadata is None else metadata,
            timestamp=clock.now(),
        )

    def __getstate__(self) -> dict[str, Any]:
        # A mappingproxy does not pickle; the episode travels with a plain dict.
        return {
            "task_id": self.task_id,
            "agent_id": self.agent_id,
            "task_type": self.task_type,
            "outcome": self.outcome,
            "metadata": dict(self.metadata),
            "timestamp": self.timestamp,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "metadata", MappingProxyType(dict(state["metadata"])))


class EpisodicMemory:
    """A bounded, thread-safe log of :class:`Episode` records.

    :meth:`record` appends; once ``max_episodes`` are held, recording drops the oldest. The
    queries return at most ``limit`` matching episodes, the most recently recorded first:

    - :meth:`query_similar`: the episode's task type contains ``task_type``, ignoring case;
    - :meth:`query_by_agent`: the agent id equals ``agent_id`` exactly;
    - :meth:`query_by_outcome`: the outcome equals ``outcome``, ignoring case.
    """

    __slots__ = ("_episodes", "_lock", "_max")

    def __init__(self, max_episodes: int = 1000) -> None:
        v.positive_int("EpisodicMemory", "max_episodes", max_episodes)
        self._max = max_episodes
        self._episodes: deque[Episode] = deque(maxlen=max_episodes)
        self._lock = threading.Lock()

    @property
    def max_episodes(self) -> int:
        return self._max

    def record(self, episode: Episode) -> None:
        """Append ``episode``, dropping the oldest one when the log is full."""
        v.instance_of("EpisodicMemory.record", "episode", episode, Episode)
        with self._lock:
            self._episodes.append(episode)

    def query_similar(self, task_type: str, limit: int = 10) -> list[Episode]:
        """Episodes whose task type contains ``task_type``, ignoring case; newest first."""
        v.non_empty_str("EpisodicMemory.query_similar", "task_type", task_type)
        wanted = task_type.casefold()
        return self._query("query_similar", limit, lambda e: wanted in e.task_type.casefold())

    def query_by_agent(self, agent_id: str, limit: int = 10) -> list[Episode]:
        """Episodes of ``agent_id``; newest first."""
        v.non_empty_str("EpisodicMemory.query_by_agent", "agent_id", agent_id)
        return self._query("query_by_agent", limit, lambda e: e.agent_id == agent_id)

    def query_by_outcome(self, outcome: str, limit: int = 10) -> list[Episode]:
        """Episodes whose outcome equals ``outcome``, ignoring case; newest first."""
        v.non_empty_str("EpisodicMemory.query_by_outcome", "outcome", outcome)
        wanted = outcome.casefold()
        return self._query("query_by_outcome", limit, lambda e: e.outcome.casefold() == wanted)

    def episodes(self) -> list[Episode]:
        """Every episode held, oldest first."""
        with self._lock:
            return list(self._episodes)

    def clear(self) -> None:
        with self._lock:
            self._episodes.clear()

    def __len__(self) -> int:
        return len(self._episodes)

    def _query(
        self, operation: str, limit: int, matches: Callable[[Episode], bool]
    ) -> list[Episode]:
        v.positive_int(f"EpisodicMemory.{operation}", "limit", limit)
        with self._lock:
            snapshot = list(self._episodes)
        found: list[Episode] = []
        for episode in reversed(snapshot):
            if matches(episode):
                found.append(episode)
                if len(found) == limit:
                    break
        return found

    def __repr__(self) -> str:
        return f"EpisodicMemory({len(self._episodes)} of {self._max} episodes)"
