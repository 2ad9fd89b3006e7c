"""The ``corral`` application: which commands it has, in the order ``--help`` lists them.

A new command is a module-level function in the module of its concept (``_agents``,
``_decisions``, ``_events``, ``_daemon``, ``_gateway``, ``_tokens``) plus one entry in
``build_app``.
"""

import sys
from typing import TYPE_CHECKING

from corral.cli._output import ReaderGone

if TYPE_CHECKING:
    import typer

INSTALL_HINT = (
    "the corral command needs the daemon extra (typer, rich, fastapi, uvicorn, mcp): "
    "pip install 'corral[daemon]'"
)


def build_app() -> "typer.Typer":
    """The ``corral`` typer application. Raises ImportError without typer and rich."""
    # Imported here, not at the top: the command modules need typer and rich, which
    # ``main`` must be able to report missing.
    import typer

    from corral.cli import (
        _agents,
        _daemon,
        _decisions,
        _events,
        _gateway,
        _lifecycle,
        _logs,
        _options,
        _patch,
        _runs,
        _tokens,
    )

    app = typer.Typer(
        name="corral",
        help="Agents under supervision: run the daemon, spawn, prompt, stop, watch, decide.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )
    app.callback()(_options.root)
    for command in (
        _daemon.serve,
        _agents.spawn,
        _agents.agents,
        _agents.show,
        _agents.prompt,
        _lifecycle.stop,
        _lifecycle.restart,
        _lifecycle.rm,
        _agents.budget,
        _patch.patch,
        _runs.run,
        _events.events,
        _logs.logs,
        _agents.inbox,
        _agents.session,
        _decisions.decisions,
        _decisions.decide,
        _decisions.approve,
        _decisions.deny,
        _decisions.check,
        _daemon.mcp,
    ):
        app.command()(command)
    app.add_typer(_gateway.app, name="gateway")
    app.add_typer(_tokens.app, name="token")
    return app


def main(argv: list[str] | None = None) -> None:
    """The ``corral`` console script."""
    try:
        app = build_app()
    except ImportError:
        print(f"corral: {INSTALL_HINT}", file=sys.stderr)
        raise SystemExit(1) from None
    try:
        app(args=argv, prog_name="corral")
    except ReaderGone:
        # The reader of our output went away (`corral events | head -1`): no traceback, and
        # the status a process ended by SIGPIPE has (128 + 13), as Unix tools end.
        raise SystemExit(141) from None
