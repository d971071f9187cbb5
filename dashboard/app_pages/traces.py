"""Traces: the tail's exemplars and the waterfall of one trace with its critical path highlighted."""

from __future__ import annotations

import streamlit as st

from dashboard import charts, data, sidebar

db = data.open_store()
f = sidebar.current()
key = (db, str(db.store), db.version)
st.title("Traces")

ex = data.exemplars(*key, f, 50)
wanted = st.text_input("Trace id (full, or a prefix of 8+ hex digits)", key="trace_id",
                       placeholder="e.g. 7a11000000000000000000000000002a")
if ex.empty and not wanted:
    st.info("No requests match the filters: nothing to show.")
    st.stop()

if not ex.empty:
    st.subheader("Slowest requests (exemplars of the tail)")
    picked = st.dataframe(ex[["trace_id", "start", "replica", "model", "tenant", "status", "latency_ms",
                              "input_tokens", "output_tokens"]],
                          hide_index=True, on_select="rerun", selection_mode="single-row", key="exemplar_table",
                          column_config={"latency_ms": st.column_config.NumberColumn("latency (ms)", format="%,.0f")})
    rows = picked.selection.rows if hasattr(picked, "selection") else []
    if rows and not wanted:
        wanted = str(ex.iloc[rows[0]]["trace_id"])
    with st.expander("Critical path of each exemplar", expanded=False):
        if db.pending:
            st.caption(db.loading_note() or "")
        else:
            st.altair_chart(charts.stage_stack(ex.head(25)), width="stretch")

trace_id = wanted or (str(ex.iloc[0]["trace_id"]) if not ex.empty else "")
if not trace_id:
    st.stop()
found = data.find_trace(*key, trace_id)
if found.empty:
    st.error(f"No request with trace id {trace_id!r} in this store (ids are 32 hex digits; a prefix needs 8+).")
    st.stop()
if len(found) > 1:
    st.caption(f"{len(found)} requests match; showing the first. Type more digits to pick another.")
req = found.iloc[0]
st.subheader(f"Trace {req['trace_id']}")
cols = st.columns(5)
cols[0].metric("end-to-end", charts.fmt_ms(req["e2e_ns"] / 1e6))
cols[1].metric("TTFT", charts.fmt_ms(req["ttft_ns"] / 1e6 if req["ttft_ns"] == req["ttft_ns"] else None))
cols[2].metric("replica", str(req["replica"]))
cols[3].metric("status", str(req["status"]))
cols[4].metric("tokens in / out", f"{req['input_tokens']} / {req['output_tokens']}")
spans = data.trace_spans(*key, str(req["trace_id"]), int(req["start_ns"]))
if spans.empty:
    st.warning("The spans of this trace are no longer in the store (compacted or removed).")
    st.stop()
st.altair_chart(charts.waterfall(spans), width="stretch", height=28 * len(spans) + 60)
st.caption("Pale bars: each span's extent. Solid, outlined bars: the stretches that are on the request's "
           "critical path; their sum per stage equals the stage columns of `requests`.")
if bool(req.get("critical_path", True)):
    crit = {c.removesuffix("_ns"): req[c] / 1e6 for c in data.STAGE_COLUMNS if req[c] > 0 and c != "generation_ns"}
else:  # the table's stage columns are not computed yet: sum this trace's own stretches
    by_stage = spans[spans["stage"].notna()].groupby("stage")["critical_ms"].sum()
    crit = {str(k): float(v) for k, v in by_stage.items() if v > 0}
    crit["other"] = req["e2e_ns"] / 1e6 - sum(crit.values())
st.dataframe([{"stage": k, "critical-path ms": round(v, 1), "share": f"{v / (req['e2e_ns'] / 1e6):.0%}"}
              for k, v in sorted(crit.items(), key=lambda kv: -kv[1])], hide_index=True)
