"""The live watch: which window comes next, the buffer, persistence and delivery hooks; the stdout line."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Final

import polars as pl

from analysis.engine.percentiles import choose_window_s
from analysis.watch.evaluation import Watcher
from analysis.watch.reading import open_range, read_rows, request_source
from analysis.watch.records import Config, Event, fmt_ms
from analysis.watch.state import AlertStore
from tracing.store import require_store

#: The span of stored requests whose rate chooses a live watch's window (the last hour before now - delay).
RATE_SPAN_NS: Final = 3_600_000_000_000


def live_window_s(store: Path, now_ns: int, delay_s: float) -> float:
    """The window of a live watch started without --window: the one its saved state used (a restart keeps
    the grid), else the report's choice (percentiles.choose_window_s) for the requests of the last hour."""
    saved = AlertStore(store).load_state().get("window_s")
    if saved:
        return float(saved)
    hi = now_ns - round(delay_s * 1e9)
    con = open_range(store, hi - RATE_SPAN_NS, hi)
    try:
        return float(choose_window_s(con, hi - RATE_SPAN_NS, hi, request_source(con)))
    finally:
        con.close()


class LiveWatch:
    """The live loop's state machine: which window comes next, the buffer, persistence, delivery hooks.

    `step(now_ns)` evaluates every window closed (and past its delay) by now_ns that was not
    evaluated yet, persisting state after each; `deliver(event)` is called for each event after
    its record is kept and before the state moves past its window (so a crash re-creates it).
    """

    def __init__(self, store: Path, config: Config, deliver: Callable[[Event], object],
                 memory_limit: str = "2GB") -> None:
        self.store = require_store(Path(store))
        self.config = config
        self.alerts = AlertStore(self.store)
        self.memory_limit = memory_limit
        state = self.alerts.load_state()
        self.watcher = Watcher(config, state.get("active") or {})
        self.next_window_ns: int | None = state.get("last_window_end_ns")
        self.deliver = deliver
        self._filled = False
        self.ticks = 0

    def _closed_until(self, now_ns: int) -> int:
        """End of the newest window that can be evaluated at now_ns."""
        w = self.config.window_ns
        return ((now_ns - self.config.delay_ns) // w) * w

    def _fill(self, upto_ns: int) -> None:
        """Read the lookback windows before upto_ns into the buffer (once, at start)."""
        w = self.config.window_ns
        lo = upto_ns - self.config.windows_kept() * w
        con = open_range(self.store, lo, upto_ns + self.config.delay_ns + 1, self.memory_limit)
        try:
            rows = read_rows(con, lo, upto_ns, w, self.config.delay_ns)
        finally:
            con.close()
        for t in range(lo, upto_ns, w):
            self.watcher.add_window(t, rows.filter((pl.col("start_ns") >= t) & (pl.col("start_ns") < t + w)))
        self._filled = True

    def step(self, now_ns: int) -> list[Event]:
        """Evaluate the windows that became due by now_ns; returns their events."""
        w = self.config.window_ns
        closed = self._closed_until(now_ns)
        if self.next_window_ns is None:
            self.next_window_ns = closed - w  # a new watch starts with the newest window that can be evaluated
        start = max(self.next_window_ns, closed - self.config.windows_kept() * w)
        start = -(-start // w) * w  # on the window grid (the window may have changed since the state was saved)
        if not self._filled:
            self._fill(start)
        events: list[Event] = []
        for t in range(start, closed, w):
            con = open_range(self.store, t, t + w + self.config.delay_ns + 1, self.memory_limit)
            try:
                rows = read_rows(con, t, t + w, w, self.config.delay_ns)
            finally:
                con.close()
            new = self.watcher.tick(t, rows, lambda lo, hi: open_range(self.store, lo, hi, self.memory_limit))
            for ev in new:
                self.alerts.save_alert(ev.alert)
                self.deliver(ev)
            self.alerts.save_state(t + w, self.watcher.active, self.config)
            self.next_window_ns = t + w
            self.ticks += 1
            events += new
        return events

    def next_due_ns(self) -> int:
        """Wall-clock time (ns) at which the next window becomes due."""
        w = self.config.window_ns
        nxt = self.next_window_ns if self.next_window_ns is not None else 0
        return nxt + w + self.config.delay_ns


def summary_line(ev: Event) -> str:
    """The one stdout line of an event."""
    a = ev.alert
    when = a["resolved_at"] if ev.status == "resolved" else a["fired_at"]
    what = a["rule"] if a["kind"] == "slo" else f"tail spike of {a['metric']}"
    parts = [f"{when} {ev.status.upper()} {what} [{a['id']}] window {a['window_start']}..{a['window_end']}",
             f"p50 {fmt_ms(a['p50_ms'])} p99 {fmt_ms(a['p99_ms'])} (baseline p99 {fmt_ms(a['baseline_p99_ms'])})"]
    if a.get("stage"):
        parts.append(f"stage {a['stage']} ({a['stage_share']:.0%})" if a.get("stage_share") is not None
                     else f"stage {a['stage']}")
    if a.get("dimension"):
        expl = f", {a['explained']:.0%} explained" if a.get("explained") is not None else ""
        parts.append(f"{a['dimension']}={a['value']}{expl}")
    if a.get("exemplars"):
        parts.append("exemplar " + a["exemplars"][0])
    if a.get("dashboard_url"):
        parts.append(a["dashboard_url"])
    return " · ".join(parts)


