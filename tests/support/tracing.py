"""Spans recorded in memory (OpenTelemetry's SDK and its ``InMemorySpanExporter``).

The tracer provider is global and can be set once per process: the first use sets the SDK's,
with a processor that keeps spans only while a test listens (:func:`recorded_spans`), so the
tests that do not ask for spans see none piling up.

    def test_x(spans: InMemorySpanExporter) -> None: ...   # with the fixture re-exported
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")

from opentelemetry import context, trace
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)


class _WhileListening(SpanProcessor):
    def __init__(self, exporter: InMemorySpanExporter) -> None:
        self.exporter = exporter
        self.listening = False

    def on_start(self, span: Span, parent_context: context.Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        if self.listening:
            self.exporter.export([span])


_EXPORTER = InMemorySpanExporter()
_PROCESSOR = _WhileListening(_EXPORTER)


def _install() -> None:
    provider = trace.get_tracer_provider()
    if isinstance(provider, TracerProvider):
        if _PROCESSOR not in provider._active_span_processor._span_processors:
            provider.add_span_processor(_PROCESSOR)
        return
    made = TracerProvider()
    made.add_span_processor(_PROCESSOR)
    trace.set_tracer_provider(made)
    assert trace.get_tracer_provider() is made, "another tracer provider was set first"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The spans ended during the test (``spans.get_finished_spans()``)."""
    _install()
    _EXPORTER.clear()
    _PROCESSOR.listening = True
    try:
        yield _EXPORTER
    finally:
        _PROCESSOR.listening = False
        _EXPORTER.clear()
