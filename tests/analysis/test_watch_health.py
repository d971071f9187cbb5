"""The live watch's health on /metrics: evaluation time and duration, alerts firing, deliveries failed and queued.

A LiveWatch over a real store, a Deliverer whose receiver refuses (a real HTTP server answering
503): after one step and one delivery pass the figures, parsed from the OpenMetrics text as
Prometheus reads them, are exactly what happened.
"""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics.exposition import generate_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from analysis.watch import Config, Event, LiveWatch
from analysis.watch.delivery import Deliverer, Outbox, receivers_from
from analysis.watch.health import WatchHealth
from tests.analysis.alert_receiver import recording
from tracing.store import init_store


def _values(health: WatchHealth) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(health)
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def test_health_counts_what_happened(tmp_path: Path) -> None:
    store = init_store(tmp_path / "store")
    with recording(fail_first=10) as rec:
        receivers = receivers_from([rec.url("/hook")], [])
        outbox = Outbox(store, receivers)
        deliverer = Deliverer(outbox, backoff=(60.0, 60.0))
        live = LiveWatch(store, Config(window_s=30.0), outbox.enqueue)
        health = WatchHealth(live, deliverer)
        before = _values(health)
        assert ("tailscope_watch_last_evaluation_timestamp_seconds", ()) not in before  # absent until one ran
        live.step(10**18)
        health.evaluated(0.2)
        health.evaluated(0.1, ok=False)
        live.watcher.active["slo:x"] = {"kind": "slo"}
        alert = {"id": "a1", "kind": "slo", "status": "firing", "rule": "r", "metric": "e2e", "fired_at": "t",
                 "resolved_at": None, "window_start": "a", "window_end": "b", "requests": 1, "p50_ms": 1.0,
                 "p99_ms": 2.0, "baseline_p99_ms": None}
        assert outbox.enqueue(Event("firing", alert)) == 1
        deliverer.deliver_once()  # refused: one failure, the entry stays queued (retry in 60 s)
        got = _values(health)
    name = receivers[0].name
    assert got[("tailscope_watch_window_seconds", ())] == 30.0
    assert got[("tailscope_watch_evaluation_duration_seconds_count", ())] == 2
    assert abs(got[("tailscope_watch_evaluation_duration_seconds_sum", ())] - 0.3) < 1e-12
    assert got[("tailscope_watch_evaluation_failures_total", ())] == 1
    assert got[("tailscope_watch_alerts_firing", (("kind", "slo"),))] == 1
    assert got[("tailscope_watch_alerts_firing", (("kind", "tail_spike"),))] == 0
    assert got[("tailscope_watch_delivery_failures_total", ())] == 1
    assert got[("tailscope_watch_deliveries_total", ())] == 0
    assert got[("tailscope_watch_deliveries_queued", (("receiver", name),))] == 1
    assert got[("tailscope_watch_evaluated_until_timestamp_seconds", ())] * 1e9 == live.next_window_ns
    assert ("tailscope_watch_last_evaluation_timestamp_seconds", ()) in got
