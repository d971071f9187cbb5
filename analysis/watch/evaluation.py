"""Watch evaluation: the `Watcher` that evaluates one window at a time (tail spikes and SLO rules)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import duckdb
import numpy as np
import polars as pl

from analysis.engine.percentiles import MIN_TAIL, effective_count, iso, ms, weighted_quantile_sorted
from analysis.report import explain_spikes
from analysis.stats.spikes import Detection, Spike, detect
from analysis.watch.reading import ROW_COLUMNS
from analysis.watch.records import ALERT_VERSION, Config, Event, alert_id, spike_url, with_attribute
from analysis.watch.rules import NS, Rule


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
        if "span_id" not in rows.columns:  # rows without span ids: their attributes cannot be read, only the rest
            rows = rows.with_columns(pl.lit(None, dtype=pl.String).alias("span_id"))
        self.frames.append((int(window_start_ns), rows.select(ROW_COLUMNS)))
        keep_from = int(window_start_ns) - (self.config.windows_kept()) * self.config.window_ns
        self.frames = [(w, f) for w, f in self.frames if w >= keep_from]

    def buffer(self) -> pl.DataFrame:
        """Rows of every buffered window, in time order."""
        frames = [f for _, f in self.frames if f.height]
        if not frames:
            return pl.DataFrame({c: [] for c in ROW_COLUMNS})
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
        for rule in cfg.slo_rules:
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
            alert = self._record("tail_spike", key, cfg.spike_rule, spike.start_ns, win_ns + cfg.window_ns, eval_ns,
                                 spike.p50_ns, spike.p99_ns, spike.baseline_p99_ns, spike.requests,
                                 spike.requests_weighted if det.weighted else None)
            alert["service"] = _service_of(frame.filter(pl.col("start_ns") >= spike.start_ns), cfg.metric)
            alert["p_value"] = float(f"{spike.p_value:.3g}")
            alert["baseline_p50_ms"] = ms(spike.baseline_p50_ns)
            if cfg.explain:
                self._explain(alert, frame, det, spike, explain_con)
            self.active[key] = alert
            return [Event("firing", alert)]
        if spike is not None and active is not None:
            self._grow(active, win_ns + cfg.window_ns)
            active["last_p99_ms"] = ms(spike.p99_ns)
            return []
        if active is not None:
            return [Event("resolved", self._resolve(key, eval_ns))]
        return []

    def _grow(self, alert: dict[str, Any], end_ns: int) -> None:
        """The alert's window now ends at end_ns: its end and its dashboard link follow, with the filters and the
        attribute value the alert was fired with (its record holds them)."""
        alert["window_end"] = iso(end_ns)
        filters = tuple((str(k), str(v)) for k, v in alert.get("filters") or ())
        alert["dashboard_url"] = with_attribute(
            spike_url(self.config.dashboard_url, alert["window_start_ns"], end_ns, filters), alert)

    def _resolve(self, key: str, eval_ns: int) -> dict[str, Any]:
        alert = self.active.pop(key)
        alert["resolved_at"] = iso(eval_ns)
        alert["status"] = "resolved"
        return alert

    def _record(self, kind: str, key: str, rule: Rule | None, start_ns: int, end_ns: int, eval_ns: int,
                p50_ns: float, p99_ns: float, baseline_p99_ns: float, requests: int,
                requests_weighted: float | None = None) -> dict[str, Any]:
        cfg = self.config
        slo = rule is not None and rule.kind != "tail_spike"
        metric = rule.metric if rule is not None and slo and rule.kind != "error_rate" else cfg.metric
        where = rule.where if rule is not None else ()
        return {
            "version": ALERT_VERSION, "id": alert_id(key, metric, start_ns), "kind": kind, "status": "firing",
            "rule": rule.text if rule is not None and slo else None, "metric": metric,
            "fired_at": iso(eval_ns), "resolved_at": None,
            "window_start": iso(start_ns), "window_end": iso(end_ns), "window_start_ns": int(start_ns),
            "window_s": int(cfg.window_s) if float(cfg.window_s).is_integer() else cfg.window_s,
            "requests": int(requests),
            "requests_weighted": int(requests) if requests_weighted is None else round(requests_weighted, 3),
            "p50_ms": ms(p50_ns), "p99_ms": ms(p99_ns), "baseline_p99_ms": ms(baseline_p99_ns),
            "stage": None, "stage_share": None, "stages": [],
            "dimension": None, "value": None, "attribute": None, "attribute_source": None, "explained": None,
            "p99_without_ms": None, "dimensions": [],
            "exemplars": [], "dashboard_url": spike_url(cfg.dashboard_url, start_ns, end_ns, where), "errors": [],
            "service": None, "filters": [list(f) for f in where],
            "labels": dict(rule.labels) if rule is not None else {},
            "annotations": dict(rule.annotations) if rule is not None else {},
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
            alert["attribute"], alert["attribute_source"] = top.get("attribute"), top.get("source")
            alert["explained"], alert["p99_without_ms"] = top["explained"], top["p99_without_ms"]
            alert["dashboard_url"] = with_attribute(alert["dashboard_url"], alert)
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
            alert["service"] = dict(rule.where).get("service") or _service_of(self._values(win, rule.metric),
                                                                              rule.metric)
            alert["outcomes"] = _outcomes(win)
            alert["outcomes_weighted"] = _outcomes(win, weighted=True)
            if cfg.explain and det is not None and rule.metric == cfg.metric and not rule.where:
                spike = _window_spike(det, win_ns)
                if spike is not None:
                    self._explain(alert, self._values(buf, cfg.metric), det, spike, explain_con)
            self.active[rule.key] = alert
            return [Event("firing", alert)]
        if violated and active is not None:
            self._grow(active, win_ns + cfg.window_ns)
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


def _service_of(frame: pl.DataFrame, metric: str) -> str | None:
    """The service an alert is about: the one service of its requests, else the one serving most of its tail
    (requests at or above the p99 of `metric`); None without requests."""
    services = frame.get_column("service").drop_nulls()
    if services.len() == 0:
        return None
    if services.n_unique() == 1:
        return str(services[0])
    values = frame.get_column(f"{metric}_ns").cast(pl.Float64)
    threshold = values.quantile(0.99, "linear")
    tail = frame.filter(values >= threshold).get_column("service").drop_nulls() if threshold is not None else services
    counts = (tail if tail.len() else services).value_counts(sort=True)
    return str(counts.row(0)[0])


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
        figures: dict[str, Any] = {"measured_ms": ms(q), "threshold_ms": ms(rule.threshold_ns),
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
