"""Explanation of one spike: which stages grew in the tail, which dimension values the tail is made of,
how much of the excess disappears without each, and example traces to open.

- Stages: the tail slice of the spike window (its slowest 1 %, at least 10 requests)
  against the same slice of the baseline, stage by stage, in critical-path time
  (`requests` view columns). Each stage's growth divided by the total positive growth
  is its share; the positive shares sum to 1. Stages split into prefill / decode report
  those parts (the `generation` column then holds only its uncovered residual).
- Dimensions: replica, model, model_version, tenant and power-of-two buckets of input /
  output tokens, and every pair of them. Tail = the spike's requests slower than the
  baseline p99 (the excess itself). Score = share among the tail minus share in the
  baseline. A candidate needs support (at least MIN_SUPPORT requests and MIN_SHARE of the
  tail) and a binomial over-representation p-value (Chernoff bound) below
  ALPHA / candidates tested (Bonferroni).
- Counterfactual: remove the candidate from both the spike window and the baseline,
  recompute both p99s; explained = 1 - (new excess / excess). Removing it from both
  sides keeps a value that is always in the tail (long outputs) from passing for a cause.
  Dimensions are ranked by explained (rounded to 0.01), a pair needing PAIR_MARGIN more than
  a single to rank above it (a pair is a subset of its parts: it earns its place only by
  explaining clearly more), then single before pair, then score.

Sampled traces: given each row's adjusted count (`weights`), tail slices hold the slowest
(1 - q) of the weight, shares and stage means are weighted, the p-value reads the effective
counts (Kish), and counterfactual percentiles are weighted quantiles. Support stays a count of
kept requests: it is the evidence there is. Without weights nothing changes.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from itertools import combinations
from typing import Any, Final, Protocol, runtime_checkable

import duckdb
import numpy as np
import numpy.typing as npt
import polars as pl

from analysis.engine import model as M
from analysis.engine.connect import duck_type
from analysis.engine.percentiles import MIN_TAIL, effective_count, ms, quantiles_unsorted, weighted_quantile_sorted
from analysis.engine.views import LIVE_HOUR_MACRO, LIVE_REQUESTS_KEPT, VIEW_SQL
from analysis.stats.spikes import quantile_sorted
from tracing import schema as S

#: Dimensions a spike is explained by (columns of `requests`).
DIMENSIONS: Final[tuple[str, ...]] = ("replica", "model", "model_version", "tenant", "input_tokens",
                                      "output_tokens")
#: Numeric dimensions, bucketed by powers of two: [2^k, 2^(k+1) - 1], and [0, 0].
BUCKETED: Final[frozenset[str]] = frozenset({"input_tokens", "output_tokens"})
#: Stages that happen before the first token (the ones TTFT is made of).
BEFORE_FIRST_TOKEN: Final[tuple[str, ...]] = (S.NETWORK, S.QUEUE_WAIT, S.PREPROCESS, S.MODEL_LOAD, S.GENERATION,
                                              S.PREFILL, S.OTHER)
TAIL_Q: Final = 0.99
MIN_TAIL_SLICE: Final = 10
MIN_SUPPORT: Final = 3
MIN_SHARE: Final = 0.1
ALPHA: Final = 0.01
MAX_COUNTERFACTUAL: Final = 25
MAX_EXEMPLARS: Final = 5
MAX_PAIR_CELLS: Final = 5_000_000
#: The fewest cells an attribute's count with a group of built-ins may have (`PairTables`; else a quarter of the
#: rows): more built-ins in one count means fewer passes over the rows, but a larger table to sum.
PAIR_TABLE_CELLS: Final = 1 << 12
#: A pair ranks above a single only when it explains this much more of the excess.
PAIR_MARGIN: Final = 0.1

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
Mask = npt.NDArray[np.bool_]


def bucket_bounds(x: int) -> tuple[int, int]:
    """The power-of-two bucket [lo, hi] holding a non-negative integer (0 has its own bucket)."""
    if x <= 0:
        return (0, 0)
    lo = 1 << (int(x).bit_length() - 1)
    return (lo, 2 * lo - 1)


#: Between the two ends of a bucket's label.
BUCKET_SEP: Final = "-"


def bucket_label(lo: int, hi: int) -> str:
    """How a token bucket is written everywhere (report, dashboard): "lo-hi", both ends included."""
    return f"{lo}{BUCKET_SEP}{hi}"


def bucket_lo_sql(column: str) -> str:
    """DuckDB SQL for the low end of `column`'s bucket, as `bucket_bounds` (NULL stays NULL; < 2**62)."""
    guess = f"(2 ** floor(log2(greatest({column}, 1))))::BIGINT"
    # log2 of a double can land one off next to a power of two: settle it in integers
    return (f"(CASE WHEN {column} IS NULL THEN NULL WHEN {column} <= 0 THEN 0 "  # greatest() skips NULL
            f"WHEN {guess} > {column} THEN {guess} // 2 "
            f"WHEN {guess} * 2 <= {column} THEN {guess} * 2 ELSE {guess} END)")


def bucket_hi_sql(column: str) -> str:
    """DuckDB SQL for the high end (included) of `column`'s bucket, as `bucket_bounds`."""
    return f"(CASE WHEN {column} IS NULL THEN NULL WHEN {column} <= 0 THEN 0 ELSE 2 * {bucket_lo_sql(column)} - 1 END)"


def bucket_label_sql(column: str) -> str:
    """DuckDB SQL for `bucket_label` of `column`'s bucket, so SQL callers (the dashboard) write it the same way."""
    return f"({bucket_lo_sql(column)}::VARCHAR || '{BUCKET_SEP}' || {bucket_hi_sql(column)}::VARCHAR)"


@dataclass
class Coded:
    """One dimension as integer codes (-1 = missing) with each code's label and bounds."""

    name: str
    codes: I64
    labels: list[str]
    lo: list[int | None]
    hi: list[int | None]
    #: the attribute key a dimension reads and where from (request, stage, resource); None / "builtin" for the six
    attribute: str | None = None
    source: str = "builtin"
    #: rows per code over all of `codes`, the missing ones in the last slot (`counts_of`; an attribute file's
    #: counts fill it without a pass); dataclasses.replace does not copy it (its codes differ)
    counts: I64 | None = field(default=None, init=False, repr=False, compare=False)

    def at(self, rows: I64) -> I64:
        """The codes of `rows` (`codes[rows]`; a coding that makes its codes only when asked gathers just these)."""
        return self.codes[rows]

    def keyed(self, scale: int, plus: I64) -> I64:
        """Every row's code times `scale` plus `plus` (the missing value in the extra last slot, len(labels)): a
        key of this dimension with others in one pass (a coding that makes its codes only when asked makes none)."""
        return _missing_last(self.codes, len(self.labels) + 1) * scale + plus

    def count_keyed(self, scale: int, plus: I64, cells: int, weights: F64 | None = None) -> tuple[I64, F64 | None]:
        """Rows per cell of `keyed(scale, plus)` (every key in [0, cells)) and, given every row's `weights`, their
        sums (np.bincount's, in row order)."""
        key = self.keyed(scale, plus)
        return np.bincount(key, minlength=cells), None if weights is None else summed(key, weights, cells)


def counts_of(c: Coded) -> I64:
    """Rows per code over all of `c.codes`, the missing ones in the last slot (len(labels) + 1 slots); cached."""
    if c.counts is None:
        got = np.bincount(c.codes + 1, minlength=len(c.labels) + 1)
        c.counts = np.concatenate([got[1:], got[:1]])
    return c.counts


def base_counts(c: Coded, base: I64, outside: I64 | None, slots: int) -> I64:
    """Rows of `base` per code of `c`, the missing ones in the last slot; `outside`: the rows of `c` not in `base`,
    when fewer than it (then its count is taken from the whole's, `counts_of`)."""
    if outside is None:
        return np.bincount(_missing_last(c.at(base), slots), minlength=slots)
    return counts_of(c) - np.bincount(_missing_last(c.at(outside), slots), minlength=slots)


def code_dimension(frame: pl.DataFrame, name: str) -> Coded:
    """Integer codes of a dimension column (token columns bucketed by powers of two)."""
    col = frame.get_column(name)
    if name in BUCKETED:
        codes = _bucket_codes(col.cast(pl.Int64))
        return bucketed(name, codes, int(codes.max()) if codes.size else -1)
    # a categorical (the report's frame reads text dimensions as ENUMs) is coded without decoding its text
    if col.dtype == pl.Categorical or isinstance(col.dtype, pl.Enum):
        # codes from the column's own through a table of its few values: no cast of every row
        own = col.to_physical()  # unsigned: the missing rows read the table's last slot
        present = col.gather(own.arg_unique()).drop_nulls()  # one row of each value (cheaper than unique())
        phys = present.to_physical().cast(pl.Int64).to_numpy()
        texts = present.cast(pl.String).to_list()
        labels = sorted(texts)
        at = {label: i for i, label in enumerate(labels)}
        lut = np.full(int(phys.max()) + 2 if phys.size else 1, -1, dtype=np.int64)  # last slot: missing
        lut[phys] = [at[t] for t in texts]
        return Coded(name, lut[(own.fill_null(lut.size - 1) if own.null_count() else own).to_numpy()],
                     labels, [None] * len(labels), [None] * len(labels))
    text = col.cast(pl.String)
    labels = text.drop_nulls().unique().sort().to_list()
    codes = text.cast(pl.Enum(labels)).to_physical().cast(pl.Int64).fill_null(-1).to_numpy()
    return Coded(name, codes, labels, [None] * len(labels), [None] * len(labels))


def bucketed(name: str, codes: I64, top: int) -> Coded:
    """A token dimension with its bucket codes and the labels and bounds of every bucket up to code `top` (-1: none);
    a remote engine, which keeps the codes, gives `top` alone and no codes."""
    labels: list[str] = []
    lo: list[int | None] = []
    hi: list[int | None] = []
    for c in range(top + 1):
        b_lo, b_hi = bucket_bounds(0 if c == 0 else 1 << (c - 1))
        labels.append(bucket_label(b_lo, b_hi))
        lo.append(b_lo)
        hi.append(b_hi)
    return Coded(name, codes, labels, lo, hi)


#: Token counts up to this are bucketed through a table of every count's code (`_bucket_codes`).
_BUCKET_TABLE_MAX: Final = 1 << 22


def _bucket_float_codes(x: npt.NDArray[Any]) -> I64:
    """The bucket code of each count by its float formula: -1 missing (NaN) or negative, 0 for 0, else
    floor(log2(x)) + 1 (the ClickHouse report writes the same formula in SQL)."""
    xs = np.nan_to_num(np.asarray(x, dtype=np.float64), nan=-1.0)
    k = np.where(xs >= 1, np.floor(np.log2(np.maximum(xs, 1))).astype(np.int64) + 1, 0)
    return np.where(xs < 0, -1, k).astype(np.int64)


def _bucket_codes(x: pl.Series) -> I64:
    """`_bucket_float_codes` of an Int64 column; counts in [0, _BUCKET_TABLE_MAX] read a table of the formula's
    code for every count up to the largest (one gather instead of a log per row), the same codes."""
    lo, hi = x.min(), x.max()
    if not isinstance(lo, int) or not isinstance(hi, int) or lo < 0 or hi > _BUCKET_TABLE_MAX:
        return _bucket_float_codes(x.to_numpy())
    table = np.append(_bucket_float_codes(np.arange(hi + 1)), -1)  # last slot: missing
    return table[(x.fill_null(hi + 1) if x.null_count() else x).to_numpy()]


def code_with_counts(frame: pl.DataFrame, combos: pl.DataFrame) -> tuple[list[Coded], list[I64]]:
    """The DIMENSIONS of `frame`'s rows and of `combos`' rows (counted requests, see `Rest`) coded together,
    so both carry the labels coding every request would give; (the rows' Coded, the combos' codes)."""
    both = pl.concat([frame.select(DIMENSIONS), combos.select(DIMENSIONS)], how="vertical_relaxed")
    every = [code_dimension(both, d) for d in DIMENSIONS]
    rows = [Coded(c.name, c.codes[:frame.height], c.labels, c.lo, c.hi) for c in every]
    return rows, [c.codes[frame.height:] for c in every]


def binomial_tail_bound(k: int, n: int, p: float) -> float:
    """Upper bound (Chernoff) on P[Binomial(n, p) >= k]; 1 when k <= n p."""
    if n == 0 or k <= n * p:
        return 1.0
    x = k / n
    p = min(max(p, 1e-300), 1 - 1e-16)
    kl = x * math.log(x / p) + ((1 - x) * math.log((1 - x) / (1 - p)) if x < 1 else 0.0)
    return math.exp(-n * kl)


@dataclass
class Candidate:
    """A dimension value (or a pair) with its contrast and counterfactual figures."""

    dims: tuple[int, ...]  # indices into the coded dimensions
    codes: tuple[int, ...]
    tail_count: int
    base_count: int
    tail_share: float
    base_share: float
    score: float
    p_value: float
    p99_without_ns: float = math.nan
    baseline_p99_without_ns: float = math.nan
    explained: float = math.nan


@dataclass
class Rest:
    """Baseline requests given as counts, not rows (a remote engine aggregates them).

    `codes`: per dimension, the code of each combination (coded with the rows' `Coded`);
    `counts`: requests per combination; `values_without(cand)`: their metric values outside a
    candidate (read only when a counterfactual needs more than the baseline's top slice);
    `weights`: the summed adjusted counts per combination, for weighted requests (None: unweighted).
    """

    codes: list[I64]
    counts: I64
    values_without: Callable[[Candidate], F64]
    weights: F64 | None = None

    @property
    def n(self) -> int:
        """Requests the counts stand for."""
        return int(self.counts.sum())


def contrast(coded: Sequence[Coded], tail: I64, base: I64, pairs: bool = True,
             weights: F64 | None = None, rest: Rest | None = None) -> tuple[list[Candidate], int]:
    """Candidates over-represented among `tail` rows against `base` rows; returns (passing, tested): each passing
    candidate's p-value is at most ALPHA / tested (Bonferroni over every candidate tested)."""
    found, tested = contrast_raw(coded, tail, base, pairs, weights, rest)
    return significant(found, tested), tested


def significant(found: Sequence[Candidate], tested: int) -> list[Candidate]:
    """The candidates whose p-value passes ALPHA / tested (the family-wise level over `tested` candidates)."""
    level = ALPHA / max(tested, 1)
    return [c for c in found if c.p_value <= level]


@dataclass
class Cells:
    """One combination's cells (a dimension's values, or a pair's pairs of values) as a remote engine counts them:
    `present`, the cells a tail or baseline request holds (missing values left out: the family's share); and the
    cells with at least the asked tail count, in cell order: their codes, tail and baseline counts (`t`, `b`) and,
    weighted, their summed adjusted counts (`tw`, `bw`)."""

    present: int
    codes: list[tuple[int, ...]]
    t: list[int]
    b: list[int]
    tw: list[float] | None = None
    bw: list[float] | None = None


#: A remote engine's cells: (the dimensions, combinations of their indices, the tail's rows, the least tail count a
#: candidate can have) -> each combination's Cells, counted over the tail and the whole baseline on the engine.
RemoteCells = Callable[[Sequence[Coded], list[tuple[int, ...]], I64, int], dict[tuple[int, ...], Cells]]


def least_support(n_t: int, weighted: bool) -> int:
    """The least tail count a candidate may have: MIN_SUPPORT and, unweighted, a share of at least MIN_SHARE (the
    guard's own float test); what a remote engine is asked for."""
    if weighted or n_t == 0:
        return MIN_SUPPORT
    k = max(MIN_SUPPORT, math.ceil(MIN_SHARE * n_t) - 1)
    while k / n_t < MIN_SHARE:
        k += 1
    return k


def family_combos(coded: Sequence[Coded], pairs: bool, pairs_with: int | None,
                  cut: list[dict[str, Any]] | None = None) -> list[tuple[int, ...]]:
    """The combinations `contrast_raw` tests, in its order: each dimension alone, then the pairs (every one, or with
    `pairs_with` those holding one of the first `pairs_with` dimensions), without those of a dimension with no
    value; a pair of more than MAX_PAIR_CELLS cells is left out and, given `cut`, recorded there with why."""
    slots = [len(c.labels) + 1 for c in coded]
    combos: list[tuple[int, ...]] = [(i,) for i in range(len(coded))]
    if pairs:
        combos += [c for c in combinations(range(len(coded)), 2) if pairs_with is None or c[0] < pairs_with]
    out = []
    for combo in combos:
        if any(len(coded[i].labels) == 0 for i in combo):
            continue
        cells = math.prod(slots[i] for i in combo)
        if cells > MAX_PAIR_CELLS:
            if cut is not None:
                cut.append({"dimension": "&".join(coded[i].name for i in combo), "cells": cells,
                            "why": f"{cells:,} combinations of values (with missing), over the bound of "
                                   f"{MAX_PAIR_CELLS:,}"})
            continue
        out.append(combo)
    return out


def contrast_raw(coded: Sequence[Coded], tail: I64, base: I64, pairs: bool = True,
                 weights: F64 | None = None, rest: Rest | None = None, pairs_with: int | None = None,
                 remote: RemoteCells | None = None, cut: list[dict[str, Any]] | None = None,
                 remote_from: int | None = None) -> tuple[list[Candidate], int]:
    """`contrast` before the significance level: (candidates with support, their p-values, tested).

    With `weights` (adjusted counts per row) the shares are weighted and the binomial reads
    effective counts; support (`tail_count`) stays the kept requests. `rest`: more baseline
    requests as counts per combination of codes of the first dimensions (with their summed weights when
    `weights` are given). `pairs_with`: only the pairs holding one of the first `pairs_with` dimensions (the
    built-ins: every pair of them, and each with each later one, an attribute). `remote`: the combinations holding
    a dimension past the first `pairs_with` (the attributes) are counted by a remote engine (their codes here are
    not read); `remote_from`: the first dimension it counts when not the first past `pairs_with` (0: every one, the
    built-ins too, whose codes then stay on the engine). `cut`: receives the pairs left out for their size
    (`family_combos`)."""
    if rest is not None and weights is not None and rest.weights is None:
        raise ValueError("weighted requests need the baseline counts' (rest's) summed weights")
    if remote is not None and pairs_with is None:
        raise ValueError("a remote engine counts the combinations past the first pairs_with dimensions")
    local_dims = len(coded) if remote is None or pairs_with is None else min(
        pairs_with if remote_from is None else remote_from, len(coded))
    if rest is not None and len(rest.codes) != local_dims:
        raise ValueError("baseline counts (rest) must cover the dimensions counted here, no more, no fewer")
    n_t, n_b = tail.size, base.size + (rest.n if rest is not None else 0)
    w_t = None if weights is None else weights[tail]
    w_b = None if weights is None else weights[base]
    w_r = None if rest is None else rest.weights
    if w_t is not None and w_b is not None:
        sum_t, sum_b = float(w_t.sum()), float(w_b.sum()) + (float(w_r.sum()) if w_r is not None else 0.0)
        eff_t = effective_count(w_t)
    # codes with the missing value moved to an extra last slot, so a pair key is one multiply-add
    slots = [len(c.labels) + 1 for c in coded]
    codes_t = [_missing_last(c.at(tail), k) for c, k in zip(coded[:local_dims], slots, strict=False)]
    got_b: dict[int, I64] = {}

    def codes_b(i: int) -> I64:  # the baseline's codes of a dimension, gathered when first needed
        if i not in got_b:
            got_b[i] = _missing_last(coded[i].at(base), slots[i])
        return got_b[i]

    # unweighted, the baseline's count of every single and pair of the first dimensions is a sum over one count per
    # combination of them all (exact integers): one pass over its rows instead of one per single and pair
    lead = local_dims if pairs_with is None else min(pairs_with, local_dims)
    by_joint = w_b is None and lead > 2 and math.prod(slots[:lead]) <= MAX_JOINT_CELLS
    # unweighted, a single's baseline counts are its counts over every row less those outside the baseline (rows
    # once each, in order), when those are fewer (exact integers; the whole's counts are kept on the dimension);
    # the attributes' pairs with the built-ins count every row too, weighted or not (`PairTables`)
    n_rows = coded[0].codes.size if coded else 0
    by_tables = pairs and rest is None and 0 < lead < local_dims
    outside = None
    if ((by_tables or (w_b is None and local_dims > (lead if by_joint else 0))) and 2 * base.size > n_rows
            and bool(np.all(base[1:] > base[:-1]))):
        keep = np.ones(n_rows, dtype=bool)
        keep[base] = False
        outside = np.flatnonzero(keep)
    tables = PairTables(coded, lead, slots, base, outside, codes_b, weights,
                        max(n_rows // 4, PAIR_TABLE_CELLS)) if by_tables else None
    joint = None
    if by_joint:
        joint = tables.joint() if tables is not None else None
        if joint is None:
            joint = _joint_counts([codes_b(i) for i in range(lead)], slots[:lead])

    def single_b(i: int) -> I64:  # unweighted, a single's baseline counts (`base_counts`, or the attribute's table)
        if tables is not None and tables.covers(i):
            return tables.single(i)
        return base_counts(coded[i], base, outside, slots[i])

    codes_r = [] if rest is None else [np.where(c < 0, k - 1, c) for c, k in zip(rest.codes, slots, strict=False)]
    found: list[Candidate] = []
    tested = 0
    singles: dict[tuple[int, int], tuple[int, int]] = {}
    combos = family_combos(coded, pairs, pairs_with, cut)
    asked = [c for c in combos if max(c) >= local_dims]
    floor = least_support(n_t, w_t is not None)  # a cell with a smaller tail count is no candidate
    far = remote(coded, asked, tail, floor) if remote is not None and asked else {}
    for combo in combos:
        sizes = [slots[i] for i in combo]
        cells: Iterable[tuple[tuple[int, ...], int, int, float, float]]
        if combo in far:
            got = far[combo]
            tested += got.present
            tw, bw = got.tw or [0.0] * len(got.t), got.bw or [0.0] * len(got.t)
            cells = zip(got.codes, got.t, got.b, tw, bw, strict=True)
        else:
            known = tables.pair(*combo) if (tables is not None and len(combo) == 2 and combo[0] < lead
                                             and tables.covers(combo[1])) else None
            present, cells = _local_cells(combo, sizes, codes_t, codes_b, single_b if w_b is None else None, codes_r,
                                          joint, lead, rest, w_t, w_b, w_r, floor, known)
            tested += present
        for codes, t, b, tw_c, bw_c in cells:
            if any(code == size - 1 for code, size in zip(codes, sizes, strict=True)):
                continue  # a missing value is not a candidate
            if len(combo) == 1:
                singles[(combo[0], codes[0])] = (t, b)
            elif any(singles.get((combo[j], codes[j])) == (t, b) for j in range(2)):
                continue  # the pair is the same set as one of its parts
            if w_t is None:
                t_share, b_share = t / n_t, (b / n_b if n_b else 0.0)
            else:
                t_share, b_share = tw_c / sum_t, (bw_c / sum_b if n_b else 0.0)
            if t < MIN_SUPPORT or t_share < MIN_SHARE or t_share <= b_share:
                continue
            if w_t is None:
                p = binomial_tail_bound(t, n_t, (b + 1) / (n_b + 2))
            else:  # the weighted shares on the effective sample sizes
                p = binomial_tail_bound(round(t_share * eff_t), round(eff_t), (b_share * n_b + 1) / (n_b + 2))
            found.append(Candidate(combo, codes, t, b, t_share, b_share, t_share - b_share, p))
    return found, tested


def _local_cells(combo: tuple[int, ...], sizes: list[int], codes_t: list[I64], codes_b: Callable[[int], I64],
                 single_b: Callable[[int], I64] | None, codes_r: list[I64], joint: I64 | None, lead: int,
                 rest: Rest | None, w_t: F64 | None, w_b: F64 | None, w_r: F64 | None, floor: int,
                 known: tuple[I64, F64 | None] | None = None
                 ) -> tuple[int, list[tuple[tuple[int, ...], int, int, float, float]]]:
    """A combination's cells counted here: (present, the cells with at least `floor` tail requests in cell order
    with their tail and baseline counts and summed weights). `codes_b`: a dimension's baseline codes (gathered
    when asked); `single_b`: unweighted, a single's baseline counts (`base_counts`); `joint`: the first `lead`
    dimensions'; `known`: the combination's baseline counts and summed weights already counted (`PairTables`)."""
    cells = math.prod(sizes)

    def key(codes: Callable[[int], I64]) -> I64:
        return codes(combo[0]) if len(combo) == 1 else codes(combo[0]) * sizes[1] + codes(combo[1])

    key_t = key(codes_t.__getitem__)
    by_joint = known is None and joint is not None and max(combo) < lead
    by_whole = known is None and not by_joint and single_b is not None and len(combo) == 1
    key_b = None if known is not None or by_joint or by_whole else key(codes_b)
    tc = np.bincount(key_t, minlength=cells)
    if known is not None:
        bc = known[0]
    elif by_joint:
        assert joint is not None
        bc = joint.sum(axis=tuple(i for i in range(lead) if i not in combo)).ravel()
    elif by_whole:
        assert single_b is not None
        bc = single_b(combo[0])
    else:
        assert key_b is not None
        bc = np.bincount(key_b, minlength=cells)
    twc = bwc = None
    if rest is not None:
        key_r = key(codes_r.__getitem__)
        bc = bc + np.bincount(key_r, weights=rest.counts, minlength=cells).round().astype(np.int64)
    if w_t is not None and w_b is not None:
        twc = summed(key_t, w_t, cells)
        if known is not None:
            assert known[1] is not None
            bwc = known[1]
        else:
            assert key_b is not None
            bwc = summed(key_b, w_b, cells)
        if w_r is not None:
            bwc = bwc + np.bincount(key_r, weights=w_r, minlength=cells)
    # the family: every value (or pair of values) the window's requests hold, whether or not it reached the
    # tail: counting only those in the tail would let a dimension of many rare values pass by chance
    present = _present_cells(tc, bc, sizes)
    out = [(_unkey(int(cell), sizes), int(tc[cell]), int(bc[cell]), 0.0 if twc is None else float(twc[cell]),
            0.0 if bwc is None else float(bwc[cell])) for cell in np.flatnonzero(tc >= floor)]
    return present, out


class PairTables:
    """The baseline's counts of each attribute with each of the first `lead` dimensions (the built-ins), from one
    count per attribute and group of built-ins instead of one per pair.

    The rows' combinations of a run of built-ins (`Numbered`) are numbered densely over those present; an
    attribute's rows are counted once by `code x (k + 1) + combination`, and its table with each built-in of the
    group is that count summed over the group's other built-ins. The built-ins are grouped, in order, so that an
    attribute's count has at most `cells` cells (one group when they fit). Given the rows `outside` the baseline
    (when it is most of the rows), every row is counted and those outside carry the combination number k, a slot
    never read: the baseline's exact counts with no gather; else its rows are gathered (`codes_b`). Weighted, the
    adjusted counts `weights` (every row's) are summed the same way.
    """

    def __init__(self, coded: Sequence[Coded], lead: int, slots: list[int], base: I64, outside: I64 | None,
                 codes_b: Callable[[int], I64], weights: F64 | None, cells: int) -> None:
        self.coded, self.lead, self.slots, self.base, self.codes_b = coded, lead, slots, base, codes_b
        self.outside, self.weights, self.cells = outside, weights, cells
        self.whole = outside is not None
        self.numbered: dict[tuple[int, ...], Numbered] = {}
        self.done: dict[int, tuple[I64, dict[int, tuple[I64, F64 | None]]]] = {}
        self.grouped: dict[int, list[tuple[int, ...]] | None] = {}  # `_groups` per attribute width

    def _numbered(self, group: tuple[int, ...]) -> Numbered:
        """The rows' combinations of the built-ins of `group` numbered (from every built-in's, when it fits)."""
        if group not in self.numbered:
            sizes = [self.slots[j] for j in group]
            every = self._every(group)
            if every is not None:  # a table of every built-in's numbers: one gather of the rows
                sub = _joint_key([every.parts[j] for j in group], sizes)
                held = np.bincount(sub, minlength=math.prod(sizes)) > 0
                k = int(held.sum())
                combo = np.append((np.cumsum(held) - 1)[sub], k)[every.combo]
            else:
                if self.whole:
                    key = _joint_key([_missing_last(self.coded[j].codes, self.slots[j]) for j in group], sizes)
                else:
                    key = _joint_key([self.codes_b(j) for j in group], sizes)
                held = np.bincount(key, minlength=math.prod(sizes)) > 0
                k = int(held.sum())
                combo = (np.cumsum(held) - 1)[key]
                if self.outside is not None:
                    combo[self.outside] = k  # the slot never read
            self.numbered[group] = Numbered(combo, k, np.unravel_index(np.flatnonzero(held), sizes))
        return self.numbered[group]

    def _every(self, group: tuple[int, ...]) -> Numbered | None:
        """Every built-in's numbering, to number `group` from (None: `group` is every built-in, or too many)."""
        every = tuple(range(self.lead))
        if group == every or math.prod(self.slots[:self.lead]) > MAX_JOINT_CELLS:
            return None
        return self._numbered(every)

    def _k(self, group: tuple[int, ...]) -> int:
        """How many combinations of `group`'s built-ins the rows hold (without numbering the rows when it can)."""
        every = self._every(group) if group not in self.numbered else None
        if every is None:
            return self._numbered(group).k
        sizes = [self.slots[j] for j in group]
        return int(np.count_nonzero(np.bincount(_joint_key([every.parts[j] for j in group], sizes),
                                                minlength=math.prod(sizes))))

    def joint(self) -> I64 | None:
        """Given the rows outside the baseline: its rows per combination of every built-in, an array of shape their
        slots (`_joint_counts` of its rows, without gathering them); else None."""
        sizes = self.slots[:self.lead]
        if not self.whole or math.prod(sizes) > MAX_JOINT_CELLS:
            return None
        every = self._numbered(tuple(range(self.lead)))
        grid = np.zeros(math.prod(sizes), dtype=np.int64)
        grid[np.ravel_multi_index(every.parts, sizes)] = np.bincount(every.combo, minlength=every.k + 1)[:every.k]
        return grid.reshape(sizes)

    def _groups(self, a_slots: int) -> list[tuple[int, ...]] | None:
        """The built-ins in runs whose count with an attribute of `a_slots` slots has at most `cells` cells (a
        run's combinations bounded by the product of its slots, else numbered); None when one built-in alone
        has more. Worked out once per width (`covers` and `_tables` ask for each attribute)."""
        if a_slots not in self.grouped:
            self.grouped[a_slots] = self._grouped(a_slots)
        return self.grouped[a_slots]

    def _grouped(self, a_slots: int) -> list[tuple[int, ...]] | None:
        """`_groups`, worked out."""
        groups: list[tuple[int, ...]] = []
        run: tuple[int, ...] = ()
        for j in range(self.lead):
            wider = (*run, j)
            if a_slots * (math.prod(self.slots[d] for d in wider) + 1) <= self.cells or (
                    a_slots * (self._k(wider) + 1) <= self.cells):
                run = wider
                continue
            if not run:
                return None
            groups.append(run)
            run = (j,)
            if a_slots * (self.slots[j] + 1) > self.cells:
                return None
        return [*groups, run] if run else groups

    def covers(self, i: int) -> bool:
        """Whether attribute `i`'s pairs with the built-ins are counted here."""
        return i >= self.lead and self._groups(self.slots[i]) is not None

    def _tables(self, i: int) -> tuple[I64, dict[int, tuple[I64, F64 | None]]]:
        """Attribute `i`'s baseline counts per code, and per built-in its pair's counts (and summed weights), in
        `_local_cells`' cell order (the built-in's code x the attribute's slots + the attribute's code)."""
        if i in self.done:
            return self.done[i]
        a_slots, c = self.slots[i], self.coded[i]
        groups = self._groups(a_slots)
        assert groups is not None
        single: I64 | None = None
        per: dict[int, tuple[I64, F64 | None]] = {}
        for group in groups:
            num = self._numbered(group)
            width = num.k + 1
            if self.whole:
                counts, sums = c.count_keyed(width, num.combo, a_slots * width, self.weights)
            else:
                key = self.codes_b(i) * width + num.combo
                counts = np.bincount(key, minlength=a_slots * width)
                sums = None if self.weights is None else summed(key, self.weights[self.base], a_slots * width)
            tb = counts.reshape(a_slots, width)[:, :num.k]
            tw = None if sums is None else sums.reshape(a_slots, width)[:, :num.k]
            code, combo = np.nonzero(tb)
            n = tb[code, combo]
            if single is None:
                single = np.bincount(code, weights=n, minlength=a_slots).astype(np.int64)
            for d, j in enumerate(group):
                cell = num.parts[d][combo] * a_slots + code
                size = self.slots[j] * a_slots
                per[j] = (np.bincount(cell, weights=n, minlength=size).astype(np.int64),
                          None if tw is None else summed(cell, tw[code, combo], size))
        assert single is not None
        self.done[i] = (single, per)
        return self.done[i]

    def single(self, i: int) -> I64:
        """Attribute `i`'s baseline count per code, the missing ones in the last slot."""
        return self._tables(i)[0]

    def pair(self, j: int, i: int) -> tuple[I64, F64 | None]:
        """The baseline counts (and summed weights, weighted) of built-in `j` with attribute `i`, in cell order."""
        return self._tables(i)[1][j]


@dataclass
class Numbered:
    """A run of built-ins' combination of each counted row (`combo`, numbered 0..k-1 over the combinations
    present; k for a row outside the baseline), and each number's codes of the run's built-ins (`parts`)."""

    combo: I64
    k: int
    parts: tuple[npt.NDArray[np.intp], ...]


#: The most cells `contrast` counts the baseline's combinations of every dimension in (else pair by pair).
MAX_JOINT_CELLS: Final = 1 << 22


def summed(key: I64, weights: F64, cells: int) -> F64:
    """`weights` summed per key in [0, cells) (np.bincount's sums, in row order)."""
    return np.bincount(key, weights=weights, minlength=cells).astype(np.float64, copy=False)


def _present_cells(tc: I64, bc: I64, sizes: list[int]) -> int:
    """Cells (values, or pairs of values) held by a tail or baseline request, the missing value's left out."""
    held = (tc > 0) | (bc > 0)
    return int(held.reshape(sizes)[tuple(slice(0, size - 1) for size in sizes)].sum())  # the missing slot left out


def _missing_last(codes: I64, slots: int) -> I64:
    """Codes with the missing value (-1) moved to the extra last slot (slots - 1); `codes` itself when none is."""
    return np.where(codes < 0, slots - 1, codes) if codes.size and codes.min() < 0 else codes


def _joint_counts(codes: list[I64], slots: list[int]) -> I64 | None:
    """Rows per combination of every dimension's code (codes in [0, slots)), an array of shape `slots`; None
    when it would have more than MAX_JOINT_CELLS cells."""
    if math.prod(slots) > MAX_JOINT_CELLS or not codes:
        return None
    return np.bincount(_joint_key(codes, slots), minlength=math.prod(slots)).reshape(slots)


def _joint_key(codes: list[I64], slots: list[int]) -> I64:
    """Each row's combination of every dimension's code (codes in [0, slots)) as one index into an array of shape
    `slots`."""
    key = codes[0].astype(np.int64, copy=True)
    for c, k in zip(codes[1:], slots[1:], strict=True):
        key *= k
        key += c
    return key


def _unkey(cell: int, sizes: list[int]) -> tuple[int, ...]:
    out: list[int] = []
    for size in reversed(sizes):
        out.append(int(cell % size))
        cell //= size
    return tuple(reversed(out))


def gathered(coded: Sequence[Coded], rows: I64, dims: set[int] | None = None) -> list[Coded]:
    """The dimensions with the codes of `rows` only (of `dims`: the others kept as they are, never read)."""
    return [dataclasses.replace(c, codes=c.at(rows)) if dims is None or i in dims else c for i, c in enumerate(coded)]


def candidate_mask(coded: Sequence[Coded], cand: Candidate, rows: I64 | None) -> Mask:
    """Which of `rows` (None: every row of `coded`) match the candidate."""
    mask: Mask | None = None
    for i, code in zip(cand.dims, cand.codes, strict=True):
        match = (coded[i].codes if rows is None else coded[i].codes[rows]) == code
        mask = match if mask is None else mask & match
    if mask is None:
        return np.ones(coded[0].codes.size if rows is None else rows.size, dtype=bool)
    return mask


class TailQuantile:
    """p99 of a large sample with any subset removed, from its top slice only (exact while the slice holds it)."""

    def __init__(self, values: F64, rows: I64, q: float = TAIL_Q, slice_share: float = 0.05,
                 n_total: int | None = None) -> None:
        """`n_total`: the sample's size when `values` hold only its top part (at least the slice)."""
        self.n = values.size if n_total is None else n_total
        self.q = q
        self.top = self.top_size(self.n, slice_share)
        if self.top > values.size:
            raise ValueError(f"the top slice needs {self.top} values, {values.size} given")
        part = np.argpartition(values, values.size - self.top)[values.size - self.top:] if self.top < values.size \
            else np.arange(values.size)
        order = part[np.argsort(values[part], kind="stable")]
        self.values = values[order]  # the top slice, ascending
        self.rows = rows[order]
        self._slice_coded: tuple[Sequence[Coded], dict[int, Coded]] | None = None  # (coded, slice codes)

    @staticmethod
    def top_size(n: int, slice_share: float = 0.05) -> int:
        """How many of n values the top slice keeps (a remote engine pulls that many)."""
        return min(n, max(200, math.ceil(slice_share * n)))

    def without(self, removed_in_slice: Mask, removed_total: int) -> float:
        """The quantile after removing `removed_total` rows, of which the slice ones are flagged (nan if unknown)."""
        n2 = self.n - removed_total
        if n2 <= 0:
            return math.nan
        kept = self.values[~removed_in_slice]
        below = n2 - kept.size
        h = (n2 - 1) * self.q
        a = math.floor(h)
        i = a - below
        if i < 0 or kept.size == 0:
            return math.nan
        b = min(i + 1, kept.size - 1)
        return float(kept[i] + (h - a) * (kept[b] - kept[i]))

    def quantile(self) -> float:
        """The quantile of the whole sample."""
        return self.without(np.zeros(self.values.size, dtype=bool), 0)

    def slice_rows(self) -> I64:
        """Row ids of the top slice."""
        return self.rows

    def without_candidate(self, coded: Sequence[Coded], cand: Candidate) -> float:
        """The quantile with the candidate's baseline requests removed (nan when it reaches below the slice)."""
        if self._slice_coded is None or self._slice_coded[0] is not coded:
            self._slice_coded = (coded, {})
        got = self._slice_coded[1]  # the slice's codes of each dimension a candidate reads, gathered once
        for i in cand.dims:
            if i not in got:
                got[i] = dataclasses.replace(coded[i], codes=coded[i].at(self.rows))
        return self.without(candidate_mask([got.get(i, c) for i, c in enumerate(coded)], cand, None),
                            cand.base_count)


class BaselineTail(Protocol):
    """The baseline's p99, whole and with a candidate's requests removed: a TailQuantile in memory, or a remote
    engine's exact quantile per candidate (so no baseline row need come back for it)."""

    def quantile(self) -> float:
        """The quantile of the whole baseline."""
        ...

    def without_candidate(self, coded: Sequence[Coded], cand: Candidate) -> float:
        """The quantile with the candidate's requests removed; nan when unknown (the caller then reads them)."""
        ...


@runtime_checkable
class AsksAtOnce(Protocol):
    """A BaselineTail that can compute many candidates' quantiles together (a remote engine: fewer queries)."""

    def ask(self, coded: Sequence[Coded], cands: Sequence[Candidate]) -> None:
        """Compute (and keep) `without_candidate` of each of `cands` at once, where it can."""
        ...


#: A remote engine's spike figures without a candidate, by its position among the candidates: (the spike's requests
#: left, their effective count when weighted; the spike's (weighted) p99 without it), for the candidates whose codes
#: stay on the engine (`counterfactual`'s `known`).
SpikeWithout = Mapping[int, tuple[float, float]]


def enough_for_tail(kept: float) -> bool:
    """Whether `kept` requests (effective, weighted) are enough for a p99 with a tail: at least one request beyond
    it (100 for the p99). A spike without a candidate needs this much left; analysis.breakdowns judges a replica's
    p99 against the fleet's by the same minimum (fewer, and the p99 is close to the slowest request)."""
    return kept * (1 - TAIL_Q) >= MIN_TAIL / 5


def counterfactual(coded: Sequence[Coded], cands: list[Candidate], values: F64, spike: I64, base: I64,
                   base_q: BaselineTail, weights: F64 | None = None, rest: Rest | None = None,
                   known: SpikeWithout | None = None) -> None:
    """Fill p99 without / explained for each candidate, removing it from spike and baseline alike
    (weighted quantiles when `weights` are given; `rest`: the baseline's other requests, as in `contrast`;
    weighted, the baseline's quantiles are then `base_q`'s, which must weigh them). `known`: the spike's figures
    without the candidates a remote engine computed (their codes are not read here)."""
    known = known or {}
    if isinstance(base_q, AsksAtOnce):
        base_q.ask(coded, cands)
    if weights is not None:
        _weighted_counterfactual(coded, cands, values, spike, base, weights, base_q if rest is not None else None,
                                 known)
        return
    # quantiles of fresh copies by a partition (quantiles_unsorted: the sorted computation's very figures)
    spike_values = values[spike]
    spike_p99 = quantiles_unsorted(spike_values.copy(), (TAIL_Q,))[0]
    base_p99 = base_q.quantile()
    excess = spike_p99 - base_p99
    # the spike rows' codes gathered once for every candidate's mask
    spike_coded = gathered(coded, spike, {i for n, c in enumerate(cands) if n not in known for i in c.dims})
    for n, cand in enumerate(cands):
        if n in known:
            kept, s_wo = known[n]
        else:
            keep = ~candidate_mask(spike_coded, cand, None)
            kept = float(keep.sum())
            s_wo = quantiles_unsorted(spike_values[keep], (TAIL_Q,))[0] if enough_for_tail(kept) else math.nan
        if not enough_for_tail(kept):
            continue
        b_wo = base_q.without_candidate(coded, cand)
        if math.isnan(b_wo):
            mask = ~candidate_mask(coded, cand, base)
            left = values[base][mask] if rest is None else np.concatenate([values[base][mask],
                                                                           rest.values_without(cand)])
            b_wo = quantiles_unsorted(left, (TAIL_Q,))[0] if left.size else math.nan
        cand.p99_without_ns = s_wo
        cand.baseline_p99_without_ns = b_wo
        if excess > 0 and math.isfinite(b_wo):
            cand.explained = 1.0 - (s_wo - b_wo) / excess


def weighted_q(values: F64, weights: F64 | None, rows: I64, q: float = TAIL_Q) -> float:
    """The (weighted) quantile q of the values of `rows`; nan when there are none."""
    if weights is None:
        return quantile_sorted(np.sort(values[rows]), q)
    order = np.argsort(values[rows], kind="stable")
    return weighted_quantile_sorted(values[rows][order], weights[rows][order], q)


def _weighted_counterfactual(coded: Sequence[Coded], cands: list[Candidate], values: F64, spike: I64, base: I64,
                             weights: F64, base_q: BaselineTail | None = None, known: SpikeWithout | None = None
                             ) -> None:
    """`counterfactual` weighted: the baseline's weighted p99s from its rows `base`, or from `base_q` when given
    (a remote engine's, over the baseline it holds as counts too); `known` as `counterfactual`'s."""
    excess = weighted_q(values, weights, spike) - (base_q.quantile() if base_q is not None
                                                   else weighted_q(values, weights, base))
    known = known or {}
    for n, cand in enumerate(cands):
        if n in known:
            kept, s_wo = known[n]
        else:
            keep = ~candidate_mask(coded, cand, spike)
            kept = effective_count(weights[spike][keep])
            s_wo = weighted_q(values, weights, spike[keep]) if enough_for_tail(kept) else math.nan
        if not enough_for_tail(kept):
            continue
        if base_q is not None:
            b_wo = base_q.without_candidate(coded, cand)
        else:
            rest = base[~candidate_mask(coded, cand, base)]
            b_wo = weighted_q(values, weights, rest) if rest.size else math.nan
        cand.p99_without_ns = s_wo
        cand.baseline_p99_without_ns = b_wo
        if excess > 0 and math.isfinite(b_wo):
            cand.explained = 1.0 - (s_wo - b_wo) / excess


def rank(cands: list[Candidate]) -> list[Candidate]:
    """Best explanation first: explained (to 0.01; a pair needs PAIR_MARGIN more than a single to pass it),
    then single before pair, then score."""
    def key(c: Candidate) -> tuple[float, int, float]:
        e = c.explained if math.isfinite(c.explained) else -math.inf
        return (-(round(e, 2) - PAIR_MARGIN * (len(c.dims) - 1)), len(c.dims), -c.score)
    return sorted(cands, key=key)


def candidate_json(coded: Sequence[Coded], c: Candidate) -> dict[str, Any]:
    """The report's form of a candidate (lo / hi integers for a bucket, null otherwise)."""
    names = [coded[i].name for i in c.dims]
    values = [coded[i].labels[code] for i, code in zip(c.dims, c.codes, strict=True)]
    los = [coded[i].lo[code] for i, code in zip(c.dims, c.codes, strict=True)]
    his = [coded[i].hi[code] for i, code in zip(c.dims, c.codes, strict=True)]
    bucketed = [j for j, a in enumerate(los) if a is not None]
    lo = los[bucketed[0]] if len(bucketed) == 1 else None
    hi = his[bucketed[0]] if len(bucketed) == 1 else None
    attrs = [coded[i].attribute for i in c.dims]
    sources = [coded[i].source for i in c.dims]
    return {
        "dimension": "&".join(names), "value": "&".join(values), "lo": lo, "hi": hi,
        "attribute": "&".join(a or n for a, n in zip(attrs, names, strict=True)) if any(attrs) else None,
        "source": "&".join(sources),
        "score": round(c.score, 4),
        "p99_without_ms": ms(c.p99_without_ns), "explained": _round(c.explained, 4),
        "support": c.tail_count, "tail_share": round(c.tail_share, 4), "baseline_share": round(c.base_share, 4),
        "baseline_p99_without_ms": ms(c.baseline_p99_without_ns), "p_value": float(f"{c.p_value:.3g}"),
        "conditions": [{"dimension": n, "value": v, "lo": a, "hi": b, "attribute": k, "source": src}
                       for n, v, a, b, k, src in zip(names, values, los, his, attrs, sources, strict=True)],
    }


def _round(x: float, digits: int) -> float | None:
    return round(x, digits) if math.isfinite(x) else None



# --- stage shares ------------------------------------------------------------------------

_SUB_PREFIX = "_tailscope_sel_"
_VIEW_NAMES = ("spans", *VIEW_SQL)


def _sub_sql(sql: str) -> str:
    pattern = r"\b(" + "|".join(re.escape(n) for n in sorted(_VIEW_NAMES, key=len, reverse=True)) + r")\b"
    return re.sub(pattern, lambda m: _SUB_PREFIX + m.group(1), sql)


_STAGE_INPUTS = frozenset({"TraceId", "SpanId", "ParentSpanId", "TimestampNs", "Duration", "Stage", "IsRequest",
                           "Replica"})


def stage_rows(con: duckdb.DuckDBPyConnection, trace_ids: Sequence[str], since_ns: int | None = None,
               until_ns: int | None = None) -> pl.DataFrame:
    """The `requests` view's stage columns (trace_id, span_id, <stage>_ns) for a few traces only, exact and fast.

    The view's own SQL runs over a temp copy of just these traces' spans. `since_ns` / `until_ns`
    bound the span start times read (the caller passes bounds that hold every span overlapping
    the requests), so only the segments of that time range are read. On a connection from
    `analysis.engine.connect`, requests of materialized hours are read from their files and only the
    other hours' spans are scanned (a store materialized throughout reads no span at all), or their rows where
    the reader keeps them (connect.live_requests_from).
    """
    params = {"ids": list(trace_ids), "lo": since_ns, "hi": until_ns}
    cols = ", ".join(f"{c}_ns" for c in S.CRITICAL_PATH_COLUMNS)
    split = bool(con.execute("SELECT count(*) FROM duckdb_views() WHERE view_name = '_spans_live'").fetchall()[0][0])
    wanted = ("trace_id IN (SELECT unnest($ids)) AND ($lo IS NULL OR start_ns >= $lo) "
              "AND ($hi IS NULL OR start_ns < $hi)")
    stored = f"SELECT trace_id, span_id, {cols} FROM _requests_stored WHERE {wanted}"
    if split and not con.execute("SELECT count(*) FROM _spans_live").fetchall()[0][0]:
        return con.sql(stored, params=params).pl()  # every hour materialized
    if split and con.execute("SELECT count(*) FROM duckdb_views() WHERE view_name = ?",
                             [LIVE_REQUESTS_KEPT]).fetchall()[0][0]:  # the stale hours' rows a reader keeps
        return con.sql(f"SELECT trace_id, span_id, {cols} FROM {LIVE_REQUESTS_KEPT} WHERE {wanted} UNION ALL {stored}",
                       params=params).pl()
    needed = [c for c, _, _ in S.SPAN_COLUMNS if c in _STAGE_INPUTS]
    con.execute(
        f"CREATE OR REPLACE TEMP TABLE {_SUB_PREFIX}data AS SELECT {', '.join(needed)}, EndNs "
        f"FROM {'_spans_live' if split else 'spans'} "
        "WHERE TraceId IN (SELECT unnest($ids)) AND ($lo IS NULL OR TimestampNs >= $lo) "
        "AND ($hi IS NULL OR TimestampNs < $hi)", params).fetchall()
    # the columns the critical path does not read are typed NULLs: decoding them for every stored
    # span would cost more than the whole analysis
    typed = ", ".join(c if c in _STAGE_INPUTS else f"NULL::{duck_type(typ)} AS {c}" for c, typ, _ in S.SPAN_COLUMNS)
    con.execute(f"CREATE OR REPLACE TEMP VIEW {_SUB_PREFIX}spans AS SELECT {typed}, EndNs FROM {_SUB_PREFIX}data"
                ).fetchall()
    live = M.requests_sql(f"{_SUB_PREFIX}spans", request_where=f"{LIVE_HOUR_MACRO}(TimestampNs)") if split \
        else _sub_sql(VIEW_SQL["requests"])
    con.execute(f"CREATE OR REPLACE TEMP VIEW {_SUB_PREFIX}requests AS {live}").fetchall()
    sql = f"SELECT trace_id, span_id, {cols} FROM {_SUB_PREFIX}requests"
    if not split:
        return con.sql(sql).pl()
    return con.sql(f"{sql} UNION ALL {stored}", params=params).pl()


def _mean(frame: pl.DataFrame, col: str) -> float:
    """Mean of a column, weighted by the frame's `weight` column when it has one (0 when empty)."""
    if not frame.height:
        return 0.0
    if "weight" not in frame.columns:
        return float(frame.get_column(col).mean() or 0.0)  # type: ignore[arg-type]
    x = frame.get_column(col).cast(pl.Float64).to_numpy()
    w = frame.get_column("weight").to_numpy()
    ok = ~np.isnan(x)
    return float((x[ok] * w[ok]).sum() / w[ok].sum()) if ok.any() else 0.0


def stage_shares(tail: pl.DataFrame, base: pl.DataFrame, stages: Sequence[str]) -> list[dict[str, Any]]:
    """Each stage's mean critical-path time (ms) in both slices and its share of the positive growth.

    A `weight` column (adjusted counts) makes the means weighted."""
    return shares_of_means({s: _mean(tail, f"{s}_ns") for s in stages}, {s: _mean(base, f"{s}_ns") for s in stages},
                           stages)


def shares_of_means(tail: Mapping[str, float], base: Mapping[str, float], stages: Sequence[str]
                    ) -> list[dict[str, Any]]:
    """`stage_shares` from each stage's mean critical-path time (ns) in both slices (a remote engine computes the
    means; a stage missing from a mapping counts 0)."""
    rows: list[dict[str, Any]] = []
    for stage in stages:
        t = float(tail.get(stage, 0.0))
        b = float(base.get(stage, 0.0))
        if t == 0 and b == 0:
            continue
        rows.append({"stage": stage, "tail_ms": t / 1e6, "baseline_ms": b / 1e6, "growth": t - b})
    positive = sum(r["growth"] for r in rows if r["growth"] > 0)
    out = []
    for r in rows:
        share = r["growth"] / positive if positive > 0 else 0.0
        out.append({"stage": r["stage"], "share": round(share, 4), "tail_ms": round(r["tail_ms"], 3),
                    "baseline_ms": round(r["baseline_ms"], 3)})
    out.sort(key=lambda r: (-r["share"], r["stage"]))
    return out


def tail_share(q: float = TAIL_Q) -> Fraction:
    """1 - q exactly, q read as the decimal it is written as (0.99: 1/100). In floating point 1 - 0.99 is a hair
    above 0.01, which made the tail of 1,000 rows 11 long and a weight's cut a hair high."""
    return 1 - Fraction(repr(q))


def min_tail_requests() -> int:
    """The fewest requests `enough_for_tail` accepts (100), for a page to say so."""
    return math.ceil(Fraction(MIN_TAIL, 5) / tail_share())


def tail_size(n: int, q: float = TAIL_Q) -> int:
    """How many of n unweighted rows `tail_slice` keeps, ceil(n (1 - q)) in integers (a remote engine asks for
    that many)."""
    share = tail_share(q)
    return min(n, max(MIN_TAIL_SLICE, -(-n * share.numerator // share.denominator)))


def tail_weight(total: float, q: float = TAIL_Q) -> float:
    """(1 - q) of a weight `total`, as `tail_slice` cuts it: total * numerator / denominator of `tail_share`
    (rounded once when the numerator is 1); analysis.clickhouse.report.tail_sql writes the same operations."""
    share = tail_share(q)
    return total * share.numerator / share.denominator


def tail_slice(values: F64, rows: I64, q: float = TAIL_Q, weights: F64 | None = None) -> I64:
    """Rows of the slowest (1 - q) share of `rows` (at least MIN_TAIL_SLICE of them, if there are); with
    `weights`, the slowest rows holding (1 - q) of the weight. Values tied at the cut are taken in the order of
    `rows` (the earliest first, `rows` being in start order), so an engine can choose the same rows by sorting
    on (value descending, start)."""
    if rows.size == 0:
        return rows
    if weights is not None:
        order = rows[np.argsort(-values[rows], kind="stable")]
        cum = np.cumsum(weights[order])
        k = int(np.searchsorted(cum, tail_weight(float(cum[-1]), q), side="left")) + 1
        return order[:min(rows.size, max(MIN_TAIL_SLICE, k))]
    k = tail_size(rows.size, q)
    if k == rows.size:
        return rows
    v = values[rows]
    cut = v[np.argpartition(v, rows.size - k)[rows.size - k]]  # the k-th largest value
    keep = v > cut
    keep[np.flatnonzero(v == cut)[:k - int(keep.sum())]] = True
    return rows[keep]


def exemplar_pool(values: F64, spike: I64, threshold: float) -> I64:
    """The rows `exemplar_rows` chooses from: the spike's at or above `threshold`, else its tail slice."""
    rows = spike[values[spike] >= threshold]
    return rows if rows.size else tail_slice(values, spike)


def exemplar_rows(values: F64, spike: I64, threshold: float, prefer: Mask | None, k: int = MAX_EXEMPLARS) -> I64:
    """Rows of tail requests nearest the spike p99 from above, those matching the best candidate first (`prefer`,
    over `spike`: only its rows in `exemplar_pool` are read)."""
    rows = exemplar_pool(values, spike, threshold)
    pref = np.zeros(rows.size, dtype=bool) if prefer is None else prefer[np.searchsorted(spike, rows)]
    order = np.lexsort((values[rows], ~pref))
    return rows[order[:k]]

