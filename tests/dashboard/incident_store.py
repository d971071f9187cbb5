"""A synthetic incident store, built column-wise (numpy → pyarrow) so 10 million spans take seconds.

Each request is one trace: a request span (tailscope.request=true) with stage children
queue_wait, preprocess, generation (with prefill and decode inside) and streaming. During
the spike window, replica-05 decodes six times slower (and some of its requests time out),
so p99 breaks away while p50 barely moves: the answer the dashboard must show.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from analysis.engine.materialize import build_hour, snapshot
from tracing import schema as S
from tracing.store import SegmentWriter, init_store

MS = 1_000_000
START_NS = 1_764_572_400_000_000_000  # 2025-12-01T07:00:00Z
REPLICAS = tuple(f"replica-{i:02d}" for i in range(8))
SLOW_REPLICA = "replica-05"
MODELS = ("llama-3-8b", "mistral-7b")
TENANTS = ("acme", "globex", "initech", "umbrella")
SERVICE = "llm-server"
#: Spans per request: request, queue_wait, preprocess, generation, prefill, decode, streaming.
SPANS_PER_REQUEST = 7


@dataclass(frozen=True)
class Incident:
    """Where the synthetic spike is: seconds from the start of the store."""

    start_s: float
    end_s: float
    replica: str = SLOW_REPLICA


def _hex_ids(prefix: str, n: int, offset: int, width: int) -> list[str]:
    return [f"{prefix}{i:0{width}x}" for i in range(offset, offset + n)]


def _map_array(keys: list[str], values: list[pa.Array]) -> pa.MapArray:
    """A MAP(VARCHAR, VARCHAR) array whose rows all have the same keys."""
    n = len(values[0])
    k = len(keys)
    offsets = pa.array(np.arange(0, (n + 1) * k, k, dtype=np.int32))
    key_arr = pa.array(np.tile(np.array(keys, dtype=object), n), pa.string())
    stacked = np.empty(n * k, dtype=object)
    for j, col in enumerate(values):
        stacked[j::k] = np.asarray(col.to_pylist(), dtype=object)
    return pa.MapArray.from_arrays(offsets, key_arr, pa.array(stacked, pa.string()))


def _const_map(n: int, pairs: dict[str, str]) -> pa.MapArray:
    return _map_array(list(pairs), [pa.array([v] * n, pa.string()) for v in pairs.values()])


def _chunk(rng: np.random.Generator, offset: int, n: int, duration_s: float, total: int,
           incident: Incident) -> pa.Table:
    """Spans of requests [offset, offset+n) of `total` spread evenly over `duration_s`."""
    idx = np.arange(offset, offset + n)
    t0 = START_NS + (idx * (duration_s * 1e9 / total)).astype(np.int64) + rng.integers(0, 50 * MS, n)
    rep_i = rng.integers(0, len(REPLICAS), n)
    model_i = (rng.random(n) < 0.3).astype(np.int64)
    tenant_i = rng.integers(0, len(TENANTS), n)
    input_tokens = (rng.lognormal(6.0, 0.8, n)).astype(np.int64) + 1
    output_tokens = (rng.lognormal(5.0, 0.6, n)).astype(np.int64) + 2
    queue = (rng.exponential(20, n) * MS).astype(np.int64)
    pre = ((1 + input_tokens / 500) * MS).astype(np.int64)
    prefill = ((15 + input_tokens * 0.05) * MS).astype(np.int64)
    per_token = rng.uniform(18, 24, n) * MS
    rel_s = (t0 - START_NS) / 1e9
    slow_idx = REPLICAS.index(incident.replica)
    in_spike = (rel_s >= incident.start_s) & (rel_s < incident.end_s) & (rep_i == slow_idx)
    per_token = np.where(in_spike, per_token * 6.0, per_token)
    decode = (per_token * (output_tokens - 1)).astype(np.int64)
    tail = (rng.uniform(1, 4, n) * MS).astype(np.int64)
    t_queue = t0 + MS // 2
    t_pre = t_queue + queue
    t_gen = t_pre + pre
    t_dec = t_gen + prefill
    t_end_gen = t_dec + decode
    t_end = t_end_gen + tail
    u = rng.random(n)
    outcome = np.where(in_spike & (u < 0.05), "timeout", np.where(u > 0.995, "error", "ok"))

    trace_ids = _hex_ids("7a11", n, offset, 28)
    span_base = [f"{i:012x}" for i in idx]
    # (name, stage, start, end, parent index or -1 for the request span's parent)
    parts: list[tuple[str, str | None, np.ndarray, np.ndarray, str]] = [
        ("POST /v1/chat/completions", None, t0, t_end, ""),
        ("queue_wait", "queue_wait", t_queue, t_pre, "0"),
        ("preprocess", "preprocess", t_pre, t_gen, "0"),
        ("generation", "generation", t_gen, t_end_gen, "0"),
        ("prefill", "prefill", t_gen, t_dec, "3"),
        ("decode", "decode", t_dec, t_end_gen, "3"),
        ("streaming", "streaming", t_dec, t_end, "0"),
    ]
    replicas = np.array(REPLICAS, dtype=object)[rep_i]
    models = np.array(MODELS, dtype=object)[model_i]
    tenants = np.array(TENANTS, dtype=object)[tenant_i]
    versions = np.where(model_i == 0, "v2", "v1").astype(object)
    tables: list[pa.Table] = []
    for k, (name, stage, start, end, parent) in enumerate(parts):
        is_req = stage is None
        ts = pa.array(start // 1000, pa.timestamp("us", tz="UTC"))
        resource = _map_array(["service.name", "service.instance.id"],
                              [pa.array([SERVICE] * n, pa.string()), pa.array(replicas, pa.string())])
        if is_req:
            attrs = _map_array(
                [S.ATTR_REQUEST, "gen_ai.request.model", S.ATTR_MODEL_VERSION, S.ATTR_TENANT,
                 "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens", S.ATTR_STREAMING, S.ATTR_OUTCOME],
                [pa.array(["true"] * n), pa.array(models, pa.string()), pa.array(versions, pa.string()),
                 pa.array(tenants, pa.string()), pa.array(input_tokens.astype(str)),
                 pa.array(output_tokens.astype(str)), pa.array(["true"] * n), pa.array(outcome.astype(object))])
        else:
            attrs = _const_map(n, {S.ATTR_STAGE: str(stage)})
        none_s = pa.nulls(n, pa.string())
        none_i = pa.nulls(n, pa.int64())
        cols = {
            "Timestamp": ts,
            "TimestampNs": pa.array(start, pa.int64()),
            "TraceId": pa.array(trace_ids, pa.string()),
            "SpanId": pa.array([f"{b}{k:04x}" for b in span_base], pa.string()),
            "ParentSpanId": pa.array([f"{b}{int(parent):04x}" for b in span_base] if parent else [""] * n,
                                     pa.string()),
            "TraceState": pa.array([""] * n, pa.string()),
            "SpanName": pa.array([name] * n, pa.string()),
            "SpanKind": pa.array(["Server" if is_req else "Internal"] * n, pa.string()),
            "ServiceName": pa.array([SERVICE] * n, pa.string()),
            "ResourceAttributes": resource,
            "ScopeName": pa.array(["tests.incident"] * n, pa.string()),
            "ScopeVersion": pa.array(["1"] * n, pa.string()),
            "SpanAttributes": attrs,
            "Duration": pa.array(end - start, pa.int64()),
            "StatusCode": pa.array(np.where(is_req & (outcome != "ok"), "Error", "Unset").astype(object)
                                   if is_req else ["Unset"] * n, pa.string()),
            "StatusMessage": pa.array([""] * n, pa.string()),
            "Events": pa.array([[]] * n, pa.list_(S.EVENT)),
            "Links": pa.array([[]] * n, pa.list_(S.LINK)),
            "Stage": pa.array([stage] * n, pa.string()) if stage else none_s,
            "IsRequest": pa.array([is_req] * n, pa.bool_()),
            "Outcome": pa.array(outcome.astype(object), pa.string()) if is_req else none_s,
            "Replica": pa.array(replicas, pa.string()),
            "Model": pa.array(models, pa.string()) if is_req else none_s,
            "ModelVersion": pa.array(versions, pa.string()) if is_req else none_s,
            "Tenant": pa.array(tenants, pa.string()) if is_req else none_s,
            "InputTokens": pa.array(input_tokens, pa.int64()) if is_req else none_i,
            "OutputTokens": pa.array(output_tokens, pa.int64()) if is_req else none_i,
            "TtftNs": none_i,
            "AdjustedCount": pa.array(np.ones(n), pa.float64()),
        }
        tables.append(pa.Table.from_pydict(cols, schema=S.SPAN_SCHEMA))
    return pa.concat_tables(tables)


def write_incident_store(store: Path, *, requests: int = 4_000, duration_s: float = 1_800.0,
                         incident: Incident | None = None, seed: int = 5,
                         chunk: int = 100_000) -> Incident:
    """Write a store of `requests` requests over `duration_s` with one replica-05 decode spike.

    The spike covers the 60%-75% stretch of the time range unless `incident` says otherwise;
    returns where it is.
    """
    incident = incident or Incident(duration_s * 0.60, duration_s * 0.75)
    init_store(store)
    writer = SegmentWriter(store, kind="fixture", writer="fixture")
    rng = np.random.default_rng(seed)
    for offset in range(0, requests, chunk):
        writer.write(_chunk(rng, offset, min(chunk, requests - offset), duration_s, requests, incident))
    return incident


def write_more(store: Path, *, offset: int, n: int, requests: int, duration_s: float, seed: int = 6) -> None:
    """Write one more segment: requests [offset, offset + n) of a store written with `requests` over `duration_s`
    (new trace ids; past `requests` they start after the store's last request)."""
    writer = SegmentWriter(store, kind="fixture", writer="fixture-more")
    writer.write(_chunk(np.random.default_rng(seed), offset, n, duration_s, requests,
                        Incident(duration_s * 0.60, duration_s * 0.75)))


if __name__ == "__main__":
    import sys

    out = Path(sys.argv[1])
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 4_000
    print(write_incident_store(out, requests=n), "→", out)


def leave_live(store: Path, seed: int, least: int, most: int) -> list[int]:
    """Materialize every stale hour of `store` but a random `least`..`most` of them (drawn from `seed`), which stay
    live; the live hours' keys."""
    snap = snapshot(store)
    rng = random.Random(seed)
    live = sorted(rng.sample(snap.stale, rng.randint(least, most)))
    for hour in snap.stale:
        if hour not in live:
            build_hour(snap, hour)
    return live
