"""Move a tailscope store into an `otel_traces`-shaped ClickHouse table without loss.

Each segment file goes through a staging table (the store's own columns) and one
`INSERT ... SELECT` that casts to the exporter's types: `Timestamp` at full ns from
`TimestampNs`, events field by field (`Events.Timestamp` from each event's `TimestampNs`).
The promoted columns have no place in otel_traces: where a stored promoted value differs
from what the promotion rules (analysis.clickhouse.promoted_sql, the rules of tracing/rows.py)
read off the attributes, as when an engine mapping set it, the value is written as the
convention's attribute (`tailscope.request`, `tailscope.stage`, `tailscope.outcome`,
`tailscope.ttft_ns`, the first model / version / tenant / token key, and `tailscope.replica`
on the resource), so reading the table back gives the same spans and requests.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pyarrow as pa
import pyarrow.parquet as pq

from analysis.clickhouse.client import Client, check_table_name, literal
from analysis.clickhouse.promotion import otel_traces_ddl, outcome_sql, promoted_sql
from analysis.engine import model as M
from tracing import schema as S
from tracing.store import require_store, segment_files

#: The prefix of the temporary table one segment passes through (a name unique to the run; dropped at the end).
STAGING: Final = "tailscope_export_staging"


def _ch_type(typ: pa.DataType, nullable: bool = True) -> str:
    """The ClickHouse type of a store column's Arrow type (nested values are never Nullable)."""
    if pa.types.is_map(typ):
        return f"Map({_ch_type(typ.key_type, False)}, {_ch_type(typ.item_type, False)})"
    if pa.types.is_list(typ):
        return f"Array({_ch_type(typ.value_type, False)})"
    if pa.types.is_struct(typ):
        return "Tuple(" + ", ".join(f"{f.name} {_ch_type(f.type, False)}" for f in typ) + ")"
    if not nullable:
        return "Int64" if pa.types.is_integer(typ) else "String"
    if pa.types.is_timestamp(typ):
        return "Nullable(DateTime64(6, 'UTC'))"
    if pa.types.is_boolean(typ):
        return "Nullable(Bool)"
    if pa.types.is_integer(typ):
        return "Nullable(Int64)"
    return "Nullable(String)"


def staging_ddl(table: str = STAGING) -> str:
    """A Memory table with the store's columns (the staging of one segment)."""
    return f"CREATE TABLE IF NOT EXISTS {table} ({staging_columns()}) ENGINE = Memory"


def staging_columns() -> str:
    """The store's columns as ClickHouse declares them (a table's, or file()'s structure)."""
    cols = []
    for f in S.SPAN_SCHEMA:
        t = _ch_type(f.type)
        if f.name in ("TraceId", "SpanId", "ParentSpanId", "TraceState", "SpanName", "SpanKind", "ServiceName",
                      "ScopeName", "ScopeVersion", "StatusCode", "StatusMessage", "TimestampNs", "Duration",
                      "IsRequest"):
            t = t.removeprefix("Nullable(").removesuffix(")")
        cols.append(f"`{f.name}` {t}")
    return ", ".join(cols)


def _differs(stored: str, derived: str) -> str:
    """`stored` and `derived` differ, NULL equal to NULL (isNotDistinctFrom, which releases before 26.x take in a JOIN's
    ON only, spelled out)."""
    return f"NOT ifNull(({stored}) = ({derived}), ({stored}) IS NULL AND ({derived}) IS NULL)"


def _fact(key: str, cond: str, value: str) -> str:
    return f"if({cond}, [({M.quote(key)}, toString({value}))], [])"


def insert_sql(target: str, source: str = STAGING, *, facts: bool = True, new_in: tuple[int, int] | None = None
               ) -> str:
    """INSERT INTO target (otel_traces columns) SELECT ... FROM a relation with the store's columns.

    `facts=False` leaves the promoted facts out (the attributes as stored): lossy for a store whose
    promoted values an engine mapping set; benchmarks.bench_clickhouse prices the facts with it.
    `new_in=(lo_ns, hi_ns)`, the source's first and last span start: only the spans whose
    (TraceId, SpanId) `target` does not hold among its spans starting in that range (an export run
    again adds nothing).
    """
    p = promoted_sql()
    span_facts = [
        _fact(S.ATTR_REQUEST, _differs("IsRequest", p["IsRequest"]), "if(IsRequest, 'true', 'false')"),
        _fact(S.ATTR_STAGE, f"Stage IS NOT NULL AND {_differs('Stage', p['Stage'])}", "Stage"),
        # the outcome rule reads the status and the attributes; on a request span the stored outcome must match it
        _fact(S.ATTR_OUTCOME, f"IsRequest AND Outcome IS NOT NULL AND "
              f"{_differs('Outcome', outcome_sql('StatusCode', 'SpanAttributes'))}", "Outcome"),
        _fact(S.ATTR_TTFT_NS, f"TtftNs IS NOT NULL AND {_differs('TtftNs', p['TtftNs'])}", "TtftNs"),
        _fact(S.MODEL_KEYS[0], f"Model IS NOT NULL AND {_differs('Model', p['Model'])}", "Model"),
        _fact(S.MODEL_VERSION_KEYS[0], f"ModelVersion IS NOT NULL AND {_differs('ModelVersion', p['ModelVersion'])}",
              "ModelVersion"),
        _fact(S.TENANT_KEYS[0], f"Tenant IS NOT NULL AND {_differs('Tenant', p['Tenant'])}", "Tenant"),
        _fact(S.INPUT_TOKEN_KEYS[0], f"InputTokens IS NOT NULL AND {_differs('InputTokens', p['InputTokens'])}",
              "InputTokens"),
        _fact(S.OUTPUT_TOKEN_KEYS[0], f"OutputTokens IS NOT NULL AND {_differs('OutputTokens', p['OutputTokens'])}",
              "OutputTokens"),
    ]
    res_fact = _fact(S.ATTR_REPLICA, f"Replica IS NOT NULL AND {_differs('Replica', p['Replica'])}", "Replica")
    span_attrs = (f"mapUpdate(SpanAttributes, CAST(arrayConcat({', '.join(span_facts)}), "
                  "'Map(String, String)'))")
    res_attrs = f"mapUpdate(ResourceAttributes, CAST({res_fact}, 'Map(String, String)'))"
    cols = {
        "Timestamp": "fromUnixTimestamp64Nano(TimestampNs)",
        "TraceId": "TraceId", "SpanId": "SpanId", "ParentSpanId": "ParentSpanId", "TraceState": "TraceState",
        "SpanName": "SpanName", "SpanKind": "SpanKind", "ServiceName": "ServiceName",
        "ResourceAttributes": res_attrs if facts else "ResourceAttributes", "ScopeName": "ScopeName",
        "ScopeVersion": "ScopeVersion", "SpanAttributes": span_attrs if facts else "SpanAttributes",
        "Duration": "toUInt64(Duration)", "StatusCode": "StatusCode",
        "StatusMessage": "StatusMessage",
        "`Events.Timestamp`": "arrayMap(e -> fromUnixTimestamp64Nano(tupleElement(e, 'TimestampNs')), Events)",
        "`Events.Name`": "arrayMap(e -> tupleElement(e, 'Name'), Events)",
        "`Events.Attributes`": "arrayMap(e -> tupleElement(e, 'Attributes'), Events)",
        "`Links.TraceId`": "arrayMap(x -> tupleElement(x, 'TraceId'), Links)",
        "`Links.SpanId`": "arrayMap(x -> tupleElement(x, 'SpanId'), Links)",
        "`Links.TraceState`": "arrayMap(x -> tupleElement(x, 'TraceState'), Links)",
        "`Links.Attributes`": "arrayMap(x -> tupleElement(x, 'Attributes'), Links)",
    }
    where = ""
    if new_in is not None:
        lo, hi = (f"fromUnixTimestamp64Nano(toInt64({int(v)}))" for v in new_in)
        where = (f"\nWHERE (TraceId, SpanId) NOT IN (SELECT TraceId, SpanId FROM {target} "
                 f"WHERE Timestamp >= {lo} AND Timestamp <= {hi})")
    return (f"INSERT INTO {target} ({', '.join(cols)})\nSELECT " + ",\n       ".join(cols.values())
            + f"\nFROM {source}{where}")


@dataclass
class ExportReport:
    """What an export moved: segments read, spans read, and spans written (the others were in the table already)."""

    segments: int = 0
    spans: int = 0
    written: int = 0


def export_store(store: Path, client: Client, table: str = "otel_traces",
                 on_segment: Callable[[int, int], None] | None = None, from_files: bool | None = None
                 ) -> ExportReport:
    """Copy every span of `store` into `table` (created with the exporter-shaped DDL if missing) that it does not hold.

    Run twice, or over a store part of which was exported, it adds no span twice: each segment
    writes only the spans whose (TraceId, SpanId) the table does not hold among its spans in the
    segment's time range (`insert_sql`'s `new_in`; two exports of one store at the same moment can
    both write a span). `on_segment(bytes_read, spans)` is called after each segment (a progress
    bar). On chdb (the engine runs in this process and reads the store's files itself) each
    segment is one `INSERT ... SELECT` from `file(segment, Parquet, <the store's columns>)`; a
    server gets each segment through a temporary table of this run's session (no name another
    run sees, gone with the session, dropped at the end or on failure): the user needs rights on
    `table` only (`from_files` forces either way).
    """
    store = require_store(Path(store))
    check_table_name(table)
    client.command(otel_traces_ddl(table))
    if from_files if from_files is not None else client.dsn.kind == "chdb":
        return _export_from_files(store, client, table, on_segment)
    staging = f"{STAGING}_{uuid.uuid4().hex[:12]}"
    client.command(f"CREATE TEMPORARY TABLE {staging} ({staging_columns()}) ENGINE = Memory")
    out = ExportReport()
    try:
        for path in segment_files(store):
            data = pq.read_table(path, schema=S.SPAN_SCHEMA)
            client.command(f"TRUNCATE TABLE {staging}")
            client.insert_arrow(staging, data)
            _insert_new(client, table, staging, out)
            out.segments += 1
            out.spans += data.num_rows
            if on_segment:
                on_segment(path.stat().st_size, data.num_rows)
    finally:
        client.command(f"DROP TEMPORARY TABLE IF EXISTS {staging}")
    return out


def _insert_new(client: Client, table: str, source: str, out: ExportReport) -> None:
    """Insert the spans of `source` that `table` does not hold; count them in `out.written`."""
    row = client.query(f"SELECT min(TimestampNs) AS lo, max(TimestampNs) AS hi, count() AS n FROM {source}"
                       ).to_pylist()[0]
    if not int(row["n"]):
        return
    lo, hi = int(row["lo"]), int(row["hi"])
    before = _count(client, table, lo, hi)
    client.command(insert_sql(table, source, new_in=(lo, hi)))
    out.written += _count(client, table, lo, hi) - before


def _count(client: Client, table: str, lo: int, hi: int) -> int:
    a, b = (f"fromUnixTimestamp64Nano(toInt64({v}))" for v in (lo, hi))
    return int(client.query(f"SELECT count() AS n FROM {table} WHERE Timestamp >= {a} AND Timestamp <= {b}"
                            ).to_pylist()[0]["n"])


def _export_from_files(store: Path, client: Client, table: str,
                       on_segment: Callable[[int, int], None] | None) -> ExportReport:
    """export_store on an engine that reads the segment files itself: no row passes through Python."""
    out = ExportReport()
    for path in segment_files(store):
        source = f"file({literal(str(path.resolve()))}, 'Parquet', {literal(staging_columns())})"
        _insert_new(client, table, source, out)
        spans = pq.ParquetFile(path).metadata.num_rows
        out.segments += 1
        out.spans += spans
        if on_segment:
            on_segment(path.stat().st_size, spans)
    return out
