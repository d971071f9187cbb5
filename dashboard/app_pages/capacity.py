"""Capacity: p99 and GPU cost per hour against the replica count, the fewest replicas for a target, scale-up."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from analysis.capacity import METRIC_NAMES as NAMES
from dashboard import charts, data, formats, sidebar

db, f, key = sidebar.replay_page("Capacity")
s = data.summary(*key, f)
a, b, c = st.columns(3)
metric = a.radio("p99 of", list(NAMES), horizontal=True, key="cap_metric", format_func=NAMES.__getitem__)
target = b.number_input("p99 target (ms)", min_value=1.0, value=data.capacity_target(s, metric), step=100.0,
                        key="cap_target", format="%.0f")
price = c.number_input("USD per GPU-hour", min_value=0.0, value=data.page_price(db) or 0.0,
                       step=0.1, key="cap_price")
usd = float(price) if price else None  # as data.page_price: the unfiltered page's work started early is this one
curve = data.finished(data.capacity_started(*key, f, float(target), metric, usd), data.detection(*key, f)["requests"],
                      "Replaying the queue for each replica count: the curve appears here when it is done.")
if "error" in curve:
    st.warning(curve["error"])
    st.stop()
pts = pd.DataFrame(curve["points"])
col = "p99_ms" if metric == "e2e" else "ttft_p99_ms"
fewest = curve["fewest_replicas"]
row = formats.metric_row()
row.metric("observed replicas", f"{curve['observed_replicas']} × {curve['slots_per_replica']} slots")
row.metric("fewest replicas for the target", "none of 1–64" if fewest is None else str(fewest))
if fewest is not None:
    value, unset = formats.usd_metric(None if usd is None else fewest * usd, "/h")
    row.metric("GPU cost at that count", value, help=unset)
svc = curve["service"]
if curve["advice"] is not None:
    head = f"If {svc['assumption']}, {curve['advice']['sentence']}."
    if svc["fewest_interval"] is not None:
        lo, hi = svc["fewest_interval"]
        head += (" Across the relation's interval: "
                 + ("no count up to 64 holds it at its high end" if hi is None else
                    f"{lo if lo is not None else 'none'}–{hi} replicas") + ".")
    if svc["batch_relation_applied"]:
        fixed = svc["fixed_fewest_replicas"]
        head += (" With service times fixed as observed the replay would say "
                 f"{'no count up to 64' if fixed is None else f'{fixed} replicas'}.")
    bounds = data.choices(*key)
    span = charts.window_label(f.since_ns or bounds["min_ns"], f.until_ns or bounds["max_ns"] + 1)
    head += (f" Measured and replayed over the whole filtered range, {span} (What-if measures the "
             "window it replays, a spike's by default, so its figures can differ).")
    (st.warning if not svc["batch_relation_applied"] and fewest is not None and fewest < curve["observed_replicas"]
     else st.info)(formats.times(head), icon=":material/info:")
if svc["fixed_points"] is not None:  # both replays: with the measured relation and with fixed service times
    fixed_pts = pd.DataFrame(svc["fixed_points"])
    pts = pd.concat([pts.assign(replay="service grows with the batch (measured)"),
                     fixed_pts.assign(replay="service times fixed as observed")])
else:
    pts = pts.assign(replay="service times fixed as observed")
base = alt.Chart(pts).encode(x=alt.X("replicas:Q", title="replicas"))
line = base.mark_line(point=True).encode(
    y=alt.Y(f"{col}:Q", title=f"predicted {NAMES[metric]} p99 (ms)", scale=alt.Scale(type="log"),
            axis=alt.Axis(format="~s", titlePadding=8)),
    color=alt.Color("replay:N", title=None, legend=alt.Legend(orient="top", labelLimit=0)),  # labels in full
    tooltip=["replay:N", "replicas:Q", alt.Tooltip(f"{col}:Q", format=",.0f"),
             alt.Tooltip("gpu_usd_per_hour:Q", format="$,.2f")])
rule = alt.Chart(pd.DataFrame({"target": [float(target)]})).mark_rule(color="#e45756", strokeDash=[6, 3]).encode(
    y="target:Q")
st.altair_chart(line + rule, width="stretch")
if usd is not None:
    cost = alt.Chart(pd.DataFrame(curve["points"])).encode(x=alt.X("replicas:Q", title="replicas"))
    st.altair_chart(cost.mark_line(color="#54a24b").encode(y=alt.Y("gpu_usd_per_hour:Q", title="GPU USD per hour")),
                    width="stretch")
st.caption("Each request keeps its observed arrival and waits first come, first served for one of replicas × "
           f"{curve['slots_per_replica']} slots. "
           + ("Its service time (latency minus queue wait) is scaled by the measured growth per request of the batch "
              "it joins, the fleet's requests in service spread evenly over the replicas (docs/methods.md). "
              if svc["batch_relation_applied"] else
              "Its service time (latency minus queue wait) stays as observed (the headline says why). ")
           + "Dashed: the target." + ("" if curve["kernel"] else " (C replay kernel not built: a coarse curve.)"))
st.subheader("Reactive scale-up against pre-scaling")
cold = curve["cold_start_ms"]
delay = f"observed median model_load {cold:,.0f} ms" if cold is not None else "no model_load observed: 0 ms"
st.caption(f"A replica started when a request finds every slot busy serves after the cold start: {delay}. "
           "Added replicas stay up to the end of the range, so the reactive cost is an upper bound. Service times are "
           "replayed as in the curve above (with the measured relation where the traces show it).")
x, y = st.columns(2)
first, last = data.scale_up_counts(curve)
start = x.number_input("start with", min_value=1, max_value=64, value=first, key="cap_start")
top = y.number_input("scale up to", min_value=int(start), max_value=128, value=max(int(start), last), key="cap_top")
up = data.capacity_scale_up(*key, f, int(start), int(top), usd)
if "error" in up:
    st.warning(up["error"])
    st.stop()
up_head = (f"If {up['service']['assumption']}, reactive scale-up from {int(start)} to "
           f"{formats.counted(int(top), 'replica')} gives p99 "
           f"{charts.fmt_ms(up['reactive']['p99_ms'])} (adding {up['reactive']['added']}), against "
           f"{charts.fmt_ms(up['static']['p99_ms'])} static and {charts.fmt_ms(up['prescaled']['p99_ms'])} "
           "pre-scaled")
if up["fixed"] is not None:
    up_head += (f"; with service times fixed as observed the replay would say "
                f"{charts.fmt_ms(up['fixed']['reactive']['p99_ms'])} reactive")
st.info(up_head + ".", icon=":material/info:")
policies = {"static": f"static {int(start)}",
            "reactive": f"reactive {int(start)}→{int(top)} (+{up['reactive']['added']})",
            "prescaled": f"pre-scaled {int(top)}"}
table = pd.DataFrame([{"policy": name, "p99_ms": up[k]["p99_ms"], "ttft_p99_ms": up[k]["ttft_p99_ms"],
                       "gpu_usd_per_hour": formats.usd(up[k]["gpu_usd_per_hour"], "/h")}
                      for k, name in policies.items()])
formats.table(table, {"p99_ms": formats.ms("p99"), "ttft_p99_ms": formats.ms("TTFT p99"),
                     "gpu_usd_per_hour": st.column_config.TextColumn("GPU USD per hour")})
