"""Running the agent service: a store opened from its URL, the HTTP API served by uvicorn."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
import os
import signal
import socket
import sys
import threading
from collections.abc import Awaitable, Callable, Generator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import uvicorn
from fastapi import FastAPI
from starlette.routing import Route
from starlette.types import ASGIApp

from corral.daemon._agent_tools import CorralTools
from corral.daemon._api import LocalApi
from corral.daemon._cluster import DEFAULT_LEASE_S, check_node_name
from corral.daemon._databases import Databases
from corral.daemon._dsn import parse_dsn, redacted
from corral.daemon._errors import ClusterModeError, DaemonError
from corral.daemon._http import create_app, is_loopback_host
from corral.daemon._log_format import JsonFormatter
from corral.daemon._mcp import mcp_asgi_app
from corral.daemon._metrics import Metrics
from corral.daemon._service import AgentService
from corral.daemon._targets import (
    TargetOptions,
    check_target_name,
    check_target_options,
    target_kind,
)
from corral.daemon._token_file import default_home, ensure_token_file
from corral.daemon._tracing import check_otlp_endpoint, otlp_configured, start_otlp
from corral.daemon._turn_log import DEFAULT_TURN_LOG_BYTES
from corral.daemon.guardrails import Rule, check_custom, load_rules_file
from corral.daemon.harnesses import CommandHarness, Harness, OpenAIHarness, PythonHarness
from corral.daemon.stores import SQLiteStore, Store
from corral.kernel import SYSTEM_CLOCK, Clock, InvalidArgumentError, UsageError
from corral.kernel import _validate as v

if TYPE_CHECKING:
    from corral.daemon._cluster._node import Node


class TokenRequiredError(DaemonError, UsageError):
    """Listening beyond loopback without a bearer token is refused."""

    code = "token_required"

    def __init__(self, host: str) -> None:
        super().__init__(
            f"refusing to listen on {host!r} without a token: a host other than loopback "
            "(127.0.0.0/8, ::1, localhost) needs a bearer token (--token or CORRAL_TOKEN)",
            host=host,
        )


class ListenError(DaemonError):
    """The address cannot be listened on (in use, not local, unresolvable)."""

    code = "listen_failed"
    default_retryable = True

    def __init__(self, host: str, port: int, reason: str) -> None:
        super().__init__(f"cannot listen on {host}:{port}: {reason}", host=host, port=port)


def open_store(url: str, *, clock: Clock = SYSTEM_CLOCK) -> Store:
    """The (not yet opened) store that ``url`` names.

    ``sqlite:///relative/path``, ``sqlite:////absolute/path`` or a bare file path give a
    :class:`SQLiteStore`; ``postgresql://...`` (or ``postgres://``) or a libpq keyword
    connection string (``host=... dbname=...``, starting with a libpq keyword and ``=``) a
    ``PostgresStore``. Anything else raises ``InvalidArgumentError``.
    """
    kind, target = parse_dsn(url)
    if kind == "sqlite":
        return SQLiteStore(target, clock=clock)
    from corral.daemon.stores._postgres import PostgresStore  # psycopg only when it is asked for

    store: Store = PostgresStore(target, clock=clock)
    return store


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeConfig:
    """How ``serve`` runs the daemon.

    ``databases`` maps names to the databases agents reach through the gateway
    (``postgresql://...``, a libpq keyword string, ``sqlite:///PATH`` or a file path; names
    are a letter then letters, digits, ``_`` or ``-``); they are opened when the daemon
    starts, and a database that cannot be reached stops it from starting. ``db_pool_size``,
    ``db_statement_timeout_s`` and ``db_max_rows`` apply to every agent in every database;
    ``db_options`` maps some of the databases' names to their own :class:`TargetOptions`
    (an option of the other engine, or a name not in ``databases``, is refused here).
    ``guardrails`` names a JSON file of daemon-wide guardrail rules that every agent's
    actions are checked with before its own (read when the daemon starts; a file that
    cannot be used stops it from starting with ``GuardrailsFileError``).
    ``port`` 0 picks a free port. ``token`` defaults to the ``CORRAL_TOKEN`` environment
    variable; without one, ``serve`` uses the token in ``<home>/token`` (made on first start,
    readable by its owner only), so every request but ``GET /healthz`` needs a token either
    way. A ``host`` that is not loopback without an explicit token raises
    :class:`TokenRequiredError` here, before anything starts (a client elsewhere must be
    given the token anyway). ``store`` is a URL for :func:`open_store`; ``home`` (default
    ``CORRAL_HOME``, else ``.corral``) holds the agents' directories and the token file.
    ``max_concurrent_turns`` bounds the turns that run at once (None: no bound), shared
    by the agents' priorities (docs/daemon.md, "Headcount and priority").
    ``turn_log_bytes`` caps each turn's kept output and log (docs/daemon.md, "Turns and
    logs"); the default harnesses keep a command's output up to it too.
    ``metrics_public`` serves ``GET /metrics`` without a token (docs/daemon.md,
    "Metrics"); ``otlp_endpoint`` (or the standard ``OTEL_EXPORTER_OTLP_ENDPOINT``) exports
    traces over OTLP/HTTP (needs ``corral[otel]``; see "Traces").
    ``heartbeat_s`` spaces the
    SSE heartbeat comments; ``shutdown_timeout_s`` bounds the wait for open requests when
    stopping. Bad values raise ``InvalidArgumentError``.
    """

    host: str = "127.0.0.1"
    port: int = 4600
    store: str = "sqlite:///.corral/corral.db"
    home: str | Path = field(default_factory=default_home)
    token: str | None = field(default=None, repr=False)
    heartbeat_s: float = 15.0
    max_body_bytes: int = 1_048_576
    shutdown_timeout_s: float = 5.0
    databases: Mapping[str, str] = field(default_factory=dict)
    db_pool_size: int = 2
    db_statement_timeout_s: float = 5.0
    db_max_rows: int = 1000
    db_options: Mapping[str, TargetOptions] = field(default_factory=dict)
    guardrails: str | Path | None = None
    max_concurrent_turns: int | None = None
    turn_log_bytes: int = DEFAULT_TURN_LOG_BYTES
    metrics_public: bool = False
    otlp_endpoint: str | None = None
    node: str | None = None
    lease_s: float = DEFAULT_LEASE_S
    advertise_url: str | None = None

    def __post_init__(self) -> None:
        where = "ServeConfig"
        v.non_empty_str(where, "host", self.host)
        v.non_negative_int(where, "port", self.port)
        if self.port > 65535:
            raise InvalidArgumentError(where, "port", "an integer from 0 to 65535", self.port)
        parse_dsn(self.store)
        v.instance_of(where, "home", self.home, (str, Path))
        if not str(self.home).strip():
            raise InvalidArgumentError(where, "home", "a non-empty path", self.home)
        token = self.token
        if token is None:
            token = os.environ.get("CORRAL_TOKEN") or None
            object.__setattr__(self, "token", token)
        v.non_empty_str(where, "token", token, optional=True)
        if token is not None and not (token.isascii() and token.isprintable() and " " not in token):
            raise InvalidArgumentError(where, "token", "printable ASCII without spaces", "<hidden>")
        v.positive_number(where, "heartbeat_s", self.heartbeat_s)
        v.positive_int(where, "max_body_bytes", self.max_body_bytes)
        v.positive_number(where, "shutdown_timeout_s", self.shutdown_timeout_s)
        v.instance_of(where, "databases", self.databases, Mapping)
        for name, dsn in self.databases.items():
            check_target_name(where, name, argument="databases")
            target_kind(dsn)
        object.__setattr__(self, "databases", dict(self.databases))
        v.positive_int(where, "db_pool_size", self.db_pool_size)
        v.positive_number(where, "db_statement_timeout_s", self.db_statement_timeout_s)
        v.positive_int(where, "db_max_rows", self.db_max_rows)
        check_target_options(where, self.databases, self.db_options)
        v.instance_of(where, "guardrails", self.guardrails, (str, Path, type(None)))
        v.positive_int(where, "max_concurrent_turns", self.max_concurrent_turns, optional=True)
        v.positive_int(where, "turn_log_bytes", self.turn_log_bytes)
        object.__setattr__(self, "db_options", dict(self.db_options))
        v.instance_of(where, "metrics_public", self.metrics_public, bool)
        check_otlp_endpoint(where, self.otlp_endpoint)
        if self.node is not None:
            check_node_name(where, self.node)
            if parse_dsn(self.store)[0] != "postgresql":
                raise ClusterModeError(
                    "--node needs a PostgreSQL store (--store postgresql://...): several "
                    "daemons share one database, never one SQLite file"
                )
        v.positive_number(where, "lease_s", self.lease_s)
        if not 0.2 <= self.lease_s <= 600:
            raise InvalidArgumentError(where, "lease_s", "from 0.2 to 600 seconds", self.lease_s)
        if self.advertise_url is not None and not self.advertise_url.startswith(
            ("http://", "https://")
        ):
            raise InvalidArgumentError(
                where, "advertise_url", "an http:// or https:// URL", self.advertise_url
            )
        if token is None and not is_loopback_host(self.host):
            raise TokenRequiredError(self.host)


async def serve(
    config: ServeConfig,
    *,
    harnesses: Mapping[str, Harness] | None = None,
    ready: Callable[[str], Any] | None = None,
    clock: Clock = SYSTEM_CLOCK,
    front: Callable[[FastAPI], ASGIApp] | None = None,
) -> None:
    """Run the daemon until cancelled or sent SIGTERM/SIGINT.

    Binds first (a busy address raises :class:`ListenError` before the store is touched),
    reads (or makes) the token file unless ``config`` has a token (an untrustworthy file
    raises :class:`~._errors.TokenFileError`), opens the store, starts the service (settling
    turns a previous process left in flight), then serves. Prints one line with the address
    and where the token is (never the token); ``ready`` (plain or coroutine function)
    is called with the URL that local clients and agents use (also the agents'
    ``CORRAL_URL``; a wildcard host gives the loopback URL). On SIGTERM/SIGINT it returns
    after a clean shutdown; on cancellation it shuts down the same way and re-raises.
    ``harnesses`` defaults to the ``command``, ``python`` and ``openai`` harnesses.
    ``front`` wraps the HTTP API's app in another ASGI app that is served instead (the
    console, ``corral.console.Console``, which the daemon does not import: ``corral serve``
    composes them); it sees the app's ``state`` (``api``, ``callers``).
    """
    where = "serve"
    v.instance_of(where, "config", config, ServeConfig)
    if harnesses is not None:
        v.instance_of(where, "harnesses", harnesses, Mapping)
    if ready is not None:
        v.callable_(where, "ready", ready)
    if front is not None:
        v.callable_(where, "front", front)
    rules: tuple[Rule, ...] = ()
    if config.guardrails is not None:
        rules = load_rules_file(config.guardrails)
        check_custom(rules, "guardrails file")
    sock = _listen(config.host, config.port)
    try:
        listen_url, local_url = _urls(sock)
        token, token_file = config.token, None
        if token is None:
            token, token_file = ensure_token_file(config.home)
        store = open_store(config.store, clock=clock)
        stop_tracing = None
        if otlp_configured(config.otlp_endpoint):
            stop_tracing = start_otlp(config.otlp_endpoint)
        try:
            await store.open()
            node, alone = await _take_store(config, store, token, listen_url, local_url)
            service = AgentService(
                store,
                home=config.home,
                harnesses=(
                    _default_harnesses(config.turn_log_bytes) if harnesses is None else harnesses
                ),
                url=local_url,
                clock=clock,
                token=token,
                guardrails=rules,
                max_concurrent_turns=config.max_concurrent_turns,
                turn_log_bytes=config.turn_log_bytes,
                ownership=node,
            )
            if node is not None:
                from corral.daemon._cluster._relay import NodeRelay

                # The console's and MCP's commands about another daemon's agents go there.
                service.use_relay(NodeRelay(node, token))
            # openai agents' corral tools (openai.corralTools), with the databases once open.
            tools = CorralTools(LocalApi(service))
            service.use_agent_tools(tools.for_agent)
            metrics = Metrics.of(service)  # before start: its settlements count too
            try:
                await service.start()
                if node is not None:
                    await node.start(service)
                databases = None
                if config.databases:
                    databases = await Databases.open(
                        config.databases,
                        service=service,
                        pool_size=config.db_pool_size,
                        statement_timeout_s=config.db_statement_timeout_s,
                        max_rows=config.db_max_rows,
                        clock=clock,
                        options=config.db_options,
                    )
                    tools.api = LocalApi(service, databases)
                    metrics.watch(databases)
                try:
                    served = _Served(sock, listen_url, local_url, token, token_file)
                    await _run(config, service, databases, served, ready, metrics, front, node)
                finally:
                    if databases is not None:
                        await databases.close()
            finally:
                await service.close()
                # After the service: its turns are cancelled, nothing more is written, and
                # the other daemons adopt this one's agents at once.
                if node is not None:
                    await node.leave()
                if service.relay is not None:
                    await service.relay.aclose()
                if alone is not None:
                    await alone.close()
        finally:
            try:
                await store.close()
            finally:
                if stop_tracing is not None:
                    stop_tracing()  # flushes the spans not yet exported
    finally:
        sock.close()


@dataclass(frozen=True, slots=True)
class _Served:
    """Where the daemon listens, the URL local clients use, and its token (and the file it
    came from, when it came from one)."""

    sock: socket.socket
    listen_url: str
    local_url: str
    token: str = field(repr=False)
    token_file: Path | None


async def _take_store(
    config: ServeConfig, store: Store, token: str, listen_url: str, local_url: str
) -> tuple[Node | None, Any]:
    """Join the store as node ``config.node``, or hold a PostgreSQL store alone (the
    connection that holds it is returned, to close at the end); a SQLite file has one
    daemon anyway."""
    from corral.daemon._cluster._alone import hold_alone
    from corral.daemon._cluster._node import Node
    from corral.daemon.stores._postgres import PostgresStore

    if not isinstance(store, PostgresStore):
        return None, None
    if config.node is None:
        return None, await hold_alone(store)
    url = config.advertise_url
    if url is None:
        # A wildcard address is no address to send to: this machine's name is.
        url = listen_url if local_url == listen_url else f"http://{socket.gethostname()}"
        if local_url != listen_url:
            url += ":" + listen_url.rsplit(":", 1)[1]
    node = Node(
        store, name=config.node, url=url, token=token, home=config.home, lease_s=config.lease_s
    )
    await node.join()
    return node, None


async def _run(
    config: ServeConfig,
    service: AgentService,
    databases: Databases | None,
    served: _Served,
    ready: Callable[[str], Any] | None,
    metrics: Metrics,
    front: Callable[[FastAPI], ASGIApp] | None = None,
    node: Node | None = None,
) -> None:
    app = create_app(
        service,
        token=served.token,
        max_body_bytes=config.max_body_bytes,
        heartbeat_s=config.heartbeat_s,
        databases=databases,
        metrics=metrics,
        metrics_public=config.metrics_public,
        node=node,
    )

    # MCP over streamable HTTP, behind the same token and body limit as every other route.
    # A Route at exactly /mcp, not a Mount: MCP clients do not follow a redirect to /mcp/.
    # An agent's token reaches through a tool what it reaches over HTTP: both call the
    # scoped API.
    api = LocalApi(service, databases)
    mcp = mcp_asgi_app(api, host=config.host, scoped=api.as_caller)
    app.router.routes.append(Route("/mcp", endpoint=mcp.app))
    try:
        async with mcp.lifespan():
            served_app = app if front is None else front(app)
            await _serve_app(served_app, config, service, served, ready)
    except BaseExceptionGroup as group:
        # The MCP session manager runs a task group, which wraps whatever leaves its body;
        # callers of serve() get the error itself (or the cancellation), as documented.
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise


async def _serve_app(
    app: Any,
    config: ServeConfig,
    service: AgentService,
    served: _Served,
    ready: Callable[[str], Any] | None,
) -> None:
    server = _Server(
        uvicorn.Config(
            app,
            lifespan="off",
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=math.ceil(config.shutdown_timeout_s),
        ),
        on_shutdown=service.close,
    )
    task = asyncio.create_task(server.serve(sockets=[served.sock]), name="corral-http")
    try:
        started = asyncio.create_task(server.started_event.wait())
        try:
            await asyncio.wait({started, task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            started.cancel()
        if not task.done():
            auth = ", bearer token required"
            if served.token_file is not None:
                auth = f", bearer token in {served.token_file.resolve()}"
            if config.databases:
                auth += f", databases {', '.join(sorted(config.databases))}"
            if config.guardrails is not None:
                auth += f", guardrails from {config.guardrails}"
            if config.max_concurrent_turns is not None:
                auth += f", at most {config.max_concurrent_turns} turns at once"
            if config.node is not None:
                auth += f", node {config.node} (lease {config.lease_s:g} s)"
            print(
                f"corral: listening on {served.listen_url} (store {_shown_store(config)}{auth})",
                flush=True,
            )
            if ready is not None:
                outcome = ready(served.local_url)
                if inspect.isawaitable(outcome):
                    await outcome
        await asyncio.shield(task)
    except BaseException:
        # Cancelled, or the server or ``ready`` failed: shut the server down cleanly first.
        server.should_exit = True
        await asyncio.wait({task})
        raise


LOG_FORMATS = ("text", "json")


def log_to_stderr(level: int = logging.INFO, *, log_format: str = "text") -> None:
    """Send corral's log lines (one per agent state change, among others) to stderr.

    ``log_format`` ``text`` (``time logger: message``) or ``json`` (one object a line, see
    :class:`~._log_format.JsonFormatter`). Idempotent: a second call adds no second handler.
    Other loggers are left alone.
    """
    if log_format not in LOG_FORMATS:
        raise InvalidArgumentError("log_to_stderr", "log_format", "text or json", log_format)
    root = logging.getLogger("corral")
    if any(getattr(h, "_corral_stderr", False) for h in root.handlers):
        return
    handler = _StderrHandler()
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s"))
    handler._corral_stderr = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level)


class _StderrHandler(logging.StreamHandler[Any]):
    """Writes to ``sys.stderr`` as it is when a line is logged, not as it was when the
    handler was made: an embedding program (or a test) may replace and close streams."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass  # always sys.stderr


def _shown_store(config: ServeConfig) -> str:
    kind, target = parse_dsn(config.store)
    if kind == "sqlite":
        return f"sqlite:{Path(target).resolve()}"
    return redacted(target)


def _default_harnesses(turn_log_bytes: int = DEFAULT_TURN_LOG_BYTES) -> dict[str, Harness]:
    # A command's output (its stdout: the agent's record, its events) is kept up to the
    # turn's log size too, so one agent printing 100 MB cannot make its record big.
    command = CommandHarness(max_output_bytes=turn_log_bytes, log_bytes=turn_log_bytes)
    return {
        "command": command,
        "python": PythonHarness(log_bytes=turn_log_bytes),
        "openai": OpenAIHarness(),
    }


def _listen(host: str, port: int) -> socket.socket:
    try:
        infos = socket.getaddrinfo(
            host.removeprefix("[").removesuffix("]"),
            port,
            type=socket.SOCK_STREAM,
            flags=socket.AI_PASSIVE,
        )
    except socket.gaierror as exc:
        raise ListenError(host, port, exc.strerror or str(exc)) from exc
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise ListenError(host, port, exc.strerror or str(exc)) from exc
    return sock


def _urls(sock: socket.socket) -> tuple[str, str]:
    """The URL of the bound address, and the one local clients should use."""
    ip, port = sock.getsockname()[:2]
    local = ip
    if ip in ("0.0.0.0", "::"):  # a wildcard is not an address to connect to
        local = "127.0.0.1" if ip == "0.0.0.0" else "::1"

    def url(address: str) -> str:
        return f"http://[{address}]:{port}" if ":" in address else f"http://{address}:{port}"

    return url(ip), url(local)


class _Server(uvicorn.Server):
    """uvicorn's server, with hooks: an event once listening, the service closed when shutdown
    begins (ending event streams, which would otherwise hold the graceful shutdown open), and
    signals that stop the server without being raised again afterwards (so ``serve`` can
    close the store and return)."""

    def __init__(
        self, config: uvicorn.Config, *, on_shutdown: Callable[[], Awaitable[None]]
    ) -> None:
        super().__init__(config)
        self.started_event = asyncio.Event()
        self._on_shutdown = on_shutdown

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            self.started_event.set()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            await self._on_shutdown()
        finally:
            await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        handled = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Not uvicorn's own (which the SSE library patches to set a process-wide flag that
        # never resets): this server alone stops; a second SIGINT stops it at once.
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        self.should_exit = True
