"""The read path (files grouped by their columns, bound once per connect) reads what union_by_name reads.

The store mixes the three kinds of segment a store holds: writer segments (SPAN_SCHEMA), merged
segments written by DuckDB (columns declared nullable, map and list fields named DuckDB's way) and
segments of an older schema (without the later columns). The reference is DuckDB's own
`read_parquet(files, union_by_name = true)` over the same listing, and, for the report, a store holding
the same spans in one file an hour.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analysis.engine import model as M
from analysis.engine.connect import connect, refresh
from analysis.engine.percentiles import request_facts
from analysis.engine.views import schema_groups, spans_sql, with_later_columns
from analysis.report import build_report
from analysis.watch.reading import open_range
from benchmarks.synthetic import SPANS_PER_REQUEST, START_NS, request_table
from intake.compact.merge import Compactor, Policy
from tracing.store import HOUR_NS, SegmentWriter, hour_dir, init_store, segment_files, segment_level

LATER = [name for name, _, _ in M.LATER_COLUMNS]


def _old_schema_segment(store: Path, table: pa.Table, name: str) -> None:
    """A segment as an older writer wrote it: without the later columns."""
    hour = int(table.column("TimestampNs")[0].as_py()) // HOUR_NS * HOUR_NS
    directory = hour_dir(store, hour)
    directory.mkdir(parents=True, exist_ok=True)
    pq.write_table(table.drop_columns(LATER), directory / name)


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(store, anchor): the store of mixed segments, and the same spans read by union_by_name as one file an hour."""
    root = tmp_path_factory.mktemp("read-path")
    store = init_store(root / "mixed")
    n = 600
    table = request_table(np.random.default_rng(5), n, START_NS + 50 * 60 * 10**9, START_NS + 70 * 60 * 10**9)
    per = 8 * SPANS_PER_REQUEST
    chunks = [table.slice(i, per) for i in range(0, table.num_rows, per)]
    writer = SegmentWriter(store, kind="test")
    for chunk in chunks[:30]:
        writer.write(chunk)
    # the hours ended long ago: one pass merges each into one DuckDB-written segment
    Compactor(store, Policy(fan_in=4, target_bytes=1 << 20, settle_s=300.0, quiet_s=60.0, grace_s=600.0,
                            row_group_spans=2048, durable=False)).run_once(time.time() + 1000)
    for k, chunk in enumerate(chunks[30:50]):  # older-schema segments, one per hour each touches
        hours = chunk.column("TimestampNs").to_numpy() // HOUR_NS
        for h in np.unique(hours):
            _old_schema_segment(store, chunk.filter(pa.array(hours == h)), f"old-{k:04d}-{h}.parquet")
    for chunk in chunks[50:]:
        writer.write(chunk)
    files = [str(f) for f in segment_files(store)]
    assert any(segment_level(Path(f).name) > 0 for f in files) and any("/old-" in f for f in files)
    # merged segments declare their columns nullable, of the writer's types: one group with the writer's;
    # the older schema is a group of its own
    groups = schema_groups(files)
    assert len(groups) == 2 and sorted("/old-" in f for f in groups[1]) == [True] * len(groups[1])
    assert any(segment_level(Path(f).name) > 0 for f in groups[0]) and not any("/old-" in f for f in groups[0])
    anchor = init_store(root / "anchor")
    scan = f"read_parquet({files!r}, union_by_name = true, hive_partitioning = false)"
    union = duckdb.connect().sql(f"SELECT * FROM {with_later_columns(scan)}").to_arrow_table()
    SegmentWriter(anchor, kind="anchor").write(union)
    return store, anchor


def _rows(con: Any, sql: str) -> list[str]:
    return sorted(json.dumps(r, default=str) for r in con.execute(sql).fetchall())


def test_spans_are_what_union_by_name_reads(mixed: tuple[Path, Path]) -> None:
    store, _ = mixed
    files = [str(f) for f in segment_files(store)]
    ref = duckdb.connect()
    scan = f"read_parquet({files!r}, union_by_name = true, hive_partitioning = false)"
    ref.execute(f"CREATE VIEW spans AS {spans_sql(with_later_columns(scan))}")
    con = connect(store)
    assert [d[:2] for d in con.execute("DESCRIBE spans").fetchall()] == \
        [d[:2] for d in ref.execute("DESCRIBE spans").fetchall()]
    q = "SELECT * EXCLUDE (ResourceAttributes, SpanAttributes), map_entries(ResourceAttributes), " \
        "map_entries(SpanAttributes) FROM spans"
    got = _rows(con, q)
    assert got == _rows(ref, q) and len(got) == 600 * SPANS_PER_REQUEST
    assert con.execute("SELECT count(*) FROM spans WHERE AdjustedCount IS NULL").fetchone() == \
        ref.execute("SELECT count(*) FROM spans WHERE AdjustedCount IS NULL").fetchone() != (0,)
    # no stand-in of the binding is left behind
    assert not con.execute("SELECT table_name FROM duckdb_tables() WHERE table_name LIKE '_tailscope_shape%'"
                           ).fetchall()
    # the sandbox and watch's range reads see the same spans
    box = connect(store, sandbox=True)
    assert _rows(box.cursor(), "SELECT TraceId, SpanId, Duration, AdjustedCount FROM spans") == \
        _rows(ref, "SELECT TraceId, SpanId, Duration, AdjustedCount FROM spans")
    lo, hi = START_NS + 55 * 60 * 10**9, START_NS + 65 * 60 * 10**9
    assert _rows(open_range(store, lo, hi), "SELECT TraceId, SpanId, AdjustedCount FROM spans") == _rows(
        ref, f"SELECT TraceId, SpanId, AdjustedCount FROM spans WHERE TimestampNs >= {lo} AND TimestampNs < {hi}")


def test_the_report_equals_the_one_on_the_same_spans_in_one_file(mixed: tuple[Path, Path]) -> None:
    store, anchor = mixed
    assert build_report(connect(store)) == build_report(connect(anchor))
    cols = ", ".join(M.REQUEST_COLUMNS)
    q = f"SELECT {cols} FROM requests"
    got = _rows(connect(store), q)
    assert got == _rows(connect(anchor), q) and len(got) == 600


def _opens(con: duckdb.DuckDBPyConnection) -> int:
    """Files DuckDB opened on `con` since logging began (its FileSystem log), the log then cleared."""
    n = con.execute("SELECT count(*) FROM duckdb_logs WHERE message LIKE '%\"op\":\"OPEN\"%'").fetchone()
    con.execute("CALL truncate_duckdb_logs()")
    return int(n[0]) if n else 0


def test_a_connect_opens_one_file_a_group_and_a_query_each_file_once(mixed: tuple[Path, Path]) -> None:
    """union_by_name opened every file at each of a connect's dozen binds, and again at each query's bind: a
    connect now opens the first file of each group, and a query the files DuckDB alone opens for the same scan."""
    store, _ = mixed
    files = [str(f) for f in segment_files(store)]
    groups = len(schema_groups(files))
    con = connect(store)
    con.execute("CALL enable_logging('FileSystem')")
    refresh(con, store)  # what a connect does after its connection is made
    # two binds (the empty stand-in, then the view) of each of the three file lists: the first file of each group
    assert _opens(con) <= 2 * 3 * groups
    con.execute("SELECT sum(Duration) FROM spans").fetchall()
    alone = duckdb.connect()  # DuckDB alone, the same scan of the same files (its opens per file are its own)
    alone.execute("CALL enable_logging('FileSystem')")
    alone.execute("SELECT sum(Duration) FROM read_parquet(?)", [files]).fetchall()
    assert _opens(con) <= _opens(alone) + 2 * groups


def test_request_facts_follow_a_refresh(tmp_path: Path) -> None:
    """The request facts are made once per snapshot: a refresh that lists new segments gives new facts."""
    store = init_store(tmp_path)
    table = request_table(np.random.default_rng(2), 40, START_NS, START_NS + 60 * 10**9)
    writer = SegmentWriter(store, kind="test")
    writer.write(table.slice(0, 20 * SPANS_PER_REQUEST))
    con = connect(store)
    assert con.execute(f"SELECT count(*) FROM {request_facts(con)}").fetchone() == (20,)
    writer.write(table.slice(20 * SPANS_PER_REQUEST))
    refresh(con, store)
    assert con.execute(f"SELECT count(*) FROM {request_facts(con)}").fetchone() == (40,)


def test_a_connection_spills_under_the_system_temp_dir_not_the_working_dir(tmp_path: Path, monkeypatch: Any) -> None:
    import tempfile

    store = tmp_path / "store"
    init_store(store)
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    con = connect(store, memory_limit="64MB")
    con.execute("SET enable_progress_bar = false").fetchall()
    where = Path(con.execute("SELECT current_setting('temp_directory')").fetchall()[0][0])
    assert where.parent == tmp_path / "tmp" and not where.exists()  # made at the first spill
    got = con.execute("SELECT count(*), count(DISTINCT s) FROM (SELECT md5(range::VARCHAR) AS s FROM range(1500000) "
                      "ORDER BY s)").fetchall()
    assert got == [(1500000, 1500000)]
    assert where.is_dir() and not (tmp_path / "cwd" / ".tmp").exists()
    con.close()
    assert not where.exists()
