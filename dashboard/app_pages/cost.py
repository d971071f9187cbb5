"""Cost: fair-share GPU time per tenant / model / version / replica, its price, idle share and the tail's share."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from analysis.cost import COST_GROUPS
from dashboard import charts, data, formats, sidebar

db = data.open_store()  # a store, or a ClickHouse table (the sweep then runs on the server)
f = sidebar.current()
key = (db, str(db.store), db.version)
st.title("Cost")
if not data.choices(*key)["requests"]:
    st.info("No requests in the store yet: no GPU time to share out.")
    st.stop()
left, right = st.columns(2)
# the first choice and the price as data.prewarm_cost_page's: the unfiltered page's work started early is this one
by = left.radio("Per", list(COST_GROUPS), horizontal=True, key="cost_by", format_func=lambda v: v.replace("_", " "))
price = right.number_input("USD per GPU-hour", min_value=0.0, value=data.page_price(db) or 0.0, step=0.1,
                           key="cost_price", help="0 shows GPU time only. Per-replica and per-model prices: "
                                                  "STORE/prices.toml (docs/cost.md; a store only).")
usd = float(price) if price else None
bucket = data.cost_bucket_s(*key, f)
in_range = data.detection(*key, data.Filters(f.since_ns, f.until_ns))["requests"]  # the sweep's requests
#: the filters the page can group by (a filter on one of them narrows the table to its values when grouped by it)
GROUPED_FILTERS = tuple(d for d in COST_GROUPS if d in data.FILTER_DIMENSIONS)
values = tuple(getattr(f, by)) if by in GROUPED_FILTERS else ()
res, series = data.finished(data.cost_started(*key, f, by, bucket, usd, values or None), in_range,
                            "Sharing out GPU time over the range: the figures appear here when the sweep is done.")
if "error" in res:
    st.warning(res["error"])
    st.stop()
rows = pd.DataFrame(res["rows"])
if values and not rows.empty:
    rows = rows[rows["key"].isin(values)]
tot = res["totals"]
shown = res["selected"] if values else tot  # the filtered values' totals (analysis.cost), else the fleet's
# the sweep shares out the whole fleet's time over the range: a filter narrows the table to its own values when the
# page groups by its dimension, and no further (a replica's time is split among all the requests it served)
unused = [f"{d.replace('_', ' ')} = {', '.join(getattr(f, d))}" for d in data.FILTER_DIMENSIONS
          if getattr(f, d) and d != by] + [f"{a.key} = {', '.join(a.values)}" for a in f.attributes if a.values]
if unused:
    can = sorted(d for d in GROUPED_FILTERS if getattr(f, d) and d != by)
    st.info(formats.escape(f"GPU time is shared out over the whole fleet in the time range: {'; '.join(unused)} "
                           f"{'does' if len(unused) == 1 else 'do'} not narrow it here."
                           + (f" Group by {' or '.join(can)} to read {'its' if len(unused) == 1 else 'their'} share."
                              if can else "")), icon=":material/filter_alt_off:")
row = formats.metric_row()
fleet = f"The fleet's, over the range: {tot['allocated_ns'] / 3.6e12:,.2f} GPU-hours."
row.metric("GPU-hours allocated" + (f" ({by.replace('_', ' ')} filtered)" if values else ""),
           f"{shown['allocated_ns'] / 3.6e12:,.2f}", help=fleet if values else None)
row.metric("fleet idle share" if values else "idle share",
           "–" if tot["idle_share"] is None else f"{tot['idle_share']:.1%}",
           help="Replica time with no request in a GPU stage (cold start is counted apart).")
value, unset = formats.usd_metric(shown["allocated_usd"])
row.metric("cost", value, help=unset or "Allocated GPU time at the price; idle and cold start are in the next "
                                        "figure.")
value, unset = formats.usd_metric(tot["overhead_usd"])
row.metric("fleet idle + cold start" if values else "idle + cold start", value, help=unset)
if rows.empty:
    st.info("No GPU time in this range.")
    st.stop()
rows["requests"] = rows["requests_weighted"]  # what the stored requests stand for (equal when unsampled)
priced = usd is not None or rows["cost_usd"].notna().any()
money = ["cost_usd", "usd_per_1k_output_tokens"] if priced else []
formats.table(rows[["key", "gpu_seconds", *money, "requests", "input_tokens", "output_tokens", "tail_gpu_share"]], {
    "key": st.column_config.TextColumn(by.replace("_", " ")),
    "gpu_seconds": formats.number("GPU seconds", "%,.1f"),
    "cost_usd": formats.number("USD", "$%,.2f"),
    "requests": formats.number("requests"), "input_tokens": formats.number("input tokens"),
    "output_tokens": formats.number("output tokens"),
    "usd_per_1k_output_tokens": formats.number("USD per 1k output tokens", "$%,.4f"),
    "tail_gpu_share": st.column_config.ProgressColumn("p99 tail's GPU share", format="percent", min_value=0.0,
                                                      max_value=1.0),
})
if not priced:
    st.caption(f"No price: {formats.NO_PRICE} to see USD columns.")
st.caption("GPU time: at each instant a replica's time is split equally among its requests in prefill, decode "
           "or (unsplit) generation; the p99 tail's share is the part spent on each group's slowest 1% (e2e).")
assert series is not None
st.subheader("GPU time over time")
# lazy: the chart is sent and drawn only once the expander is opened (a page's first Vega-Lite chart costs a new
# browser profile about as much as the rest of this page's first render together: docs/dashboard.md)
over_time = st.expander(f"GPUs per {by.replace('_', ' ')}, each {bucket} s cell", key="cost_over_time",
                        on_change="rerun")
if over_time.open:
    if values:
        series = series[series["key"].isin([*values, "(idle)", "(cold start)"])]
    # the cells the range's arrivals fill: none from its end on (the time filter's, else the end of the cell holding
    # the last request's start), where requests still running would draw their draining as a drop to zero; a cell
    # the time filter's end cuts is drawn, its GPUs read over the part of it observed (analysis.cost.cost_series)
    cell_ns = bucket * 1_000_000_000
    end_ns = f.until_ns if f.until_ns is not None else -(-(data.choices(*key)["max_ns"] + 1) // cell_ns) * cell_ns
    after = series["bucket_ns"] >= end_ns
    tail_s = float(series.loc[after & ~series["key"].isin(["(idle)", "(cold start)"]), "gpu_seconds"].sum())
    cut_ns = int(series.loc[after, "bucket_ns"].min()) if after.any() else end_ns
    series = series[~after].copy()
    series["time"] = pd.to_datetime(series["bucket_ns"], unit="ns", utc=True)
    series["clock"] = series["time"].dt.strftime("%H:%M:%S")
    with over_time:
        st.altair_chart(alt.Chart(series).mark_area().encode(
            x=alt.X("time:T", title="UTC", scale=alt.Scale(type="utc"), axis=alt.Axis(format=charts.AXIS_CLOCK)),
            y=alt.Y("sum(gpus):Q", stack=True, title="GPUs (GPU seconds a second)", axis=alt.Axis(format=",.1~f")),
            color=alt.Color("key:N", title=by.replace("_", " ")),
            tooltip=[alt.Tooltip("clock:N", title="time (UTC)"), alt.Tooltip("key:N", title=by.replace("_", " ")),
                     alt.Tooltip("gpus:Q", format=",.2f", title="GPUs"),
                     alt.Tooltip("gpu_seconds:Q", format=",.1f", title=f"GPU seconds in the {bucket} s")]),
            width="stretch")
        st.caption(f"Each {bucket} s cell's GPU time over the part of it that was observed (from the first span of "
                   "any replica in the range to the last), so a cell at the edge of the data does not read low.")
        if after.any():
            st.caption(formats.times(f"Not drawn: the cells from {charts.clock(cut_ns)} UTC on, which the range's "
                                     f"arrivals do not fill (requests still running: {tail_s:,.1f} GPU seconds, in "
                                     "the figures above)."))
st.subheader("Replicas")
reps = pd.DataFrame(res["replicas"])
formats.table(reps[["replica", "observed_seconds", "allocated_seconds", "cold_start_seconds", "idle_seconds",
                    "idle_share"]], {
    "observed_seconds": formats.number("observed (s)", "%,.1f"),
    "allocated_seconds": formats.number("allocated to requests (s)", "%,.1f"),
    "cold_start_seconds": formats.number("cold start (s)", "%,.1f"),
    "idle_seconds": formats.number("idle (s)", "%,.1f"),
    "idle_share": st.column_config.ProgressColumn("idle share", format="percent", min_value=0.0, max_value=1.0)})
