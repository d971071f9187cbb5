"""Shared test helpers for the instrumentation tests: a fresh global provider with an in-memory exporter."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once


def reset_globals() -> None:
    """Forget the global tracer provider so the next test can install its own."""
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """An in-memory exporter behind a SimpleSpanProcessor on a fresh global provider."""
    reset_globals()
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "test", "service.instance.id": "r0"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    yield exporter
    provider.shutdown()
    reset_globals()


def by_name(finished: Sequence[ReadableSpan]) -> dict[str, ReadableSpan]:
    """Spans keyed by name (names must be unique)."""
    out = {s.name: s for s in finished}
    assert len(out) == len(finished), [s.name for s in finished]
    return out


def parent_id(span: ReadableSpan) -> int | None:
    """The parent span id, or None for a root."""
    return span.parent.span_id if span.parent is not None else None


def span_id(span: ReadableSpan) -> int:
    """The span's own id."""
    assert span.context is not None
    return span.context.span_id


def trace_id(span: ReadableSpan) -> int:
    """The span's trace id."""
    assert span.context is not None
    return span.context.trace_id


def start(span: ReadableSpan) -> int:
    """A finished span's start time (ns; the SDK types it optional)."""
    assert span.start_time is not None
    return span.start_time


def end(span: ReadableSpan) -> int:
    """A finished span's end time (ns; the SDK types it optional)."""
    assert span.end_time is not None
    return span.end_time
