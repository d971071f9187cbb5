"""Watch state on disk: STORE/alerts/ (state.json and every alert record), written temp-then-rename."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl

from analysis.engine.percentiles import parse_time
from analysis.watch.records import ALERT_VERSION, ALERTS_DIR, Config
from analysis.watch.rules import NS
from tracing.errors import StoreError
from tracing.store import write_atomic


class AlertStore:
    """STORE/alerts/: state.json (last window evaluated, active alerts) and items/<id>.json (every alert)."""

    def __init__(self, store: Path) -> None:
        self.root = Path(store) / ALERTS_DIR
        self.items = self.root / "items"

    def load_state(self) -> dict[str, Any]:
        """The saved state, or an empty one; StoreError when the file is unreadable."""
        path = self.root / "state.json"
        if not path.exists():
            return {"version": ALERT_VERSION, "last_window_end_ns": None, "active": {}}
        try:
            state: dict[str, Any] = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise StoreError(f"{path}: cannot read the watch state ({exc}); move it away to start afresh") from None
        return state

    def save_state(self, last_window_end_ns: int, active: dict[str, dict[str, Any]], config: Config) -> None:
        """Persist the state atomically."""
        state = {"version": ALERT_VERSION, "last_window_end_ns": int(last_window_end_ns), "active": active,
                 "metric": config.metric, "window_s": config.window_s, "delay_s": config.delay_s}
        write_atomic(self.root / "state.json", json.dumps(state, indent=1).encode())

    def save_alert(self, alert: dict[str, Any]) -> None:
        """Keep an alert record (rewritten when it resolves) for the dashboard."""
        write_atomic(self.items / f"{alert['id']}.json", json.dumps(alert, indent=1).encode())


def list_alerts(store: Path | str) -> list[dict[str, Any]]:
    """Every alert kept in a store (newest first); unreadable files are skipped."""
    items = Path(store) / ALERTS_DIR / "items"
    out = []
    for path in items.glob("*.json") if items.is_dir() else []:
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    out.sort(key=lambda a: (a.get("fired_at") or "", a.get("id") or ""), reverse=True)
    return out


def alerts_frame(store: Path | str, since_ns: int | None = None, until_ns: int | None = None) -> pl.DataFrame:
    """The kept alerts as a table (one row per alert) overlapping [since_ns, until_ns), for the dashboard."""
    rows = []
    for a in list_alerts(store):
        start = int(a.get("window_start_ns") or 0)
        end = start + round(float(a.get("window_s") or 0) * NS) if not a.get("window_end") else _parse_ns(
            a["window_end"])
        if (since_ns is not None and end <= since_ns) or (until_ns is not None and start >= until_ns):
            continue
        rows.append({"id": a.get("id"), "kind": a.get("kind"), "status": a.get("status"), "rule": a.get("rule"),
                     "metric": a.get("metric"), "fired_at": a.get("fired_at"), "resolved_at": a.get("resolved_at"),
                     "window_start_ns": start, "window_end_ns": end, "p50_ms": a.get("p50_ms"),
                     "p99_ms": a.get("p99_ms"), "baseline_p99_ms": a.get("baseline_p99_ms"), "stage": a.get("stage"),
                     "dimension": a.get("dimension"), "value": a.get("value"),
                     "exemplars": ", ".join(a.get("exemplars") or [])})
    schema = {"id": pl.String, "kind": pl.String, "status": pl.String, "rule": pl.String, "metric": pl.String,
              "fired_at": pl.String, "resolved_at": pl.String, "window_start_ns": pl.Int64,
              "window_end_ns": pl.Int64, "p50_ms": pl.Float64, "p99_ms": pl.Float64,
              "baseline_p99_ms": pl.Float64, "stage": pl.String, "dimension": pl.String, "value": pl.String,
              "exemplars": pl.String}
    return pl.DataFrame(rows, schema=schema)


def _parse_ns(text: str) -> int:
    return int(parse_time(text) or 0)
