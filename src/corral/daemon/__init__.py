"""corral.daemon: agents under supervision as a service.

``AgentService`` runs agents from JSON specs through harnesses (``command``, ``python``,
``openai``), applies the failure policies and the circuit breaker, keeps budgets, inboxes and
decisions, and writes everything to a ``Store`` (SQLite or PostgreSQL) as an append-only
event log with projections, committed before anything is announced.
"""

from typing import TYPE_CHECKING

from corral.daemon._api import AgentApi, LocalApi
from corral.daemon._auth import Caller
from corral.daemon._client import (
    DaemonUnreachableError,
    HttpApi,
    RemoteError,
    follow_events,
)
from corral.daemon._errors import (
    AgentBudgetExhaustedError,
    AgentBusyError,
    AgentNotFoundError,
    AgentNotLiveError,
    DaemonError,
    GuardrailsFileError,
    IdempotencyConflictError,
    InvalidRequestError,
    InvalidSpecError,
    NothingToSendError,
    OutOfScopeError,
    ServiceClosedError,
    SpawnRefusedError,
    StoreUnavailableError,
    TokenExistsError,
    TokenFileError,
    TokenNotFoundError,
    UnauthorizedError,
    UnstorableValueError,
)
from corral.daemon._events import Event, NewEvent
from corral.daemon._http import create_app
from corral.daemon._server import ServeConfig, open_store, serve
from corral.daemon._service import AgentService, CommandResult
from corral.daemon._spec import AgentSpec, parse_spec
from corral.daemon._state import State, replay
from corral.daemon._status import http_status
from corral.daemon._targets import TargetOptions
from corral.daemon._token_file import read_token_file, token_path
from corral.daemon.harnesses import (
    AdoptingHarness,
    CommandHarness,
    Harness,
    NothingToAdoptError,
    OpenAIHarness,
    PythonHarness,
    TurnContext,
    TurnFailedError,
    TurnRequest,
    TurnResult,
    WarmHarness,
)
from corral.daemon.stores import SQLiteStore, Store

if TYPE_CHECKING:  # imported on first use (see __getattr__), typed here
    from corral.daemon._mcp import McpApp, build_mcp_server, mcp_asgi_app, run_stdio

__all__ = [
    "AgentApi",
    "AdoptingHarness",
    "AgentBudgetExhaustedError",
    "AgentBusyError",
    "AgentNotFoundError",
    "AgentNotLiveError",
    "AgentService",
    "AgentSpec",
    "Caller",
    "CommandHarness",
    "CommandResult",
    "DaemonError",
    "DaemonUnreachableError",
    "Event",
    "GuardrailsFileError",
    "Harness",
    "HttpApi",
    "IdempotencyConflictError",
    "InvalidRequestError",
    "InvalidSpecError",
    "LocalApi",
    "McpApp",
    "NewEvent",
    "NothingToAdoptError",
    "NothingToSendError",
    "OpenAIHarness",
    "OutOfScopeError",
    "PythonHarness",
    "RemoteError",
    "SQLiteStore",
    "ServeConfig",
    "ServiceClosedError",
    "SpawnRefusedError",
    "State",
    "Store",
    "StoreUnavailableError",
    "TargetOptions",
    "TokenExistsError",
    "TokenFileError",
    "TokenNotFoundError",
    "TurnContext",
    "TurnFailedError",
    "TurnRequest",
    "TurnResult",
    "WarmHarness",
    "UnauthorizedError",
    "UnstorableValueError",
    "build_mcp_server",
    "create_app",
    "follow_events",
    "http_status",
    "mcp_asgi_app",
    "open_store",
    "parse_spec",
    "read_token_file",
    "replay",
    "run_stdio",
    "serve",
    "token_path",
]


def __getattr__(name: str) -> object:
    # PostgreSQL support needs the ``postgres`` extra (psycopg): import it only when asked.
    if name == "PostgresStore":
        from corral.daemon.stores import _postgres

        return _postgres.PostgresStore
    # MCP (the mcp SDK) only when asked: it would double the start-up time of every command.
    if name in {"McpApp", "build_mcp_server", "mcp_asgi_app", "run_stdio"}:
        from corral.daemon import _mcp

        return getattr(_mcp, name)
    raise AttributeError(f"module 'corral.daemon' has no attribute {name!r}")
