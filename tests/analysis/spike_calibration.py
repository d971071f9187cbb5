"""False-spike rate of `analysis.stats.spikes.detect` on exact null data: i.i.d. windows, no incident.

Every request of a run is drawn from one log-normal law (median 1 s, log-sd `sigma`), so
any spike reported is a false one. The calibration test (test_spike_calibration.py) runs a
few hundred of these; this module is also the offline sweep behind docs/methods.md:

    python -m tests.analysis.spike_calibration [--runs 500] [--windows 10,30,60,120]
        [--per 500,1000,2000,5000] [--sigma 1.0,1.5]

It prints, per size, the runs, the false spikes, their rate with its exact 95 % upper
bound (Clopper-Pearson), and how often the scan alone (before the effect-size rules)
was significant.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import numpy.typing as npt

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


def main() -> None:
    """Sweep the sizes asked and print one line per (windows, requests per window, sigma)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=500)
    ap.add_argument("--windows", default="10,30,60,120")
    ap.add_argument("--per", default="500,1000,2000,5000")
    ap.add_argument("--sigma", default="1.0,1.5")
    ap.add_argument("--seed", type=int, default=20261201)
    args = ap.parse_args()
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
