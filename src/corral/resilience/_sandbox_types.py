"""The vocabulary of sandboxed runs: config, the task the agent sees, the result and errors."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from corral.kernel import InvalidArgumentError, RunError
from corral.kernel import _validate as v

T = TypeVar("T")

Isolation = Literal["task", "process"]

READ_ONLY_PREFIX = "[READ-ONLY MODE] "
"""What a read-only task's text starts with, so a model reading it knows."""


def _frozen_actions(where: str, value: Any) -> frozenset[str]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise InvalidArgumentError(where, "allowed_actions", "an iterable of action names", value)
    actions = frozenset(value)
    for action in actions:
        if not isinstance(action, str) or not action.strip():
            raise InvalidArgumentError(
                where, "allowed_actions", "an iterable of non-empty strings", value
            )
    return actions


@dataclass(frozen=True, slots=True, kw_only=True)
class SandboxConfig:
    """How :func:`run_sandboxed` runs an agent.

    - ``timeout_s``: seconds the agent may take (> 0). With ``isolation="process"`` they count
      from the moment the child process has started, and the child is killed when they run out.
    - ``max_memory_bytes``: the child's address-space limit (``RLIMIT_AS``), 0 for none. It
      needs ``isolation="process"`` (a limit inside this process cannot be enforced) and a
      POSIX system.
    - ``allowed_actions``: action names the agent may take, handed to it on the
      :class:`SandboxTask`; informational (enforce them with a guard).
    - ``read_only``: the task is marked read-only (see :class:`SandboxTask`); an instruction
      to the agent, not an enforced restriction.
    - ``isolation``: ``"task"`` runs the agent in this process (a plain-function agent on a
      worker thread, a coroutine agent on its own task); ``"process"`` runs it in a child
      process (multiprocessing, forkserver where available, else spawn).
    - ``preload``: module names (``isolation="process"`` only) imported once by a fork server
      of their own, from which the child is forked: a child whose agent needs heavy modules
      then starts in milliseconds rather than importing them on every run.
    """

    timeout_s: float = 30.0
    max_memory_bytes: int = 0
    allowed_actions: frozenset[str] = frozenset()
    read_only: bool = False
    isolation: Isolation = "task"
    preload: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        where = "SandboxConfig"
        v.positive_number(where, "timeout_s", self.timeout_s)
        v.non_negative_int(where, "max_memory_bytes", self.max_memory_bytes)
        object.__setattr__(self, "allowed_actions", _frozen_actions(where, self.allowed_actions))
        v.instance_of(where, "read_only", self.read_only, bool)
        if self.isolation not in ("task", "process"):
            raise InvalidArgumentError(where, "isolation", "'task' or 'process'", self.isolation)
        if not isinstance(self.preload, tuple | list) or not all(
            isinstance(name, str) and name for name in self.preload
        ):
            raise InvalidArgumentError(where, "preload", "a tuple of module names", self.preload)
        object.__setattr__(self, "preload", tuple(self.preload))
        if self.preload and self.isolation != "process":
            raise InvalidArgumentError(
                where, "preload", "empty unless isolation='process'", self.preload
            )
        if self.max_memory_bytes and self.isolation != "process":
            raise InvalidArgumentError(
                where,
                "max_memory_bytes",
                "0 unless isolation='process' (a memory limit needs a child process)",
                self.max_memory_bytes,
            )


class SandboxTask(str):
    """The task as the sandboxed agent receives it: a ``str`` that carries the config's marks.

    Its text is the task, prefixed with :data:`READ_ONLY_PREFIX` when ``read_only``; so an
    agent that only reads text (a model) sees the mark, and code can test ``task.read_only``,
    ``task.allowed_actions`` and read the unmarked ``task.original``. Picklable.
    """

    _original: str
    _read_only: bool
    _allowed_actions: frozenset[str]

    def __new__(
        cls,
        original: str,
        read_only: bool = False,
        allowed_actions: Iterable[str] = frozenset(),
    ) -> SandboxTask:
        v.instance_of("SandboxTask", "original", original, str)
        v.instance_of("SandboxTask", "read_only", read_only, bool)
        actions = _frozen_actions("SandboxTask", allowed_actions)
        self = super().__new__(cls, READ_ONLY_PREFIX + original if read_only else original)
        self._original = str(original)
        self._read_only = read_only
        self._allowed_actions = actions
        return self

    @property
    def original(self) -> str:
        return self._original

    @property
    def read_only(self) -> bool:
        return self._read_only

    @property
    def allowed_actions(self) -> frozenset[str]:
        return self._allowed_actions

    def __reduce__(self) -> tuple[Any, ...]:
        return (SandboxTask, (self._original, self._read_only, self._allowed_actions))


# --- errors -------------------------------------------------------------------------------


class SandboxError(RunError):
    """A sandboxed run did not complete; found on ``SandboxResult.error``, never raised."""

    code = "sandbox_failed"


class SandboxTimeoutError(SandboxError):
    """The agent ran past ``timeout_s``. ``pid`` is the killed child's, for process isolation."""

    code = "sandbox_timeout"
    default_retryable = True

    def __init__(self, timeout_s: float, elapsed_s: float, pid: int | None = None) -> None:
        after = f"; child process {pid} was killed" if pid is not None else ""
        super().__init__(
            f"the sandboxed run exceeded its timeout of {timeout_s:g} s "
            f"(stopped after {elapsed_s:.3f} s){after}",
            timeout_s=timeout_s,
            elapsed_s=elapsed_s,
            pid=pid,
        )
        self.timeout_s = timeout_s
        self.elapsed_s = elapsed_s
        self.pid = pid


class SandboxMemoryError(SandboxError):
    """The child process ran out of its ``max_memory_bytes`` address space."""

    code = "sandbox_memory_limit"

    def __init__(self, max_memory_bytes: int, detail: str, pid: int | None = None) -> None:
        super().__init__(
            f"the sandboxed run exceeded its memory limit of {max_memory_bytes} bytes "
            f"and was stopped ({detail})",
            max_memory_bytes=max_memory_bytes,
            detail=detail,
            pid=pid,
        )
        self.max_memory_bytes = max_memory_bytes
        self.detail = detail
        self.pid = pid


class SandboxInterruptedError(SandboxError):
    """The run was stopped from inside or by a signal, without our timeout."""

    code = "sandbox_interrupted"
    default_retryable = True

    def __init__(self, why: str, **details: Any) -> None:
        super().__init__(f"the sandboxed run was interrupted: {why}", why=why, **details)
        self.why = why


class SandboxAgentError(SandboxError):
    """The agent raised. ``__cause__`` is its exception when it could be carried back."""

    code = "sandbox_agent_failed"

    def __init__(self, error_type: str, error_message: str, traceback: str = "") -> None:
        super().__init__(
            f"the sandboxed agent raised {error_type}: {error_message}",
            error_type=error_type,
            error_message=error_message,
        )
        self.error_type = error_type
        self.error_message = error_message
        self.traceback = traceback


class SandboxStartError(SandboxError):
    """The run could not start (the agent cannot be pickled, no child process, no limits)."""

    code = "sandbox_start_failed"

    def __init__(self, why: str) -> None:
        super().__init__(f"the sandboxed run could not start: {why}", why=why)
        self.why = why


@dataclass(frozen=True, slots=True, kw_only=True)
class SandboxResult(Generic[T]):
    """How a sandboxed run ended.

    ``completed`` is True when the agent returned; ``result`` is then its value and ``error``
    None. Otherwise ``result`` is None and ``error`` says why (a :class:`SandboxError`).
    ``duration_s`` is the run's length in seconds on the run's clock.
    """

    result: T | None
    completed: bool
    duration_s: float
    error: SandboxError | None = None
