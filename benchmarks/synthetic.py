"""The synthetic store the store benchmarks share: 7 spans per request, 16 replicas, one slow-replica spike.

Each request is 7 spans (the request, queue_wait, preprocess, generation with prefill and
decode, streaming) from 16 replicas over two hours (or `duration_s`); replica-05 decodes 2.5x
slower for 15 minutes from 15:00, so the report has one spike to explain. Columns are built with
numpy and written through `tracing.store.SegmentWriter`, so the files are what the store holds.
Benchmarks build it through `benchmarks.inputs.prepare(path, make_store, spans=...)`, which
fingerprints this module's source (and what it imports) beside the store.
"""

from __future__ import annotations

import binascii
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracing import schema as S
from tracing.store import SegmentWriter

START_NS = 1_763_647_200_000_000_000  # 2025-11-20T14:00:00Z
MS = 1_000_000
SPANS_PER_REQUEST = 7
DURATION_S = 7200
REPLICAS = 16
SPIKE_REPLICA = 5
SPIKE_START_S = 3600
SPIKE_LEN_S = 900


def _hex_ids(rng: np.random.Generator, n: int, nbytes: int) -> pa.Array:
    raw = rng.integers(0, 256, size=n * nbytes, dtype=np.uint8).tobytes()
    data = binascii.hexlify(raw)
    width = 2 * nbytes
    offsets = np.arange(0, (n + 1) * width, width, dtype=np.int32)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets.tobytes()), pa.py_buffer(data))


def _map_column(keys: list[str], values: pa.Array, n: int) -> pa.Array:
    """A MAP(VARCHAR, VARCHAR) column with the same keys on every row (values: n * len(keys))."""
    k = len(keys)
    offsets = pa.array(np.arange(0, (n + 1) * k, k, dtype=np.int32))
    key_arr = pa.array(np.tile(np.array(keys, dtype=object), n), type=pa.string())
    return pa.MapArray.from_arrays(offsets, key_arr, values.cast(pa.string()))


def _empty_lists(n: int, typ: pa.DataType) -> pa.Array:
    offsets = pa.array(np.zeros(n + 1, dtype=np.int32))
    return pa.ListArray.from_arrays(offsets, pa.array([], type=typ.value_type))


def request_table(rng: np.random.Generator, n: int, t_lo: int, t_hi: int) -> pa.Table:
    """Spans of `n` requests arriving uniformly in [t_lo, t_hi) ns, as one table in SPAN_SCHEMA."""
    t0 = np.sort(rng.integers(t_lo, t_hi, size=n, dtype=np.int64))
    replica = rng.integers(0, REPLICAS, size=n)
    input_tokens = (rng.lognormal(6.0, 0.8, size=n)).astype(np.int64) + 1
    output_tokens = (rng.lognormal(5.0, 0.7, size=n)).astype(np.int64) + 2
    queue = (rng.exponential(20.0, size=n) * MS).astype(np.int64)
    pre = ((1 + input_tokens / 500) * MS).astype(np.int64)
    prefill = ((15 + input_tokens * 0.05) * MS).astype(np.int64)
    per_token = rng.uniform(18, 24, size=n) * MS
    in_spike = ((t0 - START_NS) >= SPIKE_START_S * 1_000_000_000) & (
        (t0 - START_NS) < (SPIKE_START_S + SPIKE_LEN_S) * 1_000_000_000) & (replica == SPIKE_REPLICA)
    per_token = np.where(in_spike, per_token * 2.5, per_token)
    decode = (per_token * (output_tokens - 1)).astype(np.int64)
    tail = (rng.uniform(1, 4, size=n) * MS).astype(np.int64)
    t_queue = t0 + MS // 2
    t_pre = t_queue + queue
    t_gen = t_pre + pre
    t_dec = t_gen + prefill
    t_end_gen = t_dec + decode
    t_end = t_end_gen + tail
    failed = rng.random(n) < 0.01

    k = SPANS_PER_REQUEST
    total = n * k
    trace_ids = _hex_ids(rng, n, 16)
    span_ids = _hex_ids(rng, total, 8)
    idx = np.repeat(np.arange(n), k)
    trace_col = trace_ids.take(pa.array(idx))
    kind_of = np.tile(np.arange(k), n)  # 0 request, 1 queue, 2 pre, 3 gen, 4 prefill, 5 decode, 6 streaming
    starts = np.stack([t0, t_queue, t_pre, t_gen, t_gen, t_dec, t_dec], axis=1).reshape(-1)
    ends = np.stack([t_end, t_pre, t_gen, t_end_gen, t_dec, t_end_gen, t_end], axis=1).reshape(-1)
    # parents: request for 1,2,3,6; generation for 4,5
    pos = np.arange(total)
    parent_pos = np.where(np.isin(kind_of, (4, 5)), (pos // k) * k + 3, (pos // k) * k)
    parent = span_ids.take(pa.array(parent_pos))
    parent = pc.if_else(pa.array(kind_of == 0), pa.scalar(""), parent)
    names = np.array(["POST /v1/chat/completions", "queue_wait", "preprocess", "generation",
                      "prefill", "decode", "streaming"], dtype=object)
    name_col = pa.DictionaryArray.from_arrays(pa.array(kind_of.astype(np.int32)),
                                              pa.array(names.tolist())).cast(pa.string())
    stage_names: list[str | None] = [None, "queue_wait", "preprocess", "generation", "prefill", "decode",
                                     "streaming"]
    stage_col = pa.DictionaryArray.from_arrays(pa.array(kind_of.astype(np.int32)),
                                               pa.array(stage_names, type=pa.string())).cast(pa.string())
    is_req = kind_of == 0
    rep_names = pa.array([f"replica-{i:02d}" for i in range(REPLICAS)])
    replica_col = pa.DictionaryArray.from_arrays(pa.array(replica[idx].astype(np.int32)), rep_names).cast(pa.string())
    status = np.where(is_req & failed[idx], "Error", "Unset")
    outcome_np = np.where(failed[idx], "error", "ok").astype(object)
    outcome_np[~is_req] = None
    outcome = pa.array(outcome_np, type=pa.string())
    tenants = pa.array(["acme", "globex", "initech"])
    tenant_idx = rng.integers(0, 3, size=n)
    req_only = pa.array(~is_req)

    def req_value(arr: pa.Array) -> pa.Array:
        return pc.if_else(req_only, pa.scalar(None, arr.type), arr.take(pa.array(idx)))

    tenant_col = req_value(pa.DictionaryArray.from_arrays(pa.array(tenant_idx.astype(np.int32)),
                                                          tenants).cast(pa.string()))
    model_col = req_value(pa.array(np.full(n, "llama-3-8b", dtype=object), type=pa.string()))
    version_col = req_value(pa.array(np.full(n, "v1", dtype=object), type=pa.string()))
    in_col = req_value(pa.array(input_tokens))
    out_col = req_value(pa.array(output_tokens))
    # attributes: the request flag and stream flag on requests, the stage on stages (2 entries each)
    attr_keys = np.where(is_req[:, None], np.array([[S.ATTR_REQUEST, S.ATTR_STREAMING]], dtype=object),
                         np.array([[S.ATTR_STAGE, "thread.id"]], dtype=object)).reshape(-1)
    stage_vals = np.array(["true", *stage_names[1:]], dtype=object)[kind_of]
    attr_vals = np.stack([stage_vals, np.where(is_req, "true", "1")], axis=1).reshape(-1)
    attrs = pa.MapArray.from_arrays(pa.array(np.arange(0, total * 2 + 1, 2, dtype=np.int32)),
                                    pa.array(attr_keys, type=pa.string()), pa.array(attr_vals, type=pa.string()))
    resource_attrs = _map_column(["service.instance.id"], replica_col, total)
    cols: dict[str, Any] = {
        "Timestamp": pa.array(starts // 1000, type=pa.timestamp("us", tz="UTC")),
        "TimestampNs": pa.array(starts),
        "TraceId": trace_col,
        "SpanId": span_ids,
        "ParentSpanId": parent,
        "TraceState": pa.array(np.full(total, "", dtype=object), type=pa.string()),
        "SpanName": name_col,
        "SpanKind": pa.array(np.where(is_req, "Server", "Internal"), type=pa.string()),
        "ServiceName": pa.array(np.full(total, "llm-server", dtype=object), type=pa.string()),
        "ResourceAttributes": resource_attrs,
        "ScopeName": pa.array(np.full(total, "bench", dtype=object), type=pa.string()),
        "ScopeVersion": pa.array(np.full(total, "0.1", dtype=object), type=pa.string()),
        "SpanAttributes": attrs,
        "Duration": pa.array(ends - starts),
        "StatusCode": pa.array(status, type=pa.string()),
        "StatusMessage": pa.array(np.full(total, "", dtype=object), type=pa.string()),
        "Events": _empty_lists(total, S.SPAN_SCHEMA.field("Events").type),
        "Links": _empty_lists(total, S.SPAN_SCHEMA.field("Links").type),
        "Stage": stage_col,
        "IsRequest": pa.array(is_req),
        "Outcome": outcome,
        "Replica": replica_col,
        "Model": model_col,
        "ModelVersion": version_col,
        "Tenant": tenant_col,
        "InputTokens": in_col,
        "OutputTokens": out_col,
        "TtftNs": pa.nulls(total, pa.int64()),
        "AdjustedCount": pa.array(np.ones(total), pa.float64()),
    }
    return pa.Table.from_pydict(cols, schema=S.SPAN_SCHEMA)


def make_store(store: Path, spans: int, seed: int = 1, duration_s: int = DURATION_S) -> int:
    """Write a synthetic store of about `spans` spans over `duration_s` seconds; return the number of requests."""
    rng = np.random.default_rng(seed)
    n = spans // SPANS_PER_REQUEST
    writer = SegmentWriter(store, kind="bench")
    chunks = max(1, n // 150_000)
    edges = np.linspace(START_NS, START_NS + duration_s * 1_000_000_000, chunks + 1).astype(np.int64)
    per = np.diff(np.linspace(0, n, chunks + 1).astype(np.int64))
    for c in range(chunks):
        writer.write(request_table(rng, int(per[c]), int(edges[c]), int(edges[c + 1])))
    return n
