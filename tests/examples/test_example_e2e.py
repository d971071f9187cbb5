"""End to end: the example server (2 replica processes) under a real HTTP client, read back from the store."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from analysis.engine.connect import connect
from examples.loadgen import run
from examples.model import ModelCosts
from tests import servers
from tests.tracing.otel_helpers import spans
from tracing import schema as S
from tracing.client import ClientResult, post_json

pytestmark = pytest.mark.slow  # an end-to-end run (CONTRIBUTING.md: make test-fast leaves it out)

__all__ = ["spans"]

ROOT = Path(__file__).resolve().parents[2]
N_REQUESTS = 12


def _disconnect_midstream(port: int) -> bytes:
    """POST a streaming request, read until two events have arrived, then close the socket; returns the bytes read
    (one read can hold more than two events when the server writes faster than this reads, as on a busy machine)."""
    body = json.dumps({"prompt": "go away early", "max_tokens": 200, "stream": True}).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        data = b""
        for _ in range(10_000):
            if data.count(b"data: ") >= 2:
                break
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    return data


def test_example_server_end_to_end(tmp_path: Path, spans: InMemorySpanExporter) -> None:
    store = tmp_path / "store"
    proc = servers.spawn([sys.executable, "-m", "examples.serve", "--port", "0", "--replicas", "2",
                        "--store", str(store)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       cwd=ROOT)  # examples/ is not installed: it runs from the source tree
    try:
        assert proc.stdout is not None
        ready = [proc.stdout.readline() for _ in range(2)]
        assert all(line.startswith("ready http://127.0.0.1:") for line in ready), (ready, proc.stderr)
        urls = [line.split()[1] for line in ready]
        port = int(urls[0].rsplit(":", 1)[1])
        results = run(urls, N_REQUESTS, concurrency=4, stream_ratio=0.75, seed=7)
        cut = _disconnect_midstream(port)
        assert cut.count(b"data: ") >= 2 and b"data: [DONE]" not in cut  # closed after two events, mid-stream
        timed_out = post_json(urls[1] + "/v1/completions", {"prompt": "slow", "max_tokens": 200, "timeout_s": 0.05})
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            _out, err = proc.communicate(timeout=120)
        finally:
            servers.stop(proc)  # whatever of serve's replicas is left, even when it did not stop
    assert proc.returncode == 0, err
    ok = [r for r in results if isinstance(r, ClientResult)]
    assert len(ok) == N_REQUESTS and all(r.status == 200 for r in ok), results
    assert timed_out.status == 504 and timed_out.body["type"] == "timeout"

    con = connect(store)
    rows = con.execute("SELECT * FROM requests ORDER BY start_ns").fetchall()
    cols = [d[0] for d in con.description]
    reqs = [dict(zip(cols, row, strict=True)) for row in rows]
    assert len(reqs) == N_REQUESTS + 2  # one row per call, the disconnected one included
    client = {format(s.context.trace_id, "032x"): s for s in spans.get_finished_spans()}
    by_trace = {r["trace_id"]: r for r in reqs}
    stages = dict(con.execute("SELECT TraceId, list(DISTINCT Stage) FROM spans WHERE Stage IS NOT NULL "
                              "GROUP BY 1").fetchall())
    costs = ModelCosts()
    for result in ok:
        row = by_trace[result.trace_id]
        assert row["status"] == "ok"
        assert row["parent_span_id"] == format(client[result.trace_id].context.span_id, "016x")
        assert set(stages[result.trace_id]) >= set(S.ALL_STAGES) - {"model_load"}
        expected_tokens = len(result.chunks) if result.chunks else result.body["output_tokens"]
        assert row["output_tokens"] == expected_tokens
        assert row["input_tokens"] >= 4 and row["model"] == "example-llm" and row["tenant"].startswith("tenant-")
        assert row["streaming"] == bool(result.chunks)
        # Compare on one clock, and only what causality guarantees. The client's CLIENT span and the server's
        # request span both read the machine's wall clock (time_ns). The client span starts before the request
        # is sent, so the server span cannot start earlier; the server records its first token before writing
        # it, and the client span ends only after reading the last byte, so the server's start and first token
        # both come before the client's end. The server span's END has no such order: it ends after its last
        # write and the stream's close, which can land after the client has read the last byte (seen: 68 µs).
        call = client[result.trace_id]
        assert call.start_time is not None and call.end_time is not None
        assert row["e2e_ns"] > 0
        assert call.start_time <= row["start_ns"] <= row["start_ns"] + row["ttft_ns"] <= call.end_time
        for col in ("network_ns", "preprocess_ns", "queue_wait_ns", "prefill_ns", "decode_ns"):
            assert row[col] > 0, col
        assert row["decode_ns"] >= 0.9 * row["output_tokens"] * costs.decode_step_s * 1e9
        assert row["prefill_ns"] >= 0.9 * row["input_tokens"] * costs.prefill_s_per_token * 1e9
        assert 0 < row["ttft_ns"] < row["e2e_ns"]
        assert row["tpot_ns"] > 0
        assert min(row[f"{c}_ns"] for c in S.CRITICAL_PATH_COLUMNS) >= 0
    assert {r["replica"] for r in reqs} == {"replica-0", "replica-1"}
    cold = {r["replica"] for r in reqs if r["model_load_ns"] > 0}
    assert cold == {"replica-0", "replica-1"}  # each replica's first batch waited for the model
    assert min(r["model_load_ns"] for r in reqs if r["model_load_ns"] > 0) >= 0.9 * costs.load_s * 1e9
    others = [r for r in reqs if r["trace_id"] not in client or r["status"] != "ok"]
    assert sorted(r["status"] for r in others) == ["cancelled", "timeout"]
    timeout_row = by_trace[timed_out.trace_id]
    assert timeout_row["e2e_ns"] >= 0.05e9 and timeout_row["output_tokens"] < 200
