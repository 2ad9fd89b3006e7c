"""``Node``: one daemon among several on a PostgreSQL store.

A node has a row in ``nodes`` whose ``expires`` it pushes forward every ``lease_s / 4``
seconds: that is its lease, and it covers every agent it owns (``leases``: agent, node,
epoch). Every append is checked in its transaction, under the log counter's row lock, against
those rows (:meth:`refused`): a node whose lease ran out, or an agent leased to another node or
at another epoch, is refused with ``NotOwnerError`` and nothing is written. A node whose
lease runs out (a pause, a database out of reach) stops acting for its agents, joins again
under a new incarnation and owns nothing until it adopts; the live nodes adopt a dead one's
agents, a run at a time, each a fair share. PostgreSQL's clock decides every expiry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Protocol

import psycopg
from psycopg.rows import TupleRow

from corral.daemon import _events as ev
from corral.daemon._auth import token_sha256
from corral.daemon._cluster._naming import DEFAULT_LEASE_S, check_node_name
from corral.daemon._cluster._tables import CLUSTER_LOCK_KEY, MODE_LOCK_KEY, ClusterSql
from corral.daemon._errors import (
    ClusterModeError,
    NodeNotFoundError,
    NodeTakenError,
    NotOwnerError,
    StoreUnavailableError,
)
from corral.daemon._events import Event
from corral.daemon._state import ENDED_STATES
from corral.daemon.stores._group import Pending
from corral.daemon.stores._postgres import PostgresStore
from corral.kernel import InvalidArgumentError
from corral.kernel import _validate as v

__all__ = ["Node", "NodeInfo", "Owner"]

logger = logging.getLogger("corral.daemon")

# Events any daemon may write about an agent it does not own: a notice to another agent's
# inbox, a recorded command answer, tokens, a gateway freeze seen by the daemon that ran the
# query. Every other event about an agent needs its lease.
_UNFENCED = frozenset(
    {ev.NOTICE, ev.COMMAND_RECORDED, ev.TOKEN_CREATED, ev.TOKEN_REVOKED, ev.GATEWAY_FROZEN}
)

_Conn = psycopg.AsyncConnection[TupleRow]


class Adopter(Protocol):
    """The agent service's side of ownership (``AgentService.adopt`` and ``disown``)."""

    async def adopt(self, agent_ids: Collection[str]) -> None: ...

    async def disown(self, agent_ids: Collection[str]) -> None: ...


@dataclass(frozen=True, slots=True)
class Owner:
    """Where an agent's commands go: its node, that node's URL, whether it is live, and
    how long its lease still runs (s; negative once run out)."""

    node: str
    url: str
    live: bool
    lease_left_s: float


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """A row of ``GET /nodes``."""

    name: str
    url: str
    live: bool
    stopped: bool
    started_at: datetime
    heartbeat: datetime
    heartbeat_age_s: float
    agents: list[str]


class Node:
    """This daemon as node ``name`` of the store (see the module docstring).

    Order of use: :meth:`join` (before the agent service starts: a live node of the same
    name, or live nodes with another token, raise :class:`NodeTakenError`), then
    :meth:`start` with the service (it takes its own leases back after a restart, adopts
    agents nobody owns, ends what is left on this machine of agents it does not own, and
    starts renewing), and :meth:`leave` when the daemon stops (its agents are adopted at
    once). :meth:`tick` does one round of the loop (tests drive it by hand with
    ``loop=False``).

    ``lease_s``: the node's lease (default :data:`DEFAULT_LEASE_S`); ``url`` is where the
    other daemons forward commands for this node's agents.
    """

    def __init__(
        self,
        store: PostgresStore,
        *,
        name: str,
        url: str,
        token: str,
        home: str | Path,
        lease_s: float = DEFAULT_LEASE_S,
    ) -> None:
        where = "Node"
        v.instance_of(where, "store", store, PostgresStore)
        check_node_name(where, name)
        v.non_empty_str(where, "url", url)
        v.non_empty_str(where, "token", token)
        v.positive_number(where, "lease_s", lease_s)
        if lease_s < 0.2 or lease_s > 600:
            raise InvalidArgumentError(where, "lease_s", "from 0.2 to 600 seconds", lease_s)
        self.name = name
        self.url = url
        self.lease_s = float(lease_s)
        self._store = store
        self._home = Path(home)
        self._hash = token_sha256(token)
        self._sql = ClusterSql(store.schema, store.tables)
        self._incarnation = ""
        self._held: dict[str, int] = {}  # agent -> epoch of its lease held here
        self._created: dict[str, int] = {}  # leases written in the open transaction
        self._valid_until = 0.0  # loop time past which the lease may have run out
        self._conn: _Conn | None = None  # heartbeats, adoptions, lookups
        self._listener: _Conn | None = None  # LISTEN, and the mode lock for the session
        self._work = asyncio.Lock()  # one statement at a time on _conn
        self._service: Adopter | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._dirty = asyncio.Event()
        self._left = False
        self._lost_some = False  # agents dropped by _lost, not yet taken back

    # --- ownership (the service's Ownership, and the store's Fence) -----------------------

    def owns(self, agent_id: str) -> bool:
        """Whether this node holds ``agent_id``'s lease and its own lease has not run out
        by this process's clock (it stops acting a margin before the database would let
        another node adopt)."""
        return agent_id in self._held and self._fresh()

    @property
    def held(self) -> frozenset[str]:
        """The agents whose leases this node holds."""
        return frozenset(self._held)

    @property
    def incarnation(self) -> str:
        return self._incarnation

    async def refused(self, conn: _Conn, group: Sequence[Pending]) -> dict[Pending, Exception]:
        wanted: dict[Pending, set[str]] = {}
        for member in group:
            created = {e.agent_id for e in member.events if e.type == ev.AGENT_CREATED}
            ids = {
                e.agent_id
                for e in member.events
                if e.agent_id is not None and e.type not in _UNFENCED
            }
            if ids - created:
                wanted[member] = ids - created
        if not wanted:
            return {}
        asked = sorted(set().union(*wanted.values()))
        rows = await (await conn.execute(self._sql.leases_of, (asked,))).fetchall()
        ok = {
            agent
            for agent, node, epoch, incarnation, live in rows
            if node == self.name
            and incarnation == self._incarnation
            and live
            and self._held.get(agent) == epoch
        }
        refused: dict[Pending, Exception] = {}
        for member, agents in wanted.items():
            bad = sorted(agents - ok)
            if bad:
                refused[member] = NotOwnerError(bad[0], self.name)
        return refused

    async def written(self, conn: _Conn, events: Sequence[Event]) -> None:
        self._created = {}
        async with conn.cursor() as cur:
            for event in events:
                if event.type == ev.AGENT_CREATED and event.agent_id is not None:
                    run = event.data.get("agent", {}).get("runId") or event.agent_id
                    await cur.execute(self._sql.insert_lease, (event.agent_id, self.name, run))
                    self._created[event.agent_id] = 1
                elif event.type == ev.AGENT_DELETED and event.agent_id is not None:
                    await cur.execute(self._sql.delete_lease, (event.agent_id,))
            if events:
                # Delivered at commit: the other daemons read the log up to here.
                await cur.execute(self._sql.notify, (self._sql.channel, str(events[-1].seq)))

    def committed(self, events: Sequence[Event]) -> None:
        self._held.update(self._created)
        self._created = {}
        for event in events:
            if event.type == ev.AGENT_DELETED and event.agent_id is not None:
                self._held.pop(event.agent_id, None)

    # --- joining and leaving ----------------------------------------------------------------

    async def join(self) -> None:
        """Create the tables if needed, take the shared mode lock, and write this node's row
        under a new incarnation; install the fence on the store. Raises
        :class:`NodeTakenError` or :class:`ClusterModeError` (nothing started)."""
        self._check_home()
        try:
            self._listener = await psycopg.AsyncConnection.connect(self._store.dsn, autocommit=True)
            row = await (
                await self._listener.execute(
                    "SELECT pg_try_advisory_lock_shared(%s)", (MODE_LOCK_KEY,)
                )
            ).fetchone()
            if not (row and row[0]):
                raise ClusterModeError(
                    "a daemon without --node holds this store: stop it, then start every "
                    "daemon with --node NAME"
                )
            self._conn = await psycopg.AsyncConnection.connect(self._store.dsn, autocommit=True)
            async with self._conn.transaction():
                await self._conn.execute("SELECT pg_advisory_xact_lock(%s)", (CLUSTER_LOCK_KEY,))
                for statement in self._sql.ddl:
                    await self._conn.execute(statement)
            await self._enter_when_free()
        except psycopg.OperationalError as exc:
            await self._close_connections()
            raise StoreUnavailableError(self._store.dsn_shown, str(exc).strip()) from exc
        except BaseException:
            await self._close_connections()
            raise
        self._store.fence_with(self)

    async def _enter_when_free(self) -> None:
        """:meth:`_enter`, waiting while a node of this name still has a lease: a daemon
        restarted at once after a crash finds its last incarnation's lease running for up
        to ``lease_s``. A lease that is still renewed after three times that is another
        live daemon of the same name: :class:`NodeTakenError`."""
        give_up = _now() + 3 * self.lease_s
        while True:
            try:
                await self._enter()
                return
            except _NameLive as live:
                if _now() + live.left_s > give_up:
                    raise NodeTakenError(
                        self.name,
                        f"a daemon under this name is live (its lease was renewed for "
                        f"{3 * self.lease_s:g} s while this one waited): give this one "
                        "another --node, or stop the other",
                    ) from None
                logger.info(
                    "node %s: waiting %.1f s for the lease of its last run to end",
                    self.name,
                    live.left_s,
                )
                await asyncio.sleep(min(self.lease_s / 4, live.left_s + 0.05))

    async def _enter(self) -> None:
        """Write this node's row under a new incarnation (the old one's writes are fenced)."""
        conn = self._require()
        incarnation = secrets.token_hex(8)
        async with self._work, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (CLUSTER_LOCK_KEY,))
            for name, token_hash, live, left_s in await (
                await conn.execute(self._sql.nodes_seen)
            ).fetchall():
                if name == self.name and live:
                    raise _NameLive(float(left_s))
                if live and token_hash != self._hash:
                    raise NodeTakenError(
                        self.name,
                        f"live daemon {name!r} uses another token: every daemon of a "
                        "store needs the same one (--token or CORRAL_TOKEN)",
                    )
            await conn.execute(
                self._sql.join,
                {
                    "name": self.name,
                    "inc": incarnation,
                    "url": self.url,
                    "hash": self._hash,
                    "lease": self.lease_s,
                },
            )
            self._valid_until = _now() + self.lease_s * 0.75
        self._incarnation = incarnation
        self._held.clear()

    async def start(self, service: Adopter, *, loop: bool = True) -> None:
        """Take up this node's agents: its own leases from before a restart (their turns in
        flight are settled as interrupted), then a fair share of the agents nobody owns;
        end what is left on this machine of agents it does not own; then renew every
        ``lease_s / 4`` and follow the log (``loop`` False: the caller calls :meth:`tick`)."""
        self._service = service
        if not await self._renew():
            # The service's start outlasted the lease taken at join: what adopting writes
            # would be refused, so join again first.
            await self._enter_when_free()
        own = await self._claim_own()
        if own:
            await service.adopt(own)
        await self.tick()
        strays = [
            agent
            for agent in self._store.state.agents
            if agent not in self._held and (self._home / "agents" / agent / "state").exists()
        ]
        if strays:
            await service.disown(strays)
        if loop:
            self._tasks = [
                asyncio.create_task(self._beat(), name=f"corral-node-{self.name}"),
                asyncio.create_task(self._listen(), name=f"corral-listen-{self.name}"),
                asyncio.create_task(self._follow(), name=f"corral-follow-{self.name}"),
            ]

    async def leave(self) -> None:
        """Stop renewing and mark this node stopped, so the others adopt its agents at once
        (their turns in flight, cancelled by the service's close, are settled there as
        interrupted). Idempotent; never raises."""
        if self._left:
            return
        self._left = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._conn is not None and self._incarnation:
            try:
                async with self._work:
                    await self._conn.execute(
                        self._sql.leave, {"name": self.name, "inc": self._incarnation}
                    )
            except psycopg.Error as exc:
                logger.warning("node %s: could not mark itself stopped: %s", self.name, exc)
        self._held.clear()
        await self._close_connections()

    # --- the loop -------------------------------------------------------------------------

    async def tick(self) -> list[str]:
        """One round: renew this node's lease (a lease found run out: stop acting for every
        agent, join again under a new incarnation; then take back those still leased to
        it, as a restart does), adopt a fair share of the agents nobody owns, read the
        log. The agents adopted. Raises ``StoreUnavailableError``
        when the database does not answer."""
        try:
            if not await self._renew():
                await self._lost("its lease ran out before it was renewed")
                await self._enter_when_free()
            adopted = await self._reclaim() + await self._adopt()
        except psycopg.OperationalError as exc:
            raise StoreUnavailableError(self._store.dsn_shown, str(exc).strip()) from exc
        if adopted and self._service is not None:
            logger.info("node %s: adopted %d agent(s)", self.name, len(adopted))
            await self._service.adopt(adopted)
        await self._store.refresh()
        return adopted

    async def _beat(self) -> None:
        period = self.lease_s / 4
        while True:
            await asyncio.sleep(min(period, max(0.0, self._valid_until - _now())))
            try:
                await self.tick()
            except NodeTakenError as exc:
                logger.error("node %s: %s", self.name, exc.message)
            except StoreUnavailableError as exc:
                logger.warning("node %s: %s", self.name, exc.message)
                await self._reconnect()
            except Exception:
                logger.exception("node %s: a round of its loop failed", self.name)
            if not self._fresh() and self._held:
                # Not renewed in time (the database is out of reach): stop acting before
                # another node may adopt.
                await self._lost("its lease could not be renewed in time")

    async def _lost(self, why: str) -> None:
        gone = list(self._held)
        self._held.clear()
        # Their leases still name this node, live again once it renews or joins again:
        # nobody else adopts them, so the next round takes them back (see _reclaim).
        self._lost_some = self._lost_some or bool(gone)
        logger.warning("node %s: %s; stopping %d agent(s)", self.name, why, len(gone))
        if gone and self._service is not None:
            await self._service.disown(gone)

    async def _renew(self) -> bool:
        conn = self._require()
        sent = _now()
        async with self._work:
            cur = await conn.execute(
                self._sql.renew,
                {"name": self.name, "inc": self._incarnation, "lease": self.lease_s},
            )
            renewed = await cur.fetchone() is not None
        if renewed:
            # Counted from when the renewal was sent, with a margin for clocks that drift.
            self._valid_until = sent + self.lease_s * 0.75
        return renewed

    async def _reclaim(self) -> list[str]:
        """After :meth:`_lost`: the leases still in this node's name that no other node
        adopted meanwhile, taken back with their epochs moved on (as after a restart)."""
        if not self._lost_some or not self._fresh():
            return []
        self._lost_some = False
        return await self._claim_own()

    async def _claim_own(self) -> list[str]:
        """This node's leases from its last incarnation, with their epochs moved on."""
        conn = self._require()
        async with self._work, conn.transaction():
            await conn.execute(self._sql.lock_counter)
            rows = await (await conn.execute(self._sql.claim_own, {"name": self.name})).fetchall()
        for agent, epoch in rows:
            self._held[agent] = int(epoch)
        return [agent for agent, _ in rows]

    async def _adopt(self) -> list[str]:
        """Take a fair share of the runs whose agents no live node owns (whole runs: a
        parent and its children stay on one node)."""
        if not self._fresh():
            return []
        conn = self._require()
        async with self._work, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (CLUSTER_LOCK_KEY,))
            await conn.execute(self._sql.lock_counter)
            await conn.execute(self._sql.lease_strays)
            runs = [r for (r,) in await (await conn.execute(self._sql.orphan_runs)).fetchall()]
            if not runs:
                return []
            row = await (await conn.execute(self._sql.live_count)).fetchone()
            live = max(1, int(row[0]) if row else 1)
            share = runs[: math.ceil(len(runs) / live)]
            rows = await (
                await conn.execute(self._sql.adopt, {"name": self.name, "runs": share})
            ).fetchall()
        for agent, epoch in rows:
            self._held[agent] = int(epoch)
        return [agent for agent, _ in rows]

    # --- following the log ------------------------------------------------------------------

    async def _listen(self) -> None:
        """Wake :meth:`_follow` on each NOTIFY of another daemon's commit."""
        while True:
            try:
                conn = self._listener
                if conn is None or conn.closed:
                    conn = self._listener = await psycopg.AsyncConnection.connect(
                        self._store.dsn, autocommit=True
                    )
                    await conn.execute("SELECT pg_try_advisory_lock_shared(%s)", (MODE_LOCK_KEY,))
                await conn.execute(self._sql.listen)
                self._dirty.set()  # what was committed while not listening
                async for _ in conn.notifies():
                    self._dirty.set()
            except psycopg.Error as exc:
                logger.warning("node %s: not listening for commits: %s", self.name, exc)
                await asyncio.sleep(self.lease_s / 4)

    async def _follow(self) -> None:
        """Read the log whenever another daemon committed (many wake-ups, one read)."""
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            try:
                await self._store.refresh()
            except StoreUnavailableError as exc:
                logger.warning("node %s: could not read the log: %s", self.name, exc.message)
                await asyncio.sleep(self.lease_s / 4)
                self._dirty.set()

    # --- lookups ----------------------------------------------------------------------------

    async def owner_of(self, agent_id: str) -> Owner | None:
        """The node that owns ``agent_id`` (None: no lease, e.g. not yet adopted)."""
        conn = self._require()
        async with self._work:
            row = await (await conn.execute(self._sql.owner, (agent_id,))).fetchone()
        if row is None or not row[0]:
            return None
        node, url, live, left = row
        return Owner(str(node), str(url or ""), bool(live), float(left))

    def adoption_within_s(self, owner: Owner) -> float:
        """Seconds (to 0.1) within which a node that is not live has its agents adopted:
        what is left of its lease, and a round of the adopters after it."""
        return round(max(0.0, owner.lease_left_s) + self.lease_s / 4, 1)

    async def node_of(self, agent_id: str) -> str | None:
        if agent_id in self._held:
            return self.name
        owner = await self.owner_of(agent_id)
        return None if owner is None else owner.node

    async def placement(self, asked: str | None = None) -> Owner:
        """The node a new top-level agent goes to: ``asked`` (it must be live: else
        :class:`NodeNotFoundError`), or the live node with the fewest live agents."""
        conn = self._require()
        async with self._work:
            rows = await (await conn.execute(self._sql.load, (sorted(ENDED_STATES),))).fetchall()
        live = [Owner(str(name), str(url), True, self.lease_s) for name, url, _ in rows]
        if asked is not None:
            for owner in live:
                if owner.node == asked:
                    return owner
            raise NodeNotFoundError(asked, [o.node for o in live])
        if not live:  # this node's own row is being renewed: it is live
            return Owner(self.name, self.url, True, self.lease_s)
        return live[0]

    async def nodes(self) -> list[NodeInfo]:
        """Every node the store has seen, live or not, with the agents it holds leases of."""
        conn = self._require()
        async with self._work:
            rows = await (await conn.execute(self._sql.node_list)).fetchall()
        return [
            NodeInfo(
                name=name,
                url=url,
                live=bool(live),
                stopped=bool(stopped),
                started_at=started,
                heartbeat=beat,
                heartbeat_age_s=float(age),
                agents=list(agents),
            )
            for name, url, started, beat, live, stopped, age, agents in rows
        ]

    # --- helpers ----------------------------------------------------------------------------

    def _fresh(self) -> bool:
        return bool(self._incarnation) and _now() < self._valid_until

    def _require(self) -> _Conn:
        if self._conn is None or self._left:
            raise ClusterModeError(f"node {self.name!r} has not joined its store")
        return self._conn

    async def _reconnect(self) -> None:
        if self._conn is not None and not self._conn.closed:
            return
        with contextlib.suppress(psycopg.Error):
            self._conn = await psycopg.AsyncConnection.connect(self._store.dsn, autocommit=True)

    async def _close_connections(self) -> None:
        for conn in (self._conn, self._listener):
            if conn is not None:
                with contextlib.suppress(psycopg.Error):
                    await conn.close()
        self._conn = self._listener = None

    def _check_home(self) -> None:
        """One home per node: a node ending "its leftovers" must find only its own."""
        mark = self._home / "node"
        try:
            seen = mark.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            self._home.mkdir(parents=True, exist_ok=True)
            mark.write_text(self.name + "\n", encoding="utf-8")
            return
        if seen != self.name:
            raise NodeTakenError(
                self.name,
                f"its home {str(self._home)!r} belongs to node {seen!r}: give each node a "
                "home of its own (--home)",
            )

    def __repr__(self) -> str:
        return f"Node({self.name!r}, lease_s={self.lease_s:g})"


class _NameLive(Exception):
    """A node of this name still has ``left_s`` seconds of lease."""

    def __init__(self, left_s: float) -> None:
        super().__init__(left_s)
        self.left_s = left_s


def _now() -> float:
    return asyncio.get_running_loop().time()
