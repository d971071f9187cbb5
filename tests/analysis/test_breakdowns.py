"""analysis.breakdowns against independent numpy / brute-force references."""

from __future__ import annotations

import random
from pathlib import Path

import duckdb
import numpy as np
import pytest

from analysis import breakdowns as B
from analysis import connect
from analysis.explain import bucket_bounds
from tests.analysis.test_report import SLOW_REPLICA, fleet_store
from tracing import schema as S


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fleet_store(tmp_path_factory.mktemp("fleet"))


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
