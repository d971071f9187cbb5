"""`tailscope clickhouse init`: the DDL of the materialized `tailscope_requests` table on ClickHouse."""

from __future__ import annotations

from typing import Annotated

import typer

from tailscope.commands.common import (
    DEFAULT,
    TableOption,
    clickhouse_client,
    console,
    err_console,
    errors_as_messages,
    fail,
)

clickhouse_app = typer.Typer(help="ClickHouse helpers: the materialized requests table.", no_args_is_help=True)


@clickhouse_app.command("init")
def init(
    dsn: Annotated[str, typer.Option(
        "--dsn", help="chdb:PATH (embedded) or clickhouse://user[:password]@host:8123/db.")],
    table: TableOption = DEFAULT,
    every: Annotated[str, typer.Option("--every", help="Refresh interval (ClickHouse interval, e.g. '5 MINUTE').")]
    = "5 MINUTE",
    lag: Annotated[int, typer.Option("--lag-minutes", help="Requests younger than this are left to the next "
                                     "refresh (their spans may still be arriving).")] = 10,
    apply: Annotated[bool, typer.Option("--apply", help="Run the DDL instead of printing it.")] = False,
    backfill: Annotated[bool, typer.Option(
        "--backfill", help="With --apply: also compute the requests of the spans already in the table, one "
        "refresh per interval up to where the view starts (best run while nothing writes to the table: spans "
        "inserted during the copy are copied twice and their intervals then computed from the spans).")] = False,
) -> None:
    """Print (or apply) a tailscope_requests table and the refreshable materialized view that fills it.

    --apply checks everything first and creates all of it or nothing; on an applied schema it changes nothing."""
    from analysis.clickhouse import apply_schema, requests_mv_ddl
    from analysis.clickhouse import backfill as fill

    with errors_as_messages():
        if backfill and not apply:
            fail("--backfill needs --apply (it writes to the server)")
        statements = requests_mv_ddl(table, every=every, lag_minutes=lag)
        if not apply:
            console.print(";\n\n".join(statements) + ";", highlight=False, markup=False, soft_wrap=True)
            return
        client = clickhouse_client(dsn, table)
        try:
            done = apply_schema(client, table, every=every, lag_minutes=lag)
            if done.created:
                console.print(f"created {', '.join(done.created)} over {table}"
                              + (f" ({', '.join(done.existing)} were there already)" if done.existing else ""),
                              highlight=False, soft_wrap=True)
            else:
                console.print(f"nothing to change: {', '.join(done.existing)} are there already over {table}",
                              highlight=False, soft_wrap=True)
            if backfill:
                from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

                with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                              TimeRemainingColumn(), console=err_console, transient=True) as bar:
                    task = bar.add_task("backfill: intervals", total=None)
                    filled = fill(client, table, every=every, lag_minutes=lag,
                                  progress=lambda k, n: bar.update(task, completed=k, total=n))
                console.print(f"backfilled {filled:,} interval(s) of {every} from the spans already in {table}",
                              highlight=False)
        finally:
            client.close()


def register(app: typer.Typer) -> None:
    """Add the command group to the app."""
    app.add_typer(clickhouse_app, name="clickhouse")
