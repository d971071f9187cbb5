"""The ClickHouse engine on every supported release, end to end over HTTP with our real `clickhouse://` client.

Each release (the older ones from `.venv-ch/<release>`, the newest from this venv's chdb) is
served by tests/clickhouse_http.py; a catalogue sample is exported through HTTP (twice: the
table holds each span once) and then read as the CLI and the dashboard read it: the report,
`sql` over spans / requests / stages (read-only), the dashboard's data calls, `clickhouse
init` (all or nothing; a second run changes nothing). Every answer equals the store's (DuckDB).
The full ClickHouse suite runs on the newest release through chdb (test_clickhouse*.py); this
subset runs every SQL text tailscope generates (docs/scale-out.md, "Server releases", lists them).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from analysis import clickhouse as C
from analysis.clickhouse import report as CR
from analysis.clickhouse.client import Client
from analysis.clickhouse.export import export_store
from analysis.contract import Report
from analysis.engine.connect import connect
from analysis.report import build_report
from tests import samples_cache
from tests.analysis.clickhouse_releases import NEWEST, Served, older_releases, serve
from tests.analysis.recording import Passing
from tracing.errors import QueryError

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "data" / "incidents" / "slow_replica.otlp.jsonl.gz"
RELEASES = [*older_releases(), NEWEST]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy: `tailscope report --store` below materializes the hours into it."""
    return samples_cache.copy(SAMPLE, tmp_path_factory, tmp_path_factory.mktemp("chrel") / "store")


@pytest.fixture(scope="module", params=RELEASES)
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, store: Path
           ) -> Iterator[tuple[str, Served, Any]]:
    """(release, the running server, a client with the store exported into otel_traces through HTTP)."""
    release = str(request.param)
    with serve(release, tmp_path_factory.mktemp("ch")) as srv:
        client = C.open_client(srv.dsn)
        try:
            first = export_store(store, client, C.DEFAULT_TABLE)
            assert first.written == first.spans > 0
            yield release, srv, client
        finally:
            client.close()


def test_the_release_and_its_features_are_read_from_the_server(served: tuple[str, Served, Any]) -> None:
    release, srv, client = served
    got = C.features(client)
    assert got.version == srv.version
    if release != NEWEST:
        assert srv.version.startswith(release + ".")
    # materialized CTEs (and their setting) came with 26.x; the older releases read the plain spelling
    assert got.materialized_cte == (C.require_supported(srv.version) >= (26, 1))
    assert ("enable_materialized_cte" in got.settings) == got.materialized_cte


def test_export_run_again_adds_no_span(served: tuple[str, Served, Any], store: Path) -> None:
    _, _, client = served
    spans = connect(store).sql("SELECT count(*) FROM spans").fetchall()[0][0]
    again = export_store(store, client, C.DEFAULT_TABLE)
    assert (again.spans, again.written) == (spans, 0)
    row = client.query(f"SELECT count() AS n, uniqExact(TraceId, SpanId) AS u FROM {C.DEFAULT_TABLE}").to_pylist()[0]
    assert (row["n"], row["u"]) == (spans, spans)
    temps = client.query("SELECT count() AS n FROM system.tables WHERE name LIKE 'tailscope_export_staging%'")
    assert temps.to_pylist() == [{"n": 0}]  # the staging is gone with the run


@pytest.fixture(scope="module")
def store_report(store: Path) -> Report:
    """The store's report (DuckDB), the same for every release: computed once."""
    return build_report(connect(store))


def test_the_report_equals_the_stores(served: tuple[str, Served, Any], store_report: Report) -> None:
    _, _, client = served
    want = store_report
    assert want["spikes"], "the sample has a spike, so the explanation's SQL runs too"
    assert CR.build_report(client, C.DEFAULT_TABLE, materialized=False) == want


def test_sql_reads_the_views_and_refuses_writes(served: tuple[str, Served, Any], store: Path) -> None:
    _, _, client = served
    con = connect(store)
    for sql in ("SELECT count(*) AS n FROM requests WHERE status = 'ok'", "SELECT count(*) AS n FROM stages",
                "SELECT count(*) AS n FROM spans WHERE IsRequest"):
        want = con.sql(sql).fetchall()[0][0]
        assert C.query_views(client, sql, materialized=False).to_pylist() == [{"n": want}], sql
    with pytest.raises(QueryError, match=r"readonly|Syntax error"):  # 24.8 does not parse a WITH before INSERT
        C.query_views(client, f"INSERT INTO {C.DEFAULT_TABLE} SELECT * FROM {C.DEFAULT_TABLE} LIMIT 1")
    assert client.query(f"SELECT count() AS n FROM {C.DEFAULT_TABLE}").to_pylist()[0]["n"] == con.sql(
        "SELECT count(*) FROM spans").fetchall()[0][0]


def test_init_is_all_or_nothing_and_a_second_run_changes_nothing(served: tuple[str, Served, Any]) -> None:
    _, _, client = served
    names = C.schema_objects()
    try:
        client.query("EXPLAIN AST CREATE MATERIALIZED VIEW v REFRESH EVERY 1 MINUTE APPEND TO t AS SELECT 1")
        appends = True
    except QueryError:
        appends = False
    if appends and not C.features(client).materialized_cte:
        pytest.skip("the refresh's SQL plans for tens of seconds without materialized CTEs (docs/scale-out.md): "
                    "init is checked on 24.8 (refused) and on the newest release")
    if not appends:
        with pytest.raises(QueryError, match="has no refreshable views that APPEND TO a table"):
            C.apply_schema(client, C.DEFAULT_TABLE)
        assert _present(client, names) == set()
        return
    failing = _FailingOn(client, f"CREATE MATERIALIZED VIEW IF NOT EXISTS {C.REQUESTS_TABLE}_spans_mv ")
    with pytest.raises(QueryError, match="dropped again what this run created"):
        C.apply_schema(failing, C.DEFAULT_TABLE)
    assert _present(client, names) == set()  # the spans copy and its view were dropped again
    done = C.apply_schema(client, C.DEFAULT_TABLE)
    assert (done.created, done.existing) == (names, ())
    again = C.apply_schema(client, C.DEFAULT_TABLE)
    assert (again.created, again.existing) == ((), names)


def _present(client: Any, names: tuple[str, ...]) -> set[str]:
    rows = client.query("SELECT name FROM system.tables WHERE database = currentDatabase()").to_pylist()
    return {str(r["name"]) for r in rows} & set(names)


class _FailingOn(Passing):
    """A client whose server refuses one statement (as one refused for want of a right would be)."""

    def __init__(self, inner: Client, prefix: str) -> None:
        super().__init__(inner)
        self.prefix = prefix

    def command(self, sql: str) -> None:
        if sql.startswith(self.prefix):
            raise QueryError(sql, "Not enough privileges (Code 497)")
        self.inner.command(sql)


# --- the network client's failures, each its own line (on the newest release) ------------------------------

@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A server that wants a password."""
    with serve(NEWEST, tmp_path_factory.mktemp("chauth"), user="alice", password="s3cret") as srv:
        yield srv


def test_refused_credentials_are_one_line(guarded: Served) -> None:
    with pytest.raises(C.DsnError) as err:
        C.open_client(f"clickhouse://alice:wrong@127.0.0.1:{guarded.port}/tailscope")
    assert str(err.value).startswith(f"ClickHouse at clickhouse://alice@127.0.0.1:{guarded.port}/tailscope "
                                     "refused user 'alice': ")
    assert str(err.value).endswith("(Code 516)") and "\n" not in str(err.value) and "wrong" not in str(err.value)


def test_an_unknown_database_is_one_line(guarded: Served) -> None:
    with pytest.raises(C.DsnError) as err:
        C.open_client(f"clickhouse://alice:s3cret@127.0.0.1:{guarded.port}/otel")
    assert str(err.value) == (f"ClickHouse at clickhouse://alice@127.0.0.1:{guarded.port}/otel: "
                              "Database otel does not exist (Code 81)")


def test_no_answer_in_time_is_one_line(guarded: Served) -> None:
    client = C.open_client(f"clickhouse://alice:s3cret@127.0.0.1:{guarded.port}/tailscope?timeout=1")
    try:
        with pytest.raises(QueryError) as err:
            client.query("SELECT sleep(3) AS s")
        assert err.value.what == (f"ClickHouse at clickhouse://alice@127.0.0.1:{guarded.port}/tailscope "
                                  "did not answer within 1 s (the DSN's ?timeout=)")
    finally:
        client.close()


def test_a_setting_holds_for_its_request_only(guarded: Served) -> None:
    """A setting a request names is the session's for that request only (tests/clickhouse_http.py sets only what
    differs from what the session holds): the next request reads the default again, or its own value."""
    client = C.open_client(guarded.dsn)
    try:
        def value(settings: dict[str, Any] | None = None) -> str:
            got = client.query("SELECT value FROM system.settings WHERE name = 'max_block_size'", settings)
            return str(got.to_pylist()[0]["value"])

        default = value()
        asked = [{"max_block_size": 3000}, None, {"max_block_size": 3000}, {"max_block_size": 5000},
                 {"max_block_size": 5000}, None]
        assert [value(a) for a in asked] == ["3000", default, "3000", "5000", "5000", default]
        client.command("SET max_block_size = 7000")  # a SET sent as a statement is the session's own, as on a server
        assert [value(), value({"max_block_size": 3000}), value()] == ["7000", "3000", "7000"]
        client.command(f"SET max_block_size = {default}")
        assert value() == default
    finally:
        client.close()


def test_a_server_closing_mid_answer_is_one_line(guarded: Served) -> None:
    client = C.open_client(guarded.dsn)
    try:
        assert client.query("SELECT count() AS n FROM numbers(100000)").to_pylist() == [{"n": 100000}]
        with pytest.raises(QueryError) as err:
            client.query("SELECT number FROM numbers(100000)", {"tailscope_test_cut": 1})
        assert err.value.what.startswith(f"ClickHouse at clickhouse://alice@127.0.0.1:{guarded.port}/tailscope "
                                         "closed the connection mid-answer")
        assert "\n" not in err.value.what
    finally:
        client.close()


@pytest.mark.parametrize(("version", "ok"), [("23.8.16.40", False), ("24.3.1.1", False), ("24.8.4.1", True),
                                             ("25.3.2.1", True), ("26.9.2.1", True)])
def test_a_release_older_than_24_8_is_one_line(version: str, ok: bool) -> None:
    if ok:
        assert C.require_supported(version) == tuple(int(x) for x in version.split(".")[:2])
        return
    with pytest.raises(C.UnsupportedServer) as err:
        C.require_supported(version)
    major, minor = version.split(".")[:2]
    assert str(err.value).startswith(f"ClickHouse {major}.{minor} is older than the oldest supported (24.8): ")


def test_the_cli_over_http(guarded: Served, store: Path) -> None:
    """export (twice), report and sql through the CLI with a clickhouse:// DSN; a refused password is one line."""
    import json

    from typer.testing import CliRunner

    from tailscope.cli import app

    runner = CliRunner()
    dsn = guarded.dsn
    first = runner.invoke(app, ["export", "--to", "clickhouse", "--dsn", dsn, "--store", str(store), "--quiet"])
    spans = connect(store).sql("SELECT count(*) FROM spans").fetchall()[0][0]
    assert first.exit_code == 0 and f"exported {spans:,} spans" in first.output, first.output
    again = runner.invoke(app, ["export", "--to", "clickhouse", "--dsn", dsn, "--store", str(store), "--quiet"])
    assert again.exit_code == 0 and "exported 0 spans" in again.output and "were there already" in again.output
    report = runner.invoke(app, ["report", "--engine", "clickhouse", "--dsn", dsn, "--json"])
    assert report.exit_code == 0, report.output
    assert json.loads(report.stdout) == json.loads(runner.invoke(app, ["report", "--store", str(store),
                                                                                 "--json"]).stdout)
    sql = runner.invoke(app, ["sql", "SELECT count(*) AS n FROM requests", "--engine", "clickhouse", "--dsn", dsn,
                              "-f", "json"])
    assert sql.exit_code == 0 and json.loads(sql.stdout) == json.loads(runner.invoke(
        app, ["sql", "SELECT count(*) AS n FROM requests", "--store", str(store), "-f", "json"]).stdout)
    bad = dsn.replace(":s3cret@", ":nope@")
    refused = runner.invoke(app, ["report", "--engine", "clickhouse", "--dsn", bad])
    assert refused.exit_code == 1
    assert [line for line in refused.output.splitlines() if line.strip()] == [
        f"error: ClickHouse at clickhouse://alice@127.0.0.1:{guarded.port}/tailscope refused user 'alice': "
        "Authentication failed: password is incorrect, or there is no user with such name (Code 516)"]
