"""The gateway's PostgreSQL engine: analysis with libpg_query, per-agent pools, one-round-trip
reads and journalled writes over the wire protocol. Private: use
:class:`corral.gateway.Gateway`."""
