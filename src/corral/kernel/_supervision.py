"""The org chart of a run (``Supervision``) and its two budgets."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from typing import Any

from corral.kernel import _validate as v
from corral.kernel._errors import InvalidArgumentError


class Priority(IntEnum):
    """Weight of a branch: decides who may pause whom when the headcount cap is reached."""

    BACKGROUND = 0
    LOW = 1
    NORMAL = 2
    HIGH = 4
    CRITICAL = 8


class HistoryRetention(StrEnum):
    """How long an agent's conversation history is kept after its run ends."""

    NONE = "none"
    RUN = "run"
    PERMANENT = "permanent"


@dataclass(frozen=True, slots=True, kw_only=True)
class SpawnBudget:
    """The headcount cap of a whole run; the root agent counts as one.

    One instance is shared by every node of a supervision tree, so the cap is global to the
    run. ``allow_preempt`` lets HIGH and CRITICAL agents pause a lower-priority one to take its
    slot instead of being refused.
    """

    max_agents: int = 50
    allow_preempt: bool = True

    def __post_init__(self) -> None:
        v.positive_int("SpawnBudget", "max_agents", self.max_agents)
        v.instance_of("SpawnBudget", "allow_preempt", self.allow_preempt, bool)


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutionBudget:
    """One agent's allowance. ``None`` means unlimited; negative, NaN or infinite is refused.

    Units: ``max_tokens`` prompt + completion tokens; ``max_cost_usd`` US dollars;
    ``max_turns`` model round-trips; ``deadline_s`` seconds of wall-clock time from the start
    of the run.
    """

    max_tokens: int | None = None
    max_cost_usd: float | None = None
    max_turns: int | None = None
    deadline_s: float | None = None

    def __post_init__(self) -> None:
        v.non_negative_int("ExecutionBudget", "max_tokens", self.max_tokens, optional=True)
        v.non_negative_number("ExecutionBudget", "max_cost_usd", self.max_cost_usd, optional=True)
        v.non_negative_int("ExecutionBudget", "max_turns", self.max_turns, optional=True)
        v.non_negative_number("ExecutionBudget", "deadline_s", self.deadline_s, optional=True)

    @property
    def unlimited(self) -> bool:
        """True when no dimension has a limit."""
        return (
            self.max_tokens is None
            and self.max_cost_usd is None
            and self.max_turns is None
            and self.deadline_s is None
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "max_tokens": self.max_tokens,
            "max_cost_usd": self.max_cost_usd,
            "max_turns": self.max_turns,
            "deadline_s": self.deadline_s,
        }


def new_id() -> str:
    """A fresh random id (32 hex digits)."""
    return uuid.uuid4().hex


@dataclass(frozen=True, slots=True)
class Supervision:
    """One agent's place in a run's supervision tree.

    Build it with :meth:`root` once per run and :meth:`spawn_child` for every helper; never by
    hand. ``session_id`` is the conversation (history is keyed by it, and it outlives runs);
    ``run_id`` is one execution tree. ``depth`` is informational: the only structural limit is
    the shared :class:`SpawnBudget`.
    """

    run_id: str
    session_id: str
    root_id: str
    parent_id: str | None = None
    depth: int = 0
    spawn_budget: SpawnBudget = field(default_factory=SpawnBudget)
    execution_budget: ExecutionBudget = field(default_factory=ExecutionBudget)
    retention: HistoryRetention = HistoryRetention.RUN
    priority: Priority = Priority.NORMAL

    def __post_init__(self) -> None:
        where = "Supervision"
        v.non_empty_str(where, "run_id", self.run_id)
        v.non_empty_str(where, "session_id", self.session_id)
        v.non_empty_str(where, "root_id", self.root_id)
        v.non_empty_str(where, "parent_id", self.parent_id, optional=True)
        v.non_negative_int(where, "depth", self.depth)
        if (self.parent_id is None) != (self.depth == 0):
            raise InvalidArgumentError(
                where, "parent_id", "None exactly when depth is 0", self.parent_id
            )
        v.instance_of(where, "spawn_budget", self.spawn_budget, SpawnBudget)
        v.instance_of(where, "execution_budget", self.execution_budget, ExecutionBudget)
        v.instance_of(where, "retention", self.retention, HistoryRetention)
        v.instance_of(where, "priority", self.priority, Priority)

    @classmethod
    def root(
        cls,
        agent_id: str,
        *,
        session_id: str | None = None,
        spawn_budget: SpawnBudget | None = None,
        execution_budget: ExecutionBudget | None = None,
        retention: HistoryRetention = HistoryRetention.PERMANENT,
        priority: Priority = Priority.NORMAL,
    ) -> Supervision:
        """The top of a new run: mints a run id, and a session id when none is given."""
        v.non_empty_str("Supervision.root", "agent_id", agent_id)
        return cls(
            run_id=new_id(),
            session_id=new_id() if session_id is None else session_id,
            root_id=agent_id,
            parent_id=None,
            depth=0,
            spawn_budget=SpawnBudget() if spawn_budget is None else spawn_budget,
            execution_budget=ExecutionBudget() if execution_budget is None else execution_budget,
            retention=retention,
            priority=priority,
        )

    def spawn_child(
        self,
        parent_id: str,
        *,
        retention: HistoryRetention = HistoryRetention.RUN,
        priority: Priority = Priority.NORMAL,
        execution_budget: ExecutionBudget | None = None,
    ) -> Supervision:
        """A helper's position: same run, session, root and the *same* SpawnBudget object.

        The execution budget is inherited unless one is given; depth goes up by one.
        """
        v.non_empty_str("Supervision.spawn_child", "parent_id", parent_id)
        return Supervision(
            run_id=self.run_id,
            session_id=self.session_id,
            root_id=self.root_id,
            parent_id=parent_id,
            depth=self.depth + 1,
            spawn_budget=self.spawn_budget,
            execution_budget=(
                self.execution_budget if execution_budget is None else execution_budget
            ),
            retention=retention,
            priority=priority,
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; :meth:`from_dict` reads it back."""
        return {
            "run_id": self.run_id,
            "session_id": self.session_id,
            "root_id": self.root_id,
            "parent_id": self.parent_id,
            "depth": self.depth,
            "spawn_budget": {
                "max_agents": self.spawn_budget.max_agents,
                "allow_preempt": self.spawn_budget.allow_preempt,
            },
            "execution_budget": self.execution_budget.to_dict(),
            "retention": self.retention.value,
            "priority": self.priority.name,
        }

    @classmethod
    def from_dict(cls, data: Any) -> Supervision:
        """Read a dict made by :meth:`to_dict`; raises InvalidArgumentError on bad input."""
        where = "Supervision.from_dict"
        if not isinstance(data, dict):
            raise InvalidArgumentError(where, "data", "a dict", data)
        known = {
            "run_id",
            "session_id",
            "root_id",
            "parent_id",
            "depth",
            "spawn_budget",
            "execution_budget",
            "retention",
            "priority",
        }
        unknown = sorted(set(data) - known)
        if unknown:
            raise InvalidArgumentError(where, "data", f"only the keys {sorted(known)}", unknown)
        for key in ("run_id", "session_id", "root_id"):
            if key not in data:
                raise InvalidArgumentError(where, key, "present", None)
        spawn = data.get("spawn_budget", {})
        budget = data.get("execution_budget", {})
        for key, section in (("spawn_budget", spawn), ("execution_budget", budget)):
            if not isinstance(section, dict):
                raise InvalidArgumentError(where, key, "a dict", section)
        try:
            retention = HistoryRetention(data.get("retention", HistoryRetention.RUN.value))
        except ValueError:
            raise InvalidArgumentError(
                where, "retention", "one of none, run, permanent", data.get("retention")
            ) from None
        priority_name = data.get("priority", Priority.NORMAL.name)
        if not isinstance(priority_name, str) or priority_name not in Priority.__members__:
            raise InvalidArgumentError(
                where, "priority", f"one of {list(Priority.__members__)}", priority_name
            )
        try:
            spawn_budget = SpawnBudget(**spawn)
            execution_budget = ExecutionBudget(**budget)
        except InvalidArgumentError:
            raise
        except TypeError as exc:  # unknown keyword inside a budget
            raise InvalidArgumentError(where, "budget", "known budget fields", str(exc)) from None
        return cls(
            run_id=data["run_id"],
            session_id=data["session_id"],
            root_id=data["root_id"],
            parent_id=data.get("parent_id"),
            depth=data.get("depth", 0),
            spawn_budget=spawn_budget,
            execution_budget=execution_budget,
            retention=retention,
            priority=Priority[priority_name],
        )
