"""ClickHouse as a second engine: the OpenTelemetry Collector's `otel_traces` table read by the request model.

- `parse_dsn` / `open_client`: `chdb:PATH` (the embedded engine, chdb) or
  `clickhouse://user[:password]@host[:port]/database` (a server, through clickhouse-connect).
  Both implement `Client`: a query returns an Arrow table. The network client is a thin
  factory over the same SQL.
- `source_sql(table)`: the spans of an `otel_traces`-shaped table with tailscope's column
  names and every promoted column (Stage, IsRequest, Outcome, Replica, Model, ...) derived in
  SQL by the rules of tracing/rows.py, so a table tailscope never wrote reads the same as a
  store. Both exporter spellings of the enums are read (`Server` and, before
  opentelemetry-collector-contrib PR #34799 of Aug 2024, `SPAN_KIND_SERVER`).
- `requests_sql` / `facts_sql` / `with_views`: the request model (analysis.engine.model) generated
  for the CLICKHOUSE dialect over that source.
- `requests_mv_ddl` / `coverage` / `requests_facts`: the materialized `tailscope_requests`, which
  refreshed intervals of it may be read as they are, and the requests of a range read from it
  there and computed from the spans elsewhere (docs/scale-out.md, "Materialized requests").

Known gap against tracing/rows.py: integers in token / TTFT attributes are read with ASCII
digits and ASCII whitespace only (Python's int() also reads other Unicode digits).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol
from urllib.parse import unquote, urlsplit

from analysis.engine import model as M
from analysis.engine import percentiles as P
from tracing import rows as R
from tracing import schema as S
from tracing.errors import MissingExtra, QueryError, TailscopeError

if TYPE_CHECKING:
    import pyarrow as pa

#: Default spans table: the clickhouseexporter's own name.
DEFAULT_TABLE: Final = "otel_traces"
#: Default HTTP port of a ClickHouse server.
DEFAULT_PORT: Final = 8123

#: Exporter spellings before PR #34799 (opentelemetry-collector-contrib, merged 2024-08-21) -> after.
OLD_SPAN_KINDS: Final[dict[str, str]] = {f"SPAN_KIND_{k.upper()}": k for k in S.SPAN_KINDS}
OLD_STATUS_CODES: Final[dict[str, str]] = {f"STATUS_CODE_{c.upper()}": c for c in S.STATUS_CODES}


class DsnError(TailscopeError):
    """A ClickHouse DSN that cannot be read."""


@dataclass(frozen=True)
class Dsn:
    """Where a ClickHouse engine is: an embedded chdb path, or a server over HTTP."""

    kind: str  # "chdb" or "http"
    path: str = ""
    host: str = ""
    port: int = DEFAULT_PORT
    user: str = "default"
    password: str = ""
    database: str = "default"

    def __str__(self) -> str:
        if self.kind == "chdb":
            return f"chdb:{self.path}"
        return f"clickhouse://{self.user}@{self.host}:{self.port}/{self.database}"  # never the password


def parse_dsn(text: str) -> Dsn:
    """Read `chdb:PATH` or `clickhouse://user[:password]@host[:port][/database]`; DsnError names what is wrong."""
    if text.startswith("chdb:"):
        path = text[len("chdb:"):]
        if not path:
            raise DsnError(f"DSN {text!r} names no directory: write chdb:PATH")
        return Dsn("chdb", path=path)
    if not text.startswith("clickhouse://"):
        raise DsnError(f"cannot read DSN {text!r}: write chdb:PATH or clickhouse://user@host:8123/db")
    try:
        parts = urlsplit(text)
        port = parts.port or DEFAULT_PORT
    except ValueError as exc:
        raise DsnError(f"cannot read DSN {text!r}: {exc}") from None
    if not parts.hostname:
        raise DsnError(f"DSN {text!r} names no host: write clickhouse://user@host:8123/db")
    database = parts.path.strip("/") or "default"
    if not re.fullmatch(r"[A-Za-z0-9_]+", database):
        raise DsnError(f"DSN {text!r}: database name {database!r} is not a plain identifier")
    return Dsn("http", host=parts.hostname, port=port, user=unquote(parts.username or "default"),
               password=unquote(parts.password or ""), database=database)


class Client(Protocol):
    """The little tailscope asks of a ClickHouse engine."""

    dsn: Dsn

    def query(self, sql: str, settings: dict[str, Any] | None = None) -> pa.Table:
        """Run a SELECT; the result as an Arrow table."""
        ...

    def command(self, sql: str) -> None:
        """Run a statement that returns nothing (DDL, INSERT ... SELECT)."""
        ...

    def insert_arrow(self, table: str, data: pa.Table) -> None:
        """Append an Arrow table whose column names match the table's."""
        ...

    def close(self) -> None:
        """Release the engine."""
        ...


def _settings_clause(settings: dict[str, Any] | None) -> str:
    if not settings:
        return ""
    return " SETTINGS " + ", ".join(f"{k} = {v!r}" if isinstance(v, str) else f"{k} = {int(v)}"
                                    for k, v in settings.items())


class ChdbClient:
    """The embedded engine (chdb) on a directory: one session per client."""

    def __init__(self, dsn: Dsn) -> None:
        try:
            from chdb import session
        except ModuleNotFoundError as exc:
            raise MissingExtra("the embedded ClickHouse engine", exc.name or "chdb", "clickhouse") from None
        self.dsn = dsn
        Path(dsn.path).mkdir(parents=True, exist_ok=True)
        self._s = session.Session(str(Path(dsn.path).resolve()))

    def query(self, sql: str, settings: dict[str, Any] | None = None) -> pa.Table:
        """Run a SELECT; the settings ride on the query's SETTINGS clause."""
        try:
            out = self._s.query(sql.rstrip().rstrip(";") + _settings_clause(settings), "ArrowTable")
        except Exception as exc:
            raise QueryError(sql, str(exc).strip().splitlines()[0]) from None
        return out  # type: ignore[no-any-return]

    def command(self, sql: str) -> None:
        """Run a statement."""
        try:
            self._s.query(sql, "CSV")
        except Exception as exc:
            raise QueryError(sql, str(exc).strip().splitlines()[0]) from None

    def insert_arrow(self, table: str, data: pa.Table) -> None:
        """Append through a Parquet file: chdb reads local files directly."""
        import tempfile

        import pyarrow.parquet as pq

        with tempfile.TemporaryDirectory(prefix="tailscope-chdb-") as tmp:
            path = Path(tmp) / "batch.parquet"
            pq.write_table(data, path)
            cols = ", ".join(f"`{c}`" for c in data.column_names)
            self.command(f"INSERT INTO {table} ({cols}) SELECT {cols} FROM file({M.quote(str(path))}, Parquet)")

    def close(self) -> None:
        """Close the session."""
        self._s.close()


class HttpClient:
    """A ClickHouse server over HTTP, through clickhouse-connect (thin: the same SQL as the embedded engine)."""

    def __init__(self, dsn: Dsn) -> None:
        try:
            import clickhouse_connect
        except ModuleNotFoundError as exc:
            raise MissingExtra("a ClickHouse server", exc.name or "clickhouse-connect", "clickhouse") from None
        import logging

        self.dsn = dsn
        log = logging.getLogger("clickhouse_connect")
        level = log.level
        log.setLevel(logging.CRITICAL)  # the driver logs the failure too; ours is the one line that says it
        try:
            self._c = clickhouse_connect.get_client(host=dsn.host, port=dsn.port, username=dsn.user,
                                                    password=dsn.password, database=dsn.database)
        except Exception as exc:
            raise DsnError(f"cannot reach ClickHouse at {dsn}: {str(exc).splitlines()[0]}") from None
        finally:
            log.setLevel(level)

    def query(self, sql: str, settings: dict[str, Any] | None = None) -> pa.Table:
        """Run a SELECT; the result as Arrow."""
        try:
            return self._c.query_arrow(sql, settings=settings or {}, use_strings=True)
        except Exception as exc:
            raise QueryError(sql, str(exc).strip().splitlines()[0]) from None

    def command(self, sql: str) -> None:
        """Run a statement."""
        try:
            self._c.command(sql)
        except Exception as exc:
            raise QueryError(sql, str(exc).strip().splitlines()[0]) from None

    def insert_arrow(self, table: str, data: pa.Table) -> None:
        """Append an Arrow table."""
        try:
            self._c.insert_arrow(table, data)
        except Exception as exc:
            raise QueryError(f"INSERT INTO {table}", str(exc).strip().splitlines()[0]) from None

    def close(self) -> None:
        """Close the HTTP pool."""
        self._c.close()


def open_client(dsn: str | Dsn) -> Client:
    """A client for a DSN (see `parse_dsn`)."""
    d = parse_dsn(dsn) if isinstance(dsn, str) else dsn
    return ChdbClient(d) if d.kind == "chdb" else HttpClient(d)


def literal(value: str | int) -> str:
    """A ClickHouse literal: integers as they are, strings quoted with `\\` and `'` escaped."""
    if isinstance(value, int):
        return str(int(value))
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def check_table_name(table: str) -> str:
    """A table name as given (`db.table` allowed); QueryError unless it is plain identifiers."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?", table):
        raise QueryError("", f"table name {table!r} is not a plain identifier (db.table allowed)")
    return table


# --- the promotion rules of tracing/rows.py, in ClickHouse SQL -----------------------------

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
    timeout = " OR ".join(f"position({err}, {M.quote(w)}) > 0" for w in R._TIMEOUT_WORDS)
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
    """`rows.first_attr`: the first non-empty value among `keys`, else NULL."""
    arms = [x for k in keys for x in (f"{_get(attrs, k)} != ''", _get(attrs, k))]
    return f"multiIf({', '.join(arms)}, NULL)"


_WS: Final = "[ \\t\\n\\r\\x0b\\x0c\\x1c-\\x1f]"
_DIGITS: Final = "[0-9](_?[0-9])*"
_INT_RE: Final = f"^[+-]?{_DIGITS}$"
_FLOAT_RE: Final = f"^[+-]?({_DIGITS}(\\.({_DIGITS})?)?|\\.{_DIGITS})([eE][+-]?{_DIGITS})?$"


def int_or_none_sql(text: str) -> str:
    """`rows.attr_int`: an integer string, else a finite float truncated, within int64, else NULL."""
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
        "TtftNs": f"if(mapContains({attrs}, {M.quote(S.ATTR_TTFT_NS)}), "
                  f"{int_or_none_sql(_get(attrs, S.ATTR_TTFT_NS))}, NULL)",
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


def source_sql(table: str = DEFAULT_TABLE, where: str = "") -> str:
    """A parenthesised SELECT over an otel_traces-shaped table with every stored column of a tailscope store.

    `where` (over the table's own columns, e.g. a Timestamp range) narrows the spans read;
    ClickHouse reads only the columns a query uses.
    """
    check_table_name(table)
    inner = (f"SELECT *, {kind_sql()} AS _kind, {status_sql()} AS _status, "
             f"toUnixTimestamp64Nano(Timestamp) AS _ts_ns FROM {table}"
             + (f" WHERE {where}" if where else ""))
    p = promoted_sql(kind="_kind", status="_status")
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
    return f"(SELECT\n  {body}\nFROM ({inner}))"


def requests_sql(table: str = DEFAULT_TABLE, where: str = "", request_where: str = "TRUE") -> str:
    """`requests` (all REQUEST_COLUMNS) over an otel_traces-shaped table, for ClickHouse."""
    return M.requests_sql(source_sql(table, where), M.CLICKHOUSE, request_where=request_where)


def facts_sql(table: str = DEFAULT_TABLE, where: str = "", columns: tuple[str, ...] = M.FACT_COLUMNS,
              request_where: str = "TRUE") -> str:
    """The request-level columns only (no sweep), for ClickHouse."""
    return M.facts_sql(source_sql(table, where), M.CLICKHOUSE, columns=columns, request_where=request_where)


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


#: Span columns the request model reads (the temporary copy of the spans holds only these).
MODEL_INPUTS: Final[tuple[str, ...]] = (
    "TraceId", "SpanId", "ParentSpanId", "SpanName", "SpanKind", "ServiceName", "Duration", "TimestampNs", "Stage",
    "IsRequest", "Outcome", "Replica", "Model", "ModelVersion", "Tenant", "InputTokens", "OutputTokens", "TtftNs",
    "AdjustedCount")
#: The model's span columns as kept in a copy (the one attribute the model reads, gen_ai.request.stream, as _stream).
_KEEP: Final = ", ".join(MODEL_INPUTS) + f", SpanAttributes[{M.quote(S.ATTR_STREAMING)}] AS _stream"
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
                   + _settings_clause(M.CLICKHOUSE_SETTINGS))


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
    keep = _KEEP
    engine = temp_engine(client, source_sql(table, where))
    temp_table(client, SPANS_TEMP, f"SELECT {keep} FROM {source_sql(table, where)}", engine)
    # the model reads SpanAttributes['gen_ai.request.stream'] only: a one-key map keeps that lookup as it is
    src = (f"(SELECT *, map({M.quote(S.ATTR_STREAMING)}, _stream) AS SpanAttributes FROM {SPANS_TEMP})")
    for cte, _, sql in M.chain_ctes(src, M.CLICKHOUSE, stages=stages, request_where=request_where):
        temp_table(client, cte, sql, engine)
    temp_table(client, name, M.select_sql(M.CLICKHOUSE, src, stages=stages, columns=columns), engine)
    return name


def recognition_counts(client: Client, table: str = DEFAULT_TABLE) -> tuple[int, int, dict[str, int]]:
    """(spans, request spans, request spans by `tailscope.engine`) of `table`, counted on the server: the
    coverage line of `tailscope report`, as analysis.engine.connect.request_engines counts a store."""
    src = source_sql(table)
    row = client.query(f"SELECT count() AS spans, countIf(IsRequest) AS requests FROM {src}").to_pylist()[0]
    key = M.quote(S.ATTR_ENGINE)
    engines = client.query(f"SELECT SpanAttributes[{key}] AS engine, count() AS n FROM {src} "
                           f"WHERE IsRequest AND mapContains(SpanAttributes, {key}) GROUP BY engine").to_pylist()
    return int(row["spans"]), int(row["requests"]), {str(r["engine"]): int(r["n"]) for r in engines}


def query_views(client: Client, sql: str, table: str = DEFAULT_TABLE, *, computed: bool = False,
                limits: dict[str, Any] | None = None, materialized: bool = True) -> pa.Table:
    """Run a read-only query over `spans`, `requests` and `stages` computed from `table`.

    `requests` / `stages` (when the query names them) are computed first into session
    temporary tables (`computed`: `requests` is there already); `spans` is a CTE in front of
    the query; `requests` reads the materialized table where it is current (`requests_facts`,
    unless not `materialized`). The query itself runs with `readonly = 1` (and `limits`, e.g.
    max_execution_time): the server refuses any write, DDL or setting change in it.
    """
    words = set(re.findall(r"[A-Za-z_]+", sql.lower()))
    if words & {"requests", "stages"} and not computed:
        requests_facts(client, table, materialized=materialized)
    if "stages" in words:
        temp_table(client, "stages", M.stages_sql("requests", M.CLICKHOUSE))
    body = sql.strip().rstrip(";")
    spans = f"spans AS {source_sql(table)}"
    m = re.match(r"(?is)^with\s", body)
    full = f"WITH {spans},\n{body[m.end():]}" if m else f"WITH {spans}\n{body}"
    return client.query(full, {**M.CLICKHOUSE_SETTINGS, **(limits or {}), "readonly": 1})


#: The materialized requests table `tailscope clickhouse init` creates (analysis.clickhouse.requests_mv_ddl).
REQUESTS_TABLE: Final = "tailscope_requests"
#: Columns each refresh stamps on every row it appends to REQUESTS_TABLE, after the REQUEST_COLUMNS: the interval
#: [lo, hi) it computed, when (ns), the rows it appended (its requests and one marker row), the spans it read in
#: the interval's reach, and the model's fingerprint. `coverage` reads them (docs/scale-out.md, "materialized").
STAMP_COLUMNS: Final = ("refresh_lo_ns", "refresh_hi_ns", "refreshed_ns", "refresh_rows", "refresh_spans",
                        "fingerprint")
#: Changes when the refreshed rows' layout changes (with the model's and the promotion's SQL, in the fingerprint).
_LAYOUT: Final = "tailscope_requests v2: stamped rows, one marker row per refresh"
_H: Final = M.HOUR_NS


def requests_fingerprint(table: str = DEFAULT_TABLE) -> str:
    """What a refresh computed with: the promotion of `table`'s spans (replica keys included), the request model's
    ClickHouse SQL and the table's layout. A row stamped with another fingerprint is never read."""
    text = source_sql(table) + M.requests_sql("_spans", M.CLICKHOUSE) + _LAYOUT
    return hashlib.sha256(text.encode()).hexdigest()


def reach_ns(lo_ns: int, hi_ns: int) -> tuple[int, int]:
    """The span start times the requests starting in [lo, hi) may read: from the hour before lo's hour to the end
    of the hour after (hi - 1)'s (analysis.engine.model.READ_HOURS)."""
    return (lo_ns // _H) * _H - _H, ((hi_ns - 1) // _H) * _H + 2 * _H


def span_where(lo_ns: int | None, hi_ns: int | None) -> str:
    """A condition on an otel_traces table's Timestamp keeping the spans a request starting in [lo, hi) may read
    (None: unbounded on that side; a little wider than `reach_ns` at hi, which changes no request)."""
    parts = []
    if lo_ns is not None:
        parts.append(f"Timestamp >= fromUnixTimestamp64Nano(toInt64({(lo_ns // _H) * _H - _H}))")
    if hi_ns is not None:
        parts.append(f"Timestamp < fromUnixTimestamp64Nano(toInt64({(hi_ns // _H) * _H + 2 * _H}))")
    return " AND ".join(parts)


def _marker_sql(lo: str) -> str:
    """The marker row a refresh appends beside its requests (empty trace and span id), so an interval without a
    request is told from one never refreshed; typed so that UNION ALL keeps the requests' column types."""
    strings = {"trace_id", "span_id", "parent_span_id", "status", "replica", "service", "model", "model_version",
               "tenant", "span_name"}
    exprs = {c: "''" if c in strings else "toInt64(0)" for c in M.REQUEST_COLUMNS}
    exprs.update({"start": M.CLICKHOUSE.ts_from_ns(lo), "start_ns": lo, "streaming": "false",
                  "adjusted_count": "toFloat64(1)"})
    return "SELECT " + ", ".join(f"{e} AS {c}" for c, e in exprs.items())


def refresh_sql(table: str, target: str, lo: str, hi: str) -> str:
    """The SELECT one refresh appends to `target`: the requests starting in [lo, hi) (SQL expressions of ns)
    computed from `<target>_spans` in the interval's reach, one marker row, all stamped with STAMP_COLUMNS."""
    spans = f"{target}_spans"
    reach = (f"TimestampNs >= intDiv({lo}, {_H}) * {_H} - {_H} "
             f"AND TimestampNs < intDiv({hi} - 1, {_H}) * {_H} + {2 * _H}")
    src = (f"(SELECT *, map({M.quote(S.ATTR_STREAMING)}, _stream) AS SpanAttributes FROM {spans} WHERE {reach})")
    requests = M.requests_sql(src, M.CLICKHOUSE, request_where=f"TimestampNs >= {lo} AND TimestampNs < {hi}")
    return (f"SELECT *, toUInt64(count() OVER ()) AS refresh_rows, {lo} AS refresh_lo_ns, {hi} AS refresh_hi_ns, "
            f"toUnixTimestamp64Nano(now64(9)) AS refreshed_ns, "
            f"(SELECT count() FROM {spans} WHERE {reach}) AS refresh_spans, "
            f"{M.quote(requests_fingerprint(table))} AS fingerprint "
            f"FROM (({requests}) UNION ALL ({_marker_sql(lo)}))")


def refresh(client: Client, table: str, lo_ns: int, hi_ns: int, target: str = REQUESTS_TABLE) -> None:
    """Run one refresh by hand: append the requests of [lo, hi) to `target` as the refreshable view would
    (a backfill of intervals before `clickhouse init`, once `<target>_spans` holds their spans)."""
    client.command(f"INSERT INTO {target} {refresh_sql(table, target, str(int(lo_ns)), str(int(hi_ns)))}"
                   + _settings_clause(M.CLICKHOUSE_SETTINGS))


def copy_spans(client: Client, table: str = DEFAULT_TABLE, target: str = REQUESTS_TABLE, where: str = "") -> None:
    """Copy the spans of `table` (`where`: over its columns) into `<target>_spans` as the insert-triggered view
    does for new ones: what a backfill of spans written before `clickhouse init` runs first."""
    client.command(f"INSERT INTO {target}_spans SELECT {_KEEP} FROM {source_sql(table, where)}")


#: Nanoseconds of each unit `clickhouse init --every` takes.
_INTERVAL_NS: Final = {"SECOND": 10**9, "MINUTE": 60 * 10**9, "HOUR": _H, "DAY": 24 * _H}


def _interval(every: str) -> tuple[str, int]:
    """`every` ('5 MINUTE') as the ClickHouse interval's text and its length in ns; QueryError if unreadable."""
    m = re.fullmatch(r"(\d+) (SECOND|MINUTE|HOUR|DAY)", every.strip().upper())
    if m is None or int(m.group(1)) == 0:
        raise QueryError("", f"cannot read interval {every!r}: write e.g. '5 MINUTE'")
    return f"{int(m.group(1))} {m.group(2)}", int(m.group(1)) * _INTERVAL_NS[m.group(2)]


def _view_end_sql(step: str, lag_minutes: int) -> str:
    """The end of the interval the refreshable view computes now: `step`-aligned, `lag_minutes` ago."""
    return f"toStartOfInterval(now(), INTERVAL {step}) - INTERVAL {int(lag_minutes)} MINUTE"


def backfill(client: Client, table: str = DEFAULT_TABLE, *, every: str = "5 MINUTE", lag_minutes: int = 10,
             target: str = REQUESTS_TABLE, until_ns: int | None = None, copy: bool = True,
             progress: Callable[[int, int], object] | None = None) -> int:
    """Fill `target` for the spans `table` held before `clickhouse init`: copy them into `<target>_spans`
    (`copy_spans`; `copy=False` when done already), then run one refresh (`refresh`) per `every` interval from
    the first span's to the last span's, no later than the end the refreshable view has reached (`until_ns`
    instead, when given). Returns the intervals refreshed; `progress(done, total)` is called after each."""
    step, step_ns = _interval(every)
    if copy:
        copy_spans(client, table, target)
    row = client.query(f"SELECT minOrNull(TimestampNs) AS a, maxOrNull(TimestampNs) AS b, toUnixTimestamp64Nano("
                       f"toDateTime64({_view_end_sql(step, lag_minutes)}, 9)) AS e FROM {target}_spans").to_pylist()[0]
    if row["a"] is None:
        return 0
    # no later than the view's end, nor past the interval of the last span (a table idle for months would
    # otherwise be refreshed empty interval by interval): what lies between is computed on the fly, cheaply
    end = min(int(row["e"]), int(row["b"]) // step_ns * step_ns + step_ns) if until_ns is None else int(until_ns)
    # aligned as the view aligns them (toStartOfInterval counts from the epoch), so the view's later refreshes of
    # the same intervals replace these rather than overlap them
    starts = range(int(row["a"]) // step_ns * step_ns, end, step_ns)
    for k, lo in enumerate(starts):
        refresh(client, table, lo, lo + step_ns, target)
        if progress is not None:
            progress(k + 1, len(starts))
    return len(starts)


def requests_mv_ddl(table: str = DEFAULT_TABLE, *, every: str = "5 MINUTE", lag_minutes: int = 10,
                    target: str = REQUESTS_TABLE) -> list[str]:
    """DDL of `target` (one row per request) and the views that keep it filled.

    `<target>_spans` holds the promoted span columns the model reads, filled by an
    insert-triggered view (promotion is per span). One request's spans arrive in several
    inserts, so the requests come from a refreshable view: each refresh (aligned to `every`)
    appends the requests starting in the interval that ended `lag_minutes` ago, plus one
    marker row, every row stamped with STAMP_COLUMNS. Readers never trust a refresh blindly:
    `coverage` decides which intervals may be read as they are.
    """
    check_table_name(table)
    check_table_name(target)
    step = _interval(every)[0]
    spans = f"{target}_spans"
    end = _view_end_sql(step, lag_minutes)
    select = refresh_sql(table, target, f"toUnixTimestamp64Nano(toDateTime64({end} - INTERVAL {step}, 9))",
                         f"toUnixTimestamp64Nano(toDateTime64({end}, 9))")
    keep = _KEEP
    settings = _settings_clause(M.CLICKHOUSE_SETTINGS)
    return [
        f"CREATE TABLE IF NOT EXISTS {spans} ENGINE = MergeTree PARTITION BY intDiv(TimestampNs, {24 * _H}) "
        f"ORDER BY (TimestampNs, TraceId) EMPTY AS SELECT {keep} FROM {source_sql(table)}",
        f"CREATE MATERIALIZED VIEW IF NOT EXISTS {spans}_mv TO {spans} AS SELECT {keep} FROM {source_sql(table)}",
        # a refresh run twice over one interval appends its rows twice: readers take the latest refresh of an
        # interval (its stamp), and the replacing engine drops the older rows as parts merge
        f"CREATE TABLE IF NOT EXISTS {target} ENGINE = ReplacingMergeTree(refreshed_ns) PARTITION BY toDate(start) "
        f"ORDER BY (start_ns, trace_id, span_id) EMPTY AS {select}{settings}",
        f"CREATE MATERIALIZED VIEW IF NOT EXISTS {target}_mv REFRESH EVERY {step} APPEND TO {target} "
        f"AS {select}{settings}",
    ]


@dataclass(frozen=True)
class Refresh:
    """One refresh's rows in the materialized table: the interval [lo_ns, hi_ns) it computed, and when."""

    lo_ns: int
    hi_ns: int
    refreshed_ns: int


def _exists(client: Client, target: str) -> bool:
    """Whether `target` exists with the refresh stamps (a table of an older `clickhouse init` has none)."""
    db, _, name = target.rpartition(".")
    where = f"database = {literal(db)}" if db else "database = currentDatabase()"
    cols = client.query(f"SELECT name FROM system.columns WHERE {where} AND table = {literal(name)}").to_pylist()
    have = {str(r["name"]) for r in cols}
    return set(STAMP_COLUMNS) <= have and set(M.REQUEST_COLUMNS) <= have


def coverage(client: Client, table: str = DEFAULT_TABLE, target: str = REQUESTS_TABLE,
             lo_ns: int | None = None, hi_ns: int | None = None) -> list[Refresh]:
    """The refreshes of `target` whose requests may be read as they are, for requests starting in [lo, hi).

    Of each interval only its latest refresh counts, and only when (1) all its rows are there
    (their number is stamped on each: a refresh cut short, or run twice at once, fails this),
    (2) it ran with the current `requests_fingerprint` (same model, promotion and source table),
    and (3) it read as many spans in the interval's reach as `table` holds there now (a span that
    landed later, or spans the copy never saw, make it stale). Overlapping intervals (two
    `--every`) keep the latest refresh. Every other request is computed from the spans.
    """
    check_table_name(target)
    if not _exists(client, target):
        return []
    clip = " AND ".join([*([f"refresh_hi_ns > {int(lo_ns)}"] if lo_ns is not None else []),
                         *([f"refresh_lo_ns < {int(hi_ns)}"] if hi_ns is not None else [])]) or "TRUE"
    groups = client.query(
        f"SELECT refresh_lo_ns AS lo, refresh_hi_ns AS hi, refreshed_ns AS at, any(refresh_rows) AS want, "
        f"any(refresh_spans) AS spans, any(fingerprint) AS fp, count() AS got "
        f"FROM {target} WHERE {clip} GROUP BY lo, hi, at").to_pylist()
    latest: dict[tuple[int, int], dict[str, Any]] = {}
    for g in groups:
        key = (int(g["lo"]), int(g["hi"]))
        if key not in latest or int(g["at"]) > int(latest[key]["at"]):
            latest[key] = g
    groups = list(latest.values())
    if not groups:
        return []
    first = min(int(g["lo"]) for g in groups)
    last = max(int(g["hi"]) for g in groups)
    hours = {int(r["h"]): int(r["n"]) for r in client.query(
        f"SELECT intDiv(toUnixTimestamp64Nano(Timestamp), {_H}) AS h, count() AS n FROM {check_table_name(table)} "
        f"WHERE {span_where(first, last)} GROUP BY h").to_pylist()}
    fp = requests_fingerprint(table)
    good: list[Refresh] = []
    for g in sorted(groups, key=lambda g: -int(g["at"])):
        r = Refresh(int(g["lo"]), int(g["hi"]), int(g["at"]))
        a, b = reach_ns(r.lo_ns, r.hi_ns)
        now = sum(n for h, n in hours.items() if a <= h * _H < b)
        if (int(g["got"]) == int(g["want"]) and g["fp"] == fp and int(g["spans"]) == now
                and not any(r.lo_ns < o.hi_ns and o.lo_ns < r.hi_ns for o in good)):
            good.append(r)
    return sorted(good, key=lambda r: r.lo_ns)


def _ranges_sql(col: str, ranges: list[tuple[int | None, int | None]]) -> str:
    """`col` within any of `ranges` ([lo, hi), None unbounded)."""
    return "(" + " OR ".join(f"({P.in_range_sql(col, a, b)})" for a, b in ranges) + ")" if ranges else "FALSE"


def _uncovered(covered: list[Refresh], lo_ns: int | None, hi_ns: int | None) -> list[tuple[int | None, int | None]]:
    """[lo, hi) less the covered intervals (sorted, disjoint), as ranges (None: unbounded)."""
    out: list[tuple[int | None, int | None]] = []
    at = lo_ns
    for r in covered:
        if at is None or r.lo_ns > at:
            end = r.lo_ns if hi_ns is None else min(r.lo_ns, hi_ns)
            if at is None or end > at:
                out.append((at, end))
        at = r.hi_ns if at is None else max(at, r.hi_ns)
    if hi_ns is None or at is None or at < hi_ns:
        out.append((at, hi_ns))
    return out


def _ts(ns: int) -> str:
    return f"fromUnixTimestamp64Nano(toInt64({int(ns)}))"


def _rest_spans_where(client: Client, table: str, rest: list[tuple[int | None, int | None]], client_spans: bool
                      ) -> str:
    """A condition on `table` keeping every span the requests starting in `rest` read ('' when no request starts
    there): per range, its request spans, and the spans starting from the hour before the first one's hour up to
    the last one's end that end after the first one starts (the model's `st` reads no other stage span); with
    `client_spans`, the client spans within the model's read hours of those requests."""
    if not rest:
        return ""
    arms = ", ".join(f"{P.in_range_sql('TimestampNs', a, b)}, {i}" for i, (a, b) in enumerate(rest))
    ranges = " OR ".join(f"({_ts_range(a, b) or 'TRUE'})" for a, b in rest)
    found = client.query(
        f"SELECT multiIf({arms}, -1) AS i, min(TimestampNs) AS a, max(TimestampNs) AS b, max(EndNs) AS e "
        f"FROM {source_sql(table, ranges)} WHERE IsRequest GROUP BY i").to_pylist()
    conds = []
    for f in found:
        if int(f["i"]) < 0:
            continue
        lo, hi = rest[int(f["i"])]
        a, b, e = int(f["a"]), int(f["b"]), int(f["e"])
        first = (a // _H) * _H - _H
        conds.append(_ts_range(lo, hi) or "TRUE")
        conds.append(f"Timestamp >= {_ts(first)} AND Timestamp < {_ts(e + 1)} "
                     f"AND toUnixTimestamp64Nano(Timestamp) + toInt64(Duration) > {a}")
        if client_spans:
            conds.append(f"Timestamp >= {_ts(first)} AND Timestamp < {_ts((b // _H) * _H + 2 * _H)} "
                         f"AND {kind_sql()} = 'Client'")
    return " OR ".join(f"({c})" for c in conds)


def _ts_range(lo: int | None, hi: int | None) -> str:
    """`lo <= Timestamp < hi` over an otel_traces table ('' when unbounded both ways)."""
    return " AND ".join([*([f"Timestamp >= {_ts(lo)}"] if lo is not None else []),
                         *([f"Timestamp < {_ts(hi)}"] if hi is not None else [])])


def requests_facts(client: Client, table: str = DEFAULT_TABLE, *, lo_ns: int | None = None,
                   hi_ns: int | None = None, name: str = "requests", columns: tuple[str, ...] = M.REQUEST_COLUMNS,
                   materialized: bool = True, target: str = REQUESTS_TABLE) -> str:
    """The requests starting in [lo, hi) (`columns`) in the session's temporary table `name`; returns `name`.

    With `materialized` and `target` present, the intervals `coverage` accepts are read from
    `target` and only the rest is computed from the spans (`materialize_requests`), UNION ALL:
    the rows are those of computing everything from the spans. Without, everything is computed.
    """
    covered = coverage(client, table, target, lo_ns, hi_ns) if materialized else []
    if not covered:
        return materialize_requests(client, table, where=span_where(lo_ns, hi_ns), name=name, columns=columns)
    cols = ", ".join(columns)
    in_range = _ranges_sql("start_ns", [(lo_ns, hi_ns)])
    stamps = ", ".join(f"({r.lo_ns}, {r.refreshed_ns})" for r in covered)
    parts = [f"SELECT {cols} FROM {target} WHERE NOT (trace_id = '' AND span_id = '') AND {in_range} "
             f"AND (refresh_lo_ns, refreshed_ns) IN ({stamps})"]
    rest = _uncovered(covered, lo_ns, hi_ns)
    where = _rest_spans_where(client, table, rest, "client_e2e_ns" in columns or "client_network_ns" in columns)
    if where:
        parts.append(f"SELECT {cols} FROM " + materialize_requests(
            client, table, where=where, name=f"{name}_computed", columns=columns,
            request_where=_ranges_sql("TimestampNs", rest)))
    union = " UNION ALL ".join(f"({p})" for p in parts)
    n = int(client.query(f"SELECT count() AS n FROM ({union})").to_pylist()[0]["n"])
    temp_table(client, name, union, "Memory" if n <= MEMORY_TEMP_MAX_SPANS else "MergeTree ORDER BY tuple()")
    return name


# The quantile rules in ClickHouse SQL (percentiles.weighted_quantile_sorted), one owner for every pushed-down figure.

def q_sql(sorted_values: str, q: float) -> str:
    """The quantile q of a sorted array by percentiles.weighted_quantile_sorted's unweighted arithmetic, step for step
    in Float64 (rank h = (n - 1) q, linear interpolation): equal to numpy's and DuckDB's to the last bit."""
    n = f"length({sorted_values})"
    h = f"(({n} - 1) * {q!r})"
    lo = f"toUInt64(floor({h}))"
    a = f"{sorted_values}[{lo} + 1]"
    return f"if({n} = 0, nan, {a} + ({h} - floor({h})) * ({sorted_values}[least({lo} + 1, {n} - 1) + 1] - {a}))"


def wq_sql(values: str, cum: str, q: float) -> str:
    """The weighted quantile q (percentiles.weighted_quantile_sorted): `values` sorted, `cum` their running weight;
    nan when empty."""
    n = f"length({values})"
    h = f"((arrayElement({cum}, -1) - 1) * {q!r})"

    def at(level: str) -> str:  # the first value whose running weight exceeds `level` (the last past the end)
        first = f"arrayFirstIndex(c -> c > {level}, {cum})"
        return f"{values}[if({first} = 0, {n}, {first})]"
    a, b = at(f"floor({h})"), at(f"floor({h}) + 1")
    return f"if({n} = 0, nan, {a} + ({h} - floor({h})) * ({b} - {a}))"


def arrays_sql(value: str, weight: str | None, keep: str | None = None, prefix: str = "") -> str:
    """Aggregates over a group: `{prefix}s` its values sorted, `{prefix}cum` their running weight (when weighted),
    `{prefix}tot` / `{prefix}sq` the sums of the weights and of their squares (the count twice, unweighted).

    `keep` (a condition) narrows the values to its rows that have one, so several metrics or filters share one
    GROUP BY; without it the group's non-null values (the rows' WHERE chooses them)."""
    s, cum, tot, sq = (f"{prefix}{n}" for n in ("s", "cum", "tot", "sq"))
    if keep is None:
        vals = f"groupArray(toFloat64({value}))"
        pairs = f"groupArray((toFloat64({value}), toFloat64({weight})))"
    else:
        cond = f"{value} IS NOT NULL AND ({keep})"
        vals = f"groupArrayIf(toFloat64(assumeNotNull({value})), {cond})"
        pairs = f"groupArrayIf((toFloat64(assumeNotNull({value})), toFloat64({weight})), {cond})"
    if weight is None:
        return f"arraySort({vals}) AS {s}, toFloat64(length({s})) AS {tot}, {tot} AS {sq}"
    p = f"arraySort(x -> x.1, {pairs})"
    return (f"arrayMap(x -> x.1, {p}) AS {s}, arrayMap(x -> x.2, {p}) AS {prefix}ws, arrayCumSum({prefix}ws) AS {cum}, "
            f"arraySum({prefix}ws) AS {tot}, arraySum(arrayMap(x -> x * x, {prefix}ws)) AS {sq}")


def quantile_sql(weight: str | None, q: float, prefix: str = "") -> str:
    """The quantile q over `arrays_sql`'s aggregates (same `prefix`): `q_sql` unweighted, `wq_sql` weighted."""
    return q_sql(f"{prefix}s", q) if weight is None else wq_sql(f"{prefix}s", f"{prefix}cum", q)


def kish_sql(weight: str, cond: str = "TRUE") -> str:
    """Kish's effective count (sum w)^2 / sum w^2 of the rows where `cond` holds, 0 when none (percentiles.
    effective_count; breakdowns._n_effective's arithmetic)."""
    w = f"toFloat64({weight})"
    return f"if(sumIf({w} * {w}, {cond}) = 0, 0, pow(sumIf({w}, {cond}), 2) / sumIf({w} * {w}, {cond}))"
