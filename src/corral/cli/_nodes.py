"""``corral nodes``: the daemons that share a PostgreSQL store (``corral serve --node``)."""

import typer

from corral.cli._calls import call
from corral.cli._options import JsonOpt, target
from corral.cli._output import print_json, print_table, say


def nodes(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """The daemons sharing this store: live or not, their agents, their last heartbeat."""
    found = call(target(ctx), lambda api: api.nodes())
    if as_json:
        print_json(found)
        return
    if found.get("node") is None:
        say("this daemon runs alone on its store (started without --node)")
        return
    rows = [
        {
            "node": n["name"] + (" (this one)" if n["name"] == found["node"] else ""),
            "state": "live" if n["live"] else ("stopped" if n["stopped"] else "dead"),
            "heartbeat": f"{n['heartbeatAgeS']:.1f} s ago",
            "agents": n["agentCount"],
            "url": n["url"],
        }
        for n in found["nodes"]
    ]
    print_table(
        f"nodes (lease {found['leaseS']:g} s)",
        rows,
        ["node", "state", "heartbeat", "agents", "url"],
    )
