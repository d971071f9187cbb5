"""Spike: what explains one p99 spike (chosen, or brushed on the chart): stages, dimensions, exemplars.

Every figure is analysis.report's: a detected spike exactly as `tailscope report --json` gives it,
a brushed window explained the same way (analysis.report.explain_window) against the same baseline.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from analysis.report import folded_pairs
from dashboard import charts, data, formats, links, sidebar

db = data.open_store()
f = sidebar.current()
key = (db, str(db.store), db.version)
st.title("Spike")
if not data.detection(*key, f)["requests"]:
    st.info("No requests match the filters, so there is no spike to explain.")
    st.stop()

verdict = data.spike_verdict(*key, f, explained=True)  # the marks from the report this page explains: one detection
spikes = data.spikes(*key, f) if verdict["judged"] else []
df = data.over_time(*key, f, ("e2e",))
shade = [data.spike_times_ns(sp) for sp in spikes]
context = [data.spike_times_ns(sp) for sp in verdict["context"]]
judged = verdict["judged"]  # not judged: no window is explained under these filters, so the chart takes no brush
spec = charts.percentiles(df, "e2e", "end-to-end", shade, data.window_s(*key, f), brush="brush" if judged else None,
                          context=context)
brushed: dict = {}
if judged:
    event = st.vega_lite_chart(spec, on_select="rerun", key="spike_brush", width="stretch")
    brushed = (event.get("selection", {}) if isinstance(event, dict) else event.selection).get("brush", {}) or {}
    st.caption("Drag on the chart to inspect any window; double-click to clear. Times are UTC.")
else:
    st.vega_lite_chart(spec, key="spike_brush", width="stretch")
    st.caption("Times are UTC. A window can be inspected here once the filters hold enough requests to judge.")
    st.error(formats.not_judged(verdict["reason"], context, " Clear the filters to explain them."),
             icon=":material/help:")
    st.stop()

options: dict[str, tuple[int, int]] = {}
if brushed.get(charts.MIDDLE):  # the brushed interval of the lines' x
    a, b = links.brushed(brushed[charts.MIDDLE])
    options[f"brushed {charts.window_label(a, b)}"] = (a, b)
linked = links.window()  # from a link: ?start_ns=&end_ns= (alerts, banners, a shared view)
followed = links.new_window()
if linked is not None and linked not in shade and linked not in options.values():
    options[f"linked {charts.window_label(*linked)}"] = linked
for sp, (ta, tb) in zip(spikes, shade, strict=True):
    options[f"spike {charts.window_label(ta, tb)} · p99 {charts.fmt_ms(sp['p99_ms'])}"] = (ta, tb)
if not options:
    marks = verdict["marks"]
    st.success(f"No spike: detection judged {marks.get('windows', 0):,} windows of {marks.get('window_s')} s under "
               "these filters and no stretch of them had a p99 that broke away from the baseline's. Brush a window "
               "on the chart to inspect it anyway.")
    st.stop()
brushed_label = next((k for k in options if k.startswith("brushed")), None)
if brushed_label and st.session_state.get("_last_brush") != brushed_label:  # a new brush: show it
    st.session_state["spike_choice"] = brushed_label
st.session_state["_last_brush"] = brushed_label
if followed is not None and not brushed_label:  # a link followed: show its window
    st.session_state["spike_choice"] = next(k for k, v in options.items() if v == followed)
if st.session_state.get("spike_choice") not in options:
    st.session_state.pop("spike_choice", None)
# a radio, not a select box: its script is a few KB where the select box's is about 140 KB, loaded on a first
# click; its labels are Markdown, so their clock times' colons are escaped (formats.times: no emoji plugin)
label = st.radio("Window", list(options), key="spike_choice", format_func=formats.times)
links.set_window(*options[label])
ex = data.explain(*key, f, *options[label])
standing = data.against_baseline(ex)
row = formats.metric_row()
# what the stored requests stand for (analysis' weighted count; the stored count itself when unsampled)
in_window = ex.get("requests_weighted", ex["requests"])
row.metric("requests in window", f"{in_window:,.0f}",
           help=None if in_window == ex["requests"] else
           f"{ex['requests']:,} stored requests, sampled: each stands for its adjusted count")
row.metric("p99", charts.fmt_ms(ex["p99_ms"]), delta_color="inverse",
           delta=None if ex.get("excess_ms") is None else charts.fmt_ms(ex["excess_ms"]))
row.metric("baseline p99", charts.fmt_ms(ex["baseline_p99_ms"]))
row.metric("p50 (baseline)", f"{charts.fmt_ms(ex['p50_ms'])} ({charts.fmt_ms(ex['baseline_p50_ms'])})")
st.caption(("A spike found by `tailscope report`" if ex.get("detected") else
            "Not a detected spike: explained by the report's method") + " against the report's baseline windows"
           + (f" · {'; '.join(ex['errors'])}" if ex.get("errors") else ""))
grew = standing in ("above", "slightly above")
if standing == "at or below":
    st.info(f"This window's p99 ({charts.fmt_ms(ex['p99_ms'])}) is at or below the baseline p99 "
            f"({charts.fmt_ms(ex['baseline_p99_ms'])}): there is no excess, so nothing to explain. The comparisons "
            "below are shown for reference only.", icon=":material/info:")
elif standing == "slightly above":
    st.info(f"This window's p99 is above the baseline p99, but by less than the {data.MIN_RISE:.0%} a spike needs: "
            "read the explanations below as weak.", icon=":material/info:")

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
                   "below still compares the two tails stage by stage.")
    # lazy: the chart is sent and drawn only once the expander is opened (a Vega-Lite view is the costliest element
    # of a first render after the page's first chart: docs/dashboard.md); the sentence above names the top stage
    by_stage = st.expander("Every stage: the tail against the baseline tail", key="spike_stages", on_change="rerun")
    if by_stage.open:
        by_stage.altair_chart(charts.stage_compare(stages, "spike tail" if ex.get("detected") else "window tail"),
                              width="stretch")

st.subheader("Who is in the tail: dimensions and counterfactual p99")
columns = ["dimension", "value", "explained", "p99_without_ms", "baseline_p99_without_ms", "tail_share",
           "baseline_share", "support", "score"]
if any(d.get("support_weighted", d["support"]) != d["support"] for d in ex.get("dimensions", [])):
    columns.insert(columns.index("support") + 1, "support_weighted")  # sampled: what the support stands for
dims = pd.DataFrame(ex.get("dimensions", []), columns=columns)[columns]
# each value (or pair) links to the Overview filtered to it, where the sidebar filters it (links.value_url)
dims["filter"] = [links.value_url(f, d["conditions"], data.FILTER_DIMENSIONS) for d in ex.get("dimensions", [])]
pct = st.column_config.NumberColumn(format="percent")
ms = "%,.0f ms"
table_config = {
    "explained": st.column_config.NumberColumn("share of the excess explained", format="percent",
                                               help="1 − (p99 without − baseline p99 without) / (p99 − baseline p99): "
                                                    "negative when leaving the value out widens the gap"),
    "p99_without_ms": st.column_config.NumberColumn("p99 without", format=ms),
    "baseline_p99_without_ms": st.column_config.NumberColumn("baseline p99 without", format=ms),
    "tail_share": st.column_config.NumberColumn("share of the tail", format="percent"),
    "baseline_share": st.column_config.NumberColumn("share of the baseline", format="percent"),
    "support": st.column_config.NumberColumn("tail requests", format="%,d"),
    "support_weighted": st.column_config.NumberColumn("tail requests (weighted)", format="%,.0f"),
    "score": st.column_config.NumberColumn("score", format="%.2f"),
    "filter": st.column_config.LinkColumn("filter", display_text="filter to this value",
                                          help="Open the Overview with the current filters narrowed to this value")}
pair = dims["dimension"].str.contains("&")
# a pair explaining no more than a value ranked before it is folded under that value (analysis' `folded_under`)
folded = folded_pairs(ex.get("dimensions", []))
unfolded = pd.Series(["folded_under" not in d for d in ex.get("dimensions", [])], index=dims.index, dtype=bool)
singles, pairs = dims[~pair], dims[pair & unfolded]
if dims.empty:
    st.info("No dimension value is over-represented in this window's tail (after the multiple-testing guard).")
else:
    lead = dims.iloc[0]  # the report's best explanation
    if standing == "above" and pd.notna(lead["explained"]) and lead["explained"] > 0:
        st.success(f"Without **{lead['dimension']} = {lead['value']}**: p99 {charts.fmt_ms(lead['p99_without_ms'])} "
                   f"instead of {charts.fmt_ms(ex['p99_ms'])} (baseline without it: "
                   f"{charts.fmt_ms(lead['baseline_p99_without_ms'])}; {lead['explained']:.0%} of the excess "
                   f"explained); it holds {lead['tail_share']:.0%} of the tail against {lead['baseline_share']:.0%} "
                   "of the baseline.")
    elif standing == "above":
        st.info("No single value explains the excess: leaving any of them out does not bring the p99 nearer its "
                "baseline.")
    levels = [(name, lv) for name in ("finer", "coarser") for lv in ex["dimensions"][0].get(name, [])]
    if levels:  # the lead's hierarchy (analysis.report.rank_dimensions): each level's value, filterable too
        st.markdown(f"Levels nested with **{lead['dimension']} = {lead['value']}**:\n" + "\n".join(
            f"- {name} · {lv['dimension']} = {lv['value']} alone explains "
            f"{'-' if lv['explained'] is None else format(lv['explained'], '.0%')}"
            + (f" · [filter to this value]({u})" if (u := links.value_url(f, [lv], data.FILTER_DIMENSIONS)) else "")
            for name, lv in levels))
    shown = singles.head(12)
    if shown["p99_without_ms"].notna().any():
        st.altair_chart(charts.counterfactual(shown.dropna(subset=["p99_without_ms"]), float(ex["p99_ms"] or 0),
                                              ex.get("baseline_p99_ms")), width="stretch")
    formats.table(shown, table_config)
st.caption("Ranked by analysis.stats.explain, best explanation first: tail (requests above the baseline p99) "
           "against the "
           "baseline, a Bonferroni-guarded over-representation test, then the p99 without each value, left out of "
           "the window and of the baseline alike.")

st.subheader("Pairs")
if pairs.empty:
    st.caption("No pair of values explains clearly more than its parts.")
else:
    formats.table(pairs.head(10), table_config, notes=False)  # the same columns as the table above
if folded:  # the folded pairs, each with the value it restates and its filter link
    under = [ex["dimensions"][d["folded_under"]] for d in ex.get("dimensions", []) if "folded_under" in d]
    # lazy: the table is sent and drawn only once the expander is opened (a closed one still mounts its children)
    box = st.expander(f"{len(under)} pairs folded: each explains no more than one of its values", key="spike_folded",
                      on_change="rerun")
    if box.open:
        restated = dims[~unfolded].copy()
        restated.insert(0, "folded_under", [f"{d['dimension']} = {d['value']}" for d in under])
        with box:
            formats.table(restated, {**table_config, "folded_under": st.column_config.TextColumn("folded under")},
                          notes=False)

st.subheader("Exemplars")
ids = tuple(ex.get("exemplars", []))
rows = data.exemplars(*key, f, len(ids), trace_ids=ids) if ids else pd.DataFrame()
if rows.empty:
    st.caption("No exemplar in this window.")
else:
    links.exemplar_table(rows, f)
