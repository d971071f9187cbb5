"""Explanation parts on hand-made data: buckets, stage shares, contrast, counterfactual, ranking, exemplars."""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from analysis import connect
from analysis.engine.percentiles import MIN_TAIL
from analysis.stats import explain as X
from analysis.stats.spikes import quantile_sorted
from tests import samples_cache
from tests.analysis.test_report import fleet_store
from tests.factory import T0, add_request, write
from tracing import schema as S
from tracing.rows import SpanBatch

MS = 1_000_000


def test_power_of_two_buckets() -> None:
    assert [X.bucket_bounds(x) for x in (0, 1, 2, 3, 4, 1000, 1024)] == [
        (0, 0), (1, 1), (2, 3), (2, 3), (4, 7), (512, 1023), (1024, 2047)]
    frame = pl.DataFrame({"input_tokens": [0, 1, 3, 1000, None], "tenant": ["b", "a", None, "b", "a"]})
    coded = X.code_dimension(frame, "input_tokens")
    assert coded.codes.tolist() == [0, 1, 2, 10, -1]
    assert (coded.labels[10], coded.lo[10], coded.hi[10]) == ("512-1023", 512, 1023)
    tenant = X.code_dimension(frame, "tenant")
    assert tenant.labels == ["a", "b"] and tenant.codes.tolist() == [1, 0, -1, 1, 0]


def test_an_enum_column_is_coded_as_its_text() -> None:
    """The report's frame carries text dimensions as enums or categoricals (categories in any order, some
    absent from the rows): the codes and labels equal those of the same values as plain text, on random columns."""
    rng = random.Random(11)
    for _ in range(100):
        pool = rng.sample(["a", "b", "c", "B", "é", "z z", "10", "9", ""], rng.randrange(1, 9))
        values = [rng.choice([*pool, None]) for _ in range(rng.randrange(0, 40))]
        cats = pool[:]
        rng.shuffle(cats)
        as_text = X.code_dimension(pl.DataFrame({"tenant": pl.Series(values, dtype=pl.String)}), "tenant")
        for dtype in (pl.Enum(cats), pl.Categorical):
            coded = X.code_dimension(pl.DataFrame({"tenant": pl.Series(values, dtype=dtype)}), "tenant")
            assert coded.labels == as_text.labels
            assert coded.codes.tolist() == as_text.codes.tolist()


def test_token_buckets_through_the_table_equal_the_float_formula(monkeypatch: pytest.MonkeyPatch) -> None:
    """Counts up to the table's bound are coded through a table of the formula's codes: on random columns (nulls,
    zeros, powers of two and their neighbours, negatives, counts past the bound: the bound lowered to 1,000 so both
    paths run often) the codes equal the formula's applied row by row, and the labels are the buckets up to the
    largest code; once more at the real bound."""
    rng = random.Random(7)

    def check(xs: list[int | None], case: object) -> None:
        coded = X.code_dimension(pl.DataFrame({"input_tokens": xs}, schema={"input_tokens": pl.Int64}),
                                 "input_tokens")
        want = [-1 if x is None or x < 0 else 0 if x == 0 else math.floor(np.log2(np.float64(x))) + 1 for x in xs]
        assert coded.codes.dtype == np.int64 and coded.codes.tolist() == want, case
        assert len(coded.labels) == max(want) + 1
        for code, label in enumerate(coded.labels):
            lo, hi = X.bucket_bounds(0 if code == 0 else 1 << (code - 1))
            assert (label, coded.lo[code], coded.hi[code]) == (X.bucket_label(lo, hi), lo, hi)

    check([0, 1, 2, 3, X._BUCKET_TABLE_MAX - 1, X._BUCKET_TABLE_MAX, None], "the real bound")
    check([0, 1, 2, 3, X._BUCKET_TABLE_MAX + 1, None], "past the real bound")
    with monkeypatch.context() as m:
        m.setattr(X, "_BUCKET_TABLE_MAX", 1000)
        for case in range(200):
            top = rng.choice([5, 999, 1000, 1001, 3000, 2**40])
            xs: list[int | None] = [rng.choice([None, rng.choice([0, 1, 2, 3, 999, 1000, 1001]), rng.randrange(top + 1),
                                                (1 << rng.randrange(top.bit_length())) + rng.randrange(-1, 2)])
                                    for _ in range(rng.randrange(1, 60))]
            if case % 5 == 0:
                xs.append(-rng.randrange(1, 9))
            check(xs, case)


def test_bucket_sql_equals_bucket_bounds_and_label() -> None:
    """The SQL the dashboard uses gives the report's buckets and labels, value for value."""
    import duckdb

    rng = random.Random(3)
    xs = [0, 1, 2, 3, 4, 7, 8, 1023, 1024, 1025, 2047, 2048, -5, 2**52 - 1, 2**52, 2**61 + 1, 2**62 - 1]
    xs += [(1 << rng.randrange(62)) + rng.randrange(-2, 3) for _ in range(300)] + [rng.randrange(10**6)
                                                                                   for _ in range(300)]
    con = duckdb.connect()
    rows = con.execute(f"SELECT x, {X.bucket_lo_sql('x')}, {X.bucket_hi_sql('x')}, {X.bucket_label_sql('x')} "
                       "FROM (SELECT unnest(?::BIGINT[]) AS x)", [xs]).fetchall()
    assert len(rows) == len(xs)
    for x, lo, hi, label in rows:
        assert (lo, hi) == X.bucket_bounds(x), x
        assert label == X.bucket_label(lo, hi) == f"{lo}-{hi}"
    assert con.execute(f"SELECT {X.bucket_label_sql('NULL::BIGINT')}").fetchone() == (None,)
    assert X.bucket_label(*X.bucket_bounds(1500)) == "1024-2047"


def test_stage_shares_of_the_excess() -> None:
    tail = pl.DataFrame({"decode_ns": [30 * MS, 30 * MS], "queue_wait_ns": [5 * MS, 5 * MS],
                         "prefill_ns": [1 * MS, 1 * MS], "model_load_ns": [0, 0]})
    base = pl.DataFrame({"decode_ns": [10 * MS], "queue_wait_ns": [3 * MS], "prefill_ns": [2 * MS],
                         "model_load_ns": [0]})
    out = X.stage_shares(tail, base, ["decode", "queue_wait", "prefill", "model_load"])
    assert out == [
        {"stage": "decode", "share": round(20 / 22, 4), "tail_ms": 30.0, "baseline_ms": 10.0},
        {"stage": "queue_wait", "share": round(2 / 22, 4), "tail_ms": 5.0, "baseline_ms": 3.0},
        {"stage": "prefill", "share": round(-1 / 22, 4), "tail_ms": 1.0, "baseline_ms": 2.0},
    ]  # model_load is absent from both slices: not listed


def test_tail_quantile_without_a_subset_is_exact() -> None:
    rng = np.random.default_rng(5)
    values = rng.lognormal(0, 1, 5000)
    rows = np.arange(values.size, dtype=np.int64)
    tq = X.TailQuantile(values, rows)
    for _ in range(50):
        removed = rng.random(values.size) < rng.uniform(0.0, 0.3)
        in_slice = removed[tq.slice_rows()]
        expected = quantile_sorted(np.sort(values[~removed]), 0.99)
        assert tq.without(in_slice, int(removed.sum())) == pytest.approx(expected, rel=1e-12)


def _synthetic() -> tuple[pl.DataFrame, np.ndarray, np.ndarray, np.ndarray]:
    """4,000 baseline and 1,000 spike requests on 4 replicas; long outputs are always slow, and in the
    spike replica r2 is 5x slower."""
    n_base, n_spike = 4000, 1000
    n = n_base + n_spike
    j = np.arange(n)
    replica = np.array([f"r{k}" for k in j % 4])
    output = np.where(j % 10 == 0, 3000, 100)  # 10 % long outputs
    value = 1000.0 + (j * 7919) % 1000
    value = np.where(output == 3000, value * 3, value)
    spike = np.arange(n_base, n, dtype=np.int64)
    base = np.arange(n_base, dtype=np.int64)
    value[spike] = np.where(replica[spike] == "r2", value[spike] * 5, value[spike])
    frame = pl.DataFrame({"replica": replica, "model": ["m"] * n, "model_version": ["v1"] * n,
                          "tenant": np.array(["t0", "t1", "t2"])[j % 3], "input_tokens": [10] * n,
                          "output_tokens": output})
    return frame, value, spike, base


def test_contrast_counterfactual_and_ranking_name_the_cause_not_the_always_slow() -> None:
    frame, value, spike, base = _synthetic()
    coded = [X.code_dimension(frame, d) for d in X.DIMENSIONS]
    base_p99 = quantile_sorted(np.sort(value[base]), 0.99)
    tail = spike[value[spike] > base_p99]
    cands, tested = X.contrast(coded, tail, base)
    assert tested > 0
    X.counterfactual(coded, cands, value, spike, base, X.TailQuantile(value[base], base))
    ranked = [X.candidate_json(coded, c) for c in X.rank(cands)]
    first = ranked[0]
    assert (first["dimension"], first["value"]) == ("replica", "r2")
    # without r2 the spike is the baseline again (both sides computed exactly)
    keep_s = np.array([r != "r2" for r in frame.get_column("replica").to_numpy()[spike]])
    keep_b = np.array([r != "r2" for r in frame.get_column("replica").to_numpy()[base]])
    s_wo = quantile_sorted(np.sort(value[spike][keep_s]), 0.99)
    b_wo = quantile_sorted(np.sort(value[base][keep_b]), 0.99)
    spike_p99 = quantile_sorted(np.sort(value[spike]), 0.99)
    assert first["p99_without_ms"] == round(s_wo / 1e6, 3)
    assert first["explained"] == round(1 - (s_wo - b_wo) / (spike_p99 - base_p99), 4)
    assert first["support"] == int(np.sum(frame.get_column("replica").to_numpy()[tail] == "r2"))
    # long outputs are slow everywhere: removing them from both sides explains little
    long_out = [d for d in ranked if d["dimension"] == "output_tokens" and d["lo"] == 2048]
    assert not long_out or long_out[0]["explained"] < first["explained"] - 0.3
    assert all(d["dimension"] != "model" for d in ranked)  # one value everywhere: never a cause


def _random_coded(rng: np.random.Generator, n: int) -> list[X.Coded]:
    """3 to 6 dimensions of 1 to 12 labels (or none), about 5 % of the codes missing (-1)."""
    coded = []
    for d in range(int(rng.integers(3, 7))):
        k = int(rng.integers(0, 13))
        codes = rng.integers(0, max(k, 1), n) if k else np.full(n, -1)
        codes = np.where(rng.random(n) < 0.05, -1, codes).astype(np.int64)
        labels = [f"v{i}" for i in range(k)]
        coded.append(X.Coded(f"d{d}", codes, labels, [None] * k, [None] * k))
    return coded


def _reference_counterfactual(coded: list[X.Coded], cands: list[X.Candidate], values: np.ndarray,
                              spike: np.ndarray, base: np.ndarray) -> list[tuple[float, float, float]]:
    """Each candidate's (p99 without, baseline p99 without, explained) by plain masks and full sorts."""
    def p99(x: np.ndarray) -> float:
        return quantile_sorted(np.sort(x), 0.99) if x.size else math.nan

    def matches(rows: np.ndarray, c: X.Candidate) -> np.ndarray:
        return np.all([coded[i].codes[rows] == code for i, code in zip(c.dims, c.codes, strict=True)], axis=0)

    excess = p99(values[spike]) - p99(values[base])
    out = []
    for c in cands:
        keep = ~matches(spike, c)
        if keep.sum() * (1 - X.TAIL_Q) < MIN_TAIL / 5:
            out.append((math.nan, math.nan, math.nan))
            continue
        s_wo, b_wo = p99(values[spike][keep]), p99(values[base][~matches(base, c)])
        out.append((s_wo, b_wo, 1.0 - (s_wo - b_wo) / excess if excess > 0 and math.isfinite(b_wo) else math.nan))
    return out


def test_contrast_by_joint_counts_equals_pair_by_pair_and_counterfactuals_equal_plain_masks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The baseline's counts of every single and pair read off one count per combination of all dimensions give
    the same candidates as counting each single and pair over the rows (forced by a joint limit of 0), on random
    coded dimensions with missing codes; the counterfactuals (slice codes gathered once, partitions) equal
    plain masks and full sorts."""
    rng = np.random.default_rng(17)
    for case in range(40):
        n = int(rng.integers(200, 4000))
        coded = _random_coded(rng, n)
        values = rng.lognormal(0, 1, n)
        hot = coded[0].codes == 0
        values[hot] *= rng.uniform(1, 4)  # a cause, sometimes
        rows = rng.permutation(n).astype(np.int64)
        split = int(rng.integers(n // 4, 3 * n // 4))
        spike, base = np.sort(rows[:split]), np.sort(rows[split:])
        tail = spike[values[spike] > quantile_sorted(np.sort(values[base]), 0.99)]
        joint = X.contrast(coded, tail, base)
        with monkeypatch.context() as m:
            m.setattr(X, "MAX_JOINT_CELLS", 0)
            assert repr(X.contrast(coded, tail, base)) == repr(joint), case
        cands, _ = joint
        X.counterfactual(coded, cands, values, spike, base, X.TailQuantile(values[base], base, slice_share=0.5))
        want = _reference_counterfactual(coded, cands, values, spike, base)
        got = [(c.p99_without_ns, c.baseline_p99_without_ns, c.explained) for c in cands]
        assert repr(got) == repr(want), case


def test_binomial_bound_and_guard() -> None:
    assert X.binomial_tail_bound(5, 10, 0.5) == 1.0
    assert X.binomial_tail_bound(10, 10, 0.5) == pytest.approx(0.5 ** 10)
    frame = pl.DataFrame({"replica": ["a", "b"] * 50})
    coded = [X.code_dimension(frame, "replica")]
    # a tail that looks like the baseline passes no guard
    cands, tested = X.contrast(coded, np.arange(0, 20, dtype=np.int64), np.arange(20, 100, dtype=np.int64))
    assert cands == [] and tested == 2


def test_exemplars_prefer_the_best_candidate_near_p99() -> None:
    ids = [f"{i:032x}" for i in range(10)]
    values = np.array([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], dtype=float)
    spike = np.arange(10, dtype=np.int64)
    prefer = np.array([False] * 8 + [False, True])
    assert [ids[r] for r in X.exemplar_rows(values, spike, 7.5, prefer, k=3)] == [ids[9], ids[7], ids[8]]
    assert [ids[r] for r in X.exemplar_rows(values, spike, 7.5, None, k=2)] == [ids[7], ids[8]]


def test_stage_rows_equal_the_requests_view(tmp_path: Path) -> None:
    batch = SpanBatch()
    trace, _ = add_request(batch, "one", 0, 100, [
        ("queue_wait", 5, 20), ("preprocess", 15, 30), ("generation", 30, 90),
        ("prefill", 30, 40, "generation"), ("decode", 40, 90, "generation"), ("streaming", 40, 98)])
    add_request(batch, "two", 0, 50, [("generation", 0, 50)])  # not selected: must not appear
    write(tmp_path, batch)
    con = connect(tmp_path)
    rows = X.stage_rows(con, [trace])
    cols = ", ".join(f"{c}_ns" for c in S.CRITICAL_PATH_COLUMNS)
    view = con.sql(f"SELECT trace_id, span_id, {cols} FROM requests WHERE trace_id = ?", params=[trace]).pl()
    assert rows.equals(view)
    assert rows.row(0, named=True)["decode_ns"] == 50 and rows.row(0, named=True)["streaming_ns"] == 8


def test_stage_rows_on_a_fleet_store(tmp_path_factory: pytest.TempPathFactory) -> None:
    store = samples_cache.built("fleet-spiky", fleet_store, tmp_path_factory)
    con = connect(store)
    ids = [r[0] for r in con.execute("SELECT trace_id FROM requests ORDER BY trace_id LIMIT 50").fetchall()]
    cols = ", ".join(f"{c}_ns" for c in S.CRITICAL_PATH_COLUMNS)
    view = con.sql(f"SELECT trace_id, span_id, {cols} FROM requests WHERE list_contains(?, trace_id) "
                   "ORDER BY trace_id", params=[ids]).pl()
    assert X.stage_rows(con, ids).sort("trace_id").equals(view)


def test_stage_rows_read_materialized_hours_and_compute_the_others(tmp_path: Path) -> None:
    """Mixed store: one hour materialized, its neighbours computed on the fly; every stage column equals the view."""
    from analysis.engine.materialize import HOUR_NS, build_hour, materialize, snapshot

    rng = random.Random(7)
    batch = SpanBatch()
    names = ("queue_wait", "preprocess", "generation", "streaming")
    for k in range(90):
        start = (k % 3) * HOUR_NS + rng.randrange(0, HOUR_NS - 10_000) if k % 10 else HOUR_NS - 400 * (k % 7 + 1)
        stages = []
        t = start
        for name in rng.sample(names, rng.randint(0, len(names))):
            d = rng.randint(10, 900)
            stages.append((name, t, t + d))
            t += rng.randint(0, d)  # overlapping or back to back
        add_request(batch, ("m", k), start, max(t, start + 1) + rng.randint(0, 300), stages)
    write(tmp_path, batch)
    cols = ", ".join(f"{c}_ns" for c in S.CRITICAL_PATH_COLUMNS)

    def check() -> None:
        con = connect(tmp_path)
        ids = [r[0] for r in con.execute("SELECT trace_id FROM requests").fetchall()]
        chosen = sorted(rng.sample(ids, 60))
        view = con.sql(f"SELECT trace_id, span_id, {cols} FROM requests WHERE list_contains(?, trace_id) "
                       "ORDER BY trace_id", params=[chosen]).pl()
        assert view.height == 60
        assert X.stage_rows(con, chosen).sort("trace_id").equals(view)
        assert X.stage_rows(con, chosen, T0 - HOUR_NS, T0 + 4 * HOUR_NS).sort("trace_id").equals(view)

    check()  # nothing materialized
    snap = snapshot(tmp_path)
    build_hour(snap, snap.stale[1])
    assert len(snapshot(tmp_path).fresh) == 1
    check()  # one hour from its file, two on the fly
    materialize(tmp_path)
    assert not snapshot(tmp_path).stale
    check()  # every hour from the files
