"""The live watch's own health for /metrics: when it last evaluated, how long that took, what fires, what waits.

A prometheus_client collector read at scrape time; the watch loop calls `evaluated` after each
step (nothing else is measured on its path). Deliveries are read from the `Deliverer` and its
outbox (the entries pending on disk, so a queue left by a stopped watch shows too).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from analysis.watch.delivery import Deliverer
from analysis.watch.live import LiveWatch

#: Buckets of one evaluation step (seconds): a tick reads one window's hours and may explain a spike.
STEP_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class WatchHealth:
    """Collector of a live watch's health (docs/metrics.md lists the names)."""

    def __init__(self, live: LiveWatch, deliverer: Deliverer) -> None:
        self.live = live
        self.deliverer = deliverer
        self.last_evaluation_s: float | None = None
        self.failed_evaluations = 0
        self.step = Histogram("tailscope_watch_evaluation_duration_seconds", "Time one evaluation step took "
                              "(every window that became due, read, evaluated, its alerts kept).",
                              buckets=STEP_BUCKETS_S, registry=None)

    def evaluated(self, seconds: float, ok: bool = True) -> None:
        """Note one evaluation step: its duration, and whether it failed (the watch retries next tick)."""
        self.step.observe(seconds)
        if ok:
            self.last_evaluation_s = time.time()
        else:
            self.failed_evaluations += 1

    def collect(self) -> Iterator[Metric]:
        """The figures now (prometheus_client's collector protocol)."""
        if self.last_evaluation_s is not None:
            yield GaugeMetricFamily("tailscope_watch_last_evaluation_timestamp_seconds",
                                    "Unix time of the last successful evaluation step.", value=self.last_evaluation_s)
        if self.live.next_window_ns is not None:
            yield GaugeMetricFamily("tailscope_watch_evaluated_until_timestamp_seconds",
                                    "End of the newest window evaluated (Unix time): now minus this is the lag.",
                                    value=self.live.next_window_ns / 1e9)
        yield GaugeMetricFamily("tailscope_watch_window_seconds", "Length of the evaluated window.",
                                value=self.live.config.window_s)
        yield from self.step.collect()
        yield CounterMetricFamily("tailscope_watch_evaluation_failures", "Evaluation steps that failed (retried).",
                                  value=self.failed_evaluations)
        firing = GaugeMetricFamily("tailscope_watch_alerts_firing", "Alerts firing now, by kind.", labels=["kind"])
        kinds: dict[str, int] = {"tail_spike": 0, "slo": 0}
        for alert in list(self.live.watcher.active.values()):
            kinds[alert.get("kind", "slo")] = kinds.get(alert.get("kind", "slo"), 0) + 1
        for kind, n in kinds.items():
            firing.add_metric([kind], n)
        yield firing
        yield CounterMetricFamily("tailscope_watch_deliveries", "Alert notifications delivered (2xx).",
                                  value=self.deliverer.sent)
        yield CounterMetricFamily("tailscope_watch_delivery_failures", "Delivery attempts that failed (retried).",
                                  value=self.deliverer.failures)
        queued = GaugeMetricFamily("tailscope_watch_deliveries_queued", "Notifications waiting in the outbox, "
                                   "by receiver.", labels=["receiver"])
        for receiver in self.deliverer.outbox.receivers:
            queued.add_metric([receiver.name], len(_pending(self.deliverer, receiver)))
        yield queued


def _pending(deliverer: Deliverer, receiver: Any) -> list[Any]:
    try:
        return deliverer.outbox.pending(receiver)
    except OSError:
        return []
