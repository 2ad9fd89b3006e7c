"""``GET /metrics``: the daemon's Prometheus metrics (see ``_metrics``).

An operator's token reads them (Prometheus sends one with ``authorization:
credentials_file:``); an agent's token is refused (403 ``out_of_scope``): the numbers are the
whole daemon's, not its subtree's. ``corral serve --metrics-public`` lets the route through
without a token, as ``/healthz`` is (for a scraper on a network the operator trusts).
"""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import Response

from corral.daemon._http._common import ApiRoute, api_of, errors
from corral.daemon._metrics import CONTENT_TYPE, Metrics

PATH = "/metrics"


async def metrics(request: Request) -> Response:
    api_of(request).check_operator("the daemon's metrics")
    found: Metrics = request.app.state.metrics
    return Response(found.exposition(), media_type=CONTENT_TYPE)


ROUTES = [
    ApiRoute(
        "GET",
        PATH,
        metrics,
        "The daemon's metrics in Prometheus' text format (an operator's token, unless the "
        "daemon serves them publicly)",
        responses={
            **errors(401, 403),
            200: {
                "description": "Prometheus text exposition format 0.0.4",
                "content": {"text/plain": {"schema": {"type": "string"}}},
            },
        },
    ),
]
