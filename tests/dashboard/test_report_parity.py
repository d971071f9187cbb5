"""The Spike and Overview pages show exactly what `tailscope report --json` says for the same store and range."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from analysis.engine.percentiles import iso, parse_time
from analysis.report import explain_window
from dashboard import charts, data
from tests.dashboard.conftest import APP, shown_tables


def _cli_report(store: Path, *extra: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "tailscope.cli", "report", "--json", "--store", str(store), *extra],
                         capture_output=True, text=True, check=True, timeout=600)
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def _app(store: Path, monkeypatch: pytest.MonkeyPatch) -> AppTest:
    monkeypatch.setenv("TAILSCOPE_STORE", str(store))
    at = AppTest.from_file(str(APP), default_timeout=300)
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    return at


def _metrics(at: AppTest) -> dict[str, str]:
    return {m.label: str(m.value) for m in at.metric}


def _hms(text: str) -> str:
    return f"{pd.Timestamp(text):%H:%M:%S}"


def _check_spike_page(at: AppTest, store: Path, filters: data.Filters, spike: dict[str, Any]) -> None:
    """The page's explanation (the cached analysis call it rendered) and its text equal the CLI's spike (the folded
    pairs' expander opened: its table is drawn only then)."""
    at.session_state["spike_folded"] = True
    at.switch_page("app_pages/spike.py").run()
    assert not at.exception, [e.message for e in at.exception]
    label = at.radio(key="spike_choice").value
    assert label is not None
    assert label.startswith(f"spike {_hms(spike['start'])}–{_hms(spike['end'])}")
    wb = data.workbench(str(store))
    shown = dict(data.explain(wb, str(store), wb.version, filters, *data.spike_times_ns(spike)))
    assert shown.pop("detected") is True
    assert shown == spike  # window, counts, p50, p99, baselines, stages, dimensions, exemplars: all equal
    with data._cursor(wb, filters) as cur:  # the brushed-window path gives the same on the dashboard's rows
        again = explain_window(cur, *data.spike_times_ns(spike), since=filters.since_ns, until=filters.until_ns,
                               source="requests")
    assert again.pop("detected") is True
    assert again == spike
    m = _metrics(at)
    assert m["requests in window"] == f"{spike['requests']:,}"
    assert m["p99"] == charts.fmt_ms(spike["p99_ms"])
    assert m["baseline p99"] == charts.fmt_ms(spike["baseline_p99_ms"])
    assert m["p50 (baseline)"] == f"{charts.fmt_ms(spike['p50_ms'])} ({charts.fmt_ms(spike['baseline_p50_ms'])})"
    top = spike["stages"][0]
    stage_text = " ".join(md.value for md in at.markdown)
    assert f"**{top['stage']}**" in stage_text and f"**{top['share']:.0%}**" in stage_text
    lead = spike["dimensions"][0]
    assert f"**{lead['dimension']} = {lead['value']}**" in at.success[0].value
    assert f"{lead['explained']:.0%} of the excess explained" in at.success[0].value
    assert f"baseline without it: {charts.fmt_ms(lead['baseline_p99_without_ms'])}" in at.success[0].value
    singles = [d for d in spike["dimensions"] if "&" not in d["dimension"]][:12]
    tables = shown_tables(at)  # Markdown tables: the report's values as a reader sees them, under readable headers
    assert tables[0][["dimension", "value", "share of the excess explained", "p99 without", "tail requests"]
                     ].to_dict("records") == [
        {"dimension": d["dimension"], "value": d["value"], "share of the excess explained": f"{d['explained']:.1%}",
         "p99 without": f"{d['p99_without_ms']:,.0f} ms", "tail requests": f"{d['support']:,}"} for d in singles]
    # the pairs: those explaining more than their parts in a table, those folded under a part (`folded_under`) apart
    pairs = [d for d in spike["dimensions"] if "&" in d["dimension"]]
    kept = [{"dimension": d["dimension"], "value": d["value"]} for d in pairs if "folded_under" not in d][:10]
    if kept:
        assert tables[1][["dimension", "value"]].to_dict("records") == kept
    folded = [d for d in pairs if "folded_under" in d]
    assert [e.label for e in at.expander if "pairs folded" in e.label] == (
        [f"{len(folded)} pairs folded: each explains no more than one of its values"] if folded else [])
    if folded:
        want = []
        for d in folded:
            part = spike["dimensions"][d["folded_under"]]
            want.append({"folded under": f"{part['dimension']} = {part['value']}", "dimension": d["dimension"],
                         "value": d["value"], "share of the excess explained": f"{d['explained']:.1%}"})
        shown_folded = tables[2 if kept else 1]
        assert shown_folded[list(want[0])].to_dict("records") == want


def test_spike_and_overview_equal_the_cli_report(incident_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cli = _cli_report(incident_store)
    assert cli["spikes"], "the incident store has a spike"
    at = _app(incident_store, monkeypatch)
    assert _metrics(at)["spikes"] == str(len(cli["spikes"]))
    first = sorted(cli["spikes"], key=lambda s: s["start"])[0]
    banner = at.warning[0].value.replace("\\:", ":")  # as it reads: a clock's colons are escaped in its Markdown
    assert f"**Spike {_hms(first['start'])}–{_hms(first['end'])} UTC**" in banner
    assert f"p99 {charts.fmt_ms(first['p99_ms'])} against a baseline of {charts.fmt_ms(first['baseline_p99_ms'])}" \
        in banner
    assert any(f"windows of {cli['window_s']} s" in c.value for c in at.main.caption)
    _check_spike_page(at, incident_store, data.Filters(), first)


def test_under_a_time_filter_the_pages_equal_the_cli_with_since(incident_store: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    at = _app(incident_store, monkeypatch)
    lo, hi = at.slider(key="f_time").value
    since = lo + timedelta(minutes=4)
    at.slider(key="f_time").set_value((since, hi)).run()
    assert not at.exception
    since_ns = parse_time(since.replace(tzinfo=UTC))
    assert since_ns is not None
    cli = _cli_report(incident_store, "--since", iso(since_ns))
    assert cli["spikes"] and cli["since"] == iso(since_ns)
    assert _metrics(at)["requests"] == f"{cli['requests']:,}"
    assert isinstance(since, datetime)
    _check_spike_page(at, incident_store, data.Filters(since_ns=since_ns), sorted(cli["spikes"],
                                                                                 key=lambda s: s["start"])[0])


def test_a_brushed_window_is_explained_as_analysis_explains_it_on_the_store(incident_store: Path) -> None:
    """A window that is no spike: the dashboard's explanation equals explain_window on a plain connection."""
    from analysis.engine.connect import connect

    wb = data.workbench(str(incident_store))
    lo = data.choices(wb, str(incident_store), wb.version)["min_ns"]
    a, b = lo + 300 * 1_000_000_000, lo + 540 * 1_000_000_000
    shown = data.explain(wb, str(incident_store), wb.version, data.Filters(), a, b)
    want = explain_window(connect(incident_store), a, b)
    assert shown["detected"] is False and shown["requests"] > 0 and shown["stages"]
    assert shown == want


@pytest.fixture(scope="module")
def half_store(incident_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The incident store sampled at one half by OpenTelemetry's consistent rule (`ot=th` recorded). Its trace ids
    count up (no randomness in their last 56 bits): each is replaced by a hash of itself first."""
    import hashlib

    import pyarrow as pa

    from tests.sample_traces import sampled_copy as SC

    spans = SC.read_spans(incident_store)
    ids = pa.array([hashlib.blake2b(t.encode(), digest_size=16).hexdigest()
                    for t in spans.column("TraceId").to_pylist()], pa.string())
    spans = spans.set_column(spans.schema.get_field_index("TraceId"), "TraceId", ids)
    spans = SC.consistent_sample(spans, lambda r: 0.5)
    return SC.write_store(tmp_path_factory.mktemp("half") / "store", spans)


def test_on_a_sampled_store_the_pages_count_what_the_kept_requests_stand_for(
        half_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Overview, Spike, Request shape and Cost show analysis' weighted counts, not one per stored request."""
    cli = _cli_report(half_store)
    assert cli["sampled"] is True and cli["spikes"]
    at = _app(half_store, monkeypatch)
    assert _metrics(at)["requests"] == f"{cli['requests_weighted']:,.0f}" != f"{cli['requests']:,}"
    spike = sorted(cli["spikes"], key=lambda s: s["start"])[0]
    at.switch_page("app_pages/spike.py").run()
    assert not at.exception, [e.message for e in at.exception]
    shown = at.metric[0]
    assert shown.label == "requests in window"
    assert shown.value == f"{spike['requests_weighted']:,.0f}" != f"{spike['requests']:,}"
    table = shown_tables(at)[0]
    singles = [d for d in spike["dimensions"] if "&" not in d["dimension"]][:12]
    assert table["tail requests (weighted)"].tolist() == [f"{d['support_weighted']:,.0f}" for d in singles]
    wb = data.workbench(str(half_store))
    at.switch_page("app_pages/shape.py").run()
    assert not at.exception, [e.message for e in at.exception]
    grid = data.shape(wb, str(half_store), wb.version, data.Filters())
    w = grid[~grid["p99_low_sample"]].sort_values("p99_ms", ascending=False).iloc[0]
    assert f"over {w['requests_weighted']:,.0f} requests." in " ".join(md.value for md in at.markdown)
    at.switch_page("app_pages/cost.py").run()
    assert not at.exception, [e.message for e in at.exception]
    from analysis.cost import cost_table
    from analysis.engine.connect import connect

    want = cost_table(connect(half_store), by="tenant")
    got = shown_tables(at)[0]
    assert got["requests"].tolist() == [f"{r['requests_weighted']:,.0f}" for r in want["rows"]]
    assert sum(r["requests_weighted"] for r in want["rows"]) > sum(r["requests"] for r in want["rows"])
