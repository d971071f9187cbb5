"""analysis.stats.verdicts and analysis.stats.batching: what a view may claim, checked against the real detector and
breakdowns on real DuckDB tables."""

from __future__ import annotations

import duckdb
import numpy as np
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
