"""``corral token ...``: named operator tokens, one per person, so that what a person does is
recorded under their own name.

Each subcommand is a function decorated on the module's ``app``, listed in that order.
"""

from typing import Annotated

import typer

from corral.cli._calls import call
from corral.cli._options import JsonAnswerOpt, JsonOpt, target
from corral.cli._output import print_json, print_table, say, visible, write_line

app = typer.Typer(
    help="Named operator tokens: make one per person, list, revoke.",
    no_args_is_help=True,
    add_completion=False,
)

NameArg = Annotated[
    str,
    typer.Argument(
        help="The token's name: a letter, then letters, digits, _ . @ or - (64 at most)."
    ),
]


@app.command("create")
def create(ctx: typer.Context, name: NameArg, as_json: JsonOpt = False) -> None:
    """Make the operator token NAME and print its secret, this once (only a hash is kept)."""
    made = call(target(ctx), lambda api: api.create_token(name))
    if as_json:
        print_json(made)
        return
    # The secret alone on stdout (for `$(corral token create alice)`), never wrapped; what
    # it is on stderr.
    write_line(visible(str(made["token"])))
    say(
        f"token {made['name']} made; it is shown this once: give it to its owner, who sends "
        "it as CORRAL_TOKEN or --token",
        err=True,
    )


@app.command("list")
def list_(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """The live operator tokens: names, when and by whom they were made (never secrets)."""
    found = call(target(ctx), lambda api: api.list_tokens())
    if as_json:
        print_json(found)
        return
    print_table("tokens", found, ["name", "createdAt", "by"])


@app.command("revoke")
def revoke(ctx: typer.Context, name: NameArg, as_json: JsonAnswerOpt = False) -> None:
    """Revoke the operator token NAME: from now on it opens nothing."""
    done = call(target(ctx), lambda api: api.revoke_token(name))
    if as_json:
        print_json(done)
        return
    say(f"token {done['name']} revoked by {done.get('revokedBy') or 'in-process code'}")
