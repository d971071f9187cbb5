"""CPU of spike detection (`analysis.stats.spikes.detect`) on N log-normal values in W windows, against the exact
permutation null it used before, in the same process.

    python -m benchmarks.bench_detect [--sizes 1440000:24,14000000:48] [--repeat 1]

Per size (values:windows; values log-normal, median 1 s, log-sd 1, start times sorted, no incident) it prints
the CPU seconds of `detect` as it is (block scores; the null drawn per block of scores when that is cheaper) and
of the anchor: `detect` with the Savage scores unblocked and every score shuffled once per simulated draw, the
earlier null (what `report` on 100 M spans paid before). Also the ratio, both scan p-values, the values
above the pooled p99 (K) and the machine's load average. Best of --repeat runs each.
"""

from __future__ import annotations

import argparse
import functools
import time
from typing import Any

import numpy as np

from analysis.stats import spikes

WINDOW_NS = 300 * 1_000_000_000


def _load() -> float:
    with open("/proc/loadavg") as fh:
        return float(fh.read().split()[0])


def _data(values: int, windows: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(20261202)
    starts = np.sort(rng.integers(0, windows * WINDOW_NS, values))
    return starts, rng.lognormal(0.0, 1.0, values) * 1e9


def _cpu(starts: np.ndarray, values: np.ndarray, repeat: int) -> tuple[float, spikes.Detection]:
    best, det = float("inf"), None
    for _ in range(repeat):
        c0 = time.process_time()
        det = spikes.detect(starts, values, WINDOW_NS)
        best = min(best, time.process_time() - c0)
    assert det is not None
    return best, det


def _anchor(starts: np.ndarray, values: np.ndarray, repeat: int) -> tuple[float, spikes.Detection]:
    """`detect` with the earlier null: Savage scores as they are, every one shuffled per draw."""
    saved = spikes.block_scores, spikes.scan_null_max
    spikes.block_scores = lambda scores: scores  # type: ignore[assignment]
    spikes.scan_null_max = functools.partial(saved[1], method="permute")  # type: ignore[assignment]
    try:
        return _cpu(starts, values, repeat)
    finally:
        spikes.block_scores, spikes.scan_null_max = saved  # type: ignore[assignment]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1440000:24,14000000:48", help="values:windows, comma-separated")
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args(argv)
    out: dict[str, Any] = {}
    for item in args.sizes.split(","):
        n_values, n_windows = (int(x) for x in item.split(":"))
        starts, values = _data(n_values, n_windows)
        load0 = _load()
        new_s, new = _cpu(starts, values, args.repeat)
        old_s, old = _anchor(starts, values, args.repeat)
        row = {"values": n_values, "windows": n_windows, "K": int(new.exceed.sum()), "detect_cpu_s": round(new_s, 3),
               "anchor_permutation_cpu_s": round(old_s, 3), "ratio": round(new_s / old_s, 3),
               "scan_p": new.scan_p_value, "anchor_scan_p": old.scan_p_value, "spikes": len(new.spikes),
               "anchor_spikes": len(old.spikes), "load": [load0, _load()]}
        out[item] = row
        print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    return out


if __name__ == "__main__":
    main()
