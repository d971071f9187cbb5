"""A real Prometheus (Debian's 2.42) scrapes a running `tailscope collect` fed by the example server and load generator.

Bounded load (a fixed number of requests), then: Prometheus' own count of requests equals the
request spans in the store, and every exemplar Prometheus kept (`/api/v1/query_exemplars`, with
the exemplar-storage feature) names a request trace of the store whose duration is the
exemplar's value and lies in the exemplar's bucket. Scrapes every second; each process killed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import duckdb

from examples.loadgen import run
from tests import servers
from tests.intake.collect_helpers import ROOT
from tests.monitoring import need_monitoring, prom_query, prometheus, wait_for
from tracing.store import segment_files

REQUESTS = 48


def _start_collect(store: Path, log: Path) -> tuple[subprocess.Popen[bytes], int, int]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tailscope.cli", "collect", "--store", str(store), "--http-port", "0",
         "--grpc-port", "-1", "--metrics-port", "0", "--quiet"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=open(log, "wb"),  # noqa: SIM115
        env=dict(os.environ, PYTHONUNBUFFERED="1"))
    text = wait_for(lambda: re.search(r"http=\S+:(\d+)", log.read_text()) and log.read_text(), 60, "collect",
                    lambda: log.read_text())
    http, metrics = re.search(r"http=\S+:(\d+)", text), re.search(r"metrics=\S+:(\d+)", text)
    assert http is not None and metrics is not None, text
    return proc, int(http.group(1)), int(metrics.group(1))


def test_prometheus_scrapes_span_histograms_with_trace_exemplars(tmp_path: Path) -> None:
    need_monitoring()
    store = tmp_path / "store"
    collect, port, metrics_port = _start_collect(store, tmp_path / "collect.log")
    procs: list[subprocess.Popen[Any]] = [collect]
    try:
        serve = servers.spawn(
            [sys.executable, "-m", "examples.serve", "--port", "0", "--replicas", "2", "--exporters", "otlp"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            env=dict(os.environ, TAILSCOPE_OTLP_ENDPOINT=f"http://127.0.0.1:{port}/v1/traces"))
        procs.append(serve)
        assert serve.stdout is not None
        urls = [serve.stdout.readline().split()[1] for _ in range(2)]
        with prometheus(tmp_path, f"127.0.0.1:{metrics_port}") as prom:
            start = time.time()
            run(urls, REQUESTS, concurrency=4, seed=3)

            def stored() -> int:  # the segments a reader reads (the compactor hides merged ones, then deletes them)
                files = [str(f) for f in segment_files(store)]
                if not files:
                    return 0
                return int(duckdb.execute("SELECT count(*) FROM read_parquet($files) WHERE IsRequest",
                                          {"files": files}).fetchall()[0][0])

            wait_for(lambda: stored() == REQUESTS, 60, f"{REQUESTS} request spans stored", stored)

            def counted() -> float:
                data = prom_query(prom, "/api/v1/query", query="sum(tailscope_request_duration_seconds_count)")
                return float(data["result"][0]["value"][1]) if data["result"] else 0.0

            wait_for(lambda: counted() == REQUESTS, 60, "Prometheus to count every request", counted)
            data = prom_query(prom, "/api/v1/query_exemplars", query="tailscope_request_duration_seconds_bucket",
                              start=str(start - 60), end=str(time.time() + 60))
    finally:
        for p in reversed(procs):
            if p is collect:
                p.kill()
                p.wait(timeout=30)
            else:  # the replicas examples.serve started go with it
                servers.stop(p)
    durations = {tid: ns / 1e9 for tid, ns in duckdb.execute(
        f"SELECT TraceId, Duration FROM read_parquet('{store}/spans/*/*/*.parquet') WHERE IsRequest").fetchall()}
    seen = 0
    for series in data:
        le = float(series["seriesLabels"]["le"])
        assert series["seriesLabels"]["job"] == "tailscope" and series["seriesLabels"]["replica"]
        for ex in series["exemplars"]:
            trace = ex["labels"]["trace_id"]
            assert trace in durations, trace
            assert abs(float(ex["value"]) - durations[trace]) < 1e-6 and float(ex["value"]) <= le
            seen += 1
    assert seen >= 2, data


def test_metrics_and_watch_options_fail_in_one_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from tailscope.cli import app
    from tracing.store import init_store
    runner = CliRunner()
    result = runner.invoke(app, ["metrics", "--store", str(tmp_path / "nothing")])
    assert result.exit_code == 1 and "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    store = init_store(tmp_path / "store")
    token = tmp_path / "token"
    token.write_text("t0k3n\n")
    result = runner.invoke(app, ["watch", "--store", str(store), "--once", "--metrics-token-file", str(token)])
    assert result.exit_code == 1 and result.output.strip() == "error: --metrics-token-file needs --metrics-port"
