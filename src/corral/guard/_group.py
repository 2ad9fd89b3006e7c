"""``AgentGroup``: the named set of agents a supervisor answers for, keyed by agent id."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from typing import Any

from corral.kernel import InvalidArgumentError, UnknownAgentError
from corral.kernel import _validate as v


class AgentGroup:
    """Agents by id, safe to use from several threads and tasks at once.

    Members are arbitrary objects (``None`` is refused, so ``get`` can answer ``None`` for an
    absent id). Ids are non-empty strings; ``add`` refuses an id already present, ``remove``
    of an absent id does nothing. ``ids()`` lists members in the order they joined.
    """

    __slots__ = ("_lock", "_members", "_name")

    def __init__(self, name: str, members: Mapping[str, object] | None = None) -> None:
        v.non_empty_str("AgentGroup", "name", name)
        if members is not None:
            v.instance_of("AgentGroup", "members", members, Mapping)
        self._name = name
        self._lock = threading.Lock()
        self._members: dict[str, object] = {}
        for agent_id, agent in (members or {}).items():
            self.add(agent_id, agent)

    @property
    def name(self) -> str:
        return self._name

    def add(self, agent_id: str, agent: object) -> None:
        """Add ``agent`` under ``agent_id``.

        Raises ``InvalidArgumentError`` for an empty id, a ``None`` agent, or an id that is
        already a member (remove it first to replace it).
        """
        v.non_empty_str("AgentGroup.add", "agent_id", agent_id)
        if agent is None:
            raise InvalidArgumentError(
                "AgentGroup.add", "agent", "an agent object, not None", agent
            )
        with self._lock:
            if agent_id in self._members:
                raise InvalidArgumentError(
                    "AgentGroup.add",
                    "agent_id",
                    f"an id not already in group {self._name!r}",
                    agent_id,
                )
            self._members[agent_id] = agent

    def remove(self, agent_id: str) -> object | None:
        """Remove the member ``agent_id`` and return it; ``None`` when it was not a member.

        Raises ``InvalidArgumentError`` when ``agent_id`` is not a non-empty string.
        """
        v.non_empty_str("AgentGroup.remove", "agent_id", agent_id)
        with self._lock:
            return self._members.pop(agent_id, None)

    def get(self, agent_id: str) -> object | None:
        """The member ``agent_id``, or ``None`` when there is none.

        Raises ``InvalidArgumentError`` when ``agent_id`` is not a non-empty string.
        """
        v.non_empty_str("AgentGroup.get", "agent_id", agent_id)
        return self._members.get(agent_id)

    def require(self, agent_id: str) -> object:
        """The member ``agent_id``; raises :class:`UnknownAgentError` when there is none.

        Raises ``InvalidArgumentError`` when ``agent_id`` is not a non-empty string.
        """
        v.non_empty_str("AgentGroup.require", "agent_id", agent_id)
        agent = self._members.get(agent_id)
        if agent is None:
            raise unknown_member(agent_id, self._name, len(self._members))
        return agent

    def ids(self) -> list[str]:
        """A snapshot of the member ids, in the order they joined."""
        with self._lock:
            return list(self._members)

    def __contains__(self, agent_id: Any) -> bool:
        return isinstance(agent_id, str) and agent_id in self._members

    def __len__(self) -> int:
        return len(self._members)

    def __iter__(self) -> Iterator[str]:
        return iter(self.ids())

    def __repr__(self) -> str:
        return f"AgentGroup(name={self._name!r}, members={len(self._members)})"


def unknown_member(agent_id: str, group: str, members: int) -> UnknownAgentError:
    """The error for an id that is not a member of ``group``."""
    return UnknownAgentError(
        agent_id,
        f"agent {agent_id!r} is not a member of group {group!r} ({members} members)",
        group=group,
        members=members,
    )
