"""analysis.stats.verdicts and analysis.stats.batching: what a view may claim, checked against the real detector and
breakdowns on real DuckDB tables."""

from __future__ import annotations

from collections.abc import Sequence

import duckdb
import numpy as np
import polars as pl
import pytest

from analysis.engine.percentiles import NICE_WINDOWS_S, auto_window_s
from analysis.stats import verdicts as V
from analysis.stats.batching import service_vs_batch
from analysis.stats.spikes import detect

NS = 1_000_000_000


def test_detection_window_known_answers() -> None:
    assert V.detection_window_s(14_448, 1_800.0) == 120  # the report's own window: ~960 requests each
    assert V.detection_window_s(429, 1_800.0) is None  # one tenant of the demo: no window size can judge it
    assert V.detection_window_s(6_000, 1_800.0) == 300  # wider than the report's 120 s (400 each), 6 windows fit
    assert V.detection_window_s(0, 1_800.0) is None
    assert V.detection_window_s(10, 0.0) is None


def _reference(requests: int, span_s: float) -> int | None:
    """The rule written plainly: every candidate (the report's window, then each wider nice size) in order."""
    auto = auto_window_s(requests, span_s)
    for w in [auto, *(n for n in NICE_WINDOWS_S if n > auto)]:
        if requests * w / span_s >= V.MEAN_WINDOW_REQUESTS:
            return w if w == auto or span_s / w >= V.MIN_JUDGED_WINDOWS else None
    return None


def test_detection_window_matches_the_reference_and_lets_the_detector_judge() -> None:
    rng = np.random.default_rng(1)
    for _ in range(300):
        requests = int(rng.integers(1, 40_000))
        span_s = float(rng.choice([600.0, 1_800.0, 3_600.0, 6 * 3_600.0])) * float(rng.uniform(0.5, 1.5))
        assert V.detection_window_s(requests, span_s) == _reference(requests, span_s), (requests, span_s)
    # the window chosen is one at which the real detector judges steady traffic; None is one where it cannot
    for seed in range(1, 6):
        rng = np.random.default_rng(seed)
        for requests in (1_500, 2_400, 5_000, 12_000):
            span_s = 1_800.0
            start = np.sort(rng.uniform(0, span_s, requests) * NS).astype(np.int64)
            values = rng.lognormal(22, 0.4, requests)
            w = V.detection_window_s(requests, span_s)
            det = detect(start, values, round((w or auto_window_s(requests, span_s)) * NS))
            too_few = det.note.startswith("too few windows with enough requests")
            assert too_few == (w is None), (seed, requests, w, det.note)


def test_not_judged_reads_the_reports_reason() -> None:
    assert V.not_judged({"errors": []}) is None
    assert V.not_judged({"errors": ["could not compute spikes because too few windows (2 windows with >= 500 "
                                    "requests)"]}) == "too few windows (2 windows with >= 500 requests)"
    assert V.not_judged({"errors": ["could not explain one spike because x"]}) is None


def test_against_baseline() -> None:
    assert V.against_baseline({"p99_ms": 12_000.0, "baseline_p99_ms": 17_000.0}) == "at or below"
    assert V.against_baseline({"p99_ms": 17_000.0, "baseline_p99_ms": 17_000.0}) == "at or below"
    assert V.against_baseline({"p99_ms": 18_000.0, "baseline_p99_ms": 17_000.0}) == "slightly above"
    assert V.against_baseline({"p99_ms": 20_400.0, "baseline_p99_ms": 17_000.0}) == "above"
    assert V.against_baseline({"p99_ms": None, "baseline_p99_ms": 17_000.0}) == "unknown"


@pytest.fixture()
def fleet() -> duckdb.DuckDBPyConnection:
    """8 replicas of 400 requests; replica-3's tyrell requests (10%) are 6x slower; replica-6 is slow for everyone."""
    rng = np.random.default_rng(3)
    con = duckdb.connect()
    rows = []
    tenants = ["acme", "globex", "initech", "hooli", "stark", "wayne", "umbrella", "tyrell"]
    for r in range(8):
        for i in range(400):
            tenant = "tyrell" if i % 10 == 0 else tenants[i % 7]
            ms = rng.lognormal(np.log(1_000), 0.3)
            if r == 3 and tenant == "tyrell":
                ms *= 6
            if r == 6:
                ms *= 3
            rows.append((f"replica-{r}", tenant, "m", "v1", "svc", int(ms * 1e6), "ok"))
    con.execute("CREATE TABLE requests (replica VARCHAR, tenant VARCHAR, model VARCHAR, model_version VARCHAR, "
                "service VARCHAR, e2e_ns BIGINT, status VARCHAR)")
    con.executemany("INSERT INTO requests VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
    return con


def test_outlier_replica_explained_by_a_tenant(fleet: duckdb.DuckDBPyConnection) -> None:
    from analysis.breakdowns import replicas

    flagged = replicas(fleet).filter("outlier").get_column("replica").to_list()
    assert flagged == ["replica-3", "replica-6"]
    found = V.outlier_explanations(fleet)
    assert [(e["replica"], e["dimension"], e["value"]) for e in found] == [("replica-3", "tenant", "tyrell")]
    e = found[0]
    assert e["requests"] == 400 and e["requests_without"] == 360
    assert e["p99_without_ms"] < e["p99_ms"]
    # under a filter that leaves no outlier, nothing is explained
    assert V.outlier_explanations(fleet, where="replica <> 'replica-3' AND replica <> 'replica-6'") == []


def _per_value(con: duckdb.DuckDBPyConnection, metric: str, where: str, params: Sequence[object]) -> list[dict]:
    """Outlier explanations as they were first written: the values tried, then one `replicas` query per value."""
    from analysis.breakdowns import replicas

    by_replica = replicas(con, metric, "requests", where, params)
    outliers = by_replica.filter("outlier").get_column("replica").to_list()
    if not outliers:
        return []
    values = {}
    for dim in V.OUTLIER_DIMENSIONS:
        rows = con.execute(f"SELECT {dim}, count(*) AS n FROM requests WHERE ({where}) AND coalesce(replica, "
                           f"'(none)') IN (SELECT unnest(?)) AND {dim} IS NOT NULL GROUP BY 1 ORDER BY n DESC, 1 "
                           f"LIMIT {V.OUTLIER_VALUES}", [*params, outliers]).fetchall()
        values[dim] = [v for v, _ in rows]
    return V.explain_outliers(by_replica, lambda dim, value: replicas(
        con, metric, "requests", f"({where}) AND {dim} IS DISTINCT FROM ?", [*params, value]), values)


def _random_fleet(seed: int, weighted: bool = False) -> duckdb.DuckDBPyConnection:
    """Replicas (some requests without one) serving tenants, models, versions and services (some missing); one
    replica's requests of one tenant and one of one model slow, one replica slow for all; some metrics missing."""
    rng = np.random.default_rng(seed)
    n = 4_000
    reps = [f"r{i}" for i in range(int(rng.integers(6, 11)))]

    def pick(vals: list[str], missing: float) -> list[str | None]:
        return [None if rng.random() < missing else str(v) for v in rng.choice(vals, n)]

    replica = pick(reps, 0.02)
    tenant = pick(["acme", "globex", "initech", "hooli", "tyrell"], 0.05)
    model = pick(["m1", "m2", "m3"], 0.0)
    version, service = pick(["v1", "v2"], 0.1), pick(["a", "b"], 0.0)
    e2e = rng.lognormal(np.log(1e9), 0.3, n)
    slow_t, slow_m, slow_all = rng.choice(reps, 3, replace=False)
    tyrell, m3 = rng.choice(["acme", "tyrell"]), rng.choice(["m2", "m3"])
    for i in range(n):
        e2e[i] *= (6 if replica[i] == slow_t and tenant[i] == tyrell else 1) * (
            5 if replica[i] == slow_m and model[i] == m3 else 1) * (3 if replica[i] == slow_all else 1)
    ttft = e2e * rng.uniform(0.05, 0.3, n)
    frame = pl.DataFrame({  # noqa: F841 (read by the SQL below)
        "start_ns": np.arange(n, dtype=np.int64) * 1_000_000, "replica": replica, "tenant": tenant, "model": model,
        "model_version": version, "service": service,
        "e2e_ns": pl.Series(e2e.astype(np.int64)).set(pl.Series(rng.random(n) < 0.02), None),
        "ttft_ns": pl.Series(ttft.astype(np.int64)).set(pl.Series(rng.random(n) < 0.2), None),
        "status": np.where(rng.random(n) < 0.97, "ok", "error"),
        "adjusted_count": np.where(weighted & (rng.random(n) < 0.3), 2.0, 1.0)})
    con = duckdb.connect()
    con.execute("CREATE TABLE requests AS SELECT * FROM frame")
    return con


def test_outlier_explanations_in_one_query_equal_one_query_per_value() -> None:
    """On random fleets (seeds 1-5), every metric and filter: each value's per-replica counts and p99 from the
    grouped query equal `replicas` with that value left out (under two conditions, one leaving no request), and
    the explanations equal the per-value ones; a sampled fleet (weights) keeps the per-value path and its answer."""
    from analysis.breakdowns import replicas

    found = 0
    for seed in range(1, 6):
        con = _random_fleet(seed)
        for metric, where, params in (("e2e", "true", []), ("ttft", "true", []),
                                      ("e2e", "start_ns >= ?", [400_000_000]), ("e2e", "tenant <> ?", ["hooli"]),
                                      ("e2e", "model = ?", ["m1"])):  # leaving out m1 leaves no request
            got = V.outlier_explanations(con, metric, "requests", where, params)
            assert got == _per_value(con, metric, where, params), (seed, metric, where)
            found += len(got)
            if metric != "e2e" or where not in ("true", "model = ?"):
                continue
            values = {dim: [r[0] for r in con.execute(f"SELECT DISTINCT {dim} FROM requests WHERE {dim} IS NOT "
                                                      f"NULL ORDER BY 1").fetchall()] for dim in V.OUTLIER_DIMENSIONS}
            grouped = V.replicas_without(con, metric, "requests", where, params, values)
            for dim, vals in values.items():
                for value in vals:
                    want = replicas(con, metric, "requests", f"({where}) AND {dim} IS DISTINCT FROM ?",
                                    [*params, value]).select("replica", "requests", "n_effective", "p99_ms")
                    assert grouped[(dim, value)].equals(want), (seed, metric, where, dim, value)
        if seed == 1:  # sampled: the per-value path, whose weighted quantiles the grouped query does not compute
            weighted = _random_fleet(seed, weighted=True)
            assert V.outlier_explanations(weighted) == _per_value(weighted, "e2e", "true", [])
    assert found >= 10  # the planted tenant and model explain their replicas in most cases


def test_service_vs_batch_known_answer() -> None:
    """Replica a serves 100 requests one at a time (1 s each); replica b serves 100 triples at once (2 s each)."""
    con = duckdb.connect()
    rows = [(f"a{i:04d}", "s", "a", i * 2 * NS, NS, 0) for i in range(100)]
    rows += [(f"b{i:04d}{j}", "s", "b", i * 3 * NS, 2 * NS, 0) for i in range(100) for j in range(3)]
    con.execute("CREATE TABLE requests (trace_id VARCHAR, span_id VARCHAR, replica VARCHAR, start_ns BIGINT, "
                "e2e_ns BIGINT, queue_wait_ns BIGINT)")
    con.executemany("INSERT INTO requests VALUES (?, ?, ?, ?, ?, ?)", rows)
    rel = service_vs_batch(con)
    assert rel is not None
    assert (rel["small_batch"], rel["large_batch"]) == (1.0, 3.0)
    assert (rel["small_service_ms"], rel["large_service_ms"]) == (1_000.0, 2_000.0)
    assert rel["growth"] == pytest.approx(1.0) and rel["grows"]
    assert rel["compared"] == 400
    # one batch size everywhere: the traces cannot show a relation
    con.execute("DELETE FROM requests WHERE replica = 'b'")
    assert service_vs_batch(con) is None


def test_service_vs_batch_matches_a_brute_force_count_on_random_traffic() -> None:
    """Each request's batch counted pair by pair (who is serving when it enters service), then the sizes compared:
    the smallest and largest joined by 50 requests or more."""
    for seed in range(1, 6):
        rng = np.random.default_rng(seed)
        n = 600
        start = np.sort(rng.integers(0, 600 * NS, n))
        wait = rng.integers(0, 2 * NS, n) * (rng.random(n) < 0.3)
        e2e = wait + rng.integers(NS // 2, 8 * NS, n)
        replica = rng.choice(["a", "b", "c"], n)
        con = duckdb.connect()
        con.execute("CREATE TABLE requests (trace_id VARCHAR, span_id VARCHAR, replica VARCHAR, start_ns BIGINT, "
                    "e2e_ns BIGINT, queue_wait_ns BIGINT)")
        con.executemany("INSERT INTO requests VALUES (?, ?, ?, ?, ?, ?)",
                        [(f"t{i}", "s", str(replica[i]), int(start[i]), int(e2e[i]), int(wait[i])) for i in range(n)])
        busy, end = start + wait, start + e2e
        batch = np.array([sum(1 for j in range(n) if replica[j] == replica[i] and busy[j] <= busy[i] < end[j])
                          for i in range(n)])
        sizes = [b for b in sorted(set(batch.tolist())) if (batch == b).sum() >= 50]
        lo, hi = sizes[0], sizes[-1]
        service = (e2e - wait) / 1e6
        got = service_vs_batch(con)
        assert got is not None and lo < hi
        assert got["small_service_ms"] == pytest.approx(float(np.median(service[batch == lo])))
        assert got["large_service_ms"] == pytest.approx(float(np.median(service[batch == hi])))
        assert (got["small_batch"], got["large_batch"]) == (float(lo), float(hi))
        assert got["compared"] == int((batch == lo).sum() + (batch == hi).sum())
