"""The materialized `tailscope_requests`: its DDL (`requests_mv_ddl`), which refreshed intervals of it may be read
as they are (`coverage`), the backfill, and the requests of a range read from it there and computed from the spans
elsewhere (`requests_facts`; docs/scale-out.md, "Materialized requests").
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from analysis.clickhouse.client import DEFAULT_TABLE, Client, check_table_name, literal, settings_clause
from analysis.clickhouse.model import KEEP_SQL, forget_copy, materialize_requests, temp_engine, temp_table
from analysis.clickhouse.promotion import kind_sql, source_sql
from analysis.clickhouse.server import NEWEST, Features, features
from analysis.engine import model as M
from analysis.engine import percentiles as P
from tracing import schema as S
from tracing.errors import QueryError

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


def span_range(lo_ns: int | None, hi_ns: int | None) -> tuple[int | None, int | None]:
    """The [first, end) ns of the span start times `span_where` keeps (None: unbounded on that side)."""
    return (None if lo_ns is None else (lo_ns // _H) * _H - _H, None if hi_ns is None else (hi_ns // _H) * _H + 2 * _H)


def span_where(lo_ns: int | None, hi_ns: int | None) -> str:
    """A condition on an otel_traces table's Timestamp keeping the spans a request starting in [lo, hi) may read
    (None: unbounded on that side; a little wider than `reach_ns` at hi, which changes no request)."""
    first, end = span_range(lo_ns, hi_ns)
    parts = []
    if first is not None:
        parts.append(f"Timestamp >= fromUnixTimestamp64Nano(toInt64({first}))")
    if end is not None:
        parts.append(f"Timestamp < fromUnixTimestamp64Nano(toInt64({end}))")
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


def refresh_sql(table: str, target: str, lo: str, hi: str, server: Features = NEWEST, spans: str = "") -> str:
    """The SELECT one refresh appends to `target`: the requests starting in [lo, hi) (SQL expressions of ns)
    computed from `<target>_spans` (or the relation `spans`) in the interval's reach, one marker row, all stamped
    with STAMP_COLUMNS."""
    spans = spans or f"{target}_spans"
    reach = (f"TimestampNs >= intDiv({lo}, {_H}) * {_H} - {_H} "
             f"AND TimestampNs < intDiv({hi} - 1, {_H}) * {_H} + {2 * _H}")
    src = (f"(SELECT *, map({M.quote(S.ATTR_STREAMING)}, _stream) AS SpanAttributes FROM {spans} WHERE {reach})")
    requests = M.requests_sql(src, server.dialect, request_where=f"TimestampNs >= {lo} AND TimestampNs < {hi}")
    return (f"SELECT *, toUInt64(count() OVER ()) AS refresh_rows, {lo} AS refresh_lo_ns, {hi} AS refresh_hi_ns, "
            f"toUnixTimestamp64Nano(now64(9)) AS refreshed_ns, "
            f"(SELECT count() FROM {spans} WHERE {reach}) AS refresh_spans, "
            f"{M.quote(requests_fingerprint(table))} AS fingerprint "
            f"FROM (({requests}) UNION ALL ({_marker_sql(lo)}))")


def refresh(client: Client, table: str, lo_ns: int, hi_ns: int, target: str = REQUESTS_TABLE) -> None:
    """Run one refresh by hand: append the requests of [lo, hi) to `target` as the refreshable view would
    (a backfill of intervals before `clickhouse init`, once `<target>_spans` holds their spans)."""
    server = features(client)
    client.command(f"INSERT INTO {target} {refresh_sql(table, target, str(int(lo_ns)), str(int(hi_ns)), server)}"
                   + settings_clause(server.settings))


def copy_spans(client: Client, table: str = DEFAULT_TABLE, target: str = REQUESTS_TABLE, where: str = "") -> None:
    """Copy the spans of `table` (`where`: over its columns) into `<target>_spans` as the insert-triggered view
    does for new ones: what a backfill of spans written before `clickhouse init` runs first."""
    client.command(f"INSERT INTO {target}_spans SELECT {KEEP_SQL} FROM {source_sql(table, where)}")


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
                    target: str = REQUESTS_TABLE, server: Features = NEWEST) -> list[str]:
    """DDL of `target` (one row per request) and the views that keep it filled.

    `<target>_spans` holds the promoted span columns the model reads, filled by an
    insert-triggered view (promotion is per span). One request's spans arrive in several
    inserts, so the requests come from a refreshable view: each refresh (aligned to `every`)
    appends the requests starting in the interval that ended `lag_minutes` ago, plus one
    marker row, every row stamped with STAMP_COLUMNS. Readers never trust a refresh blindly:
    `coverage` decides which intervals may be read as they are. `server`: the release the DDL is for.
    """
    check_table_name(table)
    check_table_name(target)
    step = _interval(every)[0]
    spans = f"{target}_spans"
    end = _view_end_sql(step, lag_minutes)
    select = refresh_sql(table, target, f"toUnixTimestamp64Nano(toDateTime64({end} - INTERVAL {step}, 9))",
                         f"toUnixTimestamp64Nano(toDateTime64({end}, 9))", server)
    keep = KEEP_SQL
    settings = settings_clause(server.settings)
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
        return materialize_requests(client, table, where=span_where(lo_ns, hi_ns), name=name, columns=columns,
                                    span_range=span_range(lo_ns, hi_ns))
    forget_copy(client)  # `name` is made from the materialized table too: no copy holds its spans
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
    temp_table(client, name, union, temp_engine(client, union))
    return name



@dataclass(frozen=True)
class Applied:
    """What `apply_schema` did: the objects it created and those that were there already (in DDL order)."""

    created: tuple[str, ...]
    existing: tuple[str, ...]


def schema_objects(target: str = REQUESTS_TABLE) -> tuple[str, ...]:
    """The objects `requests_mv_ddl` creates, in its order: the spans copy, its view, the requests, their view."""
    return (f"{target}_spans", f"{target}_spans_mv", target, f"{target}_mv")


def _present(client: Client, names: tuple[str, ...]) -> set[str]:
    """Which of `names` (db.table allowed) exist."""
    found: set[str] = set()
    for name in names:
        db, _, short = name.rpartition(".")
        where = f"database = {literal(db)}" if db else "database = currentDatabase()"
        if client.query(f"SELECT count() AS n FROM system.tables WHERE {where} AND name = {literal(short)}"
                        ).to_pylist()[0]["n"]:
            found.add(name)
    return found


def apply_schema(client: Client, table: str = DEFAULT_TABLE, *, every: str = "5 MINUTE", lag_minutes: int = 10,
                 target: str = REQUESTS_TABLE) -> Applied:
    """Create the materialized requests (`requests_mv_ddl`) all or nothing: check first, then create what is missing.

    Checked before anything is created: `table` exists, the server keeps refreshable views that
    APPEND, every statement parses there (EXPLAIN AST) and the spans' SELECT runs on `table` (with
    no row; the requests' SELECT is analysed when its table is created, which takes tens of seconds
    on a release without materialized CTEs, so it is not run twice). A statement refused while
    applying drops what this run created, and the error (QueryError) says so; what was there before
    is never dropped. On an applied schema it
    creates nothing (`Applied.created` is empty)."""
    server = features(client)
    statements = requests_mv_ddl(table, every=every, lag_minutes=lag_minutes, target=target, server=server)
    names = schema_objects(target)
    if not _present(client, (table,)):
        raise QueryError("", f"table {table} does not exist: nothing was created")
    for sql in statements:
        try:
            client.query(f"EXPLAIN AST {sql}")
        except QueryError as exc:
            if " APPEND TO " in sql:  # refreshable views that append came after 24.8
                raise QueryError(sql, f"ClickHouse {server.version} has no refreshable views that APPEND TO a "
                                      "table: the materialized requests cannot be kept there, so nothing was created; "
                                      "reports compute the requests from the spans") from None
            raise QueryError(sql, f"{exc.what}: nothing was created") from None
    client.query(f"SELECT * FROM (SELECT {KEEP_SQL} FROM {source_sql(table)}) LIMIT 0")
    before = _present(client, names)
    created: list[str] = []
    for name, sql in zip(names, statements, strict=True):
        if name in before:
            continue
        try:
            client.command(sql)
        except QueryError as exc:
            for done in reversed(created):
                client.command(f"DROP TABLE IF EXISTS {done}")
            undone = f"; dropped again what this run created ({', '.join(created)})" if created else ""
            raise QueryError(exc.sql, f"creating {name} failed: {exc.what}{undone}") from None
        created.append(name)
    return Applied(tuple(created), tuple(n for n in names if n in before))
