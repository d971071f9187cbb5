"""What a ClickHouse (chdb) report returns, query by query, as the requests grow: the pair store (tests/analysis/
test_attributes.py) at 600 and at 1,200 requests a window, the same windows, replicas, tenants and cause. Its report
equals the store's at both rates (test_clickhouse_attributes.py); here, what comes back: the stage shares and the
local comparison as one row of means a tail (no span, no row of the local baseline's windows), every answer of
figures the same size at both rates, and the request rows of the spike's own windows only. The full target, no
answer growing with the requests, is a stated miss (xfail, strict): the spike windows' request rows and the
detection's values above the pooled p99 still come back."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from analysis.clickhouse import client as C
from analysis.clickhouse.export import export_store
from analysis.clickhouse.report import STAGES_TEMP
from analysis.clickhouse.report import build_report as ch_report
from tests.analysis.test_attributes import pair_store

pytestmark = pytest.mark.slow  # ClickHouse (chdb) end to end

RATES = (600, 1200)
#: Answers that are request rows, by the start of their SQL: the spike windows' facts, the detection's values above
#: the pooled p99, and spans (the explanation pulls them only for the noisy-neighbour step, which this store's
#: decode-led spike does not run).
REQUEST_ROWS = "SELECT trace_id, span_id, start_ns, e2e_ns"
DETECTION_TAIL = "SELECT intDiv(start_ns, 60000000000) AS win, toFloat64(e2e_ns) AS v"
SPANS = "SELECT TimestampNs, TraceId"


class _Logging:
    """A client keeping each query's SQL (whitespace folded) and the rows it returned."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.dsn = inner, inner.dsn
        self.answers: list[tuple[str, int]] = []

    def query(self, sql: str, settings: dict[str, Any] | None = None) -> pa.Table:
        out = self.inner.query(sql, settings)
        self.answers.append((" ".join(sql.split()), out.num_rows))
        return out

    def command(self, sql: str) -> None:
        self.inner.command(sql)


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory) -> list[list[tuple[str, int]]]:
    """Each rate's report answers, in order."""
    root = tmp_path_factory.mktemp("rows")
    client = C.open_client(f"chdb:{root / 'chdb'}")
    each = []
    try:
        for per_window in RATES:
            table = f"t_rows_{per_window}"
            export_store(pair_store(root / f"pairs-{per_window}", per_window), client, table)
            logged = _Logging(client)
            got = ch_report(logged, table, window_s=60)
            assert [(s["requests"], s["windows"]) for s in got["spikes"]] == [(2 * per_window, 2)]
            assert got["spikes"][0]["stages"][0]["stage"] == "decode"
            each.append(logged.answers)
    finally:
        client.close()
    return each


def _is(sql: str, start: str) -> bool:
    return sql.startswith(start)


def test_only_the_spike_windows_requests_grow_and_the_stages_come_back_as_means(
        answers: list[list[tuple[str, int]]]) -> None:
    low, high = answers
    assert len(low) == len(high)
    for (sql, a), (_, b) in zip(low, high, strict=True):
        if _is(sql, REQUEST_ROWS):  # the spike's two windows, row by row: not the local baseline's windows
            assert (a, b) == (2 * RATES[0], 2 * RATES[1]), sql[:120]
        elif _is(sql, DETECTION_TAIL):  # about 1 % of the values: stated below
            assert 0 < a <= 0.01 * 10 * RATES[0] + 1 and 0 < b <= 0.01 * 10 * RATES[1] + 1, (a, b)
        else:
            assert a == b, (a, b, sql[:160])
    assert not [s for s, _ in low + high if _is(s, SPANS)]  # the stage shares read no span here
    means = [n for s, n in low + high if f"FROM {STAGES_TEMP}" in s]
    assert means == [2, 2]  # one row of stage means a tail (the spike's, the local baseline's) at each rate
    assert sum(1 for s, _ in low if _is(s, REQUEST_ROWS)) == 1


@pytest.mark.xfail(strict=True, reason="the spike windows' request rows and the detection's values above the pooled "
                                       "p99 still come back, so they grow with the requests")
def test_no_answer_grows_with_the_requests(answers: list[list[tuple[str, int]]]) -> None:
    low, high = answers
    assert [n for _, n in low] == [n for _, n in high]
