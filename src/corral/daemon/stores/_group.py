"""Group commit: appends that arrive while a commit is in flight go together in the next one.

Both stores hand their appends to a :class:`GroupCommitter`. It keeps the appends in the
order they were accepted; one drain task at a time takes every append waiting (up to
:data:`MAX_GROUP_EVENTS` events) and asks the store to commit them as one transaction. An
append that finds nothing in flight starts the drain task and is committed at once: batching
only happens while a commit is under way, never by waiting for company.

The store's part is the ``commit`` callable: :func:`plan` the group on its state (which
assigns sequence numbers and applies each member's events on the reducer, member by member),
write ``plan.written``, the projection rows of ``plan.tx`` and the turn rows of
``plan.turn_rows`` in one transaction, then merge
``plan.tx`` into its state with no ``await`` between the commit and the merge.

What each caller gets (docs/daemon.md, "Group commit"):

- its own events, with consecutive sequence numbers, once the transaction that holds them has
  committed; the log stays gapless and in the order the appends were accepted;
- its own error alone when the reducer refuses its events (:class:`~._state.ReplayError`, or
  any exception a projection rule raises): :func:`plan` leaves that member out and applies
  the others again without it, so they commit as if it had never been asked;
- the group's :class:`StoreUnavailableError` when the store cannot commit (disk, database or
  connection gone): every member of the group fails, ``state`` is unchanged for all of them;
- any other error of the transaction (the database refusing a row, a value that cannot be
  serialised) is taken for one member's doing: the group's members are then committed one
  by one, each in its own transaction, so each gets what it would have got alone.

Projections: a group's transaction applies its members' events in order on one
:class:`~._state.Tx`, which gives the same state as one transaction per append, with one
exception the planner avoids: after an ``agent.deleted`` a ``Tx`` would still find the deleted
agent in the state below it. So a member whose events delete an agent ends its group; the
members after it wait for the next commit.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from corral.daemon._errors import StoreUnavailableError
from corral.daemon._events import Event, NewEvent
from corral.daemon._state import State, Tx
from corral.daemon.stores._turns import TurnRow, TurnRows

__all__ = ["MAX_GROUP_EVENTS", "CommitStats", "GroupCommitter", "Pending", "Plan", "plan"]

# At most this many events in one transaction (an append larger than this still goes alone):
# a long queue is committed in several transactions rather than one unbounded one.
MAX_GROUP_EVENTS = 1000


@dataclass(frozen=True, slots=True)
class CommitStats:
    """How a store's appends were committed since it was made.

    ``appends``: appends answered with their events; ``events``: the events they held;
    ``commits``: the transactions that committed them (``appends / commits`` is the mean
    group size); ``largest``: the most appends one transaction held; ``refused``: appends
    answered with an error of their own (the reducer refused their events, or the database
    their rows) while the store could commit.
    """

    appends: int = 0
    events: int = 0
    commits: int = 0
    largest: int = 0
    refused: int = 0


@dataclass(slots=True, eq=False)
class Pending:
    """One caller's append, waiting in the queue: its events, its answer, and what makes its
    turn rows (written in the same transaction; see ``stores._turns.TurnRows``)."""

    events: list[NewEvent]
    future: asyncio.Future[list[Event]]
    turns: TurnRows | None = None


@dataclass(slots=True)
class Plan:
    """What a group makes of a state: ``tx`` holds the projections' changes (not merged),
    ``written`` every event of the transaction in order, ``turn_rows`` the accepted members'
    turn rows, ``accepted`` each committed member with its events, ``refused`` each member
    the reducer refused with its error, ``deferred`` the members left for the next group
    (they followed a deletion)."""

    tx: Tx
    written: list[Event] = field(default_factory=list)
    turn_rows: list[TurnRow] = field(default_factory=list)
    accepted: list[tuple[Pending, list[Event]]] = field(default_factory=list)
    refused: list[tuple[Pending, Exception]] = field(default_factory=list)
    deferred: list[Pending] = field(default_factory=list)


def plan(
    state: State,
    group: Sequence[Pending],
    ts: str,
    *,
    fenced: Mapping[Pending, Exception] | None = None,
) -> Plan:
    """Number and apply the events of ``group`` (in order, at time ``ts``) on one
    :class:`Tx` over ``state``, which is left as it is.

    ``fenced`` members are refused with their error before anything is applied (the store
    found that they act for agents whose lease this daemon does not hold).

    A member whose events the reducer refuses is left out with its error, and the members
    before it applied again on a fresh ``Tx`` (the one it touched is dropped whole): refusals
    are rare, so the common path applies every event once. A member that deletes an agent
    ends the group (see the module docstring). Never raises for a member's events."""
    members = [m for m in group if not fenced or m not in fenced]
    refused: list[tuple[Pending, Exception]] = [
        (m, fenced[m]) for m in group if fenced and m in fenced
    ]
    while True:
        tx = Tx(state)
        result = Plan(tx, refused=refused)
        for i, member in enumerate(members):
            mine: list[Event] = []
            try:
                for new in member.events:
                    event = Event(tx.last_seq + 1, ts, new.type, new.agent_id, new.data)
                    tx.apply(event)
                    mine.append(event)
                rows = member.turns(mine) if member.turns is not None else []
            except Exception as exc:  # any rule that raises refuses this member alone
                refused.append((member, exc))
                del members[i]
                break
            result.accepted.append((member, mine))
            result.written += mine
            result.turn_rows += rows
            if tx.deleted:
                result.deferred = members[i + 1 :]
                return result
        else:
            return result


Commit = Callable[[list[Pending]], Awaitable[Plan]]


class GroupCommitter:
    """The queue of a store's appends and the task that commits them in groups.

    ``commit`` is the store's: it plans the group on its state (:func:`plan`), writes it in
    one transaction, merges it, and returns the plan; it raises
    :class:`StoreUnavailableError` when the store cannot commit (the whole group fails), any
    other exception when the transaction failed otherwise (the members are then committed one
    by one). Runs on one event loop; not thread-safe.
    """

    def __init__(self, commit: Commit, *, max_events: int = MAX_GROUP_EVENTS) -> None:
        self._commit = commit
        self._max_events = max_events
        self._queue: deque[Pending] = deque()
        self._drainer: asyncio.Task[None] | None = None
        self._appends = self._events = self._commits = self._largest = self._refused = 0

    @property
    def stats(self) -> CommitStats:
        return CommitStats(self._appends, self._events, self._commits, self._largest, self._refused)

    async def append(self, events: list[NewEvent], turns: TurnRows | None = None) -> list[Event]:
        """Queue ``events`` (with what makes their turn rows) and wait until they are
        committed; their events, numbered.

        The events join the queue before the first ``await``: a caller cancelled after
        calling this does not take them back (they commit, and ``state`` follows)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[Event]] = loop.create_future()
        future.add_done_callback(_retrieve)
        self._queue.append(Pending(events, future, turns))
        if self._drainer is None:
            self._drainer = loop.create_task(self._drain())
        return await asyncio.shield(future)

    async def wait_idle(self) -> None:
        """Return once every append queued so far has been answered."""
        while self._drainer is not None:
            await asyncio.wait([self._drainer])

    async def _drain(self) -> None:
        try:
            while self._queue:
                await self._run(self._take())
        except BaseException:
            # Cancelled (the loop is closing): nobody will commit what is still queued.
            while self._queue:
                self._queue.popleft().future.cancel()
            raise
        finally:
            self._drainer = None

    def _take(self) -> list[Pending]:
        group = [self._queue.popleft()]
        count = len(group[0].events)
        while self._queue and count + len(self._queue[0].events) <= self._max_events:
            member = self._queue.popleft()
            group.append(member)
            count += len(member.events)
        return group

    async def _run(self, group: list[Pending]) -> None:
        try:
            done = await self._commit(group)
        except StoreUnavailableError as exc:
            for member in group:
                _answer(member, exc)
            return
        except Exception as exc:
            if len(group) == 1:
                self._refused += 1
                _answer(group[0], exc)
                return
            # Not the store's failure: some member's rows. Alone, each meets its own fate.
            for member in group:
                await self._run([member])
            return
        except BaseException:
            for member in group:
                member.future.cancel()
            raise
        if done.accepted:
            self._commits += 1
            self._appends += len(done.accepted)
            self._events += len(done.written)
            self._largest = max(self._largest, len(done.accepted))
        self._refused += len(done.refused)
        for member, events in done.accepted:
            _answer(member, events)
        for member, error in done.refused:
            _answer(member, error)
        self._queue.extendleft(reversed(done.deferred))


def _answer(member: Pending, outcome: list[Event] | BaseException) -> None:
    if member.future.done():  # cancelled at the loop's end
        return
    if isinstance(outcome, BaseException):
        member.future.set_exception(outcome)
    else:
        member.future.set_result(outcome)


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark an append's outcome seen, so a cancelled caller leaves no warning behind."""
    if not future.cancelled():
        future.exception()
