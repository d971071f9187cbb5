"""A pair that explains no more than its better part is folded under it (`attributes.folded_under`, the
hierarchy's margin): exact cases by hand, and random rankings against a plain reading of the rule."""

from __future__ import annotations

import math
import random

import pytest

from analysis.stats import attributes as A
from analysis.stats.explain import Candidate


def _c(dims: tuple[int, ...], codes: tuple[int, ...], explained: float) -> Candidate:
    return Candidate(dims, codes, 10, 5, 0.5, 0.1, 0.4, 1e-9, explained=explained)


def test_exact_folding_by_hand() -> None:
    tenant, stream, node = _c((3,), (1,), 0.85), _c((9,), (0,), 0.20), _c((7,), (2,), 0.60)
    ranked = [
        tenant,
        _c((3, 9), (1, 0), 0.84),   # restates tenant: folded under it (position 0)
        node,
        _c((3, 7), (1, 2), 0.97),   # 0.97 > 0.85 + 0.1: explains clearly more than its better part, kept
        _c((7, 9), (2, 0), 0.65),   # parts node (0.60) and stream: node is the better part, 0.60 >= 0.55
        stream,
        _c((3, 8), (1, 4), math.nan),  # no counterfactual: kept
        _c((8, 9), (4, 0), 0.25),   # the part 8=4 is not ranked, stream is ranked before: folded under stream
        _c((5, 6), (0, 0), 0.30),   # neither part ranked: kept
        _c((1,), (0,), 1.40),
        _c((1, 2), (0, 1), 1.90),   # both capped at 1: explains no more than all there is, folded under 1=0
        _c((2, 9), (1, 0), 0.35),   # its one ranked part, stream, explains 0.20 < 0.35 - 0.1: kept
    ]
    assert A.folded_under(ranked) == [None, 0, None, None, 2, None, None, 5, None, None, 9, None]


def test_a_part_ranked_after_the_pair_does_not_fold_it() -> None:
    ranked = [_c((0, 1), (0, 0), 0.50), _c((0,), (0,), 0.55), _c((1,), (0,), 0.45)]
    assert A.folded_under(ranked) == [None, None, None]


def _reference(ranked: list[Candidate]) -> list[int | None]:
    """The rule read plainly: among the pair's parts ranked before it with a finite explained, the one explaining
    most (capped at 1; the earlier on a tie); folded when it explains at least the pair's (capped) less 0.1."""
    def cap(x: float) -> float:
        return min(x, 1.0)

    out: list[int | None] = []
    for n, c in enumerate(ranked):
        best = None
        if len(c.dims) == 2 and math.isfinite(c.explained):
            values = set(zip(c.dims, c.codes, strict=True))
            for m in range(n):
                s = ranked[m]
                if len(s.dims) != 1 or (s.dims[0], s.codes[0]) not in values or not math.isfinite(s.explained):
                    continue
                if best is None or cap(s.explained) > cap(ranked[best].explained):
                    best = m
        out.append(best if best is not None and cap(ranked[best].explained) >= cap(c.explained) - 0.1 else None)
    return out


@pytest.mark.parametrize("seed", range(1, 6))
def test_folding_equals_a_plain_reading_on_random_rankings(seed: int) -> None:
    rng = random.Random(seed)
    folded = 0
    for _ in range(300):
        ranked: list[Candidate] = []
        seen: set[tuple[tuple[int, ...], tuple[int, ...]]] = set()
        for _ in range(rng.randint(1, 25)):
            dims = tuple(sorted(rng.sample(range(6), rng.choice([1, 1, 2]))))
            codes = tuple(rng.randrange(3) for _ in dims)
            if (dims, codes) in seen:
                continue
            seen.add((dims, codes))
            e = rng.choice([math.nan, rng.uniform(-0.5, 1.6), round(rng.uniform(0, 1), 1)])
            ranked.append(_c(dims, codes, e))
        got = A.folded_under(ranked)
        assert got == _reference(ranked)
        folded += sum(g is not None for g in got)
    assert folded > 100
