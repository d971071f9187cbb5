"""Attribute values written with the materialized hours (analysis/engine/attribute_values.py): a report reads the
same values and says the same thing whether an hour is materialized or computed from the spans; and pairs of an
attribute with a built-in dimension (k8s.node.name & tenant) are candidates, counted in the family."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from analysis import build_report, connect
from analysis import report as R
from analysis.engine import attribute_values as AV
from analysis.engine import model as M
from analysis.engine import percentiles as P
from analysis.engine.materialize import HOUR_NS, materialize
from analysis.engine.percentiles import request_facts
from analysis.engine.views import LIVE_HOURS
from analysis.stats import attributes as A
from analysis.stats import explain as X
from tests.analysis.test_attributes import MS, SLOW_NODE, _append, _reference_bucket, node_store
from tests.factory import T0, hex_id, write
from tracing import schema as S
from tracing.rows import SpanBatch

HOURS = 3


def hours_store(path: Path, seed: int, twice: int = 0) -> tuple[Path, dict[str, dict[str, str]]]:
    """Random requests over three hours with request, stage and resource attributes, some traces with a stage span
    two hours after their request (outside the hours its model reads), replica r5's rack changing every hour, the
    first `twice` request spans delivered twice; and each request's value of each key under the rules, written
    plainly (the reference)."""
    rng = random.Random(seed)
    batch = SpanBatch()
    replicas = [f"r{i}" for i in range(6)]
    expected: dict[str, dict[str, str]] = {}
    n = 360
    for i in range(n):
        rep = rng.choice(replicas)
        start = i * (HOURS * HOUR_NS // n) + rng.randint(0, 5000) * MS
        end = start + rng.randint(50, 500) * MS
        hour = (T0 + start) // HOUR_NS
        rack = f"rack-{replicas.index(rep) % 3}" if rep != "r5" else f"rack-h{hour % 7}"
        res = {"service.name": "llm", "service.instance.id": rep, "host": f"h{replicas.index(rep) // 2}",
               "rack": rack}
        attrs = {S.ATTR_REQUEST: "true", "color": rng.choice(["red", "green", "blue"]), S.ATTR_TENANT: "acme"}
        if rng.random() < 0.7:
            attrs["n"] = str(rng.choice([0, 1, 3, 17, 100, 4096]))
        trace, root = hex_id("ht", seed, i, size=32), hex_id("hs", seed, i)
        for _ in range(2 if i < twice else 1):
            _append(batch, trace, root, "", "request", start, end, res, attrs, kind="Server")
        stage_vals = [rng.choice(["a", "b", None]) for _ in range(2)]
        mid = (start + end) // 2
        for k, (st, s0, s1) in enumerate((("prefill", start, mid), ("decode", mid, end))):
            phase = stage_vals[k]
            sattrs = {S.ATTR_STAGE: st} | ({"phase": phase} if phase is not None else {})
            _append(batch, trace, hex_id("hst", seed, i, k), root, st, s0, s1, res, sattrs)
        if i % 9 == 0:  # a stage span of the trace two hours later: outside the request's hours, not read
            late = start + 2 * HOUR_NS + HOUR_NS // 2
            _append(batch, trace, hex_id("late", seed, i), root, "decode", late, late + 10 * MS, res,
                    {S.ATTR_STAGE: "decode", "phase": "late"})
        want = {"color": attrs["color"], "host": res["host"]}  # service.name: one value, as the tenant
        if "n" in attrs:
            want["n"] = _reference_bucket(float(attrs["n"]))
        seen = {v for v in stage_vals if v is not None}
        if len(seen) == 1:
            want["phase"] = seen.pop()
        if rep != "r5":  # r5's processes carry a rack per hour: over the store, no one value
            want["rack"] = rack
        expected[trace] = want
    write(path, batch)
    return path, expected


def _values(store: Path, store_rows: bool = True) -> tuple[dict[str, dict[str, str]], A.Attributes]:
    """Each request's attribute values as the report reads them (trace id -> key -> label)."""
    con = connect(store)
    frame, _, facts, _ = R._frame(con, "e2e", None, None, True)
    builtin = [X.code_dimension(frame, d) for d in X.DIMENSIONS]
    out = R._attribute_dims(con, f"SELECT rid, trace_id, span_id, start_ns FROM {facts}", {}, frame, builtin,
                            A.AttributeRules(), None, None, store_rows=store_rows)
    trace_of = dict(con.sql(f"SELECT rid, trace_id FROM {facts}").fetchall())
    got: dict[str, dict[str, str]] = {}
    for k, rid in enumerate(frame.get_column("rid").to_list()):
        got[str(trace_of[rid])] = {c.name: c.labels[c.codes[k]] for c in out.coded if c.codes[k] >= 0}
    con.close()
    return got, out


def _same(a: object, b: object) -> None:
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


@pytest.mark.parametrize("seed", [1, 2])
def test_values_are_the_rules_whether_hours_are_materialized_or_not(tmp_path: Path, seed: int,
                                                                     monkeypatch: Any) -> None:
    store, expected = hours_store(tmp_path / "s", seed, twice=7)
    live, live_attrs = _values(store)
    assert live == expected
    assert next(c for c in live_attrs.considered if c["attribute"] == "color")["requests"] == len(expected)
    # the request spans' maps read about 40 requests at a time (cut by start time): the same values and counts
    with monkeypatch.context() as m:
        m.setattr(A, "CHUNK_REQUESTS", 40)
        parts, parts_attrs = _values(store)
    assert parts == expected
    _same(parts_attrs.to_json(), live_attrs.to_json())
    # the facts of the stale hours, made an hour at a time, are the model's facts over every hour at once
    con = connect(store)
    assert con.sql(f"SELECT count(*) FROM {LIVE_HOURS}").fetchall()[0][0] >= HOURS  # so an hour at a time
    cols, order = ", ".join(M.FACT_COLUMNS), "ORDER BY trace_id, span_id"
    hourly = con.sql(f"SELECT {cols} FROM {request_facts(con, with_ttft=True)} {order}").fetchall()
    assert len(hourly) == len(expected) and hourly == con.sql(f"SELECT {cols} FROM _request_facts_live {order}"
                                                               ).fetchall()
    con.close()
    # and each hour in parts by trace (about 50 spans a part; a request span stored twice is one trace's): the same
    with monkeypatch.context() as m:
        m.setattr(P, "SPANS_PER_FACTS_PART", 50)
        con = connect(store)
        assert con.sql(f"SELECT max(n) FROM (SELECT count(*) AS n FROM _spans_live GROUP BY TimestampNs // {HOUR_NS})"
                       ).fetchall()[0][0] > 2 * 50  # so an hour in three parts or more
        parted = con.sql(f"SELECT {cols} FROM {request_facts(con, with_ttft=True)} {order}").fetchall()
        con.close()
    assert parted == hourly
    first = materialize(store, settled_before_ns=(T0 // HOUR_NS + 2) * HOUR_NS)  # the first hour only: mixed
    assert len(first) == 1 and AV.attributes_path(first[0]).is_file()
    mixed, mixed_attrs = _values(store)
    materialize(store)
    stored, stored_attrs = _values(store)
    assert mixed == expected and stored == expected
    for attrs in (mixed_attrs, stored_attrs):
        _same(attrs.to_json(), live_attrs.to_json())
    # a caller's own rows (not the store's row ids) are read from the spans, to the same values
    assert _values(store, store_rows=False)[0] == expected


def test_the_report_is_the_same_with_and_without_materialized_hours(tmp_path: Path) -> None:
    store, _ = hours_store(tmp_path / "h", 4)
    windows = [(None, None), (T0 + HOUR_NS // 2, T0 + 5 * HOUR_NS // 2), (T0 + HOUR_NS, T0 + 2 * HOUR_NS)]
    live = [build_report(connect(store), since=a, until=b) for a, b in windows]
    materialize(store)
    for (a, b), want in zip(windows, live, strict=True):
        _same(build_report(connect(store), since=a, until=b), want)
    # within one hour r5's processes agree on a rack: a value there, none over the store
    hour_attrs, all_attrs = live[2]["attributes"], live[0]["attributes"]
    assert hour_attrs is not None and all_attrs is not None
    one_hour = next(c for c in hour_attrs["considered"] if c["attribute"] == "rack")
    over_all = next(c for c in all_attrs["considered"] if c["attribute"] == "rack")
    assert one_hour["requests"] == live[2]["values"] and over_all["requests"] < live[0]["values"]

    nodes = node_store(tmp_path / "n")
    before = build_report(connect(nodes))
    materialize(nodes)
    after = build_report(connect(nodes))
    _same(after, before)
    assert after["spikes"][0]["dimensions"][0]["value"] == SLOW_NODE


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_kept_live_values_are_each_hours_own(tmp_path: Path, seed: int) -> None:
    """`keep_live_values` reads the stage values of a run of consecutive hours in one query: its tables hold, for any
    set of hours (consecutive or not), exactly the rows of each hour read on its own (the request, stage and resource
    queries bounded to the hour), and each request's stage value is the rule's (agreed by its stage spans)."""
    store, expected = hours_store(tmp_path / "s", seed, twice=5)
    con = connect(store)
    hours = sorted(int(h) for (h,) in con.sql(f"SELECT hour_ns FROM {LIVE_HOURS}").fetchall())
    assert len(hours) >= 3
    con.execute("CREATE TABLE keys AS SELECT trace_id, span_id, start_ns FROM requests")
    cols = {"request": "hour, trace_id, span_id, a", "stage": "hour, trace_id, span_id, k, v",
            "resource": "hour, replica, k, vs"}

    def each_hour(h: int, source: str) -> list[tuple[Any, ...]]:
        """The rows of hour `h` read on their own (the reference)."""
        facts = (f"SELECT row_number() OVER () AS rid, trace_id, span_id, start_ns FROM keys "
                 f"WHERE start_ns >= {h} AND start_ns < {h + HOUR_NS}")
        p = {"lo": h, "hi": h + HOUR_NS}
        if source == "resource":
            where = f"TimestampNs >= {h} AND TimestampNs < {h + HOUR_NS}"
            return con.sql(f"SELECT {h}::BIGINT, Replica, k, vs FROM ({AV.resource_attribute_sql('spans', where)})",
                           params=p).fetchall()
        sql = AV.request_attribute_sql(facts, AV.LIVE_SPANS) if source == "request" else \
            AV.stage_attribute_sql(facts, AV.LIVE_SPANS)
        got = "s.a" if source == "request" else "s.k, s.v"
        return con.sql(f"SELECT {h}::BIGINT, f.trace_id, f.span_id, {got} FROM ({sql}) s JOIN ({facts}) f USING (rid)",
                       params=p).fetchall()

    def norm(rows: list[tuple[Any, ...]]) -> list[str]:
        return sorted(json.dumps([sorted(c.items()) if isinstance(c, dict) else sorted(c) if isinstance(c, list)
                                  else c for c in r], default=str) for r in rows)

    for n, pick in enumerate((hours, [hours[0], hours[2]], hours[1:], [hours[-1]])):
        into = {source: f"kept_{source}_{n}" for source in cols}
        AV.keep_live_values(con, "keys", [], pick, into=into)
        for source, table in into.items():
            got = con.sql(f"SELECT {cols[source]} FROM {table}").fetchall()
            assert norm(got) == norm([r for h in pick for r in each_hour(h, source)]), (pick, source)
        phases = {str(t): str(v) for _, t, _, k, v in con.sql(f"SELECT {cols['stage']} FROM {into['stage']}").fetchall()
                  if k == "phase"}
        starts = dict(con.sql("SELECT trace_id, start_ns FROM keys").fetchall())
        assert phases == {t: w["phase"] for t, w in expected.items()
                          if "phase" in w and starts[t] // HOUR_NS * HOUR_NS in pick}
        assert phases or n  # the rule's stage values were read (all hours: some request carries one)
    con.close()


def test_a_store_without_attributes_reads_no_value() -> None:
    assert AV.presence_only("tailscope.request") and AV.presence_only("gen_ai.request.model")
    assert AV.presence_only("server.duration_ms") and not AV.presence_only("k8s.node.name")


TENANTS = ["acme", "globex", "initech"]


def test_the_rows_of_each_file_are_each_file_numbers_positions() -> None:
    """`_rows_by_file` against a look-up of every row per file number, on runs of files and on shuffled rows."""
    rng = random.Random(7)
    for case in range(60):
        runs = [[rng.randrange(6)] * rng.randrange(0, 40) for _ in range(rng.randrange(0, 6))]
        flat = [n for run in runs for n in run]
        if case % 2:
            rng.shuffle(flat)
        file_of = np.array(flat, dtype=np.int64)
        got = AV._rows_by_file(file_of)
        assert sorted(got) == sorted(set(flat))
        for n, positions in got.items():
            assert positions.tolist() == [i for i, f in enumerate(flat) if f == n]


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_split_grouped_is_each_keys_rows_and_values_over_any_batches(seed: int) -> None:
    """`split_grouped` over an answer in several batches, some in key order and some not, one empty, a key's rows
    split across batches: each key's (row id, value) pairs are those of the answer, written plainly; a presence-only
    key has no values."""
    import pyarrow as pa

    rng = random.Random(seed)
    keys = ["a", "b", "c", f"{AV.OWN_PREFIX}x", "d"]
    rows: list[tuple[str, str, list[int]]] = []
    for k in keys:
        for j in range(rng.randint(1, 6)):
            rows.append((k, f"{k}{j}", [rng.randrange(50) for _ in range(rng.randint(1, 4))]))
    rows.sort(key=lambda r: r[0])
    cuts = sorted(rng.sample(range(1, len(rows)), 3))
    batches = []
    for a, b in zip([0, *cuts], [*cuts, len(rows)], strict=True):
        part = rows[a:b]
        if rng.random() < 0.5:
            rng.shuffle(part)
        batches.append(pa.record_batch([pa.array([r[0] for r in part]), pa.array([r[1] for r in part]),
                                        pa.array([r[2] for r in part], pa.list_(pa.int64()))],
                                       names=["k", "v", "rids"]))
    batches.insert(1, batches[0].slice(0, 0))  # an empty batch (a query's answer may have one)
    got = AV.split_grouped(pa.Table.from_batches(batches))
    want: dict[str, list[tuple[int, str]]] = {}
    for k, v, row_ids in rows:
        want.setdefault(k, []).extend((r, v) for r in row_ids)
    assert set(got) == set(want)
    for k, (rids, codes, values) in got.items():
        if k.startswith(AV.OWN_PREFIX):
            assert values is None and sorted(rids.tolist()) == sorted(r for r, _ in want[k])
            continue
        assert values is not None and len(set(values.to_pylist())) == len(values)
        texts = values.to_pylist()
        assert sorted(zip(rids.tolist(), [texts[c] for c in codes.tolist()], strict=True)) == sorted(want[k])


@pytest.mark.parametrize("spread", [1, 1 << 40])
def test_frame_positions_of_row_ids_dense_or_not(spread: int) -> None:
    """A row id's frame position, whether the frame's ids are dense (a table) or spread (a search)."""
    import numpy as np

    rng = np.random.default_rng(spread % 97)
    frame = rng.permutation(np.arange(0, 3000, 3, dtype=np.int64) * spread)
    where = {int(r): i for i, r in enumerate(frame.tolist())}
    asked = rng.choice(frame, size=500)
    assert A._Positions(frame)(asked).tolist() == [where[int(r)] for r in asked.tolist()]
