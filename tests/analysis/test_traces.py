"""analysis.traces: waterfall stretches add up to the `requests` stage columns; interval subtraction; lookups."""

from __future__ import annotations

import random
from pathlib import Path

import polars as pl
import pytest

from analysis import connect
from analysis import traces as T
from analysis.engine.model import subtract
from tests import samples_cache
from tests.analysis.test_report import fleet_store
from tests.dashboard.incident_store import write_incident_store


@pytest.fixture(scope="module")
def incident(tmp_path_factory: pytest.TempPathFactory) -> Path:
    store = tmp_path_factory.mktemp("incident") / "store"
    write_incident_store(store, requests=2_000, duration_s=600.0)
    return store


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return samples_cache.built("fleet-spiky", fleet_store, tmp_path_factory)


@pytest.mark.parametrize("which", ["incident", "fleet"])
def test_waterfall_stretches_sum_to_the_stage_columns(which: str, request: pytest.FixtureRequest) -> None:
    """Per stage, the stretches drawn for a trace add up to its `requests` stage column; the rest is `other`."""
    store = request.getfixturevalue(which)
    con = connect(store)
    rows = con.sql("(SELECT * FROM requests ORDER BY e2e_ns DESC LIMIT 4) "
                   "UNION ALL (SELECT * FROM requests ORDER BY e2e_ns LIMIT 4)").pl()
    for r in rows.iter_rows(named=True):
        spans = T.waterfall(con, r["trace_id"])
        assert spans.height == con.execute("SELECT count(*) FROM spans WHERE TraceId = ?",
                                           [r["trace_id"]]).fetchall()[0][0]
        staged = spans.filter(spans["stage"].is_not_null())
        total = 0
        for row in staged.iter_rows(named=True):
            stretch_ns = sum(round(b * 1e6) - round(a * 1e6) for a, b in row["critical_stretches"])
            assert abs(stretch_ns - round(row["critical_ms"] * 1e6)) <= len(row["critical_stretches"])
        for stage, ms in staged.group_by("stage").agg(pl.col("critical_ms").sum()).iter_rows():
            assert round(ms * 1e6) == r[f"{stage}_ns"], (r["trace_id"], stage)
            total += r[f"{stage}_ns"]
        assert total + r["other_ns"] == r["e2e_ns"]


def test_waterfall_of_an_unknown_trace_is_empty(fleet: Path) -> None:
    assert T.waterfall(connect(fleet), "f" * 32).height == 0


def _covered(intervals: list[tuple[int, int]], n: int) -> set[int]:
    return {t for a, b in intervals for t in range(a, b) if 0 <= t < n}


def test_subtract_against_a_pointwise_reference() -> None:
    rng = random.Random(7)
    for _ in range(500):
        n = 40
        base = [(a, a + rng.randint(0, 15)) for a in sorted(rng.sample(range(n), 2))]
        base = [base[0]] if base[0][1] > base[1][0] else base  # disjoint, as a stage's stretch is
        holes = [(a, a + rng.randint(0, 12)) for a in (rng.randrange(n) for _ in range(rng.randint(0, 4)))]
        got = subtract(base, holes)
        assert all(b > a for a, b in got)
        assert _covered(got, n + 30) == _covered(base, n + 30) - _covered(holes, n + 30)


def test_find_requests_by_id_and_prefix(fleet: Path) -> None:
    con = connect(fleet)
    tid = con.execute("SELECT trace_id FROM requests ORDER BY trace_id LIMIT 1 OFFSET 17").fetchall()[0][0]
    assert T.find_requests(con, tid).get_column("trace_id").to_list() == [tid]
    assert T.find_requests(con, "  " + tid.upper()).get_column("trace_id").to_list() == [tid]
    prefix = tid[:8]
    want = [r[0] for r in con.execute("SELECT trace_id FROM requests WHERE starts_with(trace_id, ?) "
                                      "ORDER BY start_ns LIMIT 20", [prefix]).fetchall()]
    assert T.find_requests(con, prefix).get_column("trace_id").to_list() == want
    assert T.find_requests(con, tid[:7]).height == 0


def test_slowest_is_the_top_of_the_metric(fleet: Path) -> None:
    con = connect(fleet)
    got = T.slowest(con, "e2e", 5, where="replica = ?", params=["replica-03"])
    want = con.execute("SELECT trace_id, e2e_ns / 1e6 FROM requests WHERE replica = 'replica-03' "
                       "ORDER BY e2e_ns DESC, trace_id LIMIT 5").fetchall()
    assert list(zip(got["trace_id"], got["latency_ms"], strict=True)) == want
    assert {f"{s}_ms" for s in ("queue_wait", "decode", "other")} <= set(got.columns)
