"""Settings of the OTLP receiver: one table drives the defaults, `--help` and docs/collect.md."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

MIB = 1 << 20

#: Body cap after decompression recommended by the OTLP specification.
DEFAULT_MAX_BODY_BYTES = 64 * MIB
#: Spans accepted but not yet durable; beyond this requests get 503 + Retry-After.
DEFAULT_MAX_QUEUE_SPANS = 1_000_000
#: Bytes of request bodies being read or decoded at once; beyond this requests get 503.
DEFAULT_MAX_INFLIGHT_BYTES = 512 * MIB
#: Keys of recently stored spans kept to drop re-sent spans (see docs/collect.md).
DEFAULT_DEDUPE_WINDOW = 1_000_000
#: At startup, keys of segments modified this recently are loaded into the dedupe window.
DEFAULT_DEDUPE_STARTUP_S = 900.0
#: Seconds a client is told to wait (Retry-After) when the queue is full or we are stopping.
DEFAULT_RETRY_AFTER_S = 1
#: Seconds shutdown waits for in-flight requests before giving up on them.
DEFAULT_DRAIN_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class CollectConfig:
    """Everything `tailscope collect` can be told; ports of 0 pick a free port, None disables."""

    store: Path
    host: str = "127.0.0.1"
    http_port: int | None = 4318
    grpc_port: int | None = 4317
    token: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_queue_spans: int = DEFAULT_MAX_QUEUE_SPANS
    max_inflight_bytes: int = DEFAULT_MAX_INFLIGHT_BYTES
    dedupe_window: int = DEFAULT_DEDUPE_WINDOW
    dedupe_startup_s: float = DEFAULT_DEDUPE_STARTUP_S
    retry_after_s: int = DEFAULT_RETRY_AFTER_S
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S
    durable: bool = True
    grpc_workers: int = 8
    #: add the client's IP address to each resource as `tailscope.peer` (docs/convention.md#replica)
    record_peer: bool = True

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_queue_spans", "max_inflight_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.dedupe_window < 0:
            raise ValueError(f"dedupe_window must be >= 0, got {self.dedupe_window}")
        if self.http_port is None and self.grpc_port is None:
            raise ValueError("at least one of http_port and grpc_port must be set")


def read_token(path: Path) -> str:
    """The bearer token in `path` (surrounding whitespace stripped); ValueError if empty."""
    token = Path(path).read_text(encoding="utf-8").strip()
    if not token:
        raise ValueError(f"{path}: token file is empty")
    if any(ch.isspace() for ch in token):
        raise ValueError(f"{path}: the token must be one word without whitespace")
    return token
