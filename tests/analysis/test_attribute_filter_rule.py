"""The attribute filter's rule of one value per request, against a plain reference on random spans, in DuckDB and
in ClickHouse (chdb): a request span's own value; the value its trace's stage spans agree on among those starting
in the request's read hours (its hour and the hour on either side: two requests of one trace in different hours
may differ); the value a replica's request and worker-stage spans agree on. Filters (one value or several, several
keys at once) keep exactly the requests the reference keeps, and grouping labels each request as the reference
does (numbers by their bucket)."""

from __future__ import annotations

import random
from typing import Any

import duckdb
import pyarrow as pa
import pytest

from analysis.attribute_filters import AttributeFilter, value_relation, where_all
from analysis.engine import attribute_values as AV
from analysis.engine import model as M
from analysis.engine.dialect import CLICKHOUSE, DUCKDB, Dialect

H = M.HOUR_NS
T0 = 1_700_000_000 * 1_000_000_000 // H * H  # an hour boundary
REPLICAS = ("r0", "r1", "r2", "r3", "r4")
#: number buckets the filter offers for "n" (label -> ends): 0 its own bucket, then powers of two
BUCKETS = {"0-0": (0, 0), "1-1": (1, 1), "2-3": (2, 3), "16-31": (16, 31), "4096-8191": (4096, 8191)}
SPAN_COLUMNS = ("TraceId", "SpanId", "TimestampNs", "Stage", "IsRequest", "Replica", "keys", "vals", "rkeys", "rvals")


def _spans(seed: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(spans, requests) of random traces over five hours: some traces hold two requests hours apart, stage spans
    lie up to three hours either side, some replicas' processes disagree on their rack."""
    rng = random.Random(seed)
    spans: list[dict[str, Any]] = []
    requests: list[dict[str, Any]] = []
    racks = {r: [f"rack-{i % 2}"] for i, r in enumerate(REPLICAS)}
    racks["r4"] = ["rack-0", "rack-1"]  # its spans disagree: no value
    for t in range(160):
        trace = f"t{seed}-{t}"
        rep = rng.choice(REPLICAS)
        first = T0 + rng.randrange(5 * H)
        starts = [first] + ([first + rng.choice([-2, -1, 1, 2, 3]) * H + rng.randrange(H)] if rng.random() < 0.3
                            else [])
        for i, start in enumerate(starts):
            attrs = {"color": rng.choice(["red", "green", "blue"])}
            if rng.random() < 0.7:
                attrs["n"] = str(rng.choice([0, 1, 3, 17, 4096]))
            spans.append({"TraceId": trace, "SpanId": f"{trace}-q{i}", "TimestampNs": start, "Stage": None,
                          "IsRequest": True, "Replica": rep, "attrs": attrs,
                          "res": {"rack": rng.choice(racks[rep]), "zone": "z1"}})
            requests.append({"trace_id": trace, "span_id": f"{trace}-q{i}", "start_ns": start, "replica": rep})
        for j in range(rng.randrange(1, 5)):
            stage = rng.choice(["prefill", "decode", "queue", "streaming"])
            sattrs = {"phase": v} if (v := rng.choice(["a", "b", "a", None])) is not None else {}
            rack = rng.choice(racks[rep]) if stage in M.WORKER_STAGES else "rack-9"  # a queue's rack is not read
            spans.append({"TraceId": trace, "SpanId": f"{trace}-s{j}",
                          "TimestampNs": first + rng.randrange(-3 * H, 4 * H), "Stage": stage, "IsRequest": False,
                          "Replica": rep, "attrs": sattrs, "res": {"rack": rack, "zone": "z1"}})
    return spans, requests


def _reference(spans: list[dict[str, Any]], requests: list[dict[str, Any]]) -> dict[str, dict[tuple[str, str], str]]:
    """Each request's value per source and key, written plainly from the rules (the module's docstring)."""
    out: dict[str, dict[tuple[str, str], str]] = {}
    by_rep: dict[str, dict[str, set[str]]] = {}
    for s in spans:
        if s["IsRequest"] or s["Stage"] in M.WORKER_STAGES:
            for k, v in s["res"].items():
                by_rep.setdefault(s["Replica"], {}).setdefault(k, set()).add(v)
    for r in requests:
        own = next(s for s in spans if s["SpanId"] == r["span_id"])
        vals = {("request", k): v for k, v in own["attrs"].items()}
        hour = r["start_ns"] // H * H
        seen: dict[str, set[str]] = {}
        for s in spans:
            if s["TraceId"] == r["trace_id"] and s["Stage"] is not None and hour - H <= s["TimestampNs"] < hour + 2 * H:
                for k, v in s["attrs"].items():
                    seen.setdefault(k, set()).add(v)
        vals |= {("stage", k): next(iter(v)) for k, v in seen.items() if len(v) == 1}
        vals |= {("resource", k): next(iter(v)) for k, v in by_rep.get(r["replica"], {}).items() if len(v) == 1}
        out[r["span_id"]] = vals
    return out


def _label(source: str, key: str, value: str) -> str:
    if key != "n":
        return value
    x = int(value)
    return next(lab for lab, (lo, hi) in BUCKETS.items() if lo <= x <= hi)


def _columns(spans: list[dict[str, Any]]) -> dict[str, list[Any]]:
    return {"TraceId": [s["TraceId"] for s in spans], "SpanId": [s["SpanId"] for s in spans],
            "TimestampNs": [s["TimestampNs"] for s in spans], "Stage": [s["Stage"] for s in spans],
            "IsRequest": [s["IsRequest"] for s in spans], "Replica": [s["Replica"] for s in spans],
            "keys": [list(s["attrs"]) for s in spans], "vals": [list(s["attrs"].values()) for s in spans],
            "rkeys": [list(s["res"]) for s in spans], "rvals": [list(s["res"].values()) for s in spans]}


def _unread(engine: str) -> str:
    """The span columns the rule does not read, which a request span's copies are ordered by (model.COPY_ORDER):
    none, as in spans without them (one copy of each span here)."""
    texts = ("Outcome", "ServiceName", "SpanName", "ParentSpanId", "Model", "ModelVersion", "Tenant")
    ints = ("InputTokens", "OutputTokens", "TtftNs")
    null = {"duckdb": "NULL::{}", "clickhouse": "CAST(NULL, 'Nullable({})')"}[engine]
    types = {"duckdb": ("VARCHAR", "BIGINT", "DOUBLE"), "clickhouse": ("String", "Int64", "Float64")}[engine]
    return ", ".join(["0 AS Duration", *(f"{null.format(types[0])} AS {c}" for c in texts),
                      *(f"{null.format(types[1])} AS {c}" for c in ints), f"{null.format(types[2])} AS AdjustedCount"])


def _duckdb(spans: list[dict[str, Any]], requests: list[dict[str, Any]]) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.register("raw", pa.table(_columns(spans)))
    con.register("req_raw", pa.Table.from_pylist(requests))
    con.execute("CREATE TABLE spans AS SELECT TraceId, SpanId, TimestampNs, Stage, IsRequest, Replica, "
                f"map(keys, vals) AS SpanAttributes, map(rkeys, rvals) AS ResourceAttributes, {_unread('duckdb')} "
                "FROM raw")
    con.execute("CREATE TABLE requests AS SELECT * FROM req_raw")
    return con


class _Chdb:
    """The same tables in chdb, queried as the dashboard's ClickHouse bench queries its session tables."""

    def __init__(self, client: Any, spans: list[dict[str, Any]], requests: list[dict[str, Any]], tag: str) -> None:
        self.client, self.spans, self.requests = client, f"spans_{tag}", f"requests_{tag}"
        for name in (self.spans, self.requests, f"raw_{tag}"):
            client.command(f"DROP TABLE IF EXISTS {name}")
        client.command(f"CREATE TABLE raw_{tag} (TraceId String, SpanId String, TimestampNs Int64, Stage "
                       "Nullable(String), IsRequest Bool, Replica Nullable(String), keys Array(String), vals "
                       "Array(String), rkeys Array(String), rvals Array(String)) ENGINE = Memory")
        client.insert_arrow(f"raw_{tag}", pa.table(_columns(spans)))
        client.command(f"CREATE TABLE {self.spans} ENGINE = Memory AS SELECT TraceId, SpanId, TimestampNs, Stage, "
                       "IsRequest, Replica, mapFromArrays(keys, vals) AS SpanAttributes, mapFromArrays(rkeys, rvals) "
                       f"AS ResourceAttributes, {_unread('clickhouse')} FROM raw_{tag}")
        client.command(f"CREATE TABLE {self.requests} (trace_id String, span_id String, start_ns Int64, replica "
                       "Nullable(String)) ENGINE = Memory")
        client.insert_arrow(self.requests, pa.Table.from_pylist(requests))


def _filters(rng: random.Random) -> list[AttributeFilter]:
    """One to three random filters on different keys of every source, values picked at random (some absent)."""
    pool = [("request", "color", ["red", "green", "blue", "none-such"]), ("request", "n", list(BUCKETS)),
            ("stage", "phase", ["a", "b"]), ("resource", "rack", ["rack-0", "rack-1", "rack-9"]),
            ("resource", "zone", ["z1"])]
    out = []
    for source, key, values in rng.sample(pool, rng.randint(1, 3)):
        picked = tuple(sorted(rng.sample(values, rng.randint(1, len(values)))))
        ranges = tuple(BUCKETS[v] for v in picked) if key == "n" else ()
        out.append(AttributeFilter(key, source, picked, ranges))
    return out


def _kept(ref: dict[str, dict[tuple[str, str], str]], filters: list[AttributeFilter]) -> set[str]:
    return {sid for sid, vals in ref.items()
            if all((f.source, f.key) in vals and _label(f.source, f.key, vals[(f.source, f.key)]) in f.values
                   for f in filters)}


def _choice(source: str, key: str) -> dict[str, Any]:
    if key == "n":
        return {"source": source, "kind": "number", "values": list(BUCKETS), "ranges": BUCKETS}
    return {"source": source, "kind": "text", "values": [], "ranges": {}}


def _check(run: Any, d: Dialect, requests: str, spans: str, ref: dict[str, dict[tuple[str, str], str]],
           seed: int) -> None:
    """Filters and groupings of `run(sql, params) -> rows` against the reference."""
    rng = random.Random(seed * 7)
    for trial in range(25):
        filters = _filters(rng)
        cond, params = where_all(filters, "", d, requests, spans)
        kept = {r[0] for r in run(f"SELECT span_id FROM {requests} WHERE {cond}", params)}
        assert kept == _kept(ref, filters), (seed, trial, filters)
    for source, key in (("request", "color"), ("request", "n"), ("stage", "phase"), ("resource", "rack")):
        rel = value_relation(requests, key, _choice(source, key), d=d, requests=requests, spans=spans)
        got = dict(run(f"SELECT span_id, replica FROM {rel}", []))
        want = {sid: _label(source, key, vals[(source, key)]) if (source, key) in vals else None
                for sid, vals in ref.items()}
        assert got == want, (seed, source, key)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_filter_keeps_the_requests_the_rule_gives_on_duckdb(seed: int) -> None:
    spans, requests = _spans(seed)
    ref = _reference(spans, requests)
    # the draw reaches every case: two requests of one trace whose stage values differ, a replica without a rack
    assert any(ref[a].get(("stage", "phase")) != ref[b].get(("stage", "phase"))
               for a in ref for b in ref if a < b and a.rsplit("-", 1)[0] == b.rsplit("-", 1)[0])
    assert any(("resource", "rack") not in v for v in ref.values())
    con = _duckdb(spans, requests)
    _check(lambda sql, params: con.execute(sql, params).fetchall(), DUCKDB, "requests", "spans", ref, seed)
    # the report reads the stage values by the same rule (analysis.engine.attribute_values)
    facts = "SELECT row_number() OVER (ORDER BY span_id) AS rid, trace_id, span_id, start_ns FROM requests"
    rows = con.execute(f"SELECT f.span_id, s.k, s.v FROM ({AV.stage_attribute_sql(facts)}) s JOIN ({facts}) f "
                       "ON f.rid = s.rid", {"lo": None, "hi": None}).fetchall()
    assert {(sid, k): v for sid, k, v in rows} == {(sid, k): v for sid, vals in ref.items()
                                                  for (src, k), v in vals.items() if src == "stage"}


@pytest.mark.slow  # ClickHouse (chdb)
@pytest.mark.parametrize("seed", [1, 2])
def test_the_filter_keeps_the_requests_the_rule_gives_on_clickhouse(chdb_client: Any, seed: int) -> None:
    spans, requests = _spans(seed)
    ref = _reference(spans, requests)
    ch = _Chdb(chdb_client, spans, requests, f"s{seed}")

    def run(sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
        assert not params  # ClickHouse's SQL carries its values as literals
        return [tuple(r.values()) for r in chdb_client.query(sql, {"join_use_nulls": 1}).to_pylist()]

    _check(run, CLICKHOUSE, ch.requests, ch.spans, ref, seed)
