"""Benchmark of `report --engine clickhouse` in chdb against the same report in DuckDB, same run, same spans.

The store is benchmarks.synthetic's (7 spans per request, 16 replicas over two hours, one slow-replica
spike), built or reused under --dir by its fingerprint (benchmarks.inputs), with no request hour
materialized: the DuckDB report (the anchor) computes its requests from the spans, as the chdb report
does. It is exported into an otel_traces table in chdb (the embedded ClickHouse), then the report runs
on both engines; the two reports must be equal. --keep-export reuses an export only when it was made
from this very store by the running export code (its stamp says so), with every other table dropped.

    python -m benchmarks.bench_clickhouse [--spans 1000000] [--dir DIR] [--keep-export] [--dashboard]
                                          [--fixed-spike] [--sampled] [--profile-export] [--materialized]
                                          [--attrs N] [--skip-duckdb] [--save-report FILE]
                                          [--memory-temp-mib N] [--log-peaks] [--json]

Prints per size: export time, DuckDB report time (the anchor), chdb report time, their ratio (each
also in CPU seconds of the process, which the load of a shared machine does not stretch),
the bytes the chdb report pulled back (Arrow), the chdb directory size, each report's peak resident memory
(VmHWM, reset when it starts) and the 1-minute load. --skip-duckdb runs the chdb report alone (a size
where one process cannot hold the anchor), --save-report writes its JSON for a comparison made apart, and
--memory-temp-mib sets where the chdb report's temporary tables become MergeTree (the setting
`memory_temp_mib`, docs/settings.md), --log-peaks prints each of its statements' peak memory as it ends.
With --fixed-spike the table grows in time at the request rate of the 1 M-span store (2 h per
million spans), so the spike (15 minutes of one replica) and the windows (the 1 M store's, given
to both reports) stay the same while the table grows: what the chdb report pulls should not grow.
With --dashboard also the dashboard's first Overview on each engine: opening (the store's
Workbench load; on chdb the request model into the session) and the Overview's data calls
(summary, three percentile series, the report), with the bytes chdb returned for them. Those calls
are cold as far as tailscope goes: the Workbench's background threads (critical paths, prewarm) are
joined first, then Streamlit's query cache (`st.cache_data`) is cleared; the OS page cache is not
(the files were just written or read), nor chdb's mark cache.
With --sampled the chdb report reads a sampled copy of the exported table instead (SAMPLED_TABLE: three
traces in four kept, two of them recording a 0.5 probability, `ot=th:8`, so the requests weigh 1 or 2 and
the sampling is judged): the DuckDB report (the store, unsampled) stays the time anchor only, and the chdb
report's digest (`report_sha256`) lets two versions of the code be compared on the same copy.
With --profile-export also the export's CPU seconds per million spans split into its steps
(EXPORT_STEPS: parsing the Parquet, the casts, the promoted facts, the MergeTree write and its
bloom filter index), each as a share of the whole export (the anchor).
With --materialized also the report reading `tailscope_requests` (analysis.clickhouse.requests_facts)
against the chdb report computed from the spans (the anchor here), same run: the table's views
are created (without the refreshable view), the spans copied into `tailscope_requests_spans`
(`copy_spans`) and every 5-minute interval of the table refreshed by hand (`refresh`), that fill
timed apart; both reports must equal DuckDB's. --skip-fly leaves out the report from the spans.
With --attrs N every request carries N extra random attributes (synthetic.extra_attributes, as
bench_attributes' store): both reports consider them all, and the figures add what the chdb report's
attribute pass returned: rows of per-candidate figures (per spike two rows of cells: the tail's cells that may
pass, then each combination holding an attribute's count of cells and those cells' baseline counts), the largest
of its answers, and the exemplars' requests among them (at most 5 a spike, more only on a tie); no request's
codes. Every run counts the rows the chdb report returned by kind (`returned_rows`, ROW_KINDS): request rows,
spans, the detection's groups of tied values above the pooled p99, and rows of figures (the most one query returned
beside); and where the chdb report's CPU went (`chdb_cpu_by_step`): the CPU seconds of its statements by the
analysis function that sent them, the costliest eight; and where its memory peaked (`chdb_peak_mib_by_step`,
`chdb_top_peaks`): the peak resident memory during each statement, the highest by sending function and the eight
highest statements (the table a statement makes, and its engine).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from analysis.clickhouse.export import export_store
from analysis.engine.percentiles import auto_window_s
from benchmarks.bench_report import peak_rss_mib, reset_peak_rss
from benchmarks.inputs import clear, matches, prepare, read_stamp, record
from benchmarks.synthetic import DURATION_S, SPANS_PER_REQUEST, make_store


def _cpu_s() -> float:
    """CPU seconds of this process so far, every thread (chdb's and DuckDB's included): unlike the wall time, it
    does not stretch with the load of a shared machine."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


#: What the chdb report's queries return, by what their rows are (read off the start of their SQL): the request rows
#: (analysis.clickhouse.report._pull_facts: the spike windows' when the attribute pass failed), spans (a trace's
#: waterfall pulls them, `Fetcher`; no step of the report does), the
#: detection's groups of tied values above the pooled p99 (one row a group of
#: two or more equal values: `_ServerValues.exceedances`); every other query returns rows of figures (per window,
#: block of scores, candidate, combination, stage or key).
ROW_KINDS = (("request_rows", "SELECT trace_id, span_id, start_ns, e2e_ns"),
             ("span_rows", "SELECT TimestampNs, TraceId"), ("detection_tie_groups", "SELECT lo_rank, c FROM"))


def row_kind(sql: str) -> str:
    """The kind of a query's answer (ROW_KINDS; "figures" otherwise)."""
    text = " ".join(sql.split())
    for kind, start in ROW_KINDS:
        if text.startswith(start):
            return kind
    return "figures"


def _step() -> str:
    """The analysis function that sent the statement being run (module.function): what its CPU is counted under."""
    frame = sys._getframe(2)
    while frame is not None:
        path = Path(frame.f_code.co_filename)
        if "analysis" in path.parts:
            return f"{path.stem}.{frame.f_code.co_name}"
        frame = frame.f_back  # type: ignore[assignment]
    return "other"


def _rss_mib() -> float:
    """This process's resident memory now, MiB (VmRSS; 0 where /proc is not there)."""
    try:
        with open("/proc/self/status") as fh:
            return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:")) / 1024
    except (OSError, StopIteration):
        return 0.0


#: How many statements `Counting.top_peaks` keeps.
TOP_PEAKS = 8


def _what(sql: str) -> str:
    """A statement in a few words: the table it creates, else its first 60 characters."""
    m = re.match(r"\s*CREATE\s+(?:TEMPORARY\s+)?TABLE\s+(\S+)(?:\s+ENGINE\s*=\s*(\w+))?", sql)
    return f"create {m.group(1)} ({m.group(2)})" if m else " ".join(sql.split())[:60]


class Counting:
    """A client wrapper counting the Arrow bytes (`pulled`) and rows (`rows`) its queries return, and the rows of
    each kind (`kinds`, ROW_KINDS) with the most rows of figures one query returned (`largest_figures`); and the
    CPU seconds of its statements (chdb runs in this process) by the function that sent them (`steps`); and the
    process's peak resident memory during each statement (VmHWM, reset before it): the most by step (`peaks`), the
    costliest statements (`top_peaks`) and the peak over them all (`peak_mib`)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.dsn = inner.dsn
        self.pulled = 0
        self.rows = 0
        self.attribute_rows = 0
        self.attribute_cells = 0
        self.attribute_largest = 0
        self.exemplar_rows = 0
        self.kinds: dict[str, int] = {k: 0 for k, _ in ROW_KINDS} | {"figures": 0}
        self.largest_figures = 0
        #: per sending function: [CPU seconds, statements]
        self.steps: dict[str, list[float]] = {}
        #: per sending function: the highest peak resident MiB during one of its statements
        self.peaks: dict[str, float] = {}
        #: the statements with the highest peaks: (MiB, sending function, what the statement makes or reads)
        self.top_peaks: list[tuple[float, str, str]] = []
        self.peak_mib = 0.0
        #: print each statement's peak and resident memory after it to stderr as it ends (a run stopped for its memory
        #: says how far it came)
        self.log_peaks = False

    def _count(self, step: str, cpu: float, sql: str) -> None:
        got = self.steps.setdefault(step, [0.0, 0])
        got[0] += cpu
        got[1] += 1
        peak = peak_rss_mib()
        if self.log_peaks:
            print(f"peak {peak:,.0f} MiB, then {_rss_mib():,.0f}: {step}, {_what(sql)}", file=sys.stderr, flush=True)
        self.peak_mib = max(self.peak_mib, peak)
        self.peaks[step] = max(self.peaks.get(step, 0.0), peak)
        self.top_peaks = sorted([*self.top_peaks, (round(peak, 1), step, _what(sql))], reverse=True)[:TOP_PEAKS]

    def _start(self) -> float:
        """Before a statement: the peak so far kept, VmHWM reset (so `_count` reads the statement's own peak)."""
        self.peak_mib = max(self.peak_mib, peak_rss_mib())
        reset_peak_rss()
        return _cpu_s()

    def query(self, sql: str, settings: dict[str, Any] | None = None) -> Any:
        from analysis.clickhouse.attributes import ATTR_PREFIX

        c = self._start()
        out = self.inner.query(sql, settings)
        self._count(_step(), _cpu_s() - c, sql)
        self.pulled += out.nbytes
        self.rows += out.num_rows
        kind = row_kind(sql)
        self.kinds[kind] += out.num_rows
        if kind == "figures":
            self.largest_figures = max(self.largest_figures, out.num_rows)
        if ATTR_PREFIX in sql:  # the attribute pass's
            self.attribute_rows += out.num_rows
            self.attribute_largest = max(self.attribute_largest, out.num_rows)
            if sql.startswith("SELECT uniqExactIf("):  # a spike's cells: one row of figures
                self.attribute_cells += out.num_columns
            elif sql.startswith("SELECT toString(trace_id)"):  # the exemplars' requests matching the named value
                self.exemplar_rows += out.num_rows
        return out

    def command(self, sql: str) -> None:
        c = self._start()
        self.inner.command(sql)
        self._count(_step(), _cpu_s() - c, sql)

    def insert_arrow(self, table: str, data: Any) -> None:
        self.inner.insert_arrow(table, data)

    def close(self) -> None:
        self.inner.close()


def _overview(db: Any) -> float:
    """Seconds for the Overview's data calls (dashboard.data), with Streamlit's query cache cleared first."""
    import streamlit as st

    from dashboard import data

    for thread in (getattr(db, "worker", None), getattr(db, "warmer", None)):
        if thread is not None:  # a background prewarm would refill the cache while the calls are timed
            thread.join()
    st.cache_data.clear()
    f = data.Filters()
    t = time.perf_counter()
    key = (db, str(db.store), db.version)
    data.summary(*key, f)
    data.over_time(*key, f)
    data.report_of(*key, f)
    return round(time.perf_counter() - t, 2)


def dashboard_figures(store: Path, chdir: Path) -> dict[str, Any]:
    """The dashboard's first Overview on the store (the anchor) and on the chdb table, same spans."""
    from analysis.clickhouse import DEFAULT_TABLE, open_client
    from dashboard import clickhouse_data as CHD
    from dashboard import data

    out: dict[str, Any] = {}
    t = time.perf_counter()
    wb = data.Workbench(store)
    wb.refresh()
    while wb.pending:  # bounded by the store: the background worker computes the critical paths
        time.sleep(0.2)
    out["dash_duckdb_open_s"] = round(time.perf_counter() - t, 2)
    out["dash_duckdb_overview_s"] = _overview(wb)
    client = Counting(open_client(f"chdb:{chdir}"))
    t = time.perf_counter()
    bench = CHD.ClickHouseBench(client, DEFAULT_TABLE)
    bench.refresh()
    out["dash_chdb_open_s"] = round(time.perf_counter() - t, 2)
    client.pulled = 0
    out["dash_chdb_overview_s"] = _overview(bench)
    out["dash_chdb_overview_pulled_mib"] = round(client.pulled / 2**20, 2)
    f = data.Filters()
    out["dash_equal"] = (data.report_of(wb, str(wb.store), wb.version, f)
                         == data.report_of(bench, bench.store, bench.version, f))
    bench.close()
    return out


#: The export's steps priced by export_profile, each adding one piece to the one before (the last is the export).
EXPORT_STEPS = (
    ("parse", "read the segment (file(), Parquet) and discard it"),
    ("convert", "+ the casts to the exporter's types (Timestamp at ns, events field by field), into a Null table"),
    ("facts", "+ the promoted facts (each promotion rule run and compared with the stored value)"),
    ("write_no_index", "+ the write into the exporter's MergeTree (partition, ORDER BY), without the TraceId bloom "
                       "filter"),
    ("write", "+ the bloom filter index: the export as it runs"),
)


def export_profile(store: Path, chdir: Path) -> dict[str, Any]:
    """CPU seconds per million spans of each export step (EXPORT_STEPS) over every segment of `store`, in chdb, and
    each step's share of the whole: where the export's time goes."""
    from analysis.clickhouse import literal, open_client, otel_traces_ddl
    from analysis.clickhouse.export import insert_sql, staging_columns
    from tracing.store import segment_files

    shutil.rmtree(chdir, ignore_errors=True)
    client = open_client(f"chdb:{chdir}")
    client.command(otel_traces_ddl("p_write"))
    client.command(otel_traces_ddl("p_write_no_index"))
    client.command("ALTER TABLE p_write_no_index DROP INDEX idx_trace_id")
    client.command("CREATE TABLE p_null AS p_write ENGINE = Null")
    cpu = dict.fromkeys((k for k, _ in EXPORT_STEPS), 0.0)
    spans = 0
    for path in segment_files(store):
        source = f"file({literal(str(path.resolve()))}, 'Parquet', {literal(staging_columns())})"
        steps = {"parse": f"SELECT * FROM {source} FORMAT Null",
                 "convert": insert_sql("p_null", source, facts=False), "facts": insert_sql("p_null", source),
                 "write_no_index": insert_sql("p_write_no_index", source), "write": insert_sql("p_write", source)}
        for key, sql in steps.items():
            c = _cpu_s()
            client.command(sql)
            cpu[key] += _cpu_s() - c
        spans += int(client.query(f"SELECT count() AS n FROM {source}").to_pylist()[0]["n"])
    client.close()
    shutil.rmtree(chdir, ignore_errors=True)
    per_m = {k: round(v * 1e6 / max(spans, 1), 2) for k, v in cpu.items()}
    out: dict[str, Any] = {"profile_spans": spans, "cpu_s_per_m": per_m}
    # the anchor: the whole export; each step's own part is its figure minus the one before
    total = max(per_m["write"], 1e-9)
    before = 0.0
    parts = {}
    for key, _ in EXPORT_STEPS:
        parts[key] = round(max(per_m[key] - before, 0.0) / total, 2)
        before = per_m[key]
    out["share_of_export"] = parts
    out["spans_per_cpu_s"] = round(1e6 / total)
    return out


#: The sampled copy of the exported table that --sampled reports on.
SAMPLED_TABLE = "otel_sampled"


def sampled_copy(client: Any, source: str = "otel_traces", name: str = SAMPLED_TABLE) -> None:
    """`name`: the traces of `source` with cityHash64(TraceId) % 4 < 3, those below 2 recording a 0.5 sampling
    probability (`ot=th:8`, adjusted count 2), the third none (adjusted count 1)."""
    client.command(f"DROP TABLE IF EXISTS {name}")
    client.command(f"CREATE TABLE {name} AS {source}")
    client.command(f"INSERT INTO {name} SELECT * REPLACE (if(cityHash64(TraceId) % 4 < 2, 'ot=th:8', '') "
                   f"AS TraceState) FROM {source} WHERE cityHash64(TraceId) % 4 < 3")


#: The refresh interval of the --materialized fill (`tailscope clickhouse init`'s default).
FILL_STEP_NS = 300 * 1_000_000_000


def fill_materialized(client: Any) -> dict[str, Any]:
    """Create tailscope_requests (and its spans copy) on an exported table and refresh each 5-minute interval by
    hand, as the refreshable view would have once the spans had arrived; time and CPU of the copy and the refreshes
    (skipped, None, when the table is already filled: --keep-export)."""
    from analysis import clickhouse as C

    out: dict[str, Any] = {"fill_copy_s": None, "fill_refresh_s": None, "fill_intervals": None}
    if C.coverage(client):
        return out
    for ddl in C.requests_mv_ddl()[:3]:  # the spans copy, its insert view, the requests table
        client.command(ddl)
    t, c = time.perf_counter(), _cpu_s()
    C.copy_spans(client)
    out["fill_copy_s"], out["fill_copy_cpu_s"] = round(time.perf_counter() - t, 2), round(_cpu_s() - c, 2)
    t, c = time.perf_counter(), _cpu_s()
    # every interval up to the last span's (the table's days lie in the past: the view's end is later)
    out["fill_intervals"] = C.backfill(client, every=f"{FILL_STEP_NS // 60_000_000_000} MINUTE", copy=False)
    out["fill_refresh_s"], out["fill_refresh_cpu_s"] = round(time.perf_counter() - t, 2), round(_cpu_s() - c, 2)
    return out


def without_export_keys(report: Mapping[str, Any]) -> dict[str, Any]:
    """The report without the skipped attributes the export may add (keys of the built-ins and tailscope's own)."""
    attrs = dict(report.get("attributes") or {})
    attrs["skipped"] = [s for s in attrs.get("skipped", []) if s["reason"] not in ("builtin", "tailscope")]
    return {**report, "attributes": attrs}


def run(spans: int, root: Path, keep_export: bool = False, dashboard: bool = False, fixed_spike: bool = False,
        profile: bool = False, sampled: bool = False, materialized: bool = False, skip_fly: bool = False,
        attrs: int = 0, skip_duckdb: bool = False, save_report: Path | None = None, log_peaks: bool = False
        ) -> dict[str, Any]:
    """Build, export and report one size; the figures as a dict. `skip_duckdb`: no DuckDB anchor (a size where one
    process cannot hold it: the chdb report alone, compared by its digest); `save_report`: write the chdb report's
    JSON there (sorted keys) for a comparison made apart; `log_peaks`: print each statement of the chdb report with
    its peak resident memory and the memory after it to stderr as it ends."""
    from analysis.clickhouse import open_client
    from analysis.clickhouse.report import build_report as ch_report
    from analysis.engine.connect import connect
    from analysis.report import build_report

    tag = (f"{spans}-fixed" if fixed_spike else f"{spans}") + (f"-x{attrs}" if attrs else "")
    store = root / f"store-{tag}"
    # the synthetic store by fingerprint (benchmarks.inputs): hours an earlier run materialized are removed, so the
    # DuckDB report computes its requests from the spans, as the chdb report does
    shape: dict[str, Any] = {"duration_s": round(DURATION_S * spans / 1_000_000)} if fixed_spike else {}
    if attrs:  # synthetic.extra_attributes on every request (as bench_attributes' store)
        shape["extra"] = attrs
    out: dict[str, Any] = {"spans": spans, "export_s": None, "build_s": prepare(store, make_store, spans=spans,
                                                                                    **shape)}
    chdir = root / f"chdb-{tag}"
    # the 1 M store's automatic window (its request rate), the same at every size
    window = auto_window_s(1_000_000 // SPANS_PER_REQUEST, DURATION_S) if fixed_spike else None
    exported = {"store_digest": (read_stamp(store) or {}).get("digest")}  # a new store means a new export
    if keep_export and matches(chdir, export_store, **exported):
        client = Counting(open_client(f"chdb:{chdir}"))
        for row in client.inner.query("SELECT name FROM system.tables WHERE database = currentDatabase() "
                                      "AND name != 'otel_traces'").to_pylist():
            client.inner.command(f"DROP TABLE IF EXISTS `{row['name']}`")  # what an earlier run derived from it
        print(f"{chdir}: export reused (same store and export code); other tables dropped", file=sys.stderr)
    else:
        clear(chdir)
        client = Counting(open_client(f"chdb:{chdir}"))
        t, c = time.perf_counter(), _cpu_s()
        export_store(store, client.inner)
        out["export_s"] = round(time.perf_counter() - t, 2)
        out["export_cpu_s"] = round(_cpu_s() - c, 2)
        record(chdir, export_store, exported, manifest=False)  # chdb rewrites its parts: no file list
    out["chdb_dir_mib"] = round(_dir_bytes(chdir) / 2**20, 1)
    out["store_mib"] = round(_dir_bytes(store) / 2**20, 1)
    duck: dict[str, Any] | None = None
    if not skip_duckdb:
        con = connect(store)
        con.execute("SET enable_progress_bar = false").fetchall()
        reset_peak_rss()
        t, c = time.perf_counter(), _cpu_s()
        duck = dict(build_report(con, window_s=window))
        out["duckdb_report_s"] = round(time.perf_counter() - t, 2)
        out["duckdb_report_cpu_s"] = round(_cpu_s() - c, 2)
        out["duckdb_report_peak_rss_mib"] = round(peak_rss_mib(), 1)
        con.close()
    table = "otel_traces"
    if sampled:
        sampled_copy(client.inner)
        table = SAMPLED_TABLE
        client.pulled = 0
    if duck is not None:
        out["requests"] = duck["requests"]
        out["spikes"] = len(duck["spikes"])
    out["sampled"] = sampled
    if not skip_fly:  # the chdb report computing the model from the spans (842 s at 100 M spans)
        reset_peak_rss()
        client.peak_mib, client.peaks, client.top_peaks, client.log_peaks = 0.0, {}, [], log_peaks
        t, c = time.perf_counter(), _cpu_s()
        ch = ch_report(client, table, window_s=window, materialized=False)
        out["chdb_report_s"] = round(time.perf_counter() - t, 2)
        out["chdb_report_cpu_s"] = round(_cpu_s() - c, 2)
        out["chdb_report_peak_rss_mib"] = round(max(client.peak_mib, peak_rss_mib()), 1)
        # where it peaked: the most during one statement by the function sending it, and the costliest statements
        out["chdb_peak_mib_by_step"] = dict(sorted(((k, round(v, 1)) for k, v in client.peaks.items()),
                                                   key=lambda kv: -kv[1])[:8])
        out["chdb_top_peaks"] = [list(p) for p in client.top_peaks]
        if duck is not None:
            out["chdb_vs_duckdb_x"] = round(out["chdb_report_s"] / max(out["duckdb_report_s"], 1e-9), 2)
        else:
            out["requests"], out["spikes"] = ch["requests"], None
        out["pulled_mib"] = round(client.pulled / 2**20, 2)
        out["returned_rows"] = dict(client.kinds)  # by kind (ROW_KINDS)
        # where the chdb report's CPU went: the functions whose statements cost the most, with how many they sent
        out["chdb_cpu_by_step"] = {k: [round(v[0], 2), int(v[1])] for k, v in sorted(
            client.steps.items(), key=lambda kv: -kv[1][0])[:8]}
        out["largest_figures_rows"] = client.largest_figures
        # the attribute pass: rows of per-candidate figures (the exemplars' few requests among them)
        out["attribute_rows"], out["attribute_largest"] = client.attribute_rows, client.attribute_largest
        out["attribute_cells"], out["attribute_exemplar_rows"] = client.attribute_cells, client.exemplar_rows
        seen: dict[str, Any] = dict(ch.get("attributes") or {})
        out["attributes_considered"] = len(seen.get("considered", []))
        out["attributes_skipped"] = len(seen.get("skipped", []))
        out["equal"] = None if sampled or duck is None else ch == duck
        # a store written without the promoted keys in its maps (the synthetic one) is exported with them (the table
        # must carry them for ClickHouse to promote): ClickHouse then lists them as skipped built-in keys too
        out["equal_but_export_keys"] = (None if sampled or duck is None
                                        else without_export_keys(ch) == without_export_keys(duck))
        out["report_sha256"] = hashlib.sha256(json.dumps(ch, sort_keys=True).encode()).hexdigest()[:16]
        if save_report is not None:
            save_report.write_text(json.dumps(ch, sort_keys=True))
        out["chdb_spikes"] = len(ch["spikes"])
    if materialized:
        out |= fill_materialized(client.inner)
        client.pulled = 0
        t, c = time.perf_counter(), _cpu_s()
        mat = ch_report(client, window_s=window)
        out["chdb_mat_report_s"] = round(time.perf_counter() - t, 2)
        out["chdb_mat_report_cpu_s"] = round(_cpu_s() - c, 2)
        if "chdb_report_s" in out:
            out["mat_vs_fly_x"] = round(out["chdb_mat_report_s"] / max(out["chdb_report_s"], 1e-9), 3)
        out["mat_pulled_mib"] = round(client.pulled / 2**20, 2)
        out["mat_equal"] = None if duck is None else mat == duck
    client.close()
    if dashboard:
        out |= dashboard_figures(store, chdir)
    if profile:
        out |= export_profile(store, root / f"chdb-profile-{tag}")
    with open("/proc/loadavg") as fh:
        out["loadavg_1m"] = float(fh.read().split()[0])
    return out


def main(argv: list[str] | None = None) -> None:
    """Run each size and print the figures."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--spans", default="1000000")
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--keep-export", action="store_true", help="reuse an exported chdb directory in --dir")
    parser.add_argument("--dashboard", action="store_true", help="also time the dashboard's first Overview")
    parser.add_argument("--fixed-spike", action="store_true", help="grow the table in time, the spike fixed")
    parser.add_argument("--sampled", action="store_true", help="report on a sampled copy in chdb (SAMPLED_TABLE)")
    parser.add_argument("--materialized", action="store_true",
                        help="also the report reading tailscope_requests, filled by hand first")
    parser.add_argument("--skip-fly", action="store_true",
                        help="with --materialized: leave out the chdb report computed from the spans")
    parser.add_argument("--attrs", type=int, default=0,
                        help="extra random attributes on every request (synthetic.extra_attributes)")
    parser.add_argument("--skip-duckdb", action="store_true",
                        help="no DuckDB anchor: the chdb report alone (where one process cannot hold both)")
    parser.add_argument("--save-report", type=Path, default=None, help="write the chdb report's JSON to this file")
    parser.add_argument("--memory-temp-mib", type=int, default=None,
                        help="the chdb report's temporary tables are MergeTree (on disk) past this many MiB "
                             "(the setting analysis.settings.CLICKHOUSE.memory_temp_mib)")
    parser.add_argument("--log-peaks", action="store_true",
                        help="print each chdb report statement's peak and resident memory to stderr as it ends")
    parser.add_argument("--profile-export", action="store_true",
                        help="also price each step of the export in CPU seconds (EXPORT_STEPS)")
    args = parser.parse_args(argv)
    if args.sampled and args.materialized:
        parser.error("--materialized fills tailscope_requests over otel_traces, not the --sampled copy: pick one")
    if args.memory_temp_mib is not None:  # the setting's variable, for this process only
        from analysis.settings import CLICKHOUSE

        os.environ[str(CLICKHOUSE.memory_temp_mib.env)] = str(args.memory_temp_mib)
    root = args.dir or Path(tempfile.mkdtemp(prefix="tailscope-bench-ch-"))
    root.mkdir(parents=True, exist_ok=True)
    results = [run(int(s), root, args.keep_export, args.dashboard, args.fixed_spike, args.profile_export,
                   args.sampled, args.materialized, args.skip_fly, args.attrs, args.skip_duckdb,
                   args.save_report, args.log_peaks)
               for s in args.spans.split(",")]
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for r in results:
        if "equal" not in r or "duckdb_report_s" not in r:  # --skip-fly, --skip-duckdb
            print(json.dumps(r))
            continue
        print(f"{r['spans']:,} spans, {r['requests']:,} requests, {r['spikes']} spike(s): build {r['build_s']} s, "
              f"export {r['export_s']} s ({r.get('export_cpu_s')} CPU-s); "
              f"report DuckDB {r['duckdb_report_s']} s ({r['duckdb_report_cpu_s']} CPU-s), chdb {r['chdb_report_s']} s "
              f"({r['chdb_report_cpu_s']} CPU-s) "
              f"(x{r['chdb_vs_duckdb_x']}); pulled {r['pulled_mib']} MiB; store {r['store_mib']} MiB, "
              f"chdb {r['chdb_dir_mib']} MiB; equal={r['equal']} (but the export's keys: "
              f"{r['equal_but_export_keys']}); load {r['loadavg_1m']}")
        print(f"  attributes: {r['attributes_considered']} considered, {r['attributes_skipped']} skipped; the "
              f"attribute pass returned {r['attribute_rows']} aggregate rows (the spikes' cells among them: "
              f"{r['attribute_cells']} figures, each combination's count of cells and the baseline counts of those "
              f"that may pass), at most {r['attribute_largest']} from one query, {r['attribute_exemplar_rows']} of "
              f"them the exemplars' requests")
        print("  the chdb report's CPU-s by the function sending its statements (statements): " + ", ".join(
            f"{k} {v[0]} ({v[1]})" for k, v in r["chdb_cpu_by_step"].items()))
        print("  rows the chdb report returned: " + ", ".join(f"{k} {v:,}" for k, v in r["returned_rows"].items())
              + f" (at most {r['largest_figures_rows']:,} rows of figures from one query)")
        if "dash_equal" in r:
            print(f"  dashboard: open DuckDB {r['dash_duckdb_open_s']} s, chdb {r['dash_chdb_open_s']} s; "
                  f"first Overview DuckDB {r['dash_duckdb_overview_s']} s, chdb {r['dash_chdb_overview_s']} s "
                  f"(x{round(r['dash_chdb_overview_s'] / max(r['dash_duckdb_overview_s'], 1e-9), 2)}), "
                  f"chdb returned {r['dash_chdb_overview_pulled_mib']} MiB; equal spikes={r['dash_equal']}")
        if "mat_equal" in r:
            print(f"  materialized: fill {r['fill_intervals']} intervals, copy {r['fill_copy_s']} s, refreshes "
                  f"{r['fill_refresh_s']} s; chdb report reading tailscope_requests {r['chdb_mat_report_s']} s "
                  f"({r['chdb_mat_report_cpu_s']} CPU-s) against {r.get('chdb_report_s')} s from the spans "
                  f"(x{r.get('mat_vs_fly_x')}); pulled {r['mat_pulled_mib']} MiB; equal={r['mat_equal']}")
        if "cpu_s_per_m" in r:
            print("  export profile, CPU-s per 1 M spans (cumulative), share of the export: "
                  + "; ".join(f"{k} {r['cpu_s_per_m'][k]} ({r['share_of_export'][k]:.0%})" for k, _ in EXPORT_STEPS)
                  + f"; {r['spans_per_cpu_s']:,} spans per CPU-s")


if __name__ == "__main__":
    main()
