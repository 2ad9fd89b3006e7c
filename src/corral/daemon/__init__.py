"""corral.daemon: agents under supervision as a service.

``AgentService`` runs agents from JSON specs through harnesses (``command``, ``python``,
``openai``), applies the failure policies and the circuit breaker, keeps budgets, inboxes and
decisions, and writes everything to a ``Store`` (SQLite or PostgreSQL) as an append-only
event log with projections, committed before anything is announced.
"""

from corral.daemon._errors import (
    AgentBudgetExhaustedError,
    AgentBusyError,
    AgentNotFoundError,
    AgentNotLiveError,
    DaemonError,
    IdempotencyConflictError,
    InvalidSpecError,
    NothingToSendError,
    SpawnRefusedError,
    UnauthorizedError,
    http_status,
)
from corral.daemon._events import Event, NewEvent
from corral.daemon._harness import Harness, TurnFailedError, TurnRequest, TurnResult
from corral.daemon._service import AgentService, CommandResult
from corral.daemon._spec import AgentSpec, parse_spec
from corral.daemon._sqlite import SQLiteStore
from corral.daemon._state import State, replay
from corral.daemon._store import Store

__all__ = [
    "AgentBudgetExhaustedError",
    "AgentBusyError",
    "AgentNotFoundError",
    "AgentNotLiveError",
    "AgentService",
    "AgentSpec",
    "CommandResult",
    "DaemonError",
    "Event",
    "Harness",
    "IdempotencyConflictError",
    "InvalidSpecError",
    "NewEvent",
    "NothingToSendError",
    "SQLiteStore",
    "SpawnRefusedError",
    "State",
    "Store",
    "TurnFailedError",
    "TurnRequest",
    "TurnResult",
    "UnauthorizedError",
    "http_status",
    "parse_spec",
    "replay",
]


def __getattr__(name: str) -> object:
    # PostgreSQL support needs the ``postgres`` extra (psycopg): import it only when asked.
    if name in {"PostgresStore", "StoreUnavailableError"}:
        from corral.daemon import _postgres

        return getattr(_postgres, name)
    raise AttributeError(f"module 'corral.daemon' has no attribute {name!r}")
