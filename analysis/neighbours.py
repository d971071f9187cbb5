"""Noisy neighbours: when a spike's excess is queue wait, did one tenant's concurrency rise beside it?

Evaluated only when the spike's stage explanation puts queue_wait first with at least
`QUEUE_SHARE` of the excess. Then, on the replicas of the spike's tail requests (those
slower than the baseline p99), for every tenant:

- its share of the requests admitted (starting) in the spike window against the nearest
  baseline windows (up to `BASELINE_WINDOWS` per spike window);
- its share of the fair-share GPU time (analysis.cost) in the same windows.

A tenant's concurrency *rose* when its admitted share grew at least `RISE`-fold, the
binomial over-representation bound of its admitted count is below ALPHA / tenants
(analysis.stats.explain's guard), and its GPU share grew too. The tenant with the largest
admitted-share ratio among those is named. Victims: other tenants with at least
MIN_SUPPORT tail requests of which most waited in the queue for more than half their
latency. The sentence says "tenant X's burst pushed tenant Y's queue" only when there are
victims; when the tail is the bursting tenant's own requests it says so instead.
Nothing is said (None) when queue_wait does not lead or no tenant's concurrency rose.

Sampled traces: admitted shares weigh each request's adjusted count and the binomial bound
reads the weighted share on the effective count (as analysis.stats.explain.contrast); GPU shares are
the weighted fair share (analysis.cost); the tail's own share and a victim's queued share are
weighted. Support stays a count of kept requests. Where every weight is 1 the unweighted computation runs.

The step is split in two. *Gathering* (`Figures`) is the engine's: per tenant, the tail's requests and the
replicas they ran on; the requests admitted and the GPU time on those replicas in the spike's and the
chosen baseline windows; the other tenants' tail requests and how many of them waited mostly in the queue.
`InMemory` gathers them over a DuckDB connection (a store, or any facts and spans);
analysis.clickhouse.neighbours on a ClickHouse server, where only those figures come back (a row a tenant).
*Deciding* (`decide`) is the rule above, once, in Python over the figures.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Protocol

import duckdb
import numpy as np
import polars as pl

from analysis.engine.percentiles import facts_by_rid
from analysis.stats import explain as X
from analysis.stats.sampling import weight_of
from analysis.stats.spikes import Detection, Spike
from tracing import schema as S

#: queue_wait must hold at least this share of the spike's stage excess.
QUEUE_SHARE: Final = 0.5
#: A tenant's admitted share must grow at least this many times over the baseline.
RISE: Final = 1.5
#: Baseline windows used per spike window (the nearest ones).
BASELINE_WINDOWS: Final = 3


def baseline_windows(det: Detection, spike: Spike) -> np.ndarray:
    """Starts (ns) of the baseline windows the spike is compared with: the BASELINE_WINDOWS nearest per spike
    window (distance between the windows' edges; ties by start)."""
    base_starts = det.window_start_ns[det.baseline]
    spike_windows = int((spike.end_ns - spike.start_ns) // det.window_ns)
    dist = np.maximum(spike.start_ns - (base_starts + det.window_ns), base_starts - spike.end_ns)
    return np.asarray(base_starts[np.argsort(dist, kind="stable")[:max(1, BASELINE_WINDOWS * spike_windows)]])


@dataclass(frozen=True)
class Tail:
    """A spike's tail (its requests slower than the baseline p99) by tenant ("None" when it has none): per
    tenant the kept requests and what they stand for (their summed adjusted counts; None when unsampled), their
    total, and the replicas they ran on."""

    replicas: list[str]
    counts: dict[str, int]
    weights: dict[str, float] | None
    total_weight: float | None


class Figures(Protocol):
    """What an engine gathers for the step (`decide` reads only these). `cells` are window starts (ns), `w` their
    width; `in_spike` marks the spike's own windows."""

    def tail(self, spike: Spike) -> Tail:
        """The spike's tail by tenant."""
        ...

    def admitted(self, spike: Spike, replicas: list[str], cells: list[int], w: int) -> pl.DataFrame:
        """Requests starting in `cells` on `replicas` per (tenant, in_spike): n, nw (summed adjusted counts), nw2
        (their squares), weighted (some adjusted count is not 1)."""
        ...

    def gpu(self, spike: Spike, replicas: list[str], cells: list[int], w: int) -> pl.DataFrame:
        """Fair-share GPU ns (analysis.cost's sweep on a grid of `w`) in `cells` on `replicas` per (tenant,
        in_spike): ns."""
        ...

    def queued(self, spike: Spike, tenant: str) -> list[tuple[str, int, float, float]]:
        """The tail's requests of tenants other than `tenant`, per tenant: (tenant, kept requests, what they stand
        for, what those of them queued for more than half their latency stand for); unsampled, each weighs 1."""
        ...


def _shares(frame: pl.DataFrame, col: str) -> dict[str, float]:
    total = float(frame.get_column(col).sum() or 0)
    if total <= 0:
        return {}
    return {str(t): float(v) / total for t, v in frame.select("tenant", col).iter_rows()}


def noisy_neighbour(con: duckdb.DuckDBPyConnection, facts: str, frame: pl.DataFrame, det: Detection,
                    spike: Spike, item: dict[str, Any]) -> dict[str, Any] | None:
    """The noisy-neighbour finding for one spike of analysis.report (its `noisy_neighbour` key), or None: `decide`
    over the figures `InMemory` gathers from `frame`, `facts` and the connection's spans."""
    return decide(InMemory(con, facts, frame), det, spike, item)


def decide(figures: Figures, det: Detection, spike: Spike, item: dict[str, Any]) -> dict[str, Any] | None:
    """The rule of the module's docstring over an engine's figures: the finding, or None."""
    stages = item.get("stages") or []
    if not stages or stages[0]["stage"] != S.QUEUE_WAIT or stages[0]["share"] < QUEUE_SHARE:
        return None
    tail = figures.tail(spike)
    if sum(tail.counts.values()) < X.MIN_SUPPORT or not tail.replicas:
        return None
    replicas = tail.replicas
    chosen = baseline_windows(det, spike)
    if chosen.size == 0:
        return None
    w = det.window_ns
    cells = sorted({int(c) for c in chosen} | set(range(spike.start_ns, spike.end_ns, w)))
    admitted = figures.admitted(spike, replicas, cells, w)
    gpu = figures.gpu(spike, replicas, cells, w)
    adm_spike = admitted.filter(pl.col("in_spike"))
    adm_base = admitted.filter(~pl.col("in_spike"))
    weighted = bool(admitted.get_column("weighted").any())
    a_s, a_b = _shares(adm_spike, "nw" if weighted else "n"), _shares(adm_base, "nw" if weighted else "n")
    eff_spike = 0.0
    if weighted:  # Kish's effective count of the spike's admitted requests
        total, squares = float(adm_spike.get_column("nw").sum() or 0), float(adm_spike.get_column("nw2").sum() or 0)
        eff_spike = total * total / squares if squares else 0.0
    g_s, g_b = _shares(gpu.filter(pl.col("in_spike")), "ns"), _shares(gpu.filter(~pl.col("in_spike")), "ns")
    n_spike = int(adm_spike.get_column("n").sum() or 0)
    counts = {str(t): int(n) for t, n in adm_spike.select("tenant", "n").iter_rows()}
    tenants = sorted(t for t in a_s if t != "None")  # in one order whatever the engine: a tie names the first
    best: tuple[float, str] | None = None
    for t in tenants:
        base = a_b.get(t, 0.0)
        if base <= 0 or counts.get(t, 0) < X.MIN_SUPPORT:
            continue
        ratio = a_s[t] / base
        p = (X.binomial_tail_bound(round(a_s[t] * eff_spike), round(eff_spike), base) if weighted
             else X.binomial_tail_bound(counts[t], n_spike, base))
        rose = ratio >= RISE and p < X.ALPHA / max(1, len(tenants)) and g_s.get(t, 0.0) > g_b.get(t, 0.0)
        if rose and (best is None or ratio > best[0]):
            best = (ratio, t)
    if best is None:
        return None
    tenant = best[1]
    if tail.weights is not None and tail.total_weight:  # sampled: the share of what the tail's requests stand for
        own = tail.weights.get(tenant, 0.0) / tail.total_weight
    else:
        own = tail.counts.get(tenant, 0) / sum(tail.counts.values())
    victims: list[str] = []
    if sum(n for t, n in tail.counts.items() if t != tenant) >= X.MIN_SUPPORT:
        # support counts kept requests; "most" is a share of what they stand for (of them when unsampled)
        victims = sorted(t for t, n, nw, q in figures.queued(spike, tenant) if n >= X.MIN_SUPPORT and q * 2 > nw)
    out = {
        "tenant": tenant, "replicas": replicas,
        "admitted_share": {"spike": round(a_s[tenant], 4), "baseline": round(a_b[tenant], 4)},
        "gpu_share": {"spike": round(g_s.get(tenant, 0.0), 4), "baseline": round(g_b.get(tenant, 0.0), 4)},
        "tail_share_own": round(own, 4), "victims": victims,
    }
    where = f"on {len(replicas)} replica(s)" if len(replicas) > 3 else "on " + ", ".join(replicas)
    rise = (f"its share of admitted requests went from {a_b[tenant]:.1%} to {a_s[tenant]:.1%} and of GPU time "
            f"from {g_b.get(tenant, 0.0):.1%} to {g_s.get(tenant, 0.0):.1%} {where}")
    if victims:
        out["sentence"] = (f"tenant {tenant}'s burst pushed tenant {', '.join(victims)}'s queue: {rise}; "
                           f"{own:.0%} of the tail is its own requests")
    else:
        out["sentence"] = (f"tenant {tenant}'s burst queued its own requests: {rise}; "
                           f"{own:.0%} of the tail is its own requests, no other tenant's tail waited mostly in "
                           "the queue")
    return out


class InMemory:
    """`Figures` over a DuckDB connection: `frame` (the report's rows: rid, start_ns, e2e_ns, value, replica,
    tenant; weight when sampled), `facts` (the request facts its rids address) and the connection's `spans`."""

    def __init__(self, con: duckdb.DuckDBPyConnection, facts: str, frame: pl.DataFrame) -> None:
        self.con, self.facts, self.frame = con, facts, frame

    def _tail(self, spike: Spike) -> pl.DataFrame:
        start = self.frame.get_column("start_ns").to_numpy()
        values = self.frame.get_column("value").to_numpy()
        in_spike = (start >= spike.start_ns) & (start < spike.end_ns)
        return self.frame[np.flatnonzero(in_spike & (values > spike.baseline_p99_ns))]

    def tail(self, spike: Spike) -> Tail:
        rows = self._tail(spike)
        replicas = sorted({str(r) for r in rows.get_column("replica").drop_nulls().to_list()})
        names = np.array(rows.get_column("tenant").cast(pl.String).fill_null("None").to_list(), dtype=object)
        counts = {str(t): int((names == t).sum()) for t in sorted(set(names.tolist()))}
        if "weight" not in rows.columns:
            return Tail(replicas, counts, None, None)
        tw = rows.get_column("weight").to_numpy().astype(np.float64)
        return Tail(replicas, counts, {t: float(tw[names == t].sum()) for t in counts}, float(tw.sum()))

    def admitted(self, spike: Spike, replicas: list[str], cells: list[int], w: int) -> pl.DataFrame:
        wcol = weight_of(self.con, self.facts)
        return self.con.sql(f"""
            SELECT tenant, (start_ns >= $s0 AND start_ns < $s1) AS in_spike, count(*) AS n,
                   sum({wcol}) AS nw, sum({wcol} * {wcol}) AS nw2, bool_or({wcol} <> 1) AS weighted FROM {self.facts}
            WHERE list_contains($reps, replica) AND list_contains($cells, (start_ns // $w) * $w)
            GROUP BY ALL""", params={"s0": spike.start_ns, "s1": spike.end_ns, "reps": replicas, "cells": cells,
                                     "w": w}).pl()

    def gpu(self, spike: Spike, replicas: list[str], cells: list[int], w: int) -> pl.DataFrame:
        # here, not at the top: most reports stop before this step, and analysis.cost (with the ClickHouse SQL it
        # generates on import) is a tenth of the report's start-up
        from analysis.cost import drop_sweep, gpu_shares

        shares, _ = gpu_shares(self.con, min(cells), max(cells) + w, grid_ns=w)
        try:
            return self.con.sql(f"""
                SELECT f.tenant, (s.bucket_ns >= $s0 AND s.bucket_ns < $s1) AS in_spike, sum(s.allocated_ns) AS ns
                FROM {shares} s JOIN {self.facts} f ON f.trace_id = s.trace_id AND f.span_id = s.request_span_id
                WHERE list_contains($reps, s.replica) AND list_contains($cells, s.bucket_ns)
                GROUP BY ALL""", params={"s0": spike.start_ns, "s1": spike.end_ns, "reps": replicas,
                                         "cells": cells}).pl()
        finally:
            drop_sweep(self.con)

    def queued(self, spike: Spike, tenant: str) -> list[tuple[str, int, float, float]]:
        others = self._tail(spike).filter(pl.col("tenant").cast(pl.String).fill_null("None") != tenant)
        if others.height == 0:
            return []
        rids = others.get_column("rid").to_list()
        found = facts_by_rid(self.con, self.facts, rids, start_ns=others.get_column("start_ns").to_numpy())
        ids = [str(found[r][0]) for r in rids]
        lo = int(others.get_column("start_ns").min() or 0)  # type: ignore[arg-type]
        hi = int((others.get_column("start_ns") + others.get_column("e2e_ns")).max() or 0) + 1  # type: ignore[arg-type]
        stages = X.stage_rows(self.con, sorted(set(ids)), lo - 1, hi)
        w = others.get_column("weight").to_list() if "weight" in others.columns else [1.0] * others.height
        rows = pl.DataFrame({"trace_id": ids, "tenant": others.get_column("tenant").cast(pl.String).to_list(),
                             "e2e_ns": others.get_column("e2e_ns").to_list(), "w": w}).join(
            stages.select("trace_id", "queue_wait_ns"), on="trace_id", how="left")
        per = rows.group_by("tenant").agg(
            pl.len().alias("n"), pl.col("w").sum().alias("nw"),
            pl.col("w").filter(pl.col("queue_wait_ns") * 2 > pl.col("e2e_ns")).sum().alias("queued"))
        return [(str(t), int(n), float(nw), float(q)) for t, n, nw, q in per.iter_rows()]


def for_report(figures: Figures, det: Detection, spike: Spike, item: dict[str, Any]) -> dict[str, Any] | None:
    """`decide`, never raising: a failure becomes an entry in the spike's errors."""
    try:
        return decide(figures, det, spike, item)
    except Exception as exc:
        item.setdefault("errors", []).append(f"could not compute noisy_neighbour because {str(exc).splitlines()[0]}")
        return None
