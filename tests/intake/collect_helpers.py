"""Helpers for the receiver tests: a receiver in this process, OTLP bodies, raw HTTP posts."""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from intake.collect import CollectConfig, Receiver

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_763_647_200_000_000_000  # 2025-11-20T14:00:00Z


@contextmanager
def running(store: Path, **options: Any) -> Iterator[Receiver]:
    """A started receiver on free loopback ports; stopped (flushed) on exit."""
    options.setdefault("http_port", 0)
    options.setdefault("grpc_port", 0)
    receiver = Receiver(CollectConfig(store=store, **options))
    receiver.start()
    try:
        yield receiver
    finally:
        receiver.stop()


def pb_body(n_spans: int, rng: random.Random, *, service: str = "svc") -> tuple[bytes, list[tuple[str, str]]]:
    """One ExportTraceServiceRequest of `n_spans` spans with random unique ids, and their keys."""
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    kv = rs.resource.attributes.add()
    kv.key, kv.value.string_value = "service.name", service
    ss = rs.scope_spans.add()
    ss.scope.name = "test"
    keys = []
    trace_id = rng.randbytes(16)
    for i in range(n_spans):
        if i % 4 == 0:
            trace_id = rng.randbytes(16)
        sp = ss.spans.add()
        sp.trace_id, sp.span_id = trace_id, rng.randbytes(8)
        sp.name = "queue_wait" if i % 4 else "chat"
        sp.kind = 2
        sp.start_time_unix_nano = T0 + i * 1000
        sp.end_time_unix_nano = T0 + i * 1000 + 500
        a = sp.attributes.add()
        a.key, a.value.int_value = "i", i
        keys.append((trace_id.hex(), sp.span_id.hex()))
    return req.SerializeToString(), keys


def start_cli_receiver(store: Path, *extra: str) -> tuple[subprocess.Popen[bytes], int]:
    """`tailscope collect` as a child process (HTTP only, free port); returns it and its port."""
    log = store.parent / f"collect-{time.monotonic_ns()}.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tailscope.cli", "collect", "--store", str(store), "--http-port", "0",
         "--grpc-port", "-1", "--quiet", *extra],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=open(log, "wb"),  # noqa: SIM115
        env=dict(os.environ, PYTHONUNBUFFERED="1"))
    for _ in range(600):  # up to 60 s
        match = re.search(r"http=[^:]+:(\d+)", log.read_text())
        if match:
            return proc, int(match.group(1))
        if proc.poll() is not None:
            raise AssertionError(f"receiver exited: {log.read_text()}")
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("receiver did not start within 60 s")
