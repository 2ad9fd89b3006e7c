"""The ``corral`` command: run the daemon, and talk to a running one over HTTP.

Every command but ``serve`` talks to the daemon at ``--url`` (default
http://127.0.0.1:4600, or ``CORRAL_URL``) with the bearer ``--token`` (or ``CORRAL_TOKEN``).
A refusal prints ``error <code>: <message>`` on stderr and exits 2 for a usage error or a
4xx answer, 1 otherwise. Needs the ``daemon`` extra (typer, rich): ``pip install
'corral[daemon]'``.
"""

# No ``from __future__ import annotations`` here: typer reads the annotations of the
# commands, which are defined inside ``build_app`` where typer is imported.

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

from corral.kernel import CorralError, UsageError

if TYPE_CHECKING:
    import typer
    from rich.console import Console

    from corral.daemon._client import HttpApi

DEFAULT_URL = "http://127.0.0.1:4600"
INSTALL_HINT = (
    "the corral command needs the daemon extra (typer, rich, fastapi, uvicorn, mcp): "
    "pip install 'corral[daemon]'"
)

T = TypeVar("T")

_STATE_STYLES = {
    "running": "cyan",
    "idle": "green",
    "blocked": "yellow",
    "failed": "red",
    "stopped": "dim",
}


class _Target:
    __slots__ = ("token", "url")

    def __init__(self, url: str, token: str | None) -> None:
        self.url = url
        self.token = token


def exit_code(error: CorralError) -> int:
    """2 for a usage error or a 4xx answer, 1 for anything else."""
    from corral.daemon._status import http_status

    status = http_status(error)
    return 2 if isinstance(error, UsageError) or 400 <= status < 500 else 1


def _fail(error: CorralError) -> NoReturn:
    import typer

    _stderr().print(f"error {error.code}: {error.message}", markup=False, highlight=False)
    raise typer.Exit(exit_code(error))


def _stdout() -> "Console":
    from rich.console import Console

    return Console(highlight=False, soft_wrap=False)


def _stderr() -> "Console":
    from rich.console import Console

    return Console(stderr=True, highlight=False, soft_wrap=True)


@contextmanager
def _refusals() -> Iterator[None]:
    try:
        yield
    except CorralError as exc:
        _fail(exc)


def _call(target: _Target, work: Callable[["HttpApi"], Awaitable[T]]) -> T:
    from corral.daemon._client import HttpApi

    async def run() -> T:
        async with HttpApi(target.url, token=target.token) as api:
            return await work(api)

    with _refusals():
        return asyncio.run(run())
    raise AssertionError("unreachable")  # pragma: no cover - _refusals exits


def _print_table(
    title: str,
    rows: list[dict[str, Any]],
    keys: list[str],
    *,
    headers: dict[str, str] | None = None,
) -> None:
    """Rows as a rich table, one column per key (a ``state`` column is coloured)."""
    from rich.table import Table

    names = headers or {}
    table = Table(*(names.get(k, k) for k in keys), title=_plain(title))
    for row in rows:
        table.add_row(*(_state(row.get(k)) if k == "state" else _cell(row.get(k)) for k in keys))
    _stdout().print(table)


def _cell(value: Any) -> str:
    """``value`` as table text: rich markup in it (a ``[/bold]`` in a row or a reason) is
    shown as it is, never interpreted."""
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return _plain(json.dumps(value, separators=(",", ":"), default=str))
    return _plain(str(value))


def _plain(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def _state(value: Any) -> str:
    text = _cell(value)
    style = _STATE_STYLES.get(text)
    return f"[{style}]{text}[/{style}]" if style else text


def _print_json(value: Any) -> None:
    # Plain print: JSON output is for programs, with no wrapping or markup.
    print(json.dumps(value, indent=2, default=str))


def _load_spec(path: str) -> dict[str, Any]:
    from corral.daemon._errors import InvalidSpecError

    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidSpecError(
            [{"field": "(file)", "message": f"cannot read {path}: {exc.strerror or exc}"}]
        ) from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise InvalidSpecError(
            [{"field": "(file)", "message": f"{path} is not JSON: {exc}"}]
        ) from None
    if not isinstance(data, dict):
        raise InvalidSpecError([{"field": "(file)", "message": f"{path} must hold a JSON object"}])
    return data


def build_app() -> "typer.Typer":
    """The ``corral`` typer application. Raises ImportError without typer and rich."""
    import typer
    from rich.table import Table
    from rich.text import Text

    app = typer.Typer(
        name="corral",
        help="Agents under supervision: run the daemon, spawn, prompt, stop, watch, decide.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )

    UrlOpt = Annotated[
        str,
        typer.Option("--url", envvar="CORRAL_URL", help="The daemon's base URL."),
    ]
    TokenOpt = Annotated[
        str | None,
        typer.Option("--token", envvar="CORRAL_TOKEN", help="Bearer token for the daemon."),
    ]
    JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
    AgentArg = Annotated[str, typer.Argument(help="The agent's id, like a_1f2e3d4c.")]
    KeyOpt = Annotated[
        str | None,
        typer.Option("--key", help="Idempotency key: a retry with it is not applied twice."),
    ]
    ByOpt = Annotated[str | None, typer.Option("--by", help="Who decides (recorded).")]
    WhyOpt = Annotated[str | None, typer.Option("--why", help="Why (recorded).")]

    @app.callback()
    def root(ctx: typer.Context, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
        ctx.obj = _Target(url, token or None)

    def target(ctx: typer.Context) -> _Target:
        obj = ctx.find_root().obj
        assert isinstance(obj, _Target)
        return obj

    @app.command()
    def serve(
        ctx: typer.Context,
        host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
        port: Annotated[int, typer.Option(min=0, max=65535, help="Port to listen on.")] = 4600,
        store: Annotated[
            str | None,
            typer.Option(help="sqlite:///PATH or postgresql://... (default: SQLite in .corral/)"),
        ] = None,
        home: Annotated[
            Path | None, typer.Option(help="Where agents' working directories live.")
        ] = None,
        token: Annotated[
            str | None,
            typer.Option(
                "--token",
                envvar="CORRAL_TOKEN",
                help="Bearer token every request must carry (required off loopback).",
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
    ) -> None:
        """Run the daemon until interrupted."""
        from corral.daemon._databases import parse_db_option
        from corral.daemon._server import ServeConfig, log_to_stderr, serve

        config: dict[str, Any] = {"host": host, "port": port, "token": token or target(ctx).token}
        with _refusals():
            config["databases"] = _databases(parse_db_option(item) for item in db or [])
        if store is not None:
            config["store"] = store
        if home is not None:
            config["home"] = home
        with _refusals(), suppress(KeyboardInterrupt):
            server_config = ServeConfig(**config)
            log_to_stderr()
            asyncio.run(serve(server_config))

    @app.command()
    def spawn(
        ctx: typer.Context,
        spec: Annotated[str, typer.Argument(help="The spec file (JSON), or - for stdin.")],
        key: KeyOpt = None,
        as_json: JsonOpt = False,
    ) -> None:
        """Create an agent from a JSON spec."""
        with _refusals():
            data = _load_spec(spec)
        agent = _call(target(ctx), lambda api: api.spawn(data, idempotency_key=key))
        if as_json:
            _print_json(agent)
            return
        _stdout().print(
            f"{_cell(agent['id'])}  {_cell(agent.get('name', ''))}  {_state(agent.get('state'))}"
        )

    @app.command()
    def agents(ctx: typer.Context, as_json: JsonOpt = False) -> None:
        """Every agent, as a table."""
        found = _call(target(ctx), lambda api: api.list_agents())
        if as_json:
            _print_json(found)
            return
        _print_table("agents", found, ["id", "name", "state", "reason", "turns", "parent"])

    @app.command()
    def show(ctx: typer.Context, agent_id: AgentArg, as_json: JsonOpt = False) -> None:
        """One agent's record."""
        agent = _call(target(ctx), lambda api: api.get(agent_id))
        if as_json:
            _print_json(agent)
            return
        table = Table("field", "value", show_header=False, title=f"agent {_cell(agent.get('id'))}")
        for name, value in agent.items():
            if name == "spec":
                continue
            table.add_row(_cell(name), _state(value) if name == "state" else _cell(value))
        table.add_row("spec", _cell(agent.get("spec")))
        _stdout().print(table)

    @app.command()
    def prompt(
        ctx: typer.Context,
        agent_id: AgentArg,
        text: Annotated[
            str | None, typer.Argument(help="The prompt; without it the last one is re-sent.")
        ] = None,
        by: ByOpt = None,
        why: WhyOpt = None,
        key: KeyOpt = None,
    ) -> None:
        """Start a turn of an idle or blocked agent (resolves a blocked agent's decision)."""
        answer = _call(
            target(ctx),
            lambda api: api.prompt(agent_id, text, by=by, why=why, idempotency_key=key),
        )
        _stdout().print(
            f"{answer.get('id', agent_id)}: {answer.get('accepted', 'prompt')} accepted",
            markup=False,
        )

    @app.command()
    def stop(
        ctx: typer.Context,
        agent_id: AgentArg,
        by: ByOpt = None,
        why: WhyOpt = None,
        key: KeyOpt = None,
    ) -> None:
        """End an agent (a turn in flight is cancelled)."""
        answer = _call(
            target(ctx), lambda api: api.stop(agent_id, by=by, why=why, idempotency_key=key)
        )
        _stdout().print(f"{answer.get('id', agent_id)}: stop accepted", markup=False)

    @app.command()
    def events(
        ctx: typer.Context,
        follow: Annotated[
            bool, typer.Option("--follow", "-f", help="Keep streaming new events.")
        ] = False,
        agent: Annotated[str | None, typer.Option(help="Only this agent's events.")] = None,
        after: Annotated[
            int | None, typer.Option(min=0, help="Only events with a greater seq.")
        ] = None,
        as_json: Annotated[bool, typer.Option("--json", help="One JSON object a line.")] = False,
    ) -> None:
        """The event log; with --follow, then live events (resumes across reconnects)."""
        conn = target(ctx)
        console = _stdout()

        def emit(event: Any) -> None:
            if as_json:
                print(json.dumps(event.to_dict(), default=str), flush=True)
                return
            line = Text.assemble(
                f"{event.seq:>6}  ",
                (event.ts, "dim"),
                "  ",
                (event.type, "bold"),
                f"  {event.agent_id or '-'}  ",
                json.dumps(event.data, separators=(",", ":"), default=str),
            )
            # One line an event; --json has every field in full.
            console.print(line, no_wrap=True, overflow="ellipsis", crop=True)

        if follow:
            from corral.daemon._client import follow_events

            async def stream() -> None:
                async for event in follow_events(
                    conn.url, after, agent, token=conn.token, max_reconnects=None
                ):
                    emit(event)

            with _refusals(), suppress(KeyboardInterrupt):
                asyncio.run(stream())
            return

        async def page_all(api: "HttpApi") -> None:
            cursor = after or 0
            while True:
                page = await api.events(cursor, agent)
                for event in page:
                    emit(event)
                    cursor = event.seq
                if len(page) < 1000:
                    return

        _call(conn, page_all)

    @app.command()
    def inbox(ctx: typer.Context, agent_id: AgentArg, as_json: JsonOpt = False) -> None:
        """The notices sent to an agent by its children."""
        notices = _call(target(ctx), lambda api: api.inbox(agent_id))
        if as_json:
            _print_json(notices)
            return
        table = Table("id", "from", "kind", "state", "detail", title=f"inbox of {_cell(agent_id)}")
        for n in notices:
            detail = n.get("reason") or n.get("error") or n.get("output") or ""
            who = f"{n.get('fromName', '')} ({n.get('from', '')})".strip()
            table.add_row(
                _cell(n.get("id")), who, _cell(n.get("kind")), _cell(n.get("state")), _cell(detail)
            )
        _stdout().print(table)

    @app.command()
    def decisions(ctx: typer.Context, as_json: JsonOpt = False) -> None:
        """Everything waiting on a person, oldest first."""
        waiting = _call(target(ctx), lambda api: api.decisions())
        if as_json:
            _print_json(waiting)
            return
        kinds = {d.get("kind") for d in waiting}
        extra = ["target"] if "gateway_frozen" in kinds else []
        _print_table(
            "decisions",
            waiting,
            ["agentId", "name", "kind", *extra, "reason", "error", "since"],
            headers={"agentId": "agent"},
        )
        if "agent_blocked" in kinds:
            _stderr().print(
                "resolve with: corral prompt ID [TEXT] --by NAME --why REASON, or corral stop ID"
            )
        if "gateway_frozen" in kinds:
            _stderr().print(
                "reinstate with: corral gateway reinstate ID --target DB --by NAME --reason WHY"
            )

    app.add_typer(_gateway_app(target), name="gateway")

    @app.command()
    def mcp(ctx: typer.Context) -> None:
        """Serve the MCP tools on stdin/stdout, talking to the daemon at --url."""
        from corral.daemon._client import HttpApi
        from corral.daemon._mcp import run_stdio

        conn = target(ctx)

        async def run() -> None:
            async with HttpApi(conn.url, token=conn.token) as api:
                await run_stdio(api)

        with _refusals():
            asyncio.run(run())

    return app


def _databases(pairs: Iterable[tuple[str, str]]) -> dict[str, str]:
    from corral.kernel import InvalidArgumentError

    found: dict[str, str] = {}
    for name, dsn in pairs:
        if name in found:
            raise InvalidArgumentError("--db", "NAME", "a name given once", name)
        found[name] = dsn
    return found


def _param(text: str) -> Any:
    """A --param value: JSON when it parses (7, true, null, "7", [1,2]), else the text
    (NaN and Infinity, which are not JSON, stay text)."""
    try:
        return json.loads(text, parse_constant=_not_json)
    except ValueError:
        return text


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _gateway_app(target: Callable[["typer.Context"], _Target]) -> "typer.Typer":
    """``corral gateway ...``: the databases a daemon fronts (started with --db)."""
    import typer
    from rich.table import Table

    gw = typer.Typer(
        help="The database gateway of a daemon started with --db NAME=DSN: targets, queries, "
        "breakers, freezes and reinstatements.",
        no_args_is_help=True,
    )
    AgentArg = Annotated[str, typer.Argument(help="The agent's id.")]
    TargetOpt = Annotated[
        str | None,
        typer.Option("--target", "-t", help="The database's name (when there are several)."),
    ]
    JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]

    @gw.command("targets")
    def targets(ctx: typer.Context, as_json: JsonOpt = False) -> None:
        """The databases the daemon fronts."""
        found = _call(target(ctx), lambda api: api.db_targets())
        if as_json:
            _print_json(found)
            return
        _print_table("databases", found, ["name", "dialect", "tables", "frozenAgents"])

    @gw.command("query")
    def query(
        ctx: typer.Context,
        agent_id: AgentArg,
        request: Annotated[
            str,
            typer.Argument(help='SQL text, or a structured operation as JSON ({"op": ...}).'),
        ],
        param: Annotated[
            list[str] | None,
            typer.Option("--param", "-p", help="A parameter ($1, $2, ... in order), as JSON."),
        ] = None,
        key: Annotated[
            str | None, typer.Option("--key", help="Idempotency key (required on writes).")
        ] = None,
        plan_hash: Annotated[str | None, typer.Option("--plan-hash")] = None,
        target_name: TargetOpt = None,
        as_json: JsonOpt = False,
    ) -> None:
        """Run one request through the gateway as AGENT_ID."""
        body: dict[str, Any]
        if request.lstrip().startswith("{"):
            with _refusals():
                body = _load_json_object(request)
        else:
            body = {"sql": request}
        if param:
            body["params"] = [_param(p) for p in param]
        if key is not None:
            body["idempotency_key"] = key
        if plan_hash is not None:
            body["plan_hash"] = plan_hash
        answer = _call(target(ctx), lambda api: api.db_query(agent_id, body, target_name))
        if as_json:
            _print_json(answer)
            return
        columns = list(answer.get("columns") or [])
        if columns:
            _print_table(f"{answer.get('target')}: {answer.get('status')}", answer["rows"], columns)
        notes = [f"{answer.get('rowCount')} row(s)"]
        if answer.get("status") == "replayed":
            notes.append("replayed: the stored result, nothing ran")
        if answer.get("emptiness"):
            notes.append(str(answer["emptiness"]))
        if answer.get("truncated"):
            notes.append("truncated at the row cap")
        _stdout().print(", ".join(notes), markup=False)
        for warning in answer.get("warnings") or []:
            _stderr().print(f"warning: {warning}", markup=False)

    @gw.command("status")
    def status(
        ctx: typer.Context,
        agent_id: Annotated[
            str | None, typer.Argument(help="The agent's id; without it, every frozen agent.")
        ] = None,
        target_name: TargetOpt = None,
        as_json: JsonOpt = False,
    ) -> None:
        """An agent's breakers in a database, or every agent frozen anywhere."""
        if agent_id is None:
            waiting = _call(target(ctx), lambda api: api.decisions())
            frozen = [
                d
                for d in waiting
                if d.get("kind") == "gateway_frozen"
                and (target_name is None or d.get("target") == target_name)
            ]
            if as_json:
                _print_json(frozen)
                return
            _print_table(
                "frozen agents",
                frozen,
                ["target", "agentId", "reason", "since"],
                headers={"agentId": "agent"},
            )
            return
        found = _call(target(ctx), lambda api: api.db_status(agent_id, target_name))
        if as_json:
            _print_json(found)
            return
        table = Table("signal", "count", "threshold", title=_status_title(found))
        thresholds = found.get("thresholds") or {}
        for name, count in (found.get("counts") or {}).items():
            table.add_row(name, _cell(count), _cell(thresholds.get(name)))
        _stdout().print(table)
        freeze = found.get("freeze")
        if freeze:
            _stdout().print(
                f"frozen since {freeze.get('at')}: {freeze.get('reason')}", markup=False
            )

    @gw.command("freeze")
    def freeze(
        ctx: typer.Context,
        agent_id: AgentArg,
        reason: Annotated[str, typer.Option("--reason", help="Why (recorded).")],
        by: Annotated[str | None, typer.Option("--by", help="Who (recorded).")] = None,
        target_name: TargetOpt = None,
    ) -> None:
        """Freeze an agent in a database: every request refused until reinstated."""
        done = _call(target(ctx), lambda api: api.db_freeze(agent_id, reason, by, target_name))
        _stdout().print(
            f"{agent_id} frozen in {done.get('target')}: {done.get('reason')}", markup=False
        )

    @gw.command("reinstate")
    def reinstate(
        ctx: typer.Context,
        agent_id: AgentArg,
        by: Annotated[str, typer.Option("--by", help="Who decides (recorded).")],
        reason: Annotated[str, typer.Option("--reason", help="Why (recorded).")],
        target_name: TargetOpt = None,
    ) -> None:
        """Lift an agent's freeze in a database (a person's decision, recorded)."""
        done = _call(target(ctx), lambda api: api.db_reinstate(agent_id, by, reason, target_name))
        _stdout().print(
            f"{agent_id} reinstated in {done.get('target')} by {done.get('by')}", markup=False
        )

    @gw.command("history")
    def history(
        ctx: typer.Context,
        agent_id: AgentArg,
        target_name: TargetOpt = None,
        as_json: JsonOpt = False,
    ) -> None:
        """An agent's freezes and reinstatements in a database, oldest first."""
        found = _call(target(ctx), lambda api: api.db_history(agent_id, target_name))
        if as_json:
            _print_json(found)
            return
        rows = [
            {**r, "why": r.get("reason"), "who": r.get("by"), "signal": r.get("signal")}
            for r in found
        ]
        _print_table(f"history of {agent_id}", rows, ["at", "kind", "who", "why", "signal"])

    return gw


def _status_title(found: dict[str, Any]) -> str:
    state = "[yellow]frozen[/yellow]" if found.get("frozen") else "[green]open[/green]"
    who, where = _cell(found.get("agentId")), _cell(found.get("target"))
    return f"{who} in {where}: {state} (window {_cell(found.get('windowS'))} s)"


def _load_json_object(text: str) -> dict[str, Any]:
    from corral.kernel import InvalidArgumentError

    try:
        value = json.loads(text)
    except ValueError as exc:
        raise InvalidArgumentError("gateway query", "request", "valid JSON", str(exc)) from None
    if not isinstance(value, dict):
        raise InvalidArgumentError("gateway query", "request", "a JSON object", value)
    return value


def main(argv: list[str] | None = None) -> None:
    """The ``corral`` console script."""
    try:
        app = build_app()
    except ImportError:
        print(f"corral: {INSTALL_HINT}", file=sys.stderr)
        raise SystemExit(1) from None
    app(args=argv, prog_name="corral")


if __name__ == "__main__":
    main()
