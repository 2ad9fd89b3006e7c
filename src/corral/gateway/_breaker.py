"""Per-agent breakers: rolling counts of errors, refusals and suspicious empties in memory, and
freezes that survive restarts in a :class:`~corral.gateway._breaker_journal.FreezeJournal`."""

from __future__ import annotations

import asyncio
import heapq
import inspect
import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from types import TracebackType
from typing import Any

from corral.gateway._breaker_journal import FreezeJournal
from corral.gateway._breaker_records import (
    SIGNALS,
    BreakerPolicy,
    BreakerStatus,
    Freeze,
    Reinstatement,
    RequestOutcome,
    Signal,
    signal_label,
)
from corral.gateway._errors import GatewayError
from corral.kernel import SYSTEM_CLOCK, Clock, UsageError, new_id
from corral.kernel import _validate as v

__all__ = ["Breakers", "OnFreeze"]

logger = logging.getLogger("corral.gateway.breaker")

OnFreeze = Callable[[str, Freeze], Any]
"""``on_freeze(agent_id, freeze)``: a plain function or a coroutine function."""

# Evidence keeps statements whole up to this many characters: enough for any real query,
# while a megabyte of SQL cannot bloat every freeze record.
_MAX_REQUEST_CHARS = 8192

_Window = dict[Signal, deque[tuple[float, RequestOutcome]]]


class Breakers:
    """The breakers of every agent of one gateway.

    ``observe`` counts one finished request; when the count of a signal within the policy's
    window reaches its threshold the agent is frozen: :meth:`check` raises ``agent_frozen``
    from then on, the freeze (with its evidence) is written to the journal, and ``on_freeze``
    is called once. Each crossing freezes exactly once, however many tasks observe at the
    same moment: the decision is taken without awaiting, under a lock. Outcomes observed while
    an agent is frozen are not counted.

    Call :meth:`open` (or use ``async with``) before anything else; every method raises
    ``UsageError`` on a ``Breakers`` that is not open, so a request is never let through
    before the persisted freezes are known. ``is_frozen``, ``check`` and ``status`` read
    memory only and never block.
    """

    def __init__(
        self,
        policy: BreakerPolicy,
        *,
        journal: FreezeJournal,
        clock: Clock = SYSTEM_CLOCK,
        on_freeze: OnFreeze | None = None,
    ) -> None:
        where = "Breakers"
        v.instance_of(where, "policy", policy, BreakerPolicy)
        v.instance_of(where, "journal", journal, FreezeJournal)
        v.instance_of(where, "clock", clock, Clock)
        if on_freeze is not None:
            v.callable_(where, "on_freeze", on_freeze)
        self._policy = policy
        self._journal = journal
        self._clock = clock
        self._on_freeze = on_freeze
        self._mutex = threading.Lock()
        self._write_lock = asyncio.Lock()
        self._windows: dict[str, _Window] = {}
        self._frozen: dict[str, Freeze] = {}
        # Records decided but not yet in the journal, in order; every write drains it first.
        self._pending: list[Freeze | Reinstatement] = []
        self._tasks: set[asyncio.Task[Exception | None]] = set()
        self._open = False

    @property
    def policy(self) -> BreakerPolicy:
        return self._policy

    @property
    def journal(self) -> FreezeJournal:
        return self._journal

    # --- lifecycle ---------------------------------------------------------------------------

    async def open(self) -> None:
        """Open the journal and load the agents frozen now; a no-op when open."""
        if self._open:
            return
        await self._journal.open()
        frozen = await self._journal.current_freezes()
        with self._mutex:
            self._frozen = dict(frozen)
            self._windows.clear()
        self._open = True

    async def close(self) -> None:
        """Finish the freezes in flight, try once more to write unrecorded ones (logging a
        failure), then close the journal. Idempotent."""
        if not self._open:
            return
        self._open = False
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        try:
            async with self._write_lock:
                await self._flush()
        except Exception as exc:
            logger.error(
                "%d breaker record(s) could not be written to %r before closing: %s",
                len(self._pending),
                self._journal,
                exc,
            )
        await self._journal.close()

    async def __aenter__(self) -> Breakers:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def _require_open(self) -> None:
        if not self._open:
            raise UsageError("the breakers are not open: call open() first")

    # --- reading -----------------------------------------------------------------------------

    def is_frozen(self, agent_id: str) -> bool:
        v.non_empty_str("Breakers.is_frozen", "agent_id", agent_id)
        self._require_open()
        return agent_id in self._frozen

    def current_freeze(self, agent_id: str) -> Freeze | None:
        """The freeze in effect for ``agent_id``, or None."""
        v.non_empty_str("Breakers.current_freeze", "agent_id", agent_id)
        self._require_open()
        return self._frozen.get(agent_id)

    def frozen_agents(self) -> dict[str, Freeze]:
        """Every agent frozen now, with its freeze."""
        self._require_open()
        with self._mutex:
            return dict(self._frozen)

    def check(self, agent_id: str) -> None:
        """Raise ``GatewayError("agent_frozen")`` if ``agent_id`` is frozen.

        The message names the freeze id and either the signal, its count, threshold and
        window, or who froze the agent and why; ``details`` carry the same as fields.
        """
        v.non_empty_str("Breakers.check", "agent_id", agent_id)
        self._require_open()
        freeze = self._frozen.get(agent_id)
        if freeze is not None:
            raise _frozen_error(freeze)

    def status(self, agent_id: str) -> BreakerStatus:
        v.non_empty_str("Breakers.status", "agent_id", agent_id)
        self._require_open()
        now = self._clock.monotonic()
        with self._mutex:
            freeze = self._frozen.get(agent_id)
            window = self._windows.get(agent_id)
            if window is not None:
                self._prune(window, now)
            counts: dict[str, int] = {
                s: len(window[s]) if window and s in window else 0 for s in SIGNALS
            }
        return BreakerStatus(
            agent_id=agent_id,
            frozen=freeze is not None,
            freeze=freeze,
            counts=counts,
            thresholds=self._policy.thresholds,
            window_s=self._policy.window_s,
        )

    async def history(self, agent_id: str) -> list[Freeze | Reinstatement]:
        """The agent's freezes and reinstatements, oldest first (from the journal, after
        writing any record not yet in it). Raises the journal's error when it fails."""
        v.non_empty_str("Breakers.history", "agent_id", agent_id)
        self._require_open()
        async with self._write_lock:
            await self._flush()
            return await self._journal.history(agent_id)

    # --- counting and freezing ---------------------------------------------------------------

    async def observe(self, agent_id: str, outcome: RequestOutcome) -> Freeze | None:
        """Count one finished request; return the freeze it caused, if any.

        Never raises for a journal failure: the agent stays frozen in memory, the failure is
        logged, and the record is written with the next journal write. When it freezes, it
        returns after the freeze is written (or failed to be) and ``on_freeze`` returned; a
        cancelled caller does not stop either.
        """
        v.non_empty_str("Breakers.observe", "agent_id", agent_id)
        v.instance_of("Breakers.observe", "outcome", outcome, RequestOutcome)
        self._require_open()
        signal = outcome.signal
        if signal is None:
            return None
        threshold = self._policy.threshold(signal)
        if threshold is None:
            return None
        if outcome.at is None:
            outcome = replace(outcome, at=self._clock.now())
        if len(outcome.request) > _MAX_REQUEST_CHARS:
            outcome = replace(outcome, request=outcome.request[:_MAX_REQUEST_CHARS] + "...")
        now = self._clock.monotonic()
        with self._mutex:
            if agent_id in self._frozen:
                return None
            window = self._windows.setdefault(agent_id, {})
            events = window.setdefault(signal, deque())
            events.append((now, outcome))
            self._prune(window, now)
            count = len(events)
            if count < threshold:
                return None
            label = signal_label(signal)
            freeze = self._freeze_locked(
                agent_id,
                reason=(
                    f"{count} {label} within {self._policy.window_s:g} s reached the "
                    f"threshold of {threshold} (last: {outcome.code})"
                ),
                by=None,
                signal=signal,
                count=count,
                threshold=threshold,
            )
        error = await self._settle(freeze)
        if error is not None:
            logger.error(
                "the freeze %s of agent %r is in effect but not yet recorded: %s",
                freeze.id,
                agent_id,
                error,
            )
        return freeze

    async def freeze(self, agent_id: str, *, reason: str, by: str | None = None) -> Freeze:
        """Freeze ``agent_id`` by hand; idempotent: an agent already frozen keeps (and gets
        back) its freeze. The freeze is in effect when this is called; if the journal fails,
        its error is raised and the record is written with the next journal write."""
        where = "Breakers.freeze"
        v.non_empty_str(where, "agent_id", agent_id)
        v.non_empty_str(where, "reason", reason)
        v.non_empty_str(where, "by", by, optional=True)
        self._require_open()
        with self._mutex:
            existing = self._frozen.get(agent_id)
            if existing is not None:
                return existing
            window = self._windows.get(agent_id)
            if window is not None:
                self._prune(window, self._clock.monotonic())
            freeze = self._freeze_locked(agent_id, reason=reason, by=by)
        error = await self._settle(freeze)
        if error is not None:
            raise error
        return freeze

    async def reinstate(self, agent_id: str, *, by: str, reason: str) -> Reinstatement:
        """Lift the agent's freeze, recording who (``by``) and why (``reason``), and start its
        counts from zero. Raises ``InvalidArgumentError`` when ``by`` or ``reason`` is empty,
        ``UsageError`` when the agent is not frozen, and the journal's error when the record
        cannot be written (the agent then stays frozen)."""
        where = "Breakers.reinstate"
        v.non_empty_str(where, "agent_id", agent_id)
        v.non_empty_str(where, "by", by)
        v.non_empty_str(where, "reason", reason)
        self._require_open()
        async with self._write_lock:
            freeze = self._frozen.get(agent_id)
            if freeze is None:
                raise UsageError(
                    f"agent {agent_id!r} is not frozen: there is nothing to reinstate",
                    agent_id=agent_id,
                )
            record = Reinstatement(
                id=new_id(),
                agent_id=agent_id,
                at=self._clock.now(),
                by=by,
                reason=reason,
                freeze_id=freeze.id,
            )
            await self._flush()
            await self._journal.record_reinstatement(record)
            with self._mutex:
                del self._frozen[agent_id]
                self._windows.pop(agent_id, None)
        return record

    # --- internals ---------------------------------------------------------------------------

    def _prune(self, window: _Window, now: float) -> None:
        """Forget events at least ``window_s`` old (the caller holds the mutex)."""
        horizon = now - self._policy.window_s
        for events in window.values():
            while events and events[0][0] <= horizon:
                events.popleft()

    def _freeze_locked(
        self,
        agent_id: str,
        *,
        reason: str,
        by: str | None,
        signal: Signal | None = None,
        count: int | None = None,
        threshold: int | None = None,
    ) -> Freeze:
        """Freeze in memory and queue the record (the caller holds the mutex and has pruned)."""
        window = self._windows.pop(agent_id, {})
        evidence = tuple(
            outcome for _, outcome in heapq.merge(*window.values(), key=lambda event: event[0])
        )
        freeze = Freeze(
            id=new_id(),
            agent_id=agent_id,
            at=self._clock.now(),
            reason=reason,
            by=by,
            signal=signal,
            count=count,
            threshold=threshold,
            window_s=None if signal is None else self._policy.window_s,
            evidence=evidence,
        )
        self._frozen[agent_id] = freeze
        self._pending.append(freeze)
        return freeze

    async def _settle(self, freeze: Freeze) -> Exception | None:
        # In its own task, shielded: a cancelled caller must not leave the freeze unrecorded
        # or the pool undrained.
        task = asyncio.ensure_future(self._record_and_notify(freeze))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return await asyncio.shield(task)

    async def _record_and_notify(self, freeze: Freeze) -> Exception | None:
        error: Exception | None = None
        try:
            async with self._write_lock:
                await self._flush()
        except Exception as exc:
            error = exc
        # A reinstatement that overtook this task makes draining the pool pointless.
        if self._on_freeze is not None and self._frozen.get(freeze.agent_id) is freeze:
            try:
                result = self._on_freeze(freeze.agent_id, freeze)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                logger.exception(
                    "on_freeze failed for agent %r (freeze %s)", freeze.agent_id, freeze.id
                )
        return error

    async def _flush(self) -> None:
        """Write the queued records in order (the caller holds the write lock)."""
        while self._pending:
            record = self._pending[0]
            if isinstance(record, Freeze):
                await self._journal.record_freeze(record)
            else:
                await self._journal.record_reinstatement(record)
            with self._mutex:
                self._pending.pop(0)

    def __repr__(self) -> str:
        return f"Breakers({self._policy!r}, frozen={len(self._frozen)})"


def _frozen_error(freeze: Freeze) -> GatewayError:
    agent = freeze.agent_id
    if freeze.signal is not None:
        cause = (
            f"{freeze.count} {signal_label(freeze.signal)} within {freeze.window_s:g} s "
            f"reached the threshold of {freeze.threshold}"
        )
    else:
        cause = f"frozen by {freeze.by or 'an operator'}: {freeze.reason}"
    return GatewayError(
        "agent_frozen",
        f"agent {agent!r} is frozen (freeze {freeze.id}): {cause}; every request is refused "
        "until a person reinstates it",
        agent_id=agent,
        freeze_id=freeze.id,
        signal=freeze.signal,
        count=freeze.count,
        threshold=freeze.threshold,
        window_s=freeze.window_s,
        reason=freeze.reason,
        by=freeze.by,
        frozen_at=freeze.at.isoformat(),
    )
