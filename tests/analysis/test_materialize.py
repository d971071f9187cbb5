"""Materialized request hours: freshness, late spans, requests across an hour boundary, crash safety."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import duckdb
from typer.testing import CliRunner

from analysis import connect, refresh
from analysis.engine import attribute_values as AV
from analysis.engine import gpu_sweep as GS
from analysis.engine import materialize as MZ
from analysis.engine.materialize import HOUR_NS, materialize, snapshot
from tailscope.cli import app
from tests.factory import T0, add_request, write
from tests.sql import one
from tracing.rows import SpanBatch

COLS = "trace_id, span_id, start_ns, e2e_ns, replica, ttft_ns, queue_wait_ns, generation_ns, decode_ns, other_ns"


def _all(con: Any, source: str = "requests") -> list[tuple[Any, ...]]:
    return con.execute(f"SELECT {COLS} FROM {source} ORDER BY start_ns, trace_id").fetchall()


def _two_hours(store: Path) -> None:
    batch = SpanBatch()
    for k in range(6):
        add_request(batch, ("a", k), k * 1000, k * 1000 + 500, [("queue_wait", k * 1000, k * 1000 + 100),
                                                              ("generation", k * 1000 + 100, k * 1000 + 500)])
        add_request(batch, ("b", k), HOUR_NS + k * 1000, HOUR_NS + k * 1000 + 300,
                    [("generation", HOUR_NS + k * 1000, HOUR_NS + k * 1000 + 300)])
    write(store, batch)


def test_materialized_hours_give_the_same_rows_and_are_read_instead(tmp_path: Path) -> None:
    _two_hours(tmp_path)
    live = _all(connect(tmp_path))
    assert len(live) == 12
    before = connect(tmp_path)  # a snapshot from before materializing keeps working
    assert len(materialize(tmp_path)) == 2
    assert materialize(tmp_path) == []  # nothing stale any more
    con = connect(tmp_path)
    assert con.execute("SELECT count(*) FROM _requests_stored").fetchone() == (12,)
    assert con.execute("SELECT count(*) FROM _requests_live").fetchone() == (0,)
    assert _all(con) == live == _all(before)
    stored = con.execute("SELECT count(*) FROM requests_between(?, ?)", [T0 + HOUR_NS, T0 + 2 * HOUR_NS]).fetchone()
    assert stored == (6,)
    files = sorted(p.relative_to(tmp_path).parts[:3] for p in tmp_path.glob(MZ.REQUESTS_GLOB))
    assert files == [("requests", "dt=2025-11-20", "hr=14"), ("requests", "dt=2025-11-20", "hr=15")]


def test_late_spans_make_their_hour_and_its_neighbours_stale(tmp_path: Path) -> None:
    _two_hours(tmp_path)
    materialize(tmp_path)
    late = SpanBatch()
    add_request(late, "late", HOUR_NS + 5000, HOUR_NS + 5100, [("decode", HOUR_NS + 5000, HOUR_NS + 5100)])
    write(tmp_path, late)
    snap = snapshot(tmp_path)
    assert snap.stale == [T0, T0 + HOUR_NS]  # the hour of the late span and the hour before it
    con = connect(tmp_path)
    assert con.execute("SELECT count(*) FROM requests").fetchone() == (13,)
    assert con.execute("SELECT count(*) FROM _requests_stored").fetchone() == (0,)
    on_the_fly = _all(con)
    assert len(materialize(tmp_path)) == 2
    refresh(con, tmp_path)
    assert con.execute("SELECT count(*) FROM _requests_live").fetchone() == (0,)
    assert _all(con) == on_the_fly


def test_a_request_across_the_hour_boundary_reads_the_next_hours_spans(tmp_path: Path) -> None:
    start = HOUR_NS - 1000  # starts 1 us before the hour ends
    first = SpanBatch()
    trace, _ = add_request(first, "cross", start, start + 4000, [("queue_wait", start, start + 500)])
    write(tmp_path, first)
    materialize(tmp_path)
    row = connect(tmp_path).execute("SELECT decode_ns, other_ns FROM requests").fetchone()
    assert row == (0, 3500)
    # the decode span starts in the next hour and lands later, in that hour's partition
    second = SpanBatch()
    root = one(connect(tmp_path), "SELECT span_id FROM requests")[0]
    second.append(trace_id=trace, span_id="d" * 16, parent_span_id=root, name="decode", kind="Internal",
                  start_ns=T0 + HOUR_NS + 500, end_ns=T0 + HOUR_NS + 3000, service="llm", resource={},
                  attrs={"tailscope.stage": "decode"})
    write(tmp_path, second)
    con = connect(tmp_path)
    assert snapshot(tmp_path).stale == [T0, T0 + HOUR_NS]
    assert con.execute("SELECT decode_ns, other_ns FROM requests").fetchone() == (2500, 1000)
    materialize(tmp_path)
    con = connect(tmp_path)
    assert con.execute("SELECT count(*) FROM _requests_live").fetchone() == (0,)
    assert con.execute("SELECT decode_ns, other_ns FROM requests").fetchone() == (2500, 1000)


def test_a_stage_span_starting_before_the_hours_first_request_is_read(tmp_path: Path) -> None:
    """A stage span that starts before the first request of its hour (in the hour before: clock skew) and overlaps
    the request counts, clipped to it: the scan's bound on the spans' start reaches back by the longest span
    starting before that request, in the C sweep and in the model's SQL alike."""
    batch = SpanBatch()
    add_request(batch, "skewed", HOUR_NS + 1000, HOUR_NS + 9000, [("queue_wait", HOUR_NS - 5000, HOUR_NS + 3000)])
    write(tmp_path, batch)
    for kernel in (True, False):
        MZ.build_hour(snapshot(tmp_path), T0 + HOUR_NS, kernel=kernel)
        con = connect(tmp_path)
        assert con.execute("SELECT count(*) FROM _requests_stored").fetchone() == (1,)
        assert con.execute("SELECT queue_wait_ns, other_ns FROM requests").fetchone() == (2000, 6000)


def test_stage_spans_more_than_an_hour_from_the_requests_hour_are_not_read(tmp_path: Path) -> None:
    batch = SpanBatch()
    add_request(batch, "long", 0, 3 * HOUR_NS, [("queue_wait", 0, 10),
                                                ("decode", 2 * HOUR_NS, 2 * HOUR_NS + 10)])
    write(tmp_path, batch)
    assert connect(tmp_path).execute("SELECT queue_wait_ns, decode_ns FROM requests").fetchone() == (10, 0)
    materialize(tmp_path)
    assert connect(tmp_path).execute("SELECT queue_wait_ns, decode_ns FROM requests").fetchone() == (10, 0)


def test_requests_between_equals_a_filter_on_requests(tmp_path: Path) -> None:
    _two_hours(tmp_path)
    late = SpanBatch()
    add_request(late, "third", 2 * HOUR_NS + 7, 2 * HOUR_NS + 70, [])
    write(tmp_path, late)
    MZ.build_hour(snapshot(tmp_path), T0)  # one hour fresh, the others on the fly
    con = connect(tmp_path)
    assert con.execute("SELECT count(*) FROM _requests_stored").fetchone() == (6,)  # T0's hour only
    assert con.execute(f"SELECT {COLS} FROM requests_between(?, ?) ORDER BY start_ns, trace_id",
                       [T0, T0 + 9 * HOUR_NS]).fetchall() == _all(con)
    materialize(tmp_path)
    late2 = SpanBatch()
    add_request(late2, "fourth", 2 * HOUR_NS + 9, 2 * HOUR_NS + 90, [])
    write(tmp_path, late2)
    con = connect(tmp_path)
    assert 0 < one(con, "SELECT count(*) FROM _requests_stored")[0] < 14
    for lo, hi in ((0, HOUR_NS), (HOUR_NS + 1500, 2 * HOUR_NS + 8), (2 * HOUR_NS, 3 * HOUR_NS), (0, 9 * HOUR_NS)):
        got = con.execute(f"SELECT {COLS} FROM requests_between(?, ?) ORDER BY start_ns, trace_id",
                          [T0 + lo, T0 + hi]).fetchall()
        want = con.execute(f"SELECT {COLS} FROM requests WHERE start_ns >= ? AND start_ns < ? "
                           "ORDER BY start_ns, trace_id", [T0 + lo, T0 + hi]).fetchall()
        assert got == want and got


def test_temporary_and_superseded_files_are_ignored_then_swept(tmp_path: Path, monkeypatch: Any) -> None:
    _two_hours(tmp_path)
    [first, _] = materialize(tmp_path)
    (first.parent / ".requests-abc.parquet.1234.tmp").write_bytes(b"half a file")  # a crashed writer
    (first.parent / "requests-0000.parquet").write_bytes(b"not the current key")
    assert snapshot(tmp_path).stale == []
    assert connect(tmp_path).execute("SELECT count(*) FROM requests").fetchone() == (12,)
    late = SpanBatch()
    add_request(late, "late", 77, 99, [])
    write(tmp_path, late)
    monkeypatch.setattr(MZ, "GRACE_S", 0.0)
    [rebuilt, _] = materialize(tmp_path)
    # the hour's attribute values (analysis.engine.attribute_values) and GPU-time sweep (analysis.engine.gpu_sweep)
    # beside its requests, nothing else
    assert sorted(p.name for p in rebuilt.parent.iterdir()) == sorted(
        [AV.attributes_path(rebuilt).name, GS.cost_path(rebuilt).name, rebuilt.name])


def test_a_superseded_file_is_kept_for_the_grace_period_from_when_it_was_superseded(tmp_path: Path,
                                                                                     monkeypatch: Any) -> None:
    """A reader may hold a file written hours ago (the dashboard reads them in place): its grace starts
    when a rebuild supersedes it, not when it was written."""
    import os

    _two_hours(tmp_path)
    [old, _] = materialize(tmp_path)
    hours_ago = time.time() - 3 * 3600
    os.utime(old, (hours_ago, hours_ago))
    reader = connect(tmp_path)
    late = SpanBatch()
    add_request(late, "late", 77, 99, [])
    write(tmp_path, late)
    [rebuilt, _] = materialize(tmp_path)
    assert rebuilt != old and old.exists()
    assert reader.execute("SELECT count(*) FROM requests").fetchone() == (12,)  # still reads its snapshot
    assert snapshot(tmp_path).fresh[T0] == rebuilt
    monkeypatch.setattr(MZ, "GRACE_S", 0.0)
    MZ._sweep(rebuilt.parent, keep=rebuilt)
    # the hour's attribute values (analysis.engine.attribute_values) and GPU-time sweep (analysis.engine.gpu_sweep)
    # beside its requests, nothing else
    assert sorted(p.name for p in rebuilt.parent.iterdir()) == sorted(
        [AV.attributes_path(rebuilt).name, GS.cost_path(rebuilt).name, rebuilt.name])


def test_ingest_materializes_and_collect_builds_settled_hours(tmp_path: Path, monkeypatch: Any) -> None:
    from tailscope.commands import collect as C

    src = tmp_path / "trace.jsonl"
    store = tmp_path / "store"
    _otlp_json(src)
    result = CliRunner().invoke(app, ["ingest", str(src), "--store", str(store)])
    assert result.exit_code == 0, result.output
    assert "materialized the requests of 1 hour(s)" in result.output
    assert snapshot(store).stale == []
    # collect's builder thread: hours whose next hour has ended get built, the loop stops on request
    late = SpanBatch()
    add_request(late, "late", 5, 9, [])
    write(store, late)
    assert snapshot(store).stale == [T0]
    monkeypatch.setattr(C, "MATERIALIZE_EVERY_S", 0.01)
    stop = threading.Event()
    thread = threading.Thread(target=C._materialize_settled, args=(store, stop))
    thread.start()
    deadline = time.monotonic() + 60
    while snapshot(store).stale and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert snapshot(store).stale == []


def _otlp_json(path: Path) -> None:
    import json

    span = {"traceId": "ab" * 16, "spanId": "cd" * 8, "name": "request", "kind": 2,
            "startTimeUnixNano": str(T0 + 10), "endTimeUnixNano": str(T0 + 110),
            "attributes": [{"key": "tailscope.request", "value": {"stringValue": "true"}}]}
    body = {"resourceSpans": [{"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "x"}}]},
                               "scopeSpans": [{"scope": {"name": "t"}, "spans": [span]}]}]}
    path.write_text(json.dumps(body) + "\n")


def test_the_empty_spans_table_has_the_types_of_a_stored_segment(tmp_path: Path) -> None:
    import duckdb

    from analysis.engine.connect import _empty_spans_ddl

    _two_hours(tmp_path)
    con = duckdb.connect(":memory:")
    con.execute(_empty_spans_ddl())
    segment = next(tmp_path.glob("spans/*/*/*.parquet"))
    stored = con.execute(f"DESCRIBE SELECT * FROM read_parquet('{segment}', hive_partitioning = false)").fetchall()
    empty = con.execute("DESCRIBE SELECT * FROM _empty_spans").fetchall()
    assert [(r[0], r[1]) for r in empty] == [(r[0], r[1]) for r in stored]


def test_with_no_hour_materialized_the_stored_rows_have_the_models_columns_and_types(tmp_path: Path) -> None:
    """No fresh hour: the stored-row views read an empty table made from the catalog's types of the model's view
    (not the model bound again); a union with the live rows must see the very same names and types."""
    _two_hours(tmp_path)
    con = connect(tmp_path)
    model = con.execute("DESCRIBE SELECT * FROM _requests_live").fetchall()
    assert [(r[0], r[1]) for r in con.execute("DESCRIBE SELECT * FROM _requests_stored").fetchall()] == \
        [(r[0], r[1]) for r in model]
    rows = con.execute("DESCRIBE SELECT * FROM _request_rows_stored").fetchall()
    assert [(r[0], r[1]) for r in rows] == [(r[0], r[1]) for r in model] + [("rid", "BIGINT")]
    assert con.execute("SELECT count(*) FROM _request_rows_stored").fetchone() == (0,)
    assert len(_all(con)) == 12


def test_files_of_another_model_version_are_stale(tmp_path: Path, monkeypatch: Any) -> None:
    _two_hours(tmp_path)
    materialize(tmp_path)
    assert snapshot(tmp_path).stale == []
    monkeypatch.setattr(MZ, "MODEL_FINGERPRINT", "another version of the rules")
    assert snapshot(tmp_path).stale == [T0, T0 + HOUR_NS]
    assert connect(tmp_path).execute("SELECT count(*) FROM _requests_stored").fetchone() == (0,)


def test_request_engines_equal_a_scan_of_the_spans_however_much_is_materialized(tmp_path: Path) -> None:
    import random

    from analysis.engine.connect import request_engines
    from tracing import schema as S

    rng = random.Random(3)
    batch = SpanBatch()
    for k in range(120):
        start = rng.randrange(0, 3 * HOUR_NS - 1000)
        engine = rng.choice([None, "vllm", "sglang", "tgi"])
        add_request(batch, ("e", k), start, start + 500, [("generation", start, start + 400)],
                    attrs={S.ATTR_ENGINE: engine} if engine else None)
    add_request(batch, ("e", 0), 7, 507, attrs={S.ATTR_ENGINE: "vllm"})  # a request span stored twice counts twice
    write(tmp_path, batch)
    scan = ("SELECT SpanAttributes['tailscope.engine'] AS e, count(*) FROM spans "
            "WHERE IsRequest AND e IS NOT NULL GROUP BY e")

    def check() -> None:
        con = connect(tmp_path)
        want = dict(con.execute(scan).fetchall())
        assert request_engines(con) == want and sum(want.values()) > 60

    check()
    snap = snapshot(tmp_path)
    MZ.build_hour(snap, snap.stale[0])
    check()
    materialize(tmp_path)
    assert snapshot(tmp_path).stale == []
    check()


def test_the_c_sweep_gives_the_rows_of_the_model_sql(tmp_path: Path) -> None:
    """build_hour's C critical-path sweep against the model's SQL (the definition), every column of every row:
    the oracle's random traces (duplicates, skew, both levels, ties of small integer times), half of them with
    span ids of one to three letters so that the SpanId tie-break compares prefixes and lengths."""
    import dataclasses
    import random

    from tests.analysis.test_model_oracle import _random_trace, _store
    from tests.needs import need_c

    need_c(MZ.load_sweep() is not None, "the C kernel analysis._replay")
    rng = random.Random(20261202)
    spans = []
    for n in range(3000):
        trace = _random_trace(rng, n)
        if n % 2:
            short = {sp.id: "".join(rng.choice("ab") for _ in range(rng.randint(1, 3))) + str(k)
                     for k, sp in enumerate(trace)}
            short = {old: new if rng.random() < 0.7 else new[:-1] for old, new in short.items()}  # some collide
            trace = [dataclasses.replace(sp, id=short[sp.id], parent=short.get(sp.parent, sp.parent)) for sp in trace]
        spans.extend(trace)
    store = _store(tmp_path, spans)
    snap = snapshot(store)
    assert len(snap.stale) == 2
    con = duckdb.connect()
    compared, built = 0, []
    for hour in snap.stale:
        rows = {}
        for kernel in (False, True):
            path = MZ.build_hour(snap, hour, kernel=kernel)
            rows[kernel] = con.execute(f"SELECT * FROM read_parquet('{path}') ORDER BY ALL").fetchall()
        assert rows[True] == rows[False]
        compared += len(rows[True])
        built.append(str(path))
    assert compared == 3000  # one request per trace (a request span stored twice counts once)
    # the hard cases are among the rows compared (both hours): level-2 stretches, streaming beside working stages
    prefill, streaming, n = one(con, "SELECT count(*) FILTER (WHERE prefill_ns > 0), count(*) FILTER (WHERE "
                                     "streaming_ns > 0 AND generation_ns > 0), count(*) FROM read_parquet(?)", [built])
    # each count on its own (409 and 84 of the 3,000 here); a tuple's `>` compared the second only on a tie
    assert n == 3000 and prefill > 100 and streaming > 50, (n, prefill, streaming)


def test_the_sweeps_span_ids_are_the_columns_ids_with_64_bit_offsets() -> None:
    """The kernel's span ids (`_span_ids`): the column's values (nulls kept) in one array, its offsets as int64
    pointing into that array's data, whether DuckDB gave 32-bit string chunks or large strings, or nothing."""
    import random

    import numpy as np
    import pyarrow as pa

    rng = random.Random(5)
    values = [None if rng.random() < 0.1 else "".join(rng.choice("abé") for _ in range(rng.randint(0, 20)))
              for _ in range(2000)]
    chunks = [pa.array(values[a:b], pa.string()) for a, b in ((0, 700), (700, 701), (701, 701), (701, 2000))]
    for col in (pa.chunked_array(chunks), pa.chunked_array([c.cast(pa.large_string()) for c in chunks]),
                pa.chunked_array([pa.array(values, pa.string()).slice(3)])):
        ids, off = MZ._span_ids(col)
        want = col.to_pylist()
        assert ids.to_pylist() == want and off.dtype == np.int64 and off.size == len(want) + 1
        data = ids.buffers()[2].to_pybytes()
        assert [data[off[i]:off[i + 1]].decode() for i in range(len(want)) if want[i] is not None] == \
            [v for v in want if v is not None]
    ids, off = MZ._span_ids(pa.chunked_array([], pa.string()))
    assert len(ids) == 0 and off.tolist() == [0]
