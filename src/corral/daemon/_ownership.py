"""Which agents a daemon acts for: all of them alone, its leased ones among several."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from corral.daemon._api import AgentApi


@runtime_checkable
class Ownership(Protocol):
    """Tells the agent service which agents it may act for (run turns, time approvals, wake).

    Alone on its store a daemon owns every agent (the service's default, no ``Ownership``).
    Among several daemons on one PostgreSQL store (``corral.daemon._cluster``) it owns the
    agents whose leases it holds; the store refuses its writes for any other (fencing).
    """

    def owns(self, agent_id: str) -> bool:
        """Whether this daemon holds ``agent_id``'s lease now (an agent it has just
        created counts as its own)."""
        ...

    async def node_of(self, agent_id: str) -> str | None:
        """The name of the daemon that owns ``agent_id`` (None: none does yet)."""
        ...


class Relay(Protocol):
    """Where commands about an agent another daemon owns go (``_cluster._relay``)."""

    async def api_for(
        self, agent_id: str, caller_name: str | None, principal: str | None
    ) -> AgentApi | None:
        """A client of the agent's owner acting as the caller; None when it is owned here."""
        ...

    async def aclose(self) -> None:
        """Close the clients it made."""
        ...
