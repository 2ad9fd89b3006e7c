"""corral.daemon: agents under supervision as a service.

``AgentService`` runs agents from JSON specs through harnesses (``command``, ``python``,
``openai``), applies the failure policies and the circuit breaker, keeps budgets, inboxes and
decisions, and writes everything to a ``Store`` (SQLite or PostgreSQL) as an append-only
event log with projections, committed before anything is announced.
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the names, typed; each is imported on first use (see __getattr__)
    from corral.daemon._api import (
        AgentApi,
        LocalApi,
    )
    from corral.daemon._auth import (
        Caller,
    )
    from corral.daemon._client import (
        DaemonUnreachableError,
        HttpApi,
        RemoteError,
        follow_events,
    )
    from corral.daemon._errors import (
        AgentBudgetExhaustedError,
        AgentBusyError,
        AgentLiveError,
        AgentNotFoundError,
        AgentNotLiveError,
        AgentPausedError,
        DaemonError,
        GuardrailsFileError,
        IdempotencyConflictError,
        InvalidQueryError,
        InvalidRequestError,
        InvalidSpecError,
        NothingToSendError,
        OutOfScopeError,
        ParentEndedError,
        RunNotFoundError,
        ServiceClosedError,
        SpawnRefusedError,
        StoreUnavailableError,
        TokenExistsError,
        TokenFileError,
        TokenNotFoundError,
        UnauthorizedError,
        UnstorableValueError,
    )
    from corral.daemon._events import (
        Event,
        NewEvent,
    )
    from corral.daemon._http import (
        create_app,
    )
    from corral.daemon._mcp import (
        McpApp,
        build_mcp_server,
        mcp_asgi_app,
        run_stdio,
    )
    from corral.daemon._server import (
        ServeConfig,
        open_store,
        serve,
    )
    from corral.daemon._service import (
        AgentService,
        CommandResult,
    )
    from corral.daemon._spec import (
        AgentSpec,
        parse_spec,
    )
    from corral.daemon._state import (
        State,
        replay,
    )
    from corral.daemon._status import (
        http_status,
    )
    from corral.daemon._targets import (
        TargetOptions,
    )
    from corral.daemon._token_file import (
        read_token_file,
        token_path,
    )
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
    from corral.daemon.stores import (
        SQLiteStore,
        Store,
    )

# Where each public name lives: a command that needs only the HTTP client (`corral check`
# inside an agent) must not pay for the server, FastAPI and MCP at import.
_HOMES: dict[str, str] = {
    "AdoptingHarness": "corral.daemon.harnesses",
    "AgentApi": "corral.daemon._api",
    "AgentBudgetExhaustedError": "corral.daemon._errors",
    "AgentBusyError": "corral.daemon._errors",
    "AgentNotFoundError": "corral.daemon._errors",
    "AgentLiveError": "corral.daemon._errors",
    "AgentNotLiveError": "corral.daemon._errors",
    "AgentPausedError": "corral.daemon._errors",
    "ParentEndedError": "corral.daemon._errors",
    "AgentService": "corral.daemon._service",
    "AgentSpec": "corral.daemon._spec",
    "Caller": "corral.daemon._auth",
    "CommandHarness": "corral.daemon.harnesses",
    "CommandResult": "corral.daemon._service",
    "DaemonError": "corral.daemon._errors",
    "DaemonUnreachableError": "corral.daemon._client",
    "Event": "corral.daemon._events",
    "GuardrailsFileError": "corral.daemon._errors",
    "Harness": "corral.daemon.harnesses",
    "HttpApi": "corral.daemon._client",
    "IdempotencyConflictError": "corral.daemon._errors",
    "InvalidQueryError": "corral.daemon._errors",
    "InvalidRequestError": "corral.daemon._errors",
    "InvalidSpecError": "corral.daemon._errors",
    "LocalApi": "corral.daemon._api",
    "McpApp": "corral.daemon._mcp",
    "NewEvent": "corral.daemon._events",
    "NothingToAdoptError": "corral.daemon.harnesses",
    "NothingToSendError": "corral.daemon._errors",
    "OpenAIHarness": "corral.daemon.harnesses",
    "OutOfScopeError": "corral.daemon._errors",
    # PostgreSQL support needs the ``postgres`` extra (psycopg): not in __all__.
    "PostgresStore": "corral.daemon.stores._postgres",
    "PythonHarness": "corral.daemon.harnesses",
    "RemoteError": "corral.daemon._client",
    "SQLiteStore": "corral.daemon.stores",
    "ServeConfig": "corral.daemon._server",
    "RunNotFoundError": "corral.daemon._errors",
    "ServiceClosedError": "corral.daemon._errors",
    "SpawnRefusedError": "corral.daemon._errors",
    "State": "corral.daemon._state",
    "Store": "corral.daemon.stores",
    "StoreUnavailableError": "corral.daemon._errors",
    "TargetOptions": "corral.daemon._targets",
    "TokenExistsError": "corral.daemon._errors",
    "TokenFileError": "corral.daemon._errors",
    "TokenNotFoundError": "corral.daemon._errors",
    "TurnContext": "corral.daemon.harnesses",
    "TurnFailedError": "corral.daemon.harnesses",
    "TurnRequest": "corral.daemon.harnesses",
    "TurnResult": "corral.daemon.harnesses",
    "UnauthorizedError": "corral.daemon._errors",
    "UnstorableValueError": "corral.daemon._errors",
    "WarmHarness": "corral.daemon.harnesses",
    "build_mcp_server": "corral.daemon._mcp",
    "create_app": "corral.daemon._http",
    "follow_events": "corral.daemon._client",
    "http_status": "corral.daemon._status",
    "mcp_asgi_app": "corral.daemon._mcp",
    "open_store": "corral.daemon._server",
    "parse_spec": "corral.daemon._spec",
    "read_token_file": "corral.daemon._token_file",
    "replay": "corral.daemon._state",
    "run_stdio": "corral.daemon._mcp",
    "serve": "corral.daemon._server",
    "token_path": "corral.daemon._token_file",
}

__all__ = [
    "AgentApi",
    "AdoptingHarness",
    "AgentBudgetExhaustedError",
    "AgentBusyError",
    "AgentNotFoundError",
    "AgentLiveError",
    "AgentNotLiveError",
    "AgentPausedError",
    "AgentService",
    "ParentEndedError",
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
    "InvalidQueryError",
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
    "RunNotFoundError",
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
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'corral.daemon' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # the next lookup does not come here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
