"""Traces: the waterfall of one trace (its critical path highlighted) first, then the tail's exemplars.

The trace shown is the URL's `?trace=` (an exemplar link from this page or the Spike page, or a shared view),
else the one typed, else the slowest.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import charts, data, formats, links, sidebar
from tracing import schema as S

#: The slowest requests listed (a static table: formats.STATIC_ROWS at most), the stage chart's too.
EXEMPLARS = 20

db = data.open_store()
f = sidebar.current()
key = (db, str(db.store), db.version)
st.title("Traces")

linked = links.new_trace()
if linked:  # a link followed: show its trace
    st.session_state["trace_id"] = linked
ex = data.exemplars(*key, f, EXEMPLARS)
wanted = st.text_input("Trace id (full, or a prefix of 8+ hex digits)", key="trace_id",
                       placeholder="e.g. 7a11000000000000000000000000002a")
if ex.empty and not wanted:
    st.info("No requests match the filters: nothing to show.")
    st.stop()
trace_id = wanted or str(ex.iloc[0]["trace_id"])
trace_box = st.container()
# the exemplars first (drawn below the trace: trace_box holds its place above), sent while the server computes
# the waterfall; a Markdown table (links.exemplar_table), not the grid, whose script (about 1.5 MB) a first visit
# would load and compile on the way
if not ex.empty:
    st.subheader("Slowest requests (exemplars of the tail)")
    st.caption("Follow a row's link to open its waterfall (in a new tab), or type its id above.")
    links.exemplar_table(ex, f)
    # lazy: its chart is computed and drawn only once the expander is opened (not on every first render)
    stacks = st.expander("Critical path of each exemplar", key="traces_stage_stack", on_change="rerun")
    if stacks.open:
        if db.pending:
            stacks.caption(db.loading_note() or "")
        else:
            stacks.altair_chart(charts.stage_stack(ex), width="stretch")
found = data.find_trace(*key, trace_id)
with trace_box:
    if found.empty:
        st.error(f"No request with trace id {trace_id!r} in this store (ids are 32 hex digits; a prefix needs 8+).")
    else:
        if len(found) > 1:
            st.caption(f"{len(found)} requests match; showing the first. Type more digits to pick another.")
        req = found.iloc[0]
        links.set_trace(str(req["trace_id"]))
        st.subheader(f"Trace {req['trace_id']}")
        # names in a line that wraps (a long tenant would be cut short in a metric's column), figures as metrics
        tenant = str(req["tenant"]) if req.get("tenant") is not None else "–"
        st.markdown(f"replica **{req['replica']}** · tenant **{tenant}** · status **{req['status']}**")
        row = formats.metric_row()
        row.metric("end-to-end", charts.fmt_ms(req["e2e_ns"] / 1e6))
        row.metric("TTFT", charts.fmt_ms(req["ttft_ns"] / 1e6 if req["ttft_ns"] == req["ttft_ns"] else None))
        row.metric("input tokens", formats.count(req["input_tokens"]))
        row.metric("output tokens", formats.count(req["output_tokens"]))
        spans = data.trace_spans(*key, str(req["trace_id"]), int(req["start_ns"]))
        if spans.empty:
            st.warning("The spans of this trace are no longer in the store (compacted or removed).")
        else:
            st.altair_chart(charts.waterfall(spans), width="stretch", height=28 * len(spans) + 60)
            st.caption("Pale bars: each span's extent. Solid, outlined bars: the stretches that are on the "
                       "request's critical path; their sum per stage equals the stage columns of `requests`.")
            if bool(req.get("critical_path", True)):
                crit = {c.removesuffix("_ns"): req[c] / 1e6 for c in data.STAGE_COLUMNS
                        if req[c] > 0 and c != "generation_ns"}
            else:  # the table's stage columns are not computed yet: sum this trace's own stretches
                by_stage = spans[spans["stage"].notna()].groupby("stage")["critical_ms"].sum()
                crit = {str(k): float(v) for k, v in by_stage.items() if v > 0}
                crit[S.OTHER] = req["e2e_ns"] / 1e6 - sum(crit.values())
            formats.table(pd.DataFrame([{"stage": k, "critical-path ms": round(v, 1),
                                         "share": f"{v / (req['e2e_ns'] / 1e6):.0%}"}
                                        for k, v in sorted(crit.items(), key=lambda kv: -kv[1])]),
                          {"critical-path ms": formats.number("on the critical path", "%,.1f ms")})
