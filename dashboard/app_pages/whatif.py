"""What-if: replay the observed arrivals through a k-replica FIFO queue; predicted p50/p99 beside observed."""

from __future__ import annotations

import streamlit as st

from dashboard import charts, data, formats, sidebar

db, f, key = sidebar.replay_page("What-if")
observed = len(data.replicas(*key, f))  # the replicas serving the filtered requests
spikes = data.spike_marks(*key, f)["spikes"]  # windows only: no explanation needed here
windows: dict[str, data.Filters] = {}
for sp in spikes:
    a, b = data.spike_times_ns(sp)
    # named as the Overview's banners and the Spike page name it ("11-20 14:06–14:10" read like a range of days)
    windows[f"spike {charts.window_label(a, b)}"] = f.narrowed(a, b)
c = data.choices(*key)
last = (f.until_ns or c["max_ns"] + 1)
if last - (f.since_ns or c["min_ns"]) > 2 * data.HOUR_NS:
    windows["the last hour of the range"] = f.narrowed(last - data.HOUR_NS, last)
windows["the whole filtered range"] = f
choice = st.selectbox("Replay", list(windows), key="whatif_window",
                      help="The arrivals and service times replayed: a spike's window, the last hour, or "
                           "everything filtered (a long range takes a few seconds)")
fw = windows[choice]
over = choice if choice.startswith("spike") else (  # the window's times named: the spike's label holds them
    f"{choice.removeprefix('the ')}, {charts.window_label(fw.since_ns or c['min_ns'], fw.until_ns or c['max_ns'] + 1)}")
slots_seen = data.workload(*key, fw).slots
left, right = st.columns(2)
k = left.slider("Replicas", min_value=1, max_value=max(4, observed * 3), value=observed, key="whatif_replicas")
slots = right.number_input("Concurrent requests per replica", min_value=1, max_value=1024, value=slots_seen,
                           key="whatif_slots", help=f"Most requests one replica served at once here: {slots_seen}")
s = data.summary(*key, fw)
now = data.whatif(*key, fw, observed, int(slots))
then = data.whatif(*key, fw, k, int(slots))
if then["error"] or now["error"]:
    st.warning(then["error"] or now["error"])
    st.stop()
svc = then["service"]
head = (f"If {svc['assumption']}, {formats.counted(k, 'replica')} × {int(slots)} slots give p50 / p99 "
        f"{charts.fmt_ms(then['p50_ms'])} / {charts.fmt_ms(then['p99_ms'])}")
if then["fixed"] is not None:
    head += f"; with service times fixed as observed the replay would say p99 {charts.fmt_ms(then['fixed']['p99_ms'])}"
head += (f". Measured and replayed over the {over} (the Capacity page measures the whole filtered range, so its "
         "figures can differ).")
st.info(formats.times(head), icon=":material/info:")
row = formats.metric_row()
row.metric("observed p50 / p99", f"{charts.fmt_ms(s['e2e_p50_ms'])} / {charts.fmt_ms(s['e2e_p99_ms'])}")
row.metric(f"replay, {formats.counted(observed, 'replica')} (as observed)",
           f"{charts.fmt_ms(now['p50_ms'])} / {charts.fmt_ms(now['p99_ms'])}")
row.metric(f"predicted, {formats.counted(k, 'replica')}",
           f"{charts.fmt_ms(then['p50_ms'])} / {charts.fmt_ms(then['p99_ms'])}",
           delta=None if k == observed else charts.fmt_ms((then["p99_ms"] or 0) - (now["p99_ms"] or 0)) + " p99",
           delta_color="inverse")
st.caption("Each request keeps its observed arrival and waits first-come first-served for one of "
           f"{k} × {int(slots)} slots. "
           + ("Its service time (latency minus queue wait) is scaled by the measured growth per request of the batch "
              "it joins, the requests in service spread evenly over the replicas (the Capacity page's replay, "
              "docs/methods.md). " if svc["applied"] else
              "Its service time (latency minus queue wait) stays as observed (the headline says why). ")
           + "Cold starts and routing other than one shared queue are not modelled.")
