"""What sampling did to the data: which requests carry a recorded sampling probability, whether the keep
rate looks tail-based (it depends on latency or outcome without saying so), and by roughly how much
the percentiles are then off; plus the bootstrap interval of a weighted quantile.

Weights (each request's adjusted count, analysis.engine.model) make counts and percentiles right for
any sampler that *records* its probability, whatever it keeps (errors at 100 % and the rest at
20 %, a rate per tenant): the kept requests, weighted, stand for the whole. A tail-based sampler
(keep the slow ones, keep the errors, decided after the request ended) records nothing; its
kept requests weigh 1 and pull every percentile toward the slow end. The data can show it when
some requests carry a recorded probability and others none: with head sampling whether a
request carries a record does not depend on its latency or outcome, so a record-less share that
is much higher among slow requests (beyond the weighted p90) or failures than among the rest is
evidence of a policy that kept them for being slow or failing (`TAIL_RATIO` and a Chernoff bound
at `TAIL_ALPHA`). What the truth is then depends on what that policy kept, which nothing records:
when a head sampler recorded its probability on every request and the tail policy added the
slow ones it had left out, the recorded requests alone are a probability sample of the whole
and their weighted percentiles are right, while everything kept counts the slow ones twice;
when the tail policy kept every slow request and the head only the rest, everything kept is
right and the recorded ones alone are too fast. The report gives both (`unbiased_*` is the
recorded-only estimate) and calls their distance the bias: "off by up to". When nothing is
recorded a tail sampler leaves no trace in the data; `policy="tail"` (declared by the user,
`--sampling-policy tail`) says so and the magnitude is unknown.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import duckdb
import numpy as np
import numpy.typing as npt

from analysis.engine import model as M
from analysis.engine.percentiles import ms, quote_ident, row_id_column, source_columns, weighted_quantile_sorted
from analysis.stats.explain import binomial_tail_bound

F64 = npt.NDArray[np.float64]
Mask = npt.NDArray[np.bool_]

#: Sampling policies a user may declare: `auto` (judge from the data), `head` (trust the recorded
#: probabilities), `tail` (a tail-based sampler kept requests for their latency or outcome).
POLICIES: Final[tuple[str, ...]] = ("auto", "head", "tail")
#: The record-less share among slow requests (or failures) must be this many times that among the rest ...
TAIL_RATIO: Final = 2.0
#: ... and that over-representation significant at this level (Chernoff bound, two tests: slow and failed).
TAIL_ALPHA: Final = 1e-3
#: Requests beyond this weighted quantile are the "slow" ones of the test.
SLOW_Q: Final = 0.9
#: Bootstrap draws of `quantile_interval`.
BOOTSTRAP_DRAWS: Final = 400


@dataclass
class SamplingView:
    """The sampling facts of the values a report analyses."""

    policy: str
    sampled: bool
    recorded: int = 0
    unrecorded: int = 0
    malformed: int = 0
    tail_based: bool = False
    evidence: str | None = None
    p50_ns: float = math.nan
    p99_ns: float = math.nan
    unbiased_p50_ns: float = math.nan
    unbiased_p99_ns: float = math.nan
    bias: dict[str, float | None] = field(default_factory=dict)

    def warning(self) -> str | None:
        """The sentence a reader must see before any percentile, or None."""
        if not self.tail_based:
            return None
        head = f"percentiles are biased: tail-based sampling ({self.evidence})"
        if math.isfinite(self.unbiased_p99_ns) and math.isfinite(self.p99_ns):
            return (f"{head}; against the {self.recorded:,} requests with a recorded sampling probability, "
                    f"p50 may be off by up to {_pct(self.p50_ns, self.unbiased_p50_ns)} and p99 by up to "
                    f"{_pct(self.p99_ns, self.unbiased_p99_ns)} (recorded-only estimate: p50 "
                    f"{self.unbiased_p50_ns / 1e6:,.1f} ms, p99 {self.unbiased_p99_ns / 1e6:,.1f} ms)")
        return f"{head}; no request records its sampling probability, so by how much is unknown"

    def to_json(self) -> dict[str, Any]:
        """The report's `sampling` object."""
        return {"policy": self.policy, "recorded": self.recorded, "unrecorded": self.unrecorded,
                "malformed": self.malformed, "tail_based": self.tail_based, "evidence": self.evidence,
                "p50_ms": ms(self.p50_ns), "p99_ms": ms(self.p99_ns),
                "unbiased_p50_ms": ms(self.unbiased_p50_ns), "unbiased_p99_ms": ms(self.unbiased_p99_ns),
                "bias": self.bias}



def _pct(x: float, ref: float) -> str:
    return f"{(x - ref) / ref:+.0%}" if ref else "?"


def _wq(values: F64, weights: F64, q: float) -> float:
    order = np.argsort(values, kind="stable")
    return weighted_quantile_sorted(values[order], weights[order], q)


def recorded_flags(con: duckdb.DuckDBPyConnection, facts: str, rids: npt.NDArray[np.int64]
                   ) -> tuple[Mask, Mask]:
    """Per `rid` of `facts` (trace_id, start_ns): whether its request span records a sampling probability
    (an `ot=th` or a rate attribute) and whether that record is malformed; read from `spans`."""
    rec, bad = M.sampling_record_sql(M.DUCKDB)
    rid = row_id_column(con, facts)
    rows = con.execute(
        f"SELECT f.{rid}, bool_or({rec}), bool_or({bad}) FROM {facts} f "
        f"JOIN spans s ON s.IsRequest AND s.TraceId = f.trace_id AND s.TimestampNs = f.start_ns "
        f"WHERE f.{rid} IN (SELECT unnest($rids)) GROUP BY f.{rid}", {"rids": rids.tolist()}).fetchall()
    # (a semi-join on the ids: `list_contains` over the list compared every row with every id)
    got = {int(r): (bool(a), bool(b)) for r, a, b in rows}
    recorded = np.array([got.get(int(r), (False, False))[0] for r in rids], dtype=bool)
    malformed = np.array([got.get(int(r), (False, False))[1] for r in rids], dtype=bool)
    return recorded, malformed


@dataclass(frozen=True)
class Counts:
    """The analysed values counted: with / without a recorded sampling probability, malformed records, and
    whether any value weighs other than 1."""

    recorded: int
    unrecorded: int
    malformed: int
    weighted: bool


class JudgeInputs(Protocol):
    """What `judge` reads of the analysed values (each with its weight, outcome and sampling record): counts and
    weighted quantiles, never the values themselves, so a remote engine answers on its server
    (analysis.clickhouse.report) and `Arrays` in memory; the rule stays in `judge`."""

    def counts(self) -> Counts:
        """The values counted (see `Counts`)."""
        ...

    def quantiles(self, qs: tuple[float, ...], recorded_only: bool = False) -> list[float]:
        """The weighted quantiles (percentiles.weighted_quantile_sorted) of every value, or of those with a
        recorded probability only; nan when there is none."""
        ...

    def unrecorded_split(self, slower_than: float | None) -> tuple[int, int, int, int]:
        """(marked, unrecorded among them, the rest, unrecorded among the rest): marked are the values above
        `slower_than`, or the failed requests' when it is None."""
        ...


@dataclass
class Arrays:
    """JudgeInputs over per-value arrays (the store's report)."""

    values: F64
    weights: F64
    failed: Mask
    recorded: Mask
    malformed: Mask

    def counts(self) -> Counts:
        """The values counted."""
        n_rec = int(self.recorded.sum())
        return Counts(n_rec, int(self.recorded.size) - n_rec, int(self.malformed.sum()),
                      bool(np.any(self.weights != 1.0)))

    def quantiles(self, qs: tuple[float, ...], recorded_only: bool = False) -> list[float]:
        """Weighted quantiles of the values (or of the recorded ones)."""
        v, w = (self.values[self.recorded], self.weights[self.recorded]) if recorded_only else (self.values,
                                                                                              self.weights)
        order = np.argsort(v, kind="stable")
        v, w = v[order], w[order]
        return [weighted_quantile_sorted(v, w, q) for q in qs]

    def unrecorded_split(self, slower_than: float | None) -> tuple[int, int, int, int]:
        """Counts of marked / unrecorded values, in and out of the mark."""
        mark = self.failed if slower_than is None else self.values > slower_than
        unrec = ~self.recorded
        return (int(mark.sum()), int((unrec & mark).sum()), int((~mark).sum()), int((unrec & ~mark).sum()))


def judge(inputs: JudgeInputs, policy: str) -> SamplingView:
    """The sampling view of analysed values (see the module docstring for the rule)."""
    c = inputs.counts()
    view = SamplingView(policy=policy, sampled=c.weighted, recorded=c.recorded, unrecorded=c.unrecorded,
                        malformed=c.malformed)
    if policy == "tail":
        view.tail_based, view.evidence = True, "declared"
    elif policy == "auto" and view.recorded and view.unrecorded:
        slow_at = inputs.quantiles((SLOW_Q,))[0]
        for name, at in (("latency", slow_at), ("outcome", None)):
            ev = _over_represented(*inputs.unrecorded_split(at))
            if ev is not None:
                view.tail_based = True
                view.evidence = (f"requests without a recorded probability are {ev[0]:.0%} of the "
                                 f"{'slowest 10 %' if name == 'latency' else 'failures'} but {ev[1]:.0%} of the rest")
                break
    if view.recorded + view.unrecorded:
        view.p50_ns, view.p99_ns = inputs.quantiles((0.5, 0.99))
    if view.tail_based and view.recorded:
        view.unbiased_p50_ns, view.unbiased_p99_ns = inputs.quantiles((0.5, 0.99), recorded_only=True)
        view.bias = {"p50": round((view.p50_ns - view.unbiased_p50_ns) / view.unbiased_p50_ns, 4)
                     if view.unbiased_p50_ns else None,
                     "p99": round((view.p99_ns - view.unbiased_p99_ns) / view.unbiased_p99_ns, 4)
                     if view.unbiased_p99_ns else None}
    return view


def _over_represented(n_in: int, k_in: int, n_out: int, k_out: int) -> tuple[float, float] | None:
    """(share of unrecorded among the n_in marked values, among the n_out rest) when clearly and significantly
    higher; k_in / k_out: the unrecorded among each."""
    if n_in == 0 or n_out == 0:
        return None
    share_in, share_out = k_in / n_in, k_out / n_out
    if share_in < TAIL_RATIO * share_out:
        return None
    p = binomial_tail_bound(k_in, n_in, min(1.0, share_out + 1 / n_out))
    return (share_in, share_out) if p <= TAIL_ALPHA / 2 else None


def bootstrap_quantiles(values: F64, weights: F64 | None, q: float, draws: int = BOOTSTRAP_DRAWS,
                        seed: int = 0) -> F64:
    """The (weighted) quantile q of `draws` bootstrap resamples: n kept requests drawn uniformly with replacement,
    each keeping its adjusted count (see `quantile_interval` for why this resamples in proportion to them)."""
    n = values.size
    if n == 0:
        return np.full(draws, math.nan)
    w = np.ones(n) if weights is None else weights
    rng = np.random.default_rng(seed)
    out = np.empty(draws)
    for i in range(draws):
        pick = rng.integers(0, n, n)
        out[i] = _wq(values[pick], w[pick], q)
    return out


def quantile_interval(values: F64, weights: F64 | None, q: float, level: float = 0.99,
                      draws: int = BOOTSTRAP_DRAWS, seed: int = 0) -> tuple[float, float]:
    """Bootstrap interval of the (weighted) quantile q: the central `level` of `bootstrap_quantiles`.

    The kept requests are the units a Poisson (or any probability) sampler drew, so they are what is
    drawn again, uniformly, each keeping its adjusted count w_i. That is resampling in proportion to the
    adjusted counts: a request's expected weight in a resample is w_i, so the resampled weighted
    distribution is centred on the weighted one. Drawing n requests with probability w_i / sum(w), each
    weighing 1, is the same law when every weight is equal (uniform sampling), but when weights vary it
    ignores that a few heavy requests carry much of the estimate and gives too narrow an interval; its
    spread matches this one only with Kish's effective count n_eff = (sum w)^2 / sum w^2 of draws
    (tests/analysis/test_sampling_bootstrap.py compares the three on random inputs)."""
    if values.size == 0:
        return (math.nan, math.nan)
    out = bootstrap_quantiles(values, weights, q, draws, seed)
    lo, hi = np.quantile(out, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def weight_of(con: duckdb.DuckDBPyConnection, facts: str) -> str:
    """SQL reading a facts table's adjusted count (1 when the table predates it)."""
    return quote_ident("adjusted_count") if "adjusted_count" in source_columns(con, facts) else "1.0"
