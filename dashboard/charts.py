"""Charts of the dashboard, with one stage colour map so a stage looks the same everywhere.

The time-series charts of the Overview and the Spike page (`percentiles`, `counts`) are plain
Vega-Lite specs for `st.vega_lite_chart` over polars frames: the first page then imports neither
Altair nor pandas (a second or more of CPU each, on the path of a store's first page) and validates
no spec against Vega-Lite's schema. The other charts are Altair's over pandas, imported when drawn.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

import polars as pl

from tracing import schema as S

if TYPE_CHECKING:
    import altair as alt
    import pandas as pd
    import pyarrow as pa

#: One colour per critical-path stage (and `other`), used by every chart and table.
STAGE_COLORS: dict[str, str] = {
    S.NETWORK: "#8c564b",
    S.QUEUE_WAIT: "#ff7f0e",
    S.PREPROCESS: "#bcbd22",
    S.MODEL_LOAD: "#9467bd",
    S.GENERATION: "#1f77b4",
    S.PREFILL: "#17becf",
    S.DECODE: "#1f4e9c",
    S.STREAMING: "#2ca02c",
    S.OTHER: "#a0a0a0",
}
#: Percentile line colours.
PCT_COLORS: dict[str, str] = {"p50": "#4c78a8", "p90": "#9ecae9", "p99": "#e45756"}
OUTCOME_COLORS: dict[str, str] = {"ok": "#9ecae9", "error": "#e45756", "timeout": "#f58518", "cancelled": "#b279a2"}
SPIKE_FILL = "#f2b701"
#: Spikes of the range without the dimension filters, drawn as context when the filtered set cannot be judged.
CONTEXT_FILL = "#9e9e9e"


def stage_scale() -> alt.Scale:
    """The colour scale of stages (same domain and range everywhere)."""
    import altair as alt

    return alt.Scale(domain=list(STAGE_COLORS), range=list(STAGE_COLORS.values()))


#: A Vega-Lite spec (a dict) whose `datasets` hold Arrow tables, as `st.vega_lite_chart` takes it.
Spec = dict[str, Any]
#: A temporal tooltip field shown as a time of day.
_CLOCK = "%H:%M:%S"
_UTC_NS = pl.Datetime("ns", "UTC")


def clock(ns: int) -> str:
    """An instant (integer ns since the epoch) as a UTC time of day, HH:MM:SS (the charts' tooltips' format)."""
    return datetime.fromtimestamp(ns // 1_000_000_000, tz=UTC).strftime(_CLOCK)


def window_label(start_ns: int, end_ns: int) -> str:
    """A window as the banners name it: HH:MM:SS–HH:MM:SS UTC (24-hour, the charts' clock)."""
    return f"{clock(start_ns)}–{clock(end_ns)} UTC"


#: Axis labels of a UTC time axis by the ticks' granularity: 24-hour times, the date at day ticks.
AXIS_CLOCK: Final = {"milliseconds": "%H:%M:%S.%L", "seconds": "%H:%M:%S", "minutes": "%H:%M", "hours": "%H:%M",
                      "date": "%m-%d",
                      "day": "%m-%d", "week": "%m-%d", "month": "%Y-%m", "quarter": "%Y-%m", "year": "%Y"}


#: The field of the percentile lines' x (each window's middle): a brush's selection names its interval by it.
MIDDLE: Final = "middle"
#: Pixels the y labels of the Overview's and the Spike page's time charts take at least (up to "4,000,000"): the
#: charts stacked there then start their x axes at the same place and line up.
Y_LABELS: Final = 60


def _time_x(name: str, **extra: Any) -> dict[str, Any]:
    """A temporal x field drawn in UTC with 24-hour labels, whatever the browser's time zone."""
    return _field(name, "temporal", **{"scale": {"type": "utc"}, "axis": {"format": AXIS_CLOCK, "labelOverlap": True},
                                       "title": "UTC", **extra})


def _utc_text(df: pl.DataFrame, column: str, alias: str = "time (UTC)") -> pl.DataFrame:
    """`df` with a text column `alias`: the UTC datetime `column` as HH:MM:SS, for tooltips (a browser formats
    a temporal tooltip in its own zone)."""
    return df.with_columns(pl.col(column).dt.convert_time_zone("UTC").dt.strftime(_CLOCK).alias(alias))


def _window_text(df: pl.DataFrame, window_s: int) -> pl.DataFrame:
    """`df` with a text column "window (UTC)": each window (start `window`, `window_s` long) as HH:MM:SS–HH:MM:SS."""
    ends = _utc_text(df.with_columns(end=pl.col("window") + pl.duration(seconds=window_s)), "end", "b")
    return _utc_text(ends, "window", "a").with_columns(
        pl.concat_str(pl.col("a"), pl.lit("–"), pl.col("b")).alias("window (UTC)")).drop("a", "b", "end")


def _dataset(datasets: dict[str, pa.Table], df: pl.DataFrame) -> dict[str, str]:
    """Add `df` to `datasets` under a name derived from its content (as Altair names them, so a chart whose
    data changed gets a new dataset, never rows patched into the old one); the layer's `data` entry."""
    digest = hashlib.sha256(repr(df.schema).encode())
    digest.update(df.hash_rows(seed=0).to_numpy().tobytes())
    name = f"data-{digest.hexdigest()[:32]}"
    datasets[name] = df.to_arrow()
    return {"name": name}


def _field(name: str, kind: str, **extra: Any) -> dict[str, Any]:
    """A Vega-Lite field definition (`kind`: temporal, quantitative, nominal, ordinal)."""
    return {"field": name, "type": kind, **extra}


def _colors(domain: dict[str, str]) -> dict[str, list[str]]:
    return {"domain": list(domain), "range": list(domain.values())}


def _spike_layer(datasets: dict[str, pa.Table], spikes: list[tuple[int, int]], label: str = "spike",
                 color: str = "") -> list[Spec]:
    """The shaded spike windows ((start, end) in ns) as a layer to put under the data; none without spikes."""
    if not spikes:
        return []
    df = pl.DataFrame({"start": [a for a, _ in spikes], "end": [b for _, b in spikes],
                       "label": [label] * len(spikes)}, schema={"start": _UTC_NS, "end": _UTC_NS, "label": pl.String})
    df = _utc_text(_utc_text(df, "start", "a"), "end", "b").with_columns(
        window=pl.concat_str(pl.col("a"), pl.lit("–"), pl.col("b"), pl.lit(" UTC"))).drop("a", "b")
    return [{
        "data": _dataset(datasets, df),
        "mark": {"type": "rect", "color": color or SPIKE_FILL, "opacity": 0.25},
        "encoding": {"x": _time_x("start"), "x2": {"field": "end"},
                     "tooltip": [_field("label", "nominal"), _field("window", "nominal")]},
    }]


def _long(df: pl.DataFrame, columns: dict[str, str], name: str, value: str) -> pl.DataFrame:
    """`df` (one row per window) as one row per window and column (renamed by `columns`), nulls and NaNs left out."""
    return (df.select("window", *columns).unpivot(index="window", variable_name=name, value_name=value)
            .with_columns(pl.col(name).replace_strict(columns), pl.col(value).cast(pl.Float64).fill_nan(None))
            .drop_nulls(value))


def has_values(df: pl.DataFrame, prefix: str) -> bool:
    """Whether any window of `df` (data.over_time) has a p50 of `prefix` (e2e, ttft, tpot) to draw."""
    return bool(df.get_column(f"{prefix}_p50_ms").cast(pl.Float64).fill_nan(None).is_not_null().any())


def percentiles(df: pl.DataFrame, prefix: str, title: str, spikes: list[tuple[int, int]], window_s: int,
                brush: str | None = None, height: int = 280, alerts: pl.DataFrame | None = None,
                context: list[tuple[int, int]] | None = None) -> Spec:
    """p50/p90/p99 lines of `prefix` (e2e, ttft, tpot) per window of `df` (data.over_time, windows of `window_s`),
    `spikes` ((start, end) ns) shaded: a Vega-Lite spec. Each point sits in the middle of its window and the x axis
    spans every window whole, as `counts` draws them: a chart above the count charts lines up with them and ends
    where they end.

    `brush` names an x-interval selection on the lines (for `on_select`); `alerts` (rows with
    `window_start_ns` and the alert's kind, rule, status, fired_at, stage, value) draws one rule per alert.
    """
    datasets: dict[str, pa.Table] = {}
    layers = _spike_layer(datasets, context or [], "spike without the filters", CONTEXT_FILL)
    layers += _spike_layer(datasets, spikes)
    half = pl.duration(milliseconds=window_s * 500)
    long = (_window_text(_long(df, {f"{prefix}_p{p}_ms": f"p{p}" for p in (50, 90, 99)}, "pct", "ms"), window_s)
            .with_columns((pl.col("window") + half).alias(MIDDLE)))
    lines: Spec = {
        "data": _dataset(datasets, long),
        "mark": {"type": "line", "point": {"size": 12}},
        "encoding": {
            "x": _time_x(MIDDLE, scale=_utc_span(df, window_s)),
            "y": _field("ms", "quantitative", title=f"{title} (ms)", axis={"format": ",.0f", "minExtent": Y_LABELS}),
            "color": _field("pct", "nominal", title=None, scale=_colors(PCT_COLORS),
                            legend={"orient": "top", "title": None}),  # as `counts`: the same plot width (the
            # chart is 60 px taller for it, its plot as tall as with the legend at the side)
            "tooltip": [_field("window (UTC)", "nominal"), _field("pct", "nominal"),
                        _field("ms", "quantitative", format=",.0f")],
        },
    }
    spec: Spec = {"title": title, "height": height}
    if brush is not None:
        lines["name"] = "lines"
        spec["params"] = [{"name": brush, "select": {"type": "interval", "encodings": ["x"]}, "views": ["lines"]}]
    layers.append(lines)
    if alerts is not None and not alerts.is_empty():
        shown = ("kind", "rule", "status", "fired_at", "stage", "value")
        rules = _utc_text(alerts.select(pl.col("window_start_ns").cast(_UTC_NS).alias("window"), *shown), "window")
        layers.append({
            "data": _dataset(datasets, rules),
            "mark": {"type": "rule", "color": "#d62728", "strokeDash": [4, 2]},
            "encoding": {"x": _time_x("window"),
                         "tooltip": [_field(c, "nominal") for c in ("time (UTC)", *shown)]},
        })
    return {**spec, "layer": layers, "datasets": datasets}


def counts(df: pl.DataFrame, spikes: list[tuple[int, int]], window_s: int, outcomes: tuple[str, ...] = S.OUTCOMES,
           title: str = "requests per window", height: int = 240) -> Spec:
    """Requests per window of `df` (data.over_time) stacked by outcome (those of `outcomes`), `spikes`
    shaded: a Vega-Lite spec. Each bar spans its whole window, so a window of a few failures still shows
    a bar (the Overview draws the failures in a chart of their own, on their own scale). The x axis spans
    every window of `df`, with or without a bar (the charts above it keep the same range), and the y axis
    ticks whole requests only."""
    present = {o: o for o in outcomes if o in df.columns}
    datasets: dict[str, pa.Table] = {}
    layers = _spike_layer(datasets, spikes)
    rank = {o: i for i, o in enumerate(present)}
    long = (_utc_text(_long(df, present, "outcome", "n").filter(pl.col("n") > 0), "window")
            .with_columns(end=pl.col("window") + pl.duration(seconds=window_s),
                          rank=pl.col("outcome").replace_strict(rank, return_dtype=pl.Int32))
            .sort("window", "rank")
            .with_columns(top=pl.col("n").cum_sum().over("window"))
            .with_columns(bottom=pl.col("top") - pl.col("n")))  # stacked by hand: a ranged bar does not stack
    layers.append({
        "data": _dataset(datasets, long.drop("rank")),
        "mark": {"type": "bar", "stroke": "white", "strokeWidth": 0.5},
        "encoding": {
            "x": _time_x("window", scale=_utc_span(df, window_s)), "x2": {"field": "end"},
            "y": _field("top", "quantitative", title="requests",
                        axis={"format": ",.0f", "tickMinStep": 1, "minExtent": Y_LABELS}),
            "y2": {"field": "bottom"},
            "color": _field("outcome", "nominal", scale=_colors({o: OUTCOME_COLORS[o] for o in present}),
                            legend={"orient": "top", "title": None}),
            "tooltip": [_field("time (UTC)", "nominal"), _field("outcome", "nominal"),
                        _field("n", "quantitative", title="requests", format=",.0f")],
        },
    })
    return {"title": title, "height": height, "layer": layers, "datasets": datasets}


def _iso(ns: int) -> str:
    """An instant (integer ns) as ISO-8601 UTC to the ms, as a scale's domain takes it."""
    ms = ns // 1_000_000
    return f"{datetime.fromtimestamp(ms // 1000, tz=UTC):%Y-%m-%dT%H:%M:%S}.{ms % 1000:03d}Z"


def _utc_span(df: pl.DataFrame, window_s: int) -> dict[str, Any]:
    """A UTC time scale from `df`'s first window's start to its last window's end. The domain is ISO text: Vega-Lite
    reads numbers (ms) there for a ranged bar (x and x2) but not for a line or a point, whose scale then runs to an
    invalid end and draws every point at the left edge."""
    if df.is_empty():
        return {"type": "utc"}
    first, last = df.select(pl.col("window_ns").min().alias("a"), pl.col("window_ns").max().alias("b")).row(0)
    return {"type": "utc", "domain": [_iso(int(first)), _iso(int(last) + window_s * 10**9)]}


def stage_compare(df: pd.DataFrame, tail: str = "spike tail") -> alt.Chart:
    """Mean critical-path ms per stage: the tail of the window (named `tail`: a spike's, or a window's that is not
    one) vs the same slice of the baseline."""
    import altair as alt

    long = df.melt(id_vars=["stage"], value_vars=["tail_ms", "baseline_ms"], var_name="slice", value_name="ms")
    long["slice"] = long["slice"].map({"tail_ms": tail, "baseline_ms": "baseline tail"})
    return alt.Chart(long).mark_bar().encode(
        y=alt.Y("stage:N", sort=list(STAGE_COLORS), title=None),
        yOffset=alt.YOffset("slice:N", sort=["baseline tail", tail]),
        x=alt.X("ms:Q", title="mean critical-path time (ms)"),
        color=alt.Color("stage:N", scale=stage_scale(), legend=None),
        opacity=alt.Opacity("slice:N", scale=alt.Scale(domain=["baseline tail", tail], range=[0.35, 1.0]),
                            title=None),
        tooltip=["stage:N", "slice:N", alt.Tooltip("ms:Q", format=",.0f")],
    ).properties(height=max(120, 34 * len(df)))


def counterfactual(df: pd.DataFrame, p99_ms: float, baseline_p99_ms: float | None = None) -> alt.LayerChart:
    """p99 of the window without each candidate (one labelled bar each, in the report's order: best first),
    beside the observed p99 (red rule) and the baseline p99 (green rule)."""
    import altair as alt
    import pandas as pd

    data = df.assign(label=[f"{i + 1}. {d} = {v}" for i, (d, v) in enumerate(zip(df["dimension"], df["value"],
                                                                                   strict=True))])
    order = list(data["label"])
    bars = alt.Chart(data).mark_bar(color="#4c78a8").encode(
        y=alt.Y("label:N", sort=order, scale=alt.Scale(domain=order), title=None,
                axis=alt.Axis(labelLimit=360, labelOverlap=False)),
        x=alt.X("p99_without_ms:Q", title="p99 without it (ms)", axis=alt.Axis(format=",.0f")),
        tooltip=[alt.Tooltip("label:N", title="left out"),
                 alt.Tooltip("p99_without_ms:Q", format=",.0f", title="p99 without (ms)"),
                 alt.Tooltip("tail_share:Q", format=".0%", title="share of the tail"),
                 alt.Tooltip("baseline_share:Q", format=".0%", title="share of the baseline")],
    )
    marks = pd.DataFrame({"ms": [p99_ms] + ([baseline_p99_ms] if baseline_p99_ms is not None else []),
                          "what": ["observed p99"] + (["baseline p99"] if baseline_p99_ms is not None else [])})
    rule = alt.Chart(marks).mark_rule(strokeDash=[4, 3], size=2).encode(
        x="ms:Q", color=alt.Color("what:N", title=None, scale=alt.Scale(domain=["observed p99", "baseline p99"],
                                                                        range=["#e45756", "#54a24b"])),
        tooltip=["what:N", alt.Tooltip("ms:Q", format=",.0f")])
    # the height is the whole chart's (Streamlit fits it), axis and title included: 28 px a bar above 80 for them
    return (bars + rule).properties(height=80 + 28 * max(3, len(df)))


def waterfall(spans: pd.DataFrame) -> alt.Chart:
    """Spans of one trace as pale bars; the critical-path stretches drawn solid on top, coloured by stage."""
    import altair as alt
    import pandas as pd

    rows: list[dict[str, Any]] = []
    order: list[str] = []
    for i, r in enumerate(spans.itertuples()):
        row = f"{i:02d} {r.name}"
        order.append(row)
        stage = r.stage if isinstance(r.stage, str) else S.OTHER
        rows.append({"row": row, "a": r.start_ms, "b": r.end_ms, "stage": stage, "part": "span",
                     "name": r.name, "ms": r.duration_ms, "critical_ms": r.critical_ms})
        for a, b in r.critical_stretches:
            rows.append({"row": row, "a": a, "b": b, "stage": stage, "part": "critical path",
                         "name": r.name, "ms": b - a, "critical_ms": r.critical_ms})
    df = pd.DataFrame(rows)
    return alt.Chart(df).mark_bar(height=16).encode(
        y=alt.Y("row:N", sort=order, scale=alt.Scale(domain=order), title=None,
                axis=alt.Axis(labelLimit=280, labelOverlap=False)),
        x=alt.X("a:Q", title="ms since request start"),
        x2="b:Q",
        color=alt.Color("stage:N", scale=stage_scale(), title="stage"),
        opacity=alt.Opacity("part:N", scale=alt.Scale(domain=["span", "critical path"], range=[0.3, 1.0]),
                            title=None),
        stroke=alt.Stroke("part:N", scale=alt.Scale(domain=["span", "critical path"],
                                                    range=["transparent", "black"]), legend=None),
        order=alt.Order("part:N", sort="descending"),
        tooltip=["name:N", "part:N", "stage:N", alt.Tooltip("a:Q", format=",.1f", title="from ms"),
                 alt.Tooltip("b:Q", format=",.1f", title="to ms"),
                 alt.Tooltip("critical_ms:Q", format=",.1f", title="on critical path (ms)")],
    ).properties(height=28 * len(order))


def stage_stack(df: pd.DataFrame) -> alt.Chart:
    """Critical-path ms per stage of each exemplar, stacked (sums to its latency)."""
    import altair as alt

    stage_cols = [c for c in df.columns if c.endswith("_ms") and c.removesuffix("_ms") in STAGE_COLORS
                  and c != "generation_ms"]
    long = df.melt(id_vars=["trace_id"], value_vars=stage_cols, var_name="stage", value_name="ms")
    long["stage"] = long["stage"].str.removesuffix("_ms")
    long = long[long["ms"] > 0]
    return alt.Chart(long).mark_bar().encode(
        y=alt.Y("trace_id:N", sort=list(df["trace_id"]), title=None, axis=alt.Axis(labelLimit=120)),
        x=alt.X("ms:Q", title="critical-path ms"),
        color=alt.Color("stage:N", scale=stage_scale()),
        tooltip=["trace_id:N", "stage:N", alt.Tooltip("ms:Q", format=",.0f")],
    ).properties(height=max(160, 16 * len(df)))


def heatmap(df: pd.DataFrame, value: str = "p99_ms") -> alt.Chart:
    """`value` (colour) over input-token × output-token buckets (the report's labels); counts in the tooltip.

    Every bucket is labelled, and the colour scale ends at the largest cell whose p99 the data can
    support (analysis' `p99_low_sample` flag): one cell of a few requests does not wash out the rest;
    cells beyond it take the top colour.
    """
    import altair as alt

    trusted = df if "p99_low_sample" not in df.columns else df[~df["p99_low_sample"].astype(bool)]
    top = float(trusted[value].max()) if len(trusted) and trusted[value].notna().any() else None
    scale = alt.Scale(scheme="orangered", domain=[0, top], clamp=True) if top else alt.Scale(scheme="orangered")
    label = {"p99_ms": "p99 (ms)", "p50_ms": "p50 (ms)", "requests": "requests"}.get(value, value)
    return alt.Chart(df).mark_rect().encode(
        x=alt.X("input_tokens_bucket:O", sort=alt.EncodingSortField("input_tokens_lo"), title="input tokens",
                axis=alt.Axis(labelOverlap=False, labelAngle=-45)),
        y=alt.Y("output_tokens_bucket:O", sort=alt.EncodingSortField("output_tokens_lo", order="descending"),
                title="output tokens", axis=alt.Axis(labelOverlap=False)),
        color=alt.Color(f"{value}:Q", title=label, scale=scale, legend=alt.Legend(format=",.0f")),
        tooltip=[alt.Tooltip("input_tokens_bucket:O", title="input tokens"),
                 alt.Tooltip("output_tokens_bucket:O", title="output tokens"),
                 alt.Tooltip("requests:Q", format=",.0f"),
                 alt.Tooltip("p50_ms:Q", format=",.0f", title="p50 (ms)"),
                 alt.Tooltip("p99_ms:Q", format=",.0f", title="p99 (ms)")],
    ).properties(height=max(320, 24 * df["output_tokens_bucket"].nunique()))


def bucket_p99(df: pd.DataFrame, column: str, title: str) -> alt.Chart:
    """p50 and p99 per token bucket of `column` (input_tokens or output_tokens), labelled as the report does."""
    import altair as alt

    data = df.rename(columns={f"{column}_bucket": "bucket", f"{column}_lo": "lo"})
    long = data.melt(id_vars=["bucket", "lo", "requests"], value_vars=["p50_ms", "p99_ms"], var_name="pct",
                     value_name="ms")
    long["pct"] = long["pct"].str.removesuffix("_ms")
    return alt.Chart(long).mark_bar().encode(
        x=alt.X("bucket:N", sort=alt.EncodingSortField("lo"), title=title),
        xOffset="pct:N",
        y=alt.Y("ms:Q", title="ms"),
        color=alt.Color("pct:N", title=None,  # p50, p99: the labels say it
                        scale=alt.Scale(domain=["p50", "p99"], range=[PCT_COLORS["p50"], PCT_COLORS["p99"]])),
        tooltip=[alt.Tooltip("bucket:N", title=title), alt.Tooltip("pct:N", title="percentile"),
                 alt.Tooltip("ms:Q", format=",.0f"), alt.Tooltip("requests:Q", format=",.0f")],
    ).properties(height=240)


def replica_chart(df: pd.DataFrame, column: str = "replica", title: str | None = None) -> alt.LayerChart:
    """p50 (tick) and p99 (bar) per replica (or per value of `column`, in the frame's order, axis `title`);
    outliers in red, outliers a dimension's value explains in yellow, those too small to judge in grey."""
    import altair as alt
    import pandas as pd

    explained = df["explained_by"].fillna("") if "explained_by" in df.columns else pd.Series("", index=df.index)
    judged = df["judged"] if "judged" in df.columns else pd.Series(True, index=df.index)
    data = df.assign(kind=["too few to judge" if not j else "normal" if not o else "explained by a dimension" if e
                           else "outlier" for o, e, j in zip(df["outlier"], explained, judged, strict=True)])
    kinds = ["normal", "outlier", "explained by a dimension", "too few to judge"]
    x = alt.X(f"{column}:N", title=title) if column == "replica" else alt.X(f"{column}:N", title=title,
                                                                           sort=list(data[column]))
    bars = alt.Chart(data).mark_bar().encode(
        x=x,
        y=alt.Y("p99_ms:Q", title="p99 (ms)", axis=alt.Axis(format=",.0f")),
        color=alt.Color("kind:N", title="p99",
                        scale=alt.Scale(domain=kinds, range=["#9ecae9", "#e45756", "#f2b701", "#c7c7c7"])),
        tooltip=[alt.Tooltip(f"{column}:N", title=title or column), alt.Tooltip("requests:Q", format=",.0f"),
                 alt.Tooltip("p50_ms:Q", format=",.0f", title="p50 (ms)"),
                 alt.Tooltip("p99_ms:Q", format=",.0f", title="p99 (ms)"), alt.Tooltip("error:Q", format=",.0f"),
                 alt.Tooltip("timeout:Q", format=",.0f")],
    )
    ticks = alt.Chart(data).mark_tick(color="#1f4e9c", thickness=3, size=28).encode(x=x, y="p50_ms:Q")
    return (bars + ticks).properties(height=280)


def fmt_ms(ms: float | None) -> str:
    """A latency for people: 850 ms, 2.4 s, 38 s."""
    if ms is None or ms != ms:
        return "–"
    if abs(ms) < 1_000:
        return f"{ms:,.0f} ms"
    if abs(ms) < 10_000:
        return f"{ms / 1000:.1f} s"
    return f"{ms / 1000:,.0f} s"
