"""Random span stores for the compaction tests, and the reference the tests compare compaction with."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from tests.factory import T0, hex_id
from tracing.rows import SpanBatch
from tracing.store import HOUR_NS, SegmentWriter, segment_files


def random_batch(rng: random.Random, n: int, hour: int = 0, tag: object = "", base_ns: int = T0) -> SpanBatch:
    """`n` random spans starting in hour `hour` after `base_ns`'s, with varied attributes, events and statuses."""
    batch = SpanBatch()
    for i in range(n):
        start = base_ns + hour * HOUR_NS + rng.randrange(HOUR_NS)
        key = (tag, i, rng.random())
        events = [{"TimestampNs": start + 5, "Name": "tok", "Attributes": {"n": str(rng.randrange(9))}}] \
            if rng.random() < 0.3 else []
        batch.append(trace_id=hex_id("t", key, size=32), span_id=hex_id("s", key), parent_span_id="",
                     name=rng.choice(["request", "decode", "prefill"]), kind="Server", start_ns=start,
                     end_ns=start + rng.randrange(1, 10**9), service="llm",
                     resource={"service.name": "llm", "service.instance.id": f"r{rng.randrange(4)}"},
                     attrs={"k": str(rng.random())} if rng.random() < 0.5 else {},
                     status_code=rng.choice(["Unset", "Ok", "Error"]), events=events)
    return batch


def write_segments(store: Path, rng: random.Random, count: int, *, hour: int = 0, max_spans: int = 30,
                   tag: object = "", base_ns: int = T0) -> None:
    """`count` segments of 1..max_spans random spans each in hour `hour` (after `base_ns`'s), as a receiver
    writes them (one per group commit)."""
    writer = SegmentWriter(store, kind="test")
    for k in range(count):
        writer.write(random_batch(rng, rng.randint(1, max_spans), hour, (tag, k), base_ns).to_table())


def rows(store: Path) -> Counter[str]:
    """The multiset of every span (every column) a reader of the store sees."""
    out: Counter[str] = Counter()
    for f in segment_files(store):
        for row in pq.read_table(f).to_pylist():
            out[json.dumps(row, sort_keys=True, default=str)] += 1
    return out


def keys(store: Path) -> Counter[tuple[Any, Any]]:
    """The multiset of (TraceId, SpanId) a reader sees."""
    out: Counter[tuple[Any, Any]] = Counter()
    for f in segment_files(store):
        t = pq.read_table(f, columns=["TraceId", "SpanId"])
        out.update(zip(t.column("TraceId").to_pylist(), t.column("SpanId").to_pylist(), strict=True))
    return out
