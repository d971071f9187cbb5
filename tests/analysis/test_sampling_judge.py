"""sampling.judge reads its inputs from a source (sampling.JudgeInputs): the arrays in memory and the SQL on
ClickHouse (clickhouse.report._ServerJudged, in chdb) give the same view, and the arrays' the view of a simple
reference of the rule written here from the module docstring, on many random inputs (weights, ties, records,
failures, every policy)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from analysis.clickhouse.report import _ServerJudged
from analysis.stats import sampling as SM
from analysis.stats.explain import binomial_tail_bound


def _ref_quantile(values: list[float], weights: list[float], q: float) -> float:
    """The documented weighted quantile, by a loop: N = sum w, h = (N - 1) q, v(p) the first value whose running
    weight exceeds p (the last past the end), v(floor h) + frac(h) (v(floor h + 1) - v(floor h))."""
    if not values:
        return math.nan
    pairs = sorted(zip(values, weights, strict=True), key=lambda p: p[0])
    running, cum = 0.0, []
    for _, w in pairs:
        running += w
        cum.append(running)

    def v(level: float) -> float:
        for (x, _), c in zip(pairs, cum, strict=True):
            if c > level:
                return x
        return pairs[-1][0]
    h = (cum[-1] - 1.0) * q
    lo = math.floor(h)
    return v(lo) + (h - lo) * (v(lo + 1) - v(lo))


def _ref_judge(values: Any, weights: Any, failed: Any, recorded: Any, malformed: Any, policy: str) -> SM.SamplingView:
    """The rule of analysis.stats.sampling's docstring, written plainly over lists."""
    vals, ws = values.tolist(), weights.tolist()
    rec, bad, fail = recorded.tolist(), malformed.tolist(), failed.tolist()
    view = SM.SamplingView(policy=policy, sampled=any(w != 1.0 for w in ws), recorded=sum(rec),
                           unrecorded=len(rec) - sum(rec), malformed=sum(bad))
    if policy == "tail":
        view.tail_based, view.evidence = True, "declared"
    elif policy == "auto" and view.recorded and view.unrecorded:
        slow_at = _ref_quantile(vals, ws, SM.SLOW_Q)
        for name, marks in (("latency", [x > slow_at for x in vals]), ("outcome", fail)):
            inside = [not r for r, m in zip(rec, marks, strict=True) if m]
            outside = [not r for r, m in zip(rec, marks, strict=True) if not m]
            if not inside or not outside:
                continue
            s_in, s_out = sum(inside) / len(inside), sum(outside) / len(outside)
            if s_in >= SM.TAIL_RATIO * s_out and binomial_tail_bound(
                    sum(inside), len(inside), min(1.0, s_out + 1 / len(outside))) <= SM.TAIL_ALPHA / 2:
                view.tail_based = True
                view.evidence = (f"requests without a recorded probability are {s_in:.0%} of the "
                                 f"{'slowest 10 %' if name == 'latency' else 'failures'} but {s_out:.0%} of the rest")
                break
    if vals:
        view.p50_ns, view.p99_ns = _ref_quantile(vals, ws, 0.5), _ref_quantile(vals, ws, 0.99)
    if view.tail_based and view.recorded:
        rv = [x for x, r in zip(vals, rec, strict=True) if r]
        rw = [w for w, r in zip(ws, rec, strict=True) if r]
        view.unbiased_p50_ns, view.unbiased_p99_ns = _ref_quantile(rv, rw, 0.5), _ref_quantile(rv, rw, 0.99)
        view.bias = {k: round((a - b) / b, 4) if b else None
                     for k, a, b in (("p50", view.p50_ns, view.unbiased_p50_ns),
                                     ("p99", view.p99_ns, view.unbiased_p99_ns))}
    return view


def _random_inputs(rng: np.random.Generator, trial: int) -> tuple[SM.F64, SM.F64, SM.Mask, SM.Mask, SM.Mask]:
    """Values (ties on some trials), weights (1, whole, dyadic or thirds), failures, records (none, all, at random,
    or missing mostly on slow / failed requests as a tail sampler leaves them), malformed records."""
    n = int(rng.choice([0, 1, 7, int(rng.integers(50, 3000))], p=[0.05, 0.05, 0.1, 0.8]))
    values = rng.lognormal(18, 0.5, n)
    if trial % 3 == 0:
        values = np.round(values, -6)  # ties
    weights = [np.ones(n), rng.choice([1.0, 4.0], n), rng.choice([1.0, 2.5, 0.5], n),
               rng.choice([1.0, 10 / 3, 5.0], n)][trial % 4]
    failed = rng.random(n) < rng.choice([0.0, 0.02, 0.2])
    mode = trial % 5
    if mode == 0:
        recorded = np.ones(n, dtype=bool)
    elif mode == 1:
        recorded = np.zeros(n, dtype=bool)
    elif mode == 2:
        recorded = rng.random(n) < 0.7
    else:  # a tail sampler: the slow (mode 3) or failed (mode 4) requests mostly carry no record
        slow = values > (np.quantile(values, 0.9) if n else 0.0)
        marked = slow if mode == 3 else failed
        recorded = np.where(marked, rng.random(n) < 0.2, rng.random(n) < 0.9)
    malformed = recorded & (rng.random(n) < 0.05)
    return values, weights.astype(np.float64), failed, recorded, malformed


def _fields(view: SM.SamplingView) -> tuple[Any, ...]:
    return (view.policy, view.sampled, view.recorded, view.unrecorded, view.malformed, view.tail_based,
            view.evidence)


def _floats(view: SM.SamplingView) -> list[float]:
    return [view.p50_ns, view.p99_ns, view.unbiased_p50_ns, view.unbiased_p99_ns]


def test_the_arrays_give_the_reference_rules_view_on_random_inputs() -> None:
    rng = np.random.default_rng(3)
    tail = 0
    for trial in range(200):
        inputs = _random_inputs(rng, trial)
        for policy in SM.POLICIES:
            got = SM.judge(SM.Arrays(*inputs), policy)
            want = _ref_judge(*inputs, policy)
            assert _fields(got) == _fields(want), (trial, policy)
            assert np.array_equal(_floats(got), _floats(want), equal_nan=True), (trial, policy)
            assert got.bias == want.bias
            tail += policy == "auto" and got.tail_based
    assert tail >= 20, "the random tail samplers are caught"


@pytest.mark.slow
def test_the_server_gives_the_arrays_view_on_random_inputs(chdb_client: Any) -> None:
    """Every field equal; the quantiles to the bit but where weights of 10/3 are summed in another order within a
    tie (then within float rounding)."""
    rng = np.random.default_rng(5)
    table = "t_judged"
    seen = set()
    for trial in range(40):
        values, weights, failed, recorded, malformed = inputs = _random_inputs(rng, trial)
        chdb_client.command(f"DROP TABLE IF EXISTS {table}")
        chdb_client.command(f"CREATE TABLE {table} (v Float64, w Float64, failed Bool, recorded Bool, malformed Bool) "
                       "ENGINE = Memory")
        if values.size:
            chdb_client.insert_arrow(table, pa.table({"v": values, "w": weights, "failed": failed, "recorded": recorded,
                                                 "malformed": malformed}))
        for policy in SM.POLICIES:
            got = SM.judge(_ServerJudged(chdb_client, table), policy)
            want = SM.judge(SM.Arrays(*inputs), policy)
            assert _fields(got) == _fields(want), (trial, policy)
            if trial % 4 == 3:
                assert np.allclose(_floats(got), _floats(want), rtol=1e-12, atol=0, equal_nan=True), (trial, policy)
            else:
                assert np.array_equal(_floats(got), _floats(want), equal_nan=True), (trial, policy)
            seen.add((policy, got.tail_based, got.evidence is not None and "failures" in got.evidence))
    assert ("auto", True, True) in seen and ("auto", True, False) in seen and ("auto", False, False) in seen
