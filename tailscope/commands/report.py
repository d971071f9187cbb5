"""`tailscope report`: find p99 spikes with a flat median in the store and explain them."""

from __future__ import annotations

import enum
import json
import sys
from typing import Annotated

import duckdb
import typer

from analysis.connect import connect
from analysis.report import build_report, render_text
from intake.recognition import Recognition, gaps
from tailscope.commands.common import (
    DEFAULT,
    DsnOption,
    Engine,
    EngineOption,
    StoreOption,
    TableOption,
    clickhouse_client,
    console,
    err_console,
    errors_as_messages,
    fail,
    store_path,
)
from tracing import schema as S


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
    engine: EngineOption = Engine.duckdb,
    dsn: DsnOption = None,
    table: TableOption = DEFAULT,
) -> None:
    """Find windows where p99 rose while p50 held, and explain each: stages, dimensions, exemplars."""
    if engine is Engine.clickhouse:
        with errors_as_messages():
            from analysis.clickhouse_report import build_report as clickhouse_report

            client = clickhouse_client(dsn, table)
            try:
                result = clickhouse_report(client, table, metric=metric.value, window_s=window, since=since,
                                           until=until, include_failures=not ok_only)
            finally:
                client.close()
        if as_json:
            sys.stdout.write(json.dumps(result, indent=2) + "\n")
        else:
            render_text(result, console)
        return
    with errors_as_messages():
        con = connect(store_path(store))
        try:
            con.execute("SET enable_progress_bar = false").fetchall()
            result = build_report(con, metric=metric.value, window_s=window, since=since, until=until,
                                  include_failures=not ok_only)
            seen = recognition_of(con)
        except duckdb.Error as exc:
            fail(f"report failed: {str(exc).splitlines()[0]}")
        finally:
            con.close()
    if as_json:
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
    else:
        render_text(result, console)
    # what the data can and cannot show: on stderr with --json, so the contract on stdout stays as is
    out = err_console if as_json else console
    out.print(f"coverage: {seen.summary()}", highlight=False, soft_wrap=True)
    for gap in gaps(seen.engines):
        out.print(f"  {gap}", highlight=False, soft_wrap=True)
    problem = seen.problem()
    if problem is not None:
        err_console.print(f"[yellow]{problem}[/]", highlight=False, soft_wrap=True)


def recognition_of(con: duckdb.DuckDBPyConnection) -> Recognition:
    """Spans in the store and the request spans among them, by `tailscope.engine`."""
    spans, requests = con.execute(
        "SELECT count(*), count(*) FILTER (WHERE IsRequest) FROM spans").fetchone() or (0, 0)
    engines = dict(con.execute(
        f"SELECT SpanAttributes['{S.ATTR_ENGINE}'] AS e, count(*) FROM spans "
        "WHERE IsRequest AND e IS NOT NULL GROUP BY e").fetchall())
    return Recognition(int(spans), int(requests), {str(k): int(v) for k, v in engines.items()})


def register(app: typer.Typer) -> None:
    """Add the command to the app."""
    app.command("report")(report)
