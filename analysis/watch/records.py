"""Alert records: the watch's configuration, its events, stable alert ids and dashboard links."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import urlencode

from analysis.engine import model as M
from analysis.watch.rules import NS, WATCH_METRICS, Rule
from tracing.errors import QueryError

#: Version of the alert record (replay --json, webhook payload, STORE/alerts/ files).
ALERT_VERSION: Final = 1
#: Directory of the alert state inside a store.
ALERTS_DIR: Final = "alerts"
#: Severity of an alert whose rule sets none (`labels {severity="..."}` in the rules file).
DEFAULT_SEVERITY: Final = "warning"
#: Longest `value` label: longer values are cut (the full value stays in the description).
VALUE_LABEL_MAX: Final = 64



def alert_id(key: str, metric: str, first_window_ns: int) -> str:
    """Stable id of an alert: the same condition starting in the same window always gets the same id."""
    return hashlib.sha256(f"{key}|{metric}|{first_window_ns}".encode()).hexdigest()[:20]


def spike_url(dashboard_url: str | None, start_ns: int, end_ns: int,
              filters: tuple[tuple[str, str], ...] = ()) -> str | None:
    """The dashboard's Spike page for a window (`?start_ns=&end_ns=`, plus the rule's filters the
    sidebar reads, e.g. `&tenant=acme`), or None without a dashboard URL."""
    if not dashboard_url:
        return None
    query = [("start_ns", str(int(start_ns))), ("end_ns", str(int(end_ns)))]
    # the filters the sidebar reads from a link; the rest stay in the description
    query += [(k, v) for k, v in filters if k in M.FILTER_DIMENSIONS]
    return f"{dashboard_url.rstrip('/')}/spike?{urlencode(query)}"


def with_attribute(url: str | None, alert: dict[str, Any]) -> str | None:
    """The alert's dashboard link narrowed to the attribute value its explanation names (`&attr=&attr_value=`, the
    sidebar's attribute filter), when it names one attribute; else the link as it was."""
    attr, value = alert.get("attribute"), alert.get("value")
    if not url or not attr or value is None or alert.get("attribute_source") not in ("request", "stage", "resource"):
        return url
    return f"{url}&{urlencode([('attr', attr), ('attr_value', value)])}"


def fmt_ms(ms: float | None) -> str:
    """Milliseconds as the CLI prints them (`32,720 ms`; `-` when missing)."""
    return "-" if ms is None else f"{ms:,.0f} ms"


def alert_summary(alert: dict[str, Any]) -> str:
    """One line saying what broke, with the figures formatted as the CLI formats them."""
    what = f"SLO {alert['rule']} broken" if alert["kind"] == "slo" else f"p99 of {alert['metric']} spiked"
    base = (f" against a baseline of {fmt_ms(alert['baseline_p99_ms'])}"
            if alert.get("baseline_p99_ms") is not None else "")
    return f"{what}: p99 {fmt_ms(alert['p99_ms'])}{base}, p50 {fmt_ms(alert['p50_ms'])}"


def alert_description(alert: dict[str, Any]) -> str:
    """The cause in sentences: the stage that grew, the counterfactual of the top dimension, the window, exemplars."""
    out = [f"Window {alert['window_start']} to {alert['window_end']}, {alert['requests']:,} requests."]
    if alert.get("filters"):
        out.append("Requests with " + ", ".join(f"{k}={v}" for k, v in alert["filters"]) + ".")
    if alert.get("stage"):
        share = f"{alert['stage_share']:.0%} of the excess" if alert.get("stage_share") is not None else "the excess"
        out.append(f"{share[0].upper()}{share[1:]} is in stage {alert['stage']}.")
    if alert.get("dimension"):
        explained = f" ({alert['explained']:.0%} of the excess)" if alert.get("explained") is not None else ""
        out.append(f"Without {alert['dimension']}={alert['value']}, p99 falls from {fmt_ms(alert['p99_ms'])} "
                   f"to {fmt_ms(alert.get('p99_without_ms'))}{explained}.")
    if alert.get("exemplars"):
        out.append("Exemplar traces: " + ", ".join(alert["exemplars"][:3]) + ".")
    return " ".join(out)


def value_label(value: Any) -> str:
    """The `value` label of an explained alert: the value, cut to VALUE_LABEL_MAX characters.

    The explanation never names ids or free text (they are skipped as candidates), and an alert
    fixes its labels when it fires, so one alert has one value: the label adds no series per request."""
    text = str(value)
    return text if len(text) <= VALUE_LABEL_MAX else text[:VALUE_LABEL_MAX - 1] + "…"


def alert_labels(alert: dict[str, Any]) -> dict[str, str]:
    """The labels an alert is routed on (Alertmanager): identity, severity, metric, service, stage,
    dimension, value, then the rule's own labels (which may override severity and the rest)."""
    labels = {"alertname": "TailscopeTailSpike" if alert["kind"] == "tail_spike" else "TailscopeSLO",
              "kind": alert["kind"], "metric": alert["metric"], "alert_id": alert["id"], "source": "tailscope",
              "severity": DEFAULT_SEVERITY}
    if alert.get("rule"):
        labels["rule"] = alert["rule"]
    for key in ("service", "stage", "dimension"):
        if alert.get(key) is not None:
            labels[key] = str(alert[key])
    if alert.get("value") is not None:
        labels["value"] = value_label(alert["value"])
    labels |= dict(alert.get("labels") or {})
    return labels


@dataclass
class Config:
    """What a watch evaluates and how: metric, window, delay, lookback, rules, dashboard link."""

    metric: str = "e2e"
    window_s: float = 60.0
    delay_s: float = 60.0
    lookback: int = 60
    rules: list[Rule] = field(default_factory=list)
    include_failures: bool = True
    dashboard_url: str | None = None
    explain: bool = True

    @property
    def spike_rule(self) -> Rule | None:
        """The rules file's `tail_spike` line (labels and annotations of the tail-spike alert), if any."""
        return next((r for r in self.rules if r.kind == "tail_spike"), None)

    @property
    def slo_rules(self) -> list[Rule]:
        """The rules evaluated as SLOs (every rule but the `tail_spike` line)."""
        return [r for r in self.rules if r.kind != "tail_spike"]

    @property
    def window_ns(self) -> int:
        """Window length in ns."""
        return round(self.window_s * NS)

    @property
    def delay_ns(self) -> int:
        """How long after a window closes it is evaluated (ns)."""
        return round(self.delay_s * NS)

    def windows_kept(self) -> int:
        """Windows the buffer holds: the lookback, and enough for every burn rule's slow span."""
        need = [math.ceil(r.slow_s / self.window_s) for r in self.rules if r.kind == "burn"]
        return max([self.lookback, *need])

    def check(self) -> None:
        """QueryError on a setting that cannot work."""
        if self.metric not in WATCH_METRICS:
            raise QueryError("", f"unknown watch metric {self.metric!r}; use one of {', '.join(WATCH_METRICS)}")
        if self.lookback < 4:
            raise QueryError("", f"--lookback must be at least 4 windows (a baseline needs 3), got {self.lookback}")
        if self.delay_s < 0:
            raise QueryError("", f"--delay must not be negative, got {self.delay_s}")


@dataclass
class Event:
    """A change of an alert: "firing" or "resolved", with the full alert record."""

    status: str
    alert: dict[str, Any]
