"""The request model's adjusted count: the SQL form of the sampling rule equals the Python rule, and `requests`
carries the request span's value (1 for segments written before the column existed)."""

from __future__ import annotations

import random
from pathlib import Path

import duckdb
import pyarrow.parquet as pq

from analysis.engine import model as M
from analysis.engine.connect import connect
from tests.needs import CHDB_HOW, need_module
from tests.tracing.test_sampling import random_attrs, random_state
from tracing import schema as S
from tracing.rows import SpanBatch, adjusted_count_of
from tracing.store import SegmentWriter


def _random_rows(seed: int, n: int) -> list[tuple[str, dict[str, str]]]:
    rng = random.Random(seed)
    return [(random_state(rng), random_attrs(rng)) for _ in range(n)]


def test_duckdb_sql_form_equals_the_python_rule() -> None:
    rows = _random_rows(7, 5000)
    con = duckdb.connect()
    con.execute("CREATE TABLE t (i INTEGER, TraceState VARCHAR, SpanAttributes MAP(VARCHAR, VARCHAR))")
    con.executemany("INSERT INTO t VALUES (?, ?, MAP(?, ?))",
                    [[i, s, list(a), list(a.values())] for i, (s, a) in enumerate(rows)])
    got = [v for (_, v) in con.execute(f"SELECT i, {M.adjusted_count_sql(M.DUCKDB)} FROM t ORDER BY i").fetchall()]
    assert got == [adjusted_count_of(s, a) for s, a in rows]


def test_clickhouse_sql_form_equals_the_python_rule() -> None:
    chdb = need_module("chdb", CHDB_HOW)
    ch = M.CLICKHOUSE  # the sampling spellings are fields of the dialect
    rows = _random_rows(8, 1500)

    def lit(text: str) -> str:
        return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"

    values = ", ".join(f"({i}, {lit(s)}, map({', '.join(f'{lit(k)}, {lit(v)}' for k, v in a.items())}))"
                       if a else f"({i}, {lit(s)}, map())" for i, (s, a) in enumerate(rows))
    sql = (f"SELECT i, {M.adjusted_count_sql(ch)} AS c FROM (SELECT tupleElement(x, 1) AS i, tupleElement(x, 2) "
           f"AS TraceState, CAST(tupleElement(x, 3), 'Map(String, String)') AS SpanAttributes "
           f"FROM (SELECT arrayJoin([{values}]) AS x)) ORDER BY i FORMAT TSV")
    out = chdb.query(sql).bytes().decode()
    got = [float(line.split("\t")[1]) for line in out.splitlines()]
    assert got == [adjusted_count_of(s, a) for s, a in rows]


def _request_batch(states: list[str], first: int = 0) -> SpanBatch:
    batch = SpanBatch()
    for i, state in enumerate(states, first):
        t0 = 1_700_000_000_000_000_000 + i * 1_000_000
        batch.append(trace_id=f"{i + 1:032x}", span_id=f"{i + 1:016x}", parent_span_id="", name="req",
                     kind="Server", start_ns=t0, end_ns=t0 + 500_000, service="s", resource={},
                     attrs={S.ATTR_REQUEST: "true"}, trace_state=state)
    return batch


def test_requests_carry_the_request_spans_adjusted_count_and_old_segments_read_one(tmp_path: Path) -> None:
    store = tmp_path / "store"
    (new,) = SegmentWriter(store, kind="w").write(_request_batch(["ot=th:e", ""], first=3).to_table())
    con = connect(store)
    assert con.execute("SELECT adjusted_count FROM requests ORDER BY start_ns").fetchall() == [(8.0,), (1.0,)]
    con.close()
    new.unlink()  # only segments written before the column: the views still read, every request weighs 1
    old = _request_batch(["ot=th:8", "", "ot=th:c"]).to_table().drop_columns(["AdjustedCount"])
    pq.write_table(old, new.parent / "old-1.parquet")
    con = connect(store)
    assert con.execute("SELECT adjusted_count FROM requests ORDER BY start_ns").fetchall() == [(1.0,)] * 3
    assert con.execute("SELECT count(*) FROM spans WHERE AdjustedCount IS NULL").fetchall() == [(3,)]
    con.close()
    pq.write_table(_request_batch(["ot=th:e"], first=5).to_table(), new.parent / "new-2.parquet")
    con = connect(store)  # old and new segments side by side
    got = con.execute("SELECT adjusted_count FROM requests ORDER BY start_ns").fetchall()
    assert got == [(1.0,), (1.0,), (1.0,), (8.0,)]
