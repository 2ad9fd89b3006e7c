"""The ``Store`` seam: the event log plus its projections, durable and transactional."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from corral.daemon._events import Event, NewEvent
from corral.daemon._state import State


@runtime_checkable
class Store(Protocol):
    """Where the agent service keeps everything.

    Contract, for every implementation:
    - :meth:`append` writes the events and the projection rows they change in ONE transaction
      and returns only after it has committed (durably: a ``kill -9`` right after loses
      nothing); on an error ``state`` is unchanged, and nothing is written unless the error
      came after the commit (then :meth:`refresh`, or the next append, brings it in).
    - Sequence numbers are gapless and increasing from 1; ``ts`` is assigned by the store.
    - ``state`` is the projections as of the last committed event; treat it as read-only.
    - :meth:`replay` rebuilds projections from the log alone, without touching the stored
      ones, so a caller can check ``replay().snapshot() == state.snapshot()``.
    - Appends are serialised; callers may call :meth:`append` from many tasks at once.
    """

    @property
    def state(self) -> State: ...

    async def open(self) -> None:
        """Create the schema if needed and load the projections."""

    async def append(self, events: Sequence[NewEvent]) -> list[Event]: ...

    async def read(
        self, after: int = 0, *, agent_id: str | None = None, limit: int = 1000
    ) -> list[Event]:
        """Events with ``seq > after`` in order (only ``agent_id``'s when given)."""
        ...

    async def replay(self) -> State: ...

    async def refresh(self) -> None:
        """Bring ``state`` up to the log: apply events committed by other writers, or by an
        append whose answer was lost (a connection dropped after COMMIT). Raises the store's
        ``StoreUnavailableError`` when the log cannot be read."""

    async def close(self) -> None: ...
