"""How often a sample carries the catalogue's cold start: the p99 rise of the window holding it, over many seeds,
against the largest window rise of the same seeds' clean runs (what chance gives a one-window p99 test).

    python -m tests.sample_traces.quarter_power [--seeds 60] [--duration 2500] [--window 300] [--share 0.25]
    python -m tests.sample_traces.quarter_power --lift [--seeds 5] [--duration 2500]

Each request is kept with probability `share` by a seeded draw (the rate a consistent sampler keeps, not its ids);
windows are judged as detection judges them (500 kept values: MIN_TAIL beyond the p99), the baseline is the pooled
p99 of the judged windows within MIN_RISE of their median p99, the cold start's window left out. Offline: a minute
of CPU at 60 seeds; docs/demo.md records the figures.

`--lift`: how far m values above all others lift the p99 of a window of n values drawn from a clean run's law, the
rest of the window unchanged: its p99 (`quantile_cont`, rank 0.99 (n - 1)) is then the others' quantile
0.99 (n - 1) / (n - m - 1), over the clean run's p99 (the clean runs of seeds 1..`seeds`, at full rate); the figures
docs/methods.md records for a short event under sampling.
"""

from __future__ import annotations

import argparse
import random
from statistics import median

from analysis.engine.percentiles import MIN_TAIL
from analysis.stats.spikes import MIN_RISE
from sample_traces.fleet import SimRequest
from sample_traces.incidents import NEW_REPLICA, run
from sample_traces.quantile import quantile


def _windows(reqs: list[SimRequest], window_s: float) -> dict[int, list[float]]:
    """The judged windows' e2e values (s), by window number."""
    by: dict[int, list[float]] = {}
    for r in reqs:
        by.setdefault(int(r.arrival_s // window_s), []).append(r.e2e_s)
    return {k: v for k, v in by.items() if len(v) * 0.01 >= MIN_TAIL}


def _rise(judged: dict[int, list[float]], k: int) -> tuple[float, float]:
    """Window k's p99 over the baseline's (the other windows within MIN_RISE of the median p99, pooled), and the
    baseline p99."""
    p99 = {j: quantile(v, 0.99) for j, v in judged.items()}
    level = median(p99.values())
    base = quantile([x for j, v in judged.items() if j != k and p99[j] <= (1 + MIN_RISE) * level for x in v], 0.99)
    return p99[k] / base, base


def _kept(name: str, seed: int, duration_s: float, share: float) -> tuple[float, list[SimRequest]]:
    scenario = run(name, seed, duration_s)
    keep = random.Random(f"keep-{seed}")
    return scenario.window_s[0], [r for r in scenario.requests if keep.random() < share]


def study(seeds: int, duration_s: float, window_s: float, share: float) -> dict[str, list[float]]:
    """Per seed 1..`seeds`: the cold start's window rise and its kept requests above the baseline p99 (on the seeds
    where that window is judged; `unjudged` lists the others), and the clean run's largest window rise."""
    cold, above, null, unjudged = [], [], [], []
    for seed in range(1, seeds + 1):
        t0, reqs = _kept("cold_start", seed, duration_s, share)
        windows = _windows(reqs, window_s)
        if int(t0 // window_s) in windows:
            rise, base = _rise(windows, int(t0 // window_s))
            cold.append(rise)
            above.append(float(sum(1 for r in reqs if r.replica == NEW_REPLICA and r.load_end_s is not None
                                    and r.e2e_s > base)))
        else:  # fewer than 500 kept values in the cold start's window: no p99 is judged there
            unjudged.append(float(seed))
        judged = _windows(_kept("clean", seed, duration_s, share)[1], window_s)
        null.append(max(_rise(judged, j)[0] for j in judged))
    return {"cold": cold, "above": above, "null": null, "unjudged": unjudged}


#: (window values n, event values m on top) the lift is printed for: a quarter's 300 s window, and the fewest values
#: that judge a p99.
LIFT_SIZES = ((750, 3), (750, 4), (750, 5), (750, 6), (500, 4))


def others_quantile(n: int, m: int) -> float:
    """The quantile of the other n - m values that the p99 of n values is when its m largest lie above them all: the
    p99's rank 0.99 (n - 1) counted among the others."""
    return 0.99 * (n - 1) / (n - m - 1)


def lifts(seed: int, duration_s: float, sizes: tuple[tuple[int, int], ...] = LIFT_SIZES) -> list[float]:
    """Per (n, m): the p99 of n values whose m largest lie above all the others, the others from the clean run's law
    of `seed` (its quantile 0.99 (n - 1) / (n - m - 1)), over that law's p99."""
    e2e = [r.e2e_s for r in run("clean", seed, duration_s).requests]
    base = quantile(e2e, 0.99)
    return [quantile(e2e, others_quantile(n, m)) / base for n, m in sizes]


def main() -> None:
    """Print the cold start's window rise and the clean runs' largest, over the seeds."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=60)
    ap.add_argument("--duration", type=float, default=2500.0)
    ap.add_argument("--window", type=float, default=300.0)
    ap.add_argument("--share", type=float, default=0.25)
    ap.add_argument("--lift", action="store_true", help="the p99 lift of m values on top of n (see above)")
    a = ap.parse_args()
    if a.lift:
        per_seed = [lifts(seed, a.duration) for seed in range(1, a.seeds + 1)]
        for i, (n, m) in enumerate(LIFT_SIZES):
            col = [row[i] for row in per_seed]
            print(f"{m} values on top of {n}: p99 x{min(col):.3f} to x{max(col):.3f} (clean runs of seeds 1-{a.seeds})")
        return
    got = study(a.seeds, a.duration, a.window, a.share)
    cold, above, ranked = got["cold"], got["above"], sorted(got["null"])
    q95 = ranked[int(0.95 * (len(ranked) - 1))]
    print(f"{a.seeds} seeds, {a.duration:.0f} s runs, {a.share:.0%} kept, {a.window:.0f} s windows")
    if got["unjudged"]:
        print(f"the cold start's window holds too few kept values to judge a p99 on {len(got['unjudged'])} of "
              f"{a.seeds} seeds; the figures below are of the other {len(cold)}")
    if not cold:
        return
    print(f"cold start's window p99 / baseline p99: median {median(cold):.3f}; >= {1 + MIN_RISE:.1f} on "
          f"{sum(x >= 1 + MIN_RISE for x in cold)} of {len(cold)}")
    print(f"kept cold-start requests above the baseline p99: median {median(above):.0f}, {min(above):.0f} to "
          f"{max(above):.0f}")
    print(f"clean runs' largest window rise: median {median(ranked):.3f}, 95th percentile {q95:.3f}; "
          f"the cold start's window above it on {sum(x > q95 for x in cold)} of {len(cold)}")

if __name__ == "__main__":
    main()
