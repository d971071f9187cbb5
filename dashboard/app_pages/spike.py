"""Spike: what explains one p99 spike (chosen, or brushed on the chart): stages, dimensions, pairs."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from dashboard import charts, data, sidebar

db = data.open_store()
f = sidebar.current()
key = (db, str(db.store), db.version)
st.title("Spike")
c = data.choices(*key)
if not data.summary(*key, f)["requests"]:
    st.info("No requests match the filters, so there is no spike to explain.")
    st.stop()

spikes = data.spikes(*key, f, "e2e_ns")
bucket = data.bucket_seconds(f.since_ns or c["min_ns"], f.until_ns or c["max_ns"])
df = data.over_time(*key, f, bucket)
shade = [tuple(pd.Timestamp(t, unit="ns", tz="UTC") for t in data.spike_times_ns(sp)) for sp in spikes]
brush = alt.selection_interval(encodings=["x"], name="brush")
event = st.altair_chart(charts.percentiles(df, "e2e", "end-to-end", shade, brush=brush), on_select="rerun",
                        key="spike_brush", width="stretch")
st.caption("Drag on the chart to inspect any window; double-click to clear.")
brushed = (event.get("selection", {}) if isinstance(event, dict) else event.selection).get("brush", {}) or {}

options: dict[str, tuple[int, int, dict | None]] = {}
if brushed.get("window"):
    a_ms, b_ms = brushed["window"][:2]
    a, b = int(float(a_ms) * 1e6), int(float(b_ms) * 1e6)
    options[f"brushed {pd.Timestamp(a, unit='ns'):%H:%M:%S}–{pd.Timestamp(b, unit='ns'):%H:%M:%S}"] = (a, b, None)
linked = st.query_params.get("start_ns"), st.query_params.get("end_ns")  # from an alert: ?start_ns=&end_ns=
linked_label = None
if all(v is not None and str(v).isdigit() for v in linked) and int(linked[1]) > int(linked[0]):  # type: ignore[arg-type]
    la, lb = int(linked[0]), int(linked[1])  # type: ignore[arg-type]
    linked_label = f"linked {pd.Timestamp(la, unit='ns'):%H:%M:%S}–{pd.Timestamp(lb, unit='ns'):%H:%M:%S}"
    options[linked_label] = (la, lb, None)
for sp, (ta, tb) in zip(spikes, shade, strict=True):
    options[f"spike {ta:%H:%M:%S}–{tb:%H:%M:%S} · p99 {charts.fmt_ms(sp.get('p99_ms'))}"] = (
        *data.spike_times_ns(sp), sp)
if not options:
    st.info("No spike detected under these filters: p99 stayed with p50. Brush a window on the chart to "
            "inspect it anyway.")
    st.stop()
brushed_label = next((k for k in options if k.startswith("brushed")), None)
if brushed_label and st.session_state.get("_last_brush") != brushed_label:  # a new brush: show it
    st.session_state["spike_choice"] = brushed_label
st.session_state["_last_brush"] = brushed_label
if linked_label and st.session_state.get("_last_link") != linked_label:  # a new link: show its window
    st.session_state["spike_choice"] = linked_label
st.session_state["_last_link"] = linked_label
if st.session_state.get("spike_choice") not in options:
    st.session_state.pop("spike_choice", None)
label = st.selectbox("Window", list(options), key="spike_choice")
start, end, spike = options[label]
win = data.window_stats(*key, f, start, end)
base = data.baseline_stats(*key, f, start, end)
cols = st.columns(4)
cols[0].metric("requests in window", f"{win['requests']:,}")
cols[1].metric("p99", charts.fmt_ms(win["p99_ms"]), delta=charts.fmt_ms((win["p99_ms"] or 0) - (base["p99_ms"] or 0)),
               delta_color="inverse")
cols[2].metric("baseline p99", charts.fmt_ms(base["p99_ms"]))
cols[3].metric("p50 (baseline)", f"{charts.fmt_ms(win['p50_ms'])} ({charts.fmt_ms(base['p50_ms'])})")

expl = data.explain_window(db, f, start, end, spike, base["p99_ms"])
grew = (win["p99_ms"] or 0) > (base["p99_ms"] or 0)
source = "analysis.explain (tail vs baseline, multiple-testing guard)" if spike and spike.get("dimensions") else \
    "a plain SQL contrast of the window's tail against the window"
st.subheader("Which stage grew in the tail")
stages = expl["stages"]
if db.pending and not (spike and spike.get("stages")):
    st.info(db.loading_note() or "")
elif stages.empty:
    st.info("No stage data in this window.")
else:
    top = stages.sort_values("share", ascending=False).iloc[0]
    if not grew:
        st.caption("This window's p99 is not above the baseline's: its tail is not slower, so there is no "
                   "excess to share out. The chart still compares the two tails stage by stage.")
    else:
        st.markdown(f"Tail requests spent **{charts.fmt_ms(top['tail_ms'])}** in **{top['stage']}** against "
                    f"{charts.fmt_ms(top['baseline_ms'])} in the baseline tail: **{top['share']:.0%}** of the "
                    "excess.")
    st.altair_chart(charts.stage_compare(stages), width="stretch")

st.subheader("Who is in the tail: dimensions and counterfactual p99")
dims = expl["dimensions"]
pct = st.column_config.NumberColumn(format="percent")
table_config = {"tail_share": pct, "baseline_share": pct, "explained": pct,
                "p99_without_ms": st.column_config.NumberColumn("p99 without (ms)", format="%,.0f")}
if dims.empty:
    st.info("No dimension value is over-represented in this window's tail.")
elif not grew:
    st.caption("This window's p99 is not above the baseline's; values over-represented in its tail:")
    st.dataframe(dims.head(12), hide_index=True, column_config=table_config)
else:
    lead = dims.iloc[0]
    explained = f" ({lead['explained']:.0%} of the excess)" if pd.notna(lead["explained"]) else ""
    st.success(f"Without **{lead['dimension']} = {lead['value']}**: p99 {charts.fmt_ms(lead['p99_without_ms'])} "
               f"instead of {charts.fmt_ms(win['p99_ms'])}{explained}; it holds {lead['tail_share']:.0%} of the "
               f"tail against {lead['baseline_share']:.0%} of the baseline.")
    shown = dims.head(12)
    if shown["p99_without_ms"].notna().any():
        st.altair_chart(charts.counterfactual(shown.dropna(subset=["p99_without_ms"]), float(win["p99_ms"] or 0)),
                        width="stretch")
    st.dataframe(shown, hide_index=True, column_config=table_config)
st.caption(f"Ranked by {source}.")

st.subheader("Pairs")
if expl["pairs"].empty:
    st.caption("No pair of values stands out in this window's tail.")
else:
    pairs = expl["pairs"].head(10)
    st.dataframe(pairs[[c for c in pairs.columns if pairs[c].notna().any()]], hide_index=True,
                 column_config=table_config)

st.subheader("Exemplars")
ex = data.exemplars(*key, f.narrowed(start, end), 10)
st.dataframe(ex[["trace_id", "start", "replica", "status", "latency_ms"]], hide_index=True,
             column_config={"latency_ms": st.column_config.NumberColumn("latency (ms)", format="%,.0f")})
if not ex.empty and st.button("Open the slowest trace", key="open_trace"):
    st.session_state["trace_id"] = ex.iloc[0]["trace_id"]
    st.switch_page("app_pages/traces.py")
