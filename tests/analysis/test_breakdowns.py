"""analysis.breakdowns against independent numpy / brute-force references."""

from __future__ import annotations

import random
import statistics
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pytest

from analysis import breakdowns as B
from analysis import connect
from analysis.engine.percentiles import metric_column
from analysis.stats.explain import bucket_bounds
from tests import samples_cache
from tests.analysis.test_report import SLOW_REPLICA, fleet_store
from tracing import schema as S


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return samples_cache.built("fleet-spiky", fleet_store, tmp_path_factory)


def test_token_buckets_are_the_reports() -> None:
    rng = np.random.default_rng(3)
    xs = [*rng.integers(0, 2**40, 3000).tolist(), *(2**k + d for k in range(41) for d in (-1, 0, 1)), 0]
    con = duckdb.connect()
    con.execute("CREATE TABLE requests AS SELECT unnest(?::BIGINT[]) AS input_tokens, "
                "1::BIGINT AS output_tokens, 1000000::BIGINT AS e2e_ns", [xs])
    got = B.shape(con, by=("input_tokens",))
    want: dict[tuple[int, int], int] = {}
    for x in xs:
        want[bucket_bounds(x)] = want.get(bucket_bounds(x), 0) + 1
    assert dict(zip(zip(got["input_tokens_lo"], got["input_tokens_hi"], strict=True), got["requests"],
                    strict=True)) == want
    assert all(label == f"{lo}-{hi}" for label, lo, hi in
               zip(got["input_tokens_bucket"], got["input_tokens_lo"], got["input_tokens_hi"], strict=True))


def test_shape_cells_cover_every_request_and_match_numpy(fleet: Path) -> None:
    con = connect(fleet)
    grid = B.shape(con)
    rows = con.execute("SELECT input_tokens, output_tokens, e2e_ns FROM requests").fetchall()
    assert int(grid["requests"].sum()) == len(rows)
    cell = grid.row(int(np.argmax(grid["requests"].to_numpy())), named=True)
    vals = [e for i, o, e in rows if bucket_bounds(i)[0] == cell["input_tokens_lo"]
            and bucket_bounds(o)[0] == cell["output_tokens_lo"]]
    assert cell["p99_ms"] == pytest.approx(np.quantile(vals, 0.99) / 1e6, rel=1e-12)
    assert cell["p99_low_sample"] == (len(vals) * 0.01 < 5)


def test_summary_matches_numpy(fleet: Path) -> None:
    con = connect(fleet)
    got = B.summary(con, where="tenant = ?", params=["acme"])
    e2e = np.array([r[0] for r in con.execute("SELECT e2e_ns FROM requests WHERE tenant = 'acme'").fetchall()])
    assert got["requests"] == e2e.size
    assert sum(int(got[o] or 0) for o in S.OUTCOMES) == e2e.size
    for q in (50, 90, 99):
        assert got[f"e2e_p{q}_ms"] == pytest.approx(np.quantile(e2e, q / 100) / 1e6, rel=1e-12)
    # each metric's quantiles come from one list-valued quantile_cont: bit for bit each q's own quantile_cont
    for m in B.SUMMARY_METRICS:
        col = metric_column(m)
        for q in (50, 90, 99):
            (one,) = con.execute(f"SELECT quantile_cont({col}, {q / 100}) / 1e6 FROM requests WHERE tenant = 'acme'"
                                 ).fetchall()[0]
            assert one is not None and got[f"{m}_p{q}_ms"] == one
    none = B.summary(con, where="false")  # no request: every percentile None
    assert none["requests"] == 0 and all(none[f"{m}_p{q}_ms"] is None for m in B.SUMMARY_METRICS for q in (50, 90, 99))


def test_replica_outliers_match_a_reference(fleet: Path) -> None:
    con = connect(fleet)
    got = B.replicas(con)
    p99 = got["p99_ms"].to_numpy()
    med = float(np.median(p99))
    mad = float(np.median(np.abs(p99 - med))) * 1.4826
    want = (p99 > med + 3 * max(mad, 1e-9)) & (p99 > 1.2 * med)
    assert got["outlier"].to_list() == want.tolist()
    assert got.filter(got["outlier"])["replica"].to_list() == [SLOW_REPLICA]
    assert int(got["requests"].sum()) == con.execute("SELECT count(*) FROM requests").fetchall()[0][0]


def _outliers_reference(n_effective: list[float], p99: list[float | None]) -> tuple[list[bool], list[bool]]:
    """The outlier rule written plainly: judged with one request or more beyond the p99 (n / 100 >= 1); the median
    and MAD of the judged replicas' p99s; an outlier is judged, 3 scaled MADs and 20% above that median."""
    judged = [n >= 100 for n in n_effective]
    fleet = [p for p, j in zip(p99, judged, strict=True) if j and p is not None]
    if not fleet:
        return judged, [False] * len(p99)
    med = statistics.median(fleet)
    mad = statistics.median([abs(p - med) for p in fleet]) * 1.4826
    return judged, [j and p is not None and p > med + 3 * max(mad, 1e-9) and p > 1.2 * med
                    for p, j in zip(p99, judged, strict=True)]


def test_outliers_need_enough_requests_to_judge() -> None:
    """mark_outliers against the plain rule on random fleets (seeds 1-5), replica sizes around the minimum of 100
    effective requests; and the demo's case: one tenant's ~13 requests per replica judge no replica."""
    for seed in range(1, 6):
        rng = random.Random(seed)
        for _ in range(200):
            k = rng.randint(1, 12)
            n = [rng.choice([rng.randint(1, 99), 99.99, 100, rng.randint(100, 600)]) for _ in range(k)]
            p99 = [None if rng.random() < 0.05 else rng.lognormvariate(10, 0.3) * rng.choice([1, 1, 1, 3, 10])
                   for _ in range(k)]
            frame = {"replica": [f"r{i}" for i in range(k)], "n_effective": n, "p99_ms": p99}
            floats = {"n_effective": pl.Float64, "p99_ms": pl.Float64}
            got = B.mark_outliers(pl.DataFrame(frame, schema_overrides=floats))
            assert (got["judged"].to_list(), got["outlier"].to_list()) == _outliers_reference(n, p99), (seed, n, p99)
    small = B.mark_outliers(pl.DataFrame({"replica": ["a", "b", "c", "d", "e"], "n_effective": [13, 12, 17, 22, 14],
                                          "p99_ms": [9_000.0, 10_000.0, 102_000.0, 224_000.0, 11_000.0]}))
    assert not small["judged"].any() and not small["outlier"].any()
    # the same p99s with enough requests: c and d are outliers
    big = B.mark_outliers(small.drop("judged", "outlier").with_columns(pl.col("n_effective") * 10))
    assert big["outlier"].to_list() == [False, False, True, True, False]


def _peak_reference(rows: list[tuple[str, int, int]]) -> int:
    """Most intervals [a, b) of one replica covering one instant: check every start point."""
    best = 0
    for rep, a, _ in rows:
        best = max(best, sum(1 for r, s, e in rows if r == rep and s <= a < e))
    return max(best, 1)


def test_peak_concurrency_against_brute_force() -> None:
    rng = random.Random(11)
    for _ in range(40):
        rows = []
        for _ in range(rng.randint(1, 30)):
            a = rng.randint(0, 50)
            rows.append((rng.choice("xyz"), a, a + rng.randint(1, 20)))
        con = duckdb.connect()
        con.execute("CREATE TABLE requests (replica VARCHAR, start_ns BIGINT, end_ns BIGINT, queue_wait_ns BIGINT)")
        con.executemany("INSERT INTO requests VALUES (?, ?, ?, 0)", rows)
        assert B.peak_concurrency(con) == _peak_reference(rows)


def test_dimension_values_and_bounds(fleet: Path) -> None:
    con = connect(fleet)
    got = B.dimension_values(con, ("replica", "tenant"))
    assert got == {"replica": [f"replica-{i:02d}" for i in range(8)], "tenant": ["acme", "globex", "initech"]}
    lo, hi, n = B.time_bounds(con)
    assert (lo, hi, n) == tuple(con.execute("SELECT min(start_ns), max(start_ns), count(*) FROM requests"
                                            ).fetchall()[0])
    empty = duckdb.connect()
    empty.execute("CREATE TABLE requests (start_ns BIGINT)")
    assert B.time_bounds(empty) == (None, None, 0)


def _random_requests(con: duckdb.DuckDBPyConnection, seed: int, n: int = 400) -> None:
    """Tables `w` (random requests, whole adjusted counts 1-4), `x` (each row of `w` repeated adjusted_count
    times, no weights: the brute-force reference) and `u` (the rows of `w` weighing 1)."""
    rng = np.random.default_rng(seed)
    con.execute("""CREATE OR REPLACE TABLE w AS SELECT
        unnest($e) AS e2e_ns, unnest($t) AS ttft_ns, unnest($p) AS tpot_ns, unnest($s) AS status,
        unnest($r) AS replica, unnest($te) AS tenant, unnest($i) AS input_tokens, unnest($o) AS output_tokens,
        unnest($w) AS adjusted_count""", {
        "e": rng.integers(1, 10**9, n).tolist(),
        "t": [None if rng.random() < 0.1 else int(x) for x in rng.integers(1, 10**8, n)],
        "p": rng.integers(1, 10**7, n).tolist(), "s": rng.choice(list(S.OUTCOMES), n).tolist(),
        "r": rng.choice(["r0", "r1", "r2", "r3"], n).tolist(), "te": rng.choice(["acme", "beta"], n).tolist(),
        "i": rng.integers(0, 3000, n).tolist(), "o": rng.integers(0, 600, n).tolist(),
        "w": rng.integers(1, 5, n).astype(float).tolist()})
    con.execute("CREATE OR REPLACE TABLE x AS SELECT * EXCLUDE (adjusted_count, range) "
                "FROM w, range(adjusted_count::BIGINT)")
    con.execute("CREATE OR REPLACE TABLE u AS SELECT * REPLACE (1.0 AS adjusted_count) FROM w")
    con.execute("CREATE OR REPLACE TABLE v AS SELECT * EXCLUDE (adjusted_count) FROM w")


@pytest.mark.parametrize("seed", range(4))
def test_weighted_breakdowns_equal_the_expanded_rows(seed: int) -> None:
    """Whole adjusted counts: every figure equals the unweighted one over the rows repeated that many times."""
    con = duckdb.connect()
    _random_requests(con, seed)
    got, want = B.summary(con, "w", "tenant = ?", ["acme"]), B.summary(con, "x", "tenant = ?", ["acme"])
    for k in ("requests", *S.OUTCOMES):
        assert got[f"{k}_weighted"] == want[k]
    for k, v in want.items():
        if k.endswith("_ms"):
            assert got[k] == pytest.approx(v, rel=1e-12), k
    gr, wr = B.replicas(con, source="w"), B.replicas(con, source="x")
    assert gr["requests_weighted"].to_list() == wr["requests"].cast(float).to_list()
    for c in ("p50_ms", "p99_ms"):
        assert gr[c].to_list() == pytest.approx(wr[c].to_list(), rel=1e-12)
    gs, ws = B.shape(con, source="w"), B.shape(con, source="x")
    assert gs["input_tokens_bucket"].to_list() == ws["input_tokens_bucket"].to_list()
    assert gs["requests_weighted"].to_list() == ws["requests"].cast(float).to_list()
    for c in ("p50_ms", "p99_ms"):
        assert gs[c].to_list() == pytest.approx(ws[c].to_list(), rel=1e-12)
    # the low-sample rule reads Kish's effective count, not the stored rows nor what they stand for
    eff = con.execute("SELECT sum(adjusted_count) ^ 2 / sum(adjusted_count ^ 2) FROM w WHERE replica = 'r0'"
                      ).fetchall()[0][0]
    assert gr.filter(gr["replica"] == "r0")["n_effective"].item() == pytest.approx(eff, rel=1e-12)


@pytest.mark.parametrize("seed", range(2))
def test_breakdowns_with_every_weight_one_are_the_unweighted_ones(seed: int) -> None:
    con = duckdb.connect()
    _random_requests(con, seed)
    got, want = B.summary(con, "u"), B.summary(con, "v")
    assert got == want
    assert all(got[f"{k}_weighted"] == got[k] for k in ("requests", *S.OUTCOMES))
    assert B.replicas(con, source="u").equals(B.replicas(con, source="v"))
    assert B.shape(con, source="u").equals(B.shape(con, source="v"))
