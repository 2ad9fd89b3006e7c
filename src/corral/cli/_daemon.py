"""Commands that run a daemon's parts in this process: ``serve`` and ``mcp``."""

import asyncio
from collections.abc import Iterable
from contextlib import suppress
from pathlib import Path
from typing import Annotated, Any

import typer

from corral.cli._calls import refusals
from corral.cli._options import target
from corral.kernel import InvalidArgumentError


def serve(
    ctx: typer.Context,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to listen on.")] = 4600,
    store: Annotated[
        str | None,
        typer.Option(help="sqlite:///PATH or postgresql://... (default: SQLite in .corral/)"),
    ] = None,
    home: Annotated[
        Path | None,
        typer.Option(
            envvar="CORRAL_HOME",
            help="The daemon's state: agents' working directories and the token file "
            "(default .corral).",
        ),
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            envvar="CORRAL_TOKEN",
            help="Bearer token every request must carry (default: one made in HOME/token; "
            "required off loopback).",
        ),
    ] = None,
    db: Annotated[
        list[str] | None,
        typer.Option(
            "--db",
            help="A database agents reach through the gateway, as NAME=DSN "
            "(postgresql://..., sqlite:///PATH); repeat for several.",
        ),
    ] = None,
    db_option: Annotated[
        list[str] | None,
        typer.Option(
            "--db-option",
            help="A gateway setting of one --db database, as NAME.OPTION=VALUE: max_bytes, "
            "max_statement_chars, or (PostgreSQL) agent_role, replay_cache_bytes; "
            "repeat for several.",
        ),
    ] = None,
    guardrails: Annotated[
        Path | None,
        typer.Option(
            "--guardrails",
            help="A JSON file of guardrail rules every agent's actions are checked with, "
            "before its own (an organisation's policy).",
        ),
    ] = None,
    max_concurrent_turns: Annotated[
        int | None,
        typer.Option(
            "--max-concurrent-turns",
            min=1,
            help="At most N agent turns run at once (default: no limit); waiting turns get "
            "slots by their agents' priority (critical first, then weighted shares).",
        ),
    ] = None,
    turn_log_bytes: Annotated[
        int | None,
        typer.Option(
            "--turn-log-bytes",
            min=1024,
            help="Keep each turn's output and its log (stdout, stderr, log records, model and "
            "tool calls) up to N bytes; the rest is dropped with a marker (default 1 MiB).",
        ),
    ] = None,
    log_format: Annotated[
        str,
        typer.Option(
            "--log-format",
            help="text, or json: one JSON object a line (time, level, logger, message, "
            "agentId where there is one) for a log collector.",
        ),
    ] = "text",
    metrics_public: Annotated[
        bool,
        typer.Option(
            "--metrics-public",
            help="Serve GET /metrics without a token (default: an operator's token is "
            "needed; agents' tokens never are enough).",
        ),
    ] = False,
    otlp_endpoint: Annotated[
        str | None,
        typer.Option(
            "--otlp-endpoint",
            help="Export traces over OTLP/HTTP to this collector (e.g. http://127.0.0.1:4318; "
            "default: OTEL_EXPORTER_OTLP_ENDPOINT, if set). Needs corral[otel].",
        ),
    ] = None,
    node: Annotated[
        str | None,
        typer.Option(
            "--node",
            help="Run as node NAME among several daemons on one PostgreSQL store: each owns "
            "some agents, and a dead one's agents are adopted by the others (every node "
            "needs the same --token and a --home of its own).",
        ),
    ] = None,
    lease_s: Annotated[
        float | None,
        typer.Option(
            "--lease-s",
            min=0.2,
            max=600,
            help="With --node: the node's lease in seconds, renewed every quarter of it; a "
            "dead node's agents are adopted within 1.25x this (default 4).",
        ),
    ] = None,
    advertise_url: Annotated[
        str | None,
        typer.Option(
            "--advertise-url",
            help="With --node: the URL the other daemons send this one's commands to "
            "(default: the address it listens on, or this machine's name on a wildcard).",
        ),
    ] = None,
) -> None:
    """Run the daemon until interrupted."""
    from corral.console import Console
    from corral.daemon._server import ServeConfig, log_to_stderr
    from corral.daemon._server import serve as run_server
    from corral.daemon._targets import parse_db_option, parse_db_setting, target_options
    from corral.daemon._tuning import tune as tune_process

    config: dict[str, Any] = {"host": host, "port": port, "token": token or target(ctx).given}
    with refusals():
        databases = _databases(parse_db_option(item) for item in db or [])
        config["databases"] = databases
        settings = [parse_db_setting(item) for item in db_option or []]
        config["db_options"] = target_options(databases, settings)
    if store is not None:
        config["store"] = store
    if home is not None:
        config["home"] = home
    if guardrails is not None:
        config["guardrails"] = guardrails
    if max_concurrent_turns is not None:
        config["max_concurrent_turns"] = max_concurrent_turns
    if turn_log_bytes is not None:
        config["turn_log_bytes"] = turn_log_bytes
    if node is not None:
        config["node"] = node
    if lease_s is not None:
        config["lease_s"] = lease_s
    if advertise_url is not None:
        config["advertise_url"] = advertise_url
    config["metrics_public"] = metrics_public
    config["otlp_endpoint"] = otlp_endpoint
    with refusals(), suppress(KeyboardInterrupt):
        server_config = ServeConfig(**config)
        log_to_stderr(log_format=log_format)
        # Once up, the daemon's process is set for its work (see daemon._tuning).
        asyncio.run(run_server(server_config, front=Console, ready=lambda _url: tune_process()))


def mcp(ctx: typer.Context) -> None:
    """Serve the MCP tools on stdin/stdout, talking to the daemon at --url."""
    from corral.daemon._client import HttpApi
    from corral.daemon._mcp import run_stdio

    conn = target(ctx)

    async def run() -> None:
        async with HttpApi(conn.url, token=conn.token) as api:
            await run_stdio(api)

    with refusals():
        asyncio.run(run())


def _databases(pairs: Iterable[tuple[str, str]]) -> dict[str, str]:
    """``--db`` pairs as a mapping; a name given twice is refused."""
    found: dict[str, str] = {}
    for name, dsn in pairs:
        if name in found:
            raise InvalidArgumentError("--db", "NAME", "a name given once", name)
        found[name] = dsn
    return found
