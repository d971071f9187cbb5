"""Baseline requests given as counts (explain.Rest, the ClickHouse report's pushdown) explain exactly as rows do.

On many random request sets, the dimension contrast and the counterfactual p99s computed from
every baseline row are compared with those computed from a part of the rows (always holding
the baseline's top slice) plus the other requests as counts per combination of dimension
values, token counts replaced by a plain reference of their bucket's lower bound.
"""

from __future__ import annotations

import math
from collections import Counter
from functools import partial
from typing import Any

import numpy as np
import polars as pl

from analysis.stats import explain as X


def _bucket_floor(x: int | None) -> int | None:
    """Reference: the lower bound of a token count's power-of-two bucket (0 alone; missing when negative)."""
    if x is None or x < 0:
        return None
    return 0 if x == 0 else 1 << (x.bit_length() - 1)


def _requests(rng: np.random.Generator, n: int) -> tuple[pl.DataFrame, np.ndarray]:
    reps = [f"r{i}" for i in range(int(rng.integers(2, 9)))]
    tenants = ["a", "b", "c", None]

    def pick(options: list[Any]) -> list[Any]:
        return [options[i] for i in rng.integers(0, len(options), n)]

    def tokens() -> list[int | None]:
        return [None if rng.random() < 0.05 else int(rng.integers(-2, 9000)) for _ in range(n)]

    frame = pl.DataFrame({"replica": pick(reps), "model": pick(["m1", "m2"]), "model_version": pick(["v1", None]),
                          "tenant": pick(tenants), "input_tokens": tokens(), "output_tokens": tokens()},
                         schema={"replica": pl.String, "model": pl.String, "model_version": pl.String,
                                 "tenant": pl.String, "input_tokens": pl.Int64, "output_tokens": pl.Int64})
    values = np.round(rng.lognormal(20, 0.4, n))
    slow = frame.get_column("replica").to_numpy() == reps[0]  # one replica slow everywhere: reaches the fallback
    values[slow] *= float(rng.uniform(1.0, 6.0))
    return frame, values


def _values_without(coded: list[X.Coded], values: np.ndarray, counted: np.ndarray, calls: Counter[int],
                    cand: X.Candidate) -> np.ndarray:
    """Reference reader of the counted requests' values outside a candidate (their full coding)."""
    calls[0] += 1
    return values[counted][~X.candidate_mask(coded, cand, counted)]


def test_counts_explain_as_rows_on_random_requests() -> None:
    rng = np.random.default_rng(7)
    fallbacks = found = 0
    for _ in range(60):
        n = int(rng.integers(600, 4000))
        frame, values = _requests(rng, n)
        m = int(rng.integers(100, n // 3))
        spike, base = np.arange(m, dtype=np.int64), np.arange(m, n, dtype=np.int64)
        values[spike] *= float(rng.uniform(1.0, 3.0))
        tail = spike[values[spike] > np.quantile(values[base], 0.99)]
        tail = tail if tail.size >= X.MIN_TAIL_SLICE else X.tail_slice(values, spike)
        coded = [X.code_dimension(frame, d) for d in X.DIMENSIONS]
        want, want_tested = X.contrast(coded, tail, base)
        X.counterfactual(coded, want, values, spike, base, X.TailQuantile(values[base], base))

        # the pushdown's split: the top slice and a random part of the baseline stay rows, the rest are counts
        top = X.TailQuantile(values[base], base).values[0]
        keep = (values[base] >= top) | (rng.random(base.size) < rng.uniform(0, 0.5))
        rows = np.concatenate([spike, base[keep]])
        counted = base[~keep]
        reps = frame[counted].with_columns(
            pl.Series(t, [_bucket_floor(x) for x in frame[counted].get_column(t).to_list()], pl.Int64)
            for t in ("input_tokens", "output_tokens"))
        combos = reps.group_by(X.DIMENSIONS).len("n")
        sub = frame[rows]
        sub_coded, combo_codes = X.code_with_counts(sub, combos)
        calls = Counter[int]()
        rest = X.Rest(combo_codes, combos.get_column("n").to_numpy(),
                      partial(_values_without, coded, values, counted, calls))
        sub_values = values[rows]
        sub_spike = np.arange(m, dtype=np.int64)
        sub_base = np.arange(m, rows.size, dtype=np.int64)
        sub_tail = np.searchsorted(rows, tail).astype(np.int64)  # spike rows keep their positions
        got, got_tested = X.contrast(sub_coded, sub_tail, sub_base, rest=rest)
        X.counterfactual(sub_coded, got, sub_values, sub_spike, sub_base,
                         X.TailQuantile(sub_values[sub_base], sub_base, n_total=base.size), rest=rest)
        fallbacks += calls[0]
        found += len(want)
        assert got_tested == want_tested
        assert [X.candidate_json(sub_coded, c) for c in got] == [X.candidate_json(coded, c) for c in want]
        for a, b in zip(got, want, strict=True):
            for f in ("p99_without_ns", "baseline_p99_without_ns", "explained"):
                x, y = getattr(a, f), getattr(b, f)
                assert x == y or (math.isnan(x) and math.isnan(y)), f
    assert fallbacks > 0, "some counterfactual reached below the baseline's top slice"
    assert found > 60, "the random requests hold candidates to compare"


class _WeightedTail:
    """Reference BaselineTail: the weighted p99 of every baseline row (the full coding), whole and without a
    candidate given in another coding of the same labels."""

    def __init__(self, coded: list[X.Coded], values: np.ndarray, weights: np.ndarray, base: np.ndarray) -> None:
        self.coded, self.values, self.weights, self.base = coded, values, weights, base

    def quantile(self) -> float:
        return X.weighted_q(self.values, self.weights, self.base)

    def without_candidate(self, coded: Any, cand: X.Candidate) -> float:
        codes = tuple(self.coded[i].labels.index(coded[i].labels[c]) for i, c in zip(cand.dims, cand.codes,
                                                                                       strict=True))
        same = X.Candidate(cand.dims, codes, 0, 0, 0.0, 0.0, 0.0, 0.0)
        left = self.base[~X.candidate_mask(self.coded, same, self.base)]
        return X.weighted_q(self.values, self.weights, left) if left.size else math.nan


def test_weighted_counts_explain_as_weighted_rows_on_random_requests() -> None:
    """Weighted (adjusted counts 0.5 to 4, exact in binary so sums agree in any order): the contrast and the
    counterfactuals from rows plus counts with summed weights (and a weighted BaselineTail over the whole
    baseline, as the server's) equal those from every row."""
    rng = np.random.default_rng(17)
    found = 0
    for _ in range(40):
        n = int(rng.integers(600, 4000))
        frame, values = _requests(rng, n)
        weights = rng.choice([0.5, 1.0, 2.0, 4.0], n)
        m = int(rng.integers(100, n // 3))
        spike, base = np.arange(m, dtype=np.int64), np.arange(m, n, dtype=np.int64)
        values[spike] *= float(rng.uniform(1.0, 3.0))
        tail = X.tail_slice(values, spike, weights=weights)
        coded = [X.code_dimension(frame, d) for d in X.DIMENSIONS]
        want, want_tested = X.contrast(coded, tail, base, weights=weights)
        X.counterfactual(coded, want, values, spike, base, X.TailQuantile(values[base], base), weights)

        keep = rng.random(base.size) < rng.uniform(0, 0.5)
        rows = np.concatenate([spike, base[keep]])
        counted = base[~keep]
        reps = frame[counted].with_columns(
            pl.Series(t, [_bucket_floor(x) for x in frame[counted].get_column(t).to_list()], pl.Int64)
            for t in ("input_tokens", "output_tokens")).with_columns(pl.Series("_w", weights[counted]))
        combos = reps.group_by(X.DIMENSIONS).agg(pl.len().alias("n"), pl.col("_w").sum().alias("w"))
        sub = frame[rows]
        sub_coded, combo_codes = X.code_with_counts(sub, combos)
        calls = Counter[int]()
        rest = X.Rest(combo_codes, combos.get_column("n").to_numpy(),
                      partial(_values_without, coded, values, counted, calls), combos.get_column("w").to_numpy())
        sub_spike = np.arange(m, dtype=np.int64)
        sub_base = np.arange(m, rows.size, dtype=np.int64)
        sub_tail = np.searchsorted(rows, tail).astype(np.int64)
        got, got_tested = X.contrast(sub_coded, sub_tail, sub_base, weights=weights[rows], rest=rest)
        X.counterfactual(sub_coded, got, values[rows], sub_spike, sub_base,
                         _WeightedTail(coded, values, weights, base), weights[rows], rest=rest)
        found += len(want)
        assert calls[0] == 0, "the weighted counterfactuals read no counted value"
        assert got_tested == want_tested
        assert [X.candidate_json(sub_coded, c) for c in got] == [X.candidate_json(coded, c) for c in want]
        for a, b in zip(got, want, strict=True):
            for f in ("tail_share", "base_share", "p_value", "p99_without_ns", "baseline_p99_without_ns",
                      "explained"):
                x, y = getattr(a, f), getattr(b, f)
                assert x == y or (math.isnan(x) and math.isnan(y)), f
    assert found >= 20, "the random requests hold candidates to compare"
