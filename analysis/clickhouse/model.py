"""The request model (analysis.engine.model) generated for the CLICKHOUSE dialect over an otel_traces table, and run
on the server into session temporary tables (`materialize_requests`).
"""

from __future__ import annotations

import contextlib
import weakref
from typing import TYPE_CHECKING, Any, Final

from analysis.clickhouse.client import DEFAULT_TABLE, Client, settings_clause
from analysis.clickhouse.promotion import source_sql
from analysis.clickhouse.server import NEWEST, Features, features
from analysis.engine import model as M
from analysis.settings import CLICKHOUSE
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
#: The engine of a temporary table too large to be held in memory (`temp_engine`): on the server's disk.
ON_DISK: Final = "MergeTree ORDER BY tuple()"
#: Rows whose width `temp_engine` samples to estimate a table's bytes.
WIDTH_SAMPLE_ROWS: Final = 10_000


def temp_table(client: Client, name: str, sql: str, engine: str = "Memory") -> None:
    """(Re)create the session's temporary table `name` from `sql` with the model's settings."""
    client.command(f"DROP TEMPORARY TABLE IF EXISTS {name}")
    client.command(f"CREATE TEMPORARY TABLE {name} ENGINE = {engine} AS {sql}"
                   + settings_clause(features(client).settings))


def memory_temp_bytes() -> int:
    """Bytes up to which a temporary table is held in memory: the setting `CLICKHOUSE.memory_temp_mib`."""
    return max(0, CLICKHOUSE.memory_temp_mib.resolve()) * 2**20


def estimated_bytes(client: Client, sql: str) -> int:
    """The bytes the rows of `sql` (a SELECT) take in memory, estimated: their count times the mean width
    (`byteSize`) of its first WIDTH_SAMPLE_ROWS rows (two queries: as one, the count costs the sample's price)."""
    n = int(client.query(f"SELECT count() AS n FROM ({sql})").to_pylist()[0]["n"])
    if n == 0:
        return 0
    w = client.query(f"SELECT avg(byteSize(*)) AS w FROM (SELECT * FROM ({sql}) LIMIT {WIDTH_SAMPLE_ROWS})"
                     ).to_pylist()[0]["w"]
    return round(n * float(w))


def temp_engine(client: Client, sql: str) -> str:
    """The engine of a temporary table of the rows of `sql` (a SELECT): Memory while they are estimated at most
    `memory_temp_bytes` (`estimated_bytes`), else ON_DISK, so the session's memory does not grow with the table."""
    return "Memory" if estimated_bytes(client, sql) <= memory_temp_bytes() else ON_DISK


#: Temporary table of the spans one `requests_from_copy` call reads out of SPANS_TEMP.
SUBSET_TEMP: Final = "_tailscope_spans_subset"
#: Per client, what its session's SPANS_TEMP holds when it is every span of a time range: (the promoted source it
#: was read from, first ns, end ns (None: unbounded), its engine, the requests table computed from it). Forgotten
#: when SPANS_TEMP is made otherwise, or that table is made from anything else (`forget_copy`).
_COPIED: weakref.WeakKeyDictionary[Any, tuple[str, int | None, int | None, str, str]] = weakref.WeakKeyDictionary()


def materialize_requests(client: Client, table: str = DEFAULT_TABLE, *, where: str = "", name: str = "requests",
                         columns: tuple[str, ...] = M.REQUEST_COLUMNS, request_where: str = "TRUE",
                         span_range: tuple[int | None, int | None] | None = None) -> str:
    """Run the request model on the server into the session's temporary table `name`; returns `name`.

    The model's relations run one by one into temporary tables (ClickHouse plans the long WITH
    chain of analysis.engine.model far slower than it runs it). `where` narrows the spans read (over
    the otel_traces columns, e.g. a Timestamp range), `request_where` the request spans (over the
    model's span columns, e.g. TimestampNs). With `columns` free of stage columns the
    critical-path sweep is skipped (request facts). `span_range`: the [first, end) ns (None: unbounded)
    of the spans `where` keeps when it keeps exactly those, so `requests_from_copy` may read them again.
    Nothing outside the session is written.
    """
    copy = f"SELECT {KEEP_SQL} FROM {source_sql(table, where)}"
    engine = temp_engine(client, copy)  # the copy is the largest: the model's tables all follow it
    temp_table(client, SPANS_TEMP, copy, engine)
    forget_copy(client)
    if span_range is not None:
        # a client that cannot be weakly referenced (TypeError): its copy is never read again
        with contextlib.suppress(TypeError):
            _COPIED[client] = (source_sql(table), span_range[0], span_range[1], engine, name)
    return _run_model(client, SPANS_TEMP, engine, name, columns, request_where)


def forget_copy(client: Client) -> None:
    """Forget what SPANS_TEMP holds (a requests table is being made from something else)."""
    with contextlib.suppress(TypeError):
        _COPIED.pop(client, None)


def requests_from_copy(client: Client, table: str, lo_ns: int, hi_ns: int, cond: str, *, name: str,
                       columns: tuple[str, ...], facts: str) -> bool:
    """`materialize_requests` over the spans of `table` starting in [lo_ns, hi_ns) that meet `cond` (over the
    model's span columns), read from the session's copy of the spans (SPANS_TEMP) instead of promoted again from
    `table`, when that copy holds every span of the range (`span_range`) and is the one the requests table `facts`
    was computed from (so both read the table as it was then); False, doing nothing, otherwise."""
    try:
        held = _COPIED.get(client)
    except TypeError:
        return False
    if held is None or held[0] != source_sql(table) or held[4] != facts:
        return False
    first, end, engine = held[1], held[2], held[3]
    if (first is not None and lo_ns < first) or (end is not None and hi_ns > end):
        return False
    temp_table(client, SUBSET_TEMP, f"SELECT * FROM {SPANS_TEMP} WHERE TimestampNs >= {int(lo_ns)} "
                                    f"AND TimestampNs < {int(hi_ns)} AND ({cond})", engine)
    try:
        _run_model(client, SUBSET_TEMP, engine, name, columns, "TRUE")
    finally:
        client.command(f"DROP TEMPORARY TABLE IF EXISTS {SUBSET_TEMP}")
    return True


def _run_model(client: Client, spans: str, engine: str, name: str, columns: tuple[str, ...], request_where: str
               ) -> str:
    """The model's relations over the copied spans `spans` (KEEP_SQL's columns), one temporary table each, into
    `name`."""
    stages = any(c in M.STAGE_COLUMNS for c in columns)
    # the model reads SpanAttributes['gen_ai.request.stream'] only: a one-key map keeps that lookup as it is
    src = f"(SELECT *, map({M.quote(S.ATTR_STREAMING)}, _stream) AS SpanAttributes FROM {spans})"
    d = features(client).dialect
    for cte, _, sql in M.chain_ctes(src, d, stages=stages, request_where=request_where, columns=columns):
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

