"""`tailscope report`: find p99 spikes with a flat median in the store and explain them."""

from __future__ import annotations

import enum
import json
import sys
from typing import TYPE_CHECKING, Annotated, Any

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
    clickhouse_client,
    console,
    err_console,
    errors_as_messages,
    fail,
    query_failure,
    store_path,
    use_mapping_file,
    write_through,
)

if TYPE_CHECKING:
    import duckdb

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
    use_mapping_file(engine, table, mapping)
    if engine is Engine.clickhouse:
        with errors_as_messages():
            from analysis.clickhouse import recognition_counts
            from analysis.clickhouse.report import build_report as clickhouse_report
            from intake.recognition import Recognition

            client = clickhouse_client(dsn, table)
            try:
                result = clickhouse_report(client, table, metric=metric.value, window_s=window, since=since,
                                           until=until, include_failures=not ok_only,
                                           sampling_policy=sampling_policy.value, materialized=materialize,
                                           dimensions=dimensions, exclude_dimensions=exclude_dimensions)
                seen = Recognition(*recognition_counts(client, table))
            finally:
                client.close()
        _print(result, as_json)
        _coverage(seen, as_json)
        return
    from concurrent.futures import ThreadPoolExecutor

    import duckdb

    from analysis.engine.connect import connect
    from analysis.report import build_report

    with errors_as_messages():
        if materialize:
            write_through(store_path(store))
        con = connect(store_path(store))
        try:
            con.execute("SET enable_progress_bar = false").fetchall()
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tailscope-coverage") as pool:
                # the coverage line's count of every span is a scan of its own: on a second connection to the
                # same views, it runs beside the report (DuckDB releases the GIL) instead of after it
                coverage = pool.submit(_recognition_on, con.cursor())
                result = build_report(con, metric=metric.value, window_s=window, since=since, until=until,
                                      include_failures=not ok_only, sampling_policy=sampling_policy.value,
                                      dimensions=dimensions, exclude_dimensions=exclude_dimensions)
                seen = coverage.result()
        except duckdb.Error as exc:
            fail(query_failure("report", exc))
        finally:
            con.close()
    _print(result, as_json)
    _coverage(seen, as_json, str(store_path(store)))


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


def _print(result: dict[str, Any], as_json: bool) -> None:
    """The report on stdout: the JSON contract, or the text rendering."""
    from analysis.report import render_text

    if as_json:
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
    else:
        render_text(result, console)


def _recognition_on(cur: duckdb.DuckDBPyConnection) -> Recognition:
    """recognition_of on a cursor of its own, closed after."""
    try:
        return recognition_of(cur)
    finally:
        cur.close()


def recognition_of(con: duckdb.DuckDBPyConnection) -> Recognition:
    """Spans in the store and the request spans among them, by `tailscope.engine`."""
    from analysis.engine.connect import request_engines
    from intake.recognition import Recognition

    spans, requests = con.execute(
        "SELECT count(*), count(*) FILTER (WHERE IsRequest) FROM spans").fetchone() or (0, 0)
    return Recognition(int(spans), int(requests), request_engines(con))


def register(app: typer.Typer) -> None:
    """Add the command to the app."""
    app.command("report")(report)
