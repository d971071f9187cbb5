"""Alerts: what `tailscope watch` fired and resolved (kept in STORE/alerts/), each linking to its window."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import data, formats, sidebar

db = data.open_for("Alerts", "alerts")
f = sidebar.current()
st.title("Alerts")
df = data.alerts(str(db.store), f.since_ns, f.until_ns).to_pandas()
if df.empty:
    st.info("No alert in this range. Alerts appear here when `tailscope watch` runs on this store "
            "(docs/watch.md); `tailscope watch --replay` shows what it would have fired.")
    st.stop()
firing = int((df["status"] == "firing").sum())
row = formats.metric_row()
row.metric("alerts", f"{len(df):,}")
row.metric("firing now", f"{firing:,}")
row.metric("resolved", f"{len(df) - firing:,}")
df = df.assign(
    window=[f"spike?start_ns={a}&end_ns={b}" for a, b in zip(df["window_start_ns"], df["window_end_ns"], strict=True)],
    start=pd.to_datetime(df["window_start_ns"], unit="ns", utc=True),
)
shown = df[["status", "kind", "rule", "metric", "fired_at", "resolved_at", "start", "p50_ms", "p99_ms",
            "baseline_p99_ms", "stage", "dimension", "value", "exemplars", "window", "id"]]
ms = st.column_config.NumberColumn(format="%,.0f")
st.dataframe(shown, hide_index=True, column_config={
    "window": st.column_config.LinkColumn("window", display_text="open the Spike page"),
    "start": st.column_config.DatetimeColumn("window start", format="YYYY-MM-DD HH:mm:ss"),
    "p50_ms": ms, "p99_ms": ms, "baseline_p99_ms": ms})
st.caption("Firing alerts have no resolved_at. `kind`: tail_spike (p99 broke away with a flat median, "
           "explained) or slo (a rule of the rules file). Times are UTC.")
