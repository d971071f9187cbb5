"""Request shape: latency over input-token × output-token buckets (powers of two); p99 by bucket."""

from __future__ import annotations

import streamlit as st

from dashboard import charts, data, sidebar

db = data.open_store()
f = sidebar.current()
key = (db, str(db.store), db.version)
st.title("Request shape")
metric_label = st.radio("Latency", list(data.METRICS), horizontal=True, key="shape_metric")
metric = data.METRICS[metric_label]
grid = data.shape(*key, f, metric)  # the report's token buckets: [2^k, 2^(k+1) - 1]
if grid.empty:
    st.info("No requests with token counts match the filters.")
    st.stop()
# requests: what the stored ones stand for (analysis' weighted count; the stored count when unsampled)
grid["requests"] = grid["requests_weighted"]
value = st.radio("Colour by", ["p99_ms", "p50_ms", "requests"], horizontal=True, key="shape_value",
                 format_func={"p99_ms": "p99", "p50_ms": "p50", "requests": "requests"}.get)
st.altair_chart(charts.heatmap(grid, value), width="stretch")
worst = grid[~grid["p99_low_sample"]].sort_values("p99_ms", ascending=False).head(1)
if not worst.empty:
    w = worst.iloc[0]
    st.markdown(f"Slowest cell with a p99 to trust: input {w['input_tokens_bucket']} tokens, output "
                f"{w['output_tokens_bucket']} tokens: p99 **{charts.fmt_ms(w['p99_ms'])}** over "
                f"{w['requests']:,.0f} requests.")
else:  # say so, rather than leave out the line: every colour is a p99 of a few requests
    st.info(f"No cell holds the {data.SOLID_P99_REQUESTS} requests a p99 needs to be trusted (the most here: "
            f"{grid['n_effective'].max():,.0f}): each cell's p99 rests on its few slowest requests, so the colours "
            "compare little. Widen the filters or the time range.", icon=":material/help:")
left, right = st.columns(2)
for side, col, title in ((left, "input_tokens", "input tokens"), (right, "output_tokens", "output tokens")):
    buckets = data.shape(*key, f, metric, (col,))
    with side:
        st.altair_chart(charts.bucket_p99(buckets.assign(requests=buckets["requests_weighted"]), col, title),
                        width="stretch")
by = data.attribute_pick(db, "shape", "Latency by attribute")
if by is not None:
    data.attribute_table(db, f, metric, by, "shape")
