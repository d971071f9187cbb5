"""Every benchmark script runs once at its tiny size (benchmarks.run_all.TINY) and prints its table.

No timing is asserted: the figures of a tiny run mean nothing. What is checked is that each script
finishes, prints the rows its docs describe, and that the results it checks itself (reports equal
across engines, the cost identity, the same curve both ways) hold. Each script runs in its own
process, as `make bench` runs it, with its inputs and temporary files under the test's tmp_path.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from benchmarks import run_all
from tests import samples_cache
from tests.analysis.clickhouse_releases import python_of
from tests.needs import need, need_c

ROOT = Path(__file__).resolve().parents[2]

#: script -> patterns its tiny run's output must contain (its table's rows, and the checks it makes itself)
PRINTS: dict[str, tuple[str, ...]] = {
    "bench_instrumentation": (r"medians: tailscope / bare = \d", r"lean path, total +\d"),
    "bench_views": (r'"anchor_s": \d', r'"stored_p99_per_replica_x": \d', r'"same_answers": true',
                    r'"cli_p99_per_replica_x": \d'),
    "bench_report": (r"'report_vs_duckdb_cpu_x': \d", r"'materialize_s': \d", r"'cli_report_peak_rss_mib': \d",
                     r"'requests': 1000\b"),
    "bench_against": (r"\nsample-basic +[\d.]+ +[\d.]+ +[\d.]+ +[\d.]+ +[\d.]+ +[\d.]+  (True|False) ",
                      r"summary: this=working tree ref=HEAD \(\w+\) stores=1 "),
    "bench_compact": (r"rate: [\d,]+ spans/s with compaction, [\d,]+ without \(anchor\): [\d.]+x",),
    "bench_reads": (r"\nsql scan +[\d.]+ s +anchor \(one file an hour\) +[\d.]+ s +x[\d.]+ the anchor;   DuckDB alone "
                    r"on the same 2\d files", r"\nreport +[\d.]+ s +anchor"),
    "bench_attributes": (r"report_cpu_x \d", r"'considered': \d+", r"extra_attributes 4"),
    "bench_attribute_choices": (r"\nmaterialized +[\d.]+ +[\d.]+ +[\d.]+ ", r"\nclickhouse +[\d.]+ ",
                                r"same listing every way: True"),
    "bench_map": (r'"anchor_materialize_requests": 1750, .*"map_requests": 1750', r'"same_requests": true',
                  r'"ratio_of_best": \d'),
    "bench_cost": (r"1,000 requests", r"anchor [\d.]+ s / [\d.]+ CPU-s; cost table", r"identity holds",
                   r"cost series [\d.]+ s / [\d.]+ CPU-s", r"the same table and series: True",
                   r"identical: True", r"kernel [\d.]+ ms/replay",
                   r"what-if [\d.]+ s / [\d.]+ CPU-s; scale-up [\d.]+ s"),
    "bench_build_hour": (r'"anchor": \[', r'"cpu_x_anchor": \d'),
    "bench_detect": (r"values=20000 windows=8 K=200 detect_cpu_s=[\d.]+ anchor_permutation_cpu_s=[\d.]+",),
    "bench_clickhouse": (r"7,000 spans, 1,000 requests", r"report DuckDB [\d.]+ s", r"\(but the export's keys: True\)",
                         r"CPU-s by the function sending its statements \(statements\): \w+\.\w+ [\d.]+ \(\d+\)"),
    "bench_clickhouse_weighted": (r"2,000 summary .* True", r"2,000 replicas .* True", r"2,000 shape .* True",
                                  r"2,000 series by replica, 1 min .* True"),
    "bench_clickhouse_releases": (r"\n +24\.8 \(24\.8\.[\d.]+\): export [\d.]+ s, report [\d.]+ s, x[\d.]+ the newest; "
                                  r"equal to the newest True, to DuckDB \(the export's keys aside\) True",),
    "bench_watch": (r"slow_replica +1 ", r"\n +1h +12,600 +\d+ +[\d.]+ +[\d.]+ +[\d.]+ +[\d.]+"),
    "bench_dashboard": (r"\| page overview \(new session, cold query caches\) \| [\d.]+ \|", r"anchor \(spans scan",
                        r"materialized \d+ stale hour.*; live \(not materialized\): 1 hour",
                        r"cold: st\.cache_data cleared; st\.cache_resource cleared: .*workload; "
                        r"emptied: the live hours. GPU-time sweep"),
    "bench_dashboard_browser": (r"\| fresh session: SQL \| [\d.]+ \|", r"\| click: Overview \| [\d.]+ \|",
                                r"anchor \(a bare Streamlit page"),
    "bench_collect": (r"\n +2,048 +512 +2 ", r"OTLP/http exporter: 560 spans", r"OTLP/grpc exporter: 560 spans"),
    "bench_ingest_memory": (r"\n +whole +\d+", r"\n +streaming +\d+"),
    "bench_grpc_unauth": (r"answers: \{'UNAUTHENTICATED': 1\}", r"receiver RSS: before \d+ MiB, peak \d+ MiB"),
    "bench_metrics": (r"\ne2e +1 +[\d.]+%", r"label sets 182; series \(sample lines\) 4,914",
                      r"per series ours/anchor [\d.]+"),
}


def _run(cmd: list[str], tmp_path: Path) -> str:
    """Run one benchmark command in its own process (temporary files in a short directory of its own, removed
    after: chromium's singleton socket path must stay under 108 bytes, which pytest's tmp_path can exceed); its
    stdout."""
    with tempfile.TemporaryDirectory(prefix="ts-") as tmp:
        env = {**os.environ, "TMPDIR": tmp, "PYTHONPATH": str(ROOT)}
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, f"{' '.join(cmd[1:])} failed:\n{done.stderr[-3000:]}"
    return done.stdout


def test_every_benchmark_script_has_a_tiny_run() -> None:
    """A new benchmark script cannot escape the smoke test: each has its tiny arguments and its expected rows."""
    scripts = {p.stem for p in (ROOT / "benchmarks").glob("bench_*.py")}
    assert scripts == set(run_all.TINY) == set(run_all.SMALL) == set(PRINTS)


@pytest.mark.slow  # a benchmark script in its own process (make test-fast leaves it out)
@pytest.mark.parametrize("name", sorted(run_all.TINY))
def test_benchmark_runs_at_its_tiny_size(name: str, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    if name == "bench_build_hour":
        from analysis.engine.materialize import load_sweep

        need_c(load_sweep() is not None, "the C kernel analysis._replay")
    if name == "bench_clickhouse_releases":  # the older releases' chdb venvs (`make ch-releases`)
        args = run_all.TINY[name]
        for release in args[args.index("--releases") + 1].split(","):
            python_of(release)
    if name == "bench_dashboard_browser":
        need(Path("/usr/bin/chromium").exists(), "Debian's chromium", "run `make browser-deps`")
        # its --store, where it writes the demo store unless one is there: a copy of the demo tests' (the same
        # `tailscope demo`, checked by tests/sample_traces/test_demo.py), since the dashboard may write into it
        shutil.copytree(samples_cache.demo(tmp_path_factory)[0], tmp_path / "work" / name / "demo-store")
    out = _run(run_all.command(name, "tiny", tmp_path / "work"), tmp_path)
    for pattern in PRINTS[name]:
        assert re.search(pattern, out), f"{name}: no match for {pattern!r} in its output:\n{out[-3000:]}"


@pytest.mark.slow
def test_cost_ab_measures_a_tree_and_compares_two_runs(tmp_path: Path) -> None:
    """benchmarks.cost_ab: one tree measured on the tiny synthetic store, then two outputs compared."""
    out_file = tmp_path / "this.json"
    measured = _run([sys.executable, "-m", "benchmarks.cost_ab", "--spans", "7000", "--dir", str(tmp_path / "work"),
                     "--out", str(out_file)], tmp_path)
    assert re.search(r"'cost_s': [\d.]+", measured) and out_file.exists()
    compared = _run([sys.executable, "-m", "benchmarks.cost_ab", "--compare", str(out_file), str(out_file)], tmp_path)
    assert "cost table the same: True | curve the same: True" in compared
