"""Weighted figures of a sampled ClickHouse table computed on the server equal analysis' in memory, to the bit.

A small facts table (adjusted counts 1, 2 and 3, tied values, NULL values, every outcome, a window whose
values are all NULL, a replica whose requests all failed) is held twice: in chdb and in an in-memory DuckDB.
analysis.clickhouse.report.percentile_series and analysis.clickhouse.breakdowns' summary, replicas and shape
on the first must equal analysis.engine.percentiles.percentile_series and analysis.breakdowns' on the second, and
only their figures (one row per window, group, replica or bucket) may come back from the server.
With whole weights every sum of weights is exact in any order, so the figures are compared exactly.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pytest

from analysis import breakdowns as B
from analysis import clickhouse as C
from analysis.clickhouse import breakdowns as CB
from analysis.clickhouse import report as CR
from analysis.engine import percentiles as P
from tests.analysis.recording import Recording

W_NS = 60_000_000_000
WINDOWS = 6
SEEDS = (3, 4, 5)


def _facts(seed: int, n: int = 700) -> pa.Table:
    """Request facts: tied values (a few distinct milliseconds), NULL ttft / tpot / tokens / replica, all outcomes,
    window 2 without any TTFT, replica r-down only failures; adjusted counts drawn from 1, 2, 3."""
    rng = np.random.default_rng(seed)
    win = rng.integers(0, WINDOWS, n)
    start = win * W_NS + rng.integers(0, W_NS, n)
    replica = rng.choice(np.asarray(["r-a", "r-b", "r-c", "r-down", ""], dtype=object), n)
    status = rng.choice(np.asarray(["ok", "ok", "ok", "error", "timeout", "cancelled"], dtype=object), n)
    status[replica == "r-down"] = rng.choice(np.asarray(["error", "timeout"], dtype=object), int((replica == "r-down"
                                                                                                  ).sum()))
    e2e = rng.integers(1, 30, n) * 1_000_000  # few distinct values: ties
    ttft = rng.integers(1, 8, n) * 250_000
    tpot = rng.integers(1, 5, n) * 10_000

    def masked(values: np.ndarray, missing: np.ndarray) -> pa.Array:
        return pa.array(values.astype(np.int64), mask=missing)

    return pa.table({
        "trace_id": [f"{seed:02d}{i:030d}" for i in range(n)], "start_ns": start.astype(np.int64),
        "status": status.astype(str),
        "replica": pa.array(replica.astype(str), mask=replica == ""),
        "e2e_ns": masked(e2e, rng.random(n) < 0.08),
        "ttft_ns": masked(ttft, (rng.random(n) < 0.2) | (win == 2)),
        "tpot_ns": masked(tpot, rng.random(n) < 0.3),
        "input_tokens": masked(rng.choice([0, 1, 3, 4, 7, 8, 100, 1024], n), rng.random(n) < 0.1),
        "output_tokens": masked(rng.choice([0, 2, 5, 16, 17, 300], n), rng.random(n) < 0.1),
        "adjusted_count": rng.choice([1.0, 2.0, 3.0], n)})


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[duckdb.DuckDBPyConnection, Any]]:
    """(DuckDB holding table f<seed>, chdb holding the same rows in table f<seed>) for each seed."""
    client = C.open_client(f"chdb:{tmp_path_factory.mktemp('chw')}")
    con = duckdb.connect(":memory:")
    for seed in SEEDS:
        data, name = _facts(seed), f"f{seed}"
        client.command(f"CREATE TABLE {name} (trace_id String, start_ns Int64, status String, "
                       "replica Nullable(String), e2e_ns Nullable(Int64), ttft_ns Nullable(Int64), "
                       "tpot_ns Nullable(Int64), input_tokens Nullable(Int64), output_tokens Nullable(Int64), "
                       "adjusted_count Float64) ENGINE = Memory")
        client.insert_arrow(name, data)
        con.register("_in", data)
        con.execute(f"CREATE TABLE {name} AS SELECT * FROM _in")
        con.unregister("_in")
    yield con, client
    con.close()
    client.close()


def _same(got: pl.DataFrame, want: pl.DataFrame) -> None:
    """Same columns, rows and values, floats to the bit, nulls where nulls (the integer types may differ)."""
    assert got.columns == want.columns and got.height == want.height > 0
    for col in want.columns:
        assert got.get_column(col).to_list() == want.get_column(col).to_list(), col


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("kw", [{}, {"include_failures": False}, {"by": ("replica",)},
                                {"metric": "ttft", "by": ("status",), "include_failures": False}],
                         ids=["all", "ok-only", "by-replica", "ttft-by-status"])
def test_the_weighted_series_on_the_server_equals_the_one_in_memory(engines: tuple[duckdb.DuckDBPyConnection, Any],
                                                                    seed: int, kw: dict[str, Any]) -> None:
    con, client = engines
    counted = Recording(client)
    got = CR.percentile_series(counted, "unused", window_s=60, facts=f"f{seed}", **kw)
    want = P.percentile_series(con, window_s=60, source=f"f{seed}", **kw)
    _same(got, want)
    assert counted.rows == 1 + got.height  # the sampled check, then one row per window (and group)
    assert (got["requests_weighted"] != got["requests"]).any()  # weighted indeed
    if kw.get("metric") == "ttft":  # window 2 has no TTFT: its quantiles are null, as in memory
        assert got.filter(pl.col("window_start_ns") == 2 * W_NS)["p99_ms"].null_count() > 0


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("where", ["TRUE", "replica IN ('r-a', 'r-down') AND status != 'cancelled'"])
def test_the_weighted_breakdowns_on_the_server_equal_the_ones_in_memory(
        engines: tuple[duckdb.DuckDBPyConnection, Any], seed: int, where: str) -> None:
    con, client = engines
    table = f"f{seed}"
    counted = Recording(client)
    got = CB.summary(counted, table, where)
    assert counted.rows == 2  # the sampled check, one row of figures
    assert got == B.summary(con, table, where)
    assert got["requests_weighted"] != got["requests"] and got["e2e_p99_ms"] is not None
    for metric in ("e2e", "ttft", "tpot"):
        counted.clear()
        reps = CB.replicas(counted, table, metric, where)
        _same(reps, B.replicas(con, metric, table, where))
        assert counted.rows == 1 + reps.height
        for by in (B.TOKEN_COLUMNS, ("output_tokens",)):
            counted.clear()
            buckets = CB.shape(counted, table, metric, by, where)
            _same(buckets, B.shape(con, metric, by, table, where))
            assert counted.rows == 1 + buckets.height
