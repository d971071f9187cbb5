"""Request shape: latency over input-token × output-token buckets (powers of two); p99 by bucket."""

from __future__ import annotations

import streamlit as st

from analysis.explain import bucket_bounds, bucket_label
from dashboard import charts, data, sidebar

db = data.open_store()
f = sidebar.current()
key = (db, str(db.store), db.version)
st.title("Request shape")
metric_label = st.radio("Latency", list(data.METRICS), horizontal=True, key="shape_metric")
metric = data.METRICS[metric_label]
grid = data.shape(*key, f, metric)
if grid.empty:
    st.info("No requests with token counts match the filters.")
    st.stop()
value = st.radio("Colour by", ["p99_ms", "p50_ms", "requests"], horizontal=True, key="shape_value")
st.altair_chart(charts.heatmap(grid, value), width="stretch")
worst = grid[grid["requests"] >= 20].sort_values("p99_ms", ascending=False).head(1)
if not worst.empty:
    w = worst.iloc[0]
    i_lo, o_lo, n = int(w["input_lo"]), int(w["output_lo"]), int(w["requests"])
    i_label, o_label = (bucket_label(*bucket_bounds(lo)) for lo in (i_lo, o_lo))
    st.markdown(f"Slowest well-populated cell: input {i_label} tokens, output {o_label} "
                f"tokens: p99 **{charts.fmt_ms(w['p99_ms'])}** over {n:,} requests.")
left, right = st.columns(2)
with left:
    st.altair_chart(charts.bucket_p99(data.shape_by_bucket(*key, f, "input_tokens", metric), "input tokens"),
                    width="stretch")
with right:
    st.altair_chart(charts.bucket_p99(data.shape_by_bucket(*key, f, "output_tokens", metric), "output tokens"),
                    width="stretch")
