"""corral.gateway: agents on a real database (PostgreSQL or SQLite) without wrong reads, double
writes or runaway queries. :class:`Gateway` is the way in (``Gateway.connect(dsn)``); the manual
is docs/gateway.md, the design docs/architecture.md (seed 003)."""

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
