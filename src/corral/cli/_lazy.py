"""The root command, whose subcommands are built when they are run.

typer turns a function into a command by reading its parameters' annotations, which costs
milliseconds a parameter; building every command for every run of ``corral`` cost more than
the rest of ``corral agents`` together. :class:`LazyGroup` (typer's documented ``cls=``
extension of ``typer.Typer``, with click's ``list_commands``/``get_command``) knows the
commands by the table in ``_app.COMMANDS``, and imports and builds only the one run;
``corral --help`` lists them all from the table, importing none.
"""

import importlib
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

from corral.cli._app import COMMANDS


def build(name: str) -> Any:
    """The command ``name`` of the table, built: its module imported and its function (or
    group of subcommands) converted by typer, as ``app.command()`` / ``app.add_typer`` would."""
    module, attribute, _ = COMMANDS[name]
    target = getattr(importlib.import_module(f"corral.cli.{module}"), attribute)
    if isinstance(target, typer.Typer):
        command = typer.main.get_command(target)
    else:
        single = typer.Typer(add_completion=False)
        single.command(name)(target)
        command = typer.main.get_command(single)
    command.name = name
    return command


class LazyGroup(TyperGroup):
    """``corral``: the commands of ``_app.COMMANDS``, each built on first use."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        self._listing = False
        # Placeholders that carry the name and the help line: what --help lists and what a
        # mistyped command is matched against ("Did you mean 'agents'?").
        for name, (_, _, line) in COMMANDS.items():
            self.commands.setdefault(name, _Placeholder(name, help=line))

    def list_commands(self, ctx: Any) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        found = self.commands.get(cmd_name)
        if isinstance(found, _Placeholder) and not self._listing:
            found = self.commands[cmd_name] = build(cmd_name)
        return found

    def format_help(self, ctx: Any, formatter: Any) -> None:
        # Listing the commands asks for each one: answer with the placeholders.
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


class _Placeholder(TyperCommand):
    """A command of the table not built yet (never run: ``get_command`` builds it first)."""
