"""Cost: fair-share GPU time per tenant / model / version / replica, its price, idle share and the tail's share."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from dashboard import data, sidebar

db = data.open_store()  # a store, or a ClickHouse table (the sweep then runs on the server)
f = sidebar.current()
key = (db, str(db.store), db.version)
st.title("Cost")
if not data.choices(*key)["requests"]:
    st.info("No requests in the store yet: no GPU time to share out.")
    st.stop()
left, right = st.columns(2)
by = left.radio("Per", ["tenant", "model", "model_version", "replica"], horizontal=True, key="cost_by")
default = None if data.on_clickhouse(db) else data.price_default(str(db.store))
price = right.number_input("USD per GPU-hour", min_value=0.0, value=default or 0.0, step=0.1, key="cost_price",
                           help="0 shows GPU time only. Per-replica and per-model prices: STORE/prices.toml "
                                "(docs/cost.md; a store only).")
usd = float(price) if price else None
res = data.cost_summary(*key, f, by, usd)
if "error" in res:
    st.warning(res["error"])
    st.stop()
rows = pd.DataFrame(res["rows"])
values = getattr(f, by, ()) if by != "model_version" else ()
if values and not rows.empty:
    rows = rows[rows["key"].isin(values)]
tot = res["totals"]
cols = st.columns(4)
cols[0].metric("GPU-hours allocated", f"{tot['allocated_ns'] / 3.6e12:,.2f}")
cols[1].metric("idle share", "-" if tot["idle_share"] is None else f"{tot['idle_share']:.1%}",
               help="Replica time with no request in a GPU stage (cold start is counted apart).")
cols[2].metric("cost", "-" if tot["allocated_usd"] is None else f"${tot['allocated_usd']:,.2f}",
               help="Allocated GPU time at the price; idle and cold start are in the next figure.")
cols[3].metric("idle + cold start", "-" if tot["overhead_usd"] is None else f"${tot['overhead_usd']:,.2f}")
if rows.empty:
    st.info("No GPU time in this range.")
    st.stop()
rows["requests"] = rows["requests_weighted"]  # what the stored requests stand for (equal when unsampled)
st.dataframe(rows[["key", "gpu_seconds", "cost_usd", "requests", "input_tokens", "output_tokens",
                   "usd_per_1k_output_tokens", "tail_gpu_share"]], hide_index=True, column_config={
    "key": st.column_config.TextColumn(by),
    "gpu_seconds": st.column_config.NumberColumn("GPU-s", format="%,.1f"),
    "cost_usd": st.column_config.NumberColumn("USD", format="$%.2f"),
    "usd_per_1k_output_tokens": st.column_config.NumberColumn("USD / 1k out", format="$%.4f"),
    "tail_gpu_share": st.column_config.ProgressColumn("p99 tail's GPU share", format="percent", min_value=0.0,
                                                      max_value=1.0),
})
st.caption("GPU time: at each instant a replica's time is split equally among its requests in prefill, decode "
           "or (unsplit) generation; the p99 tail's share is the part spent on each group's slowest 1% (e2e).")
bucket = data.window_s(*key, f)  # the report's windows, as on every page
series = data.cost_over_time(*key, f, by, bucket, usd)
if values:
    series = series[series["key"].isin([*values, "(idle)", "(cold start)"])]
series["time"] = pd.to_datetime(series["bucket_ns"], unit="ns", utc=True)
st.subheader("GPU time over time")
st.altair_chart(alt.Chart(series).mark_area().encode(
    x=alt.X("time:T", title=None), y=alt.Y("sum(gpu_seconds):Q", stack=True, title=f"GPU-s per {bucket} s"),
    color=alt.Color("key:N", title=by), tooltip=["time:T", "key:N", alt.Tooltip("gpu_seconds:Q", format=",.1f")]),
    width="stretch")
st.subheader("Replicas")
reps = pd.DataFrame(res["replicas"])
st.dataframe(reps[["replica", "observed_seconds", "allocated_seconds", "cold_start_seconds", "idle_seconds",
                   "idle_share"]], hide_index=True, column_config={
    "idle_share": st.column_config.ProgressColumn("idle share", format="percent", min_value=0.0, max_value=1.0)})
