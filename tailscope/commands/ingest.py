"""`tailscope ingest`: load trace files into a store."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tailscope.commands.common import (
    StoreOption,
    byte_progress,
    console,
    err_console,
    errors_as_messages,
    store_path,
)

#: Third-party packages the command needs (imported when it runs, so `tailscope --help` starts fast).
NEEDS = ("pyarrow", "numpy", "duckdb", "polars")


def ingest(
    paths: Annotated[list[Path], typer.Argument(help="Trace files or directories: OTLP/JSON lines, "
                                                "OTLP protobuf, engine trace files; gzip of any.")],
    store: StoreOption = None,
    skip_bad: Annotated[bool, typer.Option("--skip-bad", help="Skip bad lines and rejected spans, "
                                           "count them, and store the rest.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar or summary.")] = False,
) -> None:
    """Load trace files into the store; re-ingesting a file adds no duplicate span."""
    from analysis.engine.materialize import materialize
    from intake.ingest import ingest_files, iter_files

    target = store_path(store)
    with errors_as_messages():
        files = list(iter_files(paths))
        total = sum(f.stat().st_size for f in files)
        with byte_progress(total, "ingest", enabled=not quiet) as advance:
            report = ingest_files(files, target, skip_bad=skip_bad, progress=advance)
        # the hours these spans landed in (and their neighbours) get their requests materialized
        hours = materialize(target) if report.segments else []
    if not quiet:
        console.print(
            f"{report.files} file(s): {report.spans_read:,} spans read, {report.spans_written:,} stored, "
            f"{report.duplicates:,} already present, {len(report.segments)} segment(s) into {target}"
        )
        if hours:
            console.print(f"materialized the requests of {len(hours)} hour(s)")
        if skip_bad:
            console.print(f"skipped {report.bad_lines} bad line(s) and {report.rejected_spans} rejected span(s)")
            for problem in report.problems[:5]:
                console.print(f"  {problem}", highlight=False)
        console.print(report.recognition.summary(), highlight=False)
    hint = report.recognition.problem(str(target))
    if hint is not None and _has_mapping(target):
        hint = None  # the store's own rules (tailscope map) declare its requests
        if not quiet:
            console.print(f"the store's mapping declares the requests: `tailscope map --store {target}` shows it",
                          highlight=False, soft_wrap=True, markup=False)
    if hint is not None:  # said even with --quiet: the data will not show up as requests
        err_console.print(f"[yellow]{hint}[/]", highlight=False, soft_wrap=True)


def _has_mapping(store: Path) -> bool:
    """Whether the store keeps a mapping (analysis.mapping), which the spans just recognised know nothing of."""
    from analysis.mapping.rules import map_path

    return map_path(store).exists()


def register(app: typer.Typer) -> None:
    """Add the command to the app."""
    app.command("ingest")(ingest)
