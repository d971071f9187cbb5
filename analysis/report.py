"""The report: percentile series, spike detection and the explanation of every spike, as one dict.

`build_report(con)` returns the stable JSON contract of `tailscope report --json`
(docs/methods.md describes every key); `render_text(report)` prints it with rich tables.
A sub-analysis that fails shows up as "could not compute X because Y" in `errors`
instead of failing the whole report.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any, Final

import duckdb
import numpy as np
import polars as pl
from rich.console import Console
from rich.table import Table

from analysis import explain as X
from analysis import neighbours as N
from analysis.percentiles import (
    auto_window_s,
    iso,
    metric_column,
    parse_duration,
    parse_time,
    quote_ident,
    request_facts,
)
from analysis.spikes import Detection, Spike, detect
from tracing import schema as S
from tracing.errors import QueryError

#: Metrics a report can be about.
REPORT_METRICS: Final[tuple[str, ...]] = ("e2e", "ttft", "tpot")
#: Version of the JSON contract; bumped only on incompatible change.
REPORT_VERSION: Final = 1


def _frame(con: duckdb.DuckDBPyConnection, metric: str, since: int | None, until: int | None,
           include_failures: bool) -> tuple[pl.DataFrame, dict[str, int], str]:
    facts = request_facts(con, with_ttft=metric != "e2e")
    col = quote_ident(metric_column(metric))
    where = "($since IS NULL OR start_ns >= $since) AND ($until IS NULL OR start_ns < $until)"
    params = {"since": since, "until": until}
    counts = con.sql(
        f"SELECT count(*) AS requests, count(*) FILTER (WHERE status = 'ok') AS ok, "
        f"count(*) FILTER (WHERE status = 'error') AS errors, "
        f"count(*) FILTER (WHERE status = 'timeout') AS timeouts, "
        f"count(*) FILTER (WHERE status = 'cancelled') AS cancelled, min(start_ns), max(start_ns) "
        f"FROM {facts} WHERE {where}", params=params).fetchall()[0]
    keep = "" if include_failures else " AND status = 'ok'"
    dims = ", ".join(quote_ident(d) for d in X.DIMENSIONS)
    frame = con.sql(
        f"SELECT rowid AS rid, start_ns, e2e_ns, {col}::DOUBLE AS value, {dims} FROM {facts} "
        f"WHERE {where} AND {col} IS NOT NULL{keep} ORDER BY start_ns", params=params).pl()
    names = ("requests", "ok", "error", "timeout", "cancelled", "first_ns", "last_ns")
    return frame, {n: int(v or 0) for n, v in zip(names, counts, strict=True)}, facts


def _ms(ns: float) -> float | None:
    return round(ns / 1e6, 3) if math.isfinite(ns) else None


def build_report(
    con: duckdb.DuckDBPyConnection,
    metric: str = "e2e",
    window_s: float | str | None = None,
    since: str | int | datetime | None = None,
    until: str | int | datetime | None = None,
    include_failures: bool = True,
) -> dict[str, Any]:
    """Find the p99 spikes of `metric` in [since, until) and explain each; the `report --json` contract."""
    if metric not in REPORT_METRICS:
        raise QueryError("", f"unknown report metric {metric!r}; use one of {', '.join(REPORT_METRICS)}")
    since_ns, until_ns = parse_time(since), parse_time(until)
    win = parse_duration(window_s) if window_s is not None else None
    frame, counts, facts = _frame(con, metric, since_ns, until_ns, include_failures)
    first_ns, last_ns = counts.pop("first_ns"), counts.pop("last_ns")
    if win is None:  # as choose_window_s: from the request rate over the range asked (or seen)
        lo = since_ns if since_ns is not None else first_ns
        hi = until_ns if until_ns is not None else last_ns + 1
        win = auto_window_s(counts["requests"], max(hi - lo, 1) / 1e9)
    window_ns = round(win * 1e9)
    report: dict[str, Any] = {
        "version": REPORT_VERSION, "metric": metric,
        "window_s": int(win) if float(win).is_integer() else win,
        "requests": counts.pop("requests"), "outcomes": counts,
        "include_failures": include_failures,
        "since": iso(since_ns) if since_ns is not None else None,
        "until": iso(until_ns) if until_ns is not None else None,
        "percentile_convention": "quantile_cont (linear interpolation)",
        "values": frame.height, "windows": 0, "baseline_p50_ms": None, "baseline_p99_ms": None,
        "spikes": [], "errors": [],
    }
    if frame.height == 0:
        report["errors"].append(f"could not compute spikes because no request has a {metric} value in range")
        return report
    start = frame.get_column("start_ns").to_numpy()
    values = frame.get_column("value").to_numpy().astype(np.float64)
    try:
        det = detect(start, values, window_ns)
    except Exception as exc:
        report["errors"].append(f"could not compute spikes because {exc}")
        return report
    report["windows"] = int(det.n.size)
    report["baseline_p50_ms"] = _ms(det.baseline_p50_ns)
    report["baseline_p99_ms"] = _ms(det.baseline_p99_ns)
    if det.note:
        report["errors"].append(f"could not compute spikes because {det.note}")
    report["spikes"] = _explain_all(con, facts, frame, start, values, det, metric, report["errors"])
    return report


def _trace_ids(con: duckdb.DuckDBPyConnection, facts: str, frame: pl.DataFrame, rows: np.ndarray) -> list[str]:
    """Trace ids of frame rows (the frame carries the facts' rowid, not the 32-character ids)."""
    rids = frame.get_column("rid").to_numpy()[rows].tolist()
    found = dict(con.execute(f"SELECT rowid, trace_id FROM {facts} WHERE list_contains(?, rowid)",
                             [rids]).fetchall())
    return [found[r] for r in rids]


def _local_baseline(det: Detection, spike: Spike, counts_by_window: dict[int, int]) -> np.ndarray:
    """Window starts (ns) of the baseline windows nearest the spike, holding at least as many requests."""
    base = det.window_start_ns[det.baseline]
    dist = np.maximum(spike.start_ns - (base + det.window_ns), base - spike.end_ns)
    chosen: list[int] = []
    total = 0
    for i in np.argsort(dist, kind="stable"):
        chosen.append(int(base[i]))
        total += counts_by_window[int(base[i])]
        if total >= spike.requests and len(chosen) >= 2:
            break
    return np.asarray(chosen, dtype=np.int64)


def _stages_for(con: duckdb.DuckDBPyConnection, facts: str, frame: pl.DataFrame, start: np.ndarray,
                values: np.ndarray, det: Detection, spike: Spike, spike_tail: np.ndarray, stage_names: tuple[str, ...]
                ) -> list[dict[str, Any]]:
    counts = dict(zip(det.window_start_ns.tolist(), det.n.tolist(), strict=True))
    local = _local_baseline(det, spike, counts)
    local_rows = np.flatnonzero(np.isin((start // det.window_ns) * det.window_ns, local)).astype(np.int64)
    base_tail = X.tail_slice(values, local_rows)
    rows = np.concatenate([spike_tail, base_tail])
    e2e = frame.get_column("e2e_ns").to_numpy()
    lo = int(start[rows].min() - e2e[rows].max())  # a span overlapping a request starts after this
    hi = int((start[rows] + e2e[rows]).max() + 1)
    ids = _trace_ids(con, facts, frame, rows)
    table = X.stage_rows(con, sorted(set(ids)), lo, hi)
    tail_ids = pl.DataFrame({"trace_id": ids[:spike_tail.size]})
    base_ids = pl.DataFrame({"trace_id": ids[spike_tail.size:]})
    return X.stage_shares(table.join(tail_ids, on="trace_id", how="semi"),
                          table.join(base_ids, on="trace_id", how="semi"), stage_names)


def _explain_all(con: duckdb.DuckDBPyConnection, facts: str, frame: pl.DataFrame, start: Any, values: Any,
                 det: Detection, metric: str, errors: list[str]) -> list[dict[str, Any]]:
    if not det.spikes:
        return []
    win_of_row = start // det.window_ns
    base_wins = (det.window_start_ns // det.window_ns)[det.baseline]
    base = np.flatnonzero(np.isin(win_of_row, base_wins)).astype(np.int64)
    coded = [X.code_dimension(frame, d) for d in X.DIMENSIONS]
    base_q = X.TailQuantile(values[base], base)
    stage_names = X.BEFORE_FIRST_TOKEN if metric == "ttft" else S.CRITICAL_PATH_COLUMNS
    out = []
    for spike in det.spikes:
        rows = np.flatnonzero((start >= spike.start_ns) & (start < spike.end_ns)).astype(np.int64)
        tail = X.tail_slice(values, rows)
        item = _spike_json(spike)
        item["errors"] = []
        try:
            item["stages"] = _stages_for(con, facts, frame, start, values, det, spike, tail, stage_names)
        except Exception as exc:
            item["errors"].append(f"could not compute stages because {str(exc).splitlines()[0]}")
        best_mask = None
        try:
            excess_rows = rows[values[rows] > spike.baseline_p99_ns]
            if excess_rows.size < X.MIN_TAIL_SLICE:
                excess_rows = tail
            cands, tested = X.contrast(coded, excess_rows, base)
            cands.sort(key=lambda c: -c.score)
            cands = cands[:X.MAX_COUNTERFACTUAL]
            X.counterfactual(coded, cands, values, rows, base, base_q)
            ranked = X.rank(cands)
            item["dimensions"] = [X.candidate_json(coded, c) for c in ranked]
            item["candidates_tested"] = tested
            item["tail_requests"] = int(excess_rows.size)
            if ranked:
                best_mask = X.candidate_mask(coded, ranked[0], rows)
        except Exception as exc:
            item["errors"].append(f"could not compute dimensions because {exc}")
        try:
            item["exemplars"] = _trace_ids(con, facts, frame, X.exemplar_rows(values, rows, spike.p99_ns, best_mask))
        except Exception as exc:
            item["errors"].append(f"could not compute exemplars because {exc}")
        item["noisy_neighbour"] = N.for_report(con, facts, frame, det, spike, item)
        errors.extend(item["errors"])
        out.append(item)
    return out


def _spike_json(s: Spike) -> dict[str, Any]:
    return {
        "start": iso(s.start_ns), "end": iso(s.end_ns), "requests": s.requests,
        "p50_ms": _ms(s.p50_ns), "p99_ms": _ms(s.p99_ns),
        "baseline_p50_ms": _ms(s.baseline_p50_ns), "baseline_p99_ms": _ms(s.baseline_p99_ns),
        "excess_ms": _ms(s.excess_ns), "p_value": float(f"{s.p_value:.3g}"), "windows": s.windows,
        "stages": [], "dimensions": [], "exemplars": [],
    }


def _fmt(x: float | None, unit: str = "") -> str:
    return "-" if x is None else f"{x:,.1f}{unit}"


def render_text(report: dict[str, Any], console: Console | None = None) -> None:
    """Print the report as rich tables (what `tailscope report` shows without --json)."""
    con = console or Console()
    out = report["outcomes"]
    con.print(f"[bold]{report['metric']}[/] report: {report['requests']:,} requests "
              f"({out['error']:,} errors, {out['timeout']:,} timeouts, {out['cancelled']:,} cancelled; "
              f"failures {'included' if report['include_failures'] else 'excluded'}); "
              f"window {report['window_s']} s x {report['windows']}; "
              f"baseline p50 {_fmt(report['baseline_p50_ms'], ' ms')}, p99 {_fmt(report['baseline_p99_ms'], ' ms')}",
              highlight=False)
    judged = not any(e.startswith("could not compute spikes") for e in report["errors"])
    if not report["spikes"] and judged:
        con.print("[green]no p99 spike with a flat median[/]")
    for n, spike in enumerate(report["spikes"], 1):
        con.print()
        con.print(f"[bold red]spike {n}[/]: {spike['start']} -> {spike['end']}  {spike['requests']:,} requests  "
                  f"p50 {_fmt(spike['p50_ms'], ' ms')} (baseline {_fmt(spike['baseline_p50_ms'], ' ms')})  "
                  f"p99 {_fmt(spike['p99_ms'], ' ms')} (baseline {_fmt(spike['baseline_p99_ms'], ' ms')})  "
                  f"p={spike['p_value']:.2g}", highlight=False)
        if spike["stages"]:
            t = Table("stage", "share of excess", "tail ms", "baseline tail ms", title="where the tail grew")
            for st in spike["stages"]:
                t.add_row(st["stage"], f"{st['share']:.0%}", _fmt(st["tail_ms"]), _fmt(st["baseline_ms"]))
            con.print(t)
        if spike["dimensions"]:
            t = Table("dimension", "value", "explained", "p99 without", "score", "support",
                      title="what the tail is made of")
            for d in spike["dimensions"][:10]:
                expl = "-" if d["explained"] is None else f"{d['explained']:.0%}"
                t.add_row(d["dimension"], d["value"], expl, _fmt(d["p99_without_ms"], " ms"),
                          f"{d['score']:.2f}", str(d["support"]))
            con.print(t)
        if spike["exemplars"]:
            con.print("exemplars: " + ", ".join(spike["exemplars"]), highlight=False)
    for err in report["errors"]:
        con.print(f"[yellow]{err}[/]", highlight=False)
