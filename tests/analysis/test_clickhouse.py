"""ClickHouse as the engine, tested in chdb: DSNs, the promotion rules in SQL, the request model and the report.

The promotion SQL is compared with tracing/rows.py on random attribute maps; `requests` and
`report --json` are compared between DuckDB (the store) and chdb (the store exported into an
otel_traces table with the exporter's shape) on every catalogue sample.
"""

from __future__ import annotations

import random
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analysis import clickhouse as C
from analysis.clickhouse.export import export_store, insert_sql, staging_columns
from analysis.clickhouse.report import build_report as ch_report
from analysis.contract import Report
from analysis.engine import model as M
from analysis.engine.connect import connect, request_engines
from analysis.report import build_report
from analysis.stats import explain as X
from tests import samples_cache
from tests.analysis.recording import Recording
from tracing import rows as R
from tracing import schema as S
from tracing.errors import TailscopeError

pytestmark = pytest.mark.slow  # ClickHouse (chdb) end to end on catalogue samples (make test-fast leaves it out)

DATA = Path(__file__).resolve().parents[2] / "sample_traces" / "data"
SAMPLES = sorted(p for p in DATA.rglob("*.otlp.jsonl.gz") if p.name != "demo.otlp.jsonl.gz")
MINUTE_NS = 60_000_000_000



@pytest.mark.parametrize("text", ["", "chdb:", "postgres://x@y/z", "clickhouse://", "clickhouse://h:notaport/db",
                                  "clickhouse://u@h:8123/bad-db;"])
def test_a_bad_dsn_is_one_clear_error(text: str) -> None:
    with pytest.raises(C.DsnError) as err:
        C.parse_dsn(text)
    assert isinstance(err.value, TailscopeError) and "\n" not in str(err.value)


def test_dsns_read_both_forms() -> None:
    assert C.parse_dsn("chdb:some/dir") == C.Dsn("chdb", path="some/dir")
    d = C.parse_dsn("clickhouse://ann:p%40ss@127.0.0.1:9000/traces")
    assert (d.kind, d.host, d.port, d.user, d.password, d.database) == ("http", "127.0.0.1", 9000, "ann", "p@ss",
                                                                           "traces")
    assert C.parse_dsn("clickhouse://127.0.0.1").port == C.DEFAULT_PORT
    assert "p@ss" not in str(d)


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Any:
    c = C.open_client(f"chdb:{tmp_path_factory.mktemp('chdb')}")
    yield c
    c.close()


def test_session_settings_in_force(client: Any) -> None:
    """Every session runs with SESSION_SETTINGS and, where the server has them (chdb's release does),
    IF_KNOWN_SETTINGS."""
    from analysis.clickhouse.client import IF_KNOWN_SETTINGS, SESSION_SETTINGS

    want = SESSION_SETTINGS | IF_KNOWN_SETTINGS
    names = ", ".join(f"'{k}'" for k in want)
    got = client.query(f"SELECT name, value FROM system.settings WHERE name IN ({names})").to_pylist()
    assert {r["name"]: r["value"] for r in got} == {k: str(v) for k, v in want.items()}


_KEYS = [S.ATTR_STAGE, S.ATTR_REQUEST, S.ATTR_OUTCOME, S.ATTR_TTFT_NS, S.ATTR_TIME_TO_FIRST_CHUNK, S.ATTR_OPERATION,
         S.ATTR_ERROR_TYPE,
         *S.MODEL_KEYS, *S.MODEL_VERSION_KEYS, *S.TENANT_KEYS, *S.INPUT_TOKEN_KEYS, *S.OUTPUT_TOKEN_KEYS]
_WORDS = ["", "true", "TRUE", "True ", "false", "prefill", "decode", "queue_wait", "bogus", "ok", "timeout",
          "cancelled", "error", "Deadline_Exceeded", "TIMED_OUT", "Canceled", "read time-out", "m1", "tenant-a"]
_NUMS = ["12", " 12 ", "+7", "-3", "1_000", "1__0", "12.9", "-0.5", "1e3", "1.5E2", ".5", "5.", "inf", "nan",
         "0x10", "9223372036854775807", "9223372036854775808", "-9223372036854775808", "9.3e18", "1e400", "abc",
         "", "\t42\n", "1_0.5", "00012", "1e", "--1", "0.25", "0.1234567895", "0.0000000005", "3.5"]
_UUID = "3f2b8c1e-4a5d-4e6f-8a9b-0c1d2e3f4a5b"


def _random_span(rng: random.Random) -> dict[str, Any]:
    attrs: dict[str, str] = {}
    for key in rng.sample(_KEYS, rng.randint(0, 7)):
        numeric = key in (S.ATTR_TTFT_NS, S.ATTR_TIME_TO_FIRST_CHUNK, *S.INPUT_TOKEN_KEYS, *S.OUTPUT_TOKEN_KEYS)
        attrs[key] = rng.choice(_NUMS if numeric and rng.random() < 0.8 else _WORDS)
    res: dict[str, str] = {}
    for key in rng.sample(list(S.REPLICA_RESOURCE_KEYS), rng.randint(0, 4)):
        res[key] = rng.choice(["", "pod-1", "host-a", _UUID, _UUID + "\n", _UUID.upper(), _UUID + "x", "7"])
    if rng.random() < 0.3:
        attrs[rng.choice(S.SAMPLE_RATE_KEYS)] = rng.choice(["10", "4.5", "0.5", "x", "", "1e3", "100"])
    kind = rng.choice(S.SPAN_KINDS)
    status = rng.choice(S.STATUS_CODES)
    old = rng.random() < 0.5
    return {"SpanName": rng.choice(["prefill", "generation", "chat", "decode", "x"]),
            "SpanKind": f"SPAN_KIND_{kind.upper()}" if old else kind, "kind": kind,
            "StatusCode": f"STATUS_CODE_{status.upper()}" if old else status, "status": status,
            "SpanAttributes": attrs, "ResourceAttributes": res, "TraceState": rng.choice(_TRACE_STATES)}


#: Sampling records: thresholds of every length, malformed ones, other vendors' members around `ot`.
_TRACE_STATES = ["", "ot=th:8", "ot=th:c", "ot=th:0", "ot=th:fd70a3d70a3d7", "ot=th:fffffffffffff",
                 "vendor=x,ot=th:4;rv:abcdef12345678", "ot=rv:1234", "ot=th:G", "ot=th:123456789abcdef",
                 " ot=th:e ,b=2", "a=1", "ot=th:"]


def _py_promoted(s: dict[str, Any]) -> dict[str, Any]:
    attrs, res = s["SpanAttributes"], s["ResourceAttributes"]
    stage = R.stage_of(s["SpanName"], attrs)
    req = R.is_request(s["kind"], stage, attrs)
    return {"Stage": stage, "IsRequest": req, "Outcome": R.outcome_of(s["status"], attrs) if req else None,
            "Replica": R.replica_of(res), "Model": R.first_attr(attrs, S.MODEL_KEYS),
            "ModelVersion": R.first_attr(attrs, S.MODEL_VERSION_KEYS), "Tenant": R.first_attr(attrs, S.TENANT_KEYS),
            "InputTokens": R.attr_int(R.first_attr(attrs, S.INPUT_TOKEN_KEYS)),
            "OutputTokens": R.attr_int(R.first_attr(attrs, S.OUTPUT_TOKEN_KEYS)),
            "TtftNs": R.ttft_ns_of(attrs),
            "AdjustedCount": R.adjusted_count_of(s["TraceState"], attrs)}


def test_promotion_in_sql_equals_tracing_rows_on_random_spans(client: Any) -> None:
    rng = random.Random(12)
    spans = [_random_span(rng) for _ in range(1500)]
    attrs = pa.map_(pa.string(), pa.string())
    data = pa.table({
        "i": pa.array(range(len(spans)), pa.int64()),
        "SpanName": [s["SpanName"] for s in spans], "SpanKind": [s["SpanKind"] for s in spans],
        "StatusCode": [s["StatusCode"] for s in spans], "TraceState": [s["TraceState"] for s in spans],
        "SpanAttributes": pa.array([list(s["SpanAttributes"].items()) for s in spans], attrs),
        "ResourceAttributes": pa.array([list(s["ResourceAttributes"].items()) for s in spans], attrs)})
    client.command("DROP TABLE IF EXISTS rnd")
    client.command("CREATE TABLE rnd (i Int64, SpanName String, SpanKind String, StatusCode String, TraceState String, "
                   "SpanAttributes Map(LowCardinality(String), String), "
                   "ResourceAttributes Map(LowCardinality(String), String)) ENGINE = Memory")
    client.insert_arrow("rnd", data)
    p = C.promoted_sql(kind="_k", status="_s")
    got = client.query(f"SELECT i, {', '.join(f'{e} AS {n}' for n, e in p.items())} FROM "
                       f"(SELECT *, {C.kind_sql()} AS _k, {C.status_sql()} AS _s FROM rnd) ORDER BY i").to_pylist()
    assert len(got) == len(spans)
    for row, span in zip(got, spans, strict=True):
        want = _py_promoted(span)
        assert {k: row[k] for k in want} == want, span


#: client -> the samples exported through it (each once: the tests below only read the tables)
_exported: weakref.WeakKeyDictionary[Any, set[Path]] = weakref.WeakKeyDictionary()


def _store_and_table(sample: Path, factory: pytest.TempPathFactory, client: Any) -> tuple[Path, str]:
    """The sample's shared store (read only) and the ClickHouse table it was exported to (once per client)."""
    store = samples_cache.store(sample, factory)
    table = "t_" + sample.name.split(".")[0]
    done = _exported.setdefault(client, set())
    if sample.resolve() not in done:
        client.command(f"DROP TABLE IF EXISTS {table}")
        export_store(store, client, table)
        done.add(sample.resolve())
    return store, table


def _same_frames(duck: pl.DataFrame, ch: pl.DataFrame) -> None:
    assert duck.columns == ch.columns and duck.height == ch.height
    keys = ["trace_id", "span_id"]
    duck, ch = duck.sort(keys), ch.sort(keys)
    for col in duck.columns:
        a, b = duck.get_column(col), ch.get_column(col)
        if col == "start":
            b = b.dt.replace_time_zone(None)
        if a.dtype.is_float():
            assert ((a - b).abs() <= 1e-9 * a.abs().fill_null(1)).all(), col
        else:
            assert a.cast(pl.String).to_list() == b.cast(a.dtype).cast(pl.String).to_list(), col


@pytest.mark.parametrize("sample", SAMPLES, ids=[p.name.split(".")[0] for p in SAMPLES])
def test_requests_and_the_report_are_equal_on_duckdb_and_clickhouse(
        sample: Path, tmp_path_factory: pytest.TempPathFactory, client: Any) -> None:
    store, table = _store_and_table(sample, tmp_path_factory, client)
    con = connect(store)
    duck = con.sql("SELECT * FROM requests").pl()
    assert duck.height > 0
    C.materialize_requests(client, table)
    _same_frames(duck, pl.DataFrame(client.query("SELECT * FROM requests")))
    counted = Recording(client)
    got = ch_report(counted, table)
    assert got == build_report(con)
    if not got["spikes"]:  # detection on the server: one row per window a few times over (the windows' table, the
        # scan's counts above the pooled p99 and by block of scores), a few single rows, and a row per group of tied
        # values above the pooled p99 (fewer than those values, about 1 % of the requests)
        assert counted.rows - counted.ties <= 4 * got["windows"] + 16, (counted.rows, counted.ties, got["windows"])
        assert counted.ties <= got["requests"] // 100 + 1, (counted.ties, got["requests"])
    # the attribute pass: a row per key of each source and per replica and resource key, a few single rows; per
    # spike, twice (its culprit's bounds, then its explanation), a row per tail cell that may pass (at most
    # 1 / MIN_SHARE a combination holding an attribute, alone and with each built-in) and one of figures for its
    # cells, the nesting test's row and one of its p99s without the candidates; the exemplars' requests (at most
    # MAX_EXEMPLARS, more only on a tie); and a row per window of the slow requests of an attribute culprit. No
    # request's codes.
    attrs = got["attributes"]
    assert attrs is not None  # the attribute pass ran
    keys = len(attrs["considered"]) + len(attrs["skipped"])
    replicas = duck.get_column("replica").n_unique()
    cells = len(attrs["considered"]) * (1 + len(X.DIMENSIONS)) * round(1 / X.MIN_SHARE)
    per_spike = 2 * (cells + 3) + X.MAX_EXEMPLARS + got["windows"]
    assert counted.attribute_rows <= keys + (replicas + 1) * (keys + 1) + 4 + 2 * keys + per_spike * len(
        got["spikes"]), (counted.attribute_rows, keys)
    assert max(counted.attribute_each, default=0) <= max(keys, replicas * keys, got["windows"], cells,
                                                         X.MAX_EXEMPLARS)
    spans, requests = con.execute("SELECT count(*), count(*) FILTER (WHERE IsRequest) FROM spans").fetchone() or ()
    engines = request_engines(con)
    assert C.recognition_counts(client, table) == (spans, requests, engines)  # the report's coverage line
    assert bool(engines) == ("vllm" in sample.name or "sglang" in sample.name)
    if "vllm" in sample.name:
        assert ch_report(client, table, metric="ttft") == build_report(con, metric="ttft")


@pytest.mark.parametrize(("name", "seed"), [("slow_replica", 3), ("node_nic_flapping", 2)])
def test_a_spike_moved_to_its_culprits_windows_is_moved_alike(name: str, seed: int,
                                                             tmp_path_factory: pytest.TempPathFactory,
                                                             client: Any) -> None:
    """Runs where the culprit moves a spike's bounds (docs/methods.md, "Bounds: the culprit's windows"): detection
    gives 14:05-14:06 (the slow replica, seed 3) and 14:05-14:10 (the flapping node, seed 2); both engines report
    14:05-14:08, the same report. The slow requests are counted per window on the server."""
    store = samples_cache.seeded_store(name, seed, tmp_path_factory)  # the seeded accuracy files' store of the run
    table = f"t_bounds_{name}"
    client.command(f"DROP TABLE IF EXISTS {table}")
    export_store(store, client, table)
    duck = build_report(connect(store))
    assert [(s["start"], s["end"]) for s in duck["spikes"]] == [("2025-11-20T14:05:00Z", "2025-11-20T14:08:00Z")]
    assert ch_report(client, table) == duck


def test_past_the_memory_bound_the_model_runs_in_mergetree_tables(
        tmp_path_factory: pytest.TempPathFactory, client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the setting `memory_temp_mib` (0 here) the model's temporary tables are MergeTree (on disk, so a large
    table does not have to fit in the session's memory): the same requests and report as the store, and the tables'
    engine is it."""
    sample = next(p for p in SAMPLES if "vllm" not in p.name and "sglang" not in p.name)
    store, table = _store_and_table(sample, tmp_path_factory, client)
    con = connect(store)
    monkeypatch.setenv("TAILSCOPE_CLICKHOUSE_MEMORY_TEMP_MIB", "0")
    C.materialize_requests(client, table)
    engines = client.query("SELECT name, engine FROM system.tables WHERE is_temporary").to_pylist()
    assert {r["name"]: r["engine"] for r in engines}.get("requests") == "MergeTree"
    _same_frames(con.sql("SELECT * FROM requests").pl(),
                 pl.DataFrame(client.query("SELECT * FROM requests")))
    assert ch_report(client, table) == build_report(con)


def test_a_temporary_table_is_held_in_memory_up_to_the_setting(client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """`estimated_bytes` is the rows' count times their sampled width: fixed-width columns give the exact bytes
    (8 + 4 a row); `temp_engine` keeps them in memory up to `memory_temp_mib` MiB (default 512), on disk past it."""
    sql = "SELECT toUInt64(number) AS a, toUInt32(number) AS b FROM numbers(300000)"
    assert C.estimated_bytes(client, sql) == 300_000 * 12
    assert C.estimated_bytes(client, sql + " WHERE a > 300000") == 0
    assert C.memory_temp_bytes() == 512 * 2**20 and C.temp_engine(client, sql) == "Memory"
    monkeypatch.setenv("TAILSCOPE_CLICKHOUSE_MEMORY_TEMP_MIB", "3")  # 3 MiB < 3.6 MB
    assert C.temp_engine(client, sql) == C.ON_DISK
    monkeypatch.setenv("TAILSCOPE_CLICKHOUSE_MEMORY_TEMP_MIB", "4")
    assert C.temp_engine(client, sql) == "Memory"


def test_a_refusal_for_memory_is_one_line_saying_what_to_change(client: Any) -> None:
    """chdb refusing a query for memory: ClickHouse's reason without the parts it was reading, and the setting that
    keeps the model's tables on disk; a server's refusal (its code, 241) gets the same hint."""
    from tracing.errors import QueryError

    client.command("SET max_memory_usage = 20000000")
    try:
        with pytest.raises(QueryError) as err:
            client.query("SELECT groupArray(number) AS a FROM numbers(20000000)")
    finally:
        client.command("SET max_memory_usage = 0")
    said = str(err.value)
    assert said.startswith("ClickHouse refused a query for memory: ") and "\n" not in said
    assert "(MEMORY_LIMIT_EXCEEDED); the request model's temporary tables are held in memory up to 512 MiB " \
           "(TAILSCOPE_CLICKHOUSE_MEMORY_TEMP_MIB): lower it to keep them on disk" in said

    class Refused(Exception):
        code = 241

    dsn = C.parse_dsn("clickhouse://127.0.0.1:8123/db")
    line = C.http_failure(dsn, Refused("Code: 241. DB::Exception: Memory limit (for query) exceeded: would use 9.3 "
                                       "GiB, maximum: 9.3 GiB. (MEMORY_LIMIT_EXCEEDED) (version 25.8.1.1)"))
    assert C.memory_hint(line) == (
        f"ClickHouse at {dsn} failed the query: Memory limit (for query) exceeded: would use 9.3 GiB, maximum: 9.3 "
        "GiB (Code 241); the request model's temporary tables are held in memory up to 512 MiB "
        "(TAILSCOPE_CLICKHOUSE_MEMORY_TEMP_MIB): lower it to keep them on disk, or read a shorter time range")
    assert C.memory_hint("Unknown table (Code 60)") == "Unknown table (Code 60)"


def test_the_stage_step_reads_the_facts_copy_of_the_spans_only_when_it_holds_the_range(
        tmp_path_factory: pytest.TempPathFactory, client: Any) -> None:
    """`requests_from_copy` (the stage shares' request model over a spike's tails) reads the session's copy of the
    spans instead of promoting the table's spans again: the same rows as `materialize_requests` over the same spans,
    and only when the copy holds every span of the range asked and the facts asked about were computed from it (a
    copy of a narrower range, one made without `span_range`, or other facts: refused, and nothing is made)."""
    from analysis.clickhouse import model as CM

    sample = next(p for p in SAMPLES if "vllm" not in p.name and "sglang" not in p.name)
    store, table = _store_and_table(sample, tmp_path_factory, client)
    first, last = (int(x) for x in connect(store).execute("SELECT min(TimestampNs), max(TimestampNs) FROM spans "
                                                          "WHERE IsRequest").fetchone() or ())
    lo, hi = first + (last - first) // 3, first + 2 * (last - first) // 3
    traces = f"TraceId IN (SELECT TraceId FROM {table} WHERE cityHash64(TraceId) % 4 = 0)"
    cols = ("trace_id", "start_ns", *(f"{s}_ns" for s in S.CRITICAL_PATH_COLUMNS))
    C.materialize_requests(client, table, name="r_want", columns=cols, where=(
        f"Timestamp >= fromUnixTimestamp64Nano(toInt64({lo})) AND Timestamp < fromUnixTimestamp64Nano(toInt64({hi})) "
        f"AND {traces}"))
    want = client.query("SELECT * FROM r_want ORDER BY trace_id, start_ns").to_pylist()
    assert want
    C.materialize_requests(client, table, name="r_all", columns=("trace_id",))  # a copy, but not said to hold a range
    assert not CM.requests_from_copy(client, table, lo, hi, traces, name="r_got", columns=cols, facts="r_all")
    # a copy of a narrower range
    C.materialize_requests(client, table, name="r_all", columns=("trace_id",), span_range=(lo + 1, None))
    assert not CM.requests_from_copy(client, table, lo, hi, traces, name="r_got", columns=cols, facts="r_all")
    assert not CM.requests_from_copy(client, "t_other", lo, hi, traces, name="r_got", columns=cols, facts="r_all")
    C.materialize_requests(client, table, name="r_all", columns=("trace_id",), span_range=(None, None))
    # only for the requests table computed from that copy (the same spans, as they were then)
    assert not CM.requests_from_copy(client, table, lo, hi, traces, name="r_got", columns=cols, facts="other")
    assert CM.requests_from_copy(client, table, lo, hi, traces, name="r_got", columns=cols, facts="r_all")
    assert client.query("SELECT * FROM r_got ORDER BY trace_id, start_ns").to_pylist() == want


def _ns(t: int | None) -> int:
    """A finished span's start or end time (the SDK types them optional)."""
    assert t is not None
    return t


def test_a_table_the_exporter_filled_reads_like_the_store(tmp_path: Path, client: Any) -> None:
    """Spans made by the OpenTelemetry SDK, INSERTed as the clickhouseexporter writes them (old and new spellings)."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import SpanKind, Status, StatusCode

    from tracing.exporters import append_span
    from tracing.store import SegmentWriter, init_store

    mem = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "llm", "k8s.pod.name": "pod-3"}))
    provider.add_span_processor(SimpleSpanProcessor(mem))
    tracer = provider.get_tracer("t")
    rng = random.Random(3)
    t = 1_763_647_200_000_000_000
    for i in range(60):
        t += rng.randint(10_000_000, 900_000_000)
        root = tracer.start_span("chat", kind=SpanKind.SERVER, start_time=t, attributes={
            S.ATTR_OPERATION: "chat", "gen_ai.request.model": "m", "gen_ai.usage.output_tokens": rng.randint(2, 90),
            S.ATTR_TENANT: rng.choice(["a", "b"])})
        q = t + rng.randint(0, 50_000_000)
        from opentelemetry import trace as api
        ctx = api.set_span_in_context(root)
        tracer.start_span("queue_wait", context=ctx, start_time=t).end(end_time=q)
        g = tracer.start_span("generation", context=ctx, start_time=q)
        g.add_event("first_token", timestamp=q + 123_457)
        end = q + rng.randint(1_000_000, 2_000_000_000)
        g.end(end_time=end)
        if i % 7 == 0:
            root.set_status(Status(StatusCode.ERROR, "boom"))
            root.set_attribute(S.ATTR_ERROR_TYPE, "DeadlineExceeded")
        root.end(end_time=end + 1_234)
    spans = mem.get_finished_spans()
    from tracing.rows import SpanBatch
    batch = SpanBatch()
    for s in spans:
        append_span(batch, s)
    store = init_store(tmp_path / "store")
    SegmentWriter(store).write(batch.to_table())
    duck = connect(store).sql("SELECT * FROM requests").pl()
    attrs = pa.map_(pa.string(), pa.string())
    for old in (False, True):
        def kind(k: SpanKind, old: bool = old) -> str:
            name = {SpanKind.SERVER: "Server", SpanKind.INTERNAL: "Internal", SpanKind.CLIENT: "Client"}[k]
            return f"SPAN_KIND_{name.upper()}" if old else name

        def status(c: StatusCode, old: bool = old) -> str:
            name = {StatusCode.UNSET: "Unset", StatusCode.OK: "Ok", StatusCode.ERROR: "Error"}[c]
            return f"STATUS_CODE_{name.upper()}" if old else name

        rows = pa.table({
            "ts": pa.array([s.start_time for s in spans], pa.int64()),
            "TraceId": [f"{s.context.trace_id:032x}" for s in spans],
            "SpanId": [f"{s.context.span_id:016x}" for s in spans],
            "ParentSpanId": [f"{s.parent.span_id:016x}" if s.parent else "" for s in spans],
            "SpanName": [s.name for s in spans], "SpanKind": [kind(s.kind) for s in spans],
            "ServiceName": ["llm" for _ in spans],
            "ResourceAttributes": pa.array([[(k, str(v)) for k, v in s.resource.attributes.items()] for s in spans],
                                           attrs),
            "SpanAttributes": pa.array([[(k, str(v)) for k, v in (s.attributes or {}).items()] for s in spans], attrs),
            "Duration": pa.array([_ns(s.end_time) - _ns(s.start_time) for s in spans], pa.int64()),
            "StatusCode": [status(s.status.status_code) for s in spans],
            "ev_ts": pa.array([[e.timestamp for e in s.events] for s in spans], pa.list_(pa.int64())),
            "ev_name": pa.array([[e.name for e in s.events] for s in spans], pa.list_(pa.string())),
        })
        client.command("DROP TABLE IF EXISTS sdk_raw")
        client.command("CREATE TABLE sdk_raw (ts Int64, TraceId String, SpanId String, ParentSpanId String, "
                       "SpanName String, SpanKind String, ServiceName String, ResourceAttributes Map(String, String), "
                       "SpanAttributes Map(String, String), Duration Int64, StatusCode String, ev_ts Array(Int64), "
                       "ev_name Array(String)) ENGINE = Memory")
        client.insert_arrow("sdk_raw", rows)
        client.command("DROP TABLE IF EXISTS sdk_traces")
        client.command(C.otel_traces_ddl("sdk_traces"))
        client.command("INSERT INTO sdk_traces (Timestamp, TraceId, SpanId, ParentSpanId, SpanName, SpanKind, "
                       "ServiceName, ResourceAttributes, SpanAttributes, Duration, StatusCode, `Events.Timestamp`, "
                       "`Events.Name`) SELECT fromUnixTimestamp64Nano(ts), TraceId, SpanId, ParentSpanId, SpanName, "
                       "SpanKind, ServiceName, ResourceAttributes, SpanAttributes, Duration, StatusCode, "
                       "arrayMap(x -> fromUnixTimestamp64Nano(x), ev_ts), ev_name FROM sdk_raw")
        C.materialize_requests(client, "sdk_traces")
        ch = pl.from_arrow(client.query("SELECT * FROM requests"))
        assert isinstance(ch, pl.DataFrame)
        _same_frames(duck, ch)
        assert set(ch.get_column("status").to_list()) == {"ok", "timeout"}
        assert ch.get_column("replica").unique().to_list() == ["pod-3"]
        ev = client.query(f"SELECT Events FROM {C.source_sql('sdk_traces')} WHERE SpanName = 'generation' "
                          "ORDER BY TimestampNs LIMIT 1").to_pylist()[0]["Events"]
        first = min(
            (s for s in spans if s.name == "generation"), key=lambda s: s.start_time or 0)
        assert ev[0]["TimestampNs"] == first.events[0].timestamp and ev[0]["Name"] == "first_token"


def test_export_keeps_every_stored_column(tmp_path_factory: pytest.TempPathFactory, client: Any) -> None:
    """A store exported and read back through source_sql gives the same spans, ns and events included."""
    sample = DATA / "engines" / "vllm_slow_replica.otlp.jsonl.gz"
    store, table = _store_and_table(sample, tmp_path_factory, client)
    duck = connect(store).sql(f"SELECT {', '.join(S.COLUMN_NAMES)} FROM spans").to_arrow_table()
    ch = client.query(f"SELECT {', '.join(S.COLUMN_NAMES)} FROM {C.source_sql(table)}")
    keys = [("TraceId", "ascending"), ("SpanId", "ascending"), ("TimestampNs", "ascending")]
    a, b = duck.sort_by(keys), ch.sort_by(keys)
    assert a.num_rows == b.num_rows > 0
    for name in S.COLUMN_NAMES:
        x, y = a.column(name).to_pylist(), b.column(name).to_pylist()
        if name in ("ResourceAttributes", "SpanAttributes"):
            # promoted facts an engine mapping set travel as attributes: the stored ones are all still there
            assert all(set(p or []) <= set(q or []) for p, q in zip(x, y, strict=True)), name
        elif name == "Timestamp":
            assert [v.replace(tzinfo=None) for v in x] == [v.replace(tzinfo=None) for v in y]
        elif name == "Events":
            assert [[(e["TimestampNs"], e["Name"], sorted(e["Attributes"] or [])) for e in v] for v in x] == \
                   [[(e["TimestampNs"], e["Name"], sorted(e["Attributes"] or [])) for e in v] for v in y]
        else:
            assert x == y, name


def test_export_through_staging_equals_export_from_files(tmp_path_factory: pytest.TempPathFactory, client: Any) -> None:
    """The server's path (each segment through a staging table) writes the very rows chdb's file() path writes."""
    store = samples_cache.store(DATA / "engines" / "vllm_slow_replica.otlp.jsonl.gz", tmp_path_factory)
    tables = []
    for from_files in (True, False):
        table = f"t_export_{'files' if from_files else 'staging'}"
        client.command(f"DROP TABLE IF EXISTS {table}")
        export_store(store, client, table, from_files=from_files)
        tables.append(client.query(f"SELECT * FROM {table} ORDER BY TraceId, SpanId, Timestamp"))
    assert tables[0].num_rows > 0 and tables[0].equals(tables[1])


def test_export_without_facts_writes_the_attributes_as_stored(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, client: Any) -> None:
    """insert_sql(facts=False), the benchmark's price of the facts, writes the stored attributes unchanged; the export
    writes them plus the facts of the spans a mapping promoted (here a tenant stored on the request spans that no
    attribute names), and nothing else differs."""
    store = samples_cache.copy(DATA / "basic.otlp.jsonl.gz", tmp_path_factory, tmp_path / "store")  # rewritten below
    for path in (store / "spans").rglob("*.parquet"):  # as a mapping would: a promoted value no attribute holds
        seg = pq.read_table(path)
        tenant = pa.array(["tenant-z" if r else t for r, t in zip(seg.column("IsRequest").to_pylist(),
                                                                   seg.column("Tenant").to_pylist(), strict=True)])
        pq.write_table(seg.set_column(seg.schema.get_field_index("Tenant"), "Tenant", tenant), path)
    attrs = ("SpanAttributes", "ResourceAttributes")

    def by_span(t: pa.Table) -> dict[tuple[str, str], list[set[tuple[str, str]]]]:
        return {(r["TraceId"], r["SpanId"]): [set(r[c] or []) for c in attrs] for r in t.to_pylist()}

    stored = by_span(connect(store).sql(f"SELECT TraceId, SpanId, {', '.join(attrs)} FROM spans").to_arrow_table())
    got, rest = {}, {}
    for facts in (True, False):
        table = f"t_facts_{facts}"
        client.command(f"DROP TABLE IF EXISTS {table}")
        client.command(C.otel_traces_ddl(table))
        for path in sorted((store / "spans").rglob("*.parquet")):
            source = f"file({C.literal(str(path.resolve()))}, 'Parquet', {C.literal(staging_columns())})"
            client.command(insert_sql(table, source, facts=facts))
        t = client.query(f"SELECT * FROM {table} ORDER BY TraceId, SpanId, Timestamp")
        got[facts] = by_span(t)
        rest[facts] = t.drop_columns(list(attrs))
    assert len(stored) > 0 and got[False] == stored
    assert rest[False].equals(rest[True])
    added = set()
    for key, (span, res) in got[True].items():
        assert res == stored[key][1]
        added |= span - stored[key][0]
    assert added == {(S.TENANT_KEYS[0], "tenant-z")}


def test_sql_on_clickhouse_is_read_only(tmp_path_factory: pytest.TempPathFactory, client: Any) -> None:
    store, table = _store_and_table(DATA / "basic.otlp.jsonl.gz", tmp_path_factory, client)
    got = C.query_views(client, "SELECT count(*) AS n FROM requests WHERE status = 'ok'", table).to_pylist()
    want = connect(store).sql("SELECT count(*) FROM requests WHERE status = 'ok'").fetchall()[0][0]
    assert got == [{"n": want}]
    n_stages = C.query_views(client, "SELECT count(*) AS n FROM stages", table).to_pylist()[0]["n"]
    assert n_stages == want * 0 + len(M.STAGE_COLUMNS) * connect(store).sql("SELECT count(*) FROM requests"
                                                                             ).fetchall()[0][0]
    from tracing.errors import QueryError
    with pytest.raises(QueryError, match="readonly"):
        C.query_views(client, f"INSERT INTO {table} SELECT * FROM {table} LIMIT 1", table)


def test_a_server_that_does_not_answer_is_one_clear_error() -> None:
    """The network client is built by clickhouse-connect; nothing listens on this loopback port."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(C.DsnError, match=f"cannot reach ClickHouse at clickhouse://default@127.0.0.1:{port}/default"):
        C.open_client(f"clickhouse://127.0.0.1:{port}")


@pytest.mark.parametrize("sample", ["incidents/slow_replica", "engines/vllm_slow_replica"])
def test_windowed_exact_quantiles_on_the_server_equal_duckdbs(
        sample: str, tmp_path_factory: pytest.TempPathFactory, client: Any) -> None:
    from analysis.clickhouse.report import percentile_series as ch_series
    from analysis.engine.percentiles import percentile_series

    store, table = _store_and_table(DATA / f"{sample}.otlp.jsonl.gz", tmp_path_factory, client)
    con = connect(store)
    cases: list[dict[str, Any]] = [{}, {"by": ("replica",), "window_s": "1m"},
                                   {"metric": "ttft", "include_failures": False},
                                   {"metric": "queue_wait", "by": ("status",)}]
    for kw in cases:
        duck = percentile_series(con, **kw)
        ch = ch_series(client, table, **kw)
        assert duck.height > 0 and ch.columns == duck.columns, kw
        keys = ["window_start_ns", *kw.get("by", ())]
        ch, duck = ch.sort(keys, nulls_last=True), duck.sort(keys, nulls_last=True)
        for col in duck.columns:
            a, b = duck.get_column(col), ch.get_column(col)
            if a.dtype.is_float():  # the interpolation may round differently in the last bit
                assert a.is_null().to_list() == b.is_null().to_list(), (kw, col)
                assert ((a - b).abs() <= 1e-12 * a.abs()).fill_null(True).all(), (kw, col)
            else:
                assert a.cast(pl.String).to_list() == b.cast(a.dtype).cast(pl.String).to_list(), (kw, col)


def test_the_spans_pulled_back_hold_what_the_explanation_reads() -> None:
    from analysis.clickhouse.report import SPAN_INPUTS
    from analysis.stats.explain import _STAGE_INPUTS

    assert set(SPAN_INPUTS) >= _STAGE_INPUTS


def test_a_sampled_table_gives_the_same_weighted_series_and_report(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, client: Any) -> None:
    """Adjusted counts travel in TraceState (ot=th): ClickHouse derives them and weighs as the store does."""
    from analysis.clickhouse.report import percentile_series as ch_series
    from analysis.engine.percentiles import percentile_series
    from tests.sample_traces import sampled_copy as SC

    whole = samples_cache.store(DATA / "incidents" / "slow_replica.otlp.jsonl.gz", tmp_path_factory)
    store = SC.write_store(tmp_path / "quarter", SC.consistent_sample(SC.read_spans(whole), lambda r: 0.25))
    table = "t_sampled"
    client.command(f"DROP TABLE IF EXISTS {table}")
    export_store(store, client, table)
    con = connect(store)
    try:
        by: tuple[str, ...]
        for by, window_s in (((), None), (("replica",), "2m")):
            kw = {"by": by, "window_s": window_s}
            duck = percentile_series(con, by=by, window_s=window_s)
            ch = ch_series(client, table, by=by, window_s=window_s)
            assert ch.columns == duck.columns and duck.height > 0
            keys = ["window_start_ns", *by]
            duck, ch = duck.sort(keys, nulls_last=True), ch.sort(keys, nulls_last=True)
            assert duck.get_column("requests_weighted").sum() > 3 * duck.get_column("requests").sum()
            for col in duck.columns:
                a, b = duck.get_column(col), ch.get_column(col)
                if a.dtype.is_float():
                    assert ((a - b).abs().fill_null(0) <= 1e-9 * a.abs().fill_null(1)).all(), (kw, col)
                else:
                    assert a.to_list() == b.to_list(), (kw, col)
        duck_reports = {p: build_report(con, sampling_policy=p) for p in ("auto", "head", "tail")}
    finally:
        con.close()
    auto = duck_reports["auto"]["sampling"]
    assert duck_reports["auto"]["sampled"] is True and auto is not None and auto["recorded"] > 0
    for policy, duck_report in duck_reports.items():  # the sampling records are read on the server
        assert ch_report(client, table, sampling_policy=policy) == duck_report, policy


def test_tail_sampling_is_judged_on_clickhouse_as_on_the_store(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, client: Any) -> None:
    """A tail sampler that kept every slow request and a quarter of the rest, recording the quarter as head
    sampling: both engines see the recorded probabilities contradicted by the data, alike."""
    from tests.sample_traces import sampled_copy as SC

    whole = samples_cache.store(DATA / "incidents" / "slow_replica.otlp.jsonl.gz", tmp_path_factory)
    spans = SC.read_spans(whole)
    first = connect(whole)
    slow = sorted(r["e2e_ns"] for r in SC.facts(first))[-300]
    first.close()
    store = SC.write_store(tmp_path / "tail", SC.tail_sample(spans, slow, 0.25))
    table = "t_tail"
    client.command(f"DROP TABLE IF EXISTS {table}")
    export_store(store, client, table)
    con = connect(store)
    try:
        duck = build_report(con)
    finally:
        con.close()
    sampling = duck["sampling"]
    assert sampling is not None and sampling["unrecorded"] > 0 and duck["warnings"], \
        "the store's report sees the tail sampler"
    assert ch_report(client, table) == duck


@pytest.mark.parametrize("weighted", [False, True])
def test_detection_on_the_server_equals_detection_in_memory(client: Any, weighted: bool) -> None:
    """analysis.stats.spikes.detect on random values (ties, a planted tail spike, uneven windows) against
    detect_windows fed by the server (clickhouse.report._ServerValues): the same windows, quantiles, pooled
    figures, exceedances and spikes, to the bit; weighted with adjusted counts that are not whole numbers (a
    pooled figure then within float rounding: the weights are summed in another order)."""
    import numpy as np

    from analysis.clickhouse import report as CR
    from analysis.stats import spikes as SP
    rng = np.random.default_rng(11 + weighted)
    w_ns = 60_000_000_000
    found = 0
    for trial in range(4):
        n = int(rng.integers(25_000, 35_000))
        start = np.sort(rng.integers(0, 20 * w_ns, n)).astype(np.int64)
        values = np.round(rng.lognormal(13, 0.4, n), -3 * (trial % 2)).astype(np.int64)  # ties on odd trials
        hot = (start // w_ns >= 10) & (start // w_ns < 12) & (rng.random(n) < 0.06)
        values[hot] *= 4
        weights = rng.choice([1.0, 2.5, 4.0, 10 / 3], n) if weighted else np.ones(n)
        table = f"t_detect_{int(weighted)}"
        client.command(f"DROP TABLE IF EXISTS {table}")
        client.command(f"CREATE TABLE {table} (start_ns Int64, v Int64, w Float64) ENGINE = Memory")
        client.insert_arrow(table, pa.table({"start_ns": start, "v": values, "w": weights}))
        want = SP.detect(start, values.astype(np.float64), w_ns, weights=weights if weighted else None)
        src = CR._ServerValues(client, table, "TRUE", "v", "w" if weighted else None, w_ns)
        t = src.windows()
        counts = t.get_column("n").to_numpy().astype(np.int64)
        tot, sq = t.get_column("tot").to_numpy(), t.get_column("sq").to_numpy()
        got = SP.detect_windows(w_ns, src.wins, counts, t.get_column("p50").to_numpy(), t.get_column("p99").to_numpy(),
                                tot, tot * tot / sq if weighted else counts.astype(np.float64), src, weighted=weighted)
        assert np.array_equal(got.window_start_ns, want.window_start_ns) and np.array_equal(got.n, want.n)
        def same(x: Any, y: Any) -> bool:  # to the bit unweighted; weighted within float rounding
            return bool(np.allclose(x, y, rtol=1e-12, atol=0)) if weighted else bool(np.array_equal(x, y))

        assert same(got.p50_ns, want.p50_ns) and same(got.p99_ns, want.p99_ns)
        assert np.allclose(got.n_effective, want.n_effective, rtol=1e-12)
        for name in ("judged", "baseline", "candidate", "significant", "exceed", "p_value"):
            assert np.array_equal(getattr(got, name), getattr(want, name)), (trial, name)
        assert same([got.threshold_ns, got.baseline_p50_ns, got.baseline_p99_ns],
                    [want.threshold_ns, want.baseline_p50_ns, want.baseline_p99_ns])
        assert [(s.start_ns, s.end_ns, s.requests, s.p_value) for s in got.spikes] == [
            (s.start_ns, s.end_ns, s.requests, s.p_value) for s in want.spikes]
        assert same([(s.p50_ns, s.p99_ns) for s in got.spikes], [(s.p50_ns, s.p99_ns) for s in want.spikes])
        found += len(want.spikes)
        local = SP.SortedValues(*_sorted_runs(start // w_ns, values.astype(np.float64), weights if weighted else None))
        for _ in range(5):  # pooled figures over random sets of windows
            mask = rng.random(counts.size) < rng.uniform(0.05, 0.9)
            a, b = src.pool(mask), local.pool(mask)
            assert a.n == b.n
            if weighted:  # weights of 10/3 summed in another order: the rank, and so the value, within rounding
                assert (a.p50_ns, a.p99_ns) == pytest.approx((b.p50_ns, b.p99_ns), rel=1e-12, nan_ok=True)
            else:
                assert (a.p50_ns, a.p99_ns) == (b.p50_ns, b.p99_ns) or a.n == 0
            assert a.n_weighted == pytest.approx(b.n_weighted, rel=1e-12)
    assert found >= 2, "the planted spikes are found"


def _sorted_runs(win: Any, values: Any, weights: Any) -> tuple[Any, Any, Any, Any]:
    """Values sorted by window then value, each window's first row and count, and the weights in that order."""
    import numpy as np

    order = np.lexsort((values, win))
    _, first, counts = np.unique(win[order], return_index=True, return_counts=True)
    return (values[order], first.astype(np.int64), counts.astype(np.int64),
            None if weights is None else weights[order])


def _facts_table(client: Any, name: str, windows: int, seed: int, w_ns: int, weights: tuple[float, ...] = (1.0,)
                 ) -> None:
    """Request facts (analysis.engine.model.FACT_COLUMNS) of `windows` windows of 600 requests each; the last 40 windows
    are the same for every `windows` (one seed), and their windows 30-32 hold a tail spike on replica r-hot;
    adjusted counts drawn from `weights` (one seed)."""
    import numpy as np

    parts = []
    for block, seed_of in ((windows - 40, seed + 1), (40, seed)):  # older baseline first, then the shared part
        rng = np.random.default_rng(seed_of)
        n = 600 * block
        win = np.repeat(np.arange(block), 600)
        start = win * w_ns + rng.integers(0, w_ns, n)
        value = rng.lognormal(18, 0.3, n).astype(np.int64)
        replica = rng.choice(["r-a", "r-b", "r-c", "r-hot"], n)
        if seed_of == seed:
            hot = (win >= 30) & (win < 33) & (replica == "r-hot") & (rng.random(n) < 0.4)
            value[hot] *= 5
        parts.append((start, value, replica))
    offset = (windows - 40) * w_ns
    start = np.concatenate([parts[0][0], parts[1][0] + offset]).astype(np.int64)
    value = np.concatenate([parts[0][1], parts[1][1]])
    replica = np.concatenate([parts[0][2], parts[1][2]])
    n = start.size
    tag = np.concatenate([np.full(parts[0][0].size, "old"), np.full(parts[1][0].size, "new")])
    ids = [f"{t}{i:030d}" for t, i in zip(tag, np.concatenate([np.arange(parts[0][0].size),
                                                                np.arange(parts[1][0].size)]), strict=True)]
    client.command(f"DROP TABLE IF EXISTS {name}")
    client.command(f"CREATE TABLE {name} (trace_id String, span_id String, start_ns Int64, e2e_ns Int64, "
                   "status String, replica Nullable(String), service Nullable(String), model Nullable(String), "
                   "model_version Nullable(String), tenant Nullable(String), input_tokens Nullable(Int64), "
                   "output_tokens Nullable(Int64), ttft_ns Nullable(Int64), tpot_ns Nullable(Int64), "
                   "adjusted_count Float64) ENGINE = Memory")
    none = pa.nulls(n, pa.string())
    client.insert_arrow(name, pa.table({
        "trace_id": ids, "span_id": [t[:16] for t in ids], "start_ns": start, "e2e_ns": value,
        "status": ["ok"] * n, "replica": replica, "service": ["svc"] * n, "model": none, "model_version": none,
        "tenant": none, "input_tokens": pa.nulls(n, pa.int64()), "output_tokens": pa.nulls(n, pa.int64()),
        "ttft_ns": pa.nulls(n, pa.int64()), "tpot_ns": pa.nulls(n, pa.int64()),
        "adjusted_count": np.random.default_rng(seed + 7).choice(np.asarray(weights), n)}))


@dataclass(frozen=True)
class SpikeRun:
    """A facts table of `_facts_table` (seed 5) and the report on ClickHouse over it (spans: the empty t_no_spans),
    with every query's SQL and answer in order."""

    table: str
    answers: list[tuple[str, pa.Table]]
    report: Report


@pytest.fixture(scope="module")
def spike_run(client: Any) -> Callable[[int, tuple[float, ...]], SpikeRun]:
    """`spike_run(windows, weights)`: the SpikeRun of a facts table of `windows` windows with adjusted counts drawn
    from `weights`, made once per module: three tests read the sampled one of 80 windows."""
    client.command("DROP TABLE IF EXISTS t_no_spans")
    client.command(C.otel_traces_ddl("t_no_spans"))
    made: dict[tuple[int, tuple[float, ...]], SpikeRun] = {}

    def get(windows: int, weights: tuple[float, ...]) -> SpikeRun:
        if (windows, weights) not in made:
            table = f"t_facts_spike_{len(made)}"
            _facts_table(client, table, windows, 5, MINUTE_NS, weights)
            recording = Recording(client)
            report = ch_report(recording, "t_no_spans", window_s=60, facts=table)
            made[(windows, weights)] = SpikeRun(table, recording.answers, report)
        return made[(windows, weights)]

    return get


@pytest.mark.parametrize("weights", [(1.0,), (1.0, 2.0)], ids=["unsampled", "sampled"])
def test_with_a_spike_the_rows_that_come_back_do_not_grow_with_the_baseline(
        spike_run: Callable[[int, tuple[float, ...]], SpikeRun], weights: tuple[float, ...]) -> None:
    """The same spike after 40 and after 80 more baseline windows: no fact row comes back (the spike's requests stay
    on the server, `_ServerSpikeRows`, as do the stage shares' local baseline; detection's answers are a row a
    window); the baseline's p99 with
    and without each candidate is computed on the server (clickhouse.report._ServerTail), and equals the report's
    in memory (test_report_parity covers every catalogue sample; the sampled table's, with adjusted counts 1 and 2:
    test_a_sampled_spike_is_explained_on_the_server_as_in_memory)."""
    from analysis.engine.percentiles import iso

    w_ns = MINUTE_NS
    for windows in (80, 120):  # the planted spike, windows 30-32 of the shared part
        got = spike_run(windows, weights)
        assert not [sql for sql, out in got.answers if "trace_id" in out.column_names]  # no request facts' pull
        rep = got.report
        first = windows - 40 + 30
        assert [(s["start"], s["end"]) for s in rep["spikes"]] == [(iso(first * w_ns), iso((first + 3) * w_ns))]
        assert rep["spikes"][0]["dimensions"][0]["value"] == "r-hot"
        assert rep["spikes"][0]["dimensions"][0]["explained"] is not None


def test_on_a_sampled_table_detection_and_the_judgement_run_on_the_server(
        client: Any, spike_run: Callable[[int, tuple[float, ...]], SpikeRun]) -> None:
    """A sampled facts table (adjusted counts 1 and 2) with a planted spike: until any fact row is pulled (none is:
    the spike's requests stay on the server), only per-window rows, pooled figures and the values above the pooled
    p99 come back; the detection is
    analysis.stats.spikes.detect's weighted one in memory, and the sampling view sampling.judge's over the arrays."""
    import numpy as np

    from analysis.engine.percentiles import iso
    from analysis.stats import sampling as SM
    from analysis.stats import spikes as SP

    w_ns = MINUTE_NS
    run = spike_run(80, (1.0, 2.0))
    report = run.report
    pulls = [i for i, (_, out) in enumerate(run.answers) if "trace_id" in out.column_names]
    got = [out for _, out in run.answers[:pulls[0] if pulls else None]]  # every result until the first fact rows
    rows = client.query(f"SELECT start_ns, e2e_ns, adjusted_count FROM {run.table} ORDER BY start_ns")
    start, value = rows.column("start_ns").to_numpy(), rows.column("e2e_ns").to_numpy().astype(np.float64)
    weights = rows.column("adjusted_count").to_numpy()
    assert got and all(t.num_rows <= 80 or t.column_names == ["win", "v"] for t in got)
    assert sum(t.num_rows for t in got if t.column_names == ["win", "v"]) < 0.02 * start.size
    want = SP.detect(start, value, w_ns, weights=weights)
    assert [(s["start"], s["end"], s["requests"]) for s in report["spikes"]] == [
        (iso(s.start_ns), iso(s.end_ns), s.requests) for s in want.spikes] and len(want.spikes) == 1
    assert (report["baseline_p50_ms"], report["baseline_p99_ms"]) == (
        round(want.baseline_p50_ns / 1e6, 3), round(want.baseline_p99_ns / 1e6, 3))
    assert report["sampled"] and report["values_weighted"] == float(weights.sum())
    assert report["values_effective"] == round(weights.sum() ** 2 / np.square(weights).sum(), 3)
    none = np.zeros(start.size, dtype=bool)  # t_no_spans holds no sampling record; every request is ok
    assert report["sampling"] == SM.judge(SM.Arrays(value, weights, none, none, none), "auto").to_json()


def test_a_sampled_spike_is_explained_on_the_server_as_in_memory(
        client: Any, spike_run: Callable[[int, tuple[float, ...]], SpikeRun]) -> None:
    """A sampled facts table (adjusted counts 1 and 2) with a planted spike: the report on ClickHouse, whose baseline
    away from the spike comes back as counts and summed weights per dimension combination and whose weighted
    counterfactual p99s are computed on the server, equals analysis.report's over every row in memory (the weighted
    contrast and counterfactuals of analysis.stats.explain, over the whole baseline), and so does explain_window on a
    window that is not a spike."""
    import duckdb

    from analysis import report as RP
    from analysis.clickhouse import report as CR
    from analysis.engine.connect import duck_type
    from analysis.engine.percentiles import iso

    w_ns = MINUTE_NS
    run = spike_run(80, (1.0, 2.0))
    local = duckdb.connect(":memory:")
    try:  # the same requests, and the same (empty) spans, in memory
        local.register("_rows", client.query(f"SELECT * FROM {run.table}"))
        local.execute("CREATE TABLE facts AS SELECT * FROM _rows")
        cols = ", ".join(f"NULL::{duck_type(t)} AS {c}" for c, t, _ in S.SPAN_COLUMNS)
        local.execute(f"CREATE TABLE _spans_local AS SELECT {cols} LIMIT 0")
        local.execute("CREATE VIEW spans AS SELECT *, TimestampNs + Duration AS EndNs FROM _spans_local")
        want = RP.build_report(local, window_s=60, source="facts")
        first = (80 - 40 + 30) * w_ns
        calm = (iso(first - 20 * w_ns), iso(first - 18 * w_ns))  # two baseline windows
        want_window = RP.explain_window(local, *calm, window_s=60, source="facts")
    finally:
        local.close()
    assert [(s["start"], s["end"]) for s in want["spikes"]] == [(iso(first), iso(first + 3 * w_ns))]
    dims = want["spikes"][0]["dimensions"]
    assert dims[0]["value"] == "r-hot" and all(d["explained"] is not None for d in dims)
    got = run.report
    assert got["sampled"] and got == want
    got_window = CR.explain_window(client, "t_no_spans", *calm, window_s=60, facts=run.table)
    assert got_window["detected"] is False and got_window["dimensions"] is not None
    assert got_window == want_window
