"""tailscope tracing: instrument inference serving code, and the store its traces land in.

The public API for serving code (everything in `__all__`); importing it loads only the
OpenTelemetry API and the schema constants. The SDK, exporters, the lean path and the HTTP
client helper load when first used.
"""

import typing as _typing

from tracing.configure import ENV_VARS, Telemetry, configure
from tracing.instrument import (
    DECODE,
    GENERATION,
    MODEL_LOAD,
    NETWORK,
    PREFILL,
    PREPROCESS,
    QUEUE_WAIT,
    STREAMING,
    ClientDisconnected,
    Request,
    Stage,
    StageSpan,
    current_request,
    request,
    stage,
    traced_request,
)
from tracing.propagation import RemoteRequest, apply_report, extract, inject, resume
from tracing.streaming import AsyncTokenStream, TokenStream, stream

if _typing.TYPE_CHECKING:
    from tracing.client import ClientCall, ClientResult, client_request, post_json
    from tracing.lean import LeanRecorder, LeanRequest

__all__ = [
    "DECODE",
    "ENV_VARS",
    "GENERATION",
    "MODEL_LOAD",
    "NETWORK",
    "PREFILL",
    "PREPROCESS",
    "QUEUE_WAIT",
    "STREAMING",
    "AsyncTokenStream",
    "ClientCall",
    "ClientDisconnected",
    "ClientResult",
    "LeanRecorder",
    "LeanRequest",
    "RemoteRequest",
    "Request",
    "Stage",
    "StageSpan",
    "Telemetry",
    "TokenStream",
    "apply_report",
    "client_request",
    "configure",
    "current_request",
    "extract",
    "inject",
    "post_json",
    "request",
    "resume",
    "stage",
    "stream",
    "traced_request",
]

_LAZY = {
    "ClientCall": "tracing.client",
    "ClientResult": "tracing.client",
    "client_request": "tracing.client",
    "post_json": "tracing.client",
    "LeanRecorder": "tracing.lean",
    "LeanRequest": "tracing.lean",
}


def __getattr__(name: str) -> _typing.Any:
    """Load the client helper and the lean path on first use (they need more than the OTel API)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tracing' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
