"""What a ClickHouse (chdb) report returns, query by query, as the requests grow: the pair store (tests/analysis/
test_attributes.py) at 600 and at 1,200 requests a window, the same windows, replicas, tenants and cause. Its report
equals the store's at both rates (test_clickhouse_attributes.py); here, what comes back: the stage shares and the
local comparison as one row of means a tail (no span, no row of the local baseline's windows), every answer of
figures the same size at both rates, and the request rows of the spike's own windows only. The full target, no
answer growing with the requests, is a stated miss (xfail, strict): the spike windows' request rows still come back,
and so do the detection's groups of tied values above the pooled p99 (one row a group; its values above the p99 no
longer come back: the scan's ranks and scores are counted on the server, the same floats as over the values)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from analysis.clickhouse.export import export_store
from analysis.clickhouse.report import STAGES_TEMP, _ServerValues
from analysis.clickhouse.report import build_report as ch_report
from analysis.stats import spikes as SP
from tests.analysis.test_attributes import pair_store

pytestmark = pytest.mark.slow  # ClickHouse (chdb) end to end

RATES = (600, 1200)
#: Answers that grow with the requests, by the start of their SQL: the spike windows' facts, the detection's groups
#: of tied values above the pooled p99 (a row a group of two or more equal values: this store's values are coarse),
#: and spans (the explanation pulls them only for the noisy-neighbour step, which this store's decode-led spike does
#: not run).
REQUEST_ROWS = "SELECT trace_id, span_id, start_ns, e2e_ns"
DETECTION_TIES = "SELECT lo_rank, c FROM"
SPANS = "SELECT TimestampNs, TraceId"


class _Logging:
    """A client keeping each query's SQL (whitespace folded) and the rows it returned."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.dsn = inner, inner.dsn
        self.answers: list[tuple[str, int]] = []
        #: per answer, the columns holding a value (not every row null)
        self.valued: list[set[str]] = []

    def query(self, sql: str, settings: dict[str, Any] | None = None) -> pa.Table:
        out = self.inner.query(sql, settings)
        self.answers.append((" ".join(sql.split()), out.num_rows))
        self.valued.append({c for c, col in zip(out.column_names, out.columns, strict=True)
                            if col.null_count < out.num_rows})
        return out

    def command(self, sql: str) -> None:
        self.inner.command(sql)


#: The columns of the request rows that come back holding values: of the built-in dimensions only those the
#: noisy-neighbour step reads (every dimension is counted on the server).
VALUED_ROW_COLUMNS = {"trace_id", "span_id", "start_ns", "e2e_ns", "status", "replica", "tenant", "adjusted_count"}


@pytest.fixture(scope="module")
def logs(chdb_client: Any, tmp_path_factory: pytest.TempPathFactory) -> list[_Logging]:
    """Each rate's report, its answers logged."""
    root = tmp_path_factory.mktemp("rows")
    each = []
    for per_window in RATES:
        table = f"t_rows_{per_window}"
        export_store(pair_store(root / f"pairs-{per_window}", per_window), chdb_client, table)
        logged = _Logging(chdb_client)
        got = ch_report(logged, table, window_s=60)
        assert [(s["requests"], s["windows"]) for s in got["spikes"]] == [(2 * per_window, 2)]
        assert got["spikes"][0]["stages"][0]["stage"] == "decode"
        each.append(logged)
    return each


@pytest.fixture(scope="module")
def answers(logs: list[_Logging]) -> list[list[tuple[str, int]]]:
    """Each rate's report answers, in order."""
    return [logged.answers for logged in logs]


def test_the_request_rows_carry_no_dimension_the_server_explains(logs: list[_Logging]) -> None:
    for logged in logs:
        valued = [v for (sql, _), v in zip(logged.answers, logged.valued, strict=True) if _is(sql, REQUEST_ROWS)]
        assert valued and set().union(*valued) == VALUED_ROW_COLUMNS


def _is(sql: str, start: str) -> bool:
    return sql.startswith(start)


def test_only_the_spike_windows_requests_grow_and_the_stages_come_back_as_means(
        answers: list[list[tuple[str, int]]]) -> None:
    low, high = answers
    assert len(low) == len(high)
    for (sql, a), (_, b) in zip(low, high, strict=True):
        if _is(sql, REQUEST_ROWS):  # the spike's two windows, row by row: not the local baseline's windows
            assert (a, b) == (2 * RATES[0], 2 * RATES[1]), sql[:120]
        elif _is(sql, DETECTION_TIES):  # fewer than the values above the pooled p99 (about 1 %): stated below
            assert 0 < a <= 0.01 * 10 * RATES[0] + 1 and 0 < b <= 0.01 * 10 * RATES[1] + 1, (a, b)
        else:
            assert a == b, (a, b, sql[:160])
    assert not [s for s, _ in low + high if _is(s, SPANS)]  # the stage shares read no span here
    means = [n for s, n in low + high if f"FROM {STAGES_TEMP}" in s]
    assert means == [2, 2]  # one row of stage means a tail (the spike's, the local baseline's) at each rate
    assert sum(1 for s, _ in low if _is(s, REQUEST_ROWS)) == 1


@pytest.mark.xfail(strict=True, reason="the spike windows' request rows and the detection's groups of tied values "
                                       "above the pooled p99 still come back, so they grow with the requests")
def test_no_answer_grows_with_the_requests(answers: list[list[tuple[str, int]]]) -> None:
    low, high = answers
    assert [n for _, n in low] == [n for _, n in high]


def test_the_scan_reads_the_same_floats_from_the_servers_counts(chdb_client: Any) -> None:
    """The detection's values above its threshold as the scan reads them, from the server's counts
    (`_ServerValues.exceedances`: per window, per group of ties, per block of scores) and from the values in memory
    (spikes.SortedValues, the DuckDB report's): the same counts, scores and per-window sums, bit for bit, on random
    values with many ties (a few distinct ones, or ns-like ones), some windows not judged, seeds 1-5."""
    chdb_client.command("CREATE TABLE scan_values (start_ns Int64, e2e_ns Int64) ENGINE = Memory")
    w = 1_000
    for seed in (1, 2, 3, 4, 5):
        rng = np.random.default_rng(seed)
        for _ in range(4):
            windows = int(rng.integers(2, 9))
            n = rng.integers(1, 400, windows)
            start = np.concatenate([x * w + rng.integers(0, w, m) for x, m in enumerate(n.tolist())])
            value = rng.integers(1, int(rng.choice([4, 60, 10**9])) + 1, start.size)
            chdb_client.command("TRUNCATE TABLE scan_values")
            chdb_client.command("INSERT INTO scan_values VALUES " + ", ".join(
                f"({a}, {b})" for a, b in zip(start.tolist(), value.tolist(), strict=True)))
            server = _ServerValues(chdb_client, "scan_values", "TRUE", "e2e_ns", None, w)
            server.windows()
            order = np.lexsort((value, start // w))
            first = np.concatenate([[0], np.cumsum(n)[:-1]]).astype(np.int64)
            memory = SP.SortedValues(value[order].astype(np.float64), first, n.astype(np.int64))
            judged = rng.random(windows) < 0.8
            for threshold in (float(np.quantile(value, 0.9)), float(np.quantile(value, 0.5)) + 0.5, 0.0):
                got, want = server.exceedances(threshold, judged), memory.exceedances(threshold, judged)
                assert np.array_equal(got.exceed, want.exceed), (seed, threshold)
                assert np.array_equal(got.scores, want.scores), (seed, threshold)
                assert np.array_equal(got.score_sum, want.score_sum), (seed, threshold)
