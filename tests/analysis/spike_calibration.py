"""False-spike rate of `analysis.stats.spikes.detect` on exact null data: i.i.d. windows, no incident.

Every request of a run is drawn from one log-normal law (median 1 s, log-sd `sigma`), so
any spike reported is a false one. The calibration test (test_spike_calibration.py) runs a
few hundred of these; this module is also the offline sweep behind docs/methods.md:

    python -m tests.analysis.spike_calibration [--runs 500] [--windows 10,30,60,120]
        [--per 500,1000,2000,5000] [--sigma 1.0,1.5]

It prints, per size, the runs, the false spikes, their rate with its exact 95 % upper
bound (Clopper-Pearson), and how often the scan alone (before the effect-size rules)
was significant.

False leads (`count_false_leads`, `--leads`): null runs whose requests carry the six built-in
dimensions (`null_builtins`: 16 replicas, 3 models, 2 versions, 6 tenants, token counts) and
ATTRIBUTES random attributes of varied cardinality (2 to 500 values, every third a number), all
independent of latency; the window with the highest p99 is explained against the others exactly
as the report explains a spike (`analysis.report.rank_dimensions`: each value, each pair of two
built-ins and each pair of an attribute with a built-in), and a run whose explanation names any
dimension is a false lead. The family-wise rate is ALPHA (explain.ALPHA, Bonferroni over every
candidate tested):

    python -m tests.analysis.spike_calibration --leads --runs 500
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Final

import numpy as np
import numpy.typing as npt

from analysis.report import rank_dimensions
from analysis.stats import explain as X
from analysis.stats.spikes import ALPHA, detect

SEC = 1_000_000_000
WINDOW_NS = 60 * SEC


def null_run(rng: np.random.Generator, windows: int, per: int, sigma: float,
             load_ramp: float = 1.0) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """Start times and latencies (ns) of `windows` one-minute windows with no incident.

    Window w holds per * (1 + (load_ramp - 1) * w / (windows - 1)) requests (load_ramp = 1: all
    equal), each latency drawn from one log-normal law with median 1 s: more requests, same law.
    """
    growth = (load_ramp - 1) * np.arange(windows) / max(windows - 1, 1)
    counts = np.round(per * (1 + growth)).astype(np.int64)
    starts = np.repeat(np.arange(windows, dtype=np.int64) * WINDOW_NS, counts)
    offsets = np.arange(starts.size, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    starts += offsets * (WINDOW_NS // np.repeat(counts, counts))  # spread evenly inside each window
    values = np.exp(rng.normal(0.0, sigma, starts.size)) * SEC
    return starts, values


def binomial_upper(runs: int, p: float, alpha: float) -> int:
    """Smallest c with P(Binomial(runs, p) > c) <= alpha: the most false spikes a rate p allows."""
    tail = 1.0
    for c in range(runs + 1):
        tail -= math.comb(runs, c) * p ** c * (1 - p) ** (runs - c)
        if tail <= alpha:
            return c
    return runs


def clopper_pearson_upper(hits: int, runs: int, level: float = 0.95) -> float:
    """Exact one-sided upper confidence bound of a binomial rate (bisection on the binomial tail)."""
    if hits >= runs:
        return 1.0
    lo, hi = hits / runs, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        cdf = sum(math.comb(runs, c) * mid ** c * (1 - mid) ** (runs - c) for c in range(hits + 1))
        lo, hi = (mid, hi) if cdf > 1 - level else (lo, mid)
    return hi


def count_false(runs: int, windows: int, per: int, sigma: float, seed: int,
                load_ramp: float = 1.0) -> tuple[int, int]:
    """(runs with a spike, runs whose scan alone was significant) over `runs` null runs from `seed`."""
    rng = np.random.default_rng(seed)
    spikes = scans = 0
    for r in range(runs):
        starts, values = null_run(rng, windows, per, sigma, load_ramp)
        det = detect(starts, values, WINDOW_NS, seed=seed + r)
        spikes += bool(det.spikes)
        scans += getattr(det, "scan_p_value", 1.0) <= ALPHA
    return spikes, scans


#: Attributes on each null request, and the cardinalities they cycle through.
ATTRIBUTES = 40
CARDINALITIES = (2, 3, 5, 10, 30, 100, 500)


def null_attributes(rng: np.random.Generator, n: int, count: int = ATTRIBUTES) -> list[X.Coded]:
    """`count` random attribute dimensions of `n` requests, independent of anything: text values of the
    CARDINALITIES (cycled; every third a number bucketed by powers of two), 10 % of requests without the key."""
    from analysis.stats.attributes import number_buckets

    out = []
    for j in range(count):
        card = CARDINALITIES[j % len(CARDINALITIES)]
        x = rng.integers(0, card, n)
        missing = rng.random(n) < 0.1
        if j % 3 == 2:  # a number: bucketed as the report buckets one
            codes, labels, lo, hi = number_buckets(np.where(missing, np.nan, x.astype(np.float64)))
        else:
            codes = np.where(missing, -1, x).astype(np.int64)
            labels, lo, hi = [f"v{v}" for v in range(card)], [None] * card, [None] * card
        out.append(X.Coded(f"attr.{j:02d}", codes, labels, lo, hi, attribute=f"attr.{j:02d}", source="request"))
    return out


#: Values of the null built-in dimensions (replica, model, model_version, tenant).
BUILTIN_VALUES: Final = (16, 3, 2, 6)


def null_builtins(rng: np.random.Generator, n: int) -> list[X.Coded]:
    """The six built-in dimensions of `n` requests, independent of anything: uniform text values (BUILTIN_VALUES)
    and log-normal token counts bucketed as the report buckets them (explain.code_dimension)."""
    import polars as pl

    out = []
    for name, card in zip(X.DIMENSIONS[:4], BUILTIN_VALUES, strict=True):
        labels = [f"{name}-{v:02d}" for v in range(card)]
        out.append(X.Coded(name, rng.integers(0, card, n).astype(np.int64), labels, [None] * card, [None] * card))
    tokens = pl.DataFrame({name: np.round(np.exp(rng.normal(mu, 1.0, n))).astype(np.int64)
                           for name, mu in zip(X.DIMENSIONS[4:], (6.0, 5.0), strict=True)})
    out += [X.code_dimension(tokens, name) for name in X.DIMENSIONS[4:]]
    return out


def false_lead(rng: np.random.Generator, windows: int, per: int, sigma: float) -> bool:
    """One null run with the built-ins and attributes: does explaining its slowest window (highest p99) name a
    dimension?"""
    starts, values = null_run(rng, windows, per, sigma)
    coded = null_builtins(rng, values.size) + null_attributes(rng, values.size)
    win = starts // WINDOW_NS
    p99 = np.array([np.quantile(values[win == w], X.TAIL_Q) for w in range(windows)])
    worst = int(np.argmax(p99))
    rows = np.flatnonzero(win == worst).astype(np.int64)
    base = np.flatnonzero(win != worst).astype(np.int64)
    base_q = X.TailQuantile(values[base], base)
    excess = rows[values[rows] > base_q.quantile()]
    if excess.size < X.MIN_TAIL_SLICE:
        excess = X.tail_slice(values, rows)
    ranked, _, _, _ = rank_dimensions(coded, values, rows, excess, base, base_q)
    return bool(ranked)


def count_false_leads(runs: int, windows: int, per: int, sigma: float, seed: int) -> int:
    """Null runs (of `runs`, from `seed`) whose slowest window's explanation names a dimension."""
    rng = np.random.default_rng(seed)
    return sum(false_lead(rng, windows, per, sigma) for _ in range(runs))


def main() -> None:
    """Sweep the sizes asked and print one line per (windows, requests per window, sigma)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=500)
    ap.add_argument("--windows", default="10,30,60,120")
    ap.add_argument("--per", default="500,1000,2000,5000")
    ap.add_argument("--sigma", default="1.0,1.5")
    ap.add_argument("--seed", type=int, default=20261201)
    ap.add_argument("--leads", action="store_true",
                    help=f"false leads with {ATTRIBUTES} random attributes instead of false spikes")
    args = ap.parse_args()
    if args.leads:
        print(f"{'windows':>7} {'per':>5} {'sigma':>5} {'runs':>5} {'leads':>6} {'rate':>6} {'95% up':>7} {'s':>6}")
        for windows in (int(x) for x in args.windows.split(",")):
            for per in (int(x) for x in args.per.split(",")):
                for sigma in (float(x) for x in args.sigma.split(",")):
                    t0 = time.perf_counter()
                    leads = count_false_leads(args.runs, windows, per, sigma, args.seed)
                    up = clopper_pearson_upper(leads, args.runs)
                    print(f"{windows:>7} {per:>5} {sigma:>5} {args.runs:>5} {leads:>6} {leads / args.runs:>6.2%} "
                          f"{up:>7.2%} {time.perf_counter() - t0:>6.1f}", flush=True)
        return
    print(f"{'windows':>7} {'per':>5} {'sigma':>5} {'runs':>5} {'spikes':>6} {'rate':>6} {'95% up':>7} "
          f"{'scan':>5} {'s':>6}")
    for windows in (int(x) for x in args.windows.split(",")):
        for per in (int(x) for x in args.per.split(",")):
            for sigma in (float(x) for x in args.sigma.split(",")):
                t0 = time.perf_counter()
                spikes, scans = count_false(args.runs, windows, per, sigma, args.seed)
                up = clopper_pearson_upper(spikes, args.runs)
                print(f"{windows:>7} {per:>5} {sigma:>5} {args.runs:>5} {spikes:>6} {spikes / args.runs:>6.2%} "
                      f"{up:>7.2%} {scans:>5} {time.perf_counter() - t0:>6.1f}", flush=True)


if __name__ == "__main__":
    main()
