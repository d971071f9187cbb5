"""The documented SQL views over a segment store: `spans`, `requests`, `stages`.

`requests` holds one row per inference request, with each stage's exclusive time on the
request's critical path. The rule (a sweep form of the CRISP critical path): at every
instant of the request, the time belongs to the active stage span that ends last (ties:
the one that started last, then the lower span id); inside that span, the same rule
picks among its own stage children (prefill / decode inside generation). Streaming
yields: it owns only instants no other stage holds (delivery after decode ends, a slow
client), since while tokens are still being made the stream waits on them. Time no
stage covers is `other`. Each chosen stretch is one interval, so the rule is a running
minimum in SQL, and the stage columns sum exactly to `e2e_ns`. See docs/methods.md.
"""

from __future__ import annotations

from tracing import schema as S

REQUEST_STAGE_COLUMNS: tuple[str, ...] = tuple(f"{s}_ns" for s in S.CRITICAL_PATH_COLUMNS)


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def spans_sql(source: str) -> str:
    """SQL of the `spans` view over `source` (a FROM item: read_parquet(...) or a table)."""
    return f"SELECT *, TimestampNs + Duration AS EndNs FROM {source}"


def files_source(files: list[str]) -> str:
    """A read_parquet FROM item over a fixed list of segment files (one snapshot)."""
    listed = ", ".join(_quote(f) for f in files)
    return f"read_parquet([{listed}], union_by_name = true, hive_partitioning = false)"


YIELDING_SQL = "(" + ", ".join(_quote(s) for s in S.YIELDING_STAGES) + ")"

_CRIT_WINDOW = (
    "min(s0) OVER (PARTITION BY TraceId, {part} ORDER BY e0 DESC, s0 DESC, SpanId "
    "ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)"
)

_STAGE_SUMS = ",\n    ".join(
    f"coalesce(sum(excl_ns) FILTER (WHERE stage = {_quote(s)}), 0)::BIGINT AS {s}_ns" for s in S.ALL_STAGES
)

VIEW_SQL: dict[str, str] = {
    "_request_spans": """
SELECT TraceId, SpanId, ParentSpanId, SpanName, ServiceName, Replica, Model, ModelVersion, Tenant,
       InputTokens, OutputTokens, TtftNs, Outcome, StatusMessage, SpanAttributes,
       TimestampNs AS start_ns, EndNs AS end_ns
FROM spans WHERE IsRequest
""",
    "_stage_spans": """
SELECT TraceId, SpanId, ParentSpanId, Stage, Replica, Duration, TimestampNs, EndNs
FROM spans WHERE Stage IS NOT NULL
""",
    # level 1: stage spans whose parent is the request span, clipped to the request
    "_stage_l1_all": """
SELECT s.TraceId, r.SpanId AS request_span_id, s.SpanId, s.Stage AS stage, s.Replica, s.Duration,
       greatest(s.TimestampNs, r.start_ns) AS s0, least(s.EndNs, r.end_ns) AS e0,
       s.TimestampNs AS raw_s, s.EndNs AS raw_e
FROM _stage_spans s JOIN _request_spans r ON s.TraceId = r.TraceId AND s.ParentSpanId = r.SpanId
WHERE least(s.EndNs, r.end_ns) > greatest(s.TimestampNs, r.start_ns)
""",
    # working stages: the one that ends last owns the instant
    "_stage_l1": f"""
SELECT *, greatest(s0, least(e0, coalesce(m, e0))) AS x1
FROM (SELECT *, {_CRIT_WINDOW.format(part="request_span_id")} AS m
      FROM _stage_l1_all WHERE stage NOT IN {YIELDING_SQL})
""",
    # yielding stages (streaming) own only instants no working stage holds
    "_stage_l1_yield": f"""
SELECT y.TraceId, y.request_span_id, y.SpanId, y.stage, y.Replica,
       (y.x1 - y.s0) - coalesce(sum(greatest(0, least(y.x1, w.x1) - greatest(y.s0, w.s0))), 0) AS excl_ns
FROM (SELECT *, greatest(s0, least(e0, coalesce(m, e0))) AS x1
      FROM (SELECT *, {_CRIT_WINDOW.format(part="request_span_id")} AS m
            FROM _stage_l1_all WHERE stage IN {YIELDING_SQL})) y
LEFT JOIN _stage_l1 w ON w.TraceId = y.TraceId AND w.request_span_id = y.request_span_id
GROUP BY y.TraceId, y.request_span_id, y.SpanId, y.stage, y.Replica, y.s0, y.x1
""",
    # level 2: stage spans inside a level-1 working stage span, clipped to its critical stretch
    "_stage_l2_all": """
SELECT c.TraceId, p.request_span_id, p.SpanId AS parent_span_id, c.SpanId, c.Stage AS stage,
       c.Replica, c.Duration, greatest(c.TimestampNs, p.s0) AS s0, least(c.EndNs, p.x1) AS e0,
       c.TimestampNs AS raw_s, c.EndNs AS raw_e
FROM _stage_spans c JOIN _stage_l1 p ON c.TraceId = p.TraceId AND c.ParentSpanId = p.SpanId
""",
    "_stage_l2": f"""
SELECT *, greatest(s0, least(e0, coalesce(m, e0))) AS x1
FROM (SELECT *, {_CRIT_WINDOW.format(part="parent_span_id")} AS m FROM _stage_l2_all WHERE e0 > s0)
""",
    "_stage_excl": """
SELECT l1.TraceId, l1.request_span_id, l1.stage, l1.Replica,
       (l1.x1 - l1.s0) - coalesce(c.child_ns, 0) AS excl_ns
FROM _stage_l1 l1
LEFT JOIN (SELECT TraceId, parent_span_id, sum(x1 - s0) AS child_ns FROM _stage_l2
           GROUP BY ALL) c ON c.TraceId = l1.TraceId AND c.parent_span_id = l1.SpanId
UNION ALL
SELECT TraceId, request_span_id, stage, Replica, x1 - s0 AS excl_ns FROM _stage_l2
UNION ALL
SELECT TraceId, request_span_id, stage, Replica, excl_ns FROM _stage_l1_yield
""",
    "_request_stage_ns": f"""
SELECT TraceId, request_span_id,
    {_STAGE_SUMS},
    sum(excl_ns)::BIGINT AS covered_ns,
    first(Replica ORDER BY CASE WHEN stage IN ('generation','prefill','decode') THEN 0 ELSE 1 END)
        FILTER (WHERE Replica IS NOT NULL) AS worker_replica
FROM _stage_excl GROUP BY ALL
""",
    # where the first token shows: end of the first prefill span, else start of streaming
    "_request_first_token": """
SELECT TraceId, request_span_id,
       min(raw_e) FILTER (WHERE stage = 'prefill') AS prefill_end_ns,
       min(raw_s) FILTER (WHERE stage = 'streaming') AS streaming_start_ns
FROM (SELECT TraceId, request_span_id, stage, raw_s, raw_e FROM _stage_l1_all
      UNION ALL SELECT TraceId, request_span_id, stage, raw_s, raw_e FROM _stage_l2_all)
WHERE stage IN ('prefill', 'streaming')
GROUP BY ALL
""",
    "requests": "{chain}" + f"""
SELECT
    r.TraceId AS trace_id,
    r.SpanId AS span_id,
    r.ParentSpanId AS parent_span_id,
    make_timestamp(r.start_ns // 1000) AS start,
    r.start_ns,
    r.end_ns,
    r.end_ns - r.start_ns AS e2e_ns,
    coalesce(r.Outcome, 'ok') AS status,
    coalesce(k.worker_replica, r.Replica) AS replica,
    r.ServiceName AS service,
    r.Model AS model,
    r.ModelVersion AS model_version,
    r.Tenant AS tenant,
    r.InputTokens AS input_tokens,
    r.OutputTokens AS output_tokens,
    coalesce(r.SpanAttributes['{S.ATTR_STREAMING}'] = 'true', false) AS streaming,
    coalesce(r.TtftNs, t.prefill_end_ns - r.start_ns, t.streaming_start_ns - r.start_ns) AS ttft_ns,
    CASE WHEN r.OutputTokens > 1
         THEN round((r.end_ns - r.start_ns
                     - coalesce(r.TtftNs, t.prefill_end_ns - r.start_ns, t.streaming_start_ns - r.start_ns))
                    / (r.OutputTokens - 1))::BIGINT END AS tpot_ns,
    {", ".join(f"coalesce(k.{s}_ns, 0) AS {s}_ns" for s in S.CRITICAL_PATH_COLUMNS if s != "other")},
    (r.end_ns - r.start_ns) - coalesce(k.covered_ns, 0) AS other_ns,
    r.SpanName AS span_name,
    cl.Duration AS client_e2e_ns,
    cl.Duration - (r.end_ns - r.start_ns) AS client_network_ns
FROM _request_spans r
LEFT JOIN _request_stage_ns k ON k.TraceId = r.TraceId AND k.request_span_id = r.SpanId
LEFT JOIN (SELECT TraceId, SpanId, Duration FROM spans WHERE SpanKind = 'Client') cl
    ON cl.TraceId = r.TraceId AND cl.SpanId = r.ParentSpanId
LEFT JOIN _request_first_token t ON t.TraceId = r.TraceId AND t.request_span_id = r.SpanId
""",
    "stages": f"""
SELECT trace_id, span_id, start, start_ns, status, replica, service, model, model_version, tenant,
       regexp_replace(stage_col, '_ns$', '') AS stage, critical_ns
FROM (UNPIVOT (SELECT trace_id, span_id, start, start_ns, status, replica, service, model,
                      model_version, tenant, {", ".join(REQUEST_STAGE_COLUMNS)} FROM requests)
      ON {", ".join(REQUEST_STAGE_COLUMNS)} INTO NAME stage_col VALUE critical_ns)
""",
}

# `requests` evaluates the chain above once per query: each intermediate view becomes a
# MATERIALIZED CTE of the same name (a CTE shadows the view), so the window functions run
# once instead of once per reference. The views stay defined for per-trace use.
_CHAIN = ("_request_spans", "_stage_l1_all", "_stage_l1", "_stage_l1_yield", "_stage_l2_all", "_stage_l2",
          "_stage_excl", "_request_stage_ns", "_request_first_token")
VIEW_SQL["requests"] = VIEW_SQL["requests"].replace(
    "{chain}", "WITH " + ",\n".join(f"{name} AS MATERIALIZED ({VIEW_SQL[name]})" for name in _CHAIN))

#: The documented views, for docs and tests.
PUBLIC_VIEWS: tuple[str, ...] = ("spans", "requests", "stages")
