"""The protocols of the kernel: cancellation, compaction, agent context; and the stage enum."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from enum import StrEnum
from typing import Protocol, runtime_checkable

from corral.kernel._messages import ChatMessage


@runtime_checkable
class CancellationToken(Protocol):
    """The cooperative stop button of a run (``corral.runtime.Cancellation`` implements it).

    ``cancel`` is idempotent and the first reason wins; ``check`` raises
    ``CancellationError`` once cancelled; ``wait`` returns when cancelled; callbacks run once;
    a ``child`` is cancelled with its parent, never the reverse.
    """

    @property
    def is_cancelled(self) -> bool: ...

    @property
    def reason(self) -> str | None: ...

    def cancel(self, reason: str | None = None) -> None: ...

    def check(self) -> None: ...

    async def wait(self) -> None: ...

    def add_callback(self, fn: Callable[[CancellationToken], object]) -> None: ...

    def child(self) -> CancellationToken: ...


@runtime_checkable
class CompactionStrategy(Protocol):
    """Turns a whole raw history into the window sent to the model. Never mutates its input."""

    async def compact(self, history: list[ChatMessage]) -> list[ChatMessage]: ...


@runtime_checkable
class AgentContextProtocol(Protocol):
    """What an agent loop sees of its context: its id and the compacted prompt window."""

    @property
    def agent_id(self) -> str: ...

    async def get_prompt_window(self, session_id: str) -> list[ChatMessage]: ...


class MiddlewareStage(StrEnum):
    """The moment a middleware context stands for."""

    TURN = "turn"  # one prompt handled by an agent, from input to final answer
    CHAT = "chat"  # one model call
    TOOL = "tool"  # one tool call


class ActionVerdict(Protocol):
    """What a guard answers about an action: allowed, and why not when it is not."""

    @property
    def allowed(self) -> bool: ...

    @property
    def reason(self) -> str | None: ...


ActionCheck = Callable[[str, str, dict[str, object]], "ActionVerdict | Awaitable[ActionVerdict]"]
"""``check(agent_id, action, context)``, plain or async; ``Supervisor.check_action`` fits."""
