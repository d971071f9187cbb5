"""The request model (analysis.engine.model) generated for the CLICKHOUSE dialect over an otel_traces table, and run
on the server into session temporary tables (`materialize_requests`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from analysis.clickhouse.client import DEFAULT_TABLE, Client, settings_clause
from analysis.clickhouse.promotion import source_sql
from analysis.clickhouse.server import NEWEST, Features, features
from analysis.engine import model as M
from tracing import schema as S

if TYPE_CHECKING:
    pass


def requests_sql(table: str = DEFAULT_TABLE, where: str = "", request_where: str = "TRUE",
                 server: Features = NEWEST) -> str:
    """`requests` (all REQUEST_COLUMNS) over an otel_traces-shaped table, for ClickHouse (as `server` reads it)."""
    return M.requests_sql(source_sql(table, where), server.dialect, request_where=request_where)


def facts_sql(table: str = DEFAULT_TABLE, where: str = "", columns: tuple[str, ...] = M.FACT_COLUMNS,
              request_where: str = "TRUE", server: Features = NEWEST) -> str:
    """The request-level columns only (no sweep), for ClickHouse (as `server` reads it)."""
    return M.facts_sql(source_sql(table, where), server.dialect, columns=columns, request_where=request_where)


#: Span columns the request model reads (the temporary copy of the spans holds only these).
MODEL_INPUTS: Final[tuple[str, ...]] = (
    "TraceId", "SpanId", "ParentSpanId", "SpanName", "SpanKind", "ServiceName", "Duration", "TimestampNs", "Stage",
    "IsRequest", "Outcome", "Replica", "Model", "ModelVersion", "Tenant", "InputTokens", "OutputTokens", "TtftNs",
    "AdjustedCount")
#: The model's span columns as kept in a copy (the one attribute the model reads, gen_ai.request.stream, as _stream).
KEEP_SQL: Final = ", ".join(MODEL_INPUTS) + f", SpanAttributes[{M.quote(S.ATTR_STREAMING)}] AS _stream"
#: Temporary table of the spans the model read in this session.
SPANS_TEMP: Final = "_tailscope_spans"
#: Above this many spans the model's temporary tables are MergeTree (on disk) instead of Memory: a Memory copy of
#: the model's span columns takes ~200 bytes a span (100 M spans in chdb went past a 21 GiB limit), while MergeTree
#: costs ~40 % more time at 1 M spans (docs/benchmarks.md, "The request model's temporary tables").
MEMORY_TEMP_MAX_SPANS: Final = 20_000_000


def temp_table(client: Client, name: str, sql: str, engine: str = "Memory") -> None:
    """(Re)create the session's temporary table `name` from `sql` with the model's settings."""
    client.command(f"DROP TEMPORARY TABLE IF EXISTS {name}")
    client.command(f"CREATE TEMPORARY TABLE {name} ENGINE = {engine} AS {sql}"
                   + settings_clause(features(client).settings))


def temp_engine(client: Client, source: str) -> str:
    """The engine of the model's temporary tables over `source` (a FROM item): Memory while it holds at most
    MEMORY_TEMP_MAX_SPANS spans, else MergeTree, so the session's memory does not grow with the table."""
    n = int(client.query(f"SELECT count() AS n FROM {source}").to_pylist()[0]["n"])
    return "Memory" if n <= MEMORY_TEMP_MAX_SPANS else "MergeTree ORDER BY tuple()"


def materialize_requests(client: Client, table: str = DEFAULT_TABLE, *, where: str = "", name: str = "requests",
                         columns: tuple[str, ...] = M.REQUEST_COLUMNS, request_where: str = "TRUE") -> str:
    """Run the request model on the server into the session's temporary table `name`; returns `name`.

    The model's relations run one by one into temporary tables (ClickHouse plans the long WITH
    chain of analysis.engine.model far slower than it runs it). `where` narrows the spans read (over
    the otel_traces columns, e.g. a Timestamp range), `request_where` the request spans (over the
    model's span columns, e.g. TimestampNs). With `columns` free of stage columns the
    critical-path sweep is skipped (request facts). Nothing outside the session is written.
    """
    stages = any(c in M.STAGE_COLUMNS for c in columns)
    keep = KEEP_SQL
    engine = temp_engine(client, source_sql(table, where))
    temp_table(client, SPANS_TEMP, f"SELECT {keep} FROM {source_sql(table, where)}", engine)
    # the model reads SpanAttributes['gen_ai.request.stream'] only: a one-key map keeps that lookup as it is
    src = (f"(SELECT *, map({M.quote(S.ATTR_STREAMING)}, _stream) AS SpanAttributes FROM {SPANS_TEMP})")
    d = features(client).dialect
    for cte, _, sql in M.chain_ctes(src, d, stages=stages, request_where=request_where):
        temp_table(client, cte, sql, engine)
    temp_table(client, name, M.select_sql(d, src, stages=stages, columns=columns), engine)
    return name


def recognition_counts(client: Client, table: str = DEFAULT_TABLE) -> tuple[int, int, dict[str, int]]:
    """(spans, request spans, request spans by `tailscope.engine`) of `table`, counted on the server: the
    coverage line of `tailscope report`, as analysis.connect.request_engines counts a store."""
    src = source_sql(table)
    row = client.query(f"SELECT count() AS spans, countIf(IsRequest) AS requests FROM {src}").to_pylist()[0]
    key = M.quote(S.ATTR_ENGINE)
    engines = client.query(f"SELECT SpanAttributes[{key}] AS engine, count() AS n FROM {src} "
                           f"WHERE IsRequest AND mapContains(SpanAttributes, {key}) GROUP BY engine").to_pylist()
    return int(row["spans"]), int(row["requests"]), {str(r["engine"]): int(r["n"]) for r in engines}

