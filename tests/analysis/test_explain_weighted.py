"""The explanation with adjusted counts: whole weights give what the rows repeated that many times give."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from analysis.stats import explain as X


def _case(seed: int) -> tuple[np.ndarray, np.ndarray, pl.DataFrame, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    n = 3000
    values = rng.lognormal(8, 0.5, n)
    replica = rng.choice(["r0", "r1", "r2", "r3"], n)
    spike = np.arange(n) >= 2000
    values[spike & (replica == "r2")] *= 4  # the cause, inside the spike only
    weights = rng.choice([1.0, 2.0, 5.0], n)
    return values, weights, pl.DataFrame({"replica": replica}), np.flatnonzero(spike), np.flatnonzero(~spike)


def _expand(values: np.ndarray, weights: np.ndarray, frame: pl.DataFrame, rows: list[np.ndarray]
            ) -> tuple[np.ndarray, pl.DataFrame, list[np.ndarray]]:
    reps = weights.astype(np.int64)
    index = np.repeat(np.arange(values.size), reps)
    new_of = np.concatenate([[0], np.cumsum(reps)])
    out_rows = [np.concatenate([np.arange(new_of[i], new_of[i + 1]) for i in r]) for r in rows]
    return values[index], frame[index.tolist()], out_rows


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_weighted_counterfactual_and_shares_equal_the_expanded_rows(seed: int) -> None:
    values, weights, frame, spike, base = _case(seed)
    coded = [X.code_dimension(frame, "replica")]
    tail = spike[values[spike] > X.weighted_q(values, weights, base)]
    cands, _ = X.contrast(coded, tail, base, pairs=False, weights=weights)
    assert cands and coded[0].labels[cands[0].codes[0]] == "r2"
    X.counterfactual(coded, cands, values, spike, base, X.TailQuantile(values[base], base), weights)

    ev, eframe, (espike, ebase, etail) = _expand(values, weights, frame, [spike, base, tail])
    ecoded = [X.code_dimension(eframe, "replica")]
    ecands, _ = X.contrast(ecoded, etail, ebase, pairs=False)
    X.counterfactual(ecoded, ecands, ev, espike, ebase, X.TailQuantile(ev[ebase], ebase))
    by_code = {c.codes: c for c in ecands}
    for c in cands:
        e = by_code[c.codes]
        assert c.tail_share == pytest.approx(e.tail_share, rel=1e-12)
        assert c.base_share == pytest.approx(e.base_share, rel=1e-12)
        assert c.p99_without_ns == pytest.approx(e.p99_without_ns, rel=1e-12)
        assert c.baseline_p99_without_ns == pytest.approx(e.baseline_p99_without_ns, rel=1e-12)
        assert math.isfinite(c.explained) and c.explained == pytest.approx(e.explained, rel=1e-9)


def test_weighted_tail_slice_holds_one_percent_of_the_weight() -> None:
    values = np.arange(5000, dtype=np.float64)
    rows = np.arange(5000)
    even = sorted(X.tail_slice(values, rows, weights=np.full(5000, 2.0)).tolist())
    k = 50  # 1 % of 5,000 exactly (explain.tail_share), weighted (a hundredth of 10,000) or not
    assert even == sorted(X.tail_slice(values, rows).tolist()) == list(range(5000 - k, 5000))
    weights = np.where(values >= 4980, 5.0, 1.0)  # 5,080 in all: the slowest 11 hold 55 >= 50.8
    assert sorted(X.tail_slice(values, rows, weights=weights).tolist()) == list(range(4989, 5000))
