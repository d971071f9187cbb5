"""What-if: replay the observed arrivals through a k-replica queue; predicted p50/p99 beside observed."""

from __future__ import annotations

import streamlit as st

from dashboard import charts, data, sidebar

db = data.open_store()
f = sidebar.current()
key = (db, str(db.store), db.version)
st.title("What-if")
reps = data.replicas(*key, f)
if reps.empty:
    st.info("No requests match the filters: nothing to replay.")
    st.stop()
observed = len(reps)
k = st.slider("Replicas", min_value=1, max_value=max(4, observed * 3), value=observed, key="whatif_replicas")
res = data.whatif(*key, f, k)
cols = st.columns(4)
cols[0].metric("observed p50", charts.fmt_ms(res["observed_p50_ms"]))
cols[1].metric("observed p99", charts.fmt_ms(res["observed_p99_ms"]))
cols[2].metric(f"predicted p50 ({k} replicas)", charts.fmt_ms(res["predicted_p50_ms"]))
cols[3].metric(f"predicted p99 ({k} replicas)", charts.fmt_ms(res["predicted_p99_ms"]))
if res.get("error"):
    st.warning(res["error"])
    st.stop()
curve = data.whatif_curve(*key, f, tuple(sorted({max(1, observed // 2), observed - 1, observed, observed + 1,
                                                 observed * 2, k} - {0})))
if not curve.empty:
    st.altair_chart(charts.whatif_chart(curve, observed), width="stretch")
st.caption(res.get("note") or f"Observed: {observed} replicas. The replay keeps each request's arrival time "
           "and service time and queues it FIFO for the first free replica.")
