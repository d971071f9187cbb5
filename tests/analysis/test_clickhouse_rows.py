"""What comes back from the ClickHouse report (chdb), measured on the decode-tail incident (tests/analysis/
test_attributes.py) at 600 and at 1,200 requests a window, the same windows, replicas, tenants and cause. Its report
equals the store's at both rates (test_clickhouse_attributes.py); here, what comes back: no request row (the spike
windows' requests stay on the server: each figure the explanation reads of them is asked there, `_ServerSpikeRows`,
checked against the rows in memory below), the stage shares and the local comparison as one row of means a tail (no
span), and every answer the same size at both rates: the detection's values above the pooled p99 on this store's
coarse values come back as one row of its blocks of scores (`_ServerValues._blocks`, checked against the values in
memory below), not a row per group of tied values. Not covered here: the noisy-neighbour step (only when queue_wait
leads, not on this decode-led store) still pulls its windows' rows and spans."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from analysis import connect
from analysis.clickhouse import attributes as CA
from analysis.clickhouse.client import Client
from analysis.clickhouse.export import export_store
from analysis.clickhouse.report import STAGES_TEMP, _ServerSpikeRows, _ServerValues
from analysis.clickhouse.report import build_report as ch_report
from analysis.report import build_report
from analysis.stats import attributes as A
from analysis.stats import explain as X
from analysis.stats import spikes as SP
from analysis.stats.spikes import Spike
from tests.analysis.recording import Passing
from tests.analysis.test_attributes import pair_store
from tests.analysis.test_neighbours import fleet

pytestmark = pytest.mark.slow  # ClickHouse (chdb) end to end

RATES = (600, 1200)
#: Answers that would grow with the requests, by the start of their SQL: the request facts (of the spike windows, when
#: the attribute pass failed), every group of tied values above the detection's pooled p99 (a row a group of two or
#: more equal values: asked only when the server's blocks fail the client's check), and spans (no step of the report
#: pulls them now).
REQUEST_ROWS = "SELECT trace_id, span_id, start_ns, e2e_ns"
DETECTION_TIES = "SELECT lo_rank, c FROM"
SPANS = "SELECT TimestampNs, TraceId"
#: The detection's blocks of scores: one row (`_ServerValues._blocks`).
DETECTION_BLOCKS = "SELECT k, arrayMap(j -> lo[j]"


class _Logging(Passing):
    """A client keeping each query's SQL (whitespace folded) and the rows it returned."""

    def __init__(self, inner: Client) -> None:
        super().__init__(inner)
        self.answers: list[tuple[str, int]] = []

    def query(self, sql: str, settings: dict[str, Any] | None = None) -> pa.Table:
        out = self.inner.query(sql, settings)
        self.answers.append((" ".join(sql.split()), out.num_rows))
        return out


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


def _is(sql: str, start: str) -> bool:
    return sql.startswith(start)


def test_no_answer_grows_with_the_requests(answers: list[list[tuple[str, int]]]) -> None:
    low, high = answers
    assert len(low) == len(high)
    for (sql, a), (_, b) in zip(low, high, strict=True):
        assert a == b, (a, b, sql[:160])
    assert not [s for s, _ in low + high if _is(s, REQUEST_ROWS) or _is(s, SPANS) or _is(s, DETECTION_TIES)]
    assert [n for s, n in low + high if _is(s, DETECTION_BLOCKS)] == [1, 1]
    means = [n for s, n in low + high if f"FROM {STAGES_TEMP}" in s]
    assert means == [2, 2]  # one row of stage means a tail (the spike's, the local baseline's) at each rate
    # the exemplars: the only answer of trace ids, MAX_EXEMPLARS of them
    assert [n for s, n in low if s.startswith("SELECT toString(trace_id) AS t FROM")] == [X.MAX_EXEMPLARS]


def test_the_scan_reads_the_same_floats_from_the_servers_counts(chdb_client: Any,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The detection's values above its threshold as the scan reads them, from the server's counts
    (`_ServerValues.exceedances`: per window, per block of scores, the blocks found on the server and checked on the
    client from the groups of ties at their edges) and from the values in memory (spikes.SortedValues, the DuckDB
    report's): the same counts, scores and per-window sums, bit for bit, on random values with many ties (a few
    distinct ones, or ns-like ones), some windows not judged, seeds 1-5; with the server's blocks refused too (every
    group of ties asked then)."""
    logged = _Logging(chdb_client)
    logged.command("CREATE TABLE scan_values (start_ns Int64, e2e_ns Int64) ENGINE = Memory")
    w = 1_000
    refused = []
    for seed in (1, 2, 3, 4, 5):
        rng = np.random.default_rng(seed)
        for case in range(3):
            windows = int(rng.integers(2, 9))
            n = rng.integers(1, 400, windows)
            start = np.concatenate([x * w + rng.integers(0, w, m) for x, m in enumerate(n.tolist())])
            value = rng.integers(1, int(rng.choice([4, 60, 10**9])) + 1, start.size)
            logged.command("TRUNCATE TABLE scan_values")
            logged.command("INSERT INTO scan_values VALUES " + ", ".join(
                f"({a}, {b})" for a, b in zip(start.tolist(), value.tolist(), strict=True)))
            server = _ServerValues(logged, "scan_values", "TRUE", "e2e_ns", None, w)
            server.windows()
            order = np.lexsort((value, start // w))
            first = np.concatenate([[0], np.cumsum(n)[:-1]]).astype(np.int64)
            memory = SP.SortedValues(value[order].astype(np.float64), first, n.astype(np.int64))
            judged = rng.random(windows) < 0.8
            for threshold in (float(np.quantile(value, 0.9)), float(np.quantile(value, 0.5)) + 0.5, 0.0):
                want = memory.exceedances(threshold, judged)
                with monkeypatch.context() as m:
                    if seed == case + 1 and threshold == 0.0:
                        m.setattr(SP, "verified_blocks", lambda *_: None)
                        refused.append(len(logged.answers))
                    got = server.exceedances(threshold, judged)
                assert np.array_equal(got.exceed, want.exceed), (seed, threshold)
                assert np.array_equal(got.scores, want.scores), (seed, threshold)
                assert np.array_equal(got.score_sum, want.score_sum), (seed, threshold)
    # every group of ties came back only where the server's blocks were refused: its floats chose as the client's
    ties = [i for i, (sql, _) in enumerate(logged.answers) if _is(sql, DETECTION_TIES)]
    assert ties == [next(i for i in ties if i > r) for r in refused] and len(refused) == 3


def _same(got: X.Counted, want: np.ndarray, weights: np.ndarray | None) -> None:
    """The server's count of some rows is theirs: how many, their summed weight and Kish effective count."""
    assert got.n == want.size
    if weights is None:
        assert got.weight is None and got.effective is None
    else:
        w = weights[want]
        assert got.weight == float(w.sum()) and got.effective == (
            float(w.sum()) ** 2 / float(np.square(w).sum()) if want.size else 0.0)


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_the_servers_spike_rows_read_as_the_rows_in_memory(chdb_client: Any, seed: int) -> None:
    """What the explanation reads of a spike's requests left on the server (`_ServerSpikeRows`: its count, summed
    weight, effective count and p99; its tail slice; its rows above the baseline p99; its exemplars, those of a
    candidate first) against the same rows in memory (explain.tail_slice, weighted_q, exemplar_rows, the DuckDB
    report's reading): equal to the last bit, on random values with many ties (a few distinct ones, or many),
    unweighted and weighted (adjusted counts whose sums are exact in any order), seeds 1-5."""
    rng = np.random.default_rng(seed)
    chdb_client.command(f"DROP TEMPORARY TABLE IF EXISTS {CA.ATTR_TEMP}")
    chdb_client.command(f"CREATE TEMPORARY TABLE {CA.ATTR_TEMP} (trace_id String, span_id String, start_ns Int64, "
                        "v Float64, w Float64, a0 Int16) ENGINE = Memory")
    coded = [X.Coded("k0", np.zeros(0, dtype=np.int64), ["x", "y"], [None] * 2, [None] * 2, "k0", "request")]
    attrs = CA.ServerAttributes(A.Attributes(), {"k0": "a0"}, "e2e_ns")
    for weighted in (False, True):
        n = int(rng.choice([40, 400, 1500]))
        start = np.sort(rng.choice(10 * n, n, replace=False)).astype(np.int64)  # distinct: start order is one order
        values = rng.integers(1, int(rng.choice([5, 80, 10**9])) + 1, n).astype(np.float64)
        weights = rng.choice([1.0, 2.0, 4.0, 2.5, 10.0], n) if weighted else None
        a0 = rng.integers(-1, 2, n)
        chdb_client.command(f"TRUNCATE TABLE {CA.ATTR_TEMP}")
        chdb_client.command(f"INSERT INTO {CA.ATTR_TEMP} VALUES " + ", ".join(
            f"('t{i}', 's{i}', {start[i]}, {float(values[i])!r}, {1.0 if weights is None else float(weights[i])!r}, "
            f"{a0[i]})" for i in range(n)))
        server = _ServerSpikeRows(chdb_client, attrs, weighted)
        a, b = (int(x) for x in np.sort(rng.choice(10 * n, 2, replace=False)))
        rows = np.flatnonzero((start >= a) & (start < b)).astype(np.int64)
        p99 = X.weighted_q(values, weights, rows) if rows.size else math.nan
        base_p99 = float(np.quantile(values, float(rng.choice([0.5, 0.9, 0.99]))))
        spike = Spike(a, b, int(rows.size), 0.0, p99, 0.0, base_p99, math.nan, 1)

        got_rows = server.rows(spike)
        _same(got_rows, rows, weights)
        assert got_rows.p99 == p99 or (math.isnan(got_rows.p99) and math.isnan(p99)), (seed, weighted)
        tail = X.tail_slice(values, rows, weights=weights)
        got_tail = server.tail(spike)
        _same(got_tail, tail, weights)
        ids = chdb_client.query(f"SELECT trace_id FROM {CA.ATTR_TEMP} WHERE {got_tail.where}").column(0).to_pylist()
        assert sorted(ids) == sorted(f"t{i}" for i in tail.tolist()), (seed, weighted)
        excess = rows[values[rows] > base_p99]
        _same(server.excess(spike, got_tail), excess if excess.size >= X.MIN_TAIL_SLICE else tail, weights)
        if not rows.size:
            continue
        for best in (None, X.Candidate((0,), (1,), 0, 0, 0.0, 0.0, 0.0, 1.0)):
            prefer = None if best is None else a0[rows] == 1
            want_ids = [f"t{i}" for i in X.exemplar_rows(values, rows, p99, prefer).tolist()]
            assert server.exemplars(spike, coded, best) == want_ids, (seed, weighted, best)


#: The noisy-neighbour step's answers, by the start of their SQL (analysis.clickhouse.neighbours): the tail by
#: tenant, the admitted requests and the GPU time by tenant and spike-or-baseline, the other tenants' queued tail.
NEIGHBOUR_ANSWERS = {"tail": "SELECT coalesce(tenant, 'None') AS t, count() AS n, sum(",
                     "admitted": "SELECT tenant, start_ns >= ", "gpu": "SELECT f.tenant AS tenant, s.bucket_ns >= ",
                     "queued": "SELECT coalesce(o.tenant, 'None') AS t, count() AS n"}


@pytest.mark.parametrize("name", ["burst", "burst-weighed"])
def test_the_noisy_neighbour_step_asks_figures_and_says_what_the_store_says(
        chdb_client: Any, tmp_path_factory: pytest.TempPathFactory, name: str) -> None:
    """A queue-wait spike with a tenant's burst (tests/analysis/test_neighbours.py's fleet; unweighted, and with
    unequal adjusted counts): the ClickHouse report equals the store's in full (tenant, shares, GPU shares, victims),
    and its noisy-neighbour step gets a row per tenant (four: a, b, c and the bursting x), per tenant and
    spike-or-baseline for the admitted requests and GPU time, per victim (three) for the queued tail; no request row
    and no span comes back."""
    root = fleet(name, tmp_path_factory)
    want = build_report(connect(root), window_s="60s")
    table = "t_" + name.replace("-", "_")
    export_store(root, chdb_client, table)
    logged = _Logging(chdb_client)
    got = ch_report(logged, table, window_s=60)
    assert [s["noisy_neighbour"] is not None for s in want["spikes"]] == [True]
    assert got["spikes"] == want["spikes"]
    assert not [s for s, _ in logged.answers if _is(s, REQUEST_ROWS) or _is(s, SPANS)]
    rows = {k: [n for s, n in logged.answers if _is(s, start)] for k, start in NEIGHBOUR_ANSWERS.items()}
    assert rows == {"tail": [4], "admitted": [8], "gpu": [8], "queued": [3]}
