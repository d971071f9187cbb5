"""Spike detection on hand-made windows: a tail-only rise is found and merged, anything else is not."""

from __future__ import annotations

import math

import numpy as np
import pytest

from analysis.stats.spikes import (
    ALPHA,
    SCAN_DRAWS,
    SCORE_BLOCK_SPREAD,
    SortedValues,
    _block_sums,
    block_firsts,
    block_scores,
    detect,
    exceedances_of,
    quantile_sorted,
    scan_null_max,
    scan_p_value,
    scan_ratio,
    size_ratio,
    summed_by_block,
    tail_scores,
    tied_scores,
    verified_blocks,
)

SEC = 1_000_000_000
WINDOW = 60 * SEC
PER_WINDOW = 1000


def _base() -> np.ndarray:
    """The same 1,000 values in every window: 1.0 s .. ~3.7 s, a long-ish right tail."""
    return np.exp(np.linspace(0.0, 1.3, PER_WINDOW)) * 1e9


def _series(windows: int, change: dict[int, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    starts, values = [], []
    for w in range(windows):
        v = change.get(w, _base())
        starts.append(w * WINDOW + np.arange(v.size, dtype=np.int64) * (WINDOW // v.size))
        values.append(v)
    return np.concatenate(starts), np.concatenate(values)


def _tail_times(factor: float, share: float = 0.03) -> np.ndarray:
    v = _base().copy()
    k = int(share * v.size)
    v[-k:] *= factor  # only the slowest 3 % get slower: p50 does not move
    return v


def test_quantile_convention() -> None:
    v = np.array([10.0, 20.0, 30.0, 40.0, 50.0])
    assert quantile_sorted(v, 0.5) == 30.0
    assert quantile_sorted(v, 0.9) == 46.0
    assert quantile_sorted(v, 0.99) == pytest.approx(49.6)
    assert np.isnan(quantile_sorted(np.array([]), 0.5))


def _ratio_reference(k: int, n: int, total_k: int, total_n: int) -> float:
    """Kulldorff's Poisson scan ratio written out plainly, one stretch at a time."""
    e = total_k * n / total_n
    if not 0 < e < total_k or k <= e:
        return 0.0
    inside = k * math.log(k / e)
    outside = (total_k - k) * math.log((total_k - k) / (total_k - e)) if k < total_k else 0.0
    return inside + outside


def _scores_reference(values: list[float]) -> dict[float, float]:
    """Savage score of each distinct value: the mean, over its tied ranks i (1 = smallest of K), of the expected
    i-th smallest of K standard exponentials, sum over j = K - i + 1 .. K of 1 / j."""
    ordered = sorted(values)
    big_k = len(ordered)
    ranks: dict[float, list[int]] = {}
    for i, v in enumerate(ordered, start=1):
        ranks.setdefault(v, []).append(i)
    return {v: sum(sum(1 / j for j in range(big_k - i + 1, big_k + 1)) for i in rs) / len(rs)
            for v, rs in ranks.items()}


def _size_reference(k: int, s: float, total_k: int) -> float:
    """The exponential-scores likelihood ratio written out: log L(mean s/k inside, (K-s)/(K-k) outside) - log L(1)."""
    if k == 0 or k == total_k or s / k <= 1:
        return 0.0
    m_in, m_out = s / k, (total_k - s) / (total_k - k)
    return (-k * math.log(m_in) - k) - ((total_k - k) * math.log(m_out) + (total_k - k)) + total_k


def _stretch_reference(k: int, n: int, s: float, total_k: int, total_n: int) -> float:
    return _ratio_reference(k, n, total_k, total_n) + _size_reference(k, s, total_k)


def test_tail_scores_and_size_ratio_match_the_plain_formulas() -> None:
    rng = np.random.default_rng(4)
    for _ in range(200):
        big_k = int(rng.integers(1, 60))
        v = np.sort(rng.integers(0, int(rng.integers(1, 80)), big_k).astype(np.float64))  # ties when few distinct
        ref = _scores_reference(v.tolist())
        got = tail_scores(v)
        assert got == pytest.approx([ref[x] for x in v.tolist()], rel=1e-12)
        assert float(got.sum()) == pytest.approx(big_k)  # mean 1, ties or not
        members = rng.random(big_k) < 0.3
        k, s = int(members.sum()), float(got[members].sum())
        assert float(size_ratio(k, s, big_k)) == pytest.approx(_size_reference(k, s, big_k), rel=1e-9, abs=1e-9)
    assert tail_scores(np.array([])).size == 0
    assert float(size_ratio(3, 3.0, 10)) == 0.0  # as large as the rest on average: no evidence
    assert float(size_ratio(10, 10.0, 10)) == 0.0  # every exceedance inside: nothing to compare with


def test_scan_ratio_matches_the_plain_formula() -> None:
    rng = np.random.default_rng(5)
    for _ in range(300):
        total_n = int(rng.integers(1000, 100_000))
        total_k = int(rng.integers(1, total_n // 20))
        n = int(rng.integers(1, total_n))
        k = int(rng.integers(0, min(n, total_k) + 1))
        got = float(scan_ratio(k, n, total_k, total_n))
        assert got == pytest.approx(_ratio_reference(k, n, total_k, total_n), rel=1e-9, abs=1e-9)
    assert float(scan_ratio(6, 600, 60, 6000)) == 0.0  # as many as expected: no evidence
    assert float(scan_ratio(5, 600, 60, 6000)) == 0.0  # fewer: not a rise


def test_scan_null_matches_plain_draws() -> None:
    """The multivariate-hypergeometric shortcut against drawing which values lie above the threshold plainly."""
    rng = np.random.default_rng(8)
    n = np.array([500, 700, 520, 900, 610, 505, 800, 640])
    total_k, max_len = int(0.01 * n.sum()), 4
    fast = scan_null_max(n, total_k, max_len, 4000, np.random.default_rng(1))
    labels = np.repeat(np.arange(n.size), n)
    plain = np.empty(4000)
    for d in range(plain.size):
        above = np.bincount(labels[rng.choice(labels.size, total_k, replace=False)], minlength=n.size)
        plain[d] = max(_ratio_reference(int(above[a:a + length].sum()), int(n[a:a + length].sum()), total_k,
                                        int(n.sum()))
                       for length in range(1, max_len + 1) for a in range(n.size - length + 1))
    for q in (0.5, 0.9, 0.99):
        assert np.quantile(fast, q) == pytest.approx(np.quantile(plain, q), rel=0.08)
    assert scan_p_value(float(np.quantile(fast, 0.995)), fast) == pytest.approx(0.005, abs=0.002)
    # with the tail scores: which window each value above the threshold lands in, drawn plainly by rank
    scores = tail_scores(np.arange(total_k, dtype=np.float64))
    fast = scan_null_max(n, total_k, max_len, 4000, np.random.default_rng(2), scores)
    plain = np.empty(2000)
    for d in range(plain.size):
        where = labels[rng.choice(labels.size, total_k, replace=False)]  # the i-th drawn holds the i-th score
        k = np.bincount(where, minlength=n.size)
        s = np.bincount(where, weights=scores, minlength=n.size)
        plain[d] = max(_stretch_reference(int(k[a:a + length].sum()), int(n[a:a + length].sum()),
                                          float(s[a:a + length].sum()), total_k, int(n.sum()))
                       for length in range(1, max_len + 1) for a in range(n.size - length + 1))
    for q in (0.5, 0.9, 0.99):  # the plain draws beyond each fast quantile: 1 - q of them, within 4.5 sd of both
        share = float(np.mean(plain >= np.quantile(fast, q)))
        assert share == pytest.approx(1 - q, abs=4.5 * math.sqrt(q * (1 - q) * (1 / plain.size + 1 / fast.size)))
    assert scan_p_value(0.0, fast) == 1.0 and scan_p_value(1e9, fast) == 1 / (fast.size + 1)
    assert round(ALPHA * (SCAN_DRAWS + 1), 9).is_integer()  # so P(p <= ALPHA) <= ALPHA holds exactly


def test_clean_series_has_no_spike() -> None:
    starts, values = _series(10, {})
    det = detect(starts, values, WINDOW)
    assert det.spikes == [] and det.note == ""
    assert det.judged.all() and det.baseline.all()
    assert det.baseline_p50_ns == quantile_sorted(_base(), 0.5)


def test_tail_spike_is_found_and_adjacent_windows_merge() -> None:
    starts, values = _series(10, {4: _tail_times(3.0), 5: _tail_times(3.0), 6: _tail_times(3.0)})
    det = detect(starts, values, WINDOW)
    assert len(det.spikes) == 1
    spike = det.spikes[0]
    assert (spike.start_ns, spike.end_ns, spike.requests, spike.windows) == (4 * WINDOW, 7 * WINDOW, 3000, 3)
    assert spike.p50_ns == quantile_sorted(_base(), 0.5) == spike.baseline_p50_ns
    assert spike.baseline_p99_ns == quantile_sorted(np.sort(np.tile(_base(), 7)), 0.99)  # 7 baseline windows
    pooled = np.sort(np.concatenate([_tail_times(3.0)] * 3))
    assert spike.p99_ns == quantile_sorted(pooled, 0.99)
    assert spike.p_value == 1 / (SCAN_DRAWS + 1)  # above every simulated maximum
    assert det.baseline.tolist() == [True] * 4 + [False] * 3 + [True] * 3


def test_one_quieter_window_between_two_spike_windows_is_bridged() -> None:
    # window 5 rose a little (above the baseline, below the spike threshold): 3..6 is one spike
    starts, values = _series(10, {3: _tail_times(3.0), 4: _tail_times(3.0), 5: _tail_times(1.05),
                                  6: _tail_times(3.0)})
    spikes = detect(starts, values, WINDOW).spikes
    assert [(s.start_ns // WINDOW, s.end_ns // WINDOW) for s in spikes] == [(3, 7)]
    # a flat window in between keeps two spikes apart
    starts, values = _series(12, {2: _tail_times(3.0), 3: _base(), 4: _tail_times(2.0)})
    spikes = detect(starts, values, WINDOW).spikes
    assert sorted((s.start_ns // WINDOW, s.end_ns // WINDOW) for s in spikes) == [(2, 3), (4, 5)]
    assert spikes[0].start_ns == 2 * WINDOW  # the larger excess comes first


def test_a_whole_distribution_shift_is_not_a_tail_spike() -> None:
    starts, values = _series(10, {5: _base() * 1.5})  # p50 moves 50 %: a slowdown, not a tail spike
    assert detect(starts, values, WINDOW).spikes == []


def test_small_rise_and_too_few_requests_are_not_spikes() -> None:
    starts, values = _series(10, {5: _tail_times(1.1)})  # +10 % at p99: under MIN_RISE
    assert detect(starts, values, WINDOW).spikes == []
    small = [np.sort(np.resize(_base(), 100))] * 10
    starts = np.concatenate([w * WINDOW + np.arange(100, dtype=np.int64) for w in range(10)])
    det = detect(starts, np.concatenate(small), WINDOW)
    assert det.spikes == [] and "too few windows" in det.note
    det = detect(np.array([], dtype=np.int64), np.array([]), WINDOW)
    assert det.note == "no requests"


def test_shoulders_leave_the_baseline_but_the_core_is_reported_when_it_suffices() -> None:
    # window 7 rose a little right after the spike (its ramp down): out of the baseline, not in the spike
    starts, values = _series(10, {5: _tail_times(3.0), 6: _tail_times(3.0), 7: _tail_times(1.08)})
    det = detect(starts, values, WINDOW)
    assert [(s.start_ns // WINDOW, s.end_ns // WINDOW) for s in det.spikes] == [(5, 7)]
    assert det.baseline.tolist() == [True] * 5 + [False] * 3 + [True] * 2
    assert det.baseline_p99_ns == quantile_sorted(np.sort(np.tile(_base(), 7)), 0.99)


def test_detection_scan_is_the_pooled_threshold_counts_and_the_best_stretch() -> None:
    """The scan fields recomputed plainly: threshold, counts above it, the best stretch's p-value."""
    rng = np.random.default_rng(11)
    sizes = [700, 520, 900, 610, 800, 505, 760, 640, 300, 880, 700, 590]  # window 8 is too small to judge
    starts = np.concatenate([w * WINDOW + np.arange(n, dtype=np.int64) for w, n in enumerate(sizes)])
    values = rng.lognormal(0.0, 1.0, starts.size) * 1e9
    slow = np.flatnonzero(starts // WINDOW == 4)[rng.random(800) < 0.04]
    values[slow] = 40e9  # a tail rise in window 4: 4 % of its requests take 40 s (p99 of the rest: ~10 s)
    det = detect(starts, values, WINDOW, seed=3)
    judged = [w for w, n in enumerate(sizes) if n >= 500]
    assert np.flatnonzero(det.judged).tolist() == judged
    pooled = np.sort(np.concatenate([values[starts // WINDOW == w] for w in judged]))
    assert det.threshold_ns == quantile_sorted(pooled, 0.99)
    counts = [int(np.sum(values[starts // WINDOW == w] > det.threshold_ns)) for w in range(len(sizes))]
    assert det.exceed.tolist() == counts
    k = np.array([counts[w] for w in judged])
    n = np.array([sizes[w] for w in judged])
    total_k, total_n, max_len = int(k.sum()), int(n.sum()), len(judged) // 2
    tail = np.concatenate([values[(starts // WINDOW == w) & (values > det.threshold_ns)] for w in judged])
    savage = _scores_reference(tail.tolist())
    ordered = sorted(tail.tolist())
    score_of = dict(zip(ordered, _blocks_reference([savage[x] for x in ordered], SCORE_BLOCK_SPREAD), strict=True))
    s = np.array([sum(score_of[x] for x in values[(starts // WINDOW == w) & (values > det.threshold_ns)].tolist())
                  for w in judged])
    best = max(_stretch_reference(int(k[a:a + length].sum()), int(n[a:a + length].sum()),
                                  float(s[a:a + length].sum()), total_k, total_n)
               for length in range(1, max_len + 1) for a in range(len(judged) - length + 1))
    null = scan_null_max(n, total_k, max_len, SCAN_DRAWS, np.random.default_rng(3),
                         block_scores(tail_scores(np.sort(tail))))
    assert det.scan_p_value == scan_p_value(best, null)
    w4 = judged.index(4)
    assert det.p_value[4] == scan_p_value(_stretch_reference(counts[4], sizes[4], float(s[w4]), total_k, total_n),
                                          null)
    assert det.p_value[8] == 1.0  # not judged, not tested
    [spike] = det.spikes  # window 4, with window 3 if its p99 rose 20 % by chance (adjacent candidates merge)
    a, b = spike.start_ns // WINDOW, spike.end_ns // WINDOW
    assert a <= 4 < b and b - a == spike.windows
    run = [judged.index(w) for w in range(a, b)]
    run_k, run_n, run_s = sum(counts[a:b]), sum(sizes[a:b]), float(s[run].sum())
    assert spike.p_value == scan_p_value(_stretch_reference(run_k, run_n, run_s, total_k, total_n), null) <= ALPHA


@pytest.mark.parametrize("seed", [2, 3, 4])
def test_a_few_much_slower_requests_are_found_by_their_size_when_their_count_is_not_enough(seed: int) -> None:
    """7 of window 4's 750 requests take 20-40 s (the rest: log-normal, median 1 s, log-sd 0.5): the count above the
    pooled p99 alone is not significant on these seeds, the counts with the sizes of the values above it are."""
    rng = np.random.default_rng(seed)
    starts = np.concatenate([w * WINDOW + np.arange(750, dtype=np.int64) * (WINDOW // 750) for w in range(8)])
    values = rng.lognormal(0.0, 0.5, starts.size) * 1e9
    values[4 * 750 + rng.permutation(750)[:7]] = np.linspace(20, 40, 7) * 1e9
    det = detect(starts, values, WINDOW, seed=1)
    k, n = det.exceed, det.n
    count_only = scan_null_max(n, int(k.sum()), 4, SCAN_DRAWS, np.random.default_rng(1))
    assert scan_p_value(float(scan_ratio(k[4], n[4], int(k.sum()), int(n.sum()))), count_only) > ALPHA
    assert det.p_value[4] <= ALPHA
    assert [(s.start_ns // WINDOW, s.end_ns // WINDOW) for s in det.spikes] == [(4, 5)]


def _blocks_reference(scores: list[float], spread: float) -> list[float]:
    """Block scores written out: from the largest score down, a block takes every score within `spread` of its
    largest; each score is replaced by its block's mean."""
    out: list[float] = []
    rest = sorted(scores, reverse=True)
    while rest:
        block = [x for x in rest if x >= rest[0] - spread]
        rest = rest[len(block):]
        out = [sum(block) / len(block)] * len(block) + out
    return out


def test_block_scores_match_the_plain_rule() -> None:
    rng = np.random.default_rng(12)
    for _ in range(200):
        big_k = int(rng.integers(1, 400))
        v = np.sort(rng.integers(0, int(rng.integers(1, 600)), big_k).astype(np.float64))  # ties when few distinct
        scores = tail_scores(v)
        got = block_scores(scores)
        assert got == pytest.approx(_blocks_reference(scores.tolist(), SCORE_BLOCK_SPREAD), rel=1e-12)
        assert float(got.sum()) == pytest.approx(big_k)  # mean 1 still
        assert float(np.max(np.abs(got - scores))) <= SCORE_BLOCK_SPREAD
        ties = np.concatenate([[False], v[1:] == v[:-1]])
        assert np.array_equal(got[1:][ties[1:]], got[:-1][ties[1:]])  # tied values share a block
    top = block_scores(tail_scores(np.arange(1000, dtype=np.float64)))
    alone = math.ceil(1 / SCORE_BLOCK_SPREAD) - 1  # score gaps 1/rank above the spread: these largest stay alone
    assert np.unique(top[-alone:]).size == alone and top[-alone - 1] == top[-alone - 2]
    assert block_scores(np.array([])).size == 0


def _ranked_counts(at: np.ndarray, vals: np.ndarray, judged: np.ndarray
                   ) -> tuple[int, list[int], list[int], list[tuple[int, int, int]], list[list[float]]]:
    """Plainly, what a remote engine counts of the judged values: how many, each group of 2+ equal values (first rank:
    how many are smaller; size), each value's rank (how many are smaller) with its window, and per window its values
    ascending."""
    mine = [(float(v), int(a)) for a, v in zip(at.tolist(), vals.tolist(), strict=True) if judged[a]]
    ordered = sorted(v for v, _ in mine)
    firsts, sizes = [], []
    for v in sorted(set(ordered)):
        m = ordered.count(v)
        if m > 1:
            firsts.append(sum(1 for x in ordered if x < v))
            sizes.append(m)
    ranks = [(a, sum(1 for x in ordered if x < v), 1) for v, a in mine]
    per_window = [sorted(v for v, a in mine if a == w) for w in range(judged.size)]
    return len(ordered), firsts, sizes, ranks, per_window


def test_the_scan_reads_the_same_floats_from_ranks_and_ties_as_from_values() -> None:
    """`tied_scores` and `summed_by_block` (what a remote engine's counts give) against `exceedances_of` (the values in
    memory): the same scores and per-window sums, bit for bit, on values with many ties, some windows not judged;
    the sums also against a plain loop adding each window's scores in ascending order."""
    for seed in (1, 2, 3, 4, 5):
        rng = np.random.default_rng(seed)
        for _ in range(40):
            windows = int(rng.integers(1, 12))
            k = int(rng.integers(0, 300))
            at = rng.integers(0, windows, k).astype(np.int64)
            vals = rng.integers(1, int(rng.choice([3, 40, 5000])) + 1, k).astype(np.float64)
            judged = rng.random(windows) < 0.8
            want = exceedances_of(at, vals, judged)
            total_k, firsts, sizes, ranks, per_window = _ranked_counts(at, vals, judged)
            scores, starts = tied_scores(total_k, np.asarray(firsts, dtype=np.int64), np.asarray(sizes, dtype=np.int64))
            assert np.array_equal(scores, want.scores)
            assert np.array_equal(starts, block_firsts(tail_scores(np.sort(vals[judged[at]]))))
            block = np.asarray([int(np.searchsorted(starts, r, side="right")) - 1 for _, r, _ in ranks], dtype=np.int64)
            got = summed_by_block(np.asarray([a for a, _, _ in ranks], dtype=np.int64), block,
                                  np.ones(block.size, dtype=np.int64), scores, starts, windows)
            assert np.array_equal(got, want.score_sum)
            by_value = dict(zip(np.sort(vals[judged[at]]).tolist(), scores.tolist(), strict=True))
            plain = []
            for values in per_window:
                s = 0.0
                for v in values:
                    s += by_value[v]
                plain.append(s)
            assert got.tolist() == plain
            assert want.exceed.tolist() == [int((at == w).sum()) for w in range(windows)]


def _edge_groups(ordered: list[float], scores: list[float], spread: float
                 ) -> tuple[list[int], list[tuple[int, int]]]:
    """Plainly, the blocks' first ranks over the scores of the values `ordered` (from the largest score down, a block
    takes every score within `spread` of its largest) and the groups of equal values (first rank, size) holding a
    block's top, first rank or the rank before it."""
    firsts, hi = [], len(ordered)
    while hi > 0:
        top = scores[hi - 1]
        hi = min(i for i in range(hi) if scores[i] >= top - spread)
        firsts.append(hi)
    edges = {len(ordered) - 1} | {r for f in firsts for r in (f - 1, f) if r >= 0}
    groups = sorted({(ordered.index(ordered[r]), ordered.count(ordered[r])) for r in edges})
    return firsts[::-1], groups


def test_the_blocks_are_read_from_the_groups_at_their_edges_only() -> None:
    """`verified_blocks` (what a remote engine's blocks and the few groups at their edges give) against the values in
    memory (`block_scores` of `tail_scores`, bit for bit) and a plain greedy over those scores (the firsts exactly;
    the scores themselves against the plain formula),
    on values with heavy ties, seeds 1-5; a claim moved to a neighbouring value's first rank, or missing a group it
    reads, is refused; the blocks stay within H_K / SCORE_BLOCK_SPREAD + 1."""
    for seed in (1, 2, 3, 4, 5):
        rng = np.random.default_rng(seed)
        for _ in range(20):
            k = int(rng.integers(1, 200))
            v = np.sort(rng.integers(1, int(rng.choice([2, 6, 40, 10**6])) + 1, k).astype(np.float64))
            want = tail_scores(v)
            plain = _scores_reference(v.tolist())
            assert want == pytest.approx([plain[x] for x in v.tolist()], rel=1e-12)
            firsts, groups = _edge_groups(v.tolist(), want.tolist(), SCORE_BLOCK_SPREAD)
            lo, size = (np.asarray(x, dtype=np.int64) for x in zip(*groups, strict=True))
            got = verified_blocks(k, np.asarray(firsts, dtype=np.int64), lo, size)
            assert got is not None, seed
            assert np.array_equal(got[0], block_scores(want)) and got[1].tolist() == firsts
            assert got[0] == pytest.approx(_blocks_reference(want.tolist(), SCORE_BLOCK_SPREAD), rel=1e-12)
            assert len(firsts) <= sum(1 / j for j in range(1, k + 1)) / SCORE_BLOCK_SPREAD + 1
            _, every_lo, every_size = np.unique(v, return_index=True, return_counts=True)
            for i in range(1, len(firsts)):  # every group given: the claim alone is wrong
                moved = [f for f in every_lo.tolist() if firsts[i - 1] < f != firsts[i]
                         and (i + 1 == len(firsts) or f < firsts[i + 1])]
                if moved:
                    claim = np.asarray([*firsts[:i], moved[0], *firsts[i + 1:]], dtype=np.int64)
                    assert verified_blocks(k, claim, every_lo.astype(np.int64), every_size.astype(np.int64)) is None
            if len(groups) > 1:
                assert verified_blocks(k, np.asarray(firsts, dtype=np.int64), lo[1:], size[1:]) is None


@pytest.mark.parametrize("case", range(24))
def test_the_block_null_has_the_permutation_null_law(case: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Drawing large groups of equal scores by a hypergeometric per window ("auto", here every group of 3 or more so
    that both steps run on every input) against shuffling every score ("permute") on random inputs: the share of
    permutation draws at or beyond the block null's 0.9 and 0.99 quantiles is 1 - q within 4.5 binomial sd of both
    samples (the two are independent). Odd cases hold thousands of values above the threshold, even ones a few
    dozen to hundreds; every third has ties."""
    monkeypatch.setattr("analysis.stats.spikes._value_by_value", lambda m, windows: m < 3)
    rng = np.random.default_rng(100 + case)
    windows = int(rng.integers(4, 30))
    n = rng.integers(300, 3000, windows)
    share_k = (0.03, 0.06) if case % 2 else (0.002, 0.02)
    total_k = int(rng.integers(int(share_k[0] * n.sum()) + 5, int(share_k[1] * n.sum()) + 10))
    tail = rng.lognormal(0.0, 1.0, total_k)
    if case % 3 == 0:
        tail = np.round(tail, 1)  # ties
    scores = block_scores(tail_scores(np.sort(tail)))
    sizes = np.unique(scores, return_counts=True)[1]
    assert (sizes < 3).any() and (sizes >= 3).any()
    max_len = max(1, windows // 2)
    draws = 2000
    mixed = scan_null_max(n, total_k, max_len, draws, np.random.default_rng(7 * case), scores)
    perm = scan_null_max(n, total_k, max_len, draws, np.random.default_rng(7 * case + 1), scores, method="permute")
    for q in (0.9, 0.99):
        share = float(np.mean(perm >= np.quantile(mixed, q)))
        assert share == pytest.approx(1 - q, abs=4.5 * math.sqrt(q * (1 - q) * 2 / draws))


def test_the_block_null_against_plain_draws_and_its_totals(monkeypatch: pytest.MonkeyPatch) -> None:
    """The block draws (every group of 4 or more by hypergeometrics) against placing the scored values on slots plainly
    (rng.choice of K of the N slots, the i-th chosen slot holding the i-th score), and each draw's counts and sums add
    up to K and the scores' sum."""
    monkeypatch.setattr("analysis.stats.spikes._value_by_value", lambda m, windows: m < 4)
    rng = np.random.default_rng(9)
    n = np.array([500, 700, 520, 900, 610, 505, 800, 640])
    total_k, max_len = int(0.02 * n.sum()), 4
    scores = block_scores(tail_scores(np.sort(rng.lognormal(0.0, 1.0, total_k))))
    fast = scan_null_max(n, total_k, max_len, 4000, np.random.default_rng(3), scores)
    labels = np.repeat(np.arange(n.size), n)
    plain = np.empty(2000)
    for d in range(plain.size):
        where = labels[rng.choice(labels.size, total_k, replace=False)]
        k = np.bincount(where, minlength=n.size)
        s = np.bincount(where, weights=scores, minlength=n.size)
        plain[d] = max(_stretch_reference(int(k[a:a + length].sum()), int(n[a:a + length].sum()),
                                          float(s[a:a + length].sum()), total_k, int(n.sum()))
                       for length in range(1, max_len + 1) for a in range(n.size - length + 1))
    for q in (0.5, 0.9, 0.99):
        share = float(np.mean(plain >= np.quantile(fast, q)))
        assert share == pytest.approx(1 - q, abs=4.5 * math.sqrt(q * (1 - q) * (1 / plain.size + 1 / fast.size)))
    ck, cs = _block_sums(scores, n, 50, np.random.default_rng(4))
    assert (ck[:, -1] == total_k).all() and cs[:, -1] == pytest.approx(float(scores.sum()))
    assert (np.diff(ck, axis=1) <= n).all() and (np.diff(ck, axis=1) >= 0).all()


@pytest.mark.parametrize("by_value", [True, False])
def test_the_block_draws_have_the_exact_law_of_a_uniform_placement(by_value: bool,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """On 9 slots in 3 windows, 5 scored values (3 of score 0.5, 2 of score 1.5): every ordered placement of the 5 on
    distinct slots is equally likely, which gives each outcome (counts and sums per window) an exact probability.
    20,000 block draws, with the values shuffled over the slots drawn or placed by one hypergeometric per window and
    group, hit each outcome that often within 4.5 binomial sd."""
    import itertools

    monkeypatch.setattr("analysis.stats.spikes._value_by_value", lambda m, windows: by_value)
    n = np.array([3, 2, 4])
    slot_window = np.repeat(np.arange(3), n)
    scores = [0.5, 0.5, 0.5, 1.5, 1.5]
    exact: dict[tuple[int, ...], int] = {}
    for slots in itertools.permutations(range(n.sum()), len(scores)):
        k, s = [0, 0, 0], [0.0, 0.0, 0.0]
        for slot, score in zip(slots, scores, strict=True):
            k[slot_window[slot]] += 1
            s[slot_window[slot]] += score
        key = (*k, *(round(x * 2) for x in s))
        exact[key] = exact.get(key, 0) + 1
    total = sum(exact.values())
    draws = 20_000
    ck, cs = _block_sums(np.array(scores), n, draws, np.random.default_rng(5))
    block_k, block_s = np.diff(ck, axis=1), np.diff(cs, axis=1)
    seen: dict[tuple[int, ...], int] = {}
    for row in np.concatenate([block_k, np.round(block_s * 2).astype(np.int64)], axis=1).tolist():
        seen[tuple(row)] = seen.get(tuple(row), 0) + 1
    assert set(seen) <= set(exact)
    for key, ways in exact.items():
        p = ways / total
        assert seen.get(key, 0) == pytest.approx(draws * p, abs=4.5 * math.sqrt(draws * p * (1 - p)) + 1)


def test_the_pooled_quantiles_by_partition_equal_those_of_the_sorted_pool() -> None:
    """`SortedValues.pool` (unweighted: a partition) against sorting the flagged windows' values and reading
    `quantile_sorted`, bit for bit, on 300 random inputs with ties and empty windows."""
    rng = np.random.default_rng(13)
    for _ in range(300):
        counts = rng.integers(0, 50, int(rng.integers(1, 12)))
        vals = np.round(rng.lognormal(0.0, 1.0, int(counts.sum())), int(rng.integers(0, 3)))
        first = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        for a, c in zip(first.tolist(), counts.tolist(), strict=True):
            vals[a:a + c].sort()
        mask = rng.random(counts.size) < 0.6
        got = SortedValues(vals, first, counts.astype(np.int64)).pool(mask)
        ref = np.sort(vals[np.repeat(mask, counts)])
        assert got.n == ref.size == got.n_weighted == got.n_effective
        if ref.size == 0:
            assert math.isnan(got.p50_ns) and math.isnan(got.p99_ns)
        else:
            assert (got.p50_ns, got.p99_ns) == (quantile_sorted(ref, 0.5), quantile_sorted(ref, 0.99))


def test_pooled_windows_read_the_runs_of_the_flagged_windows() -> None:
    """SortedValues.pool joins the flagged windows' runs: the same values in the same order as a mask over every
    value, so the pooled quantiles are those of the mask's values, on random windows (some empty)."""
    from analysis.engine.percentiles import quantiles_unsorted
    from analysis.stats.spikes import SortedValues

    rng = np.random.default_rng(29)
    for case in range(200):
        counts = rng.integers(0, 30, int(rng.integers(1, 20))).astype(np.int64)
        first = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        values = rng.lognormal(0, 1, int(counts.sum()))
        source = SortedValues(values, first, counts)
        flagged = rng.random(counts.size) < 0.5
        want = values[np.repeat(flagged, counts)]
        assert source._values_of(flagged).tolist() == want.tolist(), case
        pooled = source.pool(flagged)
        assert pooled.n == want.size
        if want.size:
            assert (pooled.p50_ns, pooled.p99_ns) == tuple(quantiles_unsorted(want.copy(), (0.5, 0.99))), case


def test_median_is_numpys() -> None:
    """spikes.median (the baseline's median window p99, without numpy.ma) equals np.median bit for bit on random
    arrays: odd and even sizes, ties, one value, a nan."""
    from analysis.stats.spikes import median

    rng = np.random.default_rng(31)
    for case in range(500):
        x = rng.lognormal(10, 2, int(rng.integers(1, 80)))
        if case % 4 == 0:
            x = np.round(x, -3)  # ties
        if case % 50 == 0:
            x[int(rng.integers(x.size))] = np.nan
        want = float(np.median(x))
        got = median(x)
        assert (math.isnan(got) and math.isnan(want)) or got == want, case
