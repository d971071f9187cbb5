"""The ClickHouse commands through the CLI, on chdb: export, report / sql --engine clickhouse, clickhouse init."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from tailscope.cli import app
from tests import samples_cache

# ClickHouse (chdb) end to end on catalogue samples (make test-fast leaves it out)
pytestmark = pytest.mark.slow

DATA = Path(__file__).resolve().parents[2] / "sample_traces" / "data"
runner = CliRunner()


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("cli")
    store = samples_cache.store(DATA / "incidents" / "slow_replica.otlp.jsonl.gz", tmp_path_factory, cli=True)
    dsn = f"chdb:{root / 'ch'}"
    done = runner.invoke(app, ["export", "--to", "clickhouse", "--dsn", dsn, "--store", str(store), "--quiet"])
    assert done.exit_code == 0, done.output
    assert "exported" in done.output and "into otel_traces" in done.output
    return store, dsn


def test_report_json_is_the_same_on_both_engines(exported: tuple[Path, str]) -> None:
    store, dsn = exported
    duck = runner.invoke(app, ["report", "--store", str(store), "--json"])
    ch = runner.invoke(app, ["report", "--engine", "clickhouse", "--dsn", dsn, "--json"])
    assert duck.exit_code == 0 and ch.exit_code == 0, ch.output
    a = json.loads(duck.stdout)
    assert a["spikes"], "the slow_replica sample has a spike"
    assert json.loads(ch.stdout) == a
    coverage = [line for line in duck.stderr.splitlines() if line.startswith("coverage:")]
    assert len(coverage) == 1 and coverage == [line for line in ch.stderr.splitlines() if line.startswith("coverage:")]


def test_a_time_range_and_ok_only_give_the_same_report(exported: tuple[Path, str]) -> None:
    store, dsn = exported
    first = json.loads(runner.invoke(app, ["report", "--store", str(store), "--json"]).stdout)["spikes"][0]["start"]
    args = ["--since", first, "--until", "2099-01-01T00:00:00Z", "--ok-only", "--json", "--metric", "ttft"]
    duck = runner.invoke(app, ["report", "--store", str(store), *args])
    ch = runner.invoke(app, ["report", "--engine", "clickhouse", "--dsn", dsn, *args])
    assert duck.exit_code == 0 and ch.exit_code == 0, ch.output
    a = json.loads(duck.stdout)
    assert a["requests"] > 0 and json.loads(ch.stdout) == a


def test_sql_reads_the_views_and_refuses_writes(exported: tuple[Path, str]) -> None:
    store, dsn = exported
    duck = runner.invoke(app, ["sql", "SELECT count(*) AS n FROM requests", "--store", str(store), "-f", "json"])
    ch = runner.invoke(app, ["sql", "SELECT count(*) AS n FROM requests", "--engine", "clickhouse", "--dsn", dsn,
                             "-f", "json"])
    assert ch.exit_code == 0, ch.output
    assert json.loads(ch.stdout) == json.loads(duck.stdout)
    bad = runner.invoke(app, ["sql", "DROP TABLE otel_traces", "--engine", "clickhouse", "--dsn", dsn])
    assert bad.exit_code == 1
    spans = runner.invoke(app, ["sql", "SELECT count() AS n FROM otel_traces", "--engine", "clickhouse", "--dsn", dsn,
                                "-f", "json"])
    assert json.loads(spans.stdout)[0]["n"] > 0


@pytest.mark.parametrize("args", [["--dsn", "mysql://x"], [], ["--dsn", "chdb:x", "--table", "a;b"]])
def test_bad_engine_options_are_one_line(args: list[str], tmp_path: Path) -> None:
    done = runner.invoke(app, ["report", "--engine", "clickhouse", *args])
    assert done.exit_code == 1
    lines = [line for line in done.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), done.output


@dataclass(frozen=True)
class Initialized:
    """A chdb DSN where `clickhouse init` ran: printed, applied before the spans table existed (refused), then applied
    twice with --every 1 DAY --lag-minutes 0 (`applied`, `again`); the tables the refused run left (`early_tables`)."""

    dsn: str
    printed: Result
    early: Result
    early_tables: list[dict[str, Any]]
    applied: Result
    again: Result


@pytest.fixture(scope="module")
def initialized(tmp_path_factory: pytest.TempPathFactory) -> Initialized:
    """One `clickhouse init --apply` for the tests of the init itself and of its refreshable view: creating the views
    costs chdb seconds of planning the refresh's SQL, so they are made once. Daily refreshes, no lag: the view
    refreshes by itself only at midnight, so the rows a test reads are those of its own forced refresh."""
    from analysis.clickhouse import open_client, otel_traces_ddl
    dsn = f"chdb:{tmp_path_factory.mktemp('chinit') / 'ch'}"
    options = ["--apply", "--every", "1 DAY", "--lag-minutes", "0"]
    printed = runner.invoke(app, ["clickhouse", "init", "--dsn", dsn])
    early = runner.invoke(app, ["clickhouse", "init", "--dsn", dsn, *options])  # before the spans table exists
    client = open_client(dsn)
    early_tables = client.query("SELECT count() AS n FROM system.tables WHERE database = currentDatabase()"
                                ).to_pylist()
    client.command(otel_traces_ddl())
    client.close()
    applied = runner.invoke(app, ["clickhouse", "init", "--dsn", dsn, *options])
    again = runner.invoke(app, ["clickhouse", "init", "--dsn", dsn, *options])
    return Initialized(dsn, printed, early, early_tables, applied, again)


def test_clickhouse_init_prints_and_applies(initialized: Initialized) -> None:
    init = initialized
    assert init.printed.exit_code == 0
    assert "REFRESH EVERY 5 MINUTE APPEND TO tailscope_requests" in init.printed.output  # the default interval
    assert init.early.exit_code != 0 and "table otel_traces does not exist: nothing was created" in init.early.output
    assert init.early_tables == [{"n": 0}]
    assert init.applied.exit_code == 0, init.applied.output
    assert init.applied.output.startswith("created tailscope_requests_spans, tailscope_requests_spans_mv, "
                                          "tailscope_requests, tailscope_requests_mv over otel_traces")
    assert init.again.exit_code == 0 and init.again.output.startswith("nothing to change: "), init.again.output
    from analysis.clickhouse import open_client
    client = open_client(init.dsn)
    views = client.query("SELECT view FROM system.view_refreshes").column("view").to_pylist()
    tables = set(client.query("SELECT name FROM system.tables WHERE database = currentDatabase()")
                 .column("name").to_pylist())
    client.close()
    assert views == ["tailscope_requests_mv"]
    assert {"tailscope_requests", "tailscope_requests_spans", "tailscope_requests_spans_mv"} <= tables


def test_the_default_table_is_the_exporters() -> None:
    from analysis.clickhouse import DEFAULT_TABLE
    from tailscope.commands.common import DEFAULT
    assert DEFAULT == DEFAULT_TABLE == "otel_traces"


def test_the_refreshable_view_computes_the_requests_of_its_interval(initialized: Initialized) -> None:
    """Applied in chdb, a refresh (forced with SYSTEM REFRESH) appends the requests of yesterday (--every '1 DAY')."""
    from analysis.clickhouse import open_client
    assert initialized.applied.exit_code == 0, initialized.applied.output
    client = open_client(initialized.dsn)
    t0 = "toUnixTimestamp64Nano(toDateTime64(toStartOfDay(now()) - INTERVAL 12 HOUR, 9))"
    tid, root, child = "a" * 32, "b" * 16, "c" * 16
    client.command(
        "INSERT INTO otel_traces (Timestamp, TraceId, SpanId, ParentSpanId, SpanName, SpanKind, ServiceName, "
        f"SpanAttributes, Duration, StatusCode) SELECT fromUnixTimestamp64Nano({t0}), '{tid}', '{root}', '', 'chat', "
        "'Server', 's', map('gen_ai.operation.name', 'chat'), 5000000000, 'Unset' UNION ALL "
        f"SELECT fromUnixTimestamp64Nano({t0} + 1000000000), '{tid}', '{child}', '{root}', 'decode', 'Internal', "
        "'s', map(), 3000000000, 'Unset'")
    client.command("SYSTEM REFRESH VIEW tailscope_requests_mv")
    client.command("SYSTEM WAIT VIEW tailscope_requests_mv")
    rows = client.query("SELECT trace_id, e2e_ns, decode_ns, other_ns, refresh_rows, refresh_spans "
                        "FROM tailscope_requests FINAL ORDER BY trace_id").to_pylist()
    from analysis.clickhouse import coverage
    covered = coverage(client)
    client.close()
    marker = {"trace_id": "", "e2e_ns": 0, "decode_ns": 0, "other_ns": 0, "refresh_rows": 2, "refresh_spans": 2}
    assert rows == [marker, {**marker, "trace_id": tid, "e2e_ns": 5_000_000_000, "decode_ns": 3_000_000_000,
                             "other_ns": 2_000_000_000}]
    assert [r.hi_ns - r.lo_ns for r in covered] == [24 * 3_600_000_000_000], "the view's refresh may be read"


@pytest.fixture(scope="module")
def backfilled(exported: tuple[Path, str], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, Result]:
    """(the store, a chdb DSN of its spans in otel_traces, `clickhouse init --apply --backfill --every '1 HOUR'` run
    there): the materialized requests of every interval the spans fall in, made once for the tests that read them (a
    refresh costs chdb seconds of planning). A DSN of its own, so the tests on `exported` read no materialized table."""
    from analysis import clickhouse as C
    from analysis.clickhouse.export import export_store
    store = exported[0]
    dsn = f"chdb:{tmp_path_factory.mktemp('chfill') / 'ch'}"
    client = C.open_client(dsn)
    try:
        export_store(store, client, C.DEFAULT_TABLE)
    finally:
        client.close()
    done = runner.invoke(app, ["clickhouse", "init", "--dsn", dsn, "--apply", "--backfill", "--every", "1 HOUR"])
    client = C.open_client(dsn)
    try:  # the tables stay; a session on a refreshable view plans its SQL again each time it opens and closes
        client.command(f"DROP TABLE IF EXISTS {C.REQUESTS_TABLE}_mv")
    finally:
        client.close()
    return store, dsn, done


@pytest.fixture
def tripled(backfilled: tuple[Path, str, Result]) -> Iterator[tuple[Path, str]]:
    """`backfilled` with every materialized request's e2e_ns tripled (what a report that reads the table shows, and
    one computing from the spans does not), put back as it was after the test."""
    from analysis import clickhouse as C
    store, dsn, done = backfilled
    assert done.exit_code == 0, done.output

    def update(expr: str) -> None:
        client = C.open_client(dsn)
        try:
            client.command(f"ALTER TABLE tailscope_requests UPDATE e2e_ns = {expr} WHERE span_id != '' "
                           "SETTINGS mutations_sync = 1")
        finally:
            client.close()

    update("e2e_ns * 3")
    try:
        yield store, dsn
    finally:
        update("intDiv(e2e_ns, 3)")


def test_report_reads_the_materialized_table_unless_told_not_to(tripled: tuple[Path, str]) -> None:
    """After `clickhouse init --apply --backfill` (the refreshable view itself is tested above), the report reads
    tailscope_requests (corrupted here on purpose to show it); --no-materialize computes from the spans and equals
    the store's report."""
    store, dsn = tripled
    duck = json.loads(runner.invoke(app, ["report", "--store", str(store), "--json"]).stdout)
    off = runner.invoke(app, ["report", "--engine", "clickhouse", "--dsn", dsn, "--json", "--no-materialize"])
    on = runner.invoke(app, ["report", "--engine", "clickhouse", "--dsn", dsn, "--json"])
    sql = runner.invoke(app, ["sql", "SELECT max(e2e_ns) AS m FROM requests", "--engine", "clickhouse", "--dsn", dsn,
                              "-f", "json"])
    sql_off = runner.invoke(app, ["sql", "SELECT max(e2e_ns) AS m FROM requests", "--engine", "clickhouse", "--dsn",
                                  dsn, "-f", "json", "--no-materialize"])
    assert json.loads(off.stdout) == duck
    assert json.loads(on.stdout)["requests"] == duck["requests"] and json.loads(on.stdout) != duck
    assert json.loads(sql.stdout)[0]["m"] == 3 * json.loads(sql_off.stdout)[0]["m"]


def test_init_backfill_covers_the_spans_already_there(exported: tuple[Path, str],
                                                      backfilled: tuple[Path, str, Result]) -> None:
    """`clickhouse init --apply --backfill` computes the requests of every interval holding spans written before it:
    each of them is then covered (read from the table) and the report equals the store's."""
    from analysis import clickhouse as C
    refused = runner.invoke(app, ["clickhouse", "init", "--dsn", exported[1], "--backfill"])
    assert refused.exit_code == 1 and refused.output.strip().startswith("error:") and \
        len(refused.output.strip().splitlines()) == 1, refused.output
    store, dsn, done = backfilled
    assert done.exit_code == 0, done.output
    client = C.open_client(dsn)
    hour = 3_600 * 10**9
    row = client.query("SELECT min(toUnixTimestamp64Nano(Timestamp)) AS a, max(toUnixTimestamp64Nano(Timestamp)) "
                       "AS b FROM otel_traces").to_pylist()[0]
    covered = sorted(r.lo_ns for r in C.coverage(client) if r.lo_ns <= row["b"])
    client.close()
    want = list(range(row["a"] // hour * hour, row["b"] // hour * hour + hour, hour))
    assert f"backfilled {len(want):,} interval(s) of 1 HOUR" in done.output
    assert covered == want
    ch = runner.invoke(app, ["report", "--engine", "clickhouse", "--dsn", dsn, "--json"])
    duck = runner.invoke(app, ["report", "--store", str(store), "--json"])
    assert ch.exit_code == 0, ch.output
    assert json.loads(ch.stdout) == json.loads(duck.stdout)


def test_a_backfill_of_an_empty_table_refreshes_nothing(tmp_path: Path) -> None:
    from analysis import clickhouse as C
    client = C.open_client(f"chdb:{tmp_path / 'ch'}")
    try:
        client.command(C.otel_traces_ddl())
        for ddl in C.requests_mv_ddl()[:3]:
            client.command(ddl)
        assert C.backfill(client) == 0
        with pytest.raises(C.QueryError, match="cannot read interval"):
            C.backfill(client, every="0 MINUTE")
    finally:
        client.close()


def test_the_dimension_patterns_and_their_setting_work_on_clickhouse(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.analysis.test_attributes import node_store

    store = node_store(tmp_path / "nodes")
    dsn = f"chdb:{tmp_path / 'ch'}"
    done = runner.invoke(app, ["export", "--to", "clickhouse", "--dsn", dsn, "--store", str(store), "--quiet"])
    assert done.exit_code == 0, done.output
    monkeypatch.setenv("TAILSCOPE_EXCLUDE_DIMENSIONS", "retry")
    args = ["--json", "--no-materialize", "--exclude-dimensions", "k8s.*"]
    ch = runner.invoke(app, ["report", "--engine", "clickhouse", "--dsn", dsn, *args])
    duck = runner.invoke(app, ["report", "--store", str(store), *args])
    assert ch.exit_code == 0 and duck.exit_code == 0, ch.output
    got = json.loads(ch.stdout)
    skipped = {s["attribute"]: s for s in got["attributes"]["skipped"]}
    assert skipped["k8s.node.name"]["why"] == "excluded by the pattern 'k8s.*'"
    assert skipped["retry"]["why"] == "excluded by the pattern 'retry'"  # the setting's, added to the option's
    assert got == json.loads(duck.stdout)
