"""The level of a learned hierarchy a spike names (attributes.name_level), against a reference written from the rule
(docs/methods.md, "Hierarchies") with sets of rows, on random fleets: replicas in nodes in zones, a random tail and
baseline, random `explained` figures.

The rule: the values nested with the first candidate form its chain; the value named is the finest of the chain whose
`explained` (capped at 1) is within HIERARCHY_MARGIN of every other's, leaving out each coarser value that holds it
and whose other requests are no more frequent in the tail than in the baseline (it earns nothing of its own).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import numpy as np
import pytest

from analysis.stats import attributes as A
from analysis.stats.explain import Candidate, Coded

DIMS = ("replica", "k8s.node.name", "cloud.availability_zone")


@dataclass(frozen=True)
class Value:
    """A candidate as the reference sees it: a set of rows and its figures."""

    dim: int
    rows: frozenset[int]
    explained: float
    index: int  # position in the ranked list


def share(rows: frozenset[int], of: list[int]) -> float:
    return sum(1 for r in of if r in rows) / len(of)


def reference(values: list[Value], labels: list[int], tail: list[int], base: list[int]
              ) -> tuple[int, set[int], set[int]]:
    """(the index named, the finer indexes, the coarser ones), from the rule over sets of rows."""
    top = values[0]
    same = [v for v in values if v.rows == top.rows]
    first = min(same, key=lambda v: (labels[v.dim], v.index))
    order = [first] + [v for v in values if v is not first]
    chain = [first] + [v for v in order[1:] if math.isfinite(v.explained) and v.rows != top.rows
                       and (v.rows < top.rows or v.rows > top.rows)]
    if len(chain) == 1 or not math.isfinite(first.explained):
        return first.index, set(), set()
    chain.sort(key=lambda v: (len(v.rows), order.index(v)))

    def earns(coarse: Value, fine: Value) -> bool:
        if not fine.rows < coarse.rows:
            return True
        other = coarse.rows - fine.rows
        return share(other, tail) > share(other, base)

    for pos, v in enumerate(chain):
        if all(min(v.explained, 1.0) >= min(o.explained, 1.0) - A.HIERARCHY_MARGIN
               for o in chain if o is not v and earns(o, v)):
            return v.index, {c.index for c in chain[:pos]}, {c.index for c in chain[pos + 1:]}
    raise AssertionError("the largest explained is always within the margin of every value")


def fleet(rng: random.Random) -> tuple[list[Coded], list[int], list[int], int]:
    """Rows on replicas in nodes in zones (a zone may hold one node, a node one replica), a tail and a baseline."""
    zones = rng.randint(1, 3)
    nodes = [(z, k) for z in range(zones) for k in range(rng.randint(1, 3))]
    replicas = [(n, k) for n in range(len(nodes)) for k in range(rng.randint(1, 3))]
    n_rows = rng.randint(60, 300)
    on = [rng.randrange(len(replicas)) for _ in range(n_rows)]
    rep = np.array(on, dtype=np.int64)
    node = np.array([replicas[r][0] for r in on], dtype=np.int64)
    zone = np.array([nodes[replicas[r][0]][0] for r in on], dtype=np.int64)
    coded = [Coded(name, codes, [f"{name}-{i}" for i in range(size)], [None] * size, [None] * size)
             for name, codes, size in zip(DIMS, (rep, node, zone), (len(replicas), len(nodes), zones), strict=True)]
    rows = list(range(n_rows))
    rng.shuffle(rows)
    cut = rng.randint(10, n_rows // 3)
    return coded, rows[:cut], rows[cut:cut + rng.randint(20, n_rows - cut)], n_rows


def candidates(rng: random.Random, coded: list[Coded], tail: list[int], base: list[int]) -> list[Candidate]:
    """Every value held by a tail row, with its shares, score and a random explained, in a random order."""
    out = []
    for d, c in enumerate(coded):
        for code in sorted({int(c.codes[r]) for r in tail}):
            t = sum(1 for r in tail if c.codes[r] == code)
            b = sum(1 for r in base if c.codes[r] == code)
            explained = rng.choice([math.nan, rng.uniform(-0.3, 1.4), round(rng.uniform(0, 1.2), 1)])
            out.append(Candidate((d,), (code,), t, b, t / len(tail), b / len(base), t / len(tail) - b / len(base),
                                 0.0, explained=explained))
    rng.shuffle(out)
    if math.isnan(out[0].explained) and rng.random() < 0.8:
        out[0].explained = rng.uniform(0, 1.2)
    return out


@pytest.mark.parametrize("seed", range(8))
def test_name_level_matches_the_reference_on_random_fleets(seed: int) -> None:
    rng = random.Random(seed)
    named_coarser = named_finer = 0
    for _ in range(150):
        coded, tail, base, _ = fleet(rng)
        cands = candidates(rng, coded, tail, base)
        values = [Value(c.dims[0], frozenset(int(r) for r in np.flatnonzero(coded[c.dims[0]].codes == c.codes[0])),
                        c.explained, i) for i, c in enumerate(cands)]
        want, finer, coarser = reference(values, [len(c.labels) for c in coded], tail, base)
        ranked, got_finer, got_coarser = A.name_level(coded, list(cands))
        assert ranked[0] is cands[want]
        assert sorted(ranked, key=id) == sorted(cands, key=id)
        assert {id(c) for c in got_finer} == {id(cands[i]) for i in finer}
        assert {id(c) for c in got_coarser} == {id(cands[i]) for i in coarser}
        named_coarser += bool(finer)
        named_finer += bool(coarser)
    # the draws reach both outcomes: a value named over finer ones, and under coarser ones
    assert named_coarser > 10 and named_finer > 10


def test_a_coarser_value_whose_other_requests_are_ordinary_is_not_named() -> None:
    """The zone explains 0.99 and its node 0.82 (more than the margin apart): the zone is named only when its other
    node is more frequent in the tail than in the baseline."""
    # rows 0-9 on node n0, 10-19 on n1 (both in zone z0), 20-39 on n2 in zone z1
    node = np.array([0] * 10 + [1] * 10 + [2] * 20, dtype=np.int64)
    zone = np.array([0] * 20 + [1] * 20, dtype=np.int64)
    coded = [Coded("k8s.node.name", node, ["n0", "n1", "n2"], [None] * 3, [None] * 3),
             Coded("cloud.availability_zone", zone, ["z0", "z1"], [None] * 2, [None] * 2)]
    node_c = Candidate((0,), (0,), 4, 2, 4 / 6, 2 / 8, 4 / 6 - 2 / 8, 0.0, explained=0.82)
    # n1 holds 2 of the tail's 6 (0.33) and 2 of the baseline's 8 (0.25): over-represented, the zone earns its name
    zone_c = Candidate((1,), (0,), 6, 4, 6 / 6, 4 / 8, 6 / 6 - 4 / 8, 0.0, explained=0.99)
    ranked, finer, coarser = A.name_level(coded, [zone_c, node_c])
    assert ranked[0] is zone_c and finer == [node_c] and coarser == []
    # n1 holds 1 of 6 (0.17) against 3 of 8 (0.38): the zone's extra comes from ordinary requests, the node is named
    zone_c = Candidate((1,), (0,), 5, 5, 5 / 6, 5 / 8, 5 / 6 - 5 / 8, 0.0, explained=0.99)
    ranked, finer, coarser = A.name_level(coded, [zone_c, node_c])
    assert ranked[0] is node_c and finer == [] and coarser == [zone_c]
