"""Watch: the report's spike detection and SLO rules, run window by window, firing and resolving alerts.

One evaluation per closed window (`Watcher.tick`): the window's requests join a buffer of
the last `lookback` windows, and

- tail spike: `analysis.stats.spikes.detect` runs on the buffer; while the newest window is part
  of a significant spike (p99 up, p50 flat) the alert fires, with the report's explanation
  (`analysis.report.explain_spikes`: stage shares, the top dimension and its counterfactual,
  exemplar trace ids). It resolves on the first evaluated window that is not;
- SLO rules (`parse_rules`): `p99(ttft) < 2s`, `p99(e2e) < 20s for tenant=acme`,
  `error_rate < 1%` and `burn(e2e < 20s, 99%) > 14.4 over 5m, 1h` (multi-window burn rate),
  each evaluated on the newest window (burn: on the last windows covering each span).

A window [t, t + w) is evaluated at t + w + delay and sees the requests that started in it
and ended by then: a live watch (`run_live`) and a backtest (`replay`) see the same rows,
so the replay prints exactly what the live watch would have fired. Percentiles follow the
project convention (`quantile_cont`, failures included); each alert carries its counts.
Sampled traces: each request weighs its adjusted count (`adjusted_count`) in the spike
detection, the rule percentiles (analysis.engine.percentiles' weighted quantile, low-sample on the
effective count), the error rate and the burn rate; where every weight is 1 the unweighted
computation runs, bit for bit.

Cost per tick is independent of the store's history: a tick reads only the hour partitions
holding the new window (`open_range`); the baseline is the in-memory buffer, rebuilt from a
bounded lookback after a restart. Alert state lives in STORE/alerts/ (`AlertStore`, written
temp-then-rename), so a restarted watch neither repeats a fire nor loses a resolve.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from analysis.engine.percentiles import (
    GROUP_COLUMNS,
    MIN_TAIL,
    effective_count,
    iso,
    parse_duration,
    request_facts,
    weighted_quantile_sorted,
)
from analysis.engine.views import VIEW_SQL, files_source, spans_sql
from analysis.report import explain_spikes
from analysis.stats import explain as X
from analysis.stats.spikes import Detection, Spike, detect
from tracing import schema as S
from tracing.errors import QueryError, StoreError
from tracing.store import list_hour, require_store

#: Version of the alert record (replay --json, webhook payload, STORE/alerts/ files).
ALERT_VERSION: Final = 1
#: Metrics the watch can detect spikes on and rules can name.
WATCH_METRICS: Final[tuple[str, ...]] = ("e2e", "ttft", "tpot")
#: Directory of the alert state inside a store.
ALERTS_DIR: Final = "alerts"
HOUR_NS: Final = 3_600_000_000_000
NS: Final = 1_000_000_000
_ROW_COLUMNS: Final = ("trace_id", "start_ns", "e2e_ns", "ttft_ns", "tpot_ns", "status", *X.DIMENSIONS,
                       "service", "adjusted_count")

# --- rules ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """One SLO rule of a rules file.

    kind: "percentile" (q of metric below threshold), "error_rate" (failed share below
    threshold) or "burn" (error-budget burn rate over a fast and a slow span, both above
    `rate` to fire). `where` filters requests on GROUP_COLUMNS values.
    """

    text: str
    kind: str
    metric: str = "e2e"
    q: float = 0.99
    threshold_ns: float = 0.0
    threshold_ratio: float = 0.0
    objective: float = 0.99
    rate: float = 1.0
    fast_s: float = 300.0
    slow_s: float = 3600.0
    where: tuple[tuple[str, str], ...] = ()

    @property
    def key(self) -> str:
        """The state key of the rule (its normalized text)."""
        return "slo:" + " ".join(self.text.split())


_DUR = r"([0-9]*\.?[0-9]+\s*(?:ms|s|m|h|d)?)"
_PCT = r"([0-9]*\.?[0-9]+)\s*%"
_METRIC = r"(e2e|ttft|tpot)"
_PERCENTILE_RE = re.compile(rf"p([0-9]{{1,2}}(?:\.[0-9]+)?)\(\s*{_METRIC}\s*\)\s*<\s*{_DUR}")
_ERRORS_RE = re.compile(rf"error_rate\s*<\s*{_PCT}")
_BURN_RE = re.compile(rf"burn\(\s*{_METRIC}\s*<\s*{_DUR}\s*,\s*{_PCT}\s*\)\s*>\s*([0-9]*\.?[0-9]+)\s*"
                      rf"over\s+{_DUR}\s*,\s*{_DUR}")


def parse_rule(line: str, where_from: str = "rule") -> Rule:
    """One rule from its text; QueryError naming `where_from` when it cannot be read."""
    text = line.split("#", 1)[0].strip()
    body, _, filt = text.partition(" for ")
    body = body.strip()
    where: list[tuple[str, str]] = []
    for part in (p.strip() for p in filt.split(",") if p.strip()):
        name, eq, value = part.partition("=")
        if not eq or name.strip() not in GROUP_COLUMNS or not value.strip():
            raise QueryError("", f"{where_from}: cannot read filter {part!r}; write e.g. `for tenant=acme` "
                                 f"(columns: {', '.join(GROUP_COLUMNS)})")
        where.append((name.strip(), value.strip()))
    try:
        if m := _PERCENTILE_RE.fullmatch(body):
            q = float(m.group(1)) / 100
            if not 0 < q < 1:
                raise QueryError("", f"{where_from}: percentile must be between p1 and p99.9")
            return Rule(text, "percentile", metric=m.group(2), q=q,
                        threshold_ns=parse_duration(m.group(3)) * NS, where=tuple(where))
        if m := _ERRORS_RE.fullmatch(body):
            return Rule(text, "error_rate", threshold_ratio=float(m.group(1)) / 100, where=tuple(where))
        if m := _BURN_RE.fullmatch(body):
            objective = float(m.group(3)) / 100
            if not 0 < objective < 1:
                raise QueryError("", f"{where_from}: the objective must be between 0% and 100% (exclusive)")
            fast, slow = parse_duration(m.group(5)), parse_duration(m.group(6))
            if fast > slow:
                raise QueryError("", f"{where_from}: the fast span ({m.group(5)}) must not exceed the slow one")
            return Rule(text, "burn", metric=m.group(1), threshold_ns=parse_duration(m.group(2)) * NS,
                        objective=objective, rate=float(m.group(4)), fast_s=fast, slow_s=slow, where=tuple(where))
    except QueryError as exc:
        raise QueryError("", f"{where_from}: {exc.what}" if not exc.what.startswith(where_from)
                         else exc.what) from None
    raise QueryError("", f"{where_from}: cannot read rule {text!r}; write e.g. `p99(ttft) < 2s`, "
                         "`p99(e2e) < 20s for tenant=acme`, `error_rate < 1%` or "
                         "`burn(e2e < 20s, 99%) > 14.4 over 5m, 1h`")


def parse_rules(text: str, source: str = "rules") -> list[Rule]:
    """Every rule of a rules file (one per line; `#` starts a comment; blank lines skipped)."""
    rules = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.split("#", 1)[0].strip():
            rules.append(parse_rule(line, f"{source}:{n}"))
    keys = [r.key for r in rules]
    dup = next((k for k in keys if keys.count(k) > 1), None)
    if dup:
        raise QueryError("", f"{source}: rule {dup[4:]!r} is written twice")
    return rules


def load_rules(path: Path) -> list[Rule]:
    """The rules of a file; QueryError with the path when it is missing or wrong."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise QueryError("", f"{path}: cannot read the rules file ({exc.strerror})") from None
    return parse_rules(text, str(path))


# --- reading the store: only the hours a range needs ---------------------------------------


def _ts_range(path: Path) -> tuple[int, int]:
    """(min, max) TimestampNs of a segment from its Parquet footer, cached by path, size and mtime."""
    st = path.stat()
    return _ts_range_cached(str(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=200_000)
def _ts_range_cached(path: str, _size: int, _mtime_ns: int) -> tuple[int, int]:
    meta = pq.ParquetFile(path).metadata
    lo, hi = None, None
    try:
        col = meta.schema.names.index("TimestampNs")
    except ValueError:
        return (-(2**63), 2**63 - 1)
    for i in range(meta.num_row_groups):
        stats = meta.row_group(i).column(col).statistics
        if stats is None or not stats.has_min_max:
            return (-(2**63), 2**63 - 1)
        lo = stats.min if lo is None else min(lo, stats.min)
        hi = stats.max if hi is None else max(hi, stats.max)
    if lo is None or hi is None:
        return (0, -1)  # no rows
    return (int(lo), int(hi))


def segment_files_between(store: Path, lo_ns: int, hi_ns: int) -> list[Path]:
    """Segments holding spans that start in [lo_ns, hi_ns): lists only the hour partitions of the range.

    Within a partition, a segment is kept only when its TimestampNs range (read once from its
    Parquet footer, then cached) meets the range: a live receiver writes many small segments an
    hour, and a tick must open only those of its window.
    """
    spans = Path(store) / S.SPANS_DIR
    out: list[Path] = []
    hour = (lo_ns // HOUR_NS) * HOUR_NS
    while hour < hi_ns:
        text = iso(hour)
        directory = spans / f"dt={text[:10]}" / f"hr={text[11:13]}"
        if directory.is_dir():
            for path in list_hour(directory).files:
                try:
                    first, last = _ts_range(path)
                except (FileNotFoundError, OSError, pa.ArrowException):  # compacted away meanwhile, or unreadable
                    continue
                if first < hi_ns and last >= lo_ns:
                    out.append(path)
        hour += HOUR_NS
    return out


def open_range(store: Path, lo_ns: int, hi_ns: int, memory_limit: str = "2GB") -> duckdb.DuckDBPyConnection:
    """A connection whose `spans` view holds only spans starting in [lo_ns, hi_ns) (`_ensure_views` adds the rest).

    Reads only the hour partitions of that range, so its cost does not grow with the store's history.
    """
    store = require_store(Path(store)).resolve()
    con = duckdb.connect(":memory:")
    con.execute("SET memory_limit = ?", [memory_limit])
    con.execute("SET enable_progress_bar = false")
    files = [str(f) for f in segment_files_between(store, lo_ns, hi_ns)]
    con.register("_empty_spans_arrow", S.empty_span_table())
    con.execute("CREATE TABLE _empty_spans AS SELECT * FROM _empty_spans_arrow")
    con.unregister("_empty_spans_arrow")
    source = spans_sql(files_source(files)) if files else spans_sql("_empty_spans")
    con.execute(f"CREATE VIEW spans AS SELECT * FROM ({source}) "
                f"WHERE TimestampNs >= {int(lo_ns)} AND TimestampNs < {int(hi_ns)}")
    return con


def _ensure_views(con: duckdb.DuckDBPyConnection) -> None:
    """Define `requests` and the views it needs on a range connection (only when a query needs them:
    binding them costs more than a tick's own work)."""
    for name, sql in VIEW_SQL.items():
        con.execute(f"CREATE OR REPLACE VIEW {name} AS {sql}")


def read_rows(con: duckdb.DuckDBPyConnection, lo_ns: int, hi_ns: int, window_ns: int, delay_ns: int
              ) -> pl.DataFrame:
    """Requests starting in [lo_ns, hi_ns) that ended by their window's end + delay (what a live watch saw)."""
    try:
        facts = request_facts(con, with_ttft=True)
    except duckdb.CatalogException:  # traces holding several requests are read through the `requests` view
        _ensure_views(con)
        facts = request_facts(con, with_ttft=True)
    cols = ", ".join(_ROW_COLUMNS)
    return con.sql(
        f"SELECT {cols} FROM {facts} WHERE start_ns >= $lo AND start_ns < $hi "
        "AND start_ns + e2e_ns <= (start_ns // $w) * $w + $w + $d ORDER BY start_ns, trace_id",
        params={"lo": lo_ns, "hi": hi_ns, "w": window_ns, "d": delay_ns}).pl()


# --- alert records ----------------------------------------------------------------------------


def _ms(ns: float | None) -> float | None:
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


# --- evaluation ---------------------------------------------------------------------------------


class Watcher:
    """Evaluates windows one at a time and keeps which alerts are active (`active`, by key).

    Pure logic: `tick(window_start_ns, rows, explain_con)` takes the new window's rows and
    returns the events it causes; reading the store and persisting state are the caller's.
    """

    def __init__(self, config: Config, active: dict[str, dict[str, Any]] | None = None) -> None:
        config.check()
        self.config = config
        self.active: dict[str, dict[str, Any]] = dict(active or {})
        self.frames: list[tuple[int, pl.DataFrame]] = []  # (window start ns, rows) oldest first
        self.last_detection: Detection | None = None

    # buffer ------------------------------------------------------------------------------------

    def add_window(self, window_start_ns: int, rows: pl.DataFrame) -> None:
        """Append a window's rows to the buffer (without evaluating); older windows beyond the buffer drop."""
        if "adjusted_count" not in rows.columns:  # rows from before sampling was read weigh 1
            rows = rows.with_columns(pl.lit(1.0).alias("adjusted_count"))
        self.frames.append((int(window_start_ns), rows.select(_ROW_COLUMNS)))
        keep_from = int(window_start_ns) - (self.config.windows_kept()) * self.config.window_ns
        self.frames = [(w, f) for w, f in self.frames if w >= keep_from]

    def buffer(self) -> pl.DataFrame:
        """Rows of every buffered window, in time order."""
        frames = [f for _, f in self.frames if f.height]
        if not frames:
            return pl.DataFrame({c: [] for c in _ROW_COLUMNS})
        return pl.concat(frames, how="vertical_relaxed")

    # one tick ----------------------------------------------------------------------------------

    def tick(self, window_start_ns: int, rows: pl.DataFrame,
             explain_con: Callable[[int, int], duckdb.DuckDBPyConnection] | None = None) -> list[Event]:
        """Evaluate the window [window_start_ns, + window): returns the fires and resolves it causes.

        `explain_con(lo_ns, hi_ns)` opens a connection over the spans of a range, for the stage
        shares of a new alert's explanation (None: stages are left out).
        """
        cfg = self.config
        self.add_window(window_start_ns, rows)
        buf = self.buffer()
        win_end = window_start_ns + cfg.window_ns
        eval_ns = win_end + cfg.delay_ns
        events: list[Event] = []
        events += self._tail(buf, window_start_ns, eval_ns, explain_con)
        for rule in cfg.rules:
            events += self._slo(rule, buf, window_start_ns, eval_ns, explain_con)
        return events

    def _values(self, buf: pl.DataFrame, metric: str) -> pl.DataFrame:
        frame = buf if self.config.include_failures else buf.filter(pl.col("status") == "ok")
        return frame.filter(pl.col(f"{metric}_ns").is_not_null())

    def _detect(self, buf: pl.DataFrame) -> tuple[pl.DataFrame, Detection]:
        frame = self._values(buf, self.config.metric)
        start = frame.get_column("start_ns").to_numpy().astype(np.int64)
        values = frame.get_column(f"{self.config.metric}_ns").to_numpy().astype(np.float64)
        det = detect(start, values, self.config.window_ns, weights=weights_of_rows(frame))
        self.last_detection = det
        return frame, det

    def _tail(self, buf: pl.DataFrame, win_ns: int, eval_ns: int,
              explain_con: Callable[[int, int], duckdb.DuckDBPyConnection] | None) -> list[Event]:
        cfg = self.config
        key = "tail_spike"
        frame, det = self._detect(buf)
        idx = np.flatnonzero(det.window_start_ns == win_ns)
        firing = bool(idx.size and det.significant[idx[0]])
        spike = next((s for s in det.spikes if s.start_ns <= win_ns < s.end_ns), None) if firing else None
        active = self.active.get(key)
        if spike is not None and active is None:
            alert = self._record("tail_spike", key, None, spike.start_ns, win_ns + cfg.window_ns, eval_ns,
                                 spike.p50_ns, spike.p99_ns, spike.baseline_p99_ns, spike.requests,
                                 spike.requests_weighted if det.weighted else None)
            alert["p_value"] = float(f"{spike.p_value:.3g}")
            alert["baseline_p50_ms"] = _ms(spike.baseline_p50_ns)
            if cfg.explain:
                self._explain(alert, frame, det, spike, explain_con)
            self.active[key] = alert
            return [Event("firing", alert)]
        if spike is not None and active is not None:
            active["window_end"] = iso(win_ns + cfg.window_ns)
            active["last_p99_ms"] = _ms(spike.p99_ns)
            return []
        if active is not None:
            return [Event("resolved", self._resolve(key, eval_ns))]
        return []

    def _resolve(self, key: str, eval_ns: int) -> dict[str, Any]:
        alert = self.active.pop(key)
        alert["resolved_at"] = iso(eval_ns)
        alert["status"] = "resolved"
        return alert

    def _record(self, kind: str, key: str, rule: Rule | None, start_ns: int, end_ns: int, eval_ns: int,
                p50_ns: float, p99_ns: float, baseline_p99_ns: float, requests: int,
                requests_weighted: float | None = None) -> dict[str, Any]:
        cfg = self.config
        metric = rule.metric if rule is not None and rule.kind != "error_rate" else cfg.metric
        return {
            "version": ALERT_VERSION, "id": alert_id(key, metric, start_ns), "kind": kind, "status": "firing",
            "rule": rule.text if rule is not None else None, "metric": metric,
            "fired_at": iso(eval_ns), "resolved_at": None,
            "window_start": iso(start_ns), "window_end": iso(end_ns), "window_start_ns": int(start_ns),
            "window_s": int(cfg.window_s) if float(cfg.window_s).is_integer() else cfg.window_s,
            "requests": int(requests),
            "requests_weighted": int(requests) if requests_weighted is None else round(requests_weighted, 3),
            "p50_ms": _ms(p50_ns), "p99_ms": _ms(p99_ns), "baseline_p99_ms": _ms(baseline_p99_ns),
            "stage": None, "stage_share": None, "stages": [],
            "dimension": None, "value": None, "explained": None, "p99_without_ms": None, "dimensions": [],
            "exemplars": [], "dashboard_url": spike_url(cfg.dashboard_url, start_ns, end_ns), "errors": [],
        }

    def _explain(self, alert: dict[str, Any], frame: pl.DataFrame, det: Detection, spike: Spike,
                 explain_con: Callable[[int, int], duckdb.DuckDBPyConnection] | None) -> None:
        """Fill stage, dimension and exemplars from the report's explanation of this spike."""
        if not det.baseline.any():
            alert["errors"].append("could not explain because there is no baseline window")
            return
        one = dataclasses.replace(det, spikes=[spike])
        facts_frame = frame.with_row_index("rid").with_columns(
            pl.col("rid").cast(pl.Int64), pl.col(f"{self.config.metric}_ns").cast(pl.Float64).alias("value"))
        if weights_of_rows(frame) is not None:  # the report's explanation reads the weights from `weight`
            facts_frame = facts_frame.with_columns(pl.col("adjusted_count").cast(pl.Float64).alias("weight"))
        lo = int(frame.get_column("start_ns").min() or 0)  # type: ignore[arg-type]
        hi = int(spike.end_ns + self.config.delay_ns + 1)
        con = explain_con(lo, hi) if explain_con is not None else duckdb.connect(":memory:")
        try:
            con.register("_tailscope_watch_arrow", facts_frame.drop("value", "weight", strict=False).to_arrow())
            con.execute("CREATE OR REPLACE TEMP TABLE _tailscope_watch_facts AS "
                        "SELECT * FROM _tailscope_watch_arrow").fetchall()
            con.unregister("_tailscope_watch_arrow")
            items, errors = explain_spikes(con, "_tailscope_watch_facts", facts_frame, one, self.config.metric)
        finally:
            con.close()
        if not items:
            alert["errors"].extend(errors)
            return
        item = items[0]
        alert["errors"].extend(item.get("errors", []))
        alert["stages"] = item.get("stages", [])
        if alert["stages"]:
            alert["stage"] = alert["stages"][0]["stage"]
            alert["stage_share"] = alert["stages"][0]["share"]
        alert["dimensions"] = item.get("dimensions", [])[:5]
        if alert["dimensions"]:
            top = alert["dimensions"][0]
            alert["dimension"], alert["value"] = top["dimension"], top["value"]
            alert["explained"], alert["p99_without_ms"] = top["explained"], top["p99_without_ms"]
        alert["exemplars"] = item.get("exemplars", [])

    def _slo(self, rule: Rule, buf: pl.DataFrame, win_ns: int, eval_ns: int,
             explain_con: Callable[[int, int], duckdb.DuckDBPyConnection] | None) -> list[Event]:
        cfg = self.config
        frame = buf
        for name, value in rule.where:
            frame = frame.filter(pl.col(name).cast(pl.String) == value)
        win = frame.filter(pl.col("start_ns") >= win_ns)
        measured = evaluate_rule(rule, frame, win_ns, cfg.window_ns, cfg.include_failures)
        if measured is None:  # no data in the window: the state does not change
            return []
        violated, figures = measured
        active = self.active.get(rule.key)
        if violated and active is None:
            ordered, ws = _sorted_values(self._values(win, rule.metric), f"{rule.metric}_ns")
            det = self.last_detection
            base = det.baseline_p99_ns if det is not None and rule.metric == cfg.metric else math.nan
            win_w = weights_of_rows(win)
            p50, p99 = weighted_quantile_sorted(ordered, ws, 0.5), weighted_quantile_sorted(ordered, ws, 0.99)
            alert = self._record("slo", rule.key, rule, win_ns, win_ns + cfg.window_ns, eval_ns, p50, p99,
                                 base, win.height, None if win_w is None else float(win_w.sum()))
            alert.update(figures)
            alert["outcomes"] = _outcomes(win)
            alert["outcomes_weighted"] = _outcomes(win, weighted=True)
            if cfg.explain and det is not None and rule.metric == cfg.metric and not rule.where:
                spike = _window_spike(det, win_ns)
                if spike is not None:
                    self._explain(alert, self._values(buf, cfg.metric), det, spike, explain_con)
            self.active[rule.key] = alert
            return [Event("firing", alert)]
        if violated and active is not None:
            active["window_end"] = iso(win_ns + cfg.window_ns)
            return []
        if not violated and active is not None:
            return [Event("resolved", self._resolve(rule.key, eval_ns))]
        return []


def _window_spike(det: Detection, win_ns: int) -> Spike | None:
    """The newest window as a Spike against the detection's baseline (to explain an SLO breach the same way)."""
    idx = np.flatnonzero(det.window_start_ns == win_ns)
    if not idx.size or not math.isfinite(det.baseline_p99_ns):
        return None
    i = int(idx[0])
    return Spike(start_ns=win_ns, end_ns=win_ns + det.window_ns, requests=int(det.n[i]), p50_ns=float(det.p50_ns[i]),
                 p99_ns=float(det.p99_ns[i]), baseline_p50_ns=det.baseline_p50_ns,
                 baseline_p99_ns=det.baseline_p99_ns, p_value=float(det.p_value[i]), windows=1)


def _outcomes(frame: pl.DataFrame, weighted: bool = False) -> dict[str, int | float]:
    """Requests per outcome; `weighted`: what they stand for (the counts themselves when unsampled)."""
    status = frame.get_column("status").to_list()
    w = weights_of_rows(frame) if weighted else None
    if w is None:
        return {s: status.count(s) for s in ("ok", "error", "timeout", "cancelled")}
    st = np.array(status, dtype=object)
    return {s: round(float(w[st == s].sum()), 3) for s in ("ok", "error", "timeout", "cancelled")}


def weights_of_rows(frame: pl.DataFrame) -> np.ndarray | None:
    """Each row's adjusted count, or None when the frame has none or every one is 1 (the unweighted path)."""
    if "adjusted_count" not in frame.columns:
        return None
    w = frame.get_column("adjusted_count").fill_null(1.0).to_numpy().astype(np.float64)
    return None if bool(np.all(w == 1.0)) else w


def _sorted_values(frame: pl.DataFrame, col: str) -> tuple[np.ndarray, np.ndarray | None]:
    """The non-null values of `col`, sorted, with their weights in the same order (None when unweighted)."""
    rows = frame.filter(pl.col(col).is_not_null())
    raw = rows.get_column(col).to_numpy().astype(np.float64)
    w = weights_of_rows(rows)
    if w is None:
        return np.sort(raw), None
    order = np.argsort(raw, kind="stable")
    return raw[order], w[order]


def _share(frame: pl.DataFrame, bad: pl.Expr) -> tuple[float, int | float]:
    """(share of the rows where `bad` holds, their count), each row weighing its adjusted count when sampled."""
    w = weights_of_rows(frame)
    if w is None:
        n_bad = frame.filter(bad).height
        return n_bad / frame.height, n_bad
    mask = frame.select(bad.fill_null(False)).to_series().to_numpy()
    n_bad_w = float(w[mask].sum())
    return n_bad_w / float(w.sum()), n_bad_w


def evaluate_rule(rule: Rule, frame: pl.DataFrame, win_ns: int, window_ns: int, include_failures: bool = True
                  ) -> tuple[bool, dict[str, Any]] | None:
    """(violated, figures) of a rule on the window starting at win_ns (frame: the filtered buffer); None: no data.

    percentile: the window's quantile (`quantile_cont`, failures included unless asked not to)
    against the threshold; error_rate: failed (error, timeout, cancelled) share of the window;
    burn: bad share (failed, or metric at or above the threshold) over the last windows covering
    the fast and the slow span, divided by the error budget (1 - objective); fires when both exceed the rate.
    """
    win = frame.filter((pl.col("start_ns") >= win_ns) & (pl.col("start_ns") < win_ns + window_ns))
    if rule.kind == "percentile":
        sel = win if include_failures else win.filter(pl.col("status") == "ok")
        values, ws = _sorted_values(sel, f"{rule.metric}_ns")
        if values.size == 0:
            return None
        q = weighted_quantile_sorted(values, ws, rule.q)
        n_eff = effective_count(ws, values.size)
        figures: dict[str, Any] = {"measured_ms": _ms(q), "threshold_ms": _ms(rule.threshold_ns),
                                   "values": int(values.size), "low_sample": bool(n_eff * (1 - rule.q) < MIN_TAIL)}
        if ws is not None:
            figures |= {"values_weighted": round(float(ws.sum()), 3), "values_effective": round(n_eff, 3)}
        return q >= rule.threshold_ns, figures
    if rule.kind == "error_rate":
        if win.height == 0:
            return None
        ratio, failed = _share(win, pl.col("status") != "ok")
        return ratio >= rule.threshold_ratio, {"measured_ratio": round(ratio, 6), "threshold_ratio":
                                               rule.threshold_ratio, "failed": failed}
    # burn
    rates = []
    for span_s in (rule.fast_s, rule.slow_s):
        n_windows = max(1, math.ceil(span_s * NS / window_ns))
        lo = win_ns - (n_windows - 1) * window_ns
        part = frame.filter((pl.col("start_ns") >= lo) & (pl.col("start_ns") < win_ns + window_ns))
        col = f"{rule.metric}_ns"
        part = part.filter(pl.col(col).is_not_null() | (pl.col("status") != "ok"))
        if part.height == 0:
            return None
        share, _ = _share(part, (pl.col("status") != "ok") | (pl.col(col) >= rule.threshold_ns))
        rates.append(share / (1 - rule.objective))
    return all(r > rule.rate for r in rates), {"burn_fast": round(rates[0], 4), "burn_slow": round(rates[1], 4),
                                               "burn_threshold": rule.rate}


# --- persistence ------------------------------------------------------------------------------


def write_atomic(path: Path, data: bytes) -> None:
    """Write a file through a temp name and os.replace, fsynced, so a crash leaves the old or the new file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


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
    from analysis.engine.percentiles import parse_time
    return int(parse_time(text) or 0)


# --- replay -------------------------------------------------------------------------------------


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


# --- live ---------------------------------------------------------------------------------------


class LiveWatch:
    """The live loop's state machine: which window comes next, the buffer, persistence, delivery hooks.

    `step(now_ns)` evaluates every window closed (and past its delay) by now_ns that was not
    evaluated yet, persisting state after each; `deliver(event)` is called for each event after
    its record is kept and before the state moves past its window (so a crash re-creates it).
    """

    def __init__(self, store: Path, config: Config, deliver: Callable[[Event], None],
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
             f"p50 {_fmt(a['p50_ms'])} p99 {_fmt(a['p99_ms'])} (baseline p99 {_fmt(a['baseline_p99_ms'])})"]
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


def _fmt(ms: float | None) -> str:
    return "-" if ms is None else f"{ms:,.0f} ms"


def replay_json(alert: dict[str, Any]) -> dict[str, Any]:
    """The replay --json object of an alert (the alert record without the internal ns start)."""
    return {k: v for k, v in alert.items() if k != "window_start_ns"}


__all__ = ["ALERT_VERSION", "AlertStore", "Config", "Event", "LiveWatch", "Rule", "Watcher", "alert_id",
           "alerts_frame", "evaluate_rule", "list_alerts", "load_rules", "open_range", "parse_rule", "parse_rules",
           "read_rows", "replay", "replay_json", "segment_files_between", "spike_url", "summary_line"]

