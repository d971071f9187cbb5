"""Settings of the OTLP receiver: the `COLLECT` table owns their defaults, `--help` and docs/settings.md.

`CollectConfig` has one field per setting of the table (its default taken from the table; a
test checks fields and table agree), plus `store`, `token` and `forward_token`, which are not
settings with defaults (the store is the shared `--store` option, the tokens come from
`--token-file` and `--forward-token-file`).
The `tailscope collect` options are generated from the table's entries that name an option.

To add a setting: one entry in `CollectSettings` (with `option="--flag"` to put it on the
command line) and one field `name: type = COLLECT.name.default` in `CollectConfig`.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from intake.compact.policy import Policy
from intake.compact.retention import Retention, parse_duration
from tracing.settings import Setting, SettingsTable

MIB = 1 << 20


class CollectSettings(SettingsTable):
    """Settings of the receiver."""

    title = "Receiver (`tailscope collect`)"
    intro = ("Read by `intake.collect.Receiver` through `CollectConfig` (one field per setting). "
             "The settings with an option are `tailscope collect` options (generated from this table); "
             "the others are `CollectConfig` arguments for code that embeds the receiver.")
    readers = ("intake.collect.receiver", "intake.collect.forward", "intake.collect.http", "intake.collect.grpc_server",
               "intake.collect.intake", "intake.collect.config")

    host: Setting[str] = Setting(
        str, "127.0.0.1", "Address to listen on. Loopback by default; give 0.0.0.0 (with --token-file) only when "
        "other machines must send to this one.", option="--host")
    http_port: Setting[int] = Setting(
        int, 4318, "Port of OTLP/HTTP (POST /v1/traces, protobuf or JSON, gzip allowed); 0 picks a free port, "
        "-1 turns HTTP off.", option="--http-port")
    grpc_port: Setting[int] = Setting(
        int, 4317, "Port of OTLP/gRPC (TraceService/Export); 0 picks a free port, -1 turns gRPC off.",
        option="--grpc-port")
    max_body_bytes: Setting[int] = Setting(
        int, 64 * MIB, "Largest request body after gzip decompression (the OTLP recommendation); larger ones "
        "get 413 and a gzip bomb is cut off there. Also the largest gRPC message (RESOURCE_EXHAUSTED).",
        option="--max-body-mib", option_scale=MIB, option_unit="MiB")
    max_queue_spans: Setting[int] = Setting(
        int, 1_000_000, "Spans accepted but not yet on disk; beyond this requests get 503 with Retry-After "
        "instead of growing memory.", option="--max-queue-spans")
    max_inflight_bytes: Setting[int] = Setting(
        int, 512 * MIB, "Request bytes being read, inflated or decoded at once, over all connections; a body is "
        "claimed from its Content-Length before it is read, and one that does not fit gets 503 with Retry-After. "
        "A gRPC message is claimed once read, before it is decoded (UNAVAILABLE when it does not fit), and no "
        "more gRPC messages are read at once than this budget holds of --max-body-mib.",
        option="--max-inflight-mib", option_scale=MIB, option_unit="MiB")
    dedupe_window: Setting[int] = Setting(
        int, 1_000_000, "Keys (TraceId, SpanId) of the most recently stored spans kept to drop re-sent spans; "
        "about 150 bytes each. 0 turns deduplication off.", option="--dedupe-window")
    dedupe_startup_s: Setting[float] = Setting(
        float, 900.0, "At startup, load the keys of segments written this many seconds before, so spans re-sent "
        "after a crash are not stored twice.", option="--dedupe-startup-s")
    retry_after_s: Setting[int] = Setting(
        int, 1, "Seconds a client is told to wait (Retry-After) when the queue is full or the receiver is stopping.")
    drain_timeout_s: Setting[float] = Setting(
        float, 30.0, "Seconds shutdown waits for in-flight requests before giving up on them.")
    durable: Setting[bool] = Setting(
        bool, True, "fsync each segment and its directory before answering (off only for benchmarks and tests).")
    grpc_workers: Setting[int] = Setting(
        int, 8, "Threads serving authenticated gRPC calls: at most this many messages are read at once "
        "(grpcio reads a message whole before its handler runs; fewer when that many messages of "
        "--max-body-mib would overflow --max-inflight-mib), and 4 calls per thread are admitted at once "
        "(more get UNAVAILABLE before anything is read). Unauthenticated calls are refused on a thread "
        "of their own and take none of these.", option="--grpc-workers")
    max_connections: Setting[int] = Setting(
        int, 1024, "Open HTTP connections at once, one more is answered 503 and closed; as many gRPC connections "
        "(one more is refused at connect).", option="--max-connections")
    max_header_bytes: Setting[int] = Setting(
        int, 64 * 1024, "Largest HTTP request line plus headers, larger ones get 431; and largest gRPC metadata.",
        option="--max-header-kib", option_scale=1024, option_unit="KiB")
    idle_timeout_s: Setting[float] = Setting(
        float, 120.0, "Seconds a keep-alive HTTP connection may sit idle between requests before it is closed; "
        "a gRPC connection with no call this long is closed too.",
        option="--idle-timeout-s")
    header_timeout_s: Setting[float] = Setting(
        float, 10.0, "Seconds from a request's first byte to the end of its headers; a slower sender gets 408 "
        "and is closed. Also the time a gRPC connection has to finish its HTTP/2 handshake.",
        option="--header-timeout-s")
    read_timeout_s: Setting[float] = Setting(
        float, 15.0, "Seconds a request body may go without a new byte (408), and a slow reader may take to "
        "accept an answer.", option="--read-timeout-s")
    body_timeout_s: Setting[float] = Setting(
        float, 60.0, "Seconds for a whole request body to arrive (408); a 64 MiB body needs about 1.1 MB/s. "
        "gRPC connections are recycled (GOAWAY) after this long and their calls get as long again to end, so a "
        "gRPC message that never arrives holds a worker at most twice this.",
        option="--body-timeout-s")
    gather_spans: Setting[int] = Setting(
        int, 4096, "While several HTTP clients send, a group commit is taken at most once per --gather-ms "
        "unless this many spans are waiting, so the fixed cost of a segment is shared.", option="--gather-spans")
    record_peer: Setting[bool] = Setting(
        bool, True, "Add the sending client's IP address to each resource as tailscope.peer (unless the "
        "resource states one), which names replicas whose resource says nothing (TGI, Triton; "
        "docs/convention.md#replica). The C decoder adds it as it copies the resource, so it costs no "
        "measurable CPU (docs/benchmarks.md).", option="--record-peer/--no-record-peer")
    forward: Setting[str] = Setting(
        str, "", "After storing, forward every span (engine facts and synthetic stage spans included, as "
        "tailscope.* attributes) over OTLP/HTTP protobuf to this URL, e.g. a Collector's "
        "http://127.0.0.1:4318/v1/traces; from its own thread, never blocking intake (docs/collect.md). "
        "Empty: off.", option="--forward")
    forward_queue_spans: Setting[int] = Setting(
        int, 200_000, "Stored spans waiting to be forwarded; a group that does not fit is dropped and counted "
        "(fwd dropped on the console line).", option="--forward-queue-spans")
    forward_timeout_s: Setting[float] = Setting(
        float, 10.0, "Seconds one forward request may take to connect or answer before it is retried.")
    forward_retry_s: Setting[float] = Setting(
        float, 300.0, "Seconds one forward batch is retried (429, 502, 503, 504, network errors; backoff "
        "0.5-30 s or Retry-After) before it is dropped.")
    gather_ms: Setting[float] = Setting(
        float, 20.0, "Shortest time between two group commits smaller than --gather-spans while several clients "
        "send, in ms (a lone client is answered at once); 0 turns gathering off.", option="--gather-ms")
    journal_ms: Setting[float] = Setting(
        float, 250.0, "While several HTTP clients send, a request is answered once its body is fsynced in the "
        "store's journal (.journal/), and segments are written from the journal's spans at most this many ms "
        "apart (or at --segment-spans): acknowledged spans become visible to queries within about this long "
        "plus one segment write. A lone client is answered only once its spans are in a segment. A receiver "
        "killed with journalled spans leaves them to the next start, which stores them before listening. "
        "0: off (every answer waits for its segment).",
        option="--journal-ms")
    segment_spans: Setting[int] = Setting(
        int, 32_768, "Journalled spans that start a segment before --journal-ms has passed.",
        option="--segment-spans")
    metrics_port: Setting[int] = Setting(
        int, -1, "Port of GET /metrics (OpenMetrics: span latency histograms with trace-id exemplars, the "
        "receiver's health; docs/metrics.md) on --host; 0 picks a free port, -1 turns it off. With "
        "--token-file, scrapes need 'Authorization: Bearer <token>' too.", option="--metrics-port")
    metrics_tenants: Setting[int] = Setting(
        int, 0, "Give the latency histograms a tenant label holding the first this many tenants seen (later "
        "ones are counted as `other`); 0: no tenant label (tenant ids can be unbounded).",
        option="--metrics-tenants")

    compact: Setting[bool] = Setting(
        bool, True, "Compact the store in the background: an hour's small segments are merged in levels while "
        "it is written, and into a few large files sorted by start time once it has settled (docs/collect.md, "
        "\"What happens to files\"). From its own thread, never in the way of an answer.",
        option="--compact/--no-compact")
    compact_fan_in: Setting[int] = Setting(
        int, 8, "Segments of one level merged into one of the next while an hour is written: an hour holds "
        "fewer than this many small segments per level.", option="--compact-fan-in")
    compact_target_bytes: Setting[int] = Setting(
        int, 64 * MIB, "Size a compacted segment is made up to (a merge reads at most about this much), within what "
        "--compact-memory-mib can sort (16 KiB a MiB of DuckDB's share: 2 MiB by default); segments of half the "
        "smaller of the two or more are not merged again.",
        option="--compact-target-mib", option_scale=MIB, option_unit="MiB")
    compact_settle_s: Setting[float] = Setting(
        float, 300.0, "Seconds after an hour ends before it may count as settled (and get its final files).",
        option="--compact-settle-s")
    compact_quiet_s: Setting[float] = Setting(
        float, 60.0, "Seconds without a new segment in an ended hour before it counts as settled.",
        option="--compact-quiet-s")
    compact_grace_s: Setting[float] = Setting(
        float, 600.0, "Seconds merged segments stay on disk (hidden from new readers) before they are deleted, "
        "so a query that listed them before the merge can finish.", option="--compact-grace-s")
    compact_row_group_spans: Setting[int] = Setting(
        int, 65_536, "Spans per Parquet row group in compacted segments (sorted by start time, so a time range "
        "reads only the row groups it meets); a multiple of 2,048 (DuckDB writes them).")
    compact_every_s: Setting[float] = Setting(
        float, 0.5, "Seconds between two compaction passes over the store.")
    compact_memory_mib: Setting[int] = Setting(
        int, 192, "Memory compaction's merges may use together, all told (both merge lanes share one DuckDB database; "
        "it gets this less 64 MiB, what it uses beyond its limit, and a sort beyond that spills to "
        "STORE/.compact-tmp/; at least 128). The receiver's memory is its own plus at most this.",
        option="--compact-memory-mib")
    retain: Setting[str] = Setting(
        str, "", "Remove spans, a whole hour at a time and oldest first, once their hour ended this long ago "
        "(e.g. 72h, 3d, 2w), with the hour's materialized requests. Empty: keep everything.", option="--retain")
    max_store_gb: Setting[float] = Setting(
        float, 0.0, "Remove the oldest hours (never the newest) while the store's spans and materialized requests "
        "take more than this many GB (10^9 bytes). 0: no limit.", option="--max-store-gb")


#: Names of the settings `tailscope compact` takes too (compaction and retention).
COMPACT_SETTINGS: Final = ("compact_fan_in", "compact_target_bytes", "compact_settle_s", "compact_quiet_s",
                           "compact_grace_s", "compact_memory_mib", "retain", "max_store_gb")

#: The receiver's settings table.
COLLECT: Final = CollectSettings()


@dataclass(frozen=True)
class CollectConfig:
    """Everything `tailscope collect` can be told; ports of 0 pick a free port, None disables."""

    store: Path
    host: str = COLLECT.host.default
    http_port: int | None = COLLECT.http_port.default
    grpc_port: int | None = COLLECT.grpc_port.default
    token: str | None = None
    max_body_bytes: int = COLLECT.max_body_bytes.default
    max_queue_spans: int = COLLECT.max_queue_spans.default
    max_inflight_bytes: int = COLLECT.max_inflight_bytes.default
    dedupe_window: int = COLLECT.dedupe_window.default
    dedupe_startup_s: float = COLLECT.dedupe_startup_s.default
    retry_after_s: int = COLLECT.retry_after_s.default
    drain_timeout_s: float = COLLECT.drain_timeout_s.default
    durable: bool = COLLECT.durable.default
    grpc_workers: int = COLLECT.grpc_workers.default
    max_connections: int = COLLECT.max_connections.default
    max_header_bytes: int = COLLECT.max_header_bytes.default
    idle_timeout_s: float = COLLECT.idle_timeout_s.default
    header_timeout_s: float = COLLECT.header_timeout_s.default
    read_timeout_s: float = COLLECT.read_timeout_s.default
    body_timeout_s: float = COLLECT.body_timeout_s.default
    gather_spans: int = COLLECT.gather_spans.default
    gather_ms: float = COLLECT.gather_ms.default
    journal_ms: float = COLLECT.journal_ms.default
    segment_spans: int = COLLECT.segment_spans.default
    record_peer: bool = COLLECT.record_peer.default
    forward: str = COLLECT.forward.default
    forward_queue_spans: int = COLLECT.forward_queue_spans.default
    forward_timeout_s: float = COLLECT.forward_timeout_s.default
    forward_retry_s: float = COLLECT.forward_retry_s.default
    forward_token: str | None = None
    compact: bool = COLLECT.compact.default
    compact_fan_in: int = COLLECT.compact_fan_in.default
    compact_target_bytes: int = COLLECT.compact_target_bytes.default
    compact_settle_s: float = COLLECT.compact_settle_s.default
    compact_quiet_s: float = COLLECT.compact_quiet_s.default
    compact_grace_s: float = COLLECT.compact_grace_s.default
    compact_row_group_spans: int = COLLECT.compact_row_group_spans.default
    compact_every_s: float = COLLECT.compact_every_s.default
    compact_memory_mib: int = COLLECT.compact_memory_mib.default
    retain: str = COLLECT.retain.default
    max_store_gb: float = COLLECT.max_store_gb.default
    metrics_port: int | None = COLLECT.metrics_port.default  # None or negative: off
    metrics_tenants: int = COLLECT.metrics_tenants.default

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_queue_spans", "max_inflight_bytes", "max_connections",
                     "max_header_bytes", "idle_timeout_s", "header_timeout_s", "read_timeout_s", "body_timeout_s",
                     "grpc_workers"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.gather_spans < 0 or self.gather_ms < 0:
            raise ValueError("gather_spans and gather_ms must be >= 0")
        if self.journal_ms < 0 or self.segment_spans <= 0:
            raise ValueError("journal_ms must be >= 0 and segment_spans positive")
        if self.forward_queue_spans <= 0 or self.forward_timeout_s <= 0 or self.forward_retry_s < 0:
            raise ValueError("forward_queue_spans and forward_timeout_s must be positive, forward_retry_s >= 0")
        if self.metrics_tenants < 0:
            raise ValueError(f"metrics_tenants must be >= 0, got {self.metrics_tenants}")
        if self.dedupe_window < 0:
            raise ValueError(f"dedupe_window must be >= 0, got {self.dedupe_window}")
        self.compact_policy()  # raises ValueError on a bad compaction or retention setting
        self.retention()
        if self.http_port is None and self.grpc_port is None:
            raise ValueError("at least one of http_port and grpc_port must be set")

    def compact_policy(self) -> Policy:
        """The compactor's policy from the compact_* settings."""
        return Policy(fan_in=self.compact_fan_in, target_bytes=self.compact_target_bytes,
                      settle_s=self.compact_settle_s, quiet_s=self.compact_quiet_s, grace_s=self.compact_grace_s,
                      row_group_spans=self.compact_row_group_spans, durable=self.durable,
                      memory_mib=self.compact_memory_mib)

    def retention(self) -> Retention:
        """The retention policy from --retain and --max-store-gb."""
        if self.max_store_gb < 0:
            raise ValueError(f"--max-store-gb must be >= 0, got {self.max_store_gb}")
        return Retention(retain_s=parse_duration(self.retain) if self.retain else None,
                         max_bytes=int(self.max_store_gb * 1e9) if self.max_store_gb else None)


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
    metrics = (" and read /metrics (latencies, trace ids)" if config.metrics_port is not None
               and config.metrics_port >= 0 else "")
    return (f"listening on {config.host} without --token-file: anyone who can reach this machine can "
            f"write spans to the store (gRPC and HTTP alike){metrics}; give --token-file, or keep the default "
            "--host 127.0.0.1")


def read_token(path: Path) -> str:
    """The bearer token in `path` (surrounding whitespace stripped); ValueError if empty."""
    token = Path(path).read_text(encoding="utf-8").strip()
    if not token:
        raise ValueError(f"{path}: token file is empty")
    if any(ch.isspace() for ch in token):
        raise ValueError(f"{path}: the token must be one word without whitespace")
    return token
