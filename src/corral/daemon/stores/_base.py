"""The ``Store`` seam: the event log plus its projections, durable and transactional."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from corral.daemon._errors import UnstorableValueError
from corral.daemon._events import Event, NewEvent
from corral.daemon._state import State
from corral.daemon._text import unstorable
from corral.daemon.stores._turns import TurnRows

logger = logging.getLogger("corral.daemon")

MergeHook = Callable[[Sequence[Event], bool], None]
"""Told each batch of events as it becomes part of a store's ``state``, in ``seq`` order,
and whether they are the store's own (``True``: its appends) or another writer's
(``False``: brought in by :meth:`Store.refresh` or by an append's catch-up)."""


@runtime_checkable
class Store(Protocol):
    """Where the agent service keeps everything.

    Contract, for every implementation:
    - :meth:`append` writes the events, the projection rows they change and the turn rows
      ``turns`` makes of them (``stores._turns.TurnRows``: a turn's record is never written
      apart from the events that open or close it) in ONE transaction and returns only after
      it has committed (durably: a ``kill -9`` right after loses
      nothing); on an error ``state`` is unchanged, and nothing is written unless the error
      came after the commit (then :meth:`refresh`, or the next append, brings it in).
    - That transaction may hold other callers' appends too (group commit: appends that
      arrive while a commit is in flight go together in the next one, sharing its ``ts``):
      each caller still gets only its own events, consecutive, and the projections come out
      as with one transaction per append. Events the reducer or the database refuses fail
      their own append alone; a store failure fails every append of the group
      (``stores._group`` and docs/daemon.md, "Group commit", say how).
    - :meth:`append` refuses events holding a string no store can keep (a lone surrogate or
      NUL) with :class:`UnstorableValueError`, before anything is written
      (:func:`refuse_unstorable`), the same on every store.
    - Sequence numbers are gapless and increasing from 1; ``ts`` is assigned by the store.
    - ``state`` is the projections as of the last committed event; treat it as read-only.
    - :meth:`replay` rebuilds projections from the log alone, without touching the stored
      ones, so a caller can check ``replay().snapshot() == state.snapshot()``.
    - Appends are serialised in the order they were called; callers may call :meth:`append`
      from many tasks at once. Once begun, an append is not taken back by cancelling its
      caller: its events commit and ``state`` follows.
    """

    @property
    def state(self) -> State: ...

    async def open(self) -> None:
        """Create the schema if needed and load the projections."""

    async def append(
        self, events: Sequence[NewEvent], *, turns: TurnRows | None = None
    ) -> list[Event]: ...

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

    def watch(self, hook: MergeHook) -> None:
        """Call ``hook`` with every batch of events as it becomes part of ``state``: once
        each, in ``seq`` order, after the events are durable and before anything awaits.
        So a log follower sees the whole log, gapless, whoever wrote it. ``hook`` runs on
        the commit's path: it must be quick; what it raises is logged, never raised."""


class Watchers:
    """The :meth:`Store.watch` hooks of a store, told in order."""

    __slots__ = ("_hooks",)

    def __init__(self) -> None:
        self._hooks: list[MergeHook] = []

    def add(self, hook: MergeHook) -> None:
        self._hooks.append(hook)

    def merged(self, events: Sequence[Event], own: bool) -> None:
        if not events:
            return
        for hook in self._hooks:
            try:
                hook(events, own)
            except Exception:
                logger.exception("a watcher of the store's events failed")


def refuse_unstorable(events: Sequence[NewEvent]) -> None:
    """Raise :class:`UnstorableValueError` for the first event holding a string that no store
    can keep (a lone surrogate, which UTF-8 cannot encode, or NUL, which PostgreSQL's text
    cannot hold), so that no stored value can make a later read fail."""
    for new in events:
        found = unstorable({"agentId": new.agent_id, "data": new.data})
        if found is not None:
            raise UnstorableValueError(new.type, *found)
