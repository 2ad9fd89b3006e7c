"""``corral console``: the console's address on the daemon at ``--url``, opened in a
browser."""

from typing import Annotated

import typer

from corral.cli._options import JsonOpt, target
from corral.cli._output import print_json, say


def console(
    ctx: typer.Context,
    no_browser: Annotated[
        bool, typer.Option("--no-browser", help="Print the address only; open nothing.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Open the console (the daemon's web page) in a browser. Prints its address; log in
    with an operator token: the daemon's (.corral/token) or one of `corral token create
    NAME`."""
    import webbrowser

    from corral.console import console_url

    url = console_url(target(ctx).url)
    opened = False
    if not no_browser:
        try:
            opened = webbrowser.open(url)
        except webbrowser.Error:
            opened = False
    if as_json:
        print_json({"url": url, "opened": opened})
        return
    say(url)
    if not no_browser and not opened:
        say("(no browser could be opened here: open that address yourself)")
