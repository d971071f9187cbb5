"""`tailscope collect` as a child process for hostile-input tests: both front ends, either decoder.

The child is the real CLI; `decoder="python"` hides the C extension (tracing._otlpx) from it,
so the pure-Python path is exercised even where the extension is built.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.intake.collect_helpers import ROOT

_LAUNCH = ("import sys, runpy\n"
           "if sys.argv[1] == 'python': sys.modules['tracing._otlpx'] = None\n"
           "sys.argv = ['tailscope'] + sys.argv[2:]\n"
           "runpy.run_module('tailscope.cli', run_name='__main__')\n")


@dataclass
class Child:
    """A running receiver: its process, ports, store and log file."""

    proc: subprocess.Popen[bytes]
    http_port: int
    grpc_port: int
    store: Path
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}/v1/traces"

    def rss_mib(self) -> float:
        """The child's resident memory now, in MiB."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS")

    def reset_peak(self) -> None:
        """Start the child's peak resident memory (VmHWM) over from its RSS now (Linux clear_refs 5)."""
        Path(f"/proc/{self.proc.pid}/clear_refs").write_text("5")

    def peak_mib(self) -> float:
        """The child's peak resident memory since start or `reset_peak`, in MiB."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmHWM")

    def stop(self) -> str:
        """SIGTERM, wait, and return the log."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.log.read_text()

    def kill9(self) -> None:
        """kill -9 and reap."""
        self.proc.kill()
        self.proc.wait()


def start_child(store: Path, *extra: str, decoder: str = "c") -> Child:
    """Start `tailscope collect` on free loopback ports (HTTP and gRPC) and wait until it listens."""
    log = store.parent / f"collect-{time.monotonic_ns()}.log"
    proc = subprocess.Popen(
        [sys.executable, "-c", _LAUNCH, decoder, "collect", "--store", str(store), "--http-port", "0",
         "--grpc-port", "0", "--quiet", *extra],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=open(log, "wb"),  # noqa: SIM115
        env=dict(os.environ, PYTHONUNBUFFERED="1"))
    for _ in range(1200):  # up to 120 s on a loaded machine
        text = log.read_text()
        match = re.search(r"http=[^:]+:(\d+) grpc=[^:]+:(\d+)", text)
        if match:
            return Child(proc, int(match.group(1)), int(match.group(2)), store, log)
        if proc.poll() is not None:
            raise AssertionError(f"receiver exited: {text}")
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("receiver did not start within 120 s")


def raw_exchange(port: int, data: bytes, *, timeout: float = 60.0) -> bytes:
    """Send `data` on a fresh connection, half-close, and read the whole answer until EOF."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def request_with_times(starts: list[int], ends: list[int], seed: int) -> ExportTraceServiceRequest:
    """An ExportTraceServiceRequest with one span per (start, end), distinct random ids."""
    import random

    rng = random.Random(seed)
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    kv = rs.resource.attributes.add()
    kv.key, kv.value.string_value = "service.name", "hostile"
    ss = rs.scope_spans.add()
    for i, (start, end) in enumerate(zip(starts, ends, strict=True)):
        sp = ss.spans.add()
        sp.trace_id, sp.span_id = rng.randbytes(16), rng.randbytes(8)
        sp.name = f"span-{i}"
        sp.start_time_unix_nano, sp.end_time_unix_nano = start, end
    return req
