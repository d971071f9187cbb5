"""Replicas: p50/p99 and counts per replica, outliers marked."""

from __future__ import annotations

import streamlit as st

from dashboard import charts, data, sidebar

db = data.open_store()
f = sidebar.current()
key = (db, str(db.store), db.version)
st.title("Replicas")
metric_label = st.radio("Latency", list(data.METRICS), horizontal=True, key="replica_metric")
df = data.replicas(*key, f, data.METRICS[metric_label])
if df.empty:
    st.info("No requests match the filters.")
    st.stop()
out = df[df["outlier"]]
if len(out):
    st.error("Outlier replicas (p99 far above the fleet's): "
             + ", ".join(f"**{r.replica}** ({charts.fmt_ms(r.p99_ms)})" for r in out.itertuples()))
else:
    st.success(f"No outlier among {len(df)} replicas: p99 spread {charts.fmt_ms(df['p99_ms'].min())}"
               f"–{charts.fmt_ms(df['p99_ms'].max())}.")
# the tooltip's requests: what the stored ones stand for (the table shows both counts)
st.altair_chart(charts.replica_chart(df.assign(requests=df["requests_weighted"])), width="stretch")
st.caption("Bars: p99 (red: outlier, more than 3 robust deviations and 20% above the replicas' median p99). "
           "Ticks: p50.")
st.dataframe(df, hide_index=True, column_config={
    "p50_ms": st.column_config.NumberColumn("p50 (ms)", format="%,.0f"),
    "p99_ms": st.column_config.NumberColumn("p99 (ms)", format="%,.0f"),
})
