"""The baseline's p99 without each candidate on ClickHouse (analysis.clickhouse.report._ServerTail): asked for many
candidates at once from the baseline's top slice (`ask`, two queries), or one query a candidate where the slice
does not reach; both must equal a plain sort of the rest, to the last bit."""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pytest

from analysis.clickhouse import attributes as CA
from analysis.clickhouse.report import _ServerTail
from analysis.stats import attributes as A
from analysis.stats import explain as X
from tests.analysis.recording import Recording

REPLICAS = ["r0", "r1", "r2"]


def _plain_p99(values: list[float]) -> float:
    """The p99 of `values` by a plain sort: rank (n - 1) q, linear interpolation (nan when empty)."""
    s = sorted(values)
    if not s:
        return math.nan
    h = (len(s) - 1) * X.TAIL_Q
    a = math.floor(h)
    return s[a] + (h - a) * (s[min(a + 1, len(s) - 1)] - s[a])


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_without_each_candidate_equals_a_plain_sort(chdb_client: Any, seed: int) -> None:
    rng = random.Random(seed)
    n = rng.choice([300, 1500, 4000])
    top = rng.choice([3, 50, 10_000])  # few distinct values (ties everywhere) or many
    values = [float(rng.randrange(top)) for _ in range(n)]
    base = [rng.random() < 0.8 for _ in range(n)]  # the baseline's windows: start_ns // 10 even
    replica = [rng.choice([*REPLICAS, None]) for _ in range(n)]
    # a0: a candidate holding most of the slowest requests (its rest reaches below the slice), a1: a few random
    slow = set(sorted(range(n), key=lambda i: -values[i])[: n // 10])
    a0 = [0 if i in slow and rng.random() < 0.9 else rng.choice([1, -1]) for i in range(n)]
    a1 = [rng.choice([0, 1, 2, -1]) for _ in range(n)]
    w = [rng.choice([1.0, 2.0, 4.0]) for _ in range(n)]  # a sampled table's adjusted counts
    chdb_client.command(f"DROP TEMPORARY TABLE IF EXISTS {CA.ATTR_TEMP}")
    chdb_client.command(f"CREATE TEMPORARY TABLE {CA.ATTR_TEMP} (trace_id String, span_id String, start_ns Int64, "
                        f"v Float64, replica Nullable(String), a0 Int64, a1 Int64, w Float64) ENGINE = Memory")
    chdb_client.command("DROP TABLE IF EXISTS facts")
    chdb_client.command("CREATE TABLE facts (trace_id String, span_id String, start_ns Int64, e2e_ns Float64, "
                        "replica Nullable(String)) ENGINE = Memory")
    start = [20 * i + (0 if base[i] else 10) for i in range(n)]
    rep = ["NULL" if r is None else f"'{r}'" for r in replica]
    chdb_client.command(f"INSERT INTO {CA.ATTR_TEMP} VALUES " + ", ".join(
        f"('t{i}', 's{i}', {start[i]}, {values[i]!r}, {rep[i]}, {a0[i]}, {a1[i]}, {w[i]!r})" for i in range(n)))
    chdb_client.command("INSERT INTO facts VALUES " + ", ".join(
        f"('t{i}', 's{i}', {start[i]}, {values[i]!r}, {rep[i]})" for i in range(n)))
    coded = [X.Coded("replica", np.zeros(0, dtype=np.int64), REPLICAS, [None] * 3, [None] * 3),
             X.Coded("k0", np.zeros(0, dtype=np.int64), ["x", "y"], [None] * 2, [None] * 2, "k0", "request"),
             X.Coded("k1", np.zeros(0, dtype=np.int64), ["p", "q", "r"], [None] * 3, [None] * 3, "k1", "request")]
    attrs = CA.ServerAttributes(A.Attributes(), {"k0": "a0", "k1": "a1"}, "e2e_ns")
    cands = [X.Candidate(dims, codes, 0, 0, 0.0, 0.0, 0.0, 1.0)
             for dims, codes in [((0,), (0,)), ((0,), (2,)), ((1,), (0,)), ((1,), (1,)), ((2,), (1,)),
                                 ((0, 1), (1, 0)), ((0, 2), (2, 2))]]
    columns: dict[str, list[str | None] | list[int]] = {"replica": replica, "k0": a0, "k1": a1}

    def holds(c: X.Candidate, i: int) -> bool:
        return all(columns[coded[d].name][i] == (coded[d].labels[code] if d == 0 else code)
                   for d, code in zip(c.dims, c.codes, strict=True))

    def rest(c: X.Candidate) -> list[float]:
        return [values[i] for i in range(n) if base[i] and not holds(c, i)]

    client = Recording(chdb_client)
    tail = _ServerTail(client, "facts", "intDiv(start_ns, 10) % 2 = 0", "e2e_ns", None, attrs,
                       "intDiv(start_ns, 10) % 2 = 0")
    tail.ask(coded, cands)
    assert client.queries == 2
    got = [tail.without_candidate(coded, c) for c in cands]
    want = [_plain_p99(rest(c)) for c in cands]
    assert [x if not math.isnan(x) else None for x in got] == [x if not math.isnan(x) else None for x in want]
    assert tail.quantile() == _plain_p99([values[i] for i in range(n) if base[i]])
    # a candidate not asked in the batch (or one whose p99 reaches below the slice) is asked on its own, in one query
    lone = X.Candidate((0,), (1,), 0, 0, 0.0, 0.0, 0.0, 1.0)
    before = client.queries
    got_lone = tail.without_candidate(coded, lone)
    assert client.queries == before + 1
    want_lone = _plain_p99(rest(lone))
    assert (None if math.isnan(got_lone) else got_lone) == (None if math.isnan(want_lone) else want_lone)

    # the spike's (the other windows') p99 and count without each candidate, in one query: unweighted a plain sort of
    # the rest; weighted (whole weights) a plain sort of the rest with each value repeated its weight's times, and
    # Kish's effective count (sum w)^2 / sum w^2
    def nan_none(x: float) -> float | None:
        return None if math.isnan(x) else x

    spike = [i for i in range(n) if not base[i]]
    for weighted in (False, True):
        got_spike = attrs.spike_without(chdb_client, coded, cands, "intDiv(start_ns, 10) % 2 = 1", weighted)
        for k, c in enumerate(cands):
            kept = [i for i in spike if not holds(c, i)]
            if weighted:
                tot, sq = sum(w[i] for i in kept), sum(w[i] * w[i] for i in kept)
                want_left = tot * tot / sq if sq > 0 else 0.0
                want_q = _plain_p99([values[i] for i in kept for _ in range(int(w[i]))])
            else:
                want_left, want_q = float(len(kept)), _plain_p99([values[i] for i in kept])
            assert (got_spike[k][0], nan_none(got_spike[k][1])) == (want_left, nan_none(want_q)), (weighted, c)
