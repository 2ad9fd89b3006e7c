"""``GET /nodes``: the daemons that share this daemon's store, their agents and heartbeats.
A person's business: an agent's token is refused (403 ``out_of_scope``)."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse

from corral.daemon._http._common import ApiRoute, api_of, errors

# A node's agent ids are listed up to this many (``agentCount`` has them all).
NODE_AGENTS_SHOWN = 1000


async def list_nodes(request: Request) -> JSONResponse:
    api_of(request).check_operator("listing the daemons")
    node = getattr(request.app.state, "node", None)
    if node is None:
        return JSONResponse({"node": None, "leaseS": None, "nodes": []})
    found = await node.nodes()
    return JSONResponse(
        {
            "node": node.name,
            "leaseS": node.lease_s,
            "nodes": [
                {
                    "name": n.name,
                    "url": n.url,
                    "live": n.live,
                    "stopped": n.stopped,
                    "startedAt": n.started_at.isoformat(),
                    "heartbeat": n.heartbeat.isoformat(),
                    "heartbeatAgeS": round(n.heartbeat_age_s, 3),
                    "agentCount": len(n.agents),
                    "agents": n.agents[:NODE_AGENTS_SHOWN],
                }
                for n in found
            ],
        }
    )


ROUTES = [
    ApiRoute(
        "GET",
        "/nodes",
        list_nodes,
        "The daemons sharing this store (several daemons: `corral serve --node`)",
        responses=errors(401, 403, 503),
    ),
]
