"""`tailscope report`: find p99 spikes with a flat median in the store and explain them."""

from __future__ import annotations

import enum
import json
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from tailscope.commands.common import (
    DEFAULT,
    DsnOption,
    Engine,
    EngineOption,
    MappingOption,
    MaterializeOption,
    StoreOption,
    TableOption,
    console,
    err_console,
    fail,
)
from tailscope.commands.engine import ReportAsk, open_backend

if TYPE_CHECKING:
    from analysis.contract import Report
    from intake.recognition import Recognition

#: Third-party packages the command needs (imported when it runs, so `tailscope --help` starts fast).
NEEDS = ("duckdb", "polars", "numpy", "pyarrow")


class SamplingPolicy(enum.StrEnum):
    """What the trace sampler did (analysis.stats.sampling)."""

    auto = "auto"
    head = "head"
    tail = "tail"


class Metric(enum.StrEnum):
    """Latency a report is about."""

    e2e = "e2e"
    ttft = "ttft"
    tpot = "tpot"


def report(
    store: StoreOption = None,
    metric: Annotated[Metric, typer.Option("--metric", "-m", help="Latency to analyse.")] = Metric.e2e,
    window: Annotated[str | None, typer.Option(
        "--window", "-w", help="Window size, e.g. 30s, 5m, 1h (default: chosen from the request rate).",
        show_default=False)] = None,
    since: Annotated[str | None, typer.Option(
        "--since", help="Only requests starting at or after this time (ISO-8601, UTC if no zone).",
        show_default=False)] = None,
    until: Annotated[str | None, typer.Option(
        "--until", help="Only requests starting before this time (ISO-8601, UTC if no zone).",
        show_default=False)] = None,
    ok_only: Annotated[bool, typer.Option(
        "--ok-only", help="Leave errors, timeouts and cancellations out of the percentiles.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the JSON contract (docs/methods.md).")] = False,
    materialize: MaterializeOption = True,
    sampling_policy: Annotated[SamplingPolicy, typer.Option(
        "--sampling-policy", help="How traces were sampled: auto judges tail-based sampling from the data; "
        "tail declares a sampler that kept requests for their latency or outcome (percentiles are then "
        "flagged as biased); head trusts the recorded probabilities.")] = SamplingPolicy.auto,
    dimensions: Annotated[str | None, typer.Option(
        "--dimensions", help="Comma-separated glob patterns: only the dimensions matching one are considered "
        "(attribute keys as in your traces, e.g. 'k8s.*,gen_ai.*', or built-in names such as replica); "
        "default: TAILSCOPE_DIMENSIONS, else every one.", show_default=False)] = None,
    exclude_dimensions: Annotated[str | None, typer.Option(
        "--exclude-dimensions", help="Comma-separated glob patterns of dimensions never considered (added to "
        "TAILSCOPE_EXCLUDE_DIMENSIONS).", show_default=False)] = None,
    engine: EngineOption = Engine.duckdb,
    dsn: DsnOption = None,
    table: TableOption = DEFAULT,
    mapping: MappingOption = None,
) -> None:
    """Find windows where p99 rose while p50 held, and explain each: stages, dimensions, exemplars."""
    backend = open_backend(engine, store, dsn, table, mapping)
    if (dimensions is not None or exclude_dimensions is not None) and not backend.can("dimensions"):
        fail(backend.missing("dimensions"))
    result, seen = backend.report(ReportAsk(
        metric=metric.value, window=window, since=since, until=until, include_failures=not ok_only,
        sampling_policy=sampling_policy.value, dimensions=dimensions, exclude_dimensions=exclude_dimensions,
        materialize=materialize))
    _print(result, as_json)
    _coverage(seen, as_json, backend.where)


def _coverage(seen: Recognition, as_json: bool, store: str = "DIR") -> None:
    """What the data can and cannot show: on stderr with --json, so the contract on stdout stays as is."""
    from intake.recognition import gaps

    out = err_console if as_json else console
    # plain text: no :name: emoji look-up (whose table rich imports on first use)
    out.print(f"coverage: {seen.summary()}", highlight=False, soft_wrap=True, emoji=False)
    for gap in gaps(seen.engines):
        out.print(f"  {gap}", highlight=False, soft_wrap=True, emoji=False)
    problem = seen.problem(store)
    if problem is not None:
        err_console.print(f"[yellow]{problem}[/]", highlight=False, soft_wrap=True)


def _print(result: Report, as_json: bool) -> None:
    """The report on stdout: the JSON contract, or the text rendering."""
    from analysis.report import render_text

    if as_json:
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
    else:
        render_text(result, console)


def register(app: typer.Typer) -> None:
    """Add the command to the app."""
    app.command("report")(report)
