"""The event feed: live subscribers to the committed events, after a catch-up from the log."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Callable, Sequence

from corral.daemon._events import Event
from corral.daemon.stores import Store

_PAGE = 1000  # events read from the log at a time while a subscriber catches up
logger = logging.getLogger("corral.daemon")

Observer = Callable[[Sequence[Event]], None]
"""Told each commit's events, in order, once they are durable (see :meth:`EventFeed.observe`)."""


class _Subscriber:
    __slots__ = ("agent_id", "overflowed", "queue")

    def __init__(self, agent_id: str | None, size: int) -> None:
        self.agent_id = agent_id
        self.queue: asyncio.Queue[Event] = asyncio.Queue(maxsize=size)
        self.overflowed = False


class EventFeed:
    """Hands committed events to subscribers, each with a buffer of ``buffer`` events.

    :meth:`publish` is called with each append's events once they have committed, in order.
    """

    def __init__(self, store: Store, buffer: int) -> None:
        self._store = store
        self._buffer = buffer
        self._subscribers: set[_Subscriber] = set()
        self._observers: list[Observer] = []
        self._closed = False

    def observe(self, observer: Observer) -> None:
        """Call ``observer`` with the events of each commit as they are published (metrics
        derived from the log). It runs on the commit's path: it must be quick, and what it
        raises is logged, never raised."""
        self._observers.append(observer)

    @property
    def subscribers(self) -> frozenset[object]:
        """The open subscriptions (opaque; count them)."""
        return frozenset(self._subscribers)

    async def subscribe(
        self, after: int | None = None, *, agent_id: str | None = None
    ) -> AsyncGenerator[Event, None]:
        """Events with ``seq > after`` from the log, then live ones as they are published.

        No event is missed or repeated between the two. With ``after=None`` only live events
        come. The stream ends when the feed closes or the subscriber falls more than
        ``buffer`` events behind (resume with the last seq seen).
        """
        sub = _Subscriber(agent_id, self._buffer)
        self._subscribers.add(sub)
        try:
            last = self._store.state.last_seq if after is None else after
            while True:  # catch up from the log, in pages
                page = await self._store.read(last, agent_id=agent_id, limit=_PAGE)
                for event in page:
                    last = event.seq
                    yield event
                if len(page) < _PAGE:
                    break
            if self._closed:
                return  # close() has woken the subscribers it knew of; nothing more comes
            while True:
                event = await sub.queue.get()
                if sub.overflowed:  # set by publish or close() while we waited
                    break
                if event.seq > last:
                    last = event.seq
                    yield event
        finally:
            self._subscribers.discard(sub)

    def publish(self, events: Sequence[Event], *, own: bool = True) -> None:
        """Queue committed ``events`` for every subscriber they concern, and tell the
        observers when they are this daemon's own (``own``; another daemon's, which the
        store brought in, are streamed but not observed: each daemon's metrics count what
        it did). Called in ``seq`` order (the store's :meth:`~.stores.Store.watch`)."""
        if own:
            for observer in self._observers:
                try:
                    observer(events)
                except Exception:
                    logger.exception("an observer of the committed events failed")
        for event in events:
            for sub in list(self._subscribers):
                if sub.agent_id is not None and sub.agent_id != event.agent_id:
                    continue
                try:
                    sub.queue.put_nowait(event)
                except asyncio.QueueFull:
                    sub.overflowed = True

    def close(self) -> None:
        """End every stream (a subscriber that comes later gets the log, then nothing)."""
        self._closed = True
        for sub in list(self._subscribers):
            sub.overflowed = True
            # Unblocks a subscriber waiting on an empty queue so it sees ``overflowed``.
            if sub.queue.empty():
                sub.queue.put_nowait(Event(0, "", "", None, {}))
