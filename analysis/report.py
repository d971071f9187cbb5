"""The report: percentile series, spike detection and the explanation of every spike, as one dict.

`build_report(con)` returns the stable JSON contract of `tailscope report --json`
(docs/methods.md describes every key); `render_text(report)` prints it with rich tables.
`explain_window(con, start, end)` explains any window (say, one brushed on a chart) the
same way, against the same baseline. Both take `source=`, a table or view of request
facts to read instead of the store's (the dashboard passes its filtered rows).
A sub-analysis that fails shows up as "could not compute X because Y" in `errors`
instead of failing the whole report. Sampled traces (adjusted counts other than 1) are
weighted everywhere (docs/methods.md#sampled-traces); `sampling_policy` declares what the
sampler did when the data cannot show it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any, Final, Protocol, cast

import duckdb
import numpy as np
import polars as pl
from rich.console import Console

from analysis import contract as C
from analysis import neighbours as N
from analysis.engine import attribute_values as AV
from analysis.engine import model as M
from analysis.engine.connect import ROW_ID_FILE_SHIFT
from analysis.engine.dialect import quote
from analysis.engine.percentiles import (
    ANY_WEIGHTED_SQL,
    auto_window_s,
    facts_by_rid,
    iso,
    metric_column,
    ms,
    parse_duration,
    parse_time,
    quote_ident,
    request_facts,
    source_columns,
    weight_column,
)
from analysis.settings import EXPLAIN
from analysis.stats import attributes as A
from analysis.stats import bounds as B
from analysis.stats import explain as X
from analysis.stats import sampling as SM
from analysis.stats.spikes import Detection, Spike, detect, judge_stretch
from tracing import schema as S
from tracing.errors import QueryError

#: Metrics a report can be about.
REPORT_METRICS: Final[tuple[str, ...]] = ("e2e", "ttft", "tpot")
#: Version of the JSON contract; bumped only on incompatible change.
REPORT_VERSION: Final = 1


#: Reads, per row id of a facts table, whether its request span records a sampling probability and
#: whether that record is malformed (sampling.recorded_flags's signature).

#: Baseline requests as counts (see `explain_all`): combinations with their `n`, a reader of their values
#: outside a candidate, and the whole baseline's p99 with and without a candidate (the engine's own).
RestCounts = tuple[pl.DataFrame, Callable[[list[X.Coded], X.Candidate], np.ndarray], X.BaselineTail]


#: A remote engine's spike figures without candidates (explain.SpikeWithout): (the dimensions, the candidates, the
#: spike's rows) -> those of the candidates holding an attribute, by position.
SpikeWithoutOf = Callable[[Sequence[X.Coded], list[X.Candidate], X.Part], X.SpikeWithout]
#: A remote engine's test of which of some rows (an exemplar pool) match a candidate, as far as the exemplars read:
#: (the dimensions, the candidate, the rows, k) -> a mask over the rows, true for the matching ones of the k least
#: values (ties kept), false for every other row.
Prefer = Callable[[Sequence[X.Coded], X.Candidate, np.ndarray, int], np.ndarray]


#: A remote engine's stage shares of a spike (explain.stage_shares, the means computed on its server, both tails
#: chosen there, so neither a tail's rows nor any span comes back): (the spike, the local baseline's window starts
#: (`local_baseline`), the stages) -> the shares.
RemoteStages = Callable[[Spike, np.ndarray, Sequence[str]], list[C.StageShare]]


class SpikeRows(Protocol):
    """A remote engine's spike requests when it counts every dimension: their rows stay there (explain.Counted, named
    by a condition) and each figure the explanation reads of them is its answer, so none of their rows comes back.
    The in-memory reading of the same figures is the frame's rows (`spike_parts`, `_Coding`, `explain_all`)."""

    def rows(self, spike: Spike) -> X.Counted:
        """The spike's requests, with their (weighted) p99."""
        ...

    def tail(self, spike: Spike) -> X.Counted:
        """Their tail slice (explain.tail_slice's rule)."""
        ...

    def excess(self, spike: Spike, tail: X.Counted) -> X.Counted:
        """Those slower than its baseline p99, or `tail` when fewer than MIN_TAIL_SLICE (`_Coding.ranked`'s)."""
        ...

    def exemplars(self, spike: Spike, coded: Sequence[X.Coded], best: X.Candidate | None) -> list[str]:
        """Trace ids of explain.exemplar_rows's choice, those matching `best` first."""
        ...


@dataclasses.dataclass
class RemoteAttributes:
    """A remote engine's attribute dimensions for `explain_all` (with `RestCounts`): the rules the built-ins pass,
    the attributes (labels only: their codes stay on the engine, every figure read from them is its aggregate), the
    engine's counts of every combination holding an attribute over a tail and the baseline (explain.RemoteCells),
    its nesting test over the frame's requests (attributes.Overlap), the spike's p99 without a candidate holding an
    attribute (`SpikeWithoutOf`) and which of the exemplar pool's rows match one (`Prefer`). `builtin`: the built-ins
    coded on the engine too (labels only, over the frame's requests), when it counts them as it counts the attributes:
    then every figure of a candidate is the engine's, the frame's rows need not hold the dimensions, and `RestCounts`
    holds the whole baseline as one combination (its count, and summed weight)."""

    rules: A.AttributeRules
    coded: list[X.Coded]
    cells: X.RemoteCells
    overlap: A.Overlap
    spike_without: SpikeWithoutOf
    prefer: Prefer
    builtin: list[X.Coded] | None = None

#: Temp table holding a snapshot of a caller's `source` (see build_report).
SOURCE_TABLE: Final = "_tailscope_report_source"


def only_pairs(only: Mapping[str, Sequence[str]] | None) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """`only` ({dimension: values}) as Ask.only: sorted pairs, a dimension without values left out (it keeps every
    request). Raises QueryError for a dimension that is not a filter dimension (analysis.engine.model)."""
    pairs = tuple(sorted((d, tuple(str(v) for v in vs)) for d, vs in (only or {}).items() if vs))
    unknown = [d for d, _ in pairs if d not in M.FILTER_DIMENSIONS]
    if unknown:
        raise QueryError("", f"cannot filter the report by {', '.join(unknown)}; use one of "
                             f"{', '.join(M.FILTER_DIMENSIONS)}")
    return pairs


def only_condition(only: tuple[tuple[str, tuple[str, ...]], ...]) -> str:
    """A condition over the request facts (values inlined as literals: a view reads it) keeping the requests whose
    dimension is one of its values, for each pair of `only` (`only_pairs`); "true" when `only` is empty."""
    return " AND ".join([f"{quote_ident(dim)} IN ({', '.join(quote(v) for v in values)})" for dim, values in only]
                        or ["true"])


#: Temp view of the store's request facts kept by a report's `only` (see `_frame_parts`).
ONLY_VIEW: Final = "_tailscope_report_only"


@dataclasses.dataclass(frozen=True)
class Ask:
    """What a report (or find_spikes, explain_window) is asked: the metric, the range, which requests and
    dimensions. `source`: a table or view of request facts instead of the store's (see `build_report`);
    `explain=False`: detection only (find_spikes); `rules`: which dimensions to consider (None: every one);
    `only`: the filter-dimension values the requests are kept by (see `only_condition`)."""

    metric: str = "e2e"
    window_s: float | str | None = None
    since: str | int | datetime | None = None
    until: str | int | datetime | None = None
    include_failures: bool = True
    source: str | None = None
    sampling_policy: str = "auto"
    explain: bool = True
    rules: A.AttributeRules | None = None
    #: (dimension, values) pairs: only the requests whose dimension is one of the values (`only_condition`)
    only: tuple[tuple[str, tuple[str, ...]], ...] = ()


@dataclasses.dataclass(frozen=True, eq=False)
class Rows:
    """What every explanation step reads: the analysed rows and their detection.

    `frame` (rid into `facts`, start_ns, e2e_ns, value, the DIMENSIONS; weight and status when sampled) in
    start order, with `start` and `values` its columns as arrays and `weights` its adjusted counts (None
    when unsampled); `det` the detection over them; `coded` the frame's dimensions already coded (None:
    coded when explained); `neighbours` and `rest` a remote engine's (see `explain_all`).
    """

    con: duckdb.DuckDBPyConnection
    facts: str
    frame: pl.DataFrame
    det: Detection
    metric: str
    start: np.ndarray
    values: np.ndarray
    weights: np.ndarray | None
    coded: list[X.Coded] | None = None
    neighbours: N.Figures | None = None
    rest: RestCounts | None = None
    attributes: RemoteAttributes | None = None
    #: the reader of the frame's dimensions (`_frame_parts`) when `coded` is None and the facts hold them
    read_dims: Callable[[], pl.DataFrame] | None = None
    #: each spike's ranked dimensions as `culprit_bounds` ranked them, for the explanation of a spike it left in
    #: place (`_Coding.ranked`: the same rows, baseline and coding give the same ranking)
    ranked: dict[tuple[int, int, int], Any] = dataclasses.field(default_factory=dict)
    #: a remote engine's stage shares (the frame then need not hold the local baseline's rows)
    stages: RemoteStages | None = None
    #: a remote engine's spike requests (the frame then holds none of them: with `attributes.builtin`)
    spike_rows: SpikeRows | None = None

    @classmethod
    def of(cls, con: duckdb.DuckDBPyConnection, facts: str, frame: pl.DataFrame, det: Detection, metric: str, *,
           coded: list[X.Coded] | None = None, neighbours: N.Figures | None = None,
           rest: RestCounts | None = None, attributes: RemoteAttributes | None = None,
           read_dims: Callable[[], pl.DataFrame] | None = None, stages: RemoteStages | None = None,
           spike_rows: SpikeRows | None = None) -> Rows:
        """The rows of `frame`, their arrays read from it."""
        return cls(con, facts, frame, det, metric, frame.get_column("start_ns").to_numpy(), values_of(frame),
                   weights_of(frame), coded, neighbours, rest, attributes, read_dims, stages=stages,
                   spike_rows=spike_rows)


def spike_parts(rows_: Rows, spike: Spike) -> tuple[X.Part, X.Part]:
    """A spike's requests and their tail slice: the frame's rows, or the remote engine's (`Rows.spike_rows`)."""
    if rows_.spike_rows is not None:
        return rows_.spike_rows.rows(spike), rows_.spike_rows.tail(spike)
    rows = np.flatnonzero((rows_.start >= spike.start_ns) & (rows_.start < spike.end_ns)).astype(np.int64)
    return rows, X.tail_slice(rows_.values, rows, weights=rows_.weights)


def _snapshot(con: duckdb.DuckDBPyConnection, source: str, metric: str, detection_only: bool = False) -> str:
    """A temp table of the request-fact columns of `source` (a table or view name, or a parenthesised query).

    The copy fixes the rows for the whole report while the source (a live view) may change; the report
    addresses its rows by rowid (percentiles.row_id_column). `detection_only` (find_spikes on unsampled
    rows): the detection reads each request's start, value and outcome only, so the ids and dimensions,
    most of the copy's cost, are written as NULLs of their types instead of copied.
    """
    # span_id: the noisy-neighbour finding joins GPU shares on (trace_id, span_id)
    ids = ("trace_id", "span_id", *X.DIMENSIONS)
    cols = ["trace_id", "span_id", "start_ns", "e2e_ns", "status", *X.DIMENSIONS] + (
        ["ttft_ns", "tpot_ns"] if metric != "e2e" else [])
    if not detection_only and SM.weight_of(con, source) != "1.0":
        cols.append("adjusted_count")
    listed = ", ".join(
        f"CAST(NULL AS {'BIGINT' if c in X.BUCKETED else 'VARCHAR'}) AS {quote_ident(c)}"
        if detection_only and c in ids else quote_ident(c) for c in cols)
    con.execute(f"CREATE OR REPLACE TEMP TABLE {SOURCE_TABLE} AS SELECT {listed} FROM {source}").fetchall()
    return SOURCE_TABLE


def _frame(con: duckdb.DuckDBPyConnection, metric: str, since: int | None, until: int | None,
           include_failures: bool, source: str | None = None
           ) -> tuple[pl.DataFrame, dict[str, int], str, dict[str, float] | None]:
    """(the frame: values and dimensions of the rows in range, the counts, the facts table, the weighted counts),
    read one after the other (`_prepare` overlaps the dimensions' read with detection: `_frame_parts`)."""
    frame, read_dims, counts, facts, weighted = _frame_parts(con, metric, since, until, include_failures, source)
    frame = _with_dims(frame, read_dims())
    return frame, counts, facts, weighted


def _frame_parts(con: duckdb.DuckDBPyConnection, metric: str, since: int | None, until: int | None,
                 include_failures: bool, source: str | None = None, detection_only: bool = False,
                 only: tuple[tuple[str, tuple[str, ...]], ...] = ()
                 ) -> tuple[pl.DataFrame, Callable[[], pl.DataFrame], dict[str, int], str, dict[str, float] | None]:
    """(the values frame, the reader of its dimensions, the counts, the facts table, the weighted counts).

    The values frame holds what detection reads (rid, start_ns, e2e_ns, value; weight and status when
    sampled), in start order; the reader (None unless `explain`) returns rid and the DIMENSIONS of the
    same rows, for `_with_dims`: `_prepare` runs it on a second thread while detection runs on the values
    (DuckDB releases the GIL), so the dimensions' scan, most of the frame's cost, is not waited for.
    """
    facts = (request_facts(con, with_ttft=metric != "e2e") if source is None
             else _snapshot(con, source, metric, detection_only))
    if only:  # the kept rows of the facts, read in place (a predicate on the stored hours' scan), their rids the facts'
        con.execute(f"CREATE OR REPLACE TEMP VIEW {ONLY_VIEW} AS SELECT * FROM {facts} WHERE {only_condition(only)}"
                    ).fetchall()
        facts = ONLY_VIEW
    col = quote_ident(metric_column(metric))
    where = "($since IS NULL OR start_ns >= $since) AND ($until IS NULL OR start_ns < $until)"
    params = {"since": since, "until": until}
    keep = "" if include_failures else " AND status = 'ok'"
    columns = source_columns(con, facts)
    rid = "rid" if "rid" in columns else "rowid"
    # in the same scan as the counts, whether any request weighs other than 1 (percentiles.weight_column's rule)
    row = con.sql(
        "SELECT count(*) AS requests, count(*) FILTER (WHERE status = 'ok') AS ok, "
        "count(*) FILTER (WHERE status = 'error') AS errors, "
        "count(*) FILTER (WHERE status = 'timeout') AS timeouts, "
        "count(*) FILTER (WHERE status = 'cancelled') AS cancelled, min(start_ns), max(start_ns), "
        + (f"{ANY_WEIGHTED_SQL}" if "adjusted_count" in columns else "NULL")
        + f" FROM {facts} WHERE {where}", params=params).fetchall()[0]
    counts = row[:7]
    weight = "adjusted_count" if row[7] else None
    weighted: dict[str, float] | None = None
    extra = ""
    if weight is not None:
        w = quote_ident(weight)
        extra = f", {w} AS weight, status"
        row = con.sql(
            f"SELECT sum({w}), coalesce(sum({w}) FILTER (WHERE status = 'ok'), 0), "
            f"coalesce(sum({w}) FILTER (WHERE status = 'error'), 0), "
            f"coalesce(sum({w}) FILTER (WHERE status = 'timeout'), 0), "
            f"coalesce(sum({w}) FILTER (WHERE status = 'cancelled'), 0) FROM {facts} WHERE {where}",
            params=params).fetchall()[0]
        weighted = dict(zip(("requests", "ok", "error", "timeout", "cancelled"), map(float, row), strict=True))
    rows = f"FROM {facts} WHERE {where} AND {col} IS NOT NULL{keep}"
    frame = con.sql(f"SELECT {rid} AS rid, start_ns, e2e_ns, {col}::DOUBLE AS value{extra} {rows}",
                    params=params).pl()
    if not frame.get_column("start_ns").is_sorted():  # the stored hours come in start order: no sort to pay
        frame = frame.sort("start_ns", maintain_order=True)
    names = ("requests", "ok", "error", "timeout", "cancelled", "first_ns", "last_ns")
    totals = {n: int(v or 0) for n, v in zip(names, counts, strict=True)}

    def read_dims() -> pl.DataFrame:
        # the text dimensions' values among the frame's rows first: the frame then carries them as ENUMs
        # (categoricals in polars), far cheaper to sort and hand over than text
        text = [d for d in X.DIMENSIONS if d not in X.BUCKETED]
        found = con.sql(f"SELECT {', '.join(f'list(DISTINCT {quote_ident(d)})' for d in text)} {rows}",
                        params=params).fetchall()[0]
        labels = dict(zip(text, found, strict=True))
        dims = ", ".join(_enum_of(d, labels[d]) if d in labels else quote_ident(d) for d in X.DIMENSIONS)
        return con.sql(f"SELECT {rid} AS rid, {dims} {rows}", params=params).pl()

    read_dims.facts_rows = (f"SELECT {rid} AS rid, trace_id, span_id, start_ns {rows}", params)  # type: ignore[attr-defined]
    return frame, read_dims, totals, facts, weighted


def _with_dims(frame: pl.DataFrame, dims: pl.DataFrame) -> pl.DataFrame:
    """The values frame with the dimensions of its rows (`dims`: rid and the DIMENSIONS, from `_frame`'s reader)."""
    if frame.get_column("rid").equals(dims.get_column("rid")):  # the same scan order: no join to pay
        both = frame.hstack(dims.drop("rid").get_columns())
    else:
        both = frame.join(dims, on="rid", how="left", maintain_order="left")
    first = ["rid", "start_ns", "e2e_ns", "value", *X.DIMENSIONS]
    return both.select(first + [c for c in both.columns if c not in first])


def _enum_of(column: str, values: list[Any] | None) -> str:
    """`column` (text) cast to a DuckDB ENUM of `values` (NULL stays NULL), or as it is when it has no value."""
    labels = sorted({str(v) for v in values or [] if v is not None})
    if not labels:
        return quote_ident(column)
    listed = ", ".join("'" + v.replace("'", "''") + "'" for v in labels)
    return f"CAST({quote_ident(column)} AS ENUM({listed})) AS {quote_ident(column)}"


def weights_of(frame: pl.DataFrame) -> np.ndarray | None:
    """The adjusted count of each frame row, or None when the values are unsampled (every weight 1)."""
    if "weight" not in frame.columns:
        return None
    return frame.get_column("weight").to_numpy().astype(np.float64, copy=False)


def values_of(frame: pl.DataFrame) -> np.ndarray:
    """The frame's metric values as float64: the frame's own buffer, no copy of millions of rows; read-only,
    so a step writing into it fails instead of changing the frame under the others."""
    values = frame.get_column("value").to_numpy().astype(np.float64, copy=False)
    values.flags.writeable = False
    return values


def rows_in_windows(start: np.ndarray, windows: np.ndarray, window_ns: int) -> np.ndarray:
    """Positions of the rows whose start is in one of the `windows` (window numbers: start // window_ns), ascending:
    `np.flatnonzero(np.isin(start // window_ns, windows))`. For rows in start order (the report's frame) by
    bisection, a slice per window, instead of a look-up of every row."""
    start = np.asarray(start)
    windows = np.asarray(windows, dtype=np.int64)
    if start.size > 1 and not bool(np.all(start[1:] >= start[:-1])):
        return np.flatnonzero(np.isin(start // window_ns, windows))
    mask = np.zeros(start.size, dtype=bool)
    lo = windows * window_ns  # window k holds the starts in [k w, (k + 1) w)
    for a, b in zip(np.searchsorted(start, lo, side="left").tolist(),
                    np.searchsorted(start, lo + window_ns, side="left").tolist(), strict=True):
        mask[a:b] = True
    return np.flatnonzero(mask)


def _effective(weights: np.ndarray | None, rows: np.ndarray | None = None, n: int = 0) -> float:
    if weights is None:
        return float(n if rows is None else rows.size)
    w = weights if rows is None else weights[rows]
    total, squares = float(w.sum()), float(np.square(w).sum())
    return round(total * total / squares, 3) if squares else 0.0



def _prepare(con: duckdb.DuckDBPyConnection, ask: Ask) -> tuple[C.Report, Rows | None]:
    """The report's header and, when detection could run, the rows every explanation step reads (`Rows`, its
    `coded` the frame's DIMENSIONS coded for the explanation, None unless `ask.explain`).

    The sampling records are read from `spans` (sampling.recorded_flags). `explain=False`
    (find_spikes): nothing will read the rows' ids or dimensions; a caller's `source` that is unsampled
    in range under the auto policy (no sampling judgement either) is then copied without them.
    `rules`: which dimensions to consider (None: every one; the report's `attributes` object says
    which attributes were considered and which skipped, and why).
    """
    metric, window_s, since, until = ask.metric, ask.window_s, ask.since, ask.until
    include_failures, source, sampling_policy = ask.include_failures, ask.source, ask.sampling_policy
    explain, rules = ask.explain, ask.rules
    if metric not in REPORT_METRICS:
        raise QueryError("", f"unknown report metric {metric!r}; use one of {', '.join(REPORT_METRICS)}")
    if sampling_policy not in SM.POLICIES:
        raise QueryError("", f"unknown sampling policy {sampling_policy!r}; use one of {', '.join(SM.POLICIES)}")
    since_ns, until_ns = parse_time(since), parse_time(until)
    win = parse_duration(window_s) if window_s is not None else None
    detection_only = (not explain and source is not None and sampling_policy == "auto"
                      and weight_column(con, source, since_ns, until_ns) is None)
    frame, read_dims, counts, facts, weighted = _frame_parts(con, metric, since_ns, until_ns, include_failures,
                                                             source, detection_only, ask.only)
    first_ns, last_ns = counts.pop("first_ns"), counts.pop("last_ns")
    if win is None:  # as choose_window_s: from the request rate over the range asked (or seen)
        lo = since_ns if since_ns is not None else first_ns
        hi = until_ns if until_ns is not None else last_ns + 1
        win = auto_window_s(counts["requests"], max(hi - lo, 1) / 1e9)
    window_ns = round(win * 1e9)
    weights = weights_of(frame)
    report = report_header(metric, win, counts, include_failures, since_ns, until_ns, frame.height, weighted,
                           weights)
    start = frame.get_column("start_ns").to_numpy()
    values = values_of(frame)
    det: Detection | None = None
    coded: list[X.Coded] | None = None
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tailscope-report") as pool:
        # DuckDB reads the dimensions (releasing the GIL) while detection runs on the values; nothing else
        # uses the connection until the read is joined. They are aligned to the values' rows on that thread
        # too, so their row ids are freed there, and coded for the explanation (numpy and polars, the GIL
        # mostly released), which would otherwise wait for detection to end.
        dims = pool.submit(_coded_dims, con, frame, read_dims, rules or A.AttributeRules(), since_ns, until_ns,
                           source is None) if explain else None
        if frame.height == 0:
            report["errors"].append(f"could not compute spikes because no request has a {metric} value in range")
        else:
            try:
                det = detect(start, values, window_ns, weights=weights)
            except Exception as exc:
                report["errors"].append(f"could not compute spikes because {exc}")
        if dims is not None:
            frame, coded, attributes = dims.result()
            report["attributes"] = attributes
            if report["attributes"] is not None:
                report["errors"].extend(report["attributes"]["errors"])
    if det is None:
        return report, None
    report["windows"] = int(det.n.size)
    report["baseline_p50_ms"] = ms(det.baseline_p50_ns)
    report["baseline_p99_ms"] = ms(det.baseline_p99_ns)
    if det.baseline.any():
        base_wins = (det.window_start_ns // det.window_ns)[det.baseline]
        base_rows = rows_in_windows(start, base_wins, det.window_ns)
        report["baseline_effective"] = _effective(weights, base_rows)
    if weights is not None or sampling_policy != "auto":
        try:
            _judge_sampling(con, facts, frame, values, weights, report, sampling_policy)
        except Exception as exc:
            report["errors"].append(f"could not judge the sampling because {str(exc).splitlines()[0]}")
    if det.note:
        report["errors"].append(f"could not compute spikes because {det.note}")
    rows = Rows.of(con, facts, frame, det, metric, coded=coded,
                   read_dims=None if explain or detection_only else read_dims)
    if explain:
        culprit_bounds(rows)
    return report, rows


def _coded_dims(con: duckdb.DuckDBPyConnection, values_only: pl.DataFrame, read: Callable[[], pl.DataFrame],
                rules: A.AttributeRules, since_ns: int | None, until_ns: int | None, store_rows: bool
                ) -> tuple[pl.DataFrame, list[X.Coded], C.Attributes]:
    """(the values frame with its rows' dimensions, the dimensions `rules` keeps coded for the explanation, the
    report's `attributes` object). `read`: the frame's reader of its dimensions (`_frame_parts`); `store_rows`: the
    facts are the store's own (their attribute values are read from the hours' files)."""
    both = _with_dims(values_only, read())
    builtin = [X.code_dimension(both, d) for d in X.DIMENSIONS]
    facts_rows, params = read.facts_rows  # type: ignore[attr-defined]
    attrs = _attribute_dims(con, facts_rows, params, both, builtin, rules, since_ns, until_ns, store_rows=store_rows)
    kept = [c for c in builtin if rules.ruled_out(c.name) is None]
    return both, kept + attrs.coded, cast(C.Attributes, attrs.to_json())


def _attribute_dims(con: duckdb.DuckDBPyConnection, facts_rows: str, params: dict[str, Any], frame: pl.DataFrame,
                    builtin: list[X.Coded], rules: A.AttributeRules, since_ns: int | None,
                    until_ns: int | None, store_rows: bool = False) -> A.Attributes:
    """The attribute dimensions of the frame's rows (analysis.attributes; `facts_rows`: a query of their facts rows,
    rid, trace_id, span_id and start_ns), the built-ins the rules leave out listed as skipped; an error (say, a
    caller's source without span ids) is recorded, never raised. `store_rows`: the rows are the store's own (their
    ids name a materialized hour's file and row), so the values written with those hours are read."""
    out = A.Attributes()
    try:
        replica = next((c for c in builtin if c.name == "replica"), None)
        rid = frame.get_column("rid").to_numpy().astype(np.int64)
        stored = AV.stored_values(con, rid, ROW_ID_FILE_SHIFT) if store_rows else None
        out = A.read_attributes(con, facts_rows, params, rid, replica, builtin, rules, since_ns, until_ns,
                                stored=stored)
    except duckdb.Error as exc:
        out.errors.append(f"could not read the attributes because {str(exc).splitlines()[0]}")
    skip_ruled_out_builtins(out, [c.name for c in builtin], rules)
    return out


def skip_ruled_out_builtins(out: A.Attributes, names: list[str], rules: A.AttributeRules) -> None:
    """List the built-in dimensions `rules` leave out as skipped (by pattern), first in `out.skipped`."""
    for name in names:
        why = rules.ruled_out(name)
        if why is not None:
            out.skipped.insert(0, {"attribute": None, "dimension": name, "source": "builtin",
                                   "reason": "pattern", "why": why})


def report_header(metric: str, win: float, counts: dict[str, int], include_failures: bool, since_ns: int | None,
                  until_ns: int | None, values: int, weighted: dict[str, float] | None,
                  weights: np.ndarray | None) -> C.Report:
    """The report's keys before detection; `counts` holds `requests` and the outcome counts (taken from it).
    Its sampling keys: `sampled`, the `weighted` counts beside the counts, and the effective counts of the
    values' `weights` (None: unweighted)."""
    requests = counts.pop("requests")
    return {
        "version": REPORT_VERSION, "metric": metric,
        "window_s": int(win) if float(win).is_integer() else win,
        "requests": requests, "outcomes": counts,
        "include_failures": include_failures,
        "since": iso(since_ns) if since_ns is not None else None,
        "until": iso(until_ns) if until_ns is not None else None,
        "percentile_convention": "quantile_cont (linear interpolation)",
        "values": values, "windows": 0, "baseline_p50_ms": None, "baseline_p99_ms": None,
        "spikes": [], "errors": [], "attributes": None,
        "sampled": weighted is not None,
        "requests_weighted": float(requests) if weighted is None else weighted["requests"],
        "outcomes_weighted": ({k: float(v) for k, v in counts.items()} if weighted is None
                              else {k: weighted[k] for k in counts}),
        "values_weighted": float(values) if weights is None else float(weights.sum()),
        "values_effective": _effective(weights, n=values),
        "baseline_effective": None,
        "sampling": None, "warnings": [],
    }


def _judge_sampling(con: duckdb.DuckDBPyConnection, facts: str, frame: pl.DataFrame, values: np.ndarray,
                    weights: np.ndarray | None, report: C.Report, policy: str) -> None:
    """Fill the report's `sampling` object and, for tail-based sampling, the warning that percentiles are biased."""
    w = np.ones(values.size) if weights is None else weights
    rids = frame.get_column("rid").to_numpy()
    recorded, malformed = SM.recorded_flags(con, facts, rids)
    failed = (frame.get_column("status").to_numpy() != "ok") if "status" in frame.columns else np.zeros(
        values.size, dtype=bool)
    record_sampling(report, SM.judge(SM.Arrays(values, w, failed, recorded, malformed), policy))


def record_sampling(report: C.Report, view: SM.SamplingView) -> None:
    """The report's `sampling` object and, for tail-based sampling, the warning that percentiles are biased."""
    report["sampling"] = cast(C.Sampling, view.to_json())
    note = view.warning()
    if note:
        report["warnings"].append(note)


def attribute_rules(dimensions: str | tuple[str, ...] | None = None,
                    exclude_dimensions: str | tuple[str, ...] | None = None) -> A.AttributeRules:
    """The dimension patterns of a report: the arguments, else the settings (`EXPLAIN.dimensions`,
    `EXPLAIN.exclude_dimensions`: their environment variables); the settings' exclusions always apply."""
    include = A.AttributeRules.parse(dimensions) or A.AttributeRules.parse(EXPLAIN.dimensions.resolve())
    exclude = A.AttributeRules.parse(exclude_dimensions) + A.AttributeRules.parse(EXPLAIN.exclude_dimensions.resolve())
    return A.AttributeRules(include, exclude)


def build_report(
    con: duckdb.DuckDBPyConnection,
    metric: str = "e2e",
    window_s: float | str | None = None,
    since: str | int | datetime | None = None,
    until: str | int | datetime | None = None,
    include_failures: bool = True,
    source: str | None = None,
    sampling_policy: str = "auto",
    dimensions: str | tuple[str, ...] | None = None,
    exclude_dimensions: str | tuple[str, ...] | None = None,
    only: Mapping[str, Sequence[str]] | None = None,
) -> C.Report:
    """Find the p99 spikes of `metric` in [since, until) and explain each; the `report --json` contract.

    `source` (a table or view name, or a parenthesised query) holds the requests to analyse,
    with the request-fact columns of `analysis.engine.percentiles.request_facts` (trace_id, start_ns,
    e2e_ns, status, the DIMENSIONS, and ttft_ns / tpot_ns for those metrics); by default the
    facts of the whole store. Stage shares are always read from the connection's `spans`.
    `sampling_policy`: `auto` (judge tail-based sampling from the data), `head` or `tail` (declared).
    `dimensions` / `exclude_dimensions`: glob patterns (comma-separated) of the dimensions to consider / leave out
    (attribute keys or built-in names; the settings' `dimensions` / `exclude_dimensions` when None).
    `only` ({filter dimension: values}): only the requests whose dimension is one of the values, read in place
    from the facts (the same answer as a `source` holding just those requests, without copying them).
    """
    report, rows = _prepare(con, Ask(metric, window_s, since, until, include_failures, source, sampling_policy,
                                     rules=attribute_rules(dimensions, exclude_dimensions), only=only_pairs(only)))
    if rows is None:
        return report
    report["spikes"] = explain_all(rows, rows.det.spikes)
    for item in report["spikes"]:
        report["errors"].extend(item["errors"])
    return report


def find_spikes(
    con: duckdb.DuckDBPyConnection,
    metric: str = "e2e",
    window_s: float | str | None = None,
    since: str | int | datetime | None = None,
    until: str | int | datetime | None = None,
    include_failures: bool = True,
    source: str | None = None,
    sampling_policy: str = "auto",
    only: Mapping[str, Sequence[str]] | None = None,
) -> C.Report:
    """`build_report` without the explanations: the same header, and each spike's item without the keys
    the explanation fills (stages, dimensions, exemplars, noisy_neighbour, errors).

    For a view that only marks the spikes (the dashboard's Overview): detection is most of the
    report's cost on a large store, the explanations the rest. The spikes are the report's own: when detection
    found one, its bounds are its culprit's (`culprit_bounds`), which reads the dimensions of the same rows then
    (detection runs once); a caller's `source` copied without them (`_snapshot`) is read again with them
    (detection then runs twice on a range with a spike).
    """
    ask = Ask(metric, window_s, since, until, include_failures, source, sampling_policy, explain=False,
              only=only_pairs(only))
    report, rows = _prepare(con, ask)
    if rows is not None and rows.det.spikes and rows.read_dims is not None:  # the same rows and detection, coded
        frame, coded, _ = _coded_dims(con, rows.frame, rows.read_dims, attribute_rules(), parse_time(since),
                                      parse_time(until), source is None)
        rows = Rows.of(con, rows.facts, frame, rows.det, metric, coded=coded)
        culprit_bounds(rows)
    elif rows is not None and rows.det.spikes:  # the header and errors stay detection's (`marks_of`)
        rows = _prepare(con, dataclasses.replace(ask, explain=True, rules=attribute_rules()))[1]
    if rows is not None:
        report["spikes"] = [cast(C.Spike, {k: v for k, v in _spike_json(s).items() if k in MARK_KEYS})
                            for s in rows.det.spikes]
    return report


#: The keys of a spike item of find_spikes: the report item's window, counts and percentiles, before its explanation.
MARK_KEYS: Final = frozenset({"start", "end", "requests", "p50_ms", "p99_ms", "baseline_p50_ms", "baseline_p99_ms",
                              "excess_ms", "p_value", "windows", "requests_weighted", "n_effective"})


def marks_of(report: C.Report) -> C.Report:
    """What `find_spikes` answers for the same ask, taken from `build_report`'s answer: its header with `attributes`
    null and the errors detection gave (the report's without its attribute pass's and its explanations' own), each
    spike's item cut to MARK_KEYS. A caller that needs both (a page showing the spikes and explaining them) detects
    once; tests/analysis/test_find_spikes.py holds it equal to find_spikes."""
    spikes = report["spikes"]
    errors = list(report["errors"])
    explained = sum(len(item.get("errors", [])) for item in spikes)
    errors = errors[:len(errors) - explained]  # the explanations' errors come last, spike by spike
    attrs = report["attributes"]["errors"] if report["attributes"] is not None else []
    for at in range(len(errors) - len(attrs) + 1) if attrs else ():  # the attribute pass's: one run after detection's
        if errors[at:at + len(attrs)] == attrs:
            del errors[at:at + len(attrs)]
            break
    out = cast(C.Report, {**report, "attributes": None, "errors": errors})
    out["spikes"] = [cast(C.Spike, {k: v for k, v in item.items() if k in MARK_KEYS}) for item in spikes]
    return out


def explain_window(
    con: duckdb.DuckDBPyConnection,
    start: str | int | datetime,
    end: str | int | datetime,
    metric: str = "e2e",
    window_s: float | str | None = None,
    since: str | int | datetime | None = None,
    until: str | int | datetime | None = None,
    include_failures: bool = True,
    source: str | None = None,
    sampling_policy: str = "auto",
    dimensions: str | tuple[str, ...] | None = None,
    exclude_dimensions: str | tuple[str, ...] | None = None,
    only: Mapping[str, Sequence[str]] | None = None,
) -> C.Spike:
    """Explain the requests starting in [start, end) as the report explains a spike, whether or not it is one.

    Detection runs over [since, until) exactly as in `build_report` (same windows, same
    baseline); the window is then compared with the report's baseline windows that do not
    overlap it (for a detected spike: the report's own baseline, so every figure equals the
    report's). Returns the report's spike object (start, end, requests, p50_ms, p99_ms,
    baseline_p50_ms, baseline_p99_ms, excess_ms, windows, stages, dimensions, exemplars,
    candidates_tested, tail_requests, errors) with `p_value` null (no test is made) and
    `detected` true when the window is exactly one of the report's spikes. `only`: as in `build_report`.
    """
    start_ns, end_ns = parse_time(start), parse_time(end)
    assert start_ns is not None and end_ns is not None
    report, rows = _prepare(con, Ask(metric, window_s, since, until, include_failures, source, sampling_policy,
                                     rules=attribute_rules(dimensions, exclude_dimensions), only=only_pairs(only)))
    empty = window_not_explained(start_ns, end_ns, report["errors"])
    if rows is None:
        return empty
    det, starts, values, weights = rows.det, rows.start, rows.values, rows.weights
    for spike in det.spikes:
        if (spike.start_ns, spike.end_ns) == (start_ns, end_ns):  # a detected spike: the report's item
            item = explain_all(rows, [spike])[0]
            item["detected"] = True
            return item
    overlap = (det.window_start_ns < end_ns) & (det.window_start_ns + det.window_ns > start_ns)
    det = dataclasses.replace(det, baseline=det.baseline & ~overlap, spikes=[])
    base_wins = (det.window_start_ns // det.window_ns)[det.baseline]
    base_rows = rows_in_windows(starts, base_wins, det.window_ns)
    inside_rows = np.flatnonzero((starts >= start_ns) & (starts < end_ns))
    det.baseline_p50_ns = X.weighted_q(values, weights, base_rows, 0.5)
    det.baseline_p99_ns = X.weighted_q(values, weights, base_rows, 0.99)
    inside = values[inside_rows]
    if inside.size == 0 or base_rows.size == 0:
        empty["errors"].append("could not explain the window because "
                               + ("no request with a value starts in it" if inside.size == 0
                                  else "no baseline window lies outside it"))
        empty["requests"] = int(inside.size)
        return empty
    spike = Spike(start_ns=start_ns, end_ns=end_ns, requests=int(inside.size),
                  p50_ns=X.weighted_q(values, weights, inside_rows, 0.5),
                  p99_ns=X.weighted_q(values, weights, inside_rows, 0.99), baseline_p50_ns=det.baseline_p50_ns,
                  baseline_p99_ns=det.baseline_p99_ns, p_value=math.nan, windows=int(overlap.sum()),
                  requests_weighted=float(inside.size if weights is None else weights[inside_rows].sum()),
                  n_effective=_effective(weights, inside_rows))
    item = explain_all(dataclasses.replace(rows, det=det), [spike])[0]
    item["detected"] = False
    return item


def window_not_explained(start_ns: int, end_ns: int, errors: list[str]) -> C.Spike:
    """explain_window's item when the window cannot be explained (the errors say why)."""
    return {"start": iso(start_ns), "end": iso(end_ns), "requests": 0, "p50_ms": None, "p99_ms": None,
            "baseline_p50_ms": None, "baseline_p99_ms": None, "excess_ms": None, "p_value": None,
            "windows": 0, "detected": False, "stages": [], "dimensions": [], "exemplars": [],
            "requests_weighted": 0.0, "n_effective": 0.0, "errors": list(errors)}


def _trace_ids(con: duckdb.DuckDBPyConnection, facts: str, frame: pl.DataFrame, rows: np.ndarray) -> list[str]:
    """Trace ids of frame rows (the frame carries the facts' rid, not the 32-character ids)."""
    rids = frame.get_column("rid").to_numpy()[rows].tolist()
    found = facts_by_rid(con, facts, rids, start_ns=frame.get_column("start_ns").to_numpy()[rows])
    return [str(found[r][0]) for r in rids]


def local_baseline(det: Detection, spike: Spike, counts_by_window: dict[int, int]) -> np.ndarray:
    """Window starts (ns) of the baseline windows nearest the spike, holding at least as many requests."""
    base = det.window_start_ns[det.baseline]
    dist = np.maximum(spike.start_ns - (base + det.window_ns), base - spike.end_ns)
    chosen: list[int] = []
    total = 0
    for i in np.argsort(dist, kind="stable"):
        chosen.append(int(base[i]))
        total += counts_by_window[int(base[i])]
        if total >= spike.requests and len(chosen) >= 2:
            break
    return np.asarray(chosen, dtype=np.int64)


#: Per window of a detection: the requests slower than its baseline p99 that match a candidate, and all of them
#: (kept requests): what `culprit_bounds` tests. A remote engine counts them on its server.
SlowCounts = Callable[[list[X.Coded], X.Candidate], tuple[np.ndarray, np.ndarray]]


def culprit_bounds(rows_: Rows, slow_counts: SlowCounts | None = None) -> bool:
    """Move each of `rows_.det.spikes` to its culprit's windows (`analysis.stats.bounds`); whether any moved.

    The culprit is the first dimension ranked on the detected windows (as the explanation ranks them); the moved
    stretch must pass the detection's effect-size rules (`spikes.judge_stretch`: the p99 rise, the p50 held),
    else the detected one stays; its p-value is its own. `slow_counts`: the counts per window (None: from the
    rows, which then hold every request).
    """
    det = rows_.det
    if not det.spikes:
        return False
    start, values, weights = rows_.start, rows_.values, rows_.weights
    wins = det.window_start_ns // det.window_ns
    base = rows_in_windows(start, wins[det.baseline], det.window_ns).astype(np.int64)
    coding = _Coding(rows_.frame, values, base, weights, rows_.rest, rows_.coded, rows_.attributes, rows_.ranked,
                     rows_.spike_rows)
    if slow_counts is None:
        slow = np.flatnonzero(values > det.baseline_p99_ns)
        slow_at = np.searchsorted(wins, start[slow] // det.window_ns)

        def slow_counts(coded: list[X.Coded], cand: X.Candidate) -> tuple[np.ndarray, np.ndarray]:
            return (np.bincount(slow_at[X.candidate_mask(coded, cand, slow)], minlength=wins.size),
                    np.bincount(slow_at, minlength=wins.size))

    index = {int(w): i for i, w in enumerate(wins.tolist())}
    runs = [list(range(index[s.start_ns // det.window_ns], index[(s.end_ns - 1) // det.window_ns] + 1))
            for s in det.spikes]
    moved: list[Spike] = []
    for n, (spike, run) in enumerate(zip(det.spikes, runs, strict=True)):
        ranked = coding.ranked(spike, *spike_parts(rows_, spike))[1][0]
        if not ranked:
            moved.append(spike)
            continue
        k, m = (np.asarray(x, dtype=np.int64) for x in slow_counts(coding.coded, ranked[0]))
        others = np.zeros(wins.size, dtype=bool)
        for other in runs[:n] + runs[n + 1:]:
            others[other] = True
        lo, hi = B.culprit_stretch(run[0], run[-1], k, m, int(k[det.baseline].sum()), int(m[det.baseline].sum()),
                                   det.baseline, det.judged & ~others, wins, X.ALPHA)
        # the spike was found significant on its detected windows: the moved stretch keeps the effect-size rules
        judged = judge_stretch(det, list(range(lo, hi + 1)), alpha=1.0) if (lo, hi) != (run[0], run[-1]) else None
        if judged is not None:
            det.significant[run] = False
            det.significant[lo:hi + 1] = True
            runs[n] = list(range(lo, hi + 1))
        moved.append(judged or spike)
    changed = any(a is not b for a, b in zip(moved, det.spikes, strict=True))
    det.spikes = sorted(moved, key=lambda sp: (-sp.excess_ns, sp.start_ns))
    return changed


def _stages_for(rows_: Rows, spike: Spike, spike_tail: X.Part, stage_names: tuple[str, ...]
                ) -> list[C.StageShare]:
    con, facts, frame, start, values, det = rows_.con, rows_.facts, rows_.frame, rows_.start, rows_.values, rows_.det
    weights = rows_.weights
    counts = dict(zip(det.window_start_ns.tolist(), det.n.tolist(), strict=True))
    local = local_baseline(det, spike, counts)
    if rows_.stages is not None:  # a remote engine's: both tails and every span stay there
        return rows_.stages(spike, local, stage_names)
    assert not isinstance(spike_tail, X.Counted), "a remote engine's spike rows need its stage shares"
    e2e = frame.get_column("e2e_ns").to_numpy()
    local_rows = rows_in_windows(start, local // det.window_ns, det.window_ns).astype(np.int64)
    base_tail = X.tail_slice(values, local_rows, weights=weights)
    rows = np.concatenate([spike_tail, base_tail])
    lo = int(start[rows].min() - e2e[rows].max())  # a span overlapping a request starts after this
    hi = int((start[rows] + e2e[rows]).max() + 1)
    ids = _trace_ids(con, facts, frame, rows)
    table = X.stage_rows(con, sorted(set(ids)), lo, hi)
    tail_ids = pl.DataFrame({"trace_id": ids[:spike_tail.size]})
    base_ids = pl.DataFrame({"trace_id": ids[spike_tail.size:]})
    if weights is not None:  # each trace's stage times weigh its request's adjusted count
        tail_ids = tail_ids.with_columns(weight=pl.Series(weights[spike_tail])).unique("trace_id", keep="first")
        base_ids = base_ids.with_columns(weight=pl.Series(weights[base_tail])).unique("trace_id", keep="first")
        return cast(list[C.StageShare], X.stage_shares(table.join(tail_ids, on="trace_id", how="inner"),
                                                       table.join(base_ids, on="trace_id", how="inner"), stage_names))
    return cast(list[C.StageShare], X.stage_shares(table.join(tail_ids, on="trace_id", how="semi"),
                                                   table.join(base_ids, on="trace_id", how="semi"), stage_names))


def explain_all(rows_: Rows, spikes: list[Spike]) -> list[C.Spike]:
    """The report's item of each spike: stages, ranked dimensions, exemplars, against the baseline of `rows_.det`.

    `rows_.neighbours`: a remote engine's figures for the noisy-neighbour step (else read over `spans` and the
    facts: `neighbours.InMemory`).
    `rows_.rest` (a remote engine's): baseline requests left out of the frame as counts per combination of
    dimension values (a frame of X.DIMENSIONS and `n`, and `w` their summed weights when weighted, token columns
    holding any value of their bucket), a reader of their values outside a candidate and the baseline's (weighted)
    p99 with and without a candidate (X.BaselineTail); the frame must then hold every baseline request of the
    windows the steps read row by row. `rows_.coded`: the frame's DIMENSIONS already coded (`_prepare`), else
    coded here. `rows_.attributes` (with `rest`): the remote engine's attribute dimensions and the rules.
    """
    if not spikes:
        return []
    con, facts, frame, start, values, det = rows_.con, rows_.facts, rows_.frame, rows_.start, rows_.values, rows_.det
    metric, rest, coded, weights = rows_.metric, rows_.rest, rows_.coded, rows_.weights
    attributes = rows_.attributes
    base_wins = (det.window_start_ns // det.window_ns)[det.baseline]
    base = rows_in_windows(start, base_wins, det.window_ns).astype(np.int64)
    stage_names = X.BEFORE_FIRST_TOKEN if metric == "ttft" else S.CRITICAL_PATH_COLUMNS
    parts = [spike_parts(rows_, s) for s in spikes]
    rows_of, tails = [r for r, _ in parts], [t for _, t in parts]

    def stages_of(spike: Spike, tail: X.Part) -> list[C.StageShare] | str:
        # a spike's stage shares, or why they could not be computed
        try:
            return _stages_for(rows_, spike, tail, stage_names)
        except Exception as exc:
            return f"could not compute stages because {str(exc).splitlines()[0]}"

    local = rows_.neighbours is None and rest is None
    found: list[list[C.StageShare] | str] = []
    dims: list[tuple[C.Spike, np.ndarray | X.Candidate | None]] = []
    if local:
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tailscope-report") as pool:
            # the stage shares are DuckDB reads of `spans` (the GIL released): they run on a second thread
            # while the dimensions are coded, contrasted and counterfactually removed here, in numpy; the
            # connection is that thread's alone until it is joined
            stages = pool.submit(lambda: [stages_of(sp, tail) for sp, tail in zip(spikes, tails, strict=True)])
            coding = _Coding(frame, values, base, weights, rest, coded, attributes, rows_.ranked)
            dims = [coding.dimensions(sp, rows, tail) for sp, rows, tail in zip(spikes, rows_of, tails, strict=True)]
            found = stages.result()
    else:
        coding = _Coding(frame, values, base, weights, rest, coded, attributes, spike_rows=rows_.spike_rows)
    out = []
    for n, (spike, rows, tail) in enumerate(zip(spikes, rows_of, tails, strict=True)):
        # a remote engine's figures and counts are read through one client: one step after the other, spike by spike
        stage = found[n] if local else stages_of(spike, tail)
        item, best_mask = dims[n] if local else coding.dimensions(spike, rows, tail)
        if isinstance(stage, str):
            item["errors"].insert(0, stage)
        else:
            item["stages"] = stage
        try:
            if isinstance(rows, X.Counted):
                assert rows_.spike_rows is not None and not isinstance(best_mask, np.ndarray)
                item["exemplars"] = rows_.spike_rows.exemplars(spike, coding.coded, best_mask)
            else:
                assert not isinstance(best_mask, X.Candidate)
                item["exemplars"] = _trace_ids(con, facts, frame, X.exemplar_rows(values, rows, spike.p99_ns,
                                                                                  best_mask))
        except Exception as exc:
            item["errors"].append(f"could not compute exemplars because {exc}")
        figures = rows_.neighbours if rows_.neighbours is not None else N.InMemory(con, facts, frame)
        item["noisy_neighbour"] = cast(C.NoisyNeighbour | None,
                                       N.for_report(figures, det, spike, cast(dict[str, Any], item)))
        out.append(item)
    return out


class _Coding:
    """The dimensions of a frame coded once, and each spike's ranked dimensions from them (numpy only, `rest`'s
    reader aside: no connection)."""

    def __init__(self, frame: pl.DataFrame, values: np.ndarray, base: np.ndarray, weights: np.ndarray | None,
                 rest: RestCounts | None, coded: list[X.Coded] | None = None,
                 attributes: RemoteAttributes | None = None, memo: dict[tuple[int, int, int], Any] | None = None,
                 spike_rows: SpikeRows | None = None) -> None:
        """`base`: the baseline's rows; `rest`, `attributes`: as `explain_all`'s; `coded`: the frame's DIMENSIONS
        coded (by `X.code_dimension`), when already done; `memo` (`Rows.ranked`, with `coded` given and no `rest`):
        the rankings made, kept for another coding of the same rows; `spike_rows`: a remote engine's (`Rows`)."""
        self.memo = memo if coded is not None and rest is None and attributes is None else None
        self.spike_rows = spike_rows
        self.values, self.base, self.weights = values, base, weights
        self.rest: X.Rest | None = None
        self.remote: RemoteAttributes | None = attributes
        #: the first dimension the remote engine counts (None: the first attribute)
        self.remote_from: int | None = None
        self.base_q: X.BaselineTail
        if rest is None:
            self.coded = coded if coded is not None else [X.code_dimension(frame, d) for d in X.DIMENSIONS]
            self.base_q = X.TailQuantile(values[base], base)
        else:  # code rows and combinations together: the same labels as over every row
            combos, read_values, self.base_q = rest
            if attributes is not None and attributes.builtin is not None:  # every dimension on the engine: the
                # baseline is the rest's one combination, no row of it read here
                self.coded = [c for c in attributes.builtin if attributes.rules.ruled_out(c.name) is None]
                self.coded += attributes.coded
                combo_codes: list[np.ndarray] = []
                self.remote_from, self.base = 0, np.zeros(0, dtype=np.int64)
            else:
                self.coded, combo_codes = X.code_with_counts(frame, combos)
                if attributes is not None:  # the built-ins the rules keep, then the attributes
                    kept = [i for i, c in enumerate(self.coded) if attributes.rules.ruled_out(c.name) is None]
                    self.coded = [self.coded[i] for i in kept] + attributes.coded
                    combo_codes = [combo_codes[i] for i in kept]
            self.rest = X.Rest(combo_codes, combos.get_column("n").to_numpy(),
                               lambda cand: read_values(self.coded, cand),
                               combos.get_column("w").to_numpy() if "w" in combos.columns else None)

    def ranked(self, spike: Spike, rows: X.Part, tail: X.Part, cut: list[dict[str, Any]] | None = None
               ) -> tuple[X.Part, tuple[list[X.Candidate], list[X.Candidate], list[X.Candidate], int]]:
        """The spike's tail (its rows above the baseline p99, or `tail` when fewer than MIN_TAIL_SLICE) and
        `rank_dimensions` of it (`cut`: receives the pairs left out for their size)."""
        values, remote = self.values, self.remote
        key = (int(spike.start_ns), int(spike.end_ns), int(spike.baseline_p99_ns))
        hit = self.memo.get(key) if self.memo is not None else None
        excess_rows: X.Part
        if isinstance(rows, X.Counted) or isinstance(tail, X.Counted):  # a remote engine's: figures asked there
            assert self.spike_rows is not None and isinstance(tail, X.Counted)
            excess_rows = self.spike_rows.excess(spike, tail)
        elif (hit is not None and hit[0] is self.coded and np.array_equal(hit[1], self.base)
                and np.array_equal(hit[2], rows) and np.array_equal(hit[3], tail)):
            if cut is not None:
                cut.extend(hit[5])
            return cast(tuple[X.Part, tuple[list[X.Candidate], list[X.Candidate], list[X.Candidate], int]],
                        hit[4])
        else:
            excess_rows = rows[values[rows] > spike.baseline_p99_ns]
            if excess_rows.size < X.MIN_TAIL_SLICE:
                excess_rows = tail
        left_out: list[dict[str, Any]] = []
        out = excess_rows, rank_dimensions(
            self.coded, values, rows, excess_rows, self.base, self.base_q, self.weights, self.rest,
            remote.cells if remote is not None else None, remote.overlap if remote is not None else None, left_out,
            remote.spike_without if remote is not None else None, self.remote_from)
        if cut is not None:
            cut.extend(left_out)
        if self.memo is not None:
            self.memo[key] = (self.coded, self.base, rows, tail, out, left_out)
        return out

    def _best_mask(self, spike: Spike, rows: np.ndarray, best: X.Candidate) -> np.ndarray:
        """Which of the spike's `rows` match the best candidate, as the exemplars read it: a remote engine's test
        over the exemplar pool when the candidate holds an attribute (whose codes stay there)."""
        if self.remote is None or (self.remote_from is None
                                   and all(self.coded[i].source == "builtin" for i in best.dims)):
            return X.candidate_mask(self.coded, best, rows)
        pool = X.exemplar_pool(self.values, rows, spike.p99_ns)
        mask = np.zeros(rows.size, dtype=bool)
        mask[np.searchsorted(rows, pool)] = self.remote.prefer(self.coded, best, pool, X.MAX_EXEMPLARS)
        return mask

    def dimensions(self, spike: Spike, rows: X.Part, tail: X.Part
                   ) -> tuple[C.Spike, np.ndarray | X.Candidate | None]:
        """The spike's item with its ranked dimensions (or the error saying why not) and the mask of its best
        candidate over `rows`, the spike's rows (None without one; the candidate itself when they stay on a remote
        engine, `Rows.spike_rows`); `tail`: their tail slice."""
        weights, coded = self.weights, self.coded
        item = _spike_json(spike)
        item["errors"] = []
        best_mask: np.ndarray | X.Candidate | None = None
        try:
            cut: list[dict[str, Any]] = []
            excess_rows, (ranked, finer, coarser, tested) = self.ranked(spike, rows, tail, cut)
            item["dimensions"] = [cast(C.Dimension, X.candidate_json(coded, c)) for c in ranked]
            for d, under in zip(item["dimensions"], A.folded_under(ranked), strict=True):
                if under is not None:  # a pair that restates a value ranked before it
                    d["folded_under"] = under
            if item["dimensions"]:
                item["dimensions"][0]["finer"] = [_level_json(coded, c) for c in finer]
                item["dimensions"][0]["coarser"] = [_level_json(coded, c) for c in coarser]
            item["candidates_tested"] = tested
            item["pairs_cut"] = cast(list[C.PairCut], cut)
            # beside the kept counts, what they stand for and their effective count (equal when unsampled)
            if isinstance(excess_rows, X.Counted):
                n_tail, tail_w = excess_rows.n, excess_rows.weight
                effective = float(n_tail) if tail_w is None else round(excess_rows.effective or 0.0, 3)
            else:
                n_tail = int(excess_rows.size)
                tail_w = None if weights is None else float(weights[excess_rows].sum())
                effective = _effective(weights, excess_rows)
            item["tail_requests"] = n_tail
            item["tail_requests_weighted"] = float(n_tail) if tail_w is None else round(tail_w, 3)
            item["tail_effective"] = effective
            for d, c in zip(item["dimensions"], ranked, strict=True):
                d["support_weighted"] = float(c.tail_count) if tail_w is None else round(c.tail_share * tail_w, 3)
            if ranked:
                best_mask = ranked[0] if isinstance(rows, X.Counted) else self._best_mask(spike, rows, ranked[0])
        except Exception as exc:
            item["errors"].append(f"could not compute dimensions because {exc}")
        return item, best_mask


def rank_dimensions(coded: list[X.Coded], values: np.ndarray, rows: X.Part, excess_rows: X.Part,
                    base: np.ndarray, base_q: X.BaselineTail, weights: np.ndarray | None = None,
                    rest: X.Rest | None = None, remote: X.RemoteCells | None = None,
                    overlap: A.Overlap | None = None, cut: list[dict[str, Any]] | None = None,
                    spike_without: SpikeWithoutOf | None = None, remote_from: int | None = None
                    ) -> tuple[list[X.Candidate], list[X.Candidate], list[X.Candidate], int]:
    """A spike's dimensions, best first: (ranked, finer and coarser levels of the first, candidates tested).

    The built-in six (`source` "builtin", first in `coded`) and their pairs, then each attribute alone and with each
    built-in (k8s.node.name & tenant; no pair of two attributes), all under one family-wise level (Bonferroni over
    every value and pair of values tested); the counterfactual of the MAX_COUNTERFACTUAL best scores; the first
    one's level of a learned hierarchy (attributes.name_level). `rows`: the spike's rows; `excess_rows`: its tail;
    `base`: the baseline's rows (`base_q` its p99); `rest`: the baseline's other requests counted per combination
    of the built-ins; `remote`, `overlap`, `spike_without`: a remote engine's counts of the combinations holding an
    attribute, its nesting test and its spike p99s without a candidate holding one (`remote_from` 0: the built-ins'
    too, X.contrast_raw's); `cut`: receives the pairs left out for their size."""
    nb = sum(1 for c in coded if c.source == "builtin")
    if rest is not None and nb < len(coded) and remote is None:
        raise ValueError("baseline counts (rest) cover the built-ins: the attributes need a remote engine's counts")
    found, tested = X.contrast_raw(coded, excess_rows, base, weights=weights, rest=rest, pairs_with=nb,
                                   remote=remote, cut=cut, remote_from=remote_from)
    cands = X.significant(found, tested)
    cands.sort(key=lambda c: -c.score)
    cands = cands[:X.MAX_COUNTERFACTUAL]
    known = spike_without(coded, cands, rows) if spike_without is not None else None
    X.counterfactual(coded, cands, values, rows, base, base_q, weights, rest=rest, known=known)
    ranked, finer, coarser = A.name_level(coded, X.rank(cands), overlap)
    return ranked, finer, coarser, tested


def _level_json(coded: list[X.Coded], c: X.Candidate) -> C.Level:
    """A value nested with the named one (a finer or coarser level of a learned hierarchy)."""
    d = X.candidate_json(coded, c)
    return cast(C.Level, {k: d[k] for k in ("dimension", "value", "attribute", "source", "explained", "support")})


def hierarchy_text(d: Mapping[str, Any]) -> str:
    """"k8s.node.name = node-2 explains 91% (replica replica-09 alone 27%)": a named dimension with the finer values
    nested in it (render_text's line, the watch's message)."""
    expl = "-" if d.get("explained") is None else f"{d['explained']:.0%}"
    text = f"{d['dimension']} = {d['value']} explains {expl}"
    finer = [f"{f['dimension']} {f['value']} alone {'-' if f['explained'] is None else format(f['explained'], '.0%')}"
             for f in d.get("finer") or []]
    return text + (f" ({'; '.join(finer)})" if finer else "")


def _spike_json(s: Spike) -> C.Spike:
    return {
        "start": iso(s.start_ns), "end": iso(s.end_ns), "requests": s.requests,
        "p50_ms": ms(s.p50_ns), "p99_ms": ms(s.p99_ns),
        "baseline_p50_ms": ms(s.baseline_p50_ns), "baseline_p99_ms": ms(s.baseline_p99_ns),
        "excess_ms": ms(s.excess_ns),
        "p_value": float(f"{s.p_value:.3g}") if math.isfinite(s.p_value) else None, "windows": s.windows,
        "stages": [], "dimensions": [], "exemplars": [],
        "requests_weighted": float(s.requests) if math.isnan(s.requests_weighted) else s.requests_weighted,
        "n_effective": float(s.requests) if math.isnan(s.n_effective) else round(s.n_effective, 3),
    }


def _fmt(x: float | None, unit: str = "") -> str:
    return "-" if x is None else f"{x:,.1f}{unit}"


def render_text(report: C.Report, console: Console | None = None) -> None:
    """Print the report as rich tables (what `tailscope report` shows without --json)."""
    from rich.table import Table  # here: --json (and every other reader of the report) needs none

    con = console or Console()
    out = report["outcomes"]
    con.print(f"[bold]{report['metric']}[/] report: {report['requests']:,} requests "
              f"({out['error']:,} errors, {out['timeout']:,} timeouts, {out['cancelled']:,} cancelled; "
              f"failures {'included' if report['include_failures'] else 'excluded'}); "
              f"window {report['window_s']} s x {report['windows']}; "
              f"baseline{' (BIASED, see below)' if report.get('warnings') else ''} "
              f"p50 {_fmt(report['baseline_p50_ms'], ' ms')}, p99 {_fmt(report['baseline_p99_ms'], ' ms')}",
              highlight=False)
    if report.get("sampled"):
        out_w = report["outcomes_weighted"]
        con.print(f"sampled traces: the {report['requests']:,} stored requests stand for "
                  f"{report['requests_weighted']:,.0f} ({out_w['error']:,.0f} errors, "
                  f"{out_w['timeout']:,.0f} timeouts); "
                  f"counts and percentiles are weighted by each request's adjusted count "
                  f"(effective sample {report['values_effective']:,.0f})", highlight=False)
    for warning in report.get("warnings", []):
        con.print(f"[bold yellow]{warning}[/]", highlight=False)
    judged = not any(e.startswith("could not compute spikes") for e in report["errors"])
    if not report["spikes"] and judged:
        con.print("[green]no p99 spike with a flat median[/]")
    for n, spike in enumerate(report["spikes"], 1):
        con.print()
        biased = " (biased)" if report.get("warnings") else ""
        con.print(f"[bold red]spike {n}[/]: {spike['start']} -> {spike['end']}  {spike['requests']:,} requests  "
                  f"p50{biased} {_fmt(spike['p50_ms'], ' ms')} (baseline {_fmt(spike['baseline_p50_ms'], ' ms')})  "
                  f"p99 {_fmt(spike['p99_ms'], ' ms')} (baseline {_fmt(spike['baseline_p99_ms'], ' ms')})  "
                  f"p={spike['p_value']:.2g}", highlight=False)
        if spike["stages"]:
            t = Table("stage", "share of excess", "tail ms", "baseline tail ms", title="where the tail grew")
            for st in spike["stages"]:
                t.add_row(st["stage"], f"{st['share']:.0%}", _fmt(st["tail_ms"]), _fmt(st["baseline_ms"]))
            con.print(t)
        if spike["dimensions"]:
            t = Table("dimension", "value", "explained", "p99 without", "score", "support",
                      title="what the tail is made of")
            folded = folded_pairs(spike["dimensions"])
            for n, d in [(n, d) for n, d in enumerate(spike["dimensions"]) if "folded_under" not in d][:10]:
                expl = "-" if d["explained"] is None else f"{d['explained']:.0%}"
                t.add_row(d["dimension"], d["value"], expl, _fmt(d["p99_without_ms"], " ms"),
                          f"{d['score']:.2f}", str(d["support"]))
                if folded.get(n):  # the pairs restating this value (`folded_under`), on one line under it
                    most = max((p["explained"] for p in folded[n] if p["explained"] is not None), default=None)
                    t.add_row(f"  + {len(folded[n])} pair{'s' if len(folded[n]) > 1 else ''}", "no more",
                              "-" if most is None else f"<= {most:.0%}", "", "", "", style="dim")
            con.print(t)
            if spike["dimensions"][0].get("finer"):
                con.print(hierarchy_text(spike["dimensions"][0]), highlight=False)
        if spike["exemplars"]:
            con.print("exemplars: " + ", ".join(spike["exemplars"]), highlight=False)
        neighbour = spike.get("noisy_neighbour")
        if neighbour:
            con.print(f"noisy neighbour: {neighbour['sentence']}", highlight=False)
    for err in report["errors"]:
        con.print(f"[yellow]{err}[/]", highlight=False)


def folded_pairs(dims: list[C.Dimension]) -> dict[int, list[C.Dimension]]:
    """The pairs folded under each dimension (`folded_under`, attributes.folded_under), by its position."""
    out: dict[int, list[C.Dimension]] = {}
    for d in dims:
        if "folded_under" in d:
            out.setdefault(d["folded_under"], []).append(d)
    return out


def explain_spikes(con: duckdb.DuckDBPyConnection, facts: str, frame: pl.DataFrame, det: Detection, metric: str
                   ) -> tuple[list[C.Spike], list[str]]:
    """The report's explanation (stages, dimensions, exemplars) of `det.spikes`: (one item per spike, errors).

    For callers that ran `detect` themselves (the watch): `frame` holds the rows detect saw, in
    the same order, with columns rid (the `rid` of each row in the `facts` table or view of `con`, which
    holds trace_id), start_ns, e2e_ns, value and the explain dimensions; `con` also has the
    `spans` view over the spikes' time range for the stage shares.
    """
    start = frame.get_column("start_ns").to_numpy()
    coded = None
    spans = con.execute("SELECT count(*) FROM duckdb_views() WHERE view_name = 'spans'").fetchall()[0][0]
    if spans and "span_id" in source_columns(con, facts) and det.spikes:
        # the attributes too, read from the spans over the frame's time range (as the report reads them)
        builtin = [X.code_dimension(frame, d) for d in X.DIMENSIONS]
        lo = int(start.min()) if start.size else None
        rules = attribute_rules()
        attrs = _attribute_dims(con, f"SELECT rid, trace_id, span_id, start_ns FROM {facts}", {}, frame, builtin,
                                rules, lo, max(s.end_ns for s in det.spikes) + 1)
        coded = [c for c in builtin if rules.ruled_out(c.name) is None] + attrs.coded
    items = explain_all(Rows.of(con, facts, frame, det, metric, coded=coded), det.spikes)
    return items, [e for item in items for e in item.get("errors", [])]
