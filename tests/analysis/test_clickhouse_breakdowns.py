"""The dashboard's analysis on ClickHouse (chdb) equals DuckDB's on the same requests: breakdowns, traces, windows.

One catalogue sample is ingested into a store and exported into an otel_traces table; every
function of analysis.clickhouse.breakdowns and analysis.clickhouse.report.explain_window is
compared with its DuckDB namesake, unfiltered and under a filter.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from analysis import breakdowns as B
from analysis import clickhouse as C
from analysis import traces as T
from analysis.clickhouse import attributes as CA
from analysis.clickhouse import breakdowns as CB
from analysis.clickhouse import report as CR
from analysis.clickhouse.export import export_store
from analysis.contract import Report
from analysis.engine.connect import connect
from analysis.engine.percentiles import parse_time
from analysis.report import build_report, explain_window
from analysis.stats import explain as X
from tests import samples_cache
from tests.sql import one

pytestmark = pytest.mark.slow  # ClickHouse (chdb) end to end on catalogue samples (make test-fast leaves it out)

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "data" / "incidents" / "slow_replica.otlp.jsonl.gz"
FACTS = "requests"
H = 3_600_000_000_000
MINUTE = 60_000_000_000



@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[duckdb.DuckDBPyConnection, Any]]:
    """(DuckDB on the store, a chdb client whose session holds the request facts in `requests`)."""
    root = tmp_path_factory.mktemp("chb")
    store = samples_cache.store(SAMPLE, tmp_path_factory)
    client = C.open_client(f"chdb:{root / 'ch'}")
    export_store(store, client, C.DEFAULT_TABLE)
    C.materialize_requests(client, C.DEFAULT_TABLE, name=FACTS)
    con = connect(store)
    yield con, client
    con.close()
    client.close()


@pytest.fixture(scope="module")
def whole(engines: tuple[duckdb.DuckDBPyConnection, Any]) -> tuple[Report, Report]:
    """The unfiltered report on the store (DuckDB) and on ClickHouse's request facts, each computed once: two tests
    read them."""
    con, client = engines
    return build_report(con), CR.build_report(client, facts=FACTS)


def _filtered(con: duckdb.DuckDBPyConnection, cond: str) -> duckdb.DuckDBPyConnection:
    cur = con.cursor()
    cur.execute(f"CREATE OR REPLACE TEMP VIEW fq AS SELECT * FROM requests WHERE {cond}")
    return cur


def same_numbers(got: dict[str, Any], want: dict[str, Any]) -> None:
    """Equal keys and values, floats within rounding (the two engines interpolate a quantile in a different order)."""
    assert got.keys() == want.keys()
    for k, v in want.items():
        assert got[k] == (pytest.approx(v, rel=1e-12) if isinstance(v, float) else v), k


def test_the_summary_of_a_sampled_table_equals_the_stores(
        engines: tuple[duckdb.DuckDBPyConnection, Any], tmp_path: Path,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """Errors all kept, successes at a quarter (ot=th recorded): weighted counts, effective counts and weighted
    percentiles agree; the weighted counts differ from the stored ones (the check can fail)."""
    from tests.sample_traces import sampled_copy as SC

    _, client = engines
    whole = samples_cache.store(SAMPLE, tmp_path_factory)
    copy = SC.write_store(tmp_path / "copy", SC.consistent_sample(
        SC.read_spans(whole), lambda r: 1.0 if r["Outcome"] != "ok" else 0.25))
    export_store(copy, client, "otel_sampled")
    C.materialize_requests(client, "otel_sampled", name="sampled_requests")
    con = connect(copy)
    want = B.summary(con)
    con.close()
    got = CB.summary(client, "sampled_requests")
    same_numbers(got, want)
    assert got["ok_weighted"] != got["ok"] and got["error_weighted"] == got["error"], got
    con = connect(copy)
    try:
        assert_frame_equal(CB.replicas(client, "sampled_requests"), B.replicas(con), check_dtypes=False)
        assert_frame_equal(CB.shape(client, "sampled_requests"), B.shape(con), check_dtypes=False)
        assert B.replicas(con)["requests_weighted"].to_list() != B.replicas(con)["requests"].to_list()
    finally:
        con.close()


def test_token_buckets_on_clickhouse_equal_bucket_bounds(engines: tuple[duckdb.DuckDBPyConnection, Any]) -> None:
    """The server's power-of-two buckets against explain.bucket_bounds: powers of two, their neighbours, random."""
    _, client = engines
    rng = random.Random(7)
    xs = sorted({0, 1, 2, 3, *(v for k in range(1, 50) for v in (2 ** k - 1, 2 ** k, 2 ** k + 1)),
                 *(rng.randrange(1, 2 ** 40) for _ in range(500))})
    lo, hi = CB._bucket_bounds_sql("x")
    got = client.query(f"SELECT x, {lo} AS lo, {hi} AS hi FROM (SELECT arrayJoin({xs}) AS x) ORDER BY x").to_pylist()
    assert [(r["lo"], r["hi"]) for r in got] == [X.bucket_bounds(x) for x in xs]


FILTERS = ["TRUE", "replica IN ('replica-07', 'replica-05', 'replica-11')", "status = 'ok' AND start_ns % 3 != 0"]


@pytest.mark.parametrize("cond", FILTERS)
def test_breakdowns_equal_duckdbs(engines: tuple[duckdb.DuckDBPyConnection, Any], cond: str) -> None:
    con, client = engines
    cur = _filtered(con, cond)
    same_numbers(CB.summary(client, FACTS, cond), B.summary(cur, "fq"))
    requests = CB.summary(client, FACTS, cond)["requests"]
    assert requests is not None and requests > 0
    assert CB.time_bounds(client, FACTS) == B.time_bounds(con)
    dims = ["replica", "model", "tenant", "service"]
    assert CB.dimension_values(client, FACTS, dims) == B.dimension_values(con, dims)
    for metric in ("e2e", "ttft"):
        got, want = CB.slowest(client, FACTS, metric, 40, cond), T.slowest(cur, metric, 40, "fq")
        assert_frame_equal(got.with_columns(pl.col("start").dt.replace_time_zone(None)), want, check_dtypes=False)
        assert_frame_equal(CB.replicas(client, FACTS, metric, cond), B.replicas(cur, metric, "fq"), check_dtypes=False)
        for by in (B.TOKEN_COLUMNS, ("output_tokens",)):
            assert_frame_equal(CB.shape(client, FACTS, metric, by, cond), B.shape(cur, metric, by, "fq"),
                               check_dtypes=False)


def test_an_empty_selection_gives_no_numbers(engines: tuple[duckdb.DuckDBPyConnection, Any]) -> None:
    con, client = engines
    got = CB.summary(client, FACTS, "FALSE")
    same_numbers(got, B.summary(_filtered(con, "FALSE"), "fq"))
    assert got["requests"] == 0 and got["e2e_p99_ms"] is None
    assert CB.slowest(client, FACTS, "e2e", 10, "FALSE").height == 0


def test_trace_lookup_and_waterfall_equal_duckdbs(engines: tuple[duckdb.DuckDBPyConnection, Any]) -> None:
    con, client = engines
    ids = [r[0] for r in con.execute("SELECT trace_id FROM requests ORDER BY e2e_ns DESC LIMIT 3").fetchall()]
    for tid in ids:
        for key in (tid, tid[:9].upper(), tid[:7]):
            got, want = CB.find_requests(client, FACTS, key), T.find_requests(con, key)
            assert got.height == want.height and got.height == (0 if len(key) < 8 else 1)
            assert got.get_column("trace_id").to_list() == want.get_column("trace_id").to_list()
        start = int(one(con, "SELECT start_ns FROM requests WHERE trace_id = ?", [tid])[0])
        hour = start // H * H
        got_w = CB.waterfall(client, tid, hour, hour + 2 * H)
        assert got_w.height > 1
        assert_frame_equal(got_w, T.waterfall(con, tid))
    assert CB.waterfall(client, "0" * 32, 0, 2 * H).height == 0


def test_literals_survive_quotes_and_backslashes(engines: tuple[duckdb.DuckDBPyConnection, Any]) -> None:
    _, client = engines
    rng = random.Random(3)
    for _ in range(50):
        text = "".join(rng.choice("ab'\\\"\n\t%_é") for _ in range(rng.randint(0, 12)))
        assert client.query(f"SELECT {CB.literal(text)} AS v").to_pylist()[0]["v"] == text
    cond = CB.condition(5, 9, {"replica": ("a'b", "c\\d"), "model": ()})
    assert cond == "TRUE AND start_ns >= 5 AND start_ns < 9 AND replica IN ('a\\'b', 'c\\\\d')"


@pytest.mark.parametrize("cond", FILTERS[:2])
def test_any_window_is_explained_as_on_duckdb(engines: tuple[duckdb.DuckDBPyConnection, Any],
                                              whole: tuple[Report, Report], cond: str) -> None:
    """The detected spike, windows overlapping it, one before it, and one with no request."""
    con, client = engines
    cur = _filtered(con, cond)
    report = build_report(cur, source="fq")
    assert (whole[1] if cond == "TRUE" else CR.build_report(client, facts=FACTS, where=cond)) == report
    spike = whole[0]["spikes"][0]
    a, b = parse_time(spike["start"]), parse_time(spike["end"])
    assert a is not None and b is not None
    m = 60_000_000_000
    for lo, hi in [(a, b), (a - 2 * m, a + m), (a + m // 2, b + 3 * m), (a - 9 * m, a - 6 * m), (1, 2)]:
        want = explain_window(cur, lo, hi, source="fq")
        got = CR.explain_window(client, C.DEFAULT_TABLE, lo, hi, facts=FACTS, where=cond)
        assert got == want, (lo, hi)
    assert CR.explain_window(client, C.DEFAULT_TABLE, a, b, facts=FACTS)["detected"] is True
    ttft = CR.explain_window(client, C.DEFAULT_TABLE, a, b, metric="ttft", facts=FACTS)
    assert ttft == explain_window(con, a, b, metric="ttft")
    # a named source explains alike (its snapshot keeps span_id, which the noisy-neighbour step joins on)
    assert explain_window(con, a, b, metric="ttft", source="requests") == ttft


def test_token_buckets_on_the_server_code_as_explain_does(engines: tuple[duckdb.DuckDBPyConnection, Any]) -> None:
    _, client = engines
    rng = random.Random(5)
    xs: list[int | None] = [None, -3, -1, 0, 1, 2, 3]
    xs += [v for k in range(1, 62) for v in ((1 << k) - 1, 1 << k, (1 << k) + 1)]
    xs += [rng.randint(0, 1 << rng.randint(1, 40)) for _ in range(300)]
    got = client.query("SELECT " + CA.bucket_code_sql("x") + " AS c FROM (SELECT arrayJoin(["
                       + ", ".join("NULL" if x is None else f"toInt64({x})" for x in xs) + "]) AS x)").to_pylist()
    want = X.code_dimension(pl.DataFrame({"input_tokens": xs}, schema={"input_tokens": pl.Int64}), "input_tokens")
    assert [r["c"] for r in got] == want.codes.tolist()


def test_counterfactuals_on_the_server_equal_the_whole_baseline_in_memory(
        engines: tuple[duckdb.DuckDBPyConnection, Any], whole: tuple[Report, Report],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With the store's top slice never enough (so every counterfactual there sorts the whole baseline without the
    candidate), the store's report equals ClickHouse's, whose baseline p99 with and without each candidate is an
    exact quantile on the server (clickhouse.report._ServerTail)."""
    con, _ = engines
    monkeypatch.setattr(X.TailQuantile, "without_candidate", lambda self, coded, cand: math.nan)
    want = build_report(con)
    assert want["spikes"] and any(d["explained"] is not None for d in want["spikes"][0]["dimensions"])
    assert whole[1] == want


@pytest.mark.parametrize("cond", FILTERS)
def test_the_replayed_workload_equals_the_stores(engines: tuple[duckdb.DuckDBPyConnection, Any], cond: str) -> None:
    """What-if and Capacity read the same arrivals, services, slots, replicas and cold start on both engines."""
    from analysis.capacity import observed_workload

    con, client = engines
    first, last, _ = B.time_bounds(con)
    assert first is not None and last is not None
    local = duckdb.connect(":memory:")  # the store's requests under the filter, as the dashboard's cursor has them
    local.register("r", con.sql(f"SELECT * FROM requests WHERE {cond}").to_arrow_table())
    local.register("s", con.sql("SELECT * FROM spans").to_arrow_table())
    local.execute("CREATE VIEW requests AS SELECT * FROM r")
    local.execute("CREATE VIEW spans AS SELECT * FROM s")
    for since, until in ((None, None), (first + 4 * MINUTE, last - 3 * MINUTE)):
        where = cond + "".join(f" AND start_ns {op} {t}" for op, t in ((">=", since), ("<", until)) if t is not None)
        got = CB.workload(client, FACTS, C.DEFAULT_TABLE, where, since, until)
        want = observed_workload(local, since, until)
        assert got.arrivals.size > 0
        for field in ("arrivals", "services", "ttft_rest"):
            assert np.array_equal(getattr(got, field), getattr(want, field), equal_nan=True), field
        assert (got.slots, got.observed_replicas, got.cold_start_ns, got.span_ns, got.sampled) == \
            (want.slots, want.observed_replicas, want.cold_start_ns, want.span_ns, want.sampled)
    local.close()


def test_the_cold_start_comes_from_the_servers_spans(engines: tuple[duckdb.DuckDBPyConnection, Any],
                                                     tmp_path_factory: pytest.TempPathFactory) -> None:
    """On the cold-start incident the model_load spans read on the server give the store's cold start."""
    from analysis.capacity import observed_workload

    _, client = engines
    store = samples_cache.store(SAMPLE.with_name("cold_start.otlp.jsonl.gz"), tmp_path_factory)
    export_store(store, client, "otel_cold")
    C.materialize_requests(client, "otel_cold", name="cold_requests")
    con = connect(store)
    first, last, _ = B.time_bounds(con)
    assert first is not None and last is not None
    for since, until in ((None, None), (first + 4 * MINUTE, last)):
        where = "".join(f" AND start_ns {op} {t}" for op, t in ((">=", since), ("<", until)) if t is not None)
        got = CB.workload(client, "cold_requests", "otel_cold", "TRUE" + where, since, until)
        want = observed_workload(con, since, until)
        assert want.cold_start_ns is not None and got.cold_start_ns == want.cold_start_ns
        assert np.array_equal(got.arrivals, want.arrivals) and np.array_equal(got.services, want.services)
        assert (got.slots, got.observed_replicas) == (want.slots, want.observed_replicas)
    con.close()
