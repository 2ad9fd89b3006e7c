"""The daemon's OpenTelemetry traces: a span per turn, and the OTLP exporter ``serve`` sets up.

A daemon run (an agent tree, ``runId``) is one trace: the run's id is its ``trace_id``
(``corral.runtime._tracing.otel_trace_id`` makes the OpenTelemetry trace id of it). Each
turn's span (``corral.turn``) is current while its harness runs, so the ``openai`` harness's
model and tool calls (``corral.runtime.middleware.Tracing``) nest under it; a gateway query
of the run's agents joins the same trace (``_databases``).
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from corral.daemon._errors import OtelNotInstalledError
from corral.daemon._records import AgentRecord
from corral.kernel import InvalidArgumentError
from corral.runtime import _tracing

if TYPE_CHECKING:
    from corral.daemon._turns import Outcome

_ERROR_CHARS = 1000


async def turn(rec: AgentRecord, harness: str, number: int, running: Awaitable[Outcome]) -> Outcome:
    """Await ``running`` (turn ``number`` of ``rec``, to its outcome) in a ``corral.turn``
    span of the agent's run's trace, which says how the turn ended and what it spent."""
    attributes: dict[str, _tracing.AttributeValue | None] = {
        "corral.agent.id": rec["id"],
        "corral.agent.name": rec["name"],
        "corral.run.id": rec["runId"],
        "corral.turn.number": number,
        "corral.harness": harness,
    }
    with _tracing.span("corral.turn", attributes, trace_id=rec["runId"]) as span:
        outcome = await running
        if outcome.interrupted:
            span.set("corral.turn.outcome", "interrupted")
        elif outcome.result is not None:
            span.set_all(
                {
                    "corral.turn.outcome": "completed",
                    "corral.usage.tokens": outcome.result.tokens,
                    "corral.usage.cost_usd": outcome.result.cost_usd,
                }
            )
        else:
            error = (outcome.error or "")[:_ERROR_CHARS]
            usage = outcome.usage or {}
            span.set_all(
                {
                    "corral.turn.outcome": "failed",
                    "corral.turn.error": error,
                    "corral.budget.dimension": outcome.dimension,
                    "corral.usage.tokens": _number(usage.get("tokens")),
                    "corral.usage.cost_usd": _number(usage.get("costUsd")),
                }
            )
            span.error(error)
    return outcome


def _number(value: object) -> int | float | None:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


ENV_ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


def otlp_configured(endpoint: str | None) -> bool:
    """Whether traces are to be exported: an endpoint given, or one in the environment."""
    return endpoint is not None or any(os.environ.get(name) for name in ENV_ENDPOINTS)


def check_otlp_endpoint(where: str, endpoint: object) -> None:
    """Refuse an endpoint that is not an ``http://`` or ``https://`` URL (or None)."""
    if endpoint is None:
        return
    if not (
        isinstance(endpoint, str)
        and endpoint.startswith(("http://", "https://"))
        and endpoint.isprintable()
        and " " not in endpoint
    ):
        raise InvalidArgumentError(where, "otlp_endpoint", "an http:// or https:// URL", endpoint)


def start_otlp(endpoint: str | None) -> Callable[[], None]:
    """Export spans over OTLP/HTTP (protobuf): to ``endpoint`` (a base URL such as
    ``http://collector:4318``; ``/v1/traces`` is added unless the path ends with it), else
    to the endpoint the standard ``OTEL_EXPORTER_OTLP_*`` variables name (they also set
    headers, timeouts and the like). The service is named by ``OTEL_SERVICE_NAME`` (default
    ``corral``). Makes the SDK's tracer provider the global one and answers the function that
    flushes and shuts it down. Raises :class:`OtelNotInstalledError` without ``corral[otel]``.
    """
    try:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ModuleNotFoundError as exc:
        raise OtelNotInstalledError(exc.name or "opentelemetry") from None
    url = None
    if endpoint is not None:
        url = endpoint.rstrip("/")
        if not url.endswith("/v1/traces"):
            url += "/v1/traces"
    attributes = {}
    if not os.environ.get("OTEL_SERVICE_NAME"):
        attributes["service.name"] = "corral"
    provider = TracerProvider(resource=Resource.create(attributes))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url)))
    trace.set_tracer_provider(provider)
    return provider.shutdown
