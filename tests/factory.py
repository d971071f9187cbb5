"""Hand-made spans for tests: one request with stage children at exact nanosecond times."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path

from tracing import schema as S
from tracing.rows import SpanBatch
from tracing.store import SegmentWriter

T0 = 1_763_647_200_000_000_000  # 2025-11-20T14:00:00Z


def hex_id(*parts: object, size: int = 16) -> str:
    """A deterministic hex id of `size` hex digits from `parts`."""
    return hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()[:size]


def add_request(
    batch: SpanBatch,
    key: object,
    start: int,
    end: int,
    stages: Sequence[tuple[str, int, int] | tuple[str, int, int, str]] = (),
    *,
    attrs: Mapping[str, str] | None = None,
    replica: str = "replica-00",
    status_code: str = "Unset",
) -> tuple[str, str]:
    """Append a request span [start, end) (offsets from T0, ns) and its stage spans.

    A stage is (stage, start, end) or (stage, start, end, parent_stage) for a nested stage.
    Returns (trace id, request span id).
    """
    trace_id = hex_id("trace", key, size=32)
    root = hex_id("span", key, "request")
    resource = {"service.name": "llm", "service.instance.id": replica}
    base_attrs = {S.ATTR_REQUEST: "true"}
    base_attrs.update(attrs or {})
    batch.append(trace_id=trace_id, span_id=root, parent_span_id="", name="request", kind="Server",
                 start_ns=T0 + start, end_ns=T0 + end, service="llm", resource=resource,
                 attrs=base_attrs, status_code=status_code)
    ids: dict[str, str] = {}
    for n, spec in enumerate(stages):
        stage, s0, s1 = spec[0], spec[1], spec[2]
        parent = ids[spec[3]] if len(spec) == 4 else root
        span_id = hex_id("span", key, stage, n)
        ids.setdefault(stage, span_id)
        batch.append(trace_id=trace_id, span_id=span_id, parent_span_id=parent, name=stage,
                     kind="Internal", start_ns=T0 + s0, end_ns=T0 + s1, service="llm",
                     resource=resource, attrs={S.ATTR_STAGE: stage})
    return trace_id, root


def write(store: Path, batch: SpanBatch) -> list[Path]:
    """Write the batch into `store` as segments."""
    return SegmentWriter(store, kind="test").write(batch.to_table())
