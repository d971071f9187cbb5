"""Replicas: p50/p99 and counts per replica, outliers marked."""

from __future__ import annotations

import streamlit as st

from dashboard import charts, data, formats, sidebar

S_OUTCOMES = data.OUTCOMES

db = data.open_store()
f = sidebar.current()
key = (db, str(db.store), db.version)
st.title("Replicas")
metric_label = st.radio("Latency", list(data.METRICS), horizontal=True, key="replica_metric")
group = data.attribute_pick(db, "replica", "Group by an attribute instead of the replica")
if group is not None:  # per value of an attribute: the same columns and outlier rule
    data.attribute_table(db, f, data.METRICS[metric_label], group, "replicas")
    st.stop()
df = data.replicas(*key, f, data.METRICS[metric_label])
if df.empty:
    st.info("No requests match the filters.")
    st.stop()
out = df[df["outlier"]]
explained = {e["replica"]: e for e in data.outlier_explanations(*key, f, data.METRICS[metric_label])}
own = [r for r in out.itertuples() if r.replica not in explained]
few = dict(zip(df["replica"], df["p99_low_sample"], strict=True))  # judged, but a p99 resting on 1-4 requests


def thin(replica: str) -> str:
    """What a flag on `replica` rests on, where its p99 has fewer than MIN_TAIL requests beyond it."""
    n = float(df.loc[df["replica"] == replica, "n_effective"].iloc[0])
    return (f"; only {n:,.0f} requests, so its p99 rests on fewer than {data.MIN_TAIL} requests beyond it"
            if few[replica] else "")


if own:
    st.error("Outlier replicas (p99 far above the fleet's, whatever tenant, model or service is left out): "
             + ", ".join(f"**{r.replica}** ({charts.fmt_ms(r.p99_ms)}{thin(r.replica)})" for r in own))
for e in explained.values():
    st.warning(f"**{e['replica']}** is flagged an outlier (p99 {charts.fmt_ms(e['p99_ms'])}{thin(e['replica'])}), "
               f"but **{e['dimension']} = "
               f"{e['value']}** explains it: without that {e['dimension']}'s requests its p99 is "
               f"{charts.fmt_ms(e['p99_without_ms'])} ({e['requests_without']:,} of {e['requests']:,} requests left), "
               f"inside the fleet's spread (median p99 {charts.fmt_ms(e['fleet_median_p99_without_ms'])}). Look at "
               f"the {e['dimension']}, not the replica.", icon=":material/person_search:")
small = df[~df["judged"]]  # too few requests for a p99 to judge: neither an outlier nor in the fleet's median
judged = len(df) - len(small)
most = f"{df['n_effective'].max():,.0f}"
if len(df) == 1:  # nothing to compare it with: neither an outlier nor an all clear
    st.info(f"One replica in this range ({df['replica'].iloc[0]}, p99 {charts.fmt_ms(df['p99_ms'].iloc[0])}): no "
            "other replica to compare it with. Widen the filters to judge the fleet.")
elif judged < 2:
    st.warning(f"Too few requests to judge: {'no replica' if not judged else 'one replica alone'} of {len(df)} holds "
               f"the {data.MIN_REPLICA_REQUESTS} requests a p99 needs (one request beyond it; the most here: {most}). "
               "With fewer, a replica's p99 is close to its slowest request, so no replica is compared with the "
               "fleet: this is not an all clear. Widen the filters or the time range.", icon=":material/help:")
else:
    if len(small):
        st.info(f"{len(small)} of {len(df)} replicas hold fewer than the {data.MIN_REPLICA_REQUESTS} requests a p99 "
                f"needs to be judged ({', '.join(small['replica'])}): grey in the chart, neither flagged nor counted "
                "in the fleet's median.", icon=":material/help:")
    weak = df[df["judged"] & df["p99_low_sample"]]
    if len(weak):
        names = f" ({', '.join(weak['replica'])})" if len(weak) <= 6 else ""
        which = ("Every replica judged holds" if len(weak) == judged else
                 f"{len(weak)} of the {judged} replicas judged{names} hold")
        st.info(f"{which} fewer than {data.SOLID_P99_REQUESTS} requests: a p99 there rests on fewer than "
                f"{data.MIN_TAIL} requests beyond it, so one slow request moves it and a flag is weak evidence. A "
                "wider time range judges them on more.", icon=":material/help:")
    if not len(out):
        st.success(f"No outlier among the {judged} replicas judged: p99 spread "
                   f"{charts.fmt_ms(df.loc[df['judged'], 'p99_ms'].min())}"
                   f"–{charts.fmt_ms(df.loc[df['judged'], 'p99_ms'].max())}.")
# the tooltip's requests: what the stored ones stand for (the table shows both counts)
explained_by = [f"{explained[r]['dimension']} = {explained[r]['value']}" if r in explained else ""
                for r in df["replica"]]
st.altair_chart(charts.replica_chart(df.assign(requests=df["requests_weighted"], explained_by=explained_by)),
                width="stretch")
st.caption("Bars: p99 (red: outlier, more than 3 robust deviations and 20% above the median p99 of the replicas "
           f"judged, those with {data.MIN_REPLICA_REQUESTS} requests or more; yellow: an outlier that is no longer one "
           "without one tenant's, model's or service's requests; grey: too few requests to judge). Ticks: p50.")
shown = df.assign(explained_by=explained_by,
                  outlier=["yes" if o else "" if j else "not judged" for o, j in zip(df["outlier"], df["judged"],
                                                                                    strict=True)])
cols = ["replica", "outlier", "explained_by", "requests", "p50_ms", "p99_ms", *S_OUTCOMES, "n_effective"]
if (df["requests_weighted"] != df["requests"]).any():  # sampled: what the stored requests stand for
    cols.insert(cols.index("requests") + 1, "requests_weighted")
formats.table(shown[[c for c in cols if c in shown.columns]], {
    "explained_by": st.column_config.TextColumn("outlier explained by"),
    "requests_weighted": formats.number("requests (weighted)"),
    "requests": formats.number("requests"), "n_effective": formats.number("effective requests"),
    "p50_ms": formats.ms("p50"), "p99_ms": formats.ms("p99"),
    **{o: formats.number(o) for o in S_OUTCOMES},
})
