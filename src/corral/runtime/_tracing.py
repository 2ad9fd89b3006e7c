"""OpenTelemetry spans, when OpenTelemetry is installed (``corral[otel]``); nothing otherwise.

A run is one trace: its trace id is derived from the run's ``trace_id`` (``RunMeta``; the
daemon uses the run's id) by :func:`otel_trace_id`, so every process, middleware and database
query that knows the run's ``trace_id`` puts its spans in the same trace without any of them
handing a context to another. Spans are made with the global tracer provider
(``opentelemetry.trace.set_tracer_provider``): with the API alone they cost next to nothing
and go nowhere; ``corral serve --otlp-endpoint`` (or ``OTEL_EXPORTER_OTLP_ENDPOINT``) sets up
the SDK with an OTLP exporter.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
from collections.abc import Iterator, Mapping
from typing import Any

_HEX = frozenset("0123456789abcdef")
_INSTRUMENTATION = "corral"
_tracer: Any = None

AttributeValue = str | bool | int | float


@functools.cache
def available() -> bool:
    """Whether the OpenTelemetry API can be imported (``corral[otel]``, or brought by another
    package)."""
    try:
        return importlib.util.find_spec("opentelemetry.trace") is not None
    except (ImportError, ValueError):  # a parent package that is not one, or blocked
        return False


def enabled() -> bool:
    """Whether spans would go anywhere: OpenTelemetry is installed and a tracer provider has
    been set (the SDK's, by ``corral serve`` or the embedding program). Cheap: the spans of
    every call are skipped when it is False."""
    if not available():
        return False
    from opentelemetry import trace

    return not isinstance(
        trace.get_tracer_provider(), trace.ProxyTracerProvider | trace.NoOpTracerProvider
    )


def otel_trace_id(trace_id: str) -> int:
    """The OpenTelemetry trace id (128 bits, never 0) of a run's ``trace_id``: the id itself
    when it is 32 lowercase hex digits (``RunMeta``'s default, a UUID4 as hex), else the
    first 128 bits of its SHA-256. The same ``trace_id`` always gives the same trace."""
    if len(trace_id) == 32 and set(trace_id) <= _HEX and int(trace_id, 16) != 0:
        return int(trace_id, 16)
    digest = hashlib.sha256(trace_id.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:16], "big") or 1


def otel_root_span_id(trace_id: str) -> int:
    """The span id (64 bits, never 0) the spans of a run without a parent of their own hang
    from: the run itself, which no process records as a span (a "remote" parent)."""
    digest = hashlib.sha256(b"corral-run:" + trace_id.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") or 1


def _get_tracer() -> Any:
    global _tracer
    if _tracer is None:
        from opentelemetry import trace

        import corral

        # A proxy of the global provider: one set later is used from then on.
        _tracer = trace.get_tracer(_INSTRUMENTATION, corral.__version__)
    return _tracer


class Span:
    """What a ``with span(...)`` block may say of its span: attributes, an error. Does nothing
    when OpenTelemetry is not installed or the span is not recorded."""

    __slots__ = ("_span",)

    def __init__(self, span: Any = None) -> None:
        self._span = span

    @property
    def recording(self) -> bool:
        return self._span is not None and bool(self._span.is_recording())

    @property
    def trace_id(self) -> int:
        """The span's trace id (0 when there is no span)."""
        return 0 if self._span is None else int(self._span.get_span_context().trace_id)

    def set(self, name: str, value: AttributeValue | None) -> None:
        """Set attribute ``name`` (None leaves it out)."""
        if value is not None and self._span is not None:
            self._span.set_attribute(name, value)

    def set_all(self, attributes: Mapping[str, AttributeValue | None]) -> None:
        for name, value in attributes.items():
            self.set(name, value)

    def error(self, description: str) -> None:
        """Mark the span as failed with ``description`` (a turn that failed without raising)."""
        if self._span is not None:
            from opentelemetry.trace import Status, StatusCode

            self._span.set_status(Status(StatusCode.ERROR, description[:1000]))


@contextlib.contextmanager
def run_context(trace_id: str | None) -> Iterator[None]:
    """Within the block, spans started without a parent belong to the run's trace (see the
    module docstring). The current span is kept when it is in that trace already (a turn's
    span around its model calls). Does nothing when ``trace_id`` is None or OpenTelemetry is
    not installed."""
    if trace_id is None or not enabled():
        yield
        return
    from opentelemetry import context, trace

    wanted = otel_trace_id(trace_id)
    current = trace.get_current_span().get_span_context()
    if current.is_valid and current.trace_id == wanted:
        yield
        return
    parent = trace.NonRecordingSpan(
        trace.SpanContext(
            trace_id=wanted,
            span_id=otel_root_span_id(trace_id),
            is_remote=True,
            trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
        )
    )
    token = context.attach(trace.set_span_in_context(parent))
    try:
        yield
    finally:
        context.detach(token)


@contextlib.contextmanager
def span(
    name: str,
    attributes: Mapping[str, AttributeValue | None] | None = None,
    *,
    trace_id: str | None = None,
    kind: str = "internal",
    quiet: bool = False,
) -> Iterator[Span]:
    """A span named ``name``, current within the block, in the trace of ``trace_id`` (see
    :func:`run_context`; None: under the current span, if any). An exception that leaves the
    block is recorded on the span and marks it failed, then goes on; with ``quiet`` only its
    type is said (its message and traceback may quote what the span must not hold: a
    statement, a tool's arguments, a prompt). ``kind``: ``internal``,
    ``client`` (a call to another service: a model, a database) or ``server``. Without
    OpenTelemetry (or without a tracer provider set, see :func:`enabled`) the block runs
    with a :class:`Span` that does nothing."""
    if not enabled():
        yield Span()
        return
    from opentelemetry.trace import SpanKind

    span_kind = {"internal": SpanKind.INTERNAL, "client": SpanKind.CLIENT}.get(
        kind, SpanKind.SERVER
    )
    given = {k: val for k, val in (attributes or {}).items() if val is not None}
    with (
        run_context(trace_id),
        _get_tracer().start_as_current_span(
            name,
            kind=span_kind,
            attributes=given,
            record_exception=not quiet,
            set_status_on_exception=not quiet,
        ) as started,
    ):
        try:
            yield Span(started)
        except BaseException as exc:
            if quiet:
                Span(started).error(type(exc).__name__)
            raise
