"""The watch on sampled traces: rules and the tail-spike detection weigh each request's adjusted count.

Reference: the same rows repeated adjusted_count times, unweighted (the brute force a whole
adjusted count stands for); and rows whose every weight is 1 give, bit for bit, what rows
without weights give.
"""

from __future__ import annotations

import random

import numpy as np
import polars as pl
import pytest

from analysis.stats import explain as X
from analysis.stats.spikes import detect
from analysis.watch import Config, Rule, Watcher, evaluate_rule

NS = 1_000_000_000
WINDOW = 10 * NS
WIN = 50 * WINDOW


def _frame(rng: random.Random, n: int) -> pl.DataFrame:
    """Random rows over the three windows up to WIN, with whole adjusted counts 1-5."""
    statuses = ["ok"] * 8 + ["error", "timeout"]
    return pl.DataFrame({
        "start_ns": [WIN - rng.randrange(3) * WINDOW + rng.randrange(WINDOW) for _ in range(n)],
        "e2e_ns": [rng.choice([None, *(rng.randrange(1, 10**10) for _ in range(9))]) for _ in range(n)],
        "status": [rng.choice(statuses) for _ in range(n)],
        "adjusted_count": [float(rng.randint(1, 5)) for _ in range(n)],
    }, schema={"start_ns": pl.Int64, "e2e_ns": pl.Int64, "status": pl.String, "adjusted_count": pl.Float64})


def _expanded(frame: pl.DataFrame) -> pl.DataFrame:
    reps = frame.get_column("adjusted_count").cast(pl.Int64)
    return frame.select(pl.all().repeat_by(reps).explode()).drop("adjusted_count")


def _rules(rng: random.Random) -> list[Rule]:
    return [Rule("p", "percentile", metric="e2e", q=rng.choice([0.5, 0.9, 0.99]),
                 threshold_ns=rng.randrange(1, 10**10)),
            Rule("e", "error_rate", threshold_ratio=rng.choice([0.05, 0.2, 0.5])),
            Rule("b", "burn", metric="e2e", threshold_ns=rng.randrange(1, 10**10), objective=0.95,
                 rate=rng.choice([0.5, 2.0, 5.0]), fast_s=10.0, slow_s=30.0)]


def test_weighted_rules_equal_the_expanded_rows() -> None:
    rng = random.Random(18)
    for trial in range(200):
        frame = _frame(rng, rng.randrange(1, 60))
        for rule in _rules(rng):
            got, want = evaluate_rule(rule, frame, WIN, WINDOW), evaluate_rule(rule, _expanded(frame), WIN, WINDOW)
            assert (got is None) == (want is None), (trial, rule)
            if got is None or want is None:
                continue
            assert got[0] == want[0], (trial, rule)
            if rule.kind == "percentile":
                assert got[1]["measured_ms"] == pytest.approx(want[1]["measured_ms"], abs=1e-3)
                assert got[1].get("values_weighted", got[1]["values"]) == want[1]["values"]
                assert got[1]["values"] <= want[1]["values"]
            elif rule.kind == "error_rate":
                assert got[1]["measured_ratio"] == pytest.approx(want[1]["measured_ratio"], abs=1e-6)
                assert got[1]["failed"] == want[1]["failed"]
            else:
                for k in ("burn_fast", "burn_slow"):
                    assert got[1][k] == pytest.approx(want[1][k], abs=1e-4)


def test_the_low_sample_flag_reads_the_effective_count() -> None:
    """600 values, one weighing 10,000: the p99 is that one request's value, a low-sample figure."""
    values = list(range(1, 601))
    weights = [1.0] * 599 + [10_000.0]
    frame = pl.DataFrame({"start_ns": [WIN] * 600, "e2e_ns": values, "status": ["ok"] * 600,
                          "adjusted_count": weights})
    got = evaluate_rule(Rule("p", "percentile", metric="e2e", q=0.99, threshold_ns=1), frame, WIN, WINDOW)
    assert got is not None
    assert got[1]["values"] == 600 and got[1]["low_sample"]
    assert got[1]["values_effective"] == pytest.approx((599 + 10_000) ** 2 / (599 + 10_000 ** 2), abs=1e-3)
    unweighted = evaluate_rule(Rule("p", "percentile", metric="e2e", q=0.99, threshold_ns=1),
                               frame.drop("adjusted_count"), WIN, WINDOW)
    assert unweighted is not None and not unweighted[1]["low_sample"]


def test_every_weight_one_is_the_unweighted_watch_bit_for_bit() -> None:
    rng = random.Random(7)
    for trial in range(100):
        frame = _frame(rng, rng.randrange(1, 60)).with_columns(pl.lit(1.0).alias("adjusted_count"))
        for rule in _rules(rng):
            assert evaluate_rule(rule, frame, WIN, WINDOW) == evaluate_rule(rule, frame.drop("adjusted_count"),
                                                                          WIN, WINDOW), trial


def _rows(rng: np.random.Generator, t0: int, n: int, weights: bool) -> pl.DataFrame:
    cols: dict[str, object] = {"trace_id": [f"{t0}-{i}" for i in range(n)],
                               "start_ns": (t0 + rng.integers(0, 60 * NS, n)).tolist(),
                               "e2e_ns": rng.lognormal(20, 0.5, n).astype(np.int64).tolist(),
                               "ttft_ns": [None] * n, "tpot_ns": [None] * n, "status": ["ok"] * n,
                               "service": ["llm"] * n, **{d: ["x"] * n for d in X.DIMENSIONS}}
    if weights:
        cols["adjusted_count"] = rng.choice([1.0, 4.0, 10.0], n).tolist()
    return pl.DataFrame(cols)


@pytest.mark.parametrize("weights", [False, True])
def test_the_tail_detection_is_detect_with_the_weights(weights: bool) -> None:
    rng = np.random.default_rng(3)
    w = Watcher(Config())
    frames = [_rows(rng, k * 60 * NS, 900, weights) for k in range(8)]
    for k, f in enumerate(frames[:-1]):
        w.add_window(k * 60 * NS, f)
    w.tick(7 * 60 * NS, frames[-1])
    rows = pl.concat(frames)
    weight = rows.get_column("adjusted_count").to_numpy() if weights else None
    det = detect(rows.get_column("start_ns").to_numpy(), rows.get_column("e2e_ns").to_numpy().astype(np.float64),
                 60 * NS, weights=weight)
    assert w.last_detection is not None
    assert w.last_detection.weighted == weights
    assert w.last_detection.p99_ns.tolist() == det.p99_ns.tolist()
    assert w.last_detection.baseline_p99_ns == det.baseline_p99_ns
