"""`tailscope map`: requests and stages declared on an existing store, used by every reader.

The scenario is the issue's: a chat API's plain OpenTelemetry traces (sample_traces.http_chat, real SDK):
six pods, an HTTP SERVER span per request with tokenize / generate / stream_response children, and one
pod's generate stage slowed for a few minutes. Nothing claims them at ingest; one `tailscope map`
command (the one the docs show) makes them requests, and the report finds the incident.
"""

from __future__ import annotations

import json
import shutil
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from analysis.engine.materialize import snapshot
from analysis.mapping.rules import MAP_FILE
from sample_traces import http_chat
from tailscope.cli import app

runner = CliRunner()
MAP = ["--request", 'http.route == "/v1/chat/completions"',
       "--stage", 'preprocess=name == "tokenize"', "--stage", 'generation=name == "generate"',
       "--stage", 'streaming=name == "stream_response"']


def _run(*args: str) -> object:
    return runner.invoke(app, list(args))


def _ok(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.stdout


def _sql(store: Path, query: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(_ok("sql", query, "--store", str(store), "--format", "json"))
    return rows


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, http_chat.Truth]:
    base = tmp_path_factory.mktemp("http_chat")
    truth = http_chat.write(base / "chat.otlp.jsonl")
    _ok("ingest", "--quiet", "--store", str(base / "plain"), str(base / "chat.otlp.jsonl"))
    return base, truth


@pytest.fixture(scope="module")
def mapped(scenario: tuple[Path, http_chat.Truth]) -> Path:
    base, _ = scenario
    store = base / "mapped"
    shutil.copytree(base / "plain", store)
    out = _ok("map", "--store", str(store), *MAP)
    assert "mapping saved in" in out and "rebuilt the requests of 1 hour(s)" in out
    return store


def _ns(iso: str) -> int:
    return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1_000_000_000)


def test_before_the_map_nothing_is_a_request(scenario: tuple[Path, http_chat.Truth]) -> None:
    base, _ = scenario
    assert _sql(base / "plain", "SELECT count(*) AS n FROM requests") == [{"n": 0}]


def test_after_one_map_command_the_report_finds_the_incident(mapped: Path,
                                                            scenario: tuple[Path, http_chat.Truth]) -> None:
    _, truth = scenario
    result = runner.invoke(app, ["report", "--store", str(mapped), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["requests"] == truth.requests
    assert len(report["spikes"]) == 1, report["spikes"]
    spike = report["spikes"][0]
    slack = report["window_s"] * 1_000_000_000
    start, end = _ns(spike["start"]), _ns(spike["end"])
    assert truth.start_ns - slack <= start < truth.end_ns and truth.start_ns < end <= truth.end_ns + slack
    assert spike["stages"][0]["stage"] == truth.stage == "generation"
    first = spike["dimensions"][0]
    assert (first["dimension"], first["value"]) == ("replica", truth.pod)
    assert f"{truth.requests:,} request(s) recognised" in result.stderr and "(map " in result.stderr


def test_mapped_requests_have_their_stages_and_outcomes(mapped: Path, scenario: tuple[Path, http_chat.Truth]) -> None:
    _, truth = scenario
    [row] = _sql(mapped, """
        SELECT count(*) AS n, count(*) FILTER (WHERE status = 'error') AS errors,
               count(*) FILTER (WHERE status = 'cancelled') AS cancelled,
               count(*) FILTER (WHERE preprocess_ns > 0 AND generation_ns > 0) AS staged,
               count(*) FILTER (WHERE network_ns + queue_wait_ns + preprocess_ns + model_load_ns + generation_ns
                                + prefill_ns + decode_ns + streaming_ns + other_ns <> e2e_ns) AS bad_sums,
               count(DISTINCT replica) AS pods,
               count(*) FILTER (WHERE span_name <> 'POST /v1/chat/completions') AS other
        FROM requests""")
    assert row == {"n": truth.requests, "errors": truth.errors, "cancelled": truth.cancelled,
                   "staged": truth.requests, "bad_sums": 0, "pods": 6, "other": 0}
    assert truth.errors > 0 and truth.cancelled > 0


def test_watch_cost_and_the_dashboard_read_the_mapped_requests(mapped: Path, tmp_path: Path,
                                                               scenario: tuple[Path, http_chat.Truth]) -> None:
    _, truth = scenario
    rules = tmp_path / "slo.txt"
    rules.write_text("p99(e2e) < 2s\n")
    alerts = [json.loads(line) for line in _ok("watch", "--store", str(mapped), "--replay", "--json", "--rules",
                                               str(rules)).splitlines() if line.startswith("{")]
    assert sorted(a["kind"] for a in alerts) == ["slo", "tail_spike"]
    for alert in alerts:
        assert (_ns(alert["window_start"]), _ns(alert["window_end"])) == (truth.start_ns, truth.end_ns)
    [spike] = [a for a in alerts if a["kind"] == "tail_spike"]
    assert (spike["stage"], spike["dimension"], spike["value"]) == (truth.stage, "replica", truth.pod)
    cost = json.loads(_ok("cost", "--store", str(mapped), "--json", "--by", "replica"))
    assert sum(row["requests"] for row in cost["rows"]) == truth.requests
    from dashboard import data

    wb = data.workbench(str(mapped.resolve()))
    if wb.warmer is not None:
        wb.warmer.join()
    assert data.summary(wb, str(wb.store), wb.version, data.Filters())["requests"] == truth.requests


def test_the_mapping_is_shown_saved_and_versioned_into_the_materialized_hours(
        mapped: Path, scenario: tuple[Path, http_chat.Truth]) -> None:
    base, _ = scenario
    shown = _ok("map", "--store", str(mapped))
    assert " ".join(shown.split()) == (
        f"tailscope map --store '{mapped}' --request 'http.route == \"/v1/chat/completions\"' "
        "--stage 'preprocess=name == \"tokenize\"' --stage 'generation=name == \"generate\"' "
        "--stage 'streaming=name == \"stream_response\"'")
    built, plain = snapshot(mapped), snapshot(base / "plain")
    assert not built.stale and not plain.stale and list(built.fresh) == list(plain.fresh)
    # the hour was rebuilt under a new key: the mapping is part of it
    assert {p.name for p in built.fresh.values()}.isdisjoint(p.name for p in plain.fresh.values())
    # the materialized rows are the rows the model computes on the fly with the mapping
    fresh = base / "fresh"
    shutil.copytree(mapped, fresh)
    shutil.rmtree(fresh / "requests")
    query = "SELECT * FROM requests ORDER BY trace_id, span_id"
    on_the_fly = json.loads(_ok("sql", query, "--store", str(fresh), "--format", "json", "--no-materialize"))
    assert json.loads(_ok("sql", query, "--store", str(mapped), "--format", "json")) == on_the_fly


def test_reset_removes_the_mapping(scenario: tuple[Path, http_chat.Truth]) -> None:
    base, truth = scenario
    store = base / "reset"
    shutil.copytree(base / "plain", store)
    _ok("map", "--store", str(store), *MAP, "--tenant", "attr:customer.id")
    [row] = _sql(store, "SELECT count(*) AS n, count(DISTINCT tenant) AS tenants FROM requests")
    assert row == {"n": truth.requests, "tenants": 40}
    assert "mapping removed" in _ok("map", "--store", str(store), "--reset")
    assert not (store / MAP_FILE).exists()
    assert _sql(store, "SELECT count(*) AS n FROM requests") == [{"n": 0}]
    assert "no mapping in" in _ok("map", "--store", str(store))


def test_suggest_prints_a_ready_to_run_command_with_its_evidence(scenario: tuple[Path, http_chat.Truth]) -> None:
    base, truth = scenario
    store = base / "plain"
    out = _ok("map", "--suggest", "--store", str(store))
    lines = out.splitlines()
    joined = " ".join(out.split())
    command = (f"tailscope map --store '{store}' --request 'http.route == \"/v1/chat/completions\"' "
               "--stage 'generation=name == \"generate\"' --stage 'preprocess=name == \"tokenize\"' "
               "--stage 'streaming=name == \"stream_response\"' --tenant 'attr:customer.id'")
    assert joined.startswith(command)
    assert f"--request: {truth.requests:,} of {truth.requests:,} root SERVER spans have http.route " \
           "/v1/chat/completions" in joined
    assert "--stage preprocess: child span 'tokenize' in 100% of the requests" in joined
    assert sum(line.startswith("  # --stage") for line in lines) == 3
    assert not (store / MAP_FILE).exists()  # a suggestion saves nothing


def test_a_bad_rule_is_one_line_with_its_column(tmp_path: Path, scenario: tuple[Path, http_chat.Truth]) -> None:
    base, _ = scenario
    result = runner.invoke(app, ["map", "--store", str(base / "plain"), "--request", 'http.route = "/v1"'])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        "error: --request: column 12 of 'http.route = \"/v1\"': unexpected character '=' (compare with ==)"]
    result = runner.invoke(app, ["map", "--store", str(base / "plain"), "--stage", "generate"])
    assert result.exit_code == 1 and "write NAME=EXPRESSION" in result.output
    assert not (base / "plain" / MAP_FILE).exists()


def test_clickhouse_honours_the_same_mapping_file(tmp_path: Path) -> None:
    """The mapping a store saved, given as a file to --engine clickhouse (compiled to ClickHouse SQL, run in chdb),
    gives the same report as the store's own (a smaller run of the same API: equality needs no spike)."""
    pytest.importorskip("chdb")
    from analysis.clickhouse import promotion

    http_chat.write(tmp_path / "chat.otlp.jsonl", requests=1200, seed=2)
    mapped = tmp_path / "store"
    _ok("ingest", "--quiet", "--store", str(mapped), str(tmp_path / "chat.otlp.jsonl"))
    _ok("map", "--store", str(mapped), *MAP, "--tenant", "attr:customer.id")
    dsn = f"chdb:{tmp_path / 'ch'}"
    _ok("export", "--to", "clickhouse", "--dsn", dsn, "--store", str(mapped), "--quiet")
    rules = str(mapped / MAP_FILE)
    try:
        count = ["sql", "SELECT count(*) AS n, countIf(status = 'error') AS errors, uniqExact(tenant) AS tenants "
                 "FROM requests", "--engine", "clickhouse", "--dsn", dsn, "-f", "json", "--no-materialize"]
        assert json.loads(_ok(*count)) == [{"n": 0, "errors": 0, "tenants": 0}]  # the table alone: no request
        ch = json.loads(_ok(*count, "--mapping", rules))
        duck = _sql(mapped, "SELECT count(*) AS n, count(*) FILTER (WHERE status = 'error') AS errors, "
                            "count(DISTINCT tenant) AS tenants FROM requests")
        assert ch == duck and duck[0]["n"] > 0
        ch_report = _ok("report", "--engine", "clickhouse", "--dsn", dsn, "--json", "--no-materialize",
                        "--mapping", rules)
        assert json.loads(ch_report) == json.loads(_ok("report", "--store", str(mapped), "--json"))
    finally:
        promotion.use_mapping("otel_traces", None)
    bad = runner.invoke(app, ["report", "--store", str(mapped), "--mapping", rules])
    assert bad.exit_code == 1 and "--mapping is for --engine clickhouse" in bad.output


def test_collect_saves_the_mapping_file_in_its_store(mapped: Path, tmp_path: Path) -> None:
    import signal

    from tests.intake.collect_helpers import start_cli_receiver

    store = tmp_path / "collected"
    proc, _port = start_cli_receiver(store, "--mapping", str(mapped / MAP_FILE))
    try:
        assert json.loads((store / MAP_FILE).read_text()) == json.loads((mapped / MAP_FILE).read_text())
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0


def test_ingest_into_a_mapped_store_says_the_mapping_declares_the_requests(tmp_path: Path,
                                                                          mapped: Path) -> None:
    store = tmp_path / "more"
    shutil.copytree(mapped, store)
    http_chat.write(tmp_path / "later.otlp.jsonl", requests=60, seed=9)
    result = runner.invoke(app, ["ingest", "--store", str(store), str(tmp_path / "later.otlp.jsonl")])
    assert result.exit_code == 0, result.output
    assert "the store's mapping declares the requests" in " ".join(result.stdout.split())
    assert "no span was recognised" not in result.stderr
