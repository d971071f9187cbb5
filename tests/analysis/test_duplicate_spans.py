"""A request span stored more than once (the same trace and span id: an exporter's retry, two collectors), its copies
differing in times, outcome, replica, service, model, tenant, tokens and attribute maps, some equal in everything
but the map: the request is read from one copy, the first by analysis.engine.model.COPY_ORDER, whatever order the
rows and files come in, on the fly or materialized, on DuckDB or ClickHouse (chdb). Each check is against a plain
reference of the rule (`_first_copy`) over the stored spans' promoted columns (promotion is not what is tested),
on shuffled rows split into random files, seeds 1-5."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from analysis import build_report, connect
from analysis.engine import attribute_values as AV
from analysis.engine import model as M
from analysis.engine.materialize import materialize, partition_dir
from tests.factory import T0, hex_id
from tracing import schema as S
from tracing.rows import SpanBatch
from tracing.store import SegmentWriter

N_REQUESTS = 60
HOUR = M.HOUR_NS
#: The copy's columns the rule reads, in COPY_ORDER's order, as the `spans` view names them.
SPAN_COLUMNS = ("TimestampNs", "EndNs", "Outcome", "ServiceName", "Replica", "SpanName", "ParentSpanId", "Model",
                "ModelVersion", "Tenant", "InputTokens", "OutputTokens", "TtftNs",
                f"SpanAttributes['{S.ATTR_STREAMING}']", "coalesce(AdjustedCount, 1.0)")
ATTR_KEYS = ("color", "size", "zone")


def _spans(rng: random.Random) -> list[dict[str, Any]]:
    """Requests (two hours) with one generation span each; about half stored two or three times, the copies apart in
    one or more columns or only in their attribute maps (copies of one span start in the same hour)."""
    out: list[dict[str, Any]] = []
    for n in range(N_REQUESTS):
        trace, sid = hex_id("t", n, size=32), hex_id("r", n)
        start = T0 + (n % 2) * HOUR + rng.randrange(10**9, HOUR - 10**11)
        base: dict[str, Any] = {
            "trace_id": trace, "span_id": sid, "parent_span_id": "", "name": "chat", "kind": "Server",
            "start_ns": start, "end_ns": start + rng.randrange(10**8, 10**10), "service": "llm",
            "replica": "r-1", "status_code": "Unset",
            "attrs": {S.ATTR_REQUEST: "true", "gen_ai.request.model": "m-a", "tailscope.tenant": "t-a",
                      "gen_ai.usage.output_tokens": "20", "color": "red", "size": "3"}}
        copies = [base]
        for _ in range(rng.choice((0, 0, 1, 1, 2))):
            c = {**base, "attrs": dict(base["attrs"])}
            for _ in range(rng.choice((0, 1, 1, 2))):  # 0: equal in every column, the map aside
                what = rng.choice(("start", "end", "status", "replica", "service", "model", "tenant", "tokens"))
                if what == "start":
                    c["start_ns"] += rng.choice((-1, 1)) * rng.randrange(1, 10**8)
                elif what == "end":
                    c["end_ns"] += rng.choice((-1, 1)) * rng.randrange(1, 10**8)
                elif what == "status":
                    c["status_code"] = "Error"
                elif what == "replica":
                    c["replica"] = rng.choice(("r-0", "r-2", None))
                elif what == "service":
                    c["service"] = rng.choice(("gateway", "llm-b"))
                elif what == "model":
                    c["attrs"]["gen_ai.request.model"] = rng.choice(("m-b", "m-0"))
                elif what == "tenant":
                    c["attrs"]["tailscope.tenant"] = rng.choice(("t-b", "t-0"))
                else:
                    c["attrs"]["gen_ai.usage.output_tokens"] = str(rng.choice((1, 19, 200)))
            c["end_ns"] = max(c["end_ns"], c["start_ns"] + 1)
            for key in ATTR_KEYS:  # the maps: a value changed, a key dropped or added
                r = rng.random()
                if r < 0.3:
                    c["attrs"][key] = rng.choice(("blue", "green", "7", "4"))
                elif r < 0.45:
                    c["attrs"].pop(key, None)
            copies.append(c)
        out += copies
        gen = rng.choice(copies)  # a stage span over part of the request: its share depends on the copy read
        g0 = gen["start_ns"] + rng.randrange(-10**7, 10**8)
        out.append({"trace_id": trace, "span_id": hex_id("g", n), "parent_span_id": sid, "name": "generation",
                    "kind": "Internal", "start_ns": g0, "end_ns": g0 + rng.randrange(10**7, 10**10), "service": "llm",
                    "replica": None, "status_code": "Unset", "attrs": {S.ATTR_STAGE: "generation"}})
    return out


def _write(store: Path, spans: list[dict[str, Any]], rng: random.Random) -> None:
    """The spans shuffled, cut into one to four segments at random points."""
    spans = spans[:]
    rng.shuffle(spans)
    cuts = sorted(rng.sample(range(1, len(spans)), rng.randrange(0, 4)))
    for i, (a, b) in enumerate(zip([0, *cuts], [*cuts, len(spans)], strict=True)):
        batch = SpanBatch()
        for sp in spans[a:b]:
            batch.append(resource={}, **sp)
        SegmentWriter(store, kind=f"w{i}").write(batch.to_table())


def _null_first(x: Any) -> tuple[Any, ...]:
    return (0,) if x is None else (1, x)


def _first_copy(rows: list[tuple[Any, ...]]) -> tuple[Any, ...]:
    """The reference rule: the earliest start, then the latest end, then the other columns ascending (NULL first),
    then the attribute map's entries sorted by key."""
    def key(r: tuple[Any, ...]) -> tuple[Any, ...]:
        start, end, *rest, attrs = r
        return (start, -end, *map(_null_first, rest), sorted(attrs.items()))
    return min(rows, key=key)


def _reference(store: Path) -> dict[tuple[str, str], tuple[Any, ...]]:
    """(trace id, span id) -> the copy the rule picks: SPAN_COLUMNS then the attribute map."""
    con = connect(store)
    copies: dict[tuple[str, str], list[tuple[Any, ...]]] = {}
    for row in con.execute(f"SELECT TraceId, SpanId, {', '.join(SPAN_COLUMNS)}, SpanAttributes FROM spans "
                           "WHERE IsRequest").fetchall():
        copies.setdefault((row[0], row[1]), []).append(tuple(row[2:]))
    assert sum(len(c) > 1 for c in copies.values()) > N_REQUESTS // 4  # the case is there
    return {k: _first_copy(c) for k, c in copies.items()}


def _generation(store: Path) -> dict[str, tuple[int, int]]:
    con = connect(store)
    return {t: (s, e) for t, s, e in con.execute(
        "SELECT TraceId, TimestampNs, EndNs FROM spans WHERE Stage = 'generation'").fetchall()}


def _expected_row(copy: tuple[Any, ...], gen: tuple[int, int]) -> tuple[Any, ...]:
    """The requests columns the picked copy gives (generation: its stage span clipped to the copy)."""
    start, end, outcome, service, replica, name, _parent, model, _mv, tenant, _inp, out, _ttft, _st, adj, _ = copy
    g = max(0, min(end, gen[1]) - max(start, gen[0]))
    return (start, end - start, outcome or "ok", service, replica, name, model, tenant, out, adj, g, end - start - g)


REQUEST_COLUMNS = ("start_ns", "e2e_ns", "status", "service", "replica", "span_name", "model", "tenant",
                   "output_tokens", "adjusted_count", "generation_ns", "other_ns")


def _requests(store: Path) -> dict[tuple[str, str], tuple[Any, ...]]:
    rows = connect(store).execute(f"SELECT trace_id, span_id, {', '.join(REQUEST_COLUMNS)} FROM requests").fetchall()
    out = {(r[0], r[1]): tuple(r[2:]) for r in rows}
    assert len(out) == len(rows), "a request read twice"
    return out


def _attribute_maps(store: Path) -> dict[tuple[str, str], dict[str, str]]:
    """Each request's map as the attribute reads take it (AV.request_attribute_sql, the SQL of the live report, the
    reader's kept values and the hour files)."""
    con = connect(store)
    con.execute("CREATE TEMP TABLE f AS SELECT row_number() OVER () AS rid, trace_id, span_id, start_ns FROM requests")
    rows = con.execute(f"SELECT f.trace_id, f.span_id, a.a FROM ({AV.request_attribute_sql('SELECT * FROM f')}) a "
                       "JOIN f USING (rid)", {"lo": None, "hi": None}).fetchall()
    out = {(t, s): dict(a) for t, s, a in rows}
    assert len(out) == len(rows), "a request's map read twice"
    return out


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_one_copy_by_the_rule_in_any_order_live_or_materialized(tmp_path: Path, seed: int) -> None:
    spans = _spans(random.Random(seed))
    store = tmp_path / "s"
    _write(store, spans, random.Random(1000 + seed))
    ref = _reference(store)
    gen = _generation(store)
    want = {k: _expected_row(c, gen[k[0]]) for k, c in ref.items()}
    maps = {k: c[-1] for k, c in ref.items()}
    assert _requests(store) == want
    assert _attribute_maps(store) == maps
    # the attribute filter's value of a request attribute: the picked copy's
    con = connect(store)
    for key in ATTR_KEYS:
        one = M.request_copy_sql(M.DUCKDB, "spans", "TRUE", {"v": f"SpanAttributes['{key}']"})
        got = {(t, s): v for t, s, v in con.execute(f"SELECT TraceId, SpanId, v FROM ({one})").fetchall()}
        assert got == {k: m.get(key) for k, m in maps.items()}, key
    # materialized: the hours' request rows and attribute files read the same copies
    materialize(store)
    assert _requests(store) == want
    con = connect(store)
    for hour in (T0, T0 + HOUR):
        [path] = partition_dir(store, hour).glob("requests-*.parquet")
        keys = con.execute(f"SELECT trace_id, span_id FROM read_parquet('{path}')").fetchall()
        hour_file = AV.HourFile(AV.attributes_path(path))
        for key in ATTR_KEYS:
            col = hour_file.column(AV.column_name("request", key))
            values = col.dictionary.to_pylist()
            assert [values[i] for i in col.indices.to_pylist()] == [maps[k].get(key) for k in keys], key


def test_the_report_is_the_same_in_any_order_live_or_materialized(tmp_path: Path) -> None:
    spans = _spans(random.Random(7))
    reports = []
    for n in range(2):
        store = tmp_path / f"s{n}"
        _write(store, spans, random.Random(70 + n))
        reports.append(json.dumps(build_report(connect(store)), sort_keys=True))
        materialize(store)
        reports.append(json.dumps(build_report(connect(store)), sort_keys=True))
    assert len(set(reports)) == 1


@pytest.mark.slow  # ClickHouse (chdb)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_clickhouse_reads_the_same_copies(tmp_path: Path, seed: int, chdb_client: Any) -> None:
    """The spans exported to chdb (one segment, rows shuffled: an export keeps the copies of one segment): the
    requests, the attribute maps and the report's attributes are those of the rule, as on DuckDB."""
    from analysis.clickhouse.export import export_store
    from analysis.clickhouse.promotion import source_sql
    from analysis.clickhouse.report import build_report as ch_report
    from analysis.clickhouse.requests import requests_facts

    spans = _spans(random.Random(seed))
    rng = random.Random(2000 + seed)
    rng.shuffle(spans)
    store = tmp_path / "s"
    batch = SpanBatch()
    for sp in spans:
        batch.append(resource={}, **sp)
    SegmentWriter(store, kind="one").write(batch.to_table())
    ref = _reference(store)
    gen = _generation(store)
    table = f"t_dup_{seed}"
    chdb_client.command(f"DROP TABLE IF EXISTS {table}")
    export_store(store, chdb_client, table)
    facts = requests_facts(chdb_client, table, name="_dup_facts", materialized=False)
    rows = chdb_client.query(f"SELECT trace_id, span_id, {', '.join(REQUEST_COLUMNS)} FROM {facts}").to_pylist()
    got = {(r["trace_id"], r["span_id"]): tuple(r[c] for c in REQUEST_COLUMNS) for r in rows}
    assert len(got) == len(rows)
    assert got == {k: _expected_row(c, gen[k[0]]) for k, c in ref.items()}
    one = M.request_copy_sql(M.CLICKHOUSE, source_sql(table), "TRUE", {"a": "SpanAttributes"})
    maps = chdb_client.query(f"SELECT TraceId, SpanId, a FROM ({one})").to_pylist()
    assert {(r["TraceId"], r["SpanId"]): dict(r["a"]) for r in maps} == {k: c[-1] for k, c in ref.items()}
    assert ch_report(chdb_client, table)["attributes"] == build_report(connect(store))["attributes"]


@pytest.fixture(scope="module")
def chdb_client(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from analysis.clickhouse import client as C

    c = C.open_client(f"chdb:{tmp_path_factory.mktemp('chdb')}")
    yield c
    c.close()
