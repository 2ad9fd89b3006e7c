"""The ``corral`` application: which commands it has, in the order ``--help`` lists them.

A command is built only when it is run: ``corral agents`` imports the module of ``agents``
and converts that one function's parameters, not every command's (see ``_lazy``). A new
command is a module-level function (or a ``typer.Typer`` of subcommands) in the module of its
concept, plus ONE line in :data:`COMMANDS`::

    "logs": ("_logs", "logs", "An agent's logs, turn by turn; --follow for live ones."),

(command name: module under ``corral.cli``, attribute in it, the line ``corral --help``
shows for it, which the command's own help begins with; tests/test_cli_app.py checks each
entry builds, begins its help and takes ``--json``).
"""

import gc
import sys
from typing import TYPE_CHECKING

from corral.cli._output import ReaderGone

if TYPE_CHECKING:
    import typer

INSTALL_HINT = (
    "the corral command needs the daemon extra (typer, rich, fastapi, uvicorn, mcp): "
    "pip install 'corral[daemon]'"
)

HELP = "Agents under supervision: run the daemon, spawn, prompt, stop, watch, decide."

# name: (module under corral.cli, attribute, the line `corral --help` shows for it)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "serve": ("_daemon", "serve", "Run the daemon until interrupted."),
    "spawn": ("_agents", "spawn", "Create an agent from a JSON spec."),
    "agents": ("_agents", "agents", "Every agent (summaries, every page), as a table."),
    "show": ("_agents", "show", "One agent's record."),
    "prompt": ("_agents", "prompt", "Start a turn of an idle or blocked agent."),
    "stop": ("_lifecycle", "stop", "End an agent and its descendants, children first."),
    "restart": ("_lifecycle", "restart", "Run a stopped or failed agent again."),
    "rm": ("_lifecycle", "rm", "Delete an ended agent and its descendants."),
    "budget": ("_agents", "budget", "Change an agent's budget."),
    "patch": ("_patch", "patch", "Change a live agent: its budget, notifyOn or guardrails."),
    "run": ("_runs", "run", "A run as a tree: each agent's state, and what its subtree spent."),
    "events": ("_events", "events", "The event log; with --follow, then live events."),
    "logs": ("_logs", "logs", "An agent's output and logs, turn by turn."),
    "inbox": ("_agents", "inbox", "The notices sent to an agent by its children."),
    "session": ("_agents", "session", "An agent's session: the conversation of its turns."),
    "decisions": ("_decisions", "decisions", "Everything waiting on a person, oldest first."),
    "decide": ("_decisions", "decide", "Answer a decision."),
    "approve": ("_decisions", "approve", "Approve an agent's action."),
    "deny": ("_decisions", "deny", "Deny an agent's action."),
    "check": ("_decisions", "check", "Ask before acting: exit 0 when allowed."),
    "mcp": ("_daemon", "mcp", "Serve the MCP tools on stdin/stdout, talking to the daemon."),
    "gateway": ("_gateway", "app", "The database gateway of a daemon started with --db."),
    "console": ("_console", "console", "Open the console (the daemon's web page) in a browser."),
    "token": ("_tokens", "app", "Named operator tokens: make one per person, list, revoke."),
    "nodes": ("_nodes", "nodes", "The daemons sharing this store: live or not, their agents."),
}


def build_app() -> "typer.Typer":
    """The ``corral`` typer application (its commands built when run). Raises ImportError
    without typer and rich."""
    # Imported here, not at the top: the command modules need typer and rich, which
    # ``main`` must be able to report missing.
    import typer

    from corral.cli import _options
    from corral.cli._lazy import LazyGroup

    app = typer.Typer(
        cls=LazyGroup,
        name="corral",
        help=HELP,
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )
    app.callback()(_options.root)
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
    finally:
        # Everything imported lives until the process ends: collecting it at exit costs a
        # process that loaded the daemon 0.4 to 0.9 s, for nothing.
        gc.freeze()
