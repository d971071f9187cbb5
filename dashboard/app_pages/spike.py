"""Spike: what explains one p99 spike (chosen, or brushed on the chart): stages, dimensions, exemplars.

Every figure is analysis.report's: a detected spike exactly as `tailscope report --json` gives it,
a brushed window explained the same way (analysis.report.explain_window) against the same baseline.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import charts, data, sidebar

db = data.open_store()
f = sidebar.current()
key = (db, str(db.store), db.version)
st.title("Spike")
if not data.summary(*key, f)["requests"]:
    st.info("No requests match the filters, so there is no spike to explain.")
    st.stop()

spikes = data.spikes(*key, f)
df = data.over_time(*key, f)
shade = [data.spike_times_ns(sp) for sp in spikes]
event = st.vega_lite_chart(charts.percentiles(df, "e2e", "end-to-end", shade, brush="brush"), on_select="rerun",
                           key="spike_brush", width="stretch")
st.caption("Drag on the chart to inspect any window; double-click to clear.")
brushed = (event.get("selection", {}) if isinstance(event, dict) else event.selection).get("brush", {}) or {}

options: dict[str, tuple[int, int]] = {}
if brushed.get("window"):
    a, b = (int(float(ms) * 1e6) for ms in brushed["window"][:2])
    options[f"brushed {charts.clock(a)}–{charts.clock(b)}"] = (a, b)
linked = st.query_params.get("start_ns"), st.query_params.get("end_ns")  # from an alert: ?start_ns=&end_ns=
linked_label = None
if all(v is not None and str(v).isdigit() for v in linked) and int(linked[1]) > int(linked[0]):  # type: ignore[arg-type]
    la, lb = int(linked[0]), int(linked[1])  # type: ignore[arg-type]
    linked_label = f"linked {charts.clock(la)}–{charts.clock(lb)}"
    options[linked_label] = (la, lb)
for sp, (ta, tb) in zip(spikes, shade, strict=True):
    options[f"spike {charts.clock(ta)}–{charts.clock(tb)} · p99 {charts.fmt_ms(sp['p99_ms'])}"] = (ta, tb)
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
ex = data.explain(*key, f, *options[label])
cols = st.columns(4)
# what the stored requests stand for (analysis' weighted count; the stored count itself when unsampled)
in_window = ex.get("requests_weighted", ex["requests"])
cols[0].metric("requests in window", f"{in_window:,.0f}",
               help=None if in_window == ex["requests"] else
               f"{ex['requests']:,} stored requests, sampled: each stands for its adjusted count")
cols[1].metric("p99", charts.fmt_ms(ex["p99_ms"]), delta_color="inverse",
               delta=None if ex.get("excess_ms") is None else charts.fmt_ms(ex["excess_ms"]))
cols[2].metric("baseline p99", charts.fmt_ms(ex["baseline_p99_ms"]))
cols[3].metric("p50 (baseline)", f"{charts.fmt_ms(ex['p50_ms'])} ({charts.fmt_ms(ex['baseline_p50_ms'])})")
st.caption(("A spike found by `tailscope report`" if ex.get("detected") else
            "Not a detected spike: explained by the report's method") + " against the report's baseline windows"
           + (f" · {'; '.join(ex['errors'])}" if ex.get("errors") else ""))
grew = (ex.get("excess_ms") or 0) > 0

st.subheader("Which stage grew in the tail")
stages = pd.DataFrame(ex.get("stages", []))
if stages.empty:
    st.info("No stage data in this window.")
else:
    top = stages.iloc[0]  # the report orders stages by share of the excess
    if grew:
        st.markdown(f"Tail requests spent **{charts.fmt_ms(top['tail_ms'])}** in **{top['stage']}** against "
                    f"{charts.fmt_ms(top['baseline_ms'])} in the baseline tail: **{top['share']:.0%}** of the "
                    "excess.")
    else:
        st.caption("This window's p99 is not above the baseline's: there is no excess to share out. The chart "
                   "still compares the two tails stage by stage.")
    st.altair_chart(charts.stage_compare(stages), width="stretch")

st.subheader("Who is in the tail: dimensions and counterfactual p99")
columns = ["dimension", "value", "explained", "p99_without_ms", "tail_share", "baseline_share", "support", "score"]
if any(d.get("support_weighted", d["support"]) != d["support"] for d in ex.get("dimensions", [])):
    columns.insert(columns.index("support") + 1, "support_weighted")  # sampled: what the support stands for
dims = pd.DataFrame(ex.get("dimensions", []), columns=columns)[columns]
pct = st.column_config.NumberColumn(format="percent")
table_config = {"tail_share": pct, "baseline_share": pct, "explained": pct,
                "support_weighted": st.column_config.NumberColumn("support (weighted)", format="%,.0f"),
                "p99_without_ms": st.column_config.NumberColumn("p99 without (ms)", format="%,.0f")}
pair = dims["dimension"].str.contains("&")
singles, pairs = dims[~pair], dims[pair]
if dims.empty:
    st.info("No dimension value is over-represented in this window's tail (after the multiple-testing guard).")
else:
    lead = dims.iloc[0]  # the report's best explanation
    explained = f" ({lead['explained']:.0%} of the excess)" if pd.notna(lead["explained"]) else ""
    st.success(f"Without **{lead['dimension']} = {lead['value']}**: p99 {charts.fmt_ms(lead['p99_without_ms'])} "
               f"instead of {charts.fmt_ms(ex['p99_ms'])}{explained}; it holds {lead['tail_share']:.0%} of the "
               f"tail against {lead['baseline_share']:.0%} of the baseline.")
    shown = singles.head(12)
    if shown["p99_without_ms"].notna().any():
        st.altair_chart(charts.counterfactual(shown.dropna(subset=["p99_without_ms"]), float(ex["p99_ms"] or 0)),
                        width="stretch")
    st.dataframe(shown, hide_index=True, column_config=table_config)
st.caption("Ranked by analysis.stats.explain: tail (requests above the baseline p99) against the baseline, a "
           "Bonferroni-guarded over-representation test, then the p99 without each value.")

st.subheader("Pairs")
if pairs.empty:
    st.caption("No pair of values explains clearly more than its parts.")
else:
    st.dataframe(pairs.head(10), hide_index=True, column_config=table_config)

st.subheader("Exemplars")
ids = tuple(ex.get("exemplars", []))
rows = data.exemplars(*key, f, len(ids), trace_ids=ids) if ids else pd.DataFrame()
if rows.empty:
    st.caption("No exemplar in this window.")
else:
    st.dataframe(rows[["trace_id", "start", "replica", "status", "latency_ms"]], hide_index=True,
                 column_config={"latency_ms": st.column_config.NumberColumn("latency (ms)", format="%,.0f")})
    if st.button("Open the slowest exemplar", key="open_trace"):
        st.session_state["trace_id"] = rows.iloc[0]["trace_id"]
        st.switch_page("app_pages/traces.py")
