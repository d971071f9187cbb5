"""`tailscope collect`: run the OTLP receiver (HTTP and gRPC) that writes durable segments."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from analysis.commands.common import StoreOption, errors_as_messages, fail, store_path
from tracing.collect import CollectConfig, Receiver, read_token
from tracing.collect import config as C


def collect(
    store: StoreOption = None,
    host: Annotated[str, typer.Option(
        "--host", help="Address to listen on. Loopback by default; give 0.0.0.0 (with --token-file) "
        "only when other machines must send to this one.")] = "127.0.0.1",
    http_port: Annotated[int, typer.Option(
        "--http-port", help="Port of OTLP/HTTP (POST /v1/traces, protobuf or JSON, gzip allowed); "
        "0 picks a free port, -1 turns HTTP off.")] = 4318,
    grpc_port: Annotated[int, typer.Option(
        "--grpc-port", help="Port of OTLP/gRPC (TraceService/Export); 0 picks a free port, "
        "-1 turns gRPC off.")] = 4317,
    token_file: Annotated[Path | None, typer.Option(
        "--token-file", help="File holding a bearer token; requests without 'Authorization: Bearer "
        "<token>' are answered 401 (gRPC: UNAUTHENTICATED).", show_default=False)] = None,
    max_body_mib: Annotated[int, typer.Option(
        "--max-body-mib", help="Largest request body after gzip decompression, in MiB; larger "
        "ones get 413 and a gzip bomb is cut off there.")] = C.DEFAULT_MAX_BODY_BYTES // C.MIB,
    max_queue_spans: Annotated[int, typer.Option(
        "--max-queue-spans", help="Spans accepted but not yet on disk; beyond this requests get "
        "503 with Retry-After instead of growing memory.")] = C.DEFAULT_MAX_QUEUE_SPANS,
    dedupe_window: Annotated[int, typer.Option(
        "--dedupe-window", help="Keys (TraceId, SpanId) of the most recently stored spans kept to "
        "drop re-sent spans; about 150 bytes each. 0 turns deduplication off.")] = C.DEFAULT_DEDUPE_WINDOW,
    dedupe_startup_s: Annotated[float, typer.Option(
        "--dedupe-startup-s", help="At startup, load the keys of segments written this many seconds "
        "before, so spans re-sent after a crash are not stored twice.")] = C.DEFAULT_DEDUPE_STARTUP_S,
    max_inflight_mib: Annotated[int, typer.Option(
        "--max-inflight-mib", help="Request bytes being read, inflated or decoded at once, over all "
        "connections, in MiB; a body is claimed from its Content-Length before it is read, and one that "
        "does not fit gets 503 with Retry-After.")] = C.DEFAULT_MAX_INFLIGHT_BYTES // C.MIB,
    max_connections: Annotated[int, typer.Option(
        "--max-connections", help="Open HTTP connections at once; one more is answered 503 and "
        "closed.")] = C.DEFAULT_MAX_CONNECTIONS,
    max_header_kib: Annotated[int, typer.Option(
        "--max-header-kib", help="Largest HTTP request line plus headers, in KiB; larger ones get "
        "431.")] = C.DEFAULT_MAX_HEADER_BYTES // 1024,
    idle_timeout_s: Annotated[float, typer.Option(
        "--idle-timeout-s", help="Seconds a keep-alive HTTP connection may sit idle between requests "
        "before it is closed.")] = C.DEFAULT_IDLE_TIMEOUT_S,
    header_timeout_s: Annotated[float, typer.Option(
        "--header-timeout-s", help="Seconds from a request's first byte to the end of its headers; a "
        "slower sender gets 408 and is closed.")] = C.DEFAULT_HEADER_TIMEOUT_S,
    read_timeout_s: Annotated[float, typer.Option(
        "--read-timeout-s", help="Seconds a request body may go without a new byte (408), and a slow "
        "reader may take to accept an answer.")] = C.DEFAULT_READ_TIMEOUT_S,
    body_timeout_s: Annotated[float, typer.Option(
        "--body-timeout-s", help="Seconds for a whole request body to arrive (408).")] = C.DEFAULT_BODY_TIMEOUT_S,
    gather_spans: Annotated[int, typer.Option(
        "--gather-spans", help="While several HTTP clients send, a group commit is taken at most once "
        "per --gather-ms unless this many spans are waiting, so the fixed cost of a segment is "
        "shared.")] = C.DEFAULT_GATHER_SPANS,
    gather_ms: Annotated[float, typer.Option(
        "--gather-ms", help="Shortest time between two group commits smaller than --gather-spans while "
        "several clients send, in ms (a lone client is answered at once); 0 turns gathering "
        "off.")] = C.DEFAULT_GATHER_MS,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress line.")] = False,
) -> None:
    """Receive OTLP traces and store them; a 200 (gRPC OK) means the spans are fsynced to disk.

    Prints 'listening http=HOST:PORT grpc=HOST:PORT' once ready, then a progress line
    (spans/s, stored, segments, rejected, duplicates, queue depth, p99 commit latency).
    SIGTERM or Ctrl-C stops cleanly: in-flight requests are answered and the queue is written.
    """
    token = None
    if token_file is not None:
        try:
            token = read_token(token_file)
        except (OSError, ValueError) as exc:
            fail(f"--token-file: {exc}")
    try:
        config = CollectConfig(
            store=store_path(store), host=host,
            http_port=None if http_port < 0 else http_port,
            grpc_port=None if grpc_port < 0 else grpc_port,
            token=token, max_body_bytes=max_body_mib * C.MIB, max_queue_spans=max_queue_spans,
            dedupe_window=dedupe_window, dedupe_startup_s=dedupe_startup_s,
            max_inflight_bytes=max_inflight_mib * C.MIB, max_connections=max_connections,
            max_header_bytes=max_header_kib * 1024,
            idle_timeout_s=idle_timeout_s, header_timeout_s=header_timeout_s, read_timeout_s=read_timeout_s,
            body_timeout_s=body_timeout_s, gather_spans=gather_spans, gather_ms=gather_ms,
        )
    except ValueError as exc:
        fail(str(exc))
    warning = C.exposure_warning(config)
    if warning:
        sys.stderr.write(f"warning: {warning}\n")
    with errors_as_messages():
        receiver = Receiver(config)

    def ready(r: Receiver) -> None:
        parts = []
        if r.http_port is not None:
            parts.append(f"http={config.host}:{r.http_port}")
        if r.grpc_port is not None:
            parts.append(f"grpc={config.host}:{r.grpc_port}")
        sys.stderr.write(f"listening {' '.join(parts)} store={config.store} "
                         f"(dedupe: {r.loaded_keys:,} recent keys loaded)\n")
        sys.stderr.flush()

    try:
        stats = receiver.serve_forever(progress=None if quiet else sys.stderr, on_ready=ready)
    except OSError as exc:
        fail(f"could not listen: {exc}")
    sys.stderr.write(f"stopped: {stats.stored_spans:,} spans stored in {stats.segments:,} segment(s) "
                     f"from {stats.commits:,} group commit(s), "
                     f"{stats.duplicate_spans:,} duplicates dropped, {stats.rejected_spans:,} rejected\n")


def register(app: typer.Typer) -> None:
    """Add the command to the app."""
    app.command("collect")(collect)
