"""The gateway's SQLite engine: analysis by SQLite's own compiler under an authorizer,
reads on read-only connections, writes journalled in the target. Private: use
:class:`corral.gateway.Gateway`."""
