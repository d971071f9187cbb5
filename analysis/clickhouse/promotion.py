"""The promotion rules of tracing/rows.py in ClickHouse SQL, and the spans of an otel_traces table read by them.

`source_sql(table)`: the spans of an `otel_traces`-shaped table with tailscope's column names
and every promoted column (Stage, IsRequest, Outcome, Replica, Model, ...) derived in SQL by
the rules of tracing/rows.py, so a table tailscope never wrote reads the same as a store. Both
exporter spellings of the enums are read (`Server` and, before opentelemetry-collector-contrib
PR #34799 of Aug 2024, `SPAN_KIND_SERVER`). `otel_traces_ddl`: the exporter's table.

Known gap against tracing/rows.py: integers in token / TTFT attributes are read with ASCII
digits and ASCII whitespace only (Python's int() also reads other Unicode digits).
"""

from __future__ import annotations

from typing import Final

from analysis.clickhouse.client import DEFAULT_TABLE, check_table_name
from analysis.engine import model as M
from analysis.mapping.rules import Mapping, project
from tracing import rows as R
from tracing import schema as S

#: Exporter spellings before PR #34799 (opentelemetry-collector-contrib, merged 2024-08-21) -> after.
OLD_SPAN_KINDS: Final[dict[str, str]] = {f"SPAN_KIND_{k.upper()}": k for k in S.SPAN_KINDS}
OLD_STATUS_CODES: Final[dict[str, str]] = {f"STATUS_CODE_{c.upper()}": c for c in S.STATUS_CODES}


def _list(values: tuple[str, ...] | list[str]) -> str:
    return "[" + ", ".join(M.quote(v) for v in values) + "]"


def _in(values: tuple[str, ...]) -> str:
    return "(" + ", ".join(M.quote(v) for v in values) + ")"


def _get(attrs: str, key: str) -> str:
    return f"{attrs}[{M.quote(key)}]"


def kind_sql(col: str = "SpanKind") -> str:
    """SpanKind in the current spelling (`Server`), whichever spelling the exporter wrote."""
    return f"transform(toString({col}), {_list(list(OLD_SPAN_KINDS))}, {_list(list(OLD_SPAN_KINDS.values()))}, " \
           f"toString({col}))"


def status_sql(col: str = "StatusCode") -> str:
    """StatusCode in the current spelling (`Error`), whichever spelling the exporter wrote."""
    return f"transform(toString({col}), {_list(list(OLD_STATUS_CODES))}, " \
           f"{_list(list(OLD_STATUS_CODES.values()))}, toString({col}))"


def stage_sql(name: str, attrs: str) -> str:
    """`rows.stage_of`: the declared stage when in the vocabulary, else the span name when it is one."""
    declared = _get(attrs, S.ATTR_STAGE)
    vocab = _in(S.ALL_STAGES)
    return f"multiIf({declared} IN {vocab}, {declared}, toString({name}) IN {vocab}, toString({name}), NULL)"


def is_request_sql(name: str, kind: str, attrs: str) -> str:
    """`rows.is_request`: the tailscope.request flag when present, else a Server/Internal gen_ai operation span."""
    flag = S.ATTR_REQUEST
    return (f"if(mapContains({attrs}, {M.quote(flag)}), lower({_get(attrs, flag)}) = 'true', "
            f"({stage_sql(name, attrs)}) IS NULL AND {kind} IN ('Server', 'Internal') "
            f"AND mapContains({attrs}, {M.quote(S.ATTR_OPERATION)}))")


def outcome_sql(status: str, attrs: str) -> str:
    """`rows.outcome_of` (the caller keeps it to request spans)."""
    declared = _get(attrs, S.ATTR_OUTCOME)
    err = f"replaceAll(lowerUTF8({_get(attrs, S.ATTR_ERROR_TYPE)}), '_', '')"
    timeout = " OR ".join(f"position({err}, {M.quote(w)}) > 0" for w in R.TIMEOUT_WORDS)
    return (f"multiIf({declared} IN {_in(S.OUTCOMES)}, {declared}, {status} != 'Error', 'ok', {timeout}, 'timeout', "
            f"position({err}, 'cancel') > 0, 'cancelled', 'error')")


#: `rows._UUID` for RE2: Python's `$` also matches before one trailing newline.
_UUID_RE2: Final = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[1-8][0-9a-fA-F]{3}-[89abAB][0-9a-fA-F]{3}-[0-9a-fA-F]{12}\\n?$"


def replica_sql(resource: str, keys: tuple[str, ...] | None = None) -> str:
    """`rows.replica_of` over `replica_keys()` (read when the SQL is made): first non-empty key, a random
    UUID in service.instance.id only as the last resort."""
    keys = keys if keys is not None else R.replica_keys()
    arms: list[str] = []
    rnd = _get(resource, S.RANDOM_INSTANCE_KEY)
    is_uuid = f"match({rnd}, {M.quote(_UUID_RE2)})"
    for key in keys:
        v = _get(resource, key)
        cond = f"{v} != ''" + (f" AND NOT {is_uuid}" if key == S.RANDOM_INSTANCE_KEY else "")
        arms += [cond, v]
    if S.RANDOM_INSTANCE_KEY in keys:
        arms += [f"{rnd} != ''", rnd]
    return f"multiIf({', '.join(arms)}, NULL)"


def first_sql(attrs: str, keys: tuple[str, ...]) -> str:
    """`rows._first`: the first non-empty value among `keys`, else NULL."""
    arms = [x for k in keys for x in (f"{_get(attrs, k)} != ''", _get(attrs, k))]
    return f"multiIf({', '.join(arms)}, NULL)"


_WS: Final = "[ \\t\\n\\r\\x0b\\x0c\\x1c-\\x1f]"
_DIGITS: Final = "[0-9](_?[0-9])*"
_INT_RE: Final = f"^[+-]?{_DIGITS}$"
_FLOAT_RE: Final = f"^[+-]?({_DIGITS}(\\.({_DIGITS})?)?|\\.{_DIGITS})([eE][+-]?{_DIGITS})?$"


def ttfc_sql(attrs: str) -> str:
    """`rows.ttft_ns_of`'s second rule: `gen_ai.response.time_to_first_chunk` in ns (half to even), or NULL."""
    text = _get(attrs, S.ATTR_TIME_TO_FIRST_CHUNK)
    return (f"if(match({text}, {M.quote(R.SECONDS_TEXT)}), "
            f"toInt64(roundBankers(toFloat64OrNull({text}) * 1e9)), NULL)")


def int_or_none_sql(text: str) -> str:
    """`rows._int_or_none`: an integer string, else a finite float truncated, within int64, else NULL."""
    s = f"replaceRegexpAll({text}, {M.quote(f'^{_WS}+|{_WS}+$')}, '')"
    plain = f"replaceAll({s}, '_', '')"
    f = f"toFloat64OrNull({plain})"
    in_range = f"isFinite({f}) AND {f} >= -9223372036854775808.0 AND {f} < 9223372036854775808.0"
    return (f"multiIf(match({s}, {M.quote(_INT_RE)}), toInt64OrNull({plain}), "
            f"match({s}, {M.quote(_FLOAT_RE)}) AND {in_range}, toInt64({f}), NULL)")


def promoted_sql(*, name: str = "SpanName", kind: str = "SpanKind", status: str = "StatusCode",
                 attrs: str = "SpanAttributes", resource: str = "ResourceAttributes") -> dict[str, str]:
    """SQL of each promoted column over otel_traces-shaped columns (kind / status already in the current spelling)."""
    req = is_request_sql(name, kind, attrs)
    return {
        "Stage": stage_sql(name, attrs),
        "IsRequest": req,
        "Outcome": f"if({req}, {outcome_sql(status, attrs)}, NULL)",
        "Replica": replica_sql(resource),
        "Model": first_sql(attrs, S.MODEL_KEYS),
        "ModelVersion": first_sql(attrs, S.MODEL_VERSION_KEYS),
        "Tenant": first_sql(attrs, S.TENANT_KEYS),
        "InputTokens": int_or_none_sql(first_sql(attrs, S.INPUT_TOKEN_KEYS)),
        "OutputTokens": int_or_none_sql(first_sql(attrs, S.OUTPUT_TOKEN_KEYS)),
        "TtftNs": f"coalesce(if(mapContains({attrs}, {M.quote(S.ATTR_TTFT_NS)}), "
                  f"{int_or_none_sql(_get(attrs, S.ATTR_TTFT_NS))}, NULL), {ttfc_sql(attrs)})",
        "AdjustedCount": M.adjusted_count_sql(M.CLICKHOUSE, "TraceState", attrs),
    }


#: The Events column of an otel_traces table as tailscope's list of (TimestampNs, Name, Attributes).
_EVENTS: Final = ("CAST(arrayMap((t, n, a) -> tuple(toUnixTimestamp64Nano(t), toString(n), "
                  "CAST(a, 'Map(String, String)')), `Events.Timestamp`, `Events.Name`, `Events.Attributes`), "
                  "'Array(Tuple(TimestampNs Int64, Name String, Attributes Map(String, String)))')")
_LINKS: Final = ("CAST(arrayMap((t, s, st, a) -> tuple(toString(t), toString(s), toString(st), "
                 "CAST(a, 'Map(String, String)')), `Links.TraceId`, `Links.SpanId`, `Links.TraceState`, "
                 "`Links.Attributes`), "
                 "'Array(Tuple(TraceId String, SpanId String, TraceState String, Attributes Map(String, String)))')")


#: Mappings (analysis.mapping) applied to the spans of a table, by table name: what `--mapping FILE` registers
#: (`use_mapping`). Every SQL built from `source_sql` (requests, facts, reports, the materialized requests'
#: fingerprint) then reads the mapped columns.
MAPPINGS: dict[str, Mapping] = {}


def use_mapping(table: str, mapping: Mapping | None) -> None:
    """Apply `mapping` to the spans of `table` from now on in this process (None: stop)."""
    check_table_name(table)
    if mapping is None:
        MAPPINGS.pop(table, None)
    else:
        MAPPINGS[table] = mapping


def source_sql(table: str = DEFAULT_TABLE, where: str = "") -> str:
    """A parenthesised SELECT over an otel_traces-shaped table with every stored column of a tailscope store.

    `where` (over the table's own columns, e.g. a Timestamp range) narrows the spans read;
    ClickHouse reads only the columns a query uses.
    """
    check_table_name(table)
    # the promotions look their keys up in the table's own maps (`_sa`, `_ra`): the same text, without converting
    # every span's whole map to Map(String, String) first (the conversion cost 0.12 CPU-s a read of 1 M spans with
    # 40 attributes on their requests, in every statement reading the promoted columns)
    inner = (f"SELECT *, {kind_sql()} AS _kind, {status_sql()} AS _status, "
             f"toUnixTimestamp64Nano(Timestamp) AS _ts_ns, SpanAttributes AS _sa, ResourceAttributes AS _ra "
             f"FROM {table}" + (f" WHERE {where}" if where else ""))
    p = promoted_sql(kind="_kind", status="_status", attrs="_sa", resource="_ra")
    cols = {
        "Timestamp": "toDateTime64(Timestamp, 6, 'UTC')",
        "TimestampNs": "_ts_ns",
        "TraceId": "toString(TraceId)", "SpanId": "toString(SpanId)", "ParentSpanId": "toString(ParentSpanId)",
        "TraceState": "toString(TraceState)", "SpanName": "toString(SpanName)", "SpanKind": "_kind",
        "ServiceName": "toString(ServiceName)",
        "ResourceAttributes": "CAST(ResourceAttributes, 'Map(String, String)')",
        "ScopeName": "toString(ScopeName)", "ScopeVersion": "toString(ScopeVersion)",
        "SpanAttributes": "CAST(SpanAttributes, 'Map(String, String)')",
        "Duration": "toInt64(Duration)", "StatusCode": "_status", "StatusMessage": "toString(StatusMessage)",
        "Events": _EVENTS, "Links": _LINKS, **p,
        "EndNs": "_ts_ns + toInt64(Duration)",
    }
    body = ",\n  ".join(f"{expr} AS {name}" for name, expr in cols.items())
    return project(f"(SELECT\n  {body}\nFROM ({inner}))", MAPPINGS.get(table), "clickhouse")


def otel_traces_ddl(table: str = DEFAULT_TABLE) -> str:
    """CREATE TABLE IF NOT EXISTS for an otel_traces-shaped table: the clickhouseexporter's columns and keys.

    Written after open-telemetry/opentelemetry-collector-contrib
    exporter/clickhouseexporter/internal/sqltemplates/traces_table.sql at commit
    f92a5763be13aeb59ecf6f8b47e31d54109191bb (same column names, types, partition and order;
    its skip indexes, codecs and TTL are left out: they change no query result).
    """
    check_table_name(table)
    attrs = "Map(LowCardinality(String), String)"
    return f"""CREATE TABLE IF NOT EXISTS {table} (
    Timestamp DateTime64(9),
    TraceId String,
    SpanId String,
    ParentSpanId String,
    TraceState String,
    SpanName LowCardinality(String),
    SpanKind LowCardinality(String),
    ServiceName LowCardinality(String),
    ResourceAttributes {attrs},
    ScopeName String,
    ScopeVersion String,
    SpanAttributes {attrs},
    Duration UInt64,
    StatusCode LowCardinality(String),
    StatusMessage String,
    Events Nested (Timestamp DateTime64(9), Name LowCardinality(String), Attributes {attrs}),
    Links Nested (TraceId String, SpanId String, TraceState String, Attributes {attrs}),
    INDEX idx_trace_id TraceId TYPE bloom_filter(0.001) GRANULARITY 1
) ENGINE = MergeTree
PARTITION BY toDate(Timestamp)
ORDER BY (ServiceName, SpanName, toDateTime(Timestamp))"""

