"""corral.gateway: agents on a real database without wrong reads, double writes or runaway
queries (PostgreSQL first, SQLite second).

Under construction: the building blocks are in place (``_sql`` analyses and refuses SQL with
libpg_query, ``_ops`` compiles structured operations, ``_catalog_load`` reads what a database
holds); the ``Gateway`` that executes, journals idempotency keys, pools connections per agent
and freezes agents comes next, and with it this package's public names.
"""

__all__: list[str] = []
