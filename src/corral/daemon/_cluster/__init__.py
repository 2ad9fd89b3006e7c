"""Several daemons on one PostgreSQL store: nodes, leases with fencing, adoption of a dead
daemon's agents, commands sent on to their owner (docs/daemon.md, "Several daemons").

This package imports no database driver; ``_node`` (psycopg), ``_forward`` (httpx) and
``_alone`` are imported where a daemon joins a PostgreSQL store.
"""

from corral.daemon._cluster._naming import DEFAULT_LEASE_S, FORWARDED_HEADER, check_node_name

__all__ = ["DEFAULT_LEASE_S", "FORWARDED_HEADER", "check_node_name"]
