"""The contract between the gateway's front (:class:`~._gateway.Gateway`) and a database engine
(:mod:`~.postgres` or :mod:`~.sqlite`): the front owns the request pipeline, an engine plans,
reads, writes and keeps the catalog for one database."""

from __future__ import annotations

from typing import Any, Literal, Protocol, TypeVar

from corral.gateway._breaker_journal import FreezeJournal
from corral.gateway._catalog import Catalog
from corral.gateway._errors import GatewayError
from corral.gateway._result import GatewayResult

__all__ = ["Engine", "Planned"]


class Planned(Protocol):
    """A request an engine has analysed against its catalog, ready to run."""

    @property
    def kind(self) -> Literal["read", "write"]: ...

    @property
    def key(self) -> str | None:
        """The request's ``idempotency_key`` (None when absent)."""
        ...

    def fingerprint(self) -> str:
        """What identifies the work for its key (see :func:`~._journal.fingerprint`)."""
        ...


P = TypeVar("P", bound=Planned)


class Engine(Protocol[P]):
    """One database behind a :class:`~._gateway.Gateway`.

    Every method but the lifecycle ones is called on an open engine, and raises
    ``GatewayError`` only. ``write_noun`` names what a write is in the engine's
    ``idempotency_key_required`` message ("statement", "operation").
    """

    write_noun: str

    @property
    def is_open(self) -> bool:
        """Whether requests may run (False before ``open`` and from ``closing`` on)."""
        ...

    @property
    def catalog(self) -> Catalog: ...

    def freeze_journal(self) -> FreezeJournal:
        """Where the breakers keep freezes for this database."""
        ...

    async def open(self) -> None:
        """Reach the database; the breakers' journal opens next, then :meth:`load_catalog`."""
        ...

    async def load_catalog(self) -> None:
        """Load the catalog for the first time."""
        ...

    def closing(self) -> None:
        """The gateway starts closing: stop taking requests where the engine needs to."""
        ...

    async def close(self) -> None:
        """Close every connection. Idempotent."""
        ...

    async def refresh_catalog(self) -> Catalog: ...

    async def refresh_if_old(self) -> None:
        """Reload the catalog when it is older than the engine allows (each request)."""
        ...

    async def reload_catalog(self, sign: Literal["refused", "database"]) -> bool:
        """Reload after a sign the schema changed; whether the catalog changed."""
        ...

    def schema_shrunk(self, error: GatewayError) -> bool:
        """Whether the database refused ``error`` for an undefined table or column."""
        ...

    async def plan(self, request: Any, catalog: Catalog) -> P:
        """Check ``request``'s shape and analyse it against ``catalog``."""
        ...

    async def read(self, agent_id: str, planned: P) -> GatewayResult: ...

    async def write(self, agent_id: str, key: str, planned: P) -> GatewayResult:
        """Run the write once under ``(agent_id, key, plan_hash)``, the plan hash being the
        planned request's (keys in flight included)."""
        ...

    async def drain(self, agent_id: str) -> bool:
        """Close the agent's connections and cancel its statements; whether it had any."""
        ...

    def connections_in_use(self, agent_id: str) -> int: ...
