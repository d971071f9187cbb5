"""Alert records: the watch's configuration, its events, stable alert ids and dashboard links."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any, Final

from analysis.watch.rules import NS, WATCH_METRICS, Rule
from tracing.errors import QueryError

#: Version of the alert record (replay --json, webhook payload, STORE/alerts/ files).
ALERT_VERSION: Final = 1
#: Directory of the alert state inside a store.
ALERTS_DIR: Final = "alerts"


def to_ms(ns: float | None) -> float | None:
    """Nanoseconds as milliseconds rounded to the microsecond (None for a missing or infinite value)."""
    return round(ns / 1e6, 3) if ns is not None and math.isfinite(ns) else None


def alert_id(key: str, metric: str, first_window_ns: int) -> str:
    """Stable id of an alert: the same condition starting in the same window always gets the same id."""
    return hashlib.sha256(f"{key}|{metric}|{first_window_ns}".encode()).hexdigest()[:20]


def spike_url(dashboard_url: str | None, start_ns: int, end_ns: int) -> str | None:
    """The dashboard's Spike page for a window (`?start_ns=&end_ns=`), or None without a dashboard URL."""
    if not dashboard_url:
        return None
    return f"{dashboard_url.rstrip('/')}/spike?start_ns={int(start_ns)}&end_ns={int(end_ns)}"


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
