"""Which agents a daemon acts for: all of them alone, its leased ones among several."""

from __future__ import annotations

from typing import Protocol, runtime_checkable


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
