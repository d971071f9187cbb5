"""Two routes to the quarter-sampled cold start that detection does not take, measured on the catalogue: a scan of
each critical-path stage's time, and a scan of the end-to-end values on windows too short to judge a p99.

    python -m tests.sample_traces.stage_scan [--seeds 5] [--full]
    python -m tests.sample_traces.stage_scan --cost

Each run is written as the accuracy suite writes it (tests/sample_traces/seeded.py): by default the clean run and the
end-to-end incidents in a 25 % sample of a 2,500 s run, 300 s windows (the report's); `--full`: every catalogue entry,
10-minute runs at full rate, 60 s windows. Per critical-path stage (the `requests` view's columns), the best stretch
of detection's scan (`analysis.stats.spikes`: the values above the pooled p99, counted and ranked by their Savage
scores, family-wise over every stretch of up to half the windows, 999 null draws) with its p-value and whether it
overlaps the truth window. A stage event is a stage's best stretch at p <= ALPHA / (stages): the family-wise budget
split over the stages; it would be a spike when its windows also pass detection's effect-size rules on the end-to-end
values (`judge_stretch` with the significance left to the stage: the p99 20 % over the baseline's, the p50 within
10 %), and a false one on the clean run or outside the truth window. At a quarter also, for the cold start and the
clean run: the end-to-end scan on 60 s windows (no per-window p99) and the largest p99 rise over the pooled p99 of a
4-minute stretch (about 600 kept values, the shortest that judges a p99 with margin), of the stretches holding the
cold start's middle minute and of any; and detection (as the report runs it, weighted by the adjusted counts) beside
detection on the same kept values unweighted: its best stretch's scan p and the cold start's window's p99 rise.
Offline (about 70 CPU-s at a quarter, 60 at full rate, for 5 seeds); docs/methods.md records the figures.
`--cost`: what reading every request's stage columns (what a stage scan needs; the report reads them only for the
tail slices' traces) costs beside the report itself, on one unmaterialized store of a 2,500 s full-rate run.
"""

from __future__ import annotations

import argparse
import resource
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from analysis import connect
from analysis.report import build_report
from analysis.stats.spikes import (
    ALPHA,
    MAX_SCAN_SHARE,
    SCAN_DRAWS,
    Detection,
    block_scores,
    detect,
    judge_stretch,
    quantile_sorted,
    scan_null_max,
    scan_p_value,
    tail_ratio,
    tail_scores,
)
from sample_traces import generate
from sample_traces.emit import write_store
from sample_traces.incidents import CATALOGUE, run
from tests.sample_traces.seeded import QUARTER_INCIDENTS, QUARTER_RUN_S, quarter_copy
from tracing.schema import CRITICAL_PATH_COLUMNS, OTHER

SEC = 1_000_000_000
STAGES = tuple(s for s in CRITICAL_PATH_COLUMNS if s != OTHER)
#: A stage event's level: ALPHA shared by the stages (Bonferroni), so any stage's false event stays within ALPHA.
STAGE_ALPHA = ALPHA / len(STAGES)
#: The cold start's middle minute, from the run's start (the load runs 1,250-1,340 s into the 2,500 s run).
COLD_MINUTE = 21


@dataclass
class Best:
    """The most anomalous stretch of one scan: its p-value, first window (start, ns) and length in windows."""

    p_value: float
    start_ns: int
    windows: int


def scan(start_ns: npt.NDArray[np.int64], values: npt.NDArray[np.float64], window_ns: int, seed: int = 0
         ) -> Best | None:
    """Detection's scan over every window of `window_ns` (none left out for its size): threshold the pooled p99,
    the best stretch of 1 up to MAX_SCAN_SHARE of the windows; None when no value is above the threshold."""
    wins, at_all = np.unique(start_ns // window_ns, return_inverse=True)
    n = np.bincount(at_all).astype(np.int64)
    threshold = float(np.quantile(values, 0.99))
    above = values > threshold
    if not above.any():
        return None
    at, v = at_all[above], values[above]
    order = np.argsort(v, kind="stable")
    scores = block_scores(tail_scores(v[order]))
    k = np.bincount(at, minlength=n.size)
    s = np.bincount(at[order], weights=scores, minlength=n.size)
    total_k, total_n = int(k.sum()), int(n.sum())
    max_len = max(1, int(MAX_SCAN_SHARE * n.size))
    null = scan_null_max(n, total_k, max_len, SCAN_DRAWS, np.random.default_rng(seed), scores)
    ck, cn, cs = (np.concatenate([[0], np.cumsum(x)]) for x in (k, n, s))
    best, arg = -1.0, Best(1.0, 0, 0)
    for length in range(1, max_len + 1):
        ratio = tail_ratio(ck[length:] - ck[:-length], cn[length:] - cn[:-length], cs[length:] - cs[:-length],
                           total_k, total_n)
        i = int(ratio.argmax())
        if ratio[i] > best:
            best, arg = float(ratio[i]), Best(1.0, int(wins[i] * window_ns), length)
    arg.p_value = scan_p_value(best, null)
    return arg


def stretch_rises(start_ns: npt.NDArray[np.int64], values: npt.NDArray[np.float64], minutes: int
                  ) -> tuple[float, float]:
    """The largest p99 over the pooled p99 of a stretch of `minutes` one-minute windows holding at least 500 values
    (MIN_TAIL beyond its p99): of those holding the cold start's middle minute, and of any."""
    minute = start_ns // (60 * SEC)
    minute -= minute.min()
    pooled = quantile_sorted(np.sort(values), 0.99)
    event, anywhere = 0.0, 0.0
    for first in range(int(minute.max()) - minutes + 2):
        inside = (minute >= first) & (minute < first + minutes)
        if inside.sum() < 500:
            continue
        rise = quantile_sorted(np.sort(values[inside]), 0.99) / pooled
        anywhere = max(anywhere, rise)
        if first <= COLD_MINUTE < first + minutes:
            event = max(event, rise)
    return event, anywhere


def passes(det: Detection, best: Best) -> bool:
    """Whether the windows of a stage's best stretch pass detection's effect-size rules on the end-to-end values."""
    where = {int(w): i for i, w in enumerate(det.window_start_ns.tolist())}
    run_ = [where.get(best.start_ns + i * det.window_ns, -1) for i in range(best.windows)]
    return -1 not in run_ and judge_stretch(det, run_, alpha=1.0) is not None


def one(name: str, seed: int, full: bool, tmp: Path) -> dict[str, object]:
    """One run's stage scans (and, at a quarter, the end-to-end routes), as printed."""
    scenario = run(name, seed, generate.DURATION_S if full else QUARTER_RUN_S, generate.RATE)
    store = (write_store(tmp / "store", scenario.config, scenario.requests, seed) if full
             else quarter_copy(scenario, seed, tmp))
    con = connect(store)
    try:
        frame = con.sql(f"SELECT start_ns, e2e_ns, adjusted_count, {', '.join(f'{s}_ns' for s in STAGES)} "
                        "FROM requests ORDER BY start_ns").pl()
    finally:
        con.close()
    start = frame.get_column("start_ns").to_numpy()
    e2e = frame.get_column("e2e_ns").to_numpy().astype(np.float64)
    weights = frame.get_column("adjusted_count").to_numpy().astype(np.float64)
    window_ns = (60 if full else 300) * SEC
    det = detect(start, e2e, window_ns, weights=weights)  # as the report detects: weighted by the adjusted counts
    truth = scenario.truth()["window"] if scenario.incident.stage is not None else None
    events = []
    for stage in STAGES:
        best = scan(start, frame.get_column(f"{stage}_ns").to_numpy().astype(np.float64), window_ns)
        if best is None:
            continue
        end_ns = best.start_ns + best.windows * window_ns
        inside = truth is not None and best.start_ns < truth["end_ns"] and end_ns > truth["start_ns"]
        events.append((best.p_value, stage, best, inside, best.p_value <= STAGE_ALPHA and passes(det, best)))
    out: dict[str, object] = {"events": sorted(events, key=lambda e: (e[0], e[1]))}
    if not full and name in ("clean", "cold_start"):
        out["e2e_60s"] = scan(start, e2e, 60 * SEC)
        out["rise_4min"] = stretch_rises(start, e2e, 4)
        # the weights' part: detection weighted (the report's) and not, the cold start's window's p99 rise in each
        middle = start.min() // (60 * SEC) * 60 * SEC + (COLD_MINUTE * 60 + 30) * SEC
        out["weights"] = [(d.scan_p_value, float(d.p99_ns[i] / d.baseline_p99_ns))
                          for d in (det, detect(start, e2e, window_ns))
                          for i in [int(np.searchsorted(d.window_start_ns, middle, side="right")) - 1]]
    return out


def _cpu_s() -> float:
    """This process's CPU seconds, every thread's (DuckDB's too)."""
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


def cost(tmp: Path) -> None:
    """Print the CPU of the report and of reading every request's stage columns, twice each, on one store."""
    scenario = run("cold_start", 1, QUARTER_RUN_S, generate.RATE)
    store = write_store(tmp / "store", scenario.config, scenario.requests, 1)
    for _ in range(2):
        con = connect(store)
        t0 = _cpu_s()
        build_report(con, "e2e")
        t1 = _cpu_s()
        con.close()
        con = connect(store)
        t2 = _cpu_s()
        rows = con.sql(f"SELECT start_ns, {', '.join(f'{s}_ns' for s in STAGES)} FROM requests").pl().height
        t3 = _cpu_s()
        con.close()
        print(f"{rows} requests: the report {t1 - t0:.2f} CPU-s; every request's stage columns {t3 - t2:.2f} CPU-s "
              f"({(t3 - t2) / (t1 - t0):.2f} of the report)")


def main() -> None:
    """Print each run's stage scans and the counts the docs record."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--cost", action="store_true")
    ap.add_argument("--names", help="only these catalogue entries (comma-separated)")
    a = ap.parse_args()
    if a.cost:
        with tempfile.TemporaryDirectory() as tmp:
            cost(Path(tmp))
        return
    names = [inc.name for inc in CATALOGUE] if a.full else ["clean", *QUARTER_INCIDENTS]
    if a.names:
        names = [n for n in names if n in a.names.split(",")]
    clean_events = clean_spikes = outside = cold_found = 0
    for seed in range(1, a.seeds + 1):
        for name in names:
            with tempfile.TemporaryDirectory() as tmp:
                got = one(name, seed, a.full, Path(tmp))
            events = got["events"]
            assert isinstance(events, list)
            line = " ".join(f"{stage} p={p:.3f}{' in truth' if inside else ''}{' SPIKE' if spike else ''}"
                            f"@{best.start_ns // SEC % 3600 // 60:02d}+{best.windows}" for p, stage, best, inside, spike
                            in events[:3])
            extra = ""
            if "e2e_60s" in got:
                e2e, rises = got["e2e_60s"], got["rise_4min"]
                assert isinstance(e2e, Best) and isinstance(rises, tuple)
                weights = got["weights"]
                assert isinstance(weights, list)
                (pw, rw), (pu, ru) = weights
                extra = (f" | e2e at 60 s p={e2e.p_value:.3f}; 4-min p99 rise: cold start's minute {rises[0]:.2f}, "
                         f"any {rises[1]:.2f} | detection weighted: scan p={pw:.3f}, cold start window x{rw:.2f}; "
                         f"unweighted: p={pu:.3f}, x{ru:.2f}")
            print(f"seed {seed} {name:22s} {line}{extra}", flush=True)
            flagged = [(stage, inside, spike) for p, stage, _, inside, spike in events if p <= STAGE_ALPHA]
            clean_events += name == "clean" and bool(flagged)
            clean_spikes += name == "clean" and any(spike for _, _, spike in flagged)
            outside += name != "clean" and any(spike and not inside for _, inside, spike in flagged)
            cold_found += name == "cold_start" and ("model_load", True, True) in flagged
    runs = a.seeds * sum(name != "clean" for name in names)
    print(f"stage events (p <= {STAGE_ALPHA:.5f}): on {clean_events} of {a.seeds} clean runs, {clean_spikes} of them "
          f"passing the effect-size rules (false spikes); passing them outside the truth window on {outside} of "
          f"{runs} incident runs; the cold start's model_load in its window and passing them on {cold_found} of "
          f"{a.seeds}")


if __name__ == "__main__":
    main()
