"""Overview: p50/p90/p99 over time for e2e, TTFT and TPOT (a tab each) with spikes shaded; outcome counts.

The spikes are the report's (data.spike_marks: detection without the explanations, which the
Spike page shows); on a store that just opened they are being computed in the background
(Workbench.warm) while this page computes its summary and series. The page imports neither pandas
nor Altair (polars frames, Vega-Lite specs: see dashboard.charts).
"""

from __future__ import annotations

import polars as pl
import streamlit as st

from dashboard import charts, data, formats, links, sidebar

db = data.open_store()
f = sidebar.current()
key = (db, str(db.store), db.version)

st.title("Overview")
s = data.summary(*key, f)
if not s["requests"]:
    st.info("No requests match: the store is empty, no span is recognised as a request, or the filters exclude "
            "everything. Ingest traces with `tailscope ingest FILE` or widen the filters; "
            f"{data.no_request_hint(db.store)}.")
    st.stop()

df = data.over_time(*key, f)
verdict = data.spike_verdict(*key, f)
marks, spikes = verdict["marks"], verdict["spikes"]
row = formats.metric_row()
row.metric("requests", f"{s['requests_weighted']:,.0f}")  # what the stored ones stand for when sampled
row.metric("errors", f"{s['error_weighted']:,.0f}")
row.metric("timeouts", f"{s['timeout_weighted']:,.0f}")
row.metric("p50", charts.fmt_ms(s["e2e_p50_ms"]))
row.metric("p99", charts.fmt_ms(s["e2e_p99_ms"]))
# not judged: "?" (a longer word is cut short in a sixth of the page), the banner below and the help say why
row.metric("spikes", len(spikes) if verdict["judged"] else "?",
           help=None if verdict["judged"] else
           f"Not judged: spike detection could not judge these filters: {verdict['reason']}.")

shade = [data.spike_times_ns(sp) for sp in spikes]
for sp, (a, b) in zip(spikes, shade, strict=True):
    st.warning(formats.times(f"**Spike {charts.window_label(a, b)}**: p99 {charts.fmt_ms(sp.get('p99_ms'))} against a "
               f"baseline of {charts.fmt_ms(sp.get('baseline_p99_ms'))}, p50 {charts.fmt_ms(sp.get('p50_ms'))}. "
               f"[Open it on the Spike page]({links.url('spike', f, data.FILTER_DIMENSIONS, start_ns=a, end_ns=b)}) "
               "to see what explains it."), icon=":material/local_fire_department:")
context = [data.spike_times_ns(sp) for sp in verdict["context"]]
if not verdict["judged"]:
    st.error(formats.not_judged(verdict["reason"], context), icon=":material/help:")
notes = "; ".join(marks.get("warnings", []) + [e for e in marks.get("errors", []) if verdict["judged"]])
st.caption(f"windows of {data.window_s(*key, f)} s (the report's) · exact percentiles (quantile_cont) · shaded: "
           "p99 spikes of end-to-end latency found by `tailscope report`" + (f" · {notes}" if notes else ""))
fired = None if not db.can("alerts") else data.alerts(str(db.store), f.since_ns, f.until_ns)
if fired is not None and not fired.is_empty():
    st.caption(f"red rules: {fired.height} alert(s) of `tailscope watch` at the start of their window "
               "(see the Alerts page)")


@st.fragment
def latency_chart(df: pl.DataFrame, shade: list[tuple[int, int]], window_s: int, fired: pl.DataFrame | None,
                  context: list[tuple[int, int]]) -> None:
    """One tab per latency metric with values, only the open one's chart drawn (a tab switch reruns this alone):
    a first render draws one percentile chart, not three."""
    shown = [(label, prefix) for label, prefix in data.METRICS.items() if charts.has_values(df, prefix)]
    if not shown:
        return
    tabs = st.tabs([label for label, _ in shown], key="overview_latency", on_change="rerun")
    for tab, (label, prefix) in zip(tabs, shown, strict=True):
        if tab.open is not False:
            tab.vega_lite_chart(charts.percentiles(df, prefix, label, shade, window_s, alerts=fired,
                                                   context=context),
                                width="stretch")


win = data.window_s(*key, f)
latency_chart(df, shade, win, fired, context)
st.vega_lite_chart(charts.counts(df, shade, win), width="stretch")
failed = tuple(o for o in data.OUTCOMES if o != "ok")
st.vega_lite_chart(charts.counts(df, shade, win, failed, "failed requests per window (own scale)"), width="stretch")
