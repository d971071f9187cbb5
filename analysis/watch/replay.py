"""Watch replay: the live watch run over stored windows, to backtest what it would have fired."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb

from analysis.watch.evaluation import Watcher
from analysis.watch.reading import open_range, read_rows
from analysis.watch.records import Config, Event


def replay(store: Path, config: Config, since_ns: int, until_ns: int,
           on_event: Callable[[Event], None] | None = None) -> list[dict[str, Any]]:
    """Run the watch over stored windows in [since_ns, until_ns) as if live; returns every alert (final state).

    The buffer starts filled with the `lookback` windows before `since_ns` (not evaluated), as a
    live watch started earlier would have it. Alerts still firing at the end have resolved_at null.
    """
    config.check()
    w = config.window_ns
    first = (since_ns // w) * w
    last = -(-until_ns // w) * w
    pre = first - config.windows_kept() * w
    con = open_range(store, pre, last + config.delay_ns + 1)
    try:
        rows = read_rows(con, pre, last, w, config.delay_ns)
        watcher = Watcher(config)
        win_of = (rows.get_column("start_ns") // w) * w
        parts = {int(k[0]) if isinstance(k, tuple) else int(k): g for k, g in rows.with_columns(
            win_of.alias("_w")).group_by("_w", maintain_order=True)}
        empty = rows.head(0)
        for t in range(pre, first, w):
            watcher.add_window(t, parts.get(t, empty).drop("_w", strict=False))
        alerts: dict[str, dict[str, Any]] = {}

        def explain_con(lo: int, hi: int) -> duckdb.DuckDBPyConnection:
            return open_range(store, lo, hi)

        for t in range(first, last, w):
            for ev in watcher.tick(t, parts.get(t, empty).drop("_w", strict=False), explain_con):
                alerts[ev.alert["id"]] = dict(ev.alert)
                if on_event is not None:
                    on_event(ev)
    finally:
        con.close()
    return sorted(alerts.values(), key=lambda a: (a["fired_at"], a["id"]))



def replay_json(alert: dict[str, Any]) -> dict[str, Any]:
    """The replay --json object of an alert (the alert record without the internal ns start)."""
    return {k: v for k, v in alert.items() if k != "window_start_ns"}
