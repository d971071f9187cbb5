"""`tailscope watch` with its defaults: the window is the report's choice, the demo's incidents fire, alerts route.

The demo store (sample_traces/data/demo.otlp.jsonl.gz, ingested once a session) replayed with no option
but --replay must fire both incidents of demo.truth.json, each once, with the truth stage and an
accepted dimension value, as Alertmanager labels; the window is the one `tailscope report` chose;
the dashboard link and window end follow the alert's window as it grows.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from analysis.engine.materialize import materialize
from analysis.engine.percentiles import auto_window_s, parse_time
from analysis.watch import Config, parse_rule, parse_rules
from analysis.watch.delivery import alertmanager_alert
from analysis.watch.live import live_window_s
from analysis.watch.records import spike_url
from analysis.watch.state import AlertStore
from sample_traces import generate
from tailscope.cli import app
from tests import samples_cache
from tests.sample_traces.seeded import accepted
from tracing.errors import QueryError
from tracing.store import init_store

runner = CliRunner()
DASH = "http://127.0.0.1:8501"


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The store `tailscope ingest --quiet` writes of the demo sample: the session's demo store (`tailscope demo`
    ingested the same committed file; tests/samples_cache.py), copied, with its hours materialized as the command
    does, rather than decoding the 4 MB sample again (about 5 CPU-seconds)."""
    demo, run = samples_cache.demo(tmp_path_factory)
    assert run.returncode == 0, run.stderr
    store = tmp_path_factory.mktemp("demo") / "store"
    shutil.copytree(demo, store)
    materialize(store)
    return store


@pytest.fixture(scope="module")
def replayed(demo_store: Path) -> list[dict[str, Any]]:
    result = runner.invoke(app, ["watch", "--replay", "--json", "--store", str(demo_store), "--dashboard-url", DASH])
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


def test_the_demo_fires_both_incidents_with_the_defaults(replayed: list[dict[str, Any]]) -> None:
    truth = json.loads(generate.DEMO_TRUTH.read_text())["incidents"]
    assert len(replayed) == len(truth) == 2
    for alert, inc in zip(replayed, sorted(truth, key=lambda t: t["window"]["start_ns"]), strict=True):
        assert alert["kind"] == "tail_spike" and alert["status"] == "resolved"
        # fired while the incident ran, resolved after it ended
        assert inc["window"]["start"] < alert["fired_at"] <= inc["window"]["end"] < alert["resolved_at"]
        labels = alertmanager_alert(alert, "firing")["labels"]
        assert labels["stage"] == inc["stage"] and labels["severity"] == "warning"
        assert labels["service"] == "llm-server" and labels["metric"] == "e2e"
        assert accepted({"dimension": labels["dimension"], "value": labels["value"]}, inc["accept"]), labels


def test_the_window_is_the_reports(demo_store: Path, replayed: list[dict[str, Any]]) -> None:
    result = runner.invoke(app, ["report", "--json", "--store", str(demo_store)])
    report = json.loads(result.stdout[:result.stdout.rindex("}") + 1])
    assert report["window_s"] == 120 and all(a["window_s"] == report["window_s"] for a in replayed)


def test_the_link_and_the_window_end_follow_the_alert_as_it_grows(replayed: list[dict[str, Any]]) -> None:
    from analysis.engine.percentiles import parse_time
    for alert in replayed:
        start_ns, end_ns = parse_time(alert["window_start"]), parse_time(alert["window_end"])
        assert start_ns is not None and end_ns is not None
        assert end_ns - start_ns > alert["window_s"] * 1_000_000_000  # the alert outlived its first window
        assert alert["dashboard_url"] == spike_url(DASH, start_ns, end_ns)
        am = alertmanager_alert(alert, "resolved")
        assert am["generatorURL"] == am["annotations"]["dashboard"] == alert["dashboard_url"]
        assert am["annotations"]["window_end"] == alert["window_end"]


def test_replay_refuses_delivery_options_in_one_line(demo_store: Path) -> None:
    for option in ("--webhook", "--alertmanager"):
        result = runner.invoke(app, ["watch", "--replay", "--store", str(demo_store), option, "http://127.0.0.1:9/"])
        assert result.exit_code == 1 and "Traceback" not in result.output
        assert result.output.strip() == "error: --replay delivers nothing: drop --webhook / --alertmanager, " \
                                        "or run the live watch"


def test_rules_set_labels_and_annotations() -> None:
    r = parse_rule('p99(ttft) < 2s for tenant=acme labels {severity="page", team="gpu"} '
                   'annotations {runbook_url="http://rb/#ttft", summary_extra="a \\"quoted\\" word"}  # comment')
    assert (r.text, r.where) == ("p99(ttft) < 2s for tenant=acme", (("tenant", "acme"),))
    assert r.labels == (("severity", "page"), ("team", "gpu"))
    assert r.annotations == (("runbook_url", "http://rb/#ttft"), ("summary_extra", 'a "quoted" word'))
    spike = parse_rules('tail_spike labels {severity="critical"}\nerror_rate < 1%\n')[0]
    assert (spike.kind, spike.labels) == ("tail_spike", (("severity", "critical"),))
    alert = {"version": 1, "id": "x", "kind": "slo", "status": "firing", "rule": r.text, "metric": "ttft",
             "fired_at": "t1", "resolved_at": None, "window_start": "a", "window_end": "b", "requests": 10,
             "p50_ms": 1.0, "p99_ms": 2500.4, "baseline_p99_ms": None, "filters": [list(f) for f in r.where],
             "labels": dict(r.labels), "annotations": dict(r.annotations), "service": "chat"}
    am = alertmanager_alert(alert, "firing")
    assert am["labels"] == {"alertname": "TailscopeSLO", "kind": "slo", "metric": "ttft", "alert_id": "x",
                            "source": "tailscope", "severity": "page", "rule": r.text, "service": "chat",
                            "team": "gpu"}
    assert am["annotations"]["summary"] == f"SLO {r.text} broken: p99 2,500 ms, p50 1 ms"
    assert am["annotations"]["description"] == "Window a to b, 10 requests. Requests with tenant=acme."
    assert am["annotations"]["runbook_url"] == "http://rb/#ttft"


@pytest.mark.parametrize(("text", "needle"), [
    ('error_rate < 1% labels {severity=page}', "cannot read labels"),
    ('error_rate < 1% labels {alertname="x"}', "'alertname' cannot be a label"),
    ('error_rate < 1% labels {severity="page"', "labels { is not closed"),
    ('error_rate < 1% labels {severity="page"} junk', "cannot read 'junk'"),
])
def test_bad_label_clauses_say_which_line(text: str, needle: str) -> None:
    with pytest.raises(QueryError) as err:
        parse_rules(f"p99(e2e) < 1s\n{text}\n", "rules.txt")
    assert str(err.value).startswith("rules.txt:2: ") and needle in str(err.value), str(err.value)


def test_the_link_carries_the_rules_filters() -> None:
    assert spike_url(DASH + "/", 1, 2, (("tenant", "a&b"), ("input_tokens", "512"))) == \
        f"{DASH}/spike?start_ns=1&end_ns=2&tenant=a%26b"


def test_a_live_watch_keeps_its_saved_window_and_chooses_one_without(tmp_path: Path, demo_store: Path) -> None:
    empty = init_store(tmp_path / "empty")
    assert live_window_s(empty, 10**18, 60.0) == 60.0  # no request in the last hour: the report's default
    AlertStore(empty).save_state(0, {}, Config(window_s=15.0))
    assert live_window_s(empty, 10**18, 60.0) == 15.0
    # the hour before the demo's end holds all of it (30 minutes at 8 requests/s): the report's choice for that hour
    truth = json.loads(generate.DEMO_TRUTH.read_text())
    end_ns = truth["incidents"][0]["window"]["start_ns"] - 420_000_000_000 + round(truth["duration_s"] * 1e9)
    chosen = live_window_s(demo_store, end_ns + 60_000_000_000, 60.0)
    assert chosen == auto_window_s(14_448, 3600.0) == 300


def test_a_growing_alert_keeps_its_filters_and_attribute_in_the_link() -> None:
    """As a tail-spike alert's window grows, its link follows the new end and keeps the filters it fired with (a
    rule's `where`) and the attribute value its explanation named (the old code dropped the filters)."""
    import numpy as np
    import polars as pl

    from analysis.watch import Rule
    from analysis.watch.evaluation import Watcher
    from analysis.watch.records import with_attribute

    window_ns, ns = 60 * 1_000_000_000, 1_000_000_000
    rule = Rule("tail_spike", "tail_spike", where=(("tenant", "acme"),))
    w = Watcher(Config(window_s=60, delay_s=0, dashboard_url=DASH, rules=[rule], explain=False))
    rng = np.random.default_rng(3)
    fired: dict[str, Any] | None = None
    ends: list[int] = []
    for i in range(26):
        n = 600
        e2e = rng.normal(1.0, 0.05, n) * ns
        if i >= 22:  # four windows with a slow tail
            e2e[: n // 10] = 40 * ns
        rows = pl.DataFrame({"trace_id": [f"t{i}-{j}" for j in range(n)], "span_id": [f"s{j}" for j in range(n)],
                             "start_ns": i * window_ns + np.sort(rng.integers(0, window_ns, n)),
                             "e2e_ns": e2e.astype(np.int64), "ttft_ns": None, "tpot_ns": None, "status": "ok",
                             "replica": "r1", "model": "m", "model_version": None, "tenant": "acme",
                             "input_tokens": 100, "output_tokens": 10, "service": "svc", "adjusted_count": 1.0})
        events = w.tick(i * window_ns, rows)
        if events and events[0].status == "firing":
            fired = events[0].alert
            # as if its explanation had named an attribute value
            fired.update({"attribute": "k8s.node.name", "attribute_source": "resource", "value": "node-3"})
        if fired is not None and "tail_spike" in w.active:
            grown = parse_time(w.active["tail_spike"]["window_end"])
            assert grown is not None
            ends.append(grown)
    assert fired is not None and len(set(ends)) >= 2, ends  # it fired, then grew
    alert = fired  # the record itself, grown in place (resolving leaves its window and link)
    end = parse_time(alert["window_end"])
    assert end is not None and end == max(ends) > fired["window_start_ns"] + window_ns
    assert alert["dashboard_url"] == with_attribute(spike_url(DASH, alert["window_start_ns"], end,
                                                              (("tenant", "acme"),)), alert)
    assert "tenant=acme" in alert["dashboard_url"] and "attr=k8s.node.name&attr_value=node-3" in alert["dashboard_url"]
