"""The materialized `tailscope_requests` on ClickHouse (chdb): which refreshed intervals the report may read.

Every report here is compared with the same report computed from the spans alone
(`materialized=False`). Refreshes run by hand (`clickhouse.refresh`, the view's own SELECT over
literal bounds); rows are corrupted on purpose to show when the table is, and is not, read.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from analysis import clickhouse as C
from analysis.clickhouse import requests as CRQ
from analysis.clickhouse.export import export_store
from analysis.clickhouse.report import build_report, explain_window, percentile_series
from analysis.contract import Report
from analysis.engine import model as M
from tests import samples_cache

pytestmark = pytest.mark.slow  # ClickHouse (chdb) end to end on catalogue samples (make test-fast leaves it out)

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "data" / "incidents" / "slow_replica.otlp.jsonl.gz"
T = C.REQUESTS_TABLE
F = 300 * 1_000_000_000  # the refresh interval: 5 minutes


@pytest.fixture(scope="module")
def ch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, int, Report]]:
    """(a chdb client with otel_traces, its tailscope_requests views applied before the spans arrived; the start
    of the sample's first 5-minute interval; the report computed from the spans alone)."""
    root = tmp_path_factory.mktemp("chm")
    client = C.open_client(f"chdb:{root / 'ch'}")
    client.command(C.otel_traces_ddl())
    for sql in C.requests_mv_ddl():
        client.command(sql)
    client.command(f"SYSTEM STOP VIEW {T}_mv")  # refreshes run by hand below
    export_store(samples_cache.store(SAMPLE, tmp_path_factory), client, C.DEFAULT_TABLE)
    first = int(client.query("SELECT min(TimestampNs) AS t FROM tailscope_requests_spans").to_pylist()[0]["t"])
    t0 = first // F * F
    # refreshes run once (the first interval twice) and stashed: each test replays those it needs
    for lo in (t0 - F, t0, t0 + F, t0 + 2 * F, t0):
        C.refresh(client, C.DEFAULT_TABLE, lo, lo + F)
    client.command(f"CREATE TABLE stash ENGINE = MergeTree ORDER BY tuple() AS SELECT * FROM {T}")
    yield client, t0, build_report(client, materialized=False)
    client.close()


def _reset(client: Any, *intervals: int) -> None:
    """An empty table, then the stashed refreshes of each interval (by its start; the n-th time an interval is
    named, its n-th refresh), appended in that order."""
    client.command(f"TRUNCATE TABLE {T}")
    stamps = {int(r["lo"]): sorted(r["at"]) for r in client.query(
        "SELECT refresh_lo_ns AS lo, groupUniqArray(refreshed_ns) AS at FROM stash GROUP BY lo").to_pylist()}
    for k, lo in enumerate(intervals):
        at = stamps[lo][intervals[:k].count(lo)]
        client.command(f"INSERT INTO {T} SELECT * FROM stash WHERE refresh_lo_ns = {lo} AND refreshed_ns = {at}")


def _computed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The span conditions of every request computation from the spans from now on."""
    calls: list[str] = []
    real = C.materialize_requests

    def spy(*args: Any, **kw: Any) -> str:
        calls.append(kw.get("where", ""))
        return real(*args, **kw)

    monkeypatch.setattr(CRQ, "materialize_requests", spy)  # as requests_facts calls it
    return calls


def test_a_covered_table_gives_the_report_from_its_rows_alone(ch: tuple[Any, int, Report],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    client, t0, want = ch
    _reset(client, t0, t0 + F)
    assert [(r.lo_ns, r.hi_ns) for r in C.coverage(client)] == [(t0, t0 + F), (t0 + F, t0 + 2 * F)]
    calls = _computed(monkeypatch)
    assert build_report(client) == want
    assert calls == [], "every request was read from the table"
    n = client.query(f"SELECT count() AS n FROM {T} WHERE span_id != ''").to_pylist()[0]["n"]
    assert n == want["requests"] > 0 and want["spikes"]


def test_every_request_column_equals_the_computed_one(ch: tuple[Any, int, Report]) -> None:
    client, t0, _ = ch
    _reset(client, t0)  # half from the table, half computed
    order = "ORDER BY trace_id, span_id"
    C.requests_facts(client, name="from_table")
    C.materialize_requests(client, name="computed")
    got = client.query(f"SELECT * FROM from_table {order}")
    want = client.query(f"SELECT * FROM computed {order}")
    assert got.num_rows == want.num_rows > 0
    assert got.to_pylist() == want.to_pylist()
    assert got.schema.names == list(M.REQUEST_COLUMNS)


def test_the_rows_of_a_covered_interval_are_read(ch: tuple[Any, int, Report]) -> None:
    """Corrupting a covered interval's rows changes the report: the table is what it reads there."""
    client, t0, want = ch
    _reset(client, t0, t0 + F)
    client.command(f"ALTER TABLE {T} UPDATE e2e_ns = e2e_ns * 3 WHERE span_id != '' SETTINGS mutations_sync = 1")
    assert build_report(client) != want
    assert build_report(client, materialized=False) == want


def test_a_gap_is_computed_from_the_spans(ch: tuple[Any, int, Report], monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    client, t0, want = ch
    _reset(client, t0 + F)  # the first interval never refreshed
    assert [r.lo_ns for r in C.coverage(client)] == [t0 + F]
    calls = _computed(monkeypatch)
    assert build_report(client) == want
    assert len(calls) == 1


def test_a_double_refresh_reads_the_latest_once(ch: tuple[Any, int, Report]) -> None:
    client, t0, want = ch
    _reset(client, t0, t0 + F, t0)
    groups = client.query(f"SELECT refresh_lo_ns AS lo, uniqExact(refreshed_ns) AS k FROM {T} GROUP BY lo "
                          "ORDER BY lo").to_pylist()
    assert groups == [{"lo": t0, "k": 2}, {"lo": t0 + F, "k": 1}]
    latest = client.query(f"SELECT max(refreshed_ns) AS t FROM {T} WHERE refresh_lo_ns = {t0}").to_pylist()[0]["t"]
    assert [r.refreshed_ns for r in C.coverage(client) if r.lo_ns == t0] == [latest]
    assert build_report(client) == want
    client.command(f"OPTIMIZE TABLE {T} FINAL")  # the replacing engine folds the older rows
    assert client.query(f"SELECT uniqExact(refreshed_ns) AS k FROM {T} WHERE refresh_lo_ns = {t0}"
                        ).to_pylist()[0]["k"] == 1
    assert build_report(client) == want


def test_a_refresh_cut_short_is_not_read(ch: tuple[Any, int, Report]) -> None:
    client, t0, want = ch
    _reset(client, t0, t0 + F)
    client.command(f"ALTER TABLE {T} DELETE WHERE refresh_lo_ns = {t0} AND cityHash64(span_id) % 7 = 0 "
                   "SETTINGS mutations_sync = 1")
    assert [r.lo_ns for r in C.coverage(client)] == [t0 + F]
    assert build_report(client) == want


def test_rows_of_another_model_are_not_read(ch: tuple[Any, int, Report]) -> None:
    client, t0, want = ch
    _reset(client, t0, t0 + F)
    # rows a different model would have written: other values, another fingerprint
    client.command(f"ALTER TABLE {T} UPDATE e2e_ns = 1, fingerprint = 'an older model' WHERE refresh_lo_ns = {t0} "
                   "SETTINGS mutations_sync = 1")
    assert [r.lo_ns for r in C.coverage(client)] == [t0 + F]
    assert build_report(client) == want


def test_the_fingerprint_follows_the_model_and_the_source(monkeypatch: pytest.MonkeyPatch) -> None:
    fp = C.requests_fingerprint()
    assert C.requests_fingerprint("other_traces") != fp
    real = M.requests_sql
    monkeypatch.setattr(M, "requests_sql", lambda *a, **kw: real(*a, **kw).replace("coalesce(", "ifNull("))
    assert C.requests_fingerprint() != fp


def test_an_empty_interval_is_covered_and_computes_nothing(ch: tuple[Any, int, Report],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    client, t0, want = ch
    _reset(client, t0 - F, t0, t0 + F, t0 + 2 * F)  # the first and the last hold no request
    markers = client.query(f"SELECT refresh_lo_ns AS lo, count() AS n FROM {T} WHERE refresh_lo_ns IN "
                           f"({t0 - F}, {t0 + 2 * F}) GROUP BY lo ORDER BY lo").to_pylist()
    assert markers == [{"lo": t0 - F, "n": 1}, {"lo": t0 + 2 * F, "n": 1}]
    assert len(C.coverage(client)) == 4
    calls = _computed(monkeypatch)
    C.requests_facts(client, lo_ns=t0 - F, hi_ns=t0, name="nothing")
    assert client.query("SELECT count() AS n FROM nothing").to_pylist()[0]["n"] == 0
    assert build_report(client, since=t0 - F, until=t0 + 3 * F) == build_report(
        client, since=t0 - F, until=t0 + 3 * F, materialized=False)
    assert build_report(client) == want
    assert len(calls) == 1, "only the report asked to compute everything (materialized=False) computed"


def test_a_time_range_percentiles_and_a_window_read_the_table_too(ch: tuple[Any, int, Report]) -> None:
    client, t0, _ = ch
    _reset(client, t0)
    since, until = t0 + 60 * 10**9, t0 + 7 * 60 * 10**9  # across the covered interval's end
    for metric in ("e2e", "ttft"):
        assert build_report(client, metric=metric, since=since, until=until) == build_report(
            client, metric=metric, since=since, until=until, materialized=False)
        a = percentile_series(client, metric=metric, by=("replica",))
        assert a.equals(percentile_series(client, metric=metric, by=("replica",), materialized=False))
    assert percentile_series(client, metric="decode").equals(percentile_series(client, metric="decode",
                                                                               materialized=False))
    assert explain_window(client, C.DEFAULT_TABLE, since, until) == explain_window(
        client, C.DEFAULT_TABLE, since, until, materialized=False)


def _uncovered_reference(covered: list[tuple[int, int]], lo: int | None, hi: int | None, top: int
                         ) -> list[tuple[int | None, int | None]]:
    """The points of [lo, hi) in [-1, top] no covered interval holds, as runs (open ends back to None)."""
    points = [x for x in range(-1, top + 1) if (lo is None or x >= lo) and (hi is None or x < hi)
              and not any(a <= x < b for a, b in covered)]
    runs: list[list[int]] = []
    for x in points:
        if runs and runs[-1][1] == x:
            runs[-1][1] = x + 1
        else:
            runs.append([x, x + 1])
    return [(None if a == -1 and lo is None else a, None if b == top + 1 and hi is None else b) for a, b in runs]


def test_the_uncovered_ranges_equal_a_point_by_point_reference() -> None:
    rng = random.Random(5)
    for _ in range(2000):
        top = 40
        cuts = sorted(rng.sample(range(0, top), rng.randrange(0, 9) * 2))
        covered = [(cuts[i], cuts[i + 1]) for i in range(0, len(cuts), 2) if rng.random() < 0.8]
        lo = rng.choice([None, rng.randrange(0, top)])
        hi = rng.choice([None, rng.randrange(0, top + 1)])
        if lo is not None and hi is not None and hi <= lo:
            continue
        refreshes = [C.Refresh(a, b, 0) for a, b in covered]
        got = CRQ._uncovered(refreshes, lo, hi)
        assert got == _uncovered_reference(covered, lo, hi, top), (covered, lo, hi)


def test_late_spans_make_their_intervals_stale(ch: tuple[Any, int, Report]) -> None:
    """Runs last: it adds a request to the module's table."""
    client, t0, want = ch
    _reset(client, t0, t0 + F)
    tid, sid = "f" * 32, "e" * 16
    start = t0 + 100 * 10**9
    client.command(
        "INSERT INTO otel_traces (Timestamp, TraceId, SpanId, ParentSpanId, SpanName, SpanKind, ServiceName, "
        f"SpanAttributes, Duration, StatusCode) SELECT fromUnixTimestamp64Nano(toInt64({start})), '{tid}', '{sid}', "
        "'', 'chat', 'Server', 'late', map('gen_ai.operation.name', 'chat'), 90000000000, 'Unset'")
    assert C.coverage(client) == [], "both intervals are within the late span's reach (its hour)"
    now = build_report(client, materialized=False)
    assert now["requests"] == want["requests"] + 1
    assert build_report(client) == now
    for lo in (t0, t0 + F):  # refreshed after the late span: read again
        C.refresh(client, C.DEFAULT_TABLE, lo, lo + F)
    assert len(C.coverage(client)) == 2
    assert build_report(client) == now
