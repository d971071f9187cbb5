"""Map native traces of serving engines (vLLM, SGLang, TGI, Triton) onto the request model.

`normalize(table)` runs on every ingested table and every `tailscope collect` batch. It finds
the traces holding an engine's request span (by span name, then confirmed by attributes),
promotes that span (IsRequest, Outcome, TtftNs, Model, tokens, replica) and appends synthetic
stage spans under it, so the `requests` view's stage columns work for foreign traces as for
native ones. Spans that follow the tailscope convention (`tailscope.request` /
`tailscope.stage`) are never remapped, and a table without engine spans is returned as is.
The per-engine mapping is documented in docs/engines.md.
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import ModuleType

import pyarrow as pa
import pyarrow.compute as pc

from intake.engines import sglang, tgi, triton, vllm
from intake.engines._common import Row, Trace
from tracing import schema as S

_log = logging.getLogger(__name__)

#: The engine mappers. vLLM's request spans stand alone and are mapped column-wise
#: (`vllm.normalize_table`); the others need the spans of their trace and run per trace.
ENGINES: tuple[ModuleType, ...] = (vllm, sglang, tgi, triton)
TRACE_ENGINES: tuple[ModuleType, ...] = (sglang, tgi, triton)


def normalize(table: pa.Table) -> pa.Table:
    """Return `table` with engine-native request spans promoted and synthetic stage spans appended."""
    if table.num_rows == 0:
        return table
    split = vllm.normalize_table(table)
    if split is not None:
        rest, mapped = split
        return pa.concat_tables([_normalize_traces(rest), mapped])
    return _normalize_traces(table)


def _normalize_traces(table: pa.Table) -> pa.Table:
    """The per-trace engines (SGLang, TGI, Triton) on `table`."""
    if table.num_rows == 0:
        return table
    names = table.column("SpanName")
    hits: list[tuple[ModuleType, set[str]]] = []
    for engine in TRACE_ENGINES:
        mask = engine.candidate_mask(names)
        if pc.any(mask).as_py():
            hits.append((engine, set(table.column("TraceId").filter(mask).to_pylist())))
    if not hits:
        return table
    trace_ids = set().union(*(ids for _, ids in hits))
    in_traces = pc.is_in(table.column("TraceId"), value_set=pa.array(sorted(trace_ids), pa.string()))
    touched = table.filter(in_traces)
    rows = touched.to_pylist()
    by_trace: dict[str, list[Row]] = {}
    for row in rows:
        by_trace.setdefault(row["TraceId"], []).append(row)
    synthetic: list[Row] = []
    for trace_id, spans in by_trace.items():
        for engine, ids in hits:
            if trace_id not in ids:
                continue
            saved = [dict(s) for s in spans]
            try:
                synthetic.extend(engine.map_trace(Trace(spans)))
            except Exception:  # a mapping bug must never lose the batch: keep the trace as it came
                spans[:] = saved
                _log.warning("could not map a %s trace (%s); stored as is", engine.NAME, trace_id, exc_info=True)
    if not synthetic and not any(r["IsRequest"] for r in rows):
        return table
    out_rows = [row for spans in by_trace.values() for row in spans] + synthetic
    for row in out_rows:
        row["Timestamp"] = int(row["TimestampNs"]) // 1000
    rest = table.filter(pc.invert(in_traces))
    return pa.concat_tables([rest, pa.Table.from_pylist(out_rows, schema=S.SPAN_SCHEMA)])


def read_json_array(path: object, data: bytes, *, skip_bad: bool, report: object) -> list[pa.Table]:
    """Decode a JSON-array trace file (Triton's `--trace-config triton,file=...` format)."""
    return triton.read_json_array(Path(str(path)), data, skip_bad=skip_bad, report=report)


__all__ = ["ENGINES", "normalize", "read_json_array"]
