"""ClickHouse as a second engine: the OpenTelemetry Collector's `otel_traces` table read by the request model.

- `client`: DSNs (`chdb:PATH`, `clickhouse://...`) and the clients that run SQL on them.
- `promotion`: the promotion rules of tracing/rows.py in ClickHouse SQL, `source_sql`, the exporter's DDL.
- `model`: the request model (analysis.engine.model) in ClickHouse SQL, run on the server into temporary tables.
- `requests`: the materialized `tailscope_requests`, its coverage rule and backfill.
- `server`: what a server takes (its release and settings), read once per client.
- `views`: read-only SQL over spans / requests / stages.
- `quantiles`: the weighted-quantile SQL.
- `report`, `neighbours`, `breakdowns`: the analysis pushed down to the server (`neighbours`: the noisy-neighbour
  step's figures); `export`: a store into `otel_traces`.

The names callers use are re-exported here.
"""

from __future__ import annotations

from analysis.clickhouse.client import (
    DEFAULT_PORT,
    DEFAULT_TABLE,
    DEFAULT_TIMEOUT_S,
    ChdbClient,
    Client,
    Dsn,
    DsnError,
    HttpClient,
    check_table_name,
    http_failure,
    literal,
    memory_hint,
    open_client,
    parse_dsn,
    settings_clause,
)
from analysis.clickhouse.model import (
    KEEP_SQL,
    MODEL_INPUTS,
    ON_DISK,
    SPANS_TEMP,
    estimated_bytes,
    facts_sql,
    materialize_requests,
    memory_temp_bytes,
    recognition_counts,
    requests_sql,
    temp_engine,
    temp_table,
)
from analysis.clickhouse.promotion import (
    OLD_SPAN_KINDS,
    OLD_STATUS_CODES,
    first_sql,
    int_or_none_sql,
    is_request_sql,
    kind_sql,
    otel_traces_ddl,
    outcome_sql,
    promoted_sql,
    replica_sql,
    source_sql,
    stage_sql,
    status_sql,
)
from analysis.clickhouse.quantiles import (
    arrays_sql,
    kish_sql,
    q_sql,
    quantile_sql,
    wq_sql,
)
from analysis.clickhouse.requests import (
    REQUESTS_TABLE,
    STAMP_COLUMNS,
    Applied,
    Refresh,
    apply_schema,
    backfill,
    copy_spans,
    coverage,
    reach_ns,
    refresh,
    refresh_sql,
    requests_facts,
    requests_fingerprint,
    requests_mv_ddl,
    schema_objects,
    span_where,
)
from analysis.clickhouse.server import (
    NEWEST,
    OLDEST,
    Features,
    UnsupportedServer,
    features,
    require_supported,
)
from analysis.clickhouse.views import (
    query_views,
)
from tracing.errors import QueryError  # the error every function here raises (callers catch it as C.QueryError)

__all__ = [
    "DEFAULT_PORT",
    "DEFAULT_TABLE",
    "DEFAULT_TIMEOUT_S",
    "KEEP_SQL",
    "MODEL_INPUTS",
    "NEWEST",
    "OLDEST",
    "OLD_SPAN_KINDS",
    "OLD_STATUS_CODES",
    "ON_DISK",
    "REQUESTS_TABLE",
    "SPANS_TEMP",
    "STAMP_COLUMNS",
    "Applied",
    "ChdbClient",
    "Client",
    "Dsn",
    "DsnError",
    "Features",
    "HttpClient",
    "QueryError",
    "Refresh",
    "UnsupportedServer",
    "apply_schema",
    "arrays_sql",
    "backfill",
    "check_table_name",
    "copy_spans",
    "coverage",
    "estimated_bytes",
    "facts_sql",
    "features",
    "first_sql",
    "http_failure",
    "int_or_none_sql",
    "is_request_sql",
    "kind_sql",
    "kish_sql",
    "literal",
    "materialize_requests",
    "memory_hint",
    "memory_temp_bytes",
    "open_client",
    "otel_traces_ddl",
    "outcome_sql",
    "parse_dsn",
    "promoted_sql",
    "q_sql",
    "quantile_sql",
    "query_views",
    "reach_ns",
    "recognition_counts",
    "refresh",
    "refresh_sql",
    "replica_sql",
    "requests_facts",
    "requests_fingerprint",
    "requests_mv_ddl",
    "requests_sql",
    "require_supported",
    "schema_objects",
    "settings_clause",
    "source_sql",
    "span_where",
    "stage_sql",
    "status_sql",
    "temp_engine",
    "temp_table",
    "wq_sql",
]
