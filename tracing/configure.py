"""`tracing.configure(...)`: build the tracer provider, its batch processor and exporters.

Every setting is taken from the argument, else from its environment variable, else the
default: the table `tracing.settings.SERVING` owns their names, defaults, variables and help
(docs/settings.md is generated from it). Exporters: the segment store (default: a local
directory) and/or OTLP over HTTP or gRPC (to `tailscope collect` or any collector).
Telemetry never crashes or blocks the host: exporter failures are logged and counted
(`Telemetry.stats()`), and the span queue is bounded, so memory stays bounded when a backend
is down.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from opentelemetry import trace

from tracing.settings import OTLP_GRPC_ENDPOINT, OTLP_HTTP_ENDPOINT, SERVING

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

    from tracing.exporters import BoundedBatchProcessor, SegmentStoreExporter
    from tracing.lean import LeanRecorder

__all__ = [
    "DEFAULTS",
    "ENV_EXPORTERS",
    "ENV_EXPORT_DELAY_MS",
    "ENV_MAX_QUEUE_SIZE",
    "ENV_OTLP_ENDPOINT",
    "ENV_OTLP_PROTOCOL",
    "ENV_OTLP_TIMEOUT_S",
    "ENV_REPLICA_ID",
    "ENV_SERVICE_NAME",
    "ENV_STORE",
    "ENV_STORE_FLUSH_S",
    "ENV_VARS",
    "EXPORTER_NAMES",
    "Telemetry",
    "configure",
]

_log = logging.getLogger("tailscope.configure")

# The variable names, as constants (their one owner is the SERVING table).
ENV_SERVICE_NAME: Final = SERVING.service_name.env
ENV_REPLICA_ID: Final = SERVING.replica_id.env
ENV_EXPORTERS: Final = SERVING.exporters.env
ENV_STORE: Final = SERVING.store.env
ENV_OTLP_ENDPOINT: Final = SERVING.otlp_endpoint.env
ENV_OTLP_PROTOCOL: Final = SERVING.otlp_protocol.env
ENV_OTLP_TIMEOUT_S: Final = SERVING.otlp_timeout_s.env
ENV_MAX_QUEUE_SIZE: Final = SERVING.max_queue_size.env
ENV_EXPORT_DELAY_MS: Final = SERVING.export_delay_ms.env
ENV_STORE_FLUSH_S: Final = SERVING.store_flush_s.env

#: Exporter names accepted by `exporters=` / TAILSCOPE_EXPORTERS.
EXPORTER_NAMES: Final[tuple[str, ...]] = ("store", "otlp", "none")
_OTLP_PROTOCOLS: Final = ("http/protobuf", "grpc")

#: Every environment variable with its default and meaning (generated from the SERVING table).
ENV_VARS: Final[dict[str, tuple[str, str]]] = {
    variable: (setting.shown_default(), setting.help) for variable, setting in SERVING.env_vars().items()}

#: Defaults used when neither argument nor environment variable gives a value (from the SERVING table).
DEFAULTS: Final[dict[str, Any]] = {
    **SERVING.defaults(), "otlp_endpoint_http": OTLP_HTTP_ENDPOINT, "otlp_endpoint_grpc": OTLP_GRPC_ENDPOINT}


@dataclass
class Telemetry:
    """What `configure` built: the provider, its processor and exporters, with counters."""

    provider: TracerProvider
    processor: BoundedBatchProcessor
    exporters: dict[str, SpanExporter]
    resource: Resource
    store: Path | None = None
    settings: dict[str, Any] = field(default_factory=dict)

    def stats(self) -> dict[str, int]:
        """Counters: spans exported / failed per exporter, spans dropped by the full queue."""
        out: dict[str, int] = {"dropped_spans": self.processor.dropped_spans,
                               "queued_spans": self.processor.queued_spans}
        for name, exporter in self.exporters.items():
            out[f"{name}.exported_spans"] = getattr(exporter, "exported_spans", 0)
            out[f"{name}.failed_spans"] = getattr(exporter, "failed_spans", 0)
            inner = getattr(exporter, "inner", None)
            if inner is not None and hasattr(inner, "dropped_spans"):
                out[f"{name}.dropped_spans"] = inner.dropped_spans
        return out

    def store_exporter(self) -> SegmentStoreExporter | None:
        """The segment store exporter, if one is configured."""
        guarded = self.exporters.get("store")
        return getattr(guarded, "inner", None) if guarded is not None else None

    def lean(self) -> LeanRecorder:
        """A lean recorder writing to this configuration's store with the same resource."""
        # loaded on first use to keep `import tracing` light (lean loads pyarrow); no cycle: lean never imports us
        from tracing.lean import LeanRecorder

        if self.store is None:
            raise ValueError("the lean path writes to a segment store; configure with exporters including 'store'")
        return LeanRecorder(self.store, resource=self.resource)

    def flush(self, timeout_millis: int = 30000) -> bool:
        """Export everything finished so far (and write it to the store); True on success."""
        return self.processor.force_flush(timeout_millis)

    def shutdown(self) -> None:
        """Flush and stop exporting (call at process exit; never raises)."""
        try:
            self.provider.shutdown()
        except Exception:
            _log.warning("tailscope: shutdown failed", exc_info=True)


def _exporter_names(arg: str | Iterable[str] | None, otlp_given: bool, env: Mapping[str, str] | None) -> list[str]:
    raw: Iterable[str]
    if arg is not None:
        raw = arg.split(",") if isinstance(arg, str) else arg
    elif (from_env := SERVING.exporters.resolve(None, env)) is not None:
        raw = from_env.split(",")
    else:
        raw = ["otlp"] if otlp_given else ["store"]
    names = [n.strip().lower() for n in raw if n.strip()]
    for n in names:
        if n not in EXPORTER_NAMES:
            raise ValueError(f"exporters must be among {', '.join(EXPORTER_NAMES)}, got {n!r}")
    return [n for n in dict.fromkeys(names) if n != "none"]


class _OncePerMinute(logging.Filter):
    """Lets a given message of a logger through at most once a minute (a dead backend is not news twice)."""

    def __init__(self) -> None:
        super().__init__()
        self._last: dict[tuple[str, str], float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        """True when this message was not let through in the last minute."""
        key = (record.name, str(record.msg))
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < 60.0:
            return False
        if len(self._last) > 256:
            self._last.clear()
        self._last[key] = now
        return True


_OTLP_LOG_FILTER = _OncePerMinute()


def _quiet_otlp_logs() -> None:
    """Rate-limit the OTLP exporters' own per-batch error logs (ours are rate-limited and counted)."""
    for name in ("opentelemetry.exporter.otlp.proto.http.trace_exporter",
                 "opentelemetry.exporter.otlp.proto.grpc.exporter"):
        logger = logging.getLogger(name)
        if _OTLP_LOG_FILTER not in logger.filters:
            logger.addFilter(_OTLP_LOG_FILTER)


def _otlp_exporter(endpoint: str, protocol: str, timeout_s: float) -> SpanExporter:
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        target = endpoint.split("://", 1)[-1]
        return GrpcExporter(endpoint=target, insecure=not endpoint.startswith("https://"), timeout=timeout_s)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=endpoint, timeout=timeout_s)


def configure(
    service_name: str | None = None,
    *,
    replica_id: str | None = None,
    exporters: str | Sequence[str] | None = None,
    store: Path | str | None = None,
    otlp_endpoint: str | None = None,
    otlp_protocol: str | None = None,
    otlp_timeout_s: float | None = None,
    resource_attributes: Mapping[str, Any] | None = None,
    max_queue_size: int | None = None,
    export_delay_ms: int | None = None,
    store_flush_s: float | None = None,
    extra_exporters: Sequence[SpanExporter] = (),
    set_global: bool = True,
    env: Mapping[str, str] | None = None,
) -> Telemetry:
    """Build and (by default) install the global tracer provider for this process.

    Each setting: argument, else environment variable, else default (the SERVING table). Raises
    ValueError on a setting that breaks a rule (unknown exporter or protocol, sizes <= 0).
    """
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON

    from tracing.exporters import BoundedBatchProcessor, GuardedExporter, SegmentStoreExporter

    service = SERVING.service_name.resolve(service_name or None, env)
    replica = SERVING.replica_id.resolve(replica_id or None, env)
    endpoint = SERVING.otlp_endpoint.resolve(otlp_endpoint or None, env)
    protocol = SERVING.otlp_protocol.resolve(otlp_protocol or None, env).lower()
    if protocol not in _OTLP_PROTOCOLS:
        raise ValueError(f"otlp_protocol must be one of {', '.join(_OTLP_PROTOCOLS)}, got {protocol!r}")
    names = _exporter_names(exporters, endpoint is not None, env)
    queue = SERVING.max_queue_size.resolve_or_default(max_queue_size, env, _log)
    delay = SERVING.export_delay_ms.resolve_or_default(export_delay_ms, env, _log)
    otlp_timeout = SERVING.otlp_timeout_s.resolve_or_default(otlp_timeout_s, env, _log)
    flush_s = SERVING.store_flush_s.resolve_or_default(store_flush_s, env, _log)
    if queue <= 0 or delay <= 0 or flush_s < 0:
        raise ValueError("max_queue_size and export_delay_ms must be > 0 and store_flush_s >= 0")

    attrs: dict[str, Any] = dict(resource_attributes or {})
    attrs["service.name"] = service
    attrs["service.instance.id"] = replica
    resource = Resource.create(attrs)

    built: dict[str, SpanExporter] = {}
    store_dir: Path | None = None
    if "store" in names:
        store_dir = SERVING.store.resolve(Path(store).expanduser() if store is not None else None, env)
        try:
            built["store"] = GuardedExporter(SegmentStoreExporter(store_dir, flush_interval_s=flush_s), "store")
        except Exception as exc:  # an unusable store must not stop the server from starting
            _log.error("tailscope: cannot write traces to %s (%s); continuing without the store exporter",
                       store_dir, exc)
            store_dir = None
    if "otlp" in names:
        target = endpoint or (OTLP_GRPC_ENDPOINT if protocol == "grpc" else OTLP_HTTP_ENDPOINT)
        _quiet_otlp_logs()
        built["otlp"] = GuardedExporter(_otlp_exporter(target, protocol, otlp_timeout), f"otlp-{protocol}")
    for i, extra in enumerate(extra_exporters):
        built[f"extra{i}"] = GuardedExporter(extra)

    processor = BoundedBatchProcessor(list(built.values()), max_queue_size=queue, schedule_delay_millis=delay,
                                      max_export_batch_size=min(512, queue))
    # every request is recorded, whatever an upstream sampled: a p99 needs all of them
    provider = TracerProvider(resource=resource, sampler=ALWAYS_ON)
    provider.add_span_processor(processor)
    if set_global:
        trace.set_tracer_provider(provider)
    settings = {"service_name": service, "replica_id": replica, "exporters": names, "store": store_dir,
                "otlp_endpoint": endpoint, "otlp_protocol": protocol, "otlp_timeout_s": otlp_timeout,
                "max_queue_size": queue, "export_delay_ms": delay, "store_flush_s": flush_s}
    return Telemetry(provider, processor, built, resource, store_dir, settings)
