"""The report end to end on hand-made stores: the JSON contract, the spike, its stage, dimension and exemplars."""

from __future__ import annotations

import json
import re
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from analysis import build_report, connect
from analysis.report import render_text
from analysis.stats import explain as X
from tailscope.cli import app
from tests import samples_cache
from tests.factory import T0, add_request, hex_id, write
from tracing import schema as S
from tracing.rows import SpanBatch

MS = 1_000_000
SEC = 1_000_000_000
WINDOWS = 10
PER_WINDOW = 600
SLOW_REPLICA = "replica-03"
SPIKE_WINDOWS = (5, 6)


def clean_fleet_store(path: Path) -> Path:
    """`fleet_store` without the spike."""
    return fleet_store(path, spike=False)


def fleet_store(path: Path, spike: bool = True) -> Path:
    """10 one-minute windows of 600 requests on 8 replicas; with `spike`, replica-03 decodes 4x slower in 5..6.

    Each request: queue_wait 20 ms, then generation = prefill 50 ms + decode (1,000 .. 1,999 ms).
    """
    batch = SpanBatch()
    for w in range(WINDOWS):
        for j in range(PER_WINDOW):
            i = w * PER_WINDOW + j
            replica = f"replica-{j % 8:02d}"
            start = w * 60 * SEC + j * 100 * MS
            decode = (1000 + (j * 617) % 1000) * MS
            if spike and w in SPIKE_WINDOWS and replica == SLOW_REPLICA:
                decode *= 4
            q1 = start + 20 * MS
            p1 = q1 + 50 * MS
            end = p1 + decode
            out_tokens = 64 + (j * 37) % 400
            add_request(batch, i, start, end, [
                ("queue_wait", start, q1),
                ("generation", q1, end),
                ("prefill", q1, p1, "generation"),
                ("decode", p1, end, "generation"),
            ], attrs={"gen_ai.request.model": "llama", S.ATTR_MODEL_VERSION: "v1",
                      S.ATTR_TENANT: ("acme", "globex", "initech")[j % 3],
                      "gen_ai.usage.input_tokens": str(100 + (j * 53) % 900),
                      "gen_ai.usage.output_tokens": str(out_tokens)}, replica=replica)
    write(path, batch)
    return path


@pytest.fixture(scope="module")
def spiky(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Its own: `tailscope report` below materializes the hours into it."""
    return fleet_store(tmp_path_factory.mktemp("spiky"))


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return samples_cache.built("fleet-clean", clean_fleet_store, tmp_path_factory)


TOP_KEYS = {"version", "metric", "window_s", "requests", "outcomes", "include_failures", "since", "until",
            "percentile_convention", "values", "windows", "baseline_p50_ms", "baseline_p99_ms", "spikes", "errors",
            "sampled", "requests_weighted", "outcomes_weighted", "values_weighted", "values_effective",
            "baseline_effective", "sampling", "warnings", "attributes"}
SPIKE_KEYS = {"start", "end", "requests", "p50_ms", "p99_ms", "baseline_p50_ms", "baseline_p99_ms", "excess_ms",
              "p_value", "windows", "stages", "dimensions", "exemplars", "errors", "candidates_tested",
              "tail_requests", "noisy_neighbour", "requests_weighted", "n_effective", "tail_requests_weighted",
              "tail_effective", "pairs_cut"}
DIM_KEYS = {"dimension", "value", "lo", "hi", "score", "p99_without_ms", "explained", "support", "tail_share",
            "baseline_share", "baseline_p99_without_ms", "p_value", "conditions", "support_weighted", "attribute",
            "source"}


def test_report_finds_the_spike_and_names_stage_replica_and_exemplars(spiky: Path) -> None:
    report = build_report(connect(spiky))
    assert set(report) == TOP_KEYS
    assert (report["metric"], report["window_s"], report["requests"], report["windows"]) == ("e2e", 60, 6000, 10)
    assert report["outcomes"] == {"ok": 6000, "error": 0, "timeout": 0, "cancelled": 0}
    assert report["errors"] == []
    # unsampled: the weighted counts are the counts, nothing is judged about sampling
    assert (report["sampled"], report["requests_weighted"], report["values_effective"]) == (False, 6000.0, 6000.0)
    assert (report["sampling"], report["warnings"]) == (None, [])
    assert len(report["spikes"]) == 1
    spike = report["spikes"][0]
    assert set(spike) == SPIKE_KEYS
    assert spike["pairs_cut"] == []  # every pair of six built-ins is far under MAX_PAIR_CELLS
    assert (spike["start"], spike["end"], spike["requests"]) == ("2025-11-20T14:05:00Z", "2025-11-20T14:07:00Z", 1200)
    assert spike["stages"][0]["stage"] == "decode"
    assert sum(s["share"] for s in spike["stages"] if s["share"] > 0) == pytest.approx(1.0, abs=1e-3)
    assert {s["stage"] for s in spike["stages"]} <= {"decode", "prefill", "queue_wait"}  # no `generation`
    top = spike["dimensions"][0]
    assert set(top) == DIM_KEYS | {"finer", "coarser"}  # the named one's levels of a learned hierarchy
    assert (top["dimension"], top["value"], top["lo"], top["hi"]) == ("replica", SLOW_REPLICA, None, None)
    explained, without, p99 = top["explained"], top["p99_without_ms"], spike["p99_ms"]
    assert explained is not None and explained > 0.9
    assert without is not None and p99 is not None and without < p99
    # unsampled: every effective count is the count
    assert spike["tail_requests_weighted"] == spike["tail_effective"] == spike["tail_requests"]
    assert all(d["support_weighted"] == d["support"] for d in spike["dimensions"])
    # every exemplar is a slow request of replica-03 inside the spike
    slow = {hex_id("trace", w * PER_WINDOW + j, size=32) for w in SPIKE_WINDOWS for j in range(3, PER_WINDOW, 8)}
    assert spike["exemplars"] and set(spike["exemplars"]) <= slow
    assert all(re.fullmatch(r"[0-9a-f]{32}", t) for t in spike["exemplars"])
    # bucketed dimensions carry integer bounds
    buckets = [d for d in spike["dimensions"] if d["dimension"] in ("input_tokens", "output_tokens")]
    assert all(isinstance(d["lo"], int) and d["hi"] == 2 * d["lo"] - 1 for d in buckets)
    json.dumps(report)  # the contract is plain JSON


def test_clean_store_reports_no_spike(clean: Path) -> None:
    report = build_report(connect(clean))
    assert report["spikes"] == [] and report["errors"] == []
    e2e_ms = sorted(70 + 1000 + (j * 617) % 1000 for j in range(PER_WINDOW)) * 1  # every window alike
    assert report["baseline_p50_ms"] == (e2e_ms[299] + e2e_ms[300]) / 2 == 1573.5


def test_window_since_until_and_other_metrics(spiky: Path) -> None:
    con = connect(spiky)
    report = build_report(con, window_s="2m", since="2025-11-20T14:01:00Z", until="2025-11-20T14:10:00Z")
    assert (report["window_s"], report["requests"], report["since"]) == (120, 5400, "2025-11-20T14:01:00Z")
    assert [(s["start"], s["end"]) for s in report["spikes"]] == [("2025-11-20T14:04:00Z", "2025-11-20T14:08:00Z")]
    ttft = build_report(con, metric="ttft")
    assert ttft["spikes"] == [] and ttft["baseline_p50_ms"] == 70.0  # queue 20 + prefill 50: unchanged
    tpot = build_report(con, metric="tpot")
    assert (tpot["metric"], tpot["values"]) == ("tpot", 6000)


def test_a_failing_sub_analysis_is_reported_not_raised(spiky: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(con: duckdb.DuckDBPyConnection, ids: list[str], lo: int, hi: int) -> None:
        raise duckdb.IOException("disk went away")

    monkeypatch.setattr(X, "stage_rows", broken)
    report = build_report(connect(spiky))
    spike = report["spikes"][0]
    assert spike["stages"] == []
    assert spike["errors"] == ["could not compute stages because disk went away"]
    assert report["errors"] == spike["errors"]
    assert spike["dimensions"][0]["value"] == SLOW_REPLICA  # the rest still stands


def test_text_rendering(spiky: Path) -> None:
    from rich.console import Console

    console = Console(record=True, width=160)
    render_text(build_report(connect(spiky)), console)
    text = console.export_text()
    assert "spike 1: 2025-11-20T14:05:00Z -> 2025-11-20T14:07:00Z" in text
    assert "decode" in text and SLOW_REPLICA in text


def test_cli_json_text_and_errors(spiky: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["report", "--store", str(spiky), "--json", "--window", "1m"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["spikes"][0]["start"] == "2025-11-20T14:05:00Z"
    result = runner.invoke(app, ["report", "--store", str(spiky), "--metric", "ttft"])
    assert result.exit_code == 0 and "no p99 spike" in result.stdout
    result = runner.invoke(app, ["report", "--store", str(tmp_path / "missing")])
    assert result.exit_code == 1 and "no store there" in result.stderr
    result = runner.invoke(app, ["report", "--store", str(spiky), "--window", "soon"])
    assert result.exit_code == 1 and "cannot read duration" in result.stderr


def test_empty_range_is_a_message_not_a_crash(spiky: Path) -> None:
    report = build_report(connect(spiky), since=T0 + 3600 * SEC)
    assert report["requests"] == 0 and report["spikes"] == []
    assert report["errors"] == ["could not compute spikes because no request has a e2e value in range"]


def test_public_names() -> None:
    import analysis

    for name in ("build_report", "render_text", "percentile_series", "request_facts", "detect", "simulate",
                 "whatif"):
        assert name in analysis.__all__ and callable(getattr(analysis, name))


def test_a_source_out_of_start_order_gives_the_same_report(spiky: Path) -> None:
    """The frame's dimensions are read apart from its values and joined by row id: rows handed over in any
    order (the frame then sorts its values) give the report of the same rows in start order."""
    con = connect(spiky)
    ordered = build_report(con, source="(SELECT * FROM requests ORDER BY start_ns)")
    shuffled = build_report(con, source="(SELECT * FROM requests ORDER BY hash(trace_id))")
    assert ordered["spikes"] and ordered["spikes"][0]["dimensions"][0]["value"] == SLOW_REPLICA
    assert shuffled == ordered


def test_rows_in_windows_equals_a_look_up_of_every_row() -> None:
    """The rows of a set of windows found by bisection (rows in start order) or by look-up (any order) are those of
    np.isin over every row's window number, on random rows: empty, unsorted, negative and boundary starts."""
    import numpy as np

    from analysis.report import rows_in_windows

    rng = np.random.default_rng(23)
    for case in range(300):
        w = int(rng.integers(1, 50))
        n = int(rng.integers(0, 400))
        start = rng.integers(-5 * w, 40 * w, n).astype(np.int64)
        edge = rng.random(n) < 0.2  # starts on a window's bound, or just before one
        start[edge] = rng.integers(-5, 40, int(edge.sum())) * w - rng.integers(0, 2, int(edge.sum()))
        if case % 3:
            start.sort()
        windows = np.unique(rng.integers(-6, 42, int(rng.integers(0, 12))))
        got = rows_in_windows(start, windows, w)
        assert got.tolist() == np.flatnonzero(np.isin(start // w, windows)).tolist(), case
