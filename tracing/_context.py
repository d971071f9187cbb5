"""Internals shared by the recorders, propagation and the client: context key, tracer, W3C extract.

Kept apart so that tracing.instrument, tracing.propagation, tracing.lean and tracing.client
import them from below instead of from each other (no import cycles).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

#: Instrumentation scope of every span this library makes.
SCOPE_NAME: Final = "tailscope"
SCOPE_VERSION: Final = "0.1.0"

#: Context key under which the open request travels (tasks, threads, propagated contexts).
REQUEST_KEY: Final = otel_context.create_key("tailscope-request")

W3C: Final = TraceContextTextMapPropagator()

_provider_seen: object = None
_tracer_cached: trace.Tracer | None = None


def tracer() -> trace.Tracer:
    """The tailscope tracer of the current global provider (refreshed when the provider changes)."""
    global _provider_seen, _tracer_cached
    provider = trace.get_tracer_provider()
    if provider is not _provider_seen or _tracer_cached is None:
        _tracer_cached = provider.get_tracer(SCOPE_NAME, SCOPE_VERSION)
        _provider_seen = provider
    return _tracer_cached


def extract(carrier: Mapping[str, str], context: Context | None = None) -> Context:
    """The context continued from `carrier`'s W3C headers (case-insensitive keys), on top of `context`."""
    if carrier and "traceparent" not in carrier:
        carrier = {k.lower(): v for k, v in carrier.items()}
    return W3C.extract(carrier, context=context)
