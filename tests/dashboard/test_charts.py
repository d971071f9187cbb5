"""dashboard.charts: one colour per stage, latency formatting, the time-series charts' Vega-Lite specs."""

from __future__ import annotations

import json
from fractions import Fraction
from typing import Any
from unittest import mock

import numpy as np
import polars as pl
import pytest

from dashboard import charts
from tracing import schema as S


def test_every_critical_path_stage_has_one_distinct_colour() -> None:
    assert list(charts.STAGE_COLORS) == list(S.CRITICAL_PATH_COLUMNS)
    assert len(set(charts.STAGE_COLORS.values())) == len(charts.STAGE_COLORS)
    assert charts.stage_scale().to_dict() == {"domain": list(S.CRITICAL_PATH_COLUMNS),
                                              "range": list(charts.STAGE_COLORS.values())}


@pytest.mark.parametrize(("ms", "text"), [
    (None, "–"), (float("nan"), "–"), (0.4, "0 ms"), (850.0, "850 ms"), (2_449.0, "2.4 s"),
    (38_000.0, "38 s"), (-8_790.0, "-8.8 s"), (-120.0, "-120 ms"), (125_000.0, "125 s"),
])
def test_fmt_ms(ms: float | None, text: str) -> None:
    assert charts.fmt_ms(ms) == text


def test_token_buckets_are_labelled_as_the_report_labels_them() -> None:
    """The chart shows analysis' own bucket labels unchanged (the dashboard never relabels)."""
    import pandas as pd

    from analysis.stats.explain import bucket_bounds, bucket_label

    lows = [0, 1, 2, 1024]
    df = pd.DataFrame({"input_tokens_bucket": [bucket_label(*bucket_bounds(lo)) for lo in lows],
                       "input_tokens_lo": lows, "requests": [1, 2, 3, 4],
                       "p50_ms": [1.0] * 4, "p99_ms": [2.0] * 4})
    chart = charts.bucket_p99(df, "input_tokens", "input tokens")
    labels = sorted(set(chart.data["bucket"]), key=lambda s: int(s.split("-")[0]))
    assert labels == ["0-0", "1-1", "2-3", "1024-2047"]


def _series(n: int = 6) -> pl.DataFrame:
    """data.over_time's shape: one row per window, e2e percentiles (one window without values, one NaN) and
    outcome counts."""
    start = 1_763_650_800 * 10**9
    cols: dict[str, Any] = {"window_ns": [start + w * 300 * 10**9 for w in range(n)]}
    for i, q in enumerate((50, 90, 99)):
        cols[f"e2e_p{q}_ms"] = [None if w == 2 else 100.0 * (i + 1) + w for w in range(n)]
    cols["e2e_p99_ms"][4] = float("nan")
    for i, o in enumerate(S.OUTCOMES):
        cols[o] = [10 * i + w for w in range(n)]
    return pl.DataFrame(cols).with_columns(window=pl.col("window_ns").cast(pl.Datetime("ns", "UTC")))


def _validate(spec: dict[str, Any]) -> None:
    """Raise unless `spec`, its Arrow tables written out as rows, is a valid Vega-Lite spec (Altair's schema)."""
    from altair.utils.schemapi import validate_jsonschema
    from altair.vegalite.v6.schema.core import load_schema

    rows = {name: json.loads(pl.DataFrame(t).write_json()) for name, t in spec["datasets"].items()}
    schema = load_schema()
    validate_jsonschema({**spec, "datasets": rows}, schema, rootschema=schema)


def _layer_data(spec: dict[str, Any], mark: str) -> pl.DataFrame:
    (layer,) = [lay for lay in spec["layer"] if lay["mark"]["type"] == mark]
    data = pl.from_arrow(spec["datasets"][layer["data"]["name"]])
    assert isinstance(data, pl.DataFrame)
    return data


@pytest.mark.parametrize("with_spikes", [False, True])
def test_percentile_chart_is_valid_vega_lite_with_the_series_values(with_spikes: bool) -> None:
    df = _series()
    ns = df["window_ns"].to_list()
    spikes = [(ns[1], ns[3])] if with_spikes else []
    fired = pl.DataFrame({"window_start_ns": [ns[4]], "kind": ["p99"], "rule": ["p99 > 1 s"], "status": ["firing"],
                          "fired_at": ["15:21:00"], "stage": ["decode"], "value": ["1234"]})
    spec = charts.percentiles(df, "e2e", "end-to-end", spikes, 300, brush="brush", alerts=fired)
    _validate(spec)
    assert [lay["mark"]["type"] for lay in spec["layer"]] == ["rect"] * with_spikes + ["line", "rule"]
    lines = _layer_data(spec, "line")
    expected = {(w, f"p{q}", df[f"e2e_p{q}_ms"][i]) for i, w in enumerate(df["window"]) for q in (50, 90, 99)
                if i != 2 and (i, q) != (4, 99)}  # no value, NaN: no point
    assert set(lines.select("window", "pct", "ms").iter_rows()) == expected
    # each point in the middle of its window, labelled with the window; the axis spans the windows whole, as the
    # count charts under it do (the same domain: the last point sits over the last bar, both ending together)
    assert (lines["middle"] - lines["window"]).dt.total_seconds().unique().to_list() == [150]
    assert lines.filter(pl.col("window") == df["window"][0])["window (UTC)"].unique().to_list() == ["15:00:00–15:05:00"]
    (line,) = [lay for lay in spec["layer"] if lay["mark"]["type"] == "line"]
    (bar,) = [lay for lay in charts.counts(df, [], 300)["layer"] if lay["mark"]["type"] == "bar"]
    assert line["encoding"]["x"]["scale"] == bar["encoding"]["x"]["scale"] == {
        "type": "utc", "domain": ["2025-11-20T15:00:00.000Z", "2025-11-20T15:30:00.000Z"]}
    assert spec["params"] == [{"name": "brush", "select": {"type": "interval", "encodings": ["x"]},
                               "views": ["lines"]}]
    assert [lay.get("name") for lay in spec["layer"] if lay["mark"]["type"] == "line"] == ["lines"]
    assert _layer_data(spec, "rule")["window"].to_list() == [df["window"][4]]
    if with_spikes:
        rect = _layer_data(spec, "rect")
        assert rect.select("start", "end").rows() == [(df["window"][1], df["window"][3])]
        assert charts.clock(ns[1]) == "15:05:00"


def test_count_chart_is_valid_vega_lite_with_the_counts_per_outcome() -> None:
    df = _series()
    spec = charts.counts(df, [(df["window_ns"][0], df["window_ns"][1])], 60)
    _validate(spec)
    bars = _layer_data(spec, "bar")
    assert set(bars.select("window", "outcome", "n").iter_rows()) == {
        (w, o, float(df[o][i])) for i, w in enumerate(df["window"]) for o in S.OUTCOMES if df[o][i] > 0}
    # each bar spans its whole window, stacked by hand (bottom to top) in outcome order
    assert (bars["end"] - bars["window"]).dt.total_seconds().unique().to_list() == [60]
    assert (bars["top"] - bars["bottom"]).to_list() == bars["n"].to_list()
    for _, group in bars.group_by("window"):
        assert group["bottom"].min() == 0 and group["top"].max() == group["n"].sum()
    failed_spec = charts.counts(df.with_columns(error=pl.Series([0, 0, 1, 0, 0, 0]), timeout=pl.lit(0)), [], 60,
                                ("error", "timeout"))
    only_failed = _layer_data(failed_spec, "bar")
    assert set(only_failed["outcome"]) <= {"error", "timeout"}
    # the x axis spans every window of the series, not only those with a bar (one here); whole requests on y
    (failed_bars,) = [lay for lay in failed_spec["layer"] if lay["mark"]["type"] == "bar"]
    # 1_763_650_800 s is 2025-11-20T15:00:00Z; the last window starts 25 min later and ends 60 s on
    want = {"type": "utc", "domain": ["2025-11-20T15:00:00.000Z", "2025-11-20T15:26:00.000Z"]}
    assert failed_bars["encoding"]["x"]["scale"] == want
    assert failed_bars["encoding"]["y"]["axis"]["tickMinStep"] == 1
    _validate(failed_spec)
    assert "params" not in spec and "rule" not in [lay["mark"]["type"] for lay in spec["layer"]]


def test_a_chart_dataset_is_named_by_its_content() -> None:
    """Changed data gets a new name (the browser replaces it rather than patching rows into the old one)."""
    df = _series()
    names = [next(iter(charts.counts(d, [], 60)["datasets"]))
             for d in (df, df.clone(), df.with_columns(ok=pl.col("ok") + 1))]
    assert names[0] == names[1] != names[2]
    assert charts.percentiles(df, "e2e", "e2e", [], 300).keys() == {"title", "height", "layer", "datasets"}
    assert charts.has_values(df, "e2e") and not charts.has_values(df.with_columns(e2e_p50_ms=None), "e2e")


def test_an_attributes_values_chart_keeps_the_order_given_and_formats_its_numbers() -> None:
    """Grouped by an attribute, the bars follow the frame's order (the page sorts slowest first) on an axis named
    by the attribute; tooltips read as the tables do (thousands separators, whole ms)."""
    import pandas as pd

    df = pd.DataFrame({"value": ["node-3", "(none)", "node-1"], "outlier": [True, False, False],
                       "requests": [1200.0, 30.0, 5400.0], "p50_ms": [900.0, 400.0, 410.0],
                       "p99_ms": [31_000.0, 2_000.0, 1_900.0], "error": [1, 0, 2], "timeout": [0, 0, 1]})
    spec = charts.replica_chart(df, "value", "k8s.node.name").to_dict()
    bars, ticks = spec["layer"]
    assert bars["encoding"]["x"] == {"field": "value", "type": "nominal", "title": "k8s.node.name",
                                     "sort": ["node-3", "(none)", "node-1"]}
    assert ticks["encoding"]["x"] == bars["encoding"]["x"]
    tips = {t["field"]: t for t in bars["encoding"]["tooltip"]}
    assert tips["value"]["title"] == "k8s.node.name"
    assert all(tips[c]["format"] == ",.0f" for c in ("requests", "p50_ms", "p99_ms", "error", "timeout"))
    assert bars["encoding"]["y"]["axis"]["format"] == ",.0f"
    # the replicas' own chart is as before: replicas in their natural order, no title on the axis
    reps = charts.replica_chart(df.rename(columns={"value": "replica"})).to_dict()
    assert reps["layer"][0]["encoding"]["x"] == {"field": "replica", "type": "nominal", "title": None}


def test_a_static_tables_cells_read_as_their_grid_columns_would() -> None:
    """formats.table's cells: each grid column entry's format (separators, units, a dollar sign, a share), a link
    as a Markdown link (its display text, or the part its pattern picks out), a UTC time, unknown values as a dash,
    and Markdown's punctuation escaped (a `$` must not start math, nor `:` a directive)."""
    import numpy as np
    import pandas as pd
    import streamlit as st

    from dashboard import formats

    def cell(config: Any, value: Any) -> str:
        return formats._cell(config)(value)

    assert cell(formats.ms("p99"), 12345.678) == "12,346 ms"
    assert cell(formats.number("USD", "$%,.2f"), 1234.5) == r"\$1,234.50"
    assert cell(formats.number("tail requests", "%,d"), 4321.0) == "4,321"
    assert cell(formats.number("score", "%.2f"), 2.0) == "2.00"
    assert cell(formats.percent("share"), 0.4567) == "45.7%"
    assert cell(st.column_config.ProgressColumn("p", format="percent", min_value=0.0, max_value=1.0), 0.256) == "26%"
    assert [cell(formats.ms("p99"), v) for v in (None, float("nan"), pd.NA)] == ["–"] * 3
    assert cell(formats.exemplar_columns()["trace"], "traces?tenant=a&trace=7a1100000000000000000000000000ff") == (
        "[7a1100000000](traces?tenant=a&trace=7a1100000000000000000000000000ff)")
    assert cell(st.column_config.LinkColumn("filter", display_text="filter to this value"), "./?replica=r-1") == (
        "[filter to this value](./?replica=r-1)")
    assert cell(st.column_config.LinkColumn("filter"), None) == "–"
    assert cell(formats.utc("start (UTC)"), pd.Timestamp("2026-11-14 22:13:05", tz="America/New_York")) == (
        r"2026-11-15 03\:13\:05")
    assert cell(None, "tenant_a: $5 [x]") == r"tenant\_a\: \$5 \[x\]"
    assert cell(None, 1234567) == "1,234,567"
    assert [cell(None, v) for v in (True, False, np.bool_(True))] == ["yes", "", "yes"]
    # the whole table: one Markdown table, numbers right-aligned, a help text in a caption under it
    shown: list[str] = []
    with mock.patch.object(st, "markdown", shown.append), mock.patch.object(st, "caption", shown.append):
        formats.table(pd.DataFrame({"dimension": ["replica", "a|b"], "explained": [0.863, None], "support": [26, 3],
                                    "filter": ["./?replica=r-1", None]}),
                      {"explained": st.column_config.NumberColumn("share explained", format="percent", help="1 − x"),
                       "filter": st.column_config.LinkColumn("filter", display_text="filter to this value")})
    assert shown == ["| dimension | share explained | support | filter |\n|---|---:|---:|---|\n"
                     "| replica | 86.3% | 26 | [filter to this value](./?replica=r-1) |\n| a\\|b | – | 3 | – |",
                     "share explained: 1 − x"]
    # a clock time's colons escaped, and only those: Streamlit's Markdown takes `:06:` for an emoji shortcode
    assert formats.times("**Spike 14:06:00–14:10:00 UTC**: p99 [open](spike?a=1)") == (
        r"**Spike 14\:06\:00–14\:10\:00 UTC**: p99 [open](spike?a=1)")


def test_a_brushed_window_is_whole_seconds() -> None:
    """A brush's float ms (as the browser sends them) become whole-second ns, the charts' resolution: a readable,
    stable link; in either order, at least a second long; against exact rational arithmetic on random brushes."""
    from dashboard.links import brushed

    assert brushed([1_763_647_921_040.9999, 1_763_648_101_000.0001]) == (1_763_647_921 * 10**9, 1_763_648_101 * 10**9)
    assert brushed([1_763_648_101_499.0, 1_763_647_921_500.5]) == (1_763_647_922 * 10**9, 1_763_648_101 * 10**9)
    assert brushed([1_763_647_921_200.0, 1_763_647_921_400.0]) == (1_763_647_921 * 10**9, 1_763_647_922 * 10**9)
    rng = np.random.default_rng(5)
    for a, b in rng.uniform(1.7e12, 1.8e12, (500, 2)):
        lo, hi = sorted(Fraction(float(x)) / 1000 for x in (a, b))
        want_a, want_b = round(lo), round(hi)
        assert brushed([float(a), float(b)]) == (want_a * 10**9, max(want_b, want_a + 1) * 10**9)


@pytest.mark.parametrize("tail", ["spike tail", "window tail"])
def test_the_stage_comparison_names_the_window_it_compares(tail: str) -> None:
    """A brushed window that is not a spike is not called one: the tail's name is the page's, on every bar."""
    import pandas as pd

    df = pd.DataFrame({"stage": ["queue_wait", "decode"], "tail_ms": [900.0, 40.0], "baseline_ms": [30.0, 35.0]})
    spec = charts.stage_compare(df, tail).to_dict()
    rows = next(iter(spec["datasets"].values()))
    assert sorted((r["stage"], r["slice"], r["ms"]) for r in rows) == [
        ("decode", "baseline tail", 35.0), ("decode", tail, 40.0),
        ("queue_wait", "baseline tail", 30.0), ("queue_wait", tail, 900.0)]
    assert spec["encoding"]["opacity"]["scale"]["domain"] == ["baseline tail", tail]
