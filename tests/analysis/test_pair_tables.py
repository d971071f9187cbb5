"""The attributes' pairs with the built-ins counted once per attribute (`explain.PairTables`, the C kernel
`count_cells` behind `LazyCoded.count_keyed`) against plain polars group-by counts per pair, on random inputs with
missing values, weighted and not, with the baseline most of the rows (every row counted) and a few of them
(gathered), and with the built-ins split into several groups."""

from __future__ import annotations

import math
from itertools import combinations
from typing import Any

import numpy as np
import polars as pl
import pytest

from analysis.stats import attributes as A
from analysis.stats import explain as X
from analysis.stats.attributes import LazyCoded
from analysis.stats.explain import Coded

NB = 4  # built-ins


def _lazy(name: str, codes: np.ndarray, labels: int, rng: np.random.Generator) -> LazyCoded:
    """`codes` (-1 missing) as an attribute file's runs: two runs of int16 file codes through a shuffled table,
    the rows between them and after the last in no run (missing there)."""
    n = codes.size
    cuts = sorted(rng.choice(np.arange(1, n), 3, replace=False).tolist())
    runs: list[A.Run] = []
    for a, b in ((0, cuts[0]), (cuts[1], cuts[2])):  # rows cuts[0]..cuts[1] and cuts[2].. in no run
        order = rng.permutation(labels + 1)  # file code -> label code, the last file code missing
        lut = np.append(np.arange(labels), -1)[order].astype(np.int64)
        back = np.argsort(order)  # label code (missing: labels) -> file code
        part = back[np.where(codes[a:b] < 0, labels, codes[a:b])].astype(np.int16)
        runs.append((a, b, part, lut))
    codes[cuts[0]:cuts[1]] = -1
    codes[cuts[2]:] = -1
    return LazyCoded.of(name, [str(v) for v in range(labels)], [None] * labels, [None] * labels, n, runs)


def _inputs(seed: int, n: int = 2400, most: bool = True, weighted: bool = False
            ) -> tuple[list[Coded], list[np.ndarray], np.ndarray, np.ndarray, np.ndarray | None]:
    """Four built-ins of 1-6 values and five attributes of 1-60 values (stored as runs or plain codes), about a
    fifth missing: (the dimensions, their plain codes, a tail of 150 rows, the baseline of the others or a sixth
    of them with `most=False`, weights)."""
    rng = np.random.default_rng(seed)
    sizes = [int(rng.integers(1, 7)) for _ in range(NB)] + [int(rng.choice([1, 2, 7, 25, 60])) for _ in range(5)]
    codes = [np.where(rng.random(n) < 0.2, -1, rng.integers(0, k, n)).astype(np.int64) for k in sizes]
    order = rng.permutation(n)
    tail = np.sort(order[:150])
    base = np.sort(order[150:] if most else order[150:150 + n // 6])
    codes[0][tail[:70]], codes[NB][tail[:70]] = 0, 0  # a planted pair
    coded: list[Coded] = []
    for i, (c, k) in enumerate(zip(codes, sizes, strict=True)):
        if i >= NB and i % 2:
            coded.append(_lazy(f"d{i}", c, k, rng))
            coded[-1].source = "request"
        else:
            coded.append(Coded(f"d{i}", c, [str(v) for v in range(k)], [None] * k, [None] * k,
                               source="builtin" if i < NB else "request"))
    weights = rng.choice([1.0, 4.0, 10 / 3, 0.7], n) if weighted else None
    return coded, codes, tail, base, weights


def _plain(codes: list[np.ndarray], rows: np.ndarray, weights: np.ndarray | None, combo: tuple[int, ...]
           ) -> dict[tuple[int | None, ...], tuple[int, float]]:
    """Rows (and summed weights) of `rows` per combination of values of `combo`'s dimensions, missing as None:
    a polars group-by of the plain codes."""
    cols: dict[str, Any] = {f"c{d}": [None if v < 0 else int(v) for v in codes[i][rows].tolist()]
                            for d, i in enumerate(combo)}
    cols["w"] = (weights[rows] if weights is not None else np.ones(rows.size)).tolist()
    frame = pl.DataFrame(cols, schema={**{f"c{d}": pl.Int64 for d in range(len(combo))}, "w": pl.Float64})
    got = frame.group_by([f"c{d}" for d in range(len(combo))]).agg(pl.len().alias("n"), pl.col("w").sum())
    return {tuple(r[:len(combo)]): (int(r[-2]), float(r[-1])) for r in got.iter_rows()}


def _cell(value: tuple[int | None, ...], sizes: list[int]) -> int:
    """The cell of a combination of values in `X._local_cells`' order (missing in each dimension's last slot)."""
    cell = 0
    for v, k in zip(value, sizes, strict=True):
        cell = cell * k + (k - 1 if v is None else v)
    return cell


def _tables(coded: list[Coded], base: np.ndarray, weights: np.ndarray | None, cells: int) -> X.PairTables:
    slots = [len(c.labels) + 1 for c in coded]
    outside = None
    if 2 * base.size > coded[0].codes.size:
        outside = np.setdiff1d(np.arange(coded[0].codes.size), base)

    def codes_b(i: int) -> np.ndarray:
        return X._missing_last(coded[i].at(base), slots[i])

    return X.PairTables(coded, NB, slots, base, outside, codes_b, weights, cells)


@pytest.mark.parametrize("kernel", [True, False])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("most", [True, False])
@pytest.mark.parametrize("seed", range(1, 6))
def test_pair_tables_equal_a_plain_group_by(seed: int, most: bool, weighted: bool, kernel: bool,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    if not kernel:
        monkeypatch.setattr(A, "load_kernel", lambda: None)
    coded, plain_codes, _, base, weights = _inputs(seed, most=most, weighted=weighted)
    slots = [len(c.labels) + 1 for c in coded]
    plain = {(j, i): _plain(plain_codes, base, weights, (j, i) if j >= 0 else (i,))
             for i in range(NB, len(coded)) for j in range(-1, NB)}
    covered, split = 0, 0
    for cells in (30, 400, 10**6):  # several groups of built-ins (or none fits: pair by pair), then one
        tables = _tables(coded, base, weights, cells)
        for i in range(NB, len(coded)):
            if not tables.covers(i):
                assert any(slots[i] * (slots[j] + 1) > cells for j in range(NB)) and cells < 10**6
                continue
            covered += 1
            groups = tables._groups(slots[i])
            assert groups is not None and sum(groups, ()) == tuple(range(NB))
            assert len(groups) == 1 or cells < 10**6
            split += len(groups) > 1
            want = np.zeros(slots[i], dtype=np.int64)
            for value, (n, _) in plain[(-1, i)].items():
                want[_cell(value, [slots[i]])] = n
            assert tables.single(i).tolist() == want.tolist()
            for j in range(NB):
                sizes = [slots[j], slots[i]]
                counts, sums = tables.pair(j, i)
                want_n = np.zeros(math.prod(sizes), dtype=np.int64)
                want_w = np.zeros(math.prod(sizes))
                for value, (n, w) in plain[(j, i)].items():
                    want_n[_cell(value, sizes)] = n
                    want_w[_cell(value, sizes)] = w
                assert counts.tolist() == want_n.tolist(), (cells, j, i)
                if weighted:
                    assert sums is not None and sums == pytest.approx(want_w, rel=1e-12, abs=1e-9)
                else:
                    assert sums is None
    assert covered > len(coded) - NB and split >= 1


@pytest.mark.parametrize("seed", range(1, 6))
def test_the_kernels_count_is_numpys(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """`count_cells` through an attribute file's runs gives np.bincount's counts, and its weighted sums bit for bit
    (the same rows in the same order); a code past its table falls back to numpy's reading of it."""
    coded, plain_codes, _, _, weights = _inputs(seed, weighted=True)
    assert weights is not None
    lazy = [c for c in coded if isinstance(c, LazyCoded)]
    assert lazy
    rng = np.random.default_rng(seed)
    for i, c in enumerate(coded):
        if not isinstance(c, LazyCoded):
            continue
        width = int(rng.integers(1, 40))
        plus = rng.integers(0, width, c.n_rows).astype(np.int64)
        cells = (len(c.labels) + 1) * width
        got = c.count_keyed(width, plus, cells, weights)
        key = np.where(plain_codes[i] < 0, len(c.labels), plain_codes[i]) * width + plus
        assert got[0].tolist() == np.bincount(key, minlength=cells).tolist()
        assert got[1] is not None and got[1].tobytes() == np.bincount(key, weights=weights, minlength=cells).tobytes()
    broken = LazyCoded.of("x", ["a"], [None], [None], 4, [(0, 4, np.array([0, 1, 5, 1], dtype=np.int16),
                                                            np.array([0, -1], dtype=np.int64))])
    plus = np.zeros(4, dtype=np.int64)
    assert broken.count_keyed(1, plus, 2)[0].tolist() == [1, 3]  # numpy's "clip": code 5 reads the table's last
    monkeypatch.setattr(A, "load_kernel", lambda: None)
    assert broken.count_keyed(1, plus, 2)[0].tolist() == [1, 3]


Cells = dict[tuple[tuple[int, ...], tuple[int, ...]], tuple[int, int, float, float]]


def _family(coded: list[Coded], codes: list[np.ndarray], tail: np.ndarray, base: np.ndarray,
            weights: np.ndarray | None) -> tuple[int, Cells]:
    """The family a plain reading counts (every value, and every pair with a built-in, held by a tail or baseline
    row, missing left out) and the cells the guard lets through: at least the least support, a larger share of the
    tail than of the baseline, not the very rows of one of its parts; each with (tail, baseline) counts and
    shares (weighted when given)."""
    n_t = tail.size
    w_all = weights if weights is not None else np.ones(coded[0].codes.size)
    sum_t, sum_b = float(w_all[tail].sum()), float(w_all[base].sum())
    combos: list[tuple[int, ...]] = [(i,) for i in range(len(coded)) if coded[i].labels]
    combos += [c for c in combinations(range(len(coded)), 2) if c[0] < NB and all(coded[i].labels for i in c)]
    family = 0
    seen: dict[tuple[tuple[int, ...], tuple[int, ...]], tuple[int, int]] = {}
    out: Cells = {}
    least = X.least_support(n_t, weights is not None)
    for combo in combos:
        t = _plain(codes, tail, weights, combo)
        b = _plain(codes, base, weights, combo)
        held = {v for v in set(t) | set(b) if None not in v}
        family += len(held)
        for v in sorted(held, key=lambda x: tuple(-1 if y is None else y for y in x)):
            cell = tuple(int(x) for x in v if x is not None)
            (tn, tw), (bn, bw) = t.get(v, (0, 0.0)), b.get(v, (0, 0.0))
            seen[(combo, cell)] = (tn, bn)
            if len(combo) == 2 and any(seen.get(((combo[k],), (cell[k],))) == (tn, bn) for k in range(2)):
                continue
            share_t, share_b = (tn / n_t, bn / base.size) if weights is None else (tw / sum_t, bw / sum_b)
            if tn >= least and share_t >= X.MIN_SHARE and share_t > share_b:
                out[(combo, cell)] = (tn, bn, share_t, share_b)
    return family, out


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("seed", range(1, 6))
def test_the_contrast_with_pair_tables_equals_a_plain_family(seed: int, weighted: bool,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """contrast_raw (attributes' pairs by PairTables, the built-ins split into groups at this size) finds exactly
    the cells a plain count lets through, with their counts and shares, and tests the plain family."""
    monkeypatch.setattr(X, "PAIR_TABLE_CELLS", 1)  # a quarter of the rows: the larger attributes take groups
    for most in (True, False):
        coded, codes, tail, base, weights = _inputs(seed, most=most, weighted=weighted)
        found, tested = X.contrast_raw(coded, tail, base, weights=weights, pairs_with=NB)
        family, want = _family(coded, codes, tail, base, weights)
        assert tested == family
        got = {(c.dims, c.codes): (c.tail_count, c.base_count, c.tail_share, c.base_share) for c in found}
        assert got.keys() == want.keys() and any(c.dims == (0, NB) and c.codes == (0, 0) for c in found)
        for key, (tn, bn, st, sb) in want.items():
            assert got[key][:2] == (tn, bn)
            assert got[key][2:] == pytest.approx((st, sb), rel=1e-12)
