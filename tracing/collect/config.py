"""Settings of the OTLP receiver: one table drives the defaults, `--help` and docs/collect.md."""

from __future__ import annotations

import ipaddress
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
#: Open HTTP connections at once; one more is answered 503 and closed.
DEFAULT_MAX_CONNECTIONS = 1024
#: Bytes of an HTTP request line plus headers; beyond this the request is answered 431.
DEFAULT_MAX_HEADER_BYTES = 64 * 1024
#: Seconds an HTTP keep-alive connection may sit idle between requests before it is closed.
DEFAULT_IDLE_TIMEOUT_S = 120.0
#: Seconds from the first byte of a request to the end of its headers (slow senders get 408).
DEFAULT_HEADER_TIMEOUT_S = 10.0
#: Seconds a request body may go without a single new byte (408).
DEFAULT_READ_TIMEOUT_S = 15.0
#: Seconds for a whole request body to arrive (408); a 64 MiB body needs about 1.1 MB/s.
DEFAULT_BODY_TIMEOUT_S = 60.0
#: While several HTTP clients send, a group commit is taken at most once per gather_ms unless this
#: many spans wait (8 connections of 512-span bodies fill it at once).
DEFAULT_GATHER_SPANS = 4096
#: Shortest time between two group commits smaller than gather_spans while several clients send (ms);
#: 0 turns gathering off.
DEFAULT_GATHER_MS = 20.0
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
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    gather_spans: int = DEFAULT_GATHER_SPANS
    gather_ms: float = DEFAULT_GATHER_MS

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_queue_spans", "max_inflight_bytes", "max_connections",
                     "max_header_bytes", "idle_timeout_s", "header_timeout_s", "read_timeout_s", "body_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.gather_spans < 0 or self.gather_ms < 0:
            raise ValueError("gather_spans and gather_ms must be >= 0")
        if self.dedupe_window < 0:
            raise ValueError(f"dedupe_window must be >= 0, got {self.dedupe_window}")
        if self.http_port is None and self.grpc_port is None:
            raise ValueError("at least one of http_port and grpc_port must be set")


def is_loopback(host: str) -> bool:
    """True when `host` names only this machine (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def exposure_warning(config: CollectConfig) -> str | None:
    """A warning when the receiver listens beyond loopback without a token (None otherwise)."""
    if config.token or is_loopback(config.host):
        return None
    return (f"listening on {config.host} without --token-file: anyone who can reach this machine can "
            "write spans to the store (gRPC and HTTP alike); give --token-file, or keep the default "
            "--host 127.0.0.1")


def read_token(path: Path) -> str:
    """The bearer token in `path` (surrounding whitespace stripped); ValueError if empty."""
    token = Path(path).read_text(encoding="utf-8").strip()
    if not token:
        raise ValueError(f"{path}: token file is empty")
    if any(ch.isspace() for ch in token):
        raise ValueError(f"{path}: the token must be one word without whitespace")
    return token
