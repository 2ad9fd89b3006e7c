"""The global options (``--url``, ``--token``) and the options several commands share.

Imports typer at the top (typer reads these annotations): only ``build_app`` and the command
modules import it.
"""

# No ``from __future__ import annotations`` here or in the command modules: typer reads
# the annotations of the commands when ``build_app`` registers them.

from typing import Annotated, Any

import typer

from corral.cli._calls import DEFAULT_URL, Target, errors_as_json

UrlOpt = Annotated[
    str,
    typer.Option("--url", envvar="CORRAL_URL", help="The daemon's base URL."),
]
TokenOpt = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar="CORRAL_TOKEN",
        help="Bearer token for the daemon (default: a loopback daemon's token file, "
        "$CORRAL_HOME/token or .corral/token).",
    ),
]


def json_option(help: str = "Print JSON instead of a table.") -> Any:
    """The ``--json`` option every command has (a refusal is then printed as JSON too)."""
    return typer.Option("--json", help=help, callback=_json_given)


def _json_given(value: bool) -> bool:
    if value:
        errors_as_json(True)
    return value


JsonOpt = Annotated[bool, json_option()]
# For a command that answers with a line rather than a table.
JsonAnswerOpt = Annotated[bool, json_option("Print the daemon's answer as JSON.")]
AgentArg = Annotated[str, typer.Argument(help="The agent's id (like a_1f2e3d4c) or its name.")]
KeyOpt = Annotated[
    str | None,
    typer.Option("--key", help="Idempotency key: a retry with it is not applied twice."),
]
ByOpt = Annotated[str | None, typer.Option("--by", help="Who decides (recorded).")]
WhyOpt = Annotated[str | None, typer.Option("--why", help="Why (recorded).")]


def root(ctx: typer.Context, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    ctx.obj = Target(url, token or None)
    errors_as_json(False)  # until a command's --json says otherwise


def target(ctx: typer.Context) -> Target:
    """The daemon the global options of this invocation point at."""
    obj = ctx.find_root().obj
    assert isinstance(obj, Target)
    return obj
