"""`tailscope demo`: load the labelled incident sample into a store, print the report, open the dashboard.

Offline: the sample ships inside the package (sample_traces/data/demo.otlp.jsonl.gz, a
30-minute run of a 32-replica fleet with two injected incidents); if it is missing it is
regenerated from its seed. Loading is idempotent: ingest skips spans already stored.
"""

from __future__ import annotations

import json
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer

from tailscope.commands.common import StoreOption, console, err_console, errors_as_messages, store_path

#: Third-party packages the command needs (imported when it runs, so `tailscope --help` starts fast).
NEEDS = ("pyarrow", "numpy", "duckdb", "polars")


def demo_files() -> tuple[Path, Path, tempfile.TemporaryDirectory[str] | None]:
    """The committed demo traces and truth, or freshly generated ones (with the temp dir holding them)."""
    from sample_traces.generate import DEMO_TRACES, DEMO_TRUTH, generate_demo

    if DEMO_TRACES.is_file() and DEMO_TRUTH.is_file():
        return DEMO_TRACES, DEMO_TRUTH, None
    tmp = tempfile.TemporaryDirectory(prefix="tailscope-demo-")
    err_console.print("demo sample not found in the package; generating it from its seed (about 20 s)")
    traces, truth = generate_demo(Path(tmp.name) / DEMO_TRACES.name, Path(tmp.name) / DEMO_TRUTH.name)
    return traces, truth, tmp


def truth_lines(truth: dict[str, Any]) -> list[str]:
    """One line per labelled incident: window, what happened, the stage and dimension to expect."""
    out = []
    for inc in truth.get("incidents", []):
        w = inc["window"]
        out.append(f"  {w['start'][11:16]}-{w['end'][11:16]} UTC  {inc['title']}: stage {inc['stage']}, "
                   f"{inc['dimension']}={inc['value']}")
    return out


def print_report(target: Path) -> None:
    """Print the spike report of the store (analysis.report) as text."""
    from analysis.engine.connect import connect
    from analysis.report import build_report, render_text

    con = connect(target)
    try:
        render_text(build_report(con), console)
    finally:
        con.close()


def demo(
    store: StoreOption = None,
    no_dashboard: Annotated[bool, typer.Option("--no-dashboard", help="Print the report only; do not start "
                                               "the dashboard.")] = False,
) -> None:
    """Load a labelled incident sample into the store, print the report and open the dashboard."""
    from intake.ingest import ingest_files
    from tracing.store import init_store

    target = store_path(store)
    traces, truth_file, tmp = demo_files()
    try:
        with errors_as_messages():
            init_store(target)
            result = ingest_files([traces], target)
        truth = json.loads(truth_file.read_text())
    finally:
        if tmp is not None:
            tmp.cleanup()
    console.print(f"demo sample: {truth['requests']:,} requests, {truth['duration_s'] / 60:.0f} minutes, "
                  f"{len(truth['incidents'])} labelled incidents; {result.spans_written:,} spans stored, "
                  f"{result.duplicates:,} already present in {target}", highlight=False)
    console.print()
    with errors_as_messages():
        print_report(target)
    console.print()
    console.print(f"Ground truth ({truth_file.name}):", highlight=False)
    for line in truth_lines(truth):
        console.print(line, highlight=False)
    command = f"tailscope dashboard --store {shlex.quote(str(target))}"
    if no_dashboard or not sys.stdout.isatty():
        console.print(f"\nOpen the dashboard: {command}", highlight=False)
        return
    from tailscope.commands.dashboard import dashboard

    console.print(f"\nStarting the dashboard ({command}) ...", highlight=False)
    dashboard(store=target)


def register(app: typer.Typer) -> None:
    """Add the command to the app."""
    app.command("demo")(demo)
