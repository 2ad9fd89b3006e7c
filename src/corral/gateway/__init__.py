"""corral.gateway: agents on a real database without wrong reads, double writes or runaway
queries.

A :class:`Gateway` fronts one PostgreSQL database (:meth:`Gateway.connect`). Each request, SQL
(``{"sql": ..., "params": [...]}``) or a structured operation (``find``, ``count``, ``insert``,
``update``, ``delete``), is analysed against the database's catalog before anything is sent:
unknown tables and columns (with close matches), several statements, DDL, transaction
control and dangerous functions are refused with a :class:`GatewayError` whose ``code`` is
stable. Reads run in READ ONLY transactions, so a write the analysis missed fails as
``read_only_violation``; a read that finds no rows says whether its tables were empty
(``genuinely_empty``) or its filter matched nothing (``suspiciously_empty``). Writes need an
``idempotency_key``, journalled in the write's own transaction: a retry is ``replayed``,
never run twice. Each agent has its own small pool (``pool_exhausted`` at once, never a
queue), statement timeout and row cap. Per-agent breakers (:class:`BreakerPolicy`) count
errors, refusals and suspicious empties over a rolling window; crossing a threshold freezes
the agent (``agent_frozen`` on every request, its pool drained, the evidence recorded) until
a person reinstates it, and freezes survive restarts.

:class:`SQLiteGateway` fronts a SQLite file with the same two request forms: SQL is compiled by
SQLite itself under an authorizer before it runs (never executed for the check), reads run on
read-only connections, empties are loud, and idempotency keys are journalled in the target,
in the write's own transaction. The daemon fronts either with ``corral serve --db NAME=DSN``
(HTTP ``POST /gateway/query``, the MCP ``db_query`` tool, ``corral gateway``).
"""

from corral.gateway._breaker_journal import (
    FreezeJournal,
    PostgresFreezeJournal,
    SQLiteFreezeJournal,
)
from corral.gateway._breaker_records import (
    BreakerPolicy,
    BreakerStatus,
    Freeze,
    Reinstatement,
    RequestOutcome,
)
from corral.gateway._catalog import Catalog
from corral.gateway._errors import GatewayError
from corral.gateway._gateway import Gateway
from corral.gateway._ops import compile_operation
from corral.gateway._result import GatewayResult, QueryOutcome
from corral.gateway._sqlite_gateway import SQLiteGateway
from corral.gateway.postgres._sql import analyze

__all__ = [
    "BreakerPolicy",
    "BreakerStatus",
    "Catalog",
    "Freeze",
    "FreezeJournal",
    "Gateway",
    "GatewayError",
    "GatewayResult",
    "PostgresFreezeJournal",
    "QueryOutcome",
    "Reinstatement",
    "RequestOutcome",
    "SQLiteFreezeJournal",
    "SQLiteGateway",
    "analyze",
    "compile_operation",
]
