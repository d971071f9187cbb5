"""`tailscope collect`: run the OTLP receiver (HTTP and gRPC) that writes durable segments."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from intake.collect import CollectConfig, Receiver, read_token
from intake.collect import config as C
from tailscope.commands.common import StoreOption, errors_as_messages, fail, store_path


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
    record_peer: Annotated[bool, typer.Option(
        "--record-peer/--no-record-peer", help="Add the sending client's IP address to each resource as "
        "tailscope.peer, which names replicas whose resource says nothing (TGI, Triton; "
        "docs/convention.md#replica).")] = True,
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
            dedupe_window=dedupe_window, dedupe_startup_s=dedupe_startup_s, record_peer=record_peer,
        )
    except ValueError as exc:
        fail(str(exc))
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
    sys.stderr.write(f"stopped: {stats.stored_spans:,} spans stored in {stats.segments:,} segment(s), "
                     f"{stats.duplicate_spans:,} duplicates dropped, {stats.rejected_spans:,} rejected\n")


def register(app: typer.Typer) -> None:
    """Add the command to the app."""
    app.command("collect")(collect)
